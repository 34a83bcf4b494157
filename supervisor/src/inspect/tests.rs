//! The parser on synthetic arenas, laid out as the runtime lays them out
//! (arena.c rk_arena_format, alloc.c), and on corrupt ones.  A real arena,
//! made by the runtime, is read in tests/inspect.rs.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use proptest::prelude::*;

use super::*;
use crate::control_block::{self as cb, Fields as _};

const BASE: u64 = 0x7f00_0000_0000;

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// An arena built field by field.
struct Arena {
    b: Vec<u8>,
    max: u64,
    heap_offset: u64,
    top: u64,
    sizes: [u32; NCLASSES],
}

impl Arena {
    fn new(name: &str, max: u64) -> Arena {
        let map_offset = align(HDR_SIZE as u64, PAGE);
        let heap_offset = align(map_offset + (max / PAGE) * 8, 65536);
        let mut a = Arena {
            b: vec![0u8; heap_offset as usize],
            max,
            heap_offset,
            top: 0,
            sizes: class_sizes(),
        };
        a.put64(0, arena::ARENA_MAGIC);
        a.put32(8, arena::ARENA_VERSION);
        a.put32(OFF_PAGE_SIZE, PAGE as u32);
        a.put64(OFF_LAYOUT, layout_hash());
        a.put64(OFF_BASE, BASE);
        a.put64(OFF_MAX_BYTES, max);
        a.put64(OFF_MAP_OFFSET, map_offset);
        a.put64(OFF_HEAP_OFFSET, heap_offset);
        a.b[OFF_NAME..OFF_NAME + name.len()].copy_from_slice(name.as_bytes());
        a
    }
    fn put32(&mut self, o: usize, v: u32) {
        self.b[o..o + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn put64(&mut self, o: usize, v: u64) {
        self.b[o..o + 8].copy_from_slice(&v.to_le_bytes());
    }
    fn get64(&self, o: usize) -> u64 {
        u64_of(&self.b[o..o + 8])
    }
    fn map_at(&self, page: u64) -> usize {
        (self.get64(OFF_MAP_OFFSET) + page * 8) as usize
    }
    fn set_map(&mut self, page: u64, e: u64) {
        let o = self.map_at(page);
        self.put64(o, e);
    }
    /// Carves npages at the top; returns the first page.
    fn carve(&mut self, npages: u64, first: u64) -> u64 {
        let page = (self.heap_offset + self.top) / PAGE;
        self.top += npages * PAGE;
        let len = (self.heap_offset + self.top) as usize;
        if self.b.len() < len {
            self.b.resize(len, 0);
        }
        self.set_map(page, first);
        for i in 1..npages {
            self.set_map(page + i, pg_make(PG_CONT, 0, i));
        }
        page
    }
    /// A slab of class c with the runtime's geometry; returns its first page.
    fn slab(&mut self, c: usize) -> u64 {
        let g = slab_geometry(self.sizes[c]);
        let (npages, nobjs) = (g.pages, g.nobjs);
        let page = self.carve(npages, pg_make(PG_SLAB, c as u32, npages));
        let at = (page * PAGE) as usize;
        self.put32(at + SLAB_OFF_MAGIC, SLAB_MAGIC);
        self.put32(at + SLAB_OFF_CLS, c as u32);
        self.put32(at + SLAB_OFF_NOBJS, nobjs as u32);
        self.put32(at + SLAB_OFF_NPAGES, npages as u32);
        self.put64(at + SLAB_OFF_FIRST, BASE + page * PAGE + g.header);
        let s = OFF_CLASSES + c * CLASS_STATE_SIZE + CLASS_OFF_SLABS;
        let n = self.get64(s);
        self.put64(s, n + 1);
        page
    }
    fn nobjs(&self, page: u64) -> u64 {
        let at = (page * PAGE) as usize + SLAB_OFF_NOBJS;
        u32::from_le_bytes([self.b[at], self.b[at + 1], self.b[at + 2], self.b[at + 3]]) as u64
    }
    fn large(&mut self, npages: u64) -> u64 {
        self.carve(npages, pg_make(PG_LARGE, 0, npages))
    }
    fn free_run(&mut self, npages: u64) -> u64 {
        let page = self.carve(npages, pg_make(PG_FREE, 0, npages));
        self.set_map(page + npages - 1, pg_make(PG_FREE, 0, npages));
        page
    }
    fn central_free(&mut self, c: usize, n: u64) {
        self.put64(OFF_CLASSES + c * CLASS_STATE_SIZE + CLASS_OFF_COUNT, n);
    }
    fn tcache(&mut self, i: usize, owner: u32, delta: i64, bins: &[(usize, u32)]) {
        let t = OFF_TCACHES + i * TCACHE_SIZE;
        self.put32(t + TCACHE_OFF_OWNER, owner);
        self.put64(t + TCACHE_OFF_ALLOC_DELTA, delta as u64);
        for &(c, n) in bins {
            self.put32(t + TCACHE_OFF_BINS + c * TCACHE_BIN_SIZE + BIN_OFF_COUNT, n);
        }
    }
    fn allocated(&mut self, n: u64) {
        self.put64(OFF_ALLOCATED, n);
    }
    fn root(&mut self, i: usize, name: &str, ptr: u64) {
        let at = OFF_ROOTS + i * ROOT_SIZE;
        self.b[at..at + ROOT_NAME_LEN].fill(0);
        self.b[at..at + name.len()].copy_from_slice(name.as_bytes());
        self.put64(at + ROOT_OFF_PTR, ptr);
    }
    /// An object's address: slot i of the slab at page.
    fn obj(&self, page: u64, c: usize, i: u64) -> u64 {
        BASE + page * PAGE + slab_geometry(self.sizes[c]).header + i * self.sizes[c] as u64
    }
    /// Top, committed and the checksums, as the runtime keeps them.
    fn done(mut self) -> Vec<u8> {
        self.put64(OFF_TOP, self.top);
        let len = self.b.len() as u64;
        self.put64(OFF_COMMITTED, len);
        let roots = arena::fnv1a(&self.b[OFF_ROOTS..OFF_ROOTS + MAX_ROOTS * ROOT_SIZE]);
        self.put64(OFF_ROOTS_CHECKSUM, roots);
        let sum = arena::fnv1a(&self.b[..arena::CHECKED_LEN]);
        self.put64(arena::CHECKED_LEN, sum);
        let _ = self.max;
        self.b
    }
}

fn read(b: &[u8]) -> ArenaReport {
    inspect_arena("table", b, Duration::from_secs(10))
}

fn class_of(r: &ArenaReport, size: u32) -> Option<&ClassUse> {
    r.classes.iter().find(|c| c.size == size)
}

const C16: usize = 0; // 16 B
const C8K: usize = 31; // 8192 B

/// Slabs of 16 B and 8 KiB objects, large runs, a free run, roots.
fn sample() -> (Vec<u8>, u64, u64, u64) {
    let mut a = Arena::new("table", 64 << 20);
    assert_eq!(a.sizes[C16], 16);
    assert_eq!(a.sizes[C8K], 8192);
    let s16 = a.slab(C16);
    let s8k = a.slab(C8K);
    let big = a.large(3);
    a.free_run(5);
    let huge = a.large(256);
    let (n16, n8k) = (a.nobjs(s16), a.nobjs(s8k));
    // 16 B: 10 in use, 2 of the free ones in a thread's cache
    a.central_free(C16, n16 - 12);
    a.tcache(3, 4242, 32, &[(C16, 2)]);
    a.central_free(C8K, n8k - 1);
    a.tcache(7, 0, 999, &[(C16, 9)]); // a free slot: not counted
    a.allocated(16 * 10 - 32 + 8192 + 3 * PAGE + 256 * PAGE);
    a.root(0, "table", a.obj(s8k, C8K, 0));
    a.root(5, "index", BASE + big * PAGE);
    a.root(6, "mid", a.obj(s16, C16, 3) + 8);
    let _ = huge;
    (a.done(), s16, s8k, big)
}

#[test]
fn class_table_is_the_runtimes() {
    let t = class_sizes();
    assert_eq!(&t[..9], &[16, 32, 48, 64, 80, 96, 112, 128, 160]);
    assert_eq!(t[NCLASSES - 1], SMALL_MAX);
    assert!(t.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn page_map_entries_decode() {
    let e = pg_make(PG_SLAB, 39, 4096) | PG_MARK;
    assert_eq!((pg_kind(e), pg_class(e), pg_n(e)), (PG_SLAB, 39, 4096));
    assert_eq!(pg_kind(0), PG_NONE);
}

#[test]
fn a_well_formed_arena_is_read_exactly() {
    let (b, _, _, _) = sample();
    let r = read(&b);
    assert!(r.exact, "{:?}", r.problems);
    assert!(r.header_ok && r.layout_ok && r.roots_ok);
    assert_eq!(r.header_name.as_deref(), Some("table"));
    assert_eq!((r.base, r.max_bytes), (BASE, 64 << 20));
    assert_eq!(r.mapped, b.len() as u64);
    assert_eq!(r.committed, b.len() as u64);
    let c16 = class_of(&r, 16).unwrap_or_else(|| panic!("no 16 B class: {r:?}"));
    assert_eq!((c16.slabs, c16.objects, c16.bytes), (1, 10, 160));
    assert_eq!(c16.free, c16.capacity - 10);
    let c8k = class_of(&r, 8192).unwrap_or_else(|| panic!("no 8 KiB class"));
    assert_eq!((c8k.slabs, c8k.objects), (1, 1));
    assert_eq!(r.classes.len(), 2);
    assert_eq!(
        r.large,
        LargeUse {
            objects: 2,
            bytes: 259 * PAGE,
            largest: 256 * PAGE
        }
    );
    assert_eq!(
        r.free_runs,
        FreeRuns {
            count: 1,
            bytes: 5 * PAGE
        }
    );
    assert_eq!(r.objects, 13);
    assert_eq!(r.allocated_bytes, 160 + 8192 + 259 * PAGE);
    assert_eq!(r.counted_bytes, r.allocated_bytes);
    assert_eq!(
        r.slab_bytes,
        (16 + 17) * PAGE,
        "64 KiB at least, 8 objects at least"
    );
    assert!(r.walk.complete);
    assert_eq!(r.walk.runs, 5);
    assert_eq!(r.walk.source, "bytes");
    assert!(r.locks_held.is_empty());
}

#[test]
fn roots_are_named_located_and_resolved() {
    let (b, _, _, big) = sample();
    let r = read(&b);
    let names: Vec<&str> = r.roots.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["table", "index", "mid"]);
    assert_eq!(
        r.roots[0].target,
        Some(Target {
            kind: "slab",
            size: 8192
        })
    );
    assert_eq!(r.roots[1].address, BASE + big * PAGE);
    assert_eq!(
        r.roots[1].target,
        Some(Target {
            kind: "large",
            size: 3 * PAGE
        })
    );
    // inside an object, not at its start
    assert!(r.roots[2].in_arena && r.roots[2].in_heap);
    assert_eq!(r.roots[2].target, None);
}

#[test]
fn a_root_outside_the_arena_is_reported() {
    let (mut b, _, _, _) = sample();
    let at = OFF_ROOTS + ROOT_SIZE * 5 + ROOT_OFF_PTR;
    b[at..at + 8].copy_from_slice(&0xdead_beefu64.to_le_bytes());
    let sum = arena::fnv1a(&b[OFF_ROOTS..OFF_ROOTS + MAX_ROOTS * ROOT_SIZE]);
    b[OFF_ROOTS_CHECKSUM..OFF_ROOTS_CHECKSUM + 8].copy_from_slice(&sum.to_le_bytes());
    let r = read(&b);
    let x = &r.roots[1];
    assert_eq!((x.name.as_str(), x.address), ("index", 0xdead_beef));
    assert!(!x.in_arena && !x.in_heap && x.target.is_none());
    assert!(!r.exact);
    assert!(r.problems.iter().any(|p| p.contains("outside the arena")));
    // beyond the end, and a name without a NUL
    let at = OFF_ROOTS + ROOT_SIZE * 5;
    b[at..at + ROOT_NAME_LEN].fill(b'x');
    b[at + ROOT_OFF_PTR..at + ROOT_OFF_PTR + 8].copy_from_slice(&(BASE + (64 << 20)).to_le_bytes());
    let r = read(&b);
    assert!(!r.roots[1].in_arena);
    assert_eq!(r.roots[1].name.len(), ROOT_NAME_LEN);
    assert!(!r.roots_ok, "the checksum was not updated");
}

#[test]
fn thread_caches_and_the_runtimes_count_agree() {
    let (b, _, _, _) = sample();
    let r = read(&b);
    // the owned cache's 2 blocks are free; the free slot's 9 are not looked at
    assert_eq!(class_of(&r, 16).map(|c| c.objects), Some(10));
    // the owned cache's delta is part of allocated_bytes, the free slot's is not
    assert_eq!(r.allocated_bytes, 160 + 8192 + 259 * PAGE);
}

#[test]
fn a_disagreement_with_the_runtimes_count_is_a_problem() {
    let (mut b, _, _, _) = sample();
    let v = u64_of(&b[OFF_ALLOCATED..]) + 16;
    b[OFF_ALLOCATED..OFF_ALLOCATED + 8].copy_from_slice(&v.to_le_bytes());
    let r = read(&b);
    assert!(!r.exact);
    assert_eq!(r.allocated_bytes, r.counted_bytes + 16);
    assert!(
        r.problems[0].contains("bytes allocated"),
        "{:?}",
        r.problems
    );
}

#[test]
fn held_locks_are_listed() {
    let (mut b, _, _, _) = sample();
    b[OFF_HEAP_LOCK..OFF_HEAP_LOCK + 4].copy_from_slice(&77u32.to_le_bytes());
    let c = OFF_CLASSES + 3 * CLASS_STATE_SIZE + CLASS_OFF_LOCK;
    b[c..c + 4].copy_from_slice(&78u32.to_le_bytes());
    let r = read(&b);
    assert_eq!(
        r.locks_held,
        [
            LockHeld {
                lock: "heap".into(),
                tid: 77
            },
            LockHeld {
                lock: "class 3".into(),
                tid: 78
            }
        ]
    );
}

#[test]
fn huge_free_counts_are_reported_not_trusted() {
    let (mut b, _, _, _) = sample();
    let o = OFF_CLASSES + C16 * CLASS_STATE_SIZE + CLASS_OFF_COUNT;
    b[o..o + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let t = OFF_TCACHES + 3 * TCACHE_SIZE + TCACHE_OFF_BINS + C16 * TCACHE_BIN_SIZE + BIN_OFF_COUNT;
    b[t..t + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let r = read(&b);
    let c = class_of(&r, 16).unwrap_or_else(|| panic!("class gone"));
    assert_eq!((c.free, c.objects), (u64::MAX, 0));
    assert!(r.problems.iter().any(|p| p.contains("free blocks counted")));
    // a class with no slab but free blocks (a stray count) is listed too
    let (mut b, _, _, _) = sample();
    let o = OFF_CLASSES + 5 * CLASS_STATE_SIZE + CLASS_OFF_COUNT;
    b[o..o + 8].copy_from_slice(&3u64.to_le_bytes());
    let r = read(&b);
    assert_eq!(class_of(&r, 96).map(|c| (c.slabs, c.free)), Some((0, 3)));
    assert!(!r.exact);
}

#[test]
fn a_malformed_page_map_stops_the_walk() {
    let (b, s16, _, _) = sample();
    let map_off = u64_of(&b[OFF_MAP_OFFSET..]) as usize;
    for (bad, words) in [
        (0, "does not start a run"), // n = 0
        (pg_make(PG_SLAB, C16 as u32, 1 << 30), "goes past the end"),
        (pg_make(PG_CONT, 0, 1), "does not start a run"),
        (pg_make(9, 0, 4), "does not start a run"), // no such kind
        (u64::MAX, "does not start a run"),
    ] {
        let mut b = b.clone();
        let at = map_off + (s16 as usize) * 8;
        b[at..at + 8].copy_from_slice(&bad.to_le_bytes());
        let r = read(&b);
        assert!(!r.walk.complete && !r.exact, "{bad:#x}");
        assert!(
            r.problems.iter().any(|p| p.contains(words)),
            "{bad:#x}: {:?}",
            r.problems
        );
        assert_eq!(r.walk.runs, 0);
    }
}

#[test]
fn bad_slab_headers_are_reported() {
    let (b, s16, _, _) = sample();
    let at = (s16 * PAGE) as usize;
    let cases: [(usize, u32, &str); 4] = [
        (SLAB_OFF_MAGIC, 0, "bad magic"),
        (SLAB_OFF_CLS, 3, "header says class 3"),
        (SLAB_OFF_NPAGES, 2, "2 pages"),
        (SLAB_OFF_NOBJS, u32::MAX, "do not fit"),
    ];
    for (off, v, words) in cases {
        let mut b = b.clone();
        b[at + off..at + off + 4].copy_from_slice(&v.to_le_bytes());
        let r = read(&b);
        assert!(!r.exact);
        assert!(
            r.problems.iter().any(|p| p.contains(words)),
            "{words}: {:?}",
            r.problems
        );
        // the slab is still counted as a slab, its objects are not
        assert_eq!(
            class_of(&r, 16).map(|c| (c.slabs, c.capacity)),
            Some((1, 0))
        );
    }
    // a slab class beyond the table
    let mut b = b.clone();
    let map_off = u64_of(&b[OFF_MAP_OFFSET..]) as usize + s16 as usize * 8;
    b[map_off..map_off + 8].copy_from_slice(&pg_make(PG_SLAB, 200, 16).to_le_bytes());
    let r = read(&b);
    assert!(r.problems.iter().any(|p| p.contains("class 200")));
    assert!(r.walk.complete);
}

#[test]
fn offsets_beyond_the_file_are_reported() {
    let (b, _, _, _) = sample();
    // the memfd ends in the middle of the heap, after the first slab
    let heap = u64_of(&b[OFF_HEAP_OFFSET..]) as usize;
    let r = read(&b[..heap + 16 * PAGE as usize]);
    assert!(!r.exact);
    assert!(r.problems.iter().any(|p| p.contains("beyond the memfd")));
    assert!(r.walk.complete, "the walk covers what can be read");
    assert_eq!(r.walk.runs, 1);
    assert_eq!(class_of(&r, 16).map(|c| c.objects), Some(10));
    // the 8 KiB class has free blocks counted and no slab that can be read
    assert_eq!(class_of(&r, 8192).map(|c| c.slabs), Some(0));
    // inside the second
    let r = read(&b[..heap + 20 * PAGE as usize]);
    assert!(!r.walk.complete);
    assert!(r.problems.iter().any(|p| p.contains("goes past the end")));
    // shorter than the page map
    let r = read(&b[..HDR_SIZE + 100]);
    assert!(r.problems.iter().any(|p| p.contains("beyond the memfd")));
    // a top beyond max_bytes, a heap offset beyond it
    for (off, v) in [
        (OFF_TOP, u64::MAX - 5),
        (OFF_TOP, 1 << 40),
        (OFF_HEAP_OFFSET, 1 << 50),
        (OFF_MAP_OFFSET, 12),
        (OFF_MAX_BYTES, u64::MAX),
        (OFF_MAX_BYTES, 0),
    ] {
        let mut b = b.clone();
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
        let r = read(&b);
        assert!(!r.exact && !r.walk.complete, "{off} = {v}");
        assert_eq!(r.walk.runs, 0);
    }
}

#[test]
fn a_short_or_foreign_file_is_not_an_arena() {
    let r = read(&[]);
    assert!(!r.header_ok && !r.exact);
    assert!(r.header_error.is_some());
    let (b, _, _, _) = sample();
    let r = read(&b[..5000]);
    assert!(r.header_ok, "the prefix is whole");
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("smaller than an arena header"))
    );
    let r = read(&vec![0x41u8; 200_000]);
    assert!(!r.header_ok && !r.layout_ok && !r.exact);
}

#[test]
fn another_runtimes_layout_is_not_read() {
    let (mut b, _, _, _) = sample();
    b[OFF_LAYOUT] ^= 1;
    let r = read(&b);
    assert!(!r.layout_ok && !r.exact);
    // the header checksum covers the layout: both are said
    assert!(!r.header_ok);
    assert!(r.problems.iter().any(|p| p.contains("another allocator")));
    assert!(r.classes.is_empty() && r.roots.is_empty());
    assert_eq!(r.base, BASE, "the checked prefix is still shown");
}

#[test]
fn a_name_that_differs_from_the_fds_is_a_problem() {
    let (b, _, _, _) = sample();
    let r = inspect_arena("sessions", b.as_slice(), Duration::from_secs(1));
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("names the arena \"table\""))
    );
}

#[test]
fn the_walk_stops_at_its_time_budget() {
    let mut a = Arena::new("table", 64 << 20);
    for _ in 0..3 * CLOCK_EVERY {
        a.large(1);
    }
    let n = 3 * CLOCK_EVERY;
    a.allocated(n * PAGE);
    let b = a.done();
    let r = inspect_arena("table", b.as_slice(), Duration::ZERO);
    assert!(!r.walk.complete && !r.exact);
    assert_eq!(r.walk.runs, CLOCK_EVERY);
    assert!(
        r.problems[0].contains("stopped after 0 ms"),
        "{:?}",
        r.problems
    );
    let r = read(&b);
    assert!(r.exact && r.large.objects == n);
}

#[test]
fn open_regions_go_to_their_arena() {
    // a control block with the arenas "table" and "sessions", a region
    // open in "sessions"
    let mut c = vec![0u8; cb::SIZE];
    let put32 = |c: &mut Vec<u8>, o: usize, v: u32| c[o..o + 4].copy_from_slice(&v.to_le_bytes());
    put32(&mut c, cb::OFF_NARENAS, 2);
    c[cb::OFF_ARENA_NAMES..cb::OFF_ARENA_NAMES + 5].copy_from_slice(b"table");
    let n1 = cb::OFF_ARENA_NAMES + cb::ARENA_NAME_LEN;
    c[n1..n1 + 8].copy_from_slice(b"sessions");
    let s = cb::OFF_SLOTS + 2 * cb::SLOT_SIZE;
    put32(&mut c, s, 999);
    c[s + cb::SLOT_OFF_DEPTH + 2..s + cb::SLOT_OFF_DEPTH + 4].copy_from_slice(&2u16.to_le_bytes());
    let regions = c.as_slice().open_regions();
    let (b, _, _, _) = sample();
    let mut arenas = vec![
        read(&b),
        inspect_arena("sessions", b.as_slice(), Duration::from_secs(1)),
    ];
    attach_regions(&mut arenas, &regions);
    assert!(arenas[0].open_regions.is_empty());
    assert_eq!(arenas[1].open_regions, [Region { tid: 999, depth: 2 }]);
}

fn memfd_with(bytes: &[u8], seal: bool) -> OwnedFd {
    use std::io::Write;
    let flags = libc::MFD_CLOEXEC | if seal { libc::MFD_ALLOW_SEALING } else { 0 };
    // SAFETY: memfd_create with a static NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"rekindle:table".as_ptr(), flags) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh descriptor that we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut f = std::fs::File::from(owned);
    f.write_all(bytes).unwrap_or_else(|e| panic!("{e}"));
    let owned = OwnedFd::from(f);
    if seal {
        // SAFETY: fcntl on our own memfd.
        let r = unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
        assert_eq!(r, 0);
    }
    owned
}

#[test]
fn a_memfd_is_read_with_pread() {
    let (b, _, _, _) = sample();
    let want = read(&b);
    for seal in [true, false] {
        let fd = memfd_with(&b, seal);
        let src = FdSource::open(fd.as_fd()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(src.how(), "pread");
        let mut r = inspect_arena("table", &src, Duration::from_secs(10));
        assert_eq!(r.walk.source, "pread");
        r.walk.source = "bytes";
        r.walk.us = want.walk.us;
        assert_eq!(r, want);
        // reads past the end are refused
        let mut buf = [0u8; 16];
        assert!(src.read_at(b.len() as u64 - 8, &mut buf).is_err());
        assert!(src.read_at(u64::MAX - 4, &mut buf).is_err());
    }
    // a file that shrank after the fstat (an unsealed one)
    let fd = memfd_with(&b, false);
    let src = FdSource::open(fd.as_fd()).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: plain syscall on our own memfd.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 200_000) }, 0);
    let r = inspect_arena("table", &src, Duration::from_secs(1));
    assert!(!r.exact, "the slab headers are gone");
    assert!(
        r.problems.iter().any(|p| p.contains("beyond the end")),
        "{:?}",
        r.problems
    );
    let empty = memfd_with(&[], true);
    let src = FdSource::open(empty.as_fd()).unwrap_or_else(|e| panic!("{e}"));
    assert!(!inspect_arena("table", &src, Duration::from_secs(1)).header_ok);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = read(&data);
    }

    /// Random words written over a valid arena's header, page map and slab
    /// headers: whatever they say, the reader stays inside the bytes.
    #[test]
    fn corrupted_arenas_never_panic(
        writes in proptest::collection::vec((0usize..200_000, any::<u64>(), 0u8..4), 1..24)
    ) {
        let (mut b, s16, _, _) = sample();
        let len = b.len();
        let hot = [
            OFF_TOP, OFF_MAP_OFFSET, OFF_HEAP_OFFSET, OFF_MAX_BYTES, OFF_BASE,
            OFF_CLASSES + CLASS_OFF_COUNT, OFF_ROOTS + ROOT_OFF_PTR,
            (s16 * PAGE) as usize + SLAB_OFF_NOBJS,
        ];
        for (pos, v, how) in writes {
            let at = match how {
                0 => hot[pos % hot.len()],
                1 => u64_of(&b[OFF_MAP_OFFSET..]).min(len as u64 - 8) as usize + (pos % 4096) * 8,
                _ => pos % (len - 8),
            };
            if at + 8 <= len {
                b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
        let r = read(&b);
        prop_assert!(r.problems.len() <= MAX_PROBLEMS + 1);
        prop_assert!(r.walk.runs <= (len as u64) / PAGE);
    }
}

/// How long a 16 GiB arena takes, page map full: `cargo test --release
/// -- --ignored --nocapture sixteen_gib`.  The heap is sparse (a memfd whose
/// pages are never written) but for the page map and, in the slab case,
/// the 262144 slab headers (1 GiB of memory).
#[test]
#[ignore]
fn sixteen_gib_arena_timing() {
    const MAX: u64 = 16 << 30;
    for layout in ["large runs of one page", "slabs of 16 pages"] {
        let mut a = Arena::new("table", MAX);
        let first = a.heap_offset / PAGE;
        let pages = (MAX - a.heap_offset) / PAGE;
        let mut slabs: Vec<u64> = Vec::new();
        let mut page = first;
        while page < first + pages {
            if layout.starts_with("large") {
                a.set_map(page, pg_make(PG_LARGE, 0, 1));
                page += 1;
            } else if page + 16 <= first + pages {
                a.set_map(page, pg_make(PG_SLAB, 0, 16));
                for i in 1..16 {
                    a.set_map(page + i, pg_make(PG_CONT, 0, i));
                }
                slabs.push(page);
                page += 16;
            } else {
                let n = first + pages - page;
                a.set_map(page, pg_make(PG_FREE, 0, n));
                page += n;
            }
        }
        a.top = (page - first) * PAGE;
        let g16 = slab_geometry(16);
        assert_eq!(g16.pages, 16);
        let nobjs = g16.nobjs;
        let s = OFF_CLASSES + CLASS_OFF_SLABS;
        a.put64(s, slabs.len() as u64);
        a.central_free(0, slabs.len() as u64 * nobjs);
        if layout.starts_with("large") {
            a.allocated(pages * PAGE);
        }
        let mut b = a.done();
        let size = a_heap_end(&b);
        b[OFF_COMMITTED..OFF_COMMITTED + 8].copy_from_slice(&size.to_le_bytes());
        let fd = memfd_with(&b, true);
        // SAFETY: syscalls on our own memfd, into our own buffers.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), size as libc::off_t), 0);
            for &p in &slabs {
                let mut h = [0u8; SLAB_READ];
                h[SLAB_OFF_MAGIC..4].copy_from_slice(&SLAB_MAGIC.to_le_bytes());
                h[SLAB_OFF_NOBJS..SLAB_OFF_NOBJS + 4]
                    .copy_from_slice(&(nobjs as u32).to_le_bytes());
                h[SLAB_OFF_NPAGES..SLAB_OFF_NPAGES + 4].copy_from_slice(&16u32.to_le_bytes());
                let first = BASE + p * PAGE + g16.header;
                h[SLAB_OFF_FIRST..SLAB_OFF_FIRST + 8].copy_from_slice(&first.to_le_bytes());
                let n = libc::pwrite(
                    fd.as_raw_fd(),
                    h.as_ptr().cast(),
                    h.len(),
                    (p * PAGE) as libc::off_t,
                );
                assert_eq!(n, h.len() as isize);
            }
        }
        for _ in 0..2 {
            let src = FdSource::open(fd.as_fd()).unwrap_or_else(|e| panic!("{e}"));
            let t = Instant::now();
            let r = inspect_arena("table", &src, Duration::from_secs(60));
            let took = t.elapsed();
            assert!(r.exact, "{:?}", r.problems);
            println!(
                "16 GiB, {layout}: {} runs, {} objects, {} in {:.1} ms",
                r.walk.runs,
                r.objects,
                src.how(),
                took.as_secs_f64() * 1000.0
            );
        }
    }
}

fn a_heap_end(b: &[u8]) -> u64 {
    u64_of(&b[OFF_HEAP_OFFSET..]) + u64_of(&b[OFF_TOP..])
}
