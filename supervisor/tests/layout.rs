//! One contract, one definition: the control block and arena header layouts
//! the supervisor reads are defined by the runtime's C headers.  This test
//! compiles `tests/layout/probe.c` against them, runs it, and compares every
//! value with the Rust constants.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use rekindle::reason::Reason;
use rekindle::snapshot::agent_link::{self as al, SnapStatus};
use rekindle::{arena, control_block as cb, inspect as ins, proto};

fn probe_output() -> String {
    run_probe("probe.c", false)
}

/// Compiles tests/layout/NAME and runs it; `with_runtime`: linked with the
/// runtime's code (runtime/src/*.c), for what only exists at run time.
fn run_probe(name: &str, with_runtime: bool) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // one binary per call: the tests run in parallel threads
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let out = std::env::temp_dir().join(format!(
        "rekindle-layout-probe-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut runtime: Vec<PathBuf> = Vec::new();
    if with_runtime {
        let dir = root.join("runtime/src");
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap_or_else(|e| panic!("{e}")).path();
            if p.extension().is_some_and(|x| x == "c") {
                runtime.push(p);
            }
        }
    }
    let status = Command::new(&cc)
        .args(["-std=c11", "-D_GNU_SOURCE", "-pthread", "-I"])
        .arg(root.join("runtime/include"))
        .arg("-I")
        .arg(root.join("runtime/src"))
        .arg(root.join("supervisor/tests/layout").join(name))
        .args(&runtime)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(status.success(), "compiling the layout probe {name} failed");
    let run = Command::new(&out)
        .output()
        .unwrap_or_else(|e| panic!("running the layout probe: {e}"));
    let _ = std::fs::remove_file(&out);
    assert!(run.status.success());
    String::from_utf8_lossy(&run.stdout).into_owned()
}

fn c_layout() -> HashMap<String, u64> {
    parse(&probe_output())
}

/// The probe's value of name; a name it did not print fails the test.
fn want(c: &HashMap<String, u64>, name: &str) -> u64 {
    *c.get(name)
        .unwrap_or_else(|| panic!("the probe printed no {name}"))
}

fn parse(out: &str) -> HashMap<String, u64> {
    out.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[test]
fn rust_constants_match_the_c_headers() {
    let c = c_layout();
    let same = |name: &str, rust: u64| assert_eq!(rust, want(&c, name), "{name}: Rust {rust}");
    same("CONTROL_MAGIC", cb::MAGIC);
    same("CONTROL_VERSION", cb::VERSION as u64);
    same("CONTROL_SIZE", cb::SIZE as u64);
    same("CONTROL_NSLOTS", cb::NSLOTS as u64);
    same("CONTROL_SLOT_SIZE", cb::SLOT_SIZE as u64);
    same("CONTROL_MAX_ARENAS", cb::MAX_ARENAS as u64);
    same("CONTROL_ARENA_NAME_LEN", cb::ARENA_NAME_LEN as u64);
    same("CONTROL_REQUEST_REASON_LEN", cb::REQUEST_REASON_LEN as u64);
    same("CONTROL_FLAG_WARM_DISABLED", cb::FLAG_WARM_DISABLED as u64);
    same("OFF_MAGIC", cb::OFF_MAGIC as u64);
    same("OFF_VERSION", cb::OFF_VERSION as u64);
    same("OFF_SIZE", cb::OFF_SIZE as u64);
    same("OFF_PID", cb::OFF_PID as u64);
    same("OFF_GENERATION", cb::OFF_GENERATION as u64);
    same("OFF_STATE", cb::OFF_STATE as u64);
    same("OFF_FLAGS", cb::OFF_FLAGS as u64);
    same("OFF_HEARTBEAT_COUNT", cb::OFF_HEARTBEAT_COUNT as u64);
    same("OFF_HEARTBEAT_NS", cb::OFF_HEARTBEAT_NS as u64);
    same("OFF_PRESERVED", cb::OFF_PRESERVED as u64);
    same("OFF_REQUEST_MODE", cb::OFF_REQUEST_MODE as u64);
    same("OFF_REQUEST_REASON", cb::OFF_REQUEST_REASON as u64);
    same("OFF_NSLOTS", cb::OFF_NSLOTS as u64);
    same("OFF_SLOT_SIZE", cb::OFF_SLOT_SIZE as u64);
    same("OFF_NARENAS", cb::OFF_NARENAS as u64);
    same("OFF_INDEPENDENT", cb::OFF_INDEPENDENT as u64);
    same("OFF_ARENA_TABLE_SUM", cb::OFF_ARENA_TABLE_SUM as u64);
    same("OFF_SLOTS", cb::OFF_SLOTS as u64);
    same("OFF_ARENA_NAMES", cb::OFF_ARENA_NAMES as u64);
    same("SLOT_OFF_TID", cb::SLOT_OFF_TID as u64);
    same("SLOT_OFF_DEPTH", cb::SLOT_OFF_DEPTH as u64);
    same("SLOT_DEPTH_SIZE", cb::SLOT_DEPTH_SIZE as u64);
    // the supervisor names states by number (control_block::CtlState)
    for (name, words) in [
        ("CONTROL_STATE_NONE", "none"),
        ("CONTROL_STATE_RUNNING", "running"),
        ("CONTROL_STATE_RECOVERING", "recovering"),
        ("CONTROL_STATE_READY", "ready"),
        ("CONTROL_STATE_RESTARTING", "restarting"),
    ] {
        assert_eq!(
            cb::CtlState::from_raw(want(&c, name) as u32).as_str(),
            words,
            "{name}"
        );
    }
    same("CONTROL_REQ_WARM", cb::RequestMode::Warm as u64);
    same("CONTROL_REQ_COLD", cb::RequestMode::Cold as u64);
    same("ARENA_MAGIC", arena::ARENA_MAGIC);
    same("ARENA_VERSION", arena::ARENA_VERSION as u64);
    same("ARENA_OFF_MAGIC", arena::OFF_MAGIC as u64);
    same("ARENA_OFF_VERSION", arena::OFF_VERSION as u64);
    same("ARENA_CHECKED_LEN", arena::CHECKED_LEN as u64);
    same("ARENA_HDR_PREFIX", arena::HDR_PREFIX as u64);
}

#[test]
fn inspect_reads_the_arena_as_the_c_headers_lay_it_out() {
    let c = c_layout();
    let same = |name: &str, rust: u64| assert_eq!(rust, want(&c, name), "{name}: Rust {rust}");
    for (name, rust) in [
        ("ARENA_OFF_PAGE_SIZE", ins::OFF_PAGE_SIZE),
        ("ARENA_OFF_LAYOUT", ins::OFF_LAYOUT),
        ("ARENA_OFF_BASE", ins::OFF_BASE),
        ("ARENA_OFF_MAX_BYTES", ins::OFF_MAX_BYTES),
        ("ARENA_OFF_MAP_OFFSET", ins::OFF_MAP_OFFSET),
        ("ARENA_OFF_HEAP_OFFSET", ins::OFF_HEAP_OFFSET),
        ("ARENA_OFF_NAME", ins::OFF_NAME),
        ("ARENA_NAME_LEN", ins::NAME_LEN),
        ("ARENA_OFF_ROOT_LOCK", ins::OFF_ROOT_LOCK),
        ("ARENA_OFF_ROOTS_CHECKSUM", ins::OFF_ROOTS_CHECKSUM),
        ("ARENA_OFF_ROOTS", ins::OFF_ROOTS),
        ("ARENA_MAX_ROOTS", ins::MAX_ROOTS),
        ("ROOT_SIZE", ins::ROOT_SIZE),
        ("ROOT_OFF_NAME", ins::ROOT_OFF_NAME),
        ("ROOT_NAME_LEN", ins::ROOT_NAME_LEN),
        ("ROOT_OFF_PTR", ins::ROOT_OFF_PTR),
        ("ARENA_OFF_HEAP_LOCK", ins::OFF_HEAP_LOCK),
        ("ARENA_OFF_TOP", ins::OFF_TOP),
        ("ARENA_OFF_COMMITTED", ins::OFF_COMMITTED),
        ("ARENA_OFF_ALLOCATED", ins::OFF_ALLOCATED),
        ("ARENA_OFF_CLASSES", ins::OFF_CLASSES),
        ("ARENA_NCLASSES", ins::NCLASSES),
        ("CLASS_STATE_SIZE", ins::CLASS_STATE_SIZE),
        ("CLASS_OFF_LOCK", ins::CLASS_OFF_LOCK),
        ("CLASS_OFF_COUNT", ins::CLASS_OFF_COUNT),
        ("CLASS_OFF_SLABS", ins::CLASS_OFF_SLABS),
        ("ARENA_OFF_TCACHES", ins::OFF_TCACHES),
        ("ARENA_MAX_TCACHES", ins::MAX_TCACHES),
        ("TCACHE_SIZE", ins::TCACHE_SIZE),
        ("TCACHE_OFF_OWNER", ins::TCACHE_OFF_OWNER),
        ("TCACHE_OFF_ALLOC_DELTA", ins::TCACHE_OFF_ALLOC_DELTA),
        ("TCACHE_OFF_BINS", ins::TCACHE_OFF_BINS),
        ("TCACHE_BIN_SIZE", ins::TCACHE_BIN_SIZE),
        ("BIN_OFF_COUNT", ins::BIN_OFF_COUNT),
        ("ARENA_HDR_SIZE", ins::HDR_SIZE),
        ("SLAB_SIZE", ins::SLAB_SIZE),
        ("SLAB_OFF_MAGIC", ins::SLAB_OFF_MAGIC),
        ("SLAB_OFF_CLS", ins::SLAB_OFF_CLS),
        ("SLAB_OFF_NOBJS", ins::SLAB_OFF_NOBJS),
        ("SLAB_OFF_NPAGES", ins::SLAB_OFF_NPAGES),
        ("SLAB_OFF_FIRST", ins::SLAB_OFF_FIRST),
    ] {
        same(name, rust as u64);
    }
    same("ARENA_PAGE", ins::PAGE);
    same("ARENA_SMALL_MAX", ins::SMALL_MAX as u64);
    same("ARENA_TCACHE_MAX", ins::TCACHE_MAX);
    same("SLAB_MAGIC", ins::SLAB_MAGIC as u64);
    same("SLAB_HEADER_BYTES", ins::SLAB_HEADER_BYTES);
    same("SLAB_MAX_OBJECTS", ins::SLAB_MAX_OBJECTS);
    // the page map entry: kinds, fields, and how entries are made
    same("PG_NONE", ins::PG_NONE as u64);
    same("PG_SLAB", ins::PG_SLAB as u64);
    same("PG_LARGE", ins::PG_LARGE as u64);
    same("PG_CONT", ins::PG_CONT as u64);
    same("PG_FREE", ins::PG_FREE as u64);
    same("PG_MARK", ins::PG_MARK);
    let sample = c["PG_SAMPLE"];
    same("PG_SAMPLE_KIND", ins::pg_kind(sample) as u64);
    same("PG_SAMPLE_CLASS", ins::pg_class(sample) as u64);
    same("PG_SAMPLE_N", ins::pg_n(sample));
    same("PG_MAKE_SLAB_39_4096", ins::pg_make(ins::PG_SLAB, 39, 4096));
    same("PG_MAKE_LARGE_0_1", ins::pg_make(ins::PG_LARGE, 0, 1));
    same("PG_MAKE_CONT_0_7", ins::pg_make(ins::PG_CONT, 0, 7));
    same("PG_MAKE_FREE_0_300", ins::pg_make(ins::PG_FREE, 0, 300));
}

#[test]
fn inspect_computes_the_runtimes_size_classes_and_layout_hash() {
    // the table is computed by alloc.c at start: the probe runs the runtime
    let c = parse(&run_probe("probe_classes.c", true));
    let sizes = ins::class_sizes();
    for (i, s) in sizes.iter().enumerate() {
        let name = format!("CLASS_SIZE_{i}");
        assert_eq!(*s as u64, want(&c, &name), "{name}");
    }
    assert!(
        !c.contains_key(&format!("CLASS_SIZE_{}", sizes.len())),
        "C has more classes"
    );
    // the hash every arena header carries: the same class table and sizes
    assert_eq!(ins::layout_hash(), c["LAYOUT_HASH"], "rk_layout_hash()");
}

#[test]
fn reason_codes_and_names_match_the_c_header() {
    let out = probe_output();
    let mut seen = 0;
    for line in out
        .lines()
        .filter(|l| l.starts_with("REASON_") && !l.starts_with("REASON_COUNT"))
    {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 4, "{line}");
        let n: u32 = f[1].parse().unwrap_or(u32::MAX);
        let r = Reason::from_code(n);
        assert_eq!(r.code(), n, "C reason {n} ({}) unknown to Rust", f[2]);
        assert_eq!(r.as_str(), f[2], "reason {n}");
        assert_eq!(
            r.restorable(),
            f[3] == "1",
            "reason {n}: rk_reason_restorable and Reason::restorable disagree"
        );
        seen += 1;
    }
    assert_eq!(
        seen,
        Reason::ALL.len(),
        "C and Rust know different numbers of reasons"
    );
}

#[test]
fn the_snapshot_agents_messages_and_buffer_match_the_c_header() {
    let c = c_layout();
    let same = |name: &str, rust: u64| assert_eq!(rust, want(&c, name), "{name}: Rust {rust}");
    same("SNAP_BUF_MAGIC", al::BUF_MAGIC);
    same("SNAP_BUF_VERSION", al::BUF_VERSION as u64);
    same("SNAP_BUF_HDR_LEN", al::BUF_HDR_LEN as u64);
    same("SNAP_OFF_REGIONS_OFF", al::OFF_BUF_REGIONS_OFF as u64);
    same("SNAP_OFF_VEC_OFF", al::OFF_BUF_VEC_OFF as u64);
    same("SNAP_OFF_PUNCH_OFF", al::OFF_BUF_PUNCH_OFF as u64);
    same("SNAP_OFF_MANIFEST_OFF", al::OFF_BUF_MANIFEST_OFF as u64);
    same("SNAP_OFF_VEC_CAP", al::OFF_BUF_VEC_CAP as u64);
    same("SNAP_OFF_PUNCH_CAP", al::OFF_BUF_PUNCH_CAP as u64);
    same("SNAP_OFF_NREGIONS", al::OFF_BUF_NREGIONS as u64);
    same("SNAP_OFF_NVEC", al::OFF_BUF_NVEC as u64);
    same("SNAP_OFF_MANIFEST_LEN", al::OFF_BUF_MANIFEST_LEN as u64);
    same("SNAP_OFF_NPUNCH", al::OFF_BUF_NPUNCH as u64);
    same("SNAP_OFF_OPEN_EPOCH", al::OFF_BUF_OPEN_EPOCH as u64);
    same("SNAP_OFF_DURABLE_EPOCH", al::OFF_BUF_DURABLE_EPOCH as u64);
    same("SNAP_HELLO_FDS", al::HELLO_FDS as u64);
    same("SNAP_REGION_LEN", al::REGION_LEN as u64);
    // Report::regions reads the name at 8, addr/len at 56/64, first/count at 72/76
    same("SNAP_REGION_OFF_NAME", 8);
    same("SNAP_REGION_OFF_ADDR", 56);
    same("SNAP_REGION_OFF_FIRST", 72);
    same("SNAP_REGION_OFF_INO", al::REGION_OFF_INO as u64);
    same("SNAP_REGION_NEW", al::REGION_NEW as u64);
    same(
        "SNAP_REGION_TRACKED_FROM_MAP",
        al::REGION_TRACKED_FROM_MAP as u64,
    );
    same("SNAP_REGION_ARENA", 1);
    same("SNAP_REGION_RANGE", 2);
    same("SNAP_RUN_LEN", al::RUN_LEN as u64);
    same("SNAP_PUNCH_LEN", al::PUNCH_LEN as u64);
    same("SNAP_MAX_REGIONS", al::MAX_REGIONS as u64);
    same("SNAP_T_HELLO", al::T_SNAP_HELLO as u64);
    same("SNAP_T_DIRTY", al::T_SNAP_DIRTY as u64);
    same("SNAP_T_RELEASED", al::T_SNAP_RELEASED as u64);
    same("SNAP_T_SCAN", al::T_SNAP_SCAN as u64);
    same("SNAP_T_CONTINUE", al::T_SNAP_CONTINUE as u64);
    same("SNAP_T_RELEASE", al::T_SNAP_RELEASE as u64);
    same("SNAP_HELLO_LEN", al::SNAP_HELLO_LEN as u64);
    same("SNAP_SCAN_LEN", al::SNAP_SCAN_LEN as u64);
    same("SNAP_SCAN_CUT", al::SCAN_CUT as u64);
    same("SNAP_SCAN_PROBE", al::SCAN_PROBE as u64);
    same("SNAP_DIRTY_OFF_UNCHANGED", 44); // agent_link.rs: u32_at(p, 44)
    same("SNAP_DIRTY_OFF_EPOCH", 48);
    same("SNAP_DIRTY_LEN", al::SNAP_DIRTY_LEN as u64);
    same("SNAP_SEQ_LEN", al::SNAP_SEQ_LEN as u64);
    same("SNAP_RELEASED_LEN", al::SNAP_RELEASED_LEN as u64);
    for (name, s) in [
        ("SNAP_STATUS_REGION_OPEN", SnapStatus::RegionOpen),
        ("SNAP_STATUS_RESTARTING", SnapStatus::Restarting),
        ("SNAP_STATUS_LAYOUT_CHANGING", SnapStatus::LayoutChanging),
        ("SNAP_STATUS_SCAN_FAILED", SnapStatus::ScanFailed),
        ("SNAP_STATUS_STOP_TIMEOUT", SnapStatus::StopTimeout),
        ("SNAP_STATUS_BAD_REQUEST", SnapStatus::BadRequest),
        ("SNAP_STATUS_UNAVAILABLE", SnapStatus::Unavailable),
    ] {
        same(name, s.code() as u64);
    }
    same("INHERIT_RESTORED", proto::INHERIT_RESTORED as u64);
    same("INHERIT_LAZY", proto::INHERIT_LAZY as u64);
    same("ATTACH_CAP_LAZY", proto::ATTACH_CAP_LAZY as u64);
    same(
        "OFF_LAZY_PAGES",
        rekindle::control_block::OFF_LAZY_PAGES as u64,
    );
    same("LAZY_REGION_LEN", proto::LAZY_ENTRY_LEN as u64);
    same("LAZY_REGION_NAME_LEN", proto::NAME_LEN as u64);
    {
        use rekindle::snapshot::lazy as lz;
        same("UFFDIO_COPY", lz::UFFDIO_COPY);
        same("UFFDIO_UNREGISTER", lz::UFFDIO_UNREGISTER);
        same("UFFDIO_WAKE", lz::UFFDIO_WAKE);
        same("UFFD_MSG_LEN", lz::UFFD_MSG_LEN as u64);
        same("UFFD_MSG_OFF_ADDRESS", lz::UFFD_MSG_OFF_ADDRESS as u64);
        same("UFFD_MSG_OFF_FORK_UFD", lz::UFFD_MSG_OFF_FORK_UFD as u64);
        same("UFFD_EVENT_PAGEFAULT", lz::UFFD_EVENT_PAGEFAULT as u64);
        same("UFFD_EVENT_FORK", lz::UFFD_EVENT_FORK as u64);
    }
}

#[test]
fn the_redo_ring_matches_the_c_header() {
    use rekindle::redo::ring as r;
    let c = c_layout();
    let same = |name: &str, rust: u64| assert_eq!(rust, want(&c, name), "{name}: Rust {rust}");
    same("REDO_MAGIC", r::MAGIC);
    same("REDO_VERSION", r::VERSION as u64);
    same("REDO_HEADER", r::HEADER as u64);
    same("REDO_REC_HEAD", r::REC_HEAD as u64);
    same("REDO_STRUCT_SIZE", r::STRUCT_SIZE as u64);
    same("REDO_OFF_MAGIC", r::OFF_MAGIC as u64);
    same("REDO_OFF_VERSION", r::OFF_VERSION as u64);
    same("REDO_OFF_HEADER_SIZE", r::OFF_HEADER_SIZE as u64);
    same("REDO_OFF_RING_BYTES", r::OFF_RING_BYTES as u64);
    same("REDO_OFF_COMMITTED", r::OFF_COMMITTED as u64);
    same("REDO_OFF_WANT", r::OFF_WANT as u64);
    same("REDO_OFF_APP_GAPS", r::OFF_APP_GAPS as u64);
    same("REDO_OFF_REPLAY_PENDING", r::OFF_REPLAY_PENDING as u64);
    same("REDO_OFF_STARTED_AT", r::OFF_STARTED_AT as u64);
    same("REDO_OFF_STARTED_LINE", r::OFF_STARTED_LINE as u64);
    same("REDO_OFF_LINE", r::OFF_LINE as u64);
    same("REDO_OFF_LINE_GAPS", r::OFF_LINE_GAPS as u64);
    same("REDO_OFF_LINE_START", r::OFF_LINE_START as u64);
    same("REDO_OFF_DRAINED", r::OFF_DRAINED as u64);
    same("REDO_OFF_DURABLE", r::OFF_DURABLE as u64);
    same("REDO_OFF_WRITER_ERRNO", r::OFF_WRITER_ERRNO as u64);
}
