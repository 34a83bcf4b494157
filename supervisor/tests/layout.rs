//! One contract, one definition: the control block and arena header layouts
//! the supervisor reads are defined by the runtime's C headers.  This test
//! compiles `tests/layout/probe.c` against them, runs it, and compares every
//! value with the Rust constants.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use rekindle::reason::Reason;
use rekindle::{arena, control_block as cb};

fn probe_output() -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // one binary per call: the tests run in parallel threads
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let out = std::env::temp_dir().join(format!(
        "rekindle-layout-probe-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-D_GNU_SOURCE", "-pthread", "-I"])
        .arg(root.join("runtime/include"))
        .arg("-I")
        .arg(root.join("runtime/src"))
        .arg(root.join("supervisor/tests/layout/probe.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(status.success(), "compiling the layout probe failed");
    let run = Command::new(&out)
        .output()
        .unwrap_or_else(|e| panic!("running the layout probe: {e}"));
    let _ = std::fs::remove_file(&out);
    assert!(run.status.success());
    String::from_utf8_lossy(&run.stdout).into_owned()
}

fn c_layout() -> HashMap<String, u64> {
    probe_output()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[test]
fn rust_constants_match_the_c_headers() {
    let c = c_layout();
    let want = |name: &str| -> u64 {
        *c.get(name)
            .unwrap_or_else(|| panic!("the probe printed no {name}"))
    };
    let same = |name: &str, rust: u64| assert_eq!(rust, want(name), "{name}: Rust {rust}");
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
            cb::CtlState::from_raw(want(name) as u32).as_str(),
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
fn reason_codes_and_names_match_the_c_header() {
    let out = probe_output();
    let mut seen = 0;
    for line in out
        .lines()
        .filter(|l| l.starts_with("REASON_") && !l.starts_with("REASON_COUNT"))
    {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 3, "{line}");
        let n: u32 = f[1].parse().unwrap_or(u32::MAX);
        let r = Reason::from_code(n);
        assert_eq!(r.code(), n, "C reason {n} ({}) unknown to Rust", f[2]);
        assert_eq!(r.as_str(), f[2], "reason {n}");
        seen += 1;
    }
    assert_eq!(
        seen,
        Reason::ALL.len(),
        "C and Rust know different numbers of reasons"
    );
}
