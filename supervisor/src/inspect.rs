//! `rekindle inspect`: what an app's arenas hold, read from the arena memfds
//! the supervisor holds (docs in supervisor/README.md, "rekindle inspect").
//!
//! An arena is `[header | page map (8 B per page) | heap]`, and every
//! allocator structure lives inside it (runtime/src/rk_internal.h, the
//! arena section; runtime/src/alloc.c).  This module reads one through a
//! [`ByteSource`] — `pread` on the memfd, a byte slice in the tests — and
//! trusts nothing in it: every offset and count is bounds-checked, a
//! pointer stored in the arena (an absolute address in the app) is only
//! compared with the arena's range and translated by subtracting `base`,
//! never followed outside it, and the walk is bounded by the heap's page
//! count and by a time budget.  What does not add up goes to `problems`
//! (then `exact` is false); nothing here panics on any input.
//!
//! What is counted, and how exactly:
//! - the heap is walked run by run through the page map, as the runtime's
//!   sweep does (`FOR_EACH_RUN` in sweep.c): a slab run gives its class and
//!   object count (`nobjs` from its header, checked), a large run is one
//!   object of its pages, a free run is free pages;
//! - free small objects are the class free-list counts (`classes[c].count`)
//!   plus the per-thread cache counts (`tcaches[i].bins[c].count`) of the
//!   caches that have an owner.  The allocator keeps those counts with its
//!   lists (under the class lock; a cache's count right after the store
//!   that commits its list), so they are exact while no thread is inside
//!   the allocator, and no list has to be walked.  A thread killed between
//!   those two stores leaves a count one off: the totals below disagree,
//!   and that is said;
//! - `allocated_bytes` is the runtime's own figure (`rk_arena_stats`: the
//!   header's counter plus the owned caches' deltas), and `counted_bytes`
//!   what the walk adds up; they agree on a quiet arena.  A running app may
//!   allocate while it is read: a disagreement, or a slab header read
//!   half-written, is a problem reported, not an error.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use serde::Serialize;
use thiserror::Error;

use crate::arena;
use crate::control_block::OpenRegion;

// ---- the layout (checked against rk_internal.h by tests/layout.rs) ---------

pub const PAGE: u64 = 4096;
/// sizeof(struct rk_arena_hdr)
pub const HDR_SIZE: usize = 228096;
pub const OFF_PAGE_SIZE: usize = 12;
pub const OFF_LAYOUT: usize = 16;
pub const OFF_BASE: usize = 24;
pub const OFF_MAX_BYTES: usize = 32;
pub const OFF_MAP_OFFSET: usize = 40;
pub const OFF_HEAP_OFFSET: usize = 48;
pub const OFF_NAME: usize = 64;
pub const NAME_LEN: usize = 48;
pub const OFF_ROOT_LOCK: usize = 128;
pub const OFF_ROOTS_CHECKSUM: usize = 136;
pub const OFF_ROOTS: usize = 144;
pub const MAX_ROOTS: usize = 64;
pub const ROOT_SIZE: usize = 56;
pub const ROOT_OFF_NAME: usize = 0;
pub const ROOT_NAME_LEN: usize = 48;
pub const ROOT_OFF_PTR: usize = 48;
pub const OFF_HEAP_LOCK: usize = 3776;
pub const OFF_TOP: usize = 3784;
pub const OFF_COMMITTED: usize = 3792;
pub const OFF_ALLOCATED: usize = 3800;
pub const OFF_CLASSES: usize = 4352;
pub const NCLASSES: usize = 40;
pub const CLASS_STATE_SIZE: usize = 64;
pub const CLASS_OFF_LOCK: usize = 0;
pub const CLASS_OFF_COUNT: usize = 16;
pub const CLASS_OFF_SLABS: usize = 24;
pub const OFF_TCACHES: usize = 6912;
pub const MAX_TCACHES: usize = 128;
pub const TCACHE_SIZE: usize = 1728;
pub const TCACHE_OFF_OWNER: usize = 0;
pub const TCACHE_OFF_ALLOC_DELTA: usize = 8;
pub const TCACHE_OFF_BINS: usize = 24;
pub const TCACHE_BIN_SIZE: usize = 16;
pub const BIN_OFF_COUNT: usize = 8;
pub const SMALL_MAX: u32 = 32768;
pub const TCACHE_MAX: u64 = 64;

/// Page map entries (enum rk_page_kind and the RK_PG_* macros).
pub const PG_NONE: u32 = 0;
pub const PG_SLAB: u32 = 1;
pub const PG_LARGE: u32 = 2;
pub const PG_CONT: u32 = 3;
pub const PG_FREE: u32 = 4;
pub const PG_MARK: u64 = 0x1000;

pub fn pg_kind(e: u64) -> u32 {
    (e & 0xf) as u32
}
pub fn pg_class(e: u64) -> u32 {
    ((e >> 4) & 0xff) as u32
}
/// Run pages, or the back offset to the run's first page for PG_CONT.
pub fn pg_n(e: u64) -> u64 {
    e >> 32
}
pub fn pg_make(kind: u32, class: u32, n: u64) -> u64 {
    kind as u64 | ((class as u64) << 4) | (n << 32)
}

/// The slab header at the start of every slab run (struct rk_slab).
pub const SLAB_MAGIC: u32 = 0x4241_4c53;
pub const SLAB_SIZE: usize = 1048;
/// The fixed part of a slab header, rounded up to 16 bytes (a slab with no
/// tag byte); alloc.c's slab_header_bytes(n) adds one tag byte per object.
pub const SLAB_HEADER_BYTES: u64 = 1056;
/// RK_SLAB_MIN_PAGES and RK_PENDING_LOG.
pub const SLAB_MIN_PAGES: u64 = 16;
pub const PENDING_LOG: u64 = 128;

/// alloc.c's slab_header_bytes(): object 0 of a slab of nobjs objects
/// starts this far into it (the fixed header, then a tag byte per object).
pub fn slab_header_bytes(nobjs: u64) -> u64 {
    (SLAB_SIZE as u64 + nobjs + 15) & !15
}

/// A class's slab geometry as alloc.c's classes_init() computes it: pages
/// per slab, objects per slab, and where object 0 starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabGeometry {
    pub pages: u64,
    pub nobjs: u64,
    pub header: u64,
}

pub fn slab_geometry(size: u32) -> SlabGeometry {
    let size = size as u64;
    let want = (slab_header_bytes(8) + 8 * size)
        .div_ceil(PAGE)
        .max(SLAB_MIN_PAGES);
    let mut nobjs = ((want * PAGE - SLAB_SIZE as u64) / (size + 1)).min(SLAB_MAX_OBJECTS);
    while slab_header_bytes(nobjs) + nobjs * size > want * PAGE {
        nobjs -= 1;
    }
    SlabGeometry {
        pages: want,
        nobjs,
        header: slab_header_bytes(nobjs),
    }
}
pub const SLAB_MAX_OBJECTS: u64 = 4096;
pub const SLAB_OFF_MAGIC: usize = 0;
pub const SLAB_OFF_CLS: usize = 4;
pub const SLAB_OFF_NOBJS: usize = 8;
pub const SLAB_OFF_NPAGES: usize = 12;
pub const SLAB_OFF_FIRST: usize = 16;
const SLAB_READ: usize = 24;

/// The allocator's size classes, as alloc.c's classes_init() computes them:
/// 16 to 128 by 16, then four steps per power of two up to RK_SMALL_MAX.
/// tests/layout.rs compares it with the C table.
pub fn class_sizes() -> [u32; NCLASSES] {
    let mut t = [0u32; NCLASSES];
    let mut n = 0;
    for s in (16..=128).step_by(16) {
        t[n] = s;
        n += 1;
    }
    let mut b = 128u32;
    while b < SMALL_MAX {
        for k in 1..=4 {
            if n < NCLASSES {
                t[n] = b + k * b / 4;
                n += 1;
            }
        }
        b *= 2;
    }
    t
}

/// alloc.c's rk_layout_hash(): FNV-1a 64 over the class table, then over
/// the structure sizes.  Every arena stores its runtime's value at
/// OFF_LAYOUT; an arena whose value differs was made by a runtime whose
/// allocator this supervisor does not know, and only its header prefix is
/// read.
pub fn layout_hash() -> u64 {
    let sizes = class_sizes();
    let mut bytes = Vec::with_capacity(NCLASSES * 12 + 7 * 8);
    for s in sizes {
        bytes.extend_from_slice(&s.to_le_bytes());
    }
    // class_hdr[], then class_span[] (u32 each)
    for s in sizes {
        bytes.extend_from_slice(&(slab_geometry(s).header as u32).to_le_bytes());
    }
    for s in sizes {
        let g = slab_geometry(s);
        bytes.extend_from_slice(&((g.nobjs * s as u64) as u32).to_le_bytes());
    }
    for v in [
        HDR_SIZE as u64,
        SLAB_SIZE as u64,
        TCACHE_SIZE as u64,
        PAGE,
        SMALL_MAX as u64,
        TCACHE_MAX,
        PENDING_LOG,
    ] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    arena::fnv1a(&bytes)
}

// ---- byte sources ---------------------------------------------------------

#[derive(Debug, Error)]
pub enum ReadError {
    #[error("{len} bytes at offset {off} are beyond the end ({size} bytes)")]
    OutOfBounds { off: u64, len: usize, size: u64 },
    #[error("pread at offset {off}: {err}")]
    Io { off: u64, err: std::io::Error },
}

/// Read-only random access to an arena's bytes.
pub trait ByteSource {
    /// Bytes readable: [0, size).
    fn size(&self) -> u64;
    /// Fills buf from offset off, entirely or not at all.
    fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<(), ReadError>;
    /// How it reads ("pread", "bytes"), for the reply.
    fn how(&self) -> &'static str;
}

fn bounds(off: u64, len: usize, size: u64) -> Result<usize, ReadError> {
    match off.checked_add(len as u64) {
        Some(end) if end <= size => Ok(off as usize),
        _ => Err(ReadError::OutOfBounds { off, len, size }),
    }
}

impl ByteSource for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        let o = bounds(off, buf.len(), self.len() as u64)?;
        buf.copy_from_slice(&self[o..o + buf.len()]);
        Ok(())
    }
    fn how(&self) -> &'static str {
        "bytes"
    }
}

/// An arena memfd, read with pread: no mapping, so nothing the app does to
/// the file (a truncation, a hole punched) can fault the supervisor, and a
/// hole reads as zeros without being filled.  It is also the faster way
/// here: a mapping takes a page fault for each slab header it reads (a
/// 16 GiB arena of 64 KiB slabs: about twice as long; measured by
/// `sixteen_gib_arena_timing` in the tests).
pub struct FdSource<'a> {
    fd: BorrowedFd<'a>,
    size: u64,
}

impl<'a> FdSource<'a> {
    /// The memfd's size is taken now: reads stop there.
    pub fn open(fd: BorrowedFd<'a>) -> std::io::Result<Self> {
        // SAFETY: fstat into a zeroed struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(FdSource {
            fd,
            size: st.st_size.max(0) as u64,
        })
    }
}

impl ByteSource for FdSource<'_> {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        bounds(off, buf.len(), self.size)?;
        let mut got = 0usize;
        while got < buf.len() {
            let at = off + got as u64;
            // SAFETY: pread into the unfilled part of our own buffer.
            let n = unsafe {
                libc::pread(
                    self.fd.as_raw_fd(),
                    buf[got..].as_mut_ptr().cast(),
                    buf.len() - got,
                    at as libc::off_t,
                )
            };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(ReadError::Io { off: at, err });
            }
            if n == 0 {
                // shrunk since the fstat (arena memfds are sealed against
                // it, but this one need not be)
                return Err(ReadError::OutOfBounds {
                    off,
                    len: buf.len(),
                    size: at,
                });
            }
            got += n as usize;
        }
        Ok(())
    }
    fn how(&self) -> &'static str {
        "pread"
    }
}

// ---- the report -------------------------------------------------------------

/// Objects of one size class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClassUse {
    pub class: u32,
    /// Bytes per object.
    pub size: u32,
    pub slabs: u64,
    /// Object slots in those slabs.
    pub capacity: u64,
    /// Free slots: class free list plus thread caches.
    pub free: u64,
    /// Slots in use (capacity - free).
    pub objects: u64,
    /// objects * size
    pub bytes: u64,
}

/// Large objects: one page run each.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LargeUse {
    pub objects: u64,
    pub bytes: u64,
    pub largest: u64,
}

/// Free page runs inside the heap (below its top).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FreeRuns {
    pub count: u64,
    pub bytes: u64,
}

/// What a root points at, when it is an object's first byte.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    /// "slab" (a small object) or "large".
    pub kind: &'static str,
    /// The object's usable size.
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Root {
    pub name: String,
    /// The absolute address in the app.
    pub address: u64,
    /// Inside [base, base + max_bytes): the only roots rk_root_set accepts.
    pub in_arena: bool,
    /// Inside the heap carved so far.
    pub in_heap: bool,
    /// The object it starts, if it points at the first byte of one.
    pub target: Option<Target>,
}

/// A lock word of the arena found held: a thread is inside the allocator (or
/// died there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockHeld {
    /// "heap", "roots" or "class N".
    pub lock: String,
    pub tid: u32,
}

/// An open unsafe region of this arena, from the control block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Region {
    pub tid: u32,
    pub depth: u16,
}

/// How the heap was read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Walk {
    /// "pread" or "bytes".
    pub source: &'static str,
    /// Page runs visited.
    pub runs: u64,
    /// Every run up to the heap top was visited.
    pub complete: bool,
    /// Time spent on this arena.
    pub us: u64,
}

/// One arena, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ArenaReport {
    /// The name the runtime gave the supervisor with the fd.
    pub name: String,
    /// The name in the header (should be the same).
    pub header_name: Option<String>,
    /// The supervisor's header check (magic, version, checksum; arena.rs).
    pub header_ok: bool,
    pub header_error: Option<String>,
    /// The arena's layout hash is this supervisor's: the allocator was read.
    pub layout_ok: bool,
    pub roots_ok: bool,
    pub base: u64,
    pub max_bytes: u64,
    /// The memfd's size.
    pub mapped: u64,
    /// The memfd size the header records.
    pub committed: u64,
    pub heap_offset: u64,
    /// Heap bytes carved so far (the header's `top`).
    pub heap_bytes: u64,
    /// The runtime's count of bytes allocated (rk_arena_stats).
    pub allocated_bytes: u64,
    /// What the walk adds up: small objects in use by class size, plus
    /// large runs.
    pub counted_bytes: u64,
    /// Objects in use, small and large.
    pub objects: u64,
    /// Pages of slab runs, in bytes.
    pub slab_bytes: u64,
    /// The classes with at least one slab, by class.
    pub classes: Vec<ClassUse>,
    pub large: LargeUse,
    pub free_runs: FreeRuns,
    pub roots: Vec<Root>,
    pub locks_held: Vec<LockHeld>,
    pub open_regions: Vec<Region>,
    /// No problem found: the counts are exact.
    pub exact: bool,
    pub problems: Vec<String>,
    pub walk: Walk,
}

/// At most this many problems are listed (then a count of the rest).
pub const MAX_PROBLEMS: usize = 32;
/// Runs visited between two looks at the clock.
const CLOCK_EVERY: u64 = 4096;
/// Page map entries read at once by the walk (512 KiB).
const MAP_WINDOW: u64 = 65536;

struct Problems {
    list: Vec<String>,
    more: usize,
}

impl Problems {
    fn add(&mut self, p: String) {
        if self.list.len() < MAX_PROBLEMS {
            self.list.push(p);
        } else {
            self.more += 1;
        }
    }
    fn into_vec(mut self) -> Vec<String> {
        if self.more > 0 {
            self.list
                .push(format!("... and {} more problems", self.more));
        }
        self.list
    }
}

/// Little-endian fields of the header copy; a field beyond it reads 0.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn u32(&self, o: usize) -> u32 {
        let mut a = [0u8; 4];
        if let Some(s) = o.checked_add(4).and_then(|e| self.0.get(o..e)) {
            a.copy_from_slice(s);
        }
        u32::from_le_bytes(a)
    }
    fn u64(&self, o: usize) -> u64 {
        let mut a = [0u8; 8];
        if let Some(s) = o.checked_add(8).and_then(|e| self.0.get(o..e)) {
            a.copy_from_slice(s);
        }
        u64::from_le_bytes(a)
    }
    /// A NUL-terminated name of at most cap bytes; None if it has no NUL.
    fn cstr(&self, o: usize, cap: usize) -> Option<String> {
        let s = self.0.get(o..o.checked_add(cap)?)?;
        let n = s.iter().position(|&c| c == 0)?;
        Some(String::from_utf8_lossy(&s[..n]).into_owned())
    }
}

fn u64_of(b: &[u8]) -> u64 {
    Fields(b).u64(0)
}

/// The page map, read a window of entries at a time.
struct PageMap<'s, S: ByteSource + ?Sized> {
    src: &'s S,
    map_offset: u64,
    /// Pages [0, end) have entries that may be read.
    end: u64,
    /// Entries read at once.
    window: u64,
    start: u64,
    entries: Vec<u64>,
    raw: Vec<u8>,
}

impl<'s, S: ByteSource + ?Sized> PageMap<'s, S> {
    fn new(src: &'s S, map_offset: u64, end: u64, window: u64) -> Self {
        PageMap {
            src,
            map_offset,
            end,
            window: window.max(1),
            start: 0,
            entries: Vec::new(),
            raw: Vec::new(),
        }
    }

    fn get(&mut self, page: u64) -> Result<u64, ReadError> {
        if page >= self.end {
            return Err(ReadError::OutOfBounds {
                off: self.map_offset.saturating_add(page.saturating_mul(8)),
                len: 8,
                size: self.map_offset.saturating_add(self.end.saturating_mul(8)),
            });
        }
        if page < self.start || page - self.start >= self.entries.len() as u64 {
            let n = (self.end - page).min(self.window) as usize;
            self.raw.resize(n * 8, 0);
            self.entries.clear();
            // page < end, and map_offset + end * 8 was checked to fit
            self.src
                .read_at(self.map_offset + page * 8, &mut self.raw)?;
            self.entries.extend(self.raw.chunks_exact(8).map(u64_of));
            self.start = page;
        }
        Ok(self.entries[(page - self.start) as usize])
    }
}

/// A slab header, checked against the page map entry that led to it.
struct Slab {
    nobjs: u64,
    first: u64,
}

/// Reads the slab header at page and checks it against its page map entry
/// (class, run length) and the slab's room; Err says how it differs.
fn read_slab<S: ByteSource + ?Sized>(
    src: &S,
    base: u64,
    page: u64,
    class: u32,
    npages: u64,
    sizes: &[u32; NCLASSES],
) -> Result<Slab, String> {
    let mut b = [0u8; SLAB_READ];
    src.read_at(page * PAGE, &mut b)
        .map_err(|e| format!("slab header at page {page}: {e}"))?;
    let f = Fields(&b);
    let (magic, cls, nobjs, np, first) = (
        f.u32(SLAB_OFF_MAGIC),
        f.u32(SLAB_OFF_CLS),
        f.u32(SLAB_OFF_NOBJS) as u64,
        f.u32(SLAB_OFF_NPAGES) as u64,
        f.u64(SLAB_OFF_FIRST),
    );
    let size = sizes[class as usize] as u64;
    // object 0 starts after the header and one tag byte per object (of
    // the count the header claims, checked against the room just below)
    let header = slab_header_bytes(nobjs.min(SLAB_MAX_OBJECTS));
    let want_first = base.wrapping_add(page * PAGE).wrapping_add(header);
    let room = (npages * PAGE).saturating_sub(header);
    if magic != SLAB_MAGIC {
        Err(format!("slab at page {page}: bad magic {magic:#x}"))
    } else if cls != class || np != npages {
        Err(format!(
            "slab at page {page}: header says class {cls}, {np} pages; the page map class {class}, {npages} pages"
        ))
    } else if first != want_first || nobjs == 0 || nobjs > SLAB_MAX_OBJECTS || nobjs * size > room {
        Err(format!(
            "slab at page {page}: {nobjs} objects from {first:#x} do not fit it"
        ))
    } else {
        Ok(Slab { nobjs, first })
    }
}

/// The arena's geometry, checked: all in bytes from the arena's start.
struct Geometry {
    base: u64,
    map_offset: u64,
    heap_offset: u64,
    /// heap_offset + top, clamped to what can be read
    heap_end: u64,
}

impl Geometry {
    fn first_page(&self) -> u64 {
        self.heap_offset / PAGE
    }
    fn end_page(&self) -> u64 {
        self.heap_end / PAGE
    }
}

/// Reads one arena.  `name` is the name the runtime gave with the fd;
/// `budget` bounds the time spent (the walk stops there, and says so).
pub fn inspect_arena<S: ByteSource + ?Sized>(name: &str, src: &S, budget: Duration) -> ArenaReport {
    let t0 = Instant::now();
    let mut r = ArenaReport {
        name: name.to_string(),
        mapped: src.size(),
        ..ArenaReport::default()
    };
    r.walk.source = src.how();
    let mut problems = Problems {
        list: Vec::new(),
        more: 0,
    };
    read_arena(&mut r, src, t0, budget, &mut problems);
    r.problems = problems.into_vec();
    r.exact = r.problems.is_empty() && r.walk.complete;
    r.walk.us = t0.elapsed().as_micros().min(u64::MAX as u128) as u64;
    r
}

/// A report for an arena whose fd could not be read at all.
pub fn unreadable(name: &str, why: &str) -> ArenaReport {
    ArenaReport {
        name: name.to_string(),
        header_error: Some(why.to_string()),
        problems: vec![why.to_string()],
        ..ArenaReport::default()
    }
}

fn read_arena<S: ByteSource + ?Sized>(
    r: &mut ArenaReport,
    src: &S,
    t0: Instant,
    budget: Duration,
    problems: &mut Problems,
) {
    let size = src.size();
    let hlen = size.min(HDR_SIZE as u64) as usize;
    let mut hdr = vec![0u8; hlen];
    if let Err(e) = src.read_at(0, &mut hdr) {
        problems.add(format!("cannot read the header: {e}"));
        r.header_error = Some(format!("cannot read the header: {e}"));
        return;
    }
    let check = arena::check_header_bytes(&hdr[..hlen.min(arena::HDR_PREFIX)]);
    r.header_ok = check.is_ok();
    r.header_error = check.err();
    if let Some(e) = &r.header_error {
        problems.add(format!("header: {e}"));
    }
    let h = Fields(&hdr);
    r.header_name = h.cstr(OFF_NAME, NAME_LEN);
    r.base = h.u64(OFF_BASE);
    r.max_bytes = h.u64(OFF_MAX_BYTES);
    r.heap_offset = h.u64(OFF_HEAP_OFFSET);
    if hlen < HDR_SIZE {
        problems.add(format!(
            "the memfd ({size} bytes) is smaller than an arena header ({HDR_SIZE} bytes)"
        ));
        return;
    }
    let page_size = h.u32(OFF_PAGE_SIZE);
    let layout = h.u64(OFF_LAYOUT);
    r.layout_ok = page_size as u64 == PAGE && layout == layout_hash();
    if !r.layout_ok {
        problems.add(format!(
            "layout {layout:#x} (page size {page_size}) is not this supervisor's {:#x}: \
             made by a runtime with another allocator, which is not read",
            layout_hash()
        ));
        return;
    }
    match &r.header_name {
        Some(n) if *n == r.name => {}
        Some(n) => problems.add(format!("the header names the arena {n:?}")),
        None => problems.add("the header's name has no NUL".into()),
    }
    r.committed = h.u64(OFF_COMMITTED);
    r.heap_bytes = h.u64(OFF_TOP);
    if r.committed != size {
        problems.add(format!(
            "the header says the memfd is {} bytes; it is {size}",
            r.committed
        ));
    }
    let sizes = class_sizes();
    locks_held(r, &h);
    let geo = geometry(r, &h, size, problems);
    if let Some(geo) = &geo {
        let walked = walk(r, src, geo, &sizes, t0, budget, problems);
        count_objects(r, &h, &sizes, &walked, problems);
    }
    roots(r, &h, src, geo.as_ref(), &sizes, problems);
}

fn locks_held(r: &mut ArenaReport, h: &Fields) {
    let mut add = |lock: String, tid: u32| {
        if tid != 0 {
            r.locks_held.push(LockHeld { lock, tid });
        }
    };
    add("heap".into(), h.u32(OFF_HEAP_LOCK));
    add("roots".into(), h.u32(OFF_ROOT_LOCK));
    for c in 0..NCLASSES {
        add(
            format!("class {c}"),
            h.u32(OFF_CLASSES + c * CLASS_STATE_SIZE + CLASS_OFF_LOCK),
        );
    }
}

/// The header's offsets, checked against each other and the memfd.
fn geometry(r: &ArenaReport, h: &Fields, size: u64, problems: &mut Problems) -> Option<Geometry> {
    let (max, map_offset, heap_offset, top) = (
        r.max_bytes,
        h.u64(OFF_MAP_OFFSET),
        r.heap_offset,
        r.heap_bytes,
    );
    let map_end = (max / PAGE)
        .checked_mul(8)
        .and_then(|b| b.checked_add(map_offset));
    let sane = max > 0
        && max.is_multiple_of(PAGE)
        && map_offset >= HDR_SIZE as u64
        && map_offset.is_multiple_of(8)
        && heap_offset.is_multiple_of(PAGE)
        && heap_offset <= max
        && map_end.is_some_and(|e| e <= heap_offset);
    if !sane {
        problems.add(format!(
            "bad geometry: max_bytes {max}, page map at {map_offset}, heap at {heap_offset}"
        ));
        return None;
    }
    let Some(heap_end) = heap_offset.checked_add(top).filter(|&e| e <= max) else {
        problems.add(format!(
            "heap top {top} is beyond max_bytes {max} (heap at {heap_offset})"
        ));
        return None;
    };
    if !top.is_multiple_of(PAGE) {
        problems.add(format!("heap top {top} is not a multiple of the page"));
    }
    if heap_offset > size {
        problems.add(format!(
            "the heap starts at {heap_offset}, beyond the memfd ({size} bytes)"
        ));
        return None;
    }
    let mut end = heap_end;
    if heap_end > size {
        problems.add(format!(
            "the heap ends at {heap_end}, beyond the memfd ({size} bytes): read up to there"
        ));
        end = size;
    }
    Some(Geometry {
        base: r.base,
        map_offset,
        heap_offset,
        heap_end: end - end % PAGE,
    })
}

/// Per class: slabs and object slots found by the walk.
struct Walked {
    slabs: [u64; NCLASSES],
    capacity: [u64; NCLASSES],
}

/// Visits the heap run by run (sweep.c's FOR_EACH_RUN), within the budget.
fn walk<S: ByteSource + ?Sized>(
    r: &mut ArenaReport,
    src: &S,
    geo: &Geometry,
    sizes: &[u32; NCLASSES],
    t0: Instant,
    budget: Duration,
    problems: &mut Problems,
) -> Walked {
    let mut w = Walked {
        slabs: [0; NCLASSES],
        capacity: [0; NCLASSES],
    };
    let (first, end) = (geo.first_page(), geo.end_page());
    let mut map = PageMap::new(src, geo.map_offset, end, MAP_WINDOW);
    let mut page = first;
    let mut bad_slabs = 0u64;
    while page < end {
        if r.walk.runs.is_multiple_of(CLOCK_EVERY) && r.walk.runs > 0 && t0.elapsed() > budget {
            problems.add(format!(
                "stopped after {} ms at heap page {} of {}: the counts cover the heap below it",
                budget.as_millis(),
                page - first,
                end - first
            ));
            break;
        }
        let e = match map.get(page) {
            Ok(e) => e,
            Err(err) => {
                problems.add(format!("page map: {err}"));
                break;
            }
        };
        let (kind, n) = (pg_kind(e), pg_n(e));
        if n == 0 || !matches!(kind, PG_SLAB | PG_LARGE | PG_FREE) {
            problems.add(format!(
                "page map entry {e:#x} at heap page {} does not start a run: the walk stops there",
                page - first
            ));
            break;
        }
        if n > end - page {
            problems.add(format!(
                "page map entry {e:#x} at heap page {}: a run of {n} pages goes past the end \
                 of the heap that can be read ({} pages): the walk stops there",
                page - first,
                end - first
            ));
            break;
        }
        match kind {
            PG_SLAB => {
                let c = pg_class(e);
                r.slab_bytes += n * PAGE;
                if c as usize >= NCLASSES {
                    problems.add(format!("slab at page {page}: class {c} does not exist"));
                } else {
                    match read_slab(src, geo.base, page, c, n, sizes) {
                        Ok(s) => {
                            w.slabs[c as usize] += 1;
                            w.capacity[c as usize] += s.nobjs;
                        }
                        Err(why) => {
                            bad_slabs += 1;
                            if bad_slabs <= 4 {
                                problems.add(why);
                            }
                            w.slabs[c as usize] += 1;
                        }
                    }
                }
            }
            PG_LARGE => {
                r.large.objects += 1;
                r.large.bytes += n * PAGE;
                r.large.largest = r.large.largest.max(n * PAGE);
            }
            _ => {
                r.free_runs.count += 1;
                r.free_runs.bytes += n * PAGE;
            }
        }
        page += n;
        r.walk.runs += 1;
    }
    if bad_slabs > 4 {
        problems.add(format!(
            "{bad_slabs} slabs with a bad header in all (their objects are not counted)"
        ));
    }
    r.walk.complete = page == end;
    w
}

/// Objects in use per class: the walk's slots minus the free counts.
fn count_objects(
    r: &mut ArenaReport,
    h: &Fields,
    sizes: &[u32; NCLASSES],
    w: &Walked,
    problems: &mut Problems,
) {
    let mut free = [0u64; NCLASSES];
    let mut delta: i128 = 0;
    for (c, f) in free.iter_mut().enumerate() {
        *f = h.u64(OFF_CLASSES + c * CLASS_STATE_SIZE + CLASS_OFF_COUNT);
    }
    for i in 0..MAX_TCACHES {
        let t = OFF_TCACHES + i * TCACHE_SIZE;
        if h.u32(t + TCACHE_OFF_OWNER) == 0 {
            continue; // a free slot: flushed when given up
        }
        delta += h.u64(t + TCACHE_OFF_ALLOC_DELTA) as i64 as i128;
        for (c, f) in free.iter_mut().enumerate() {
            let n = h.u32(t + TCACHE_OFF_BINS + c * TCACHE_BIN_SIZE + BIN_OFF_COUNT);
            *f = f.saturating_add(n as u64);
        }
    }
    let alloc = h.u64(OFF_ALLOCATED) as i128 + delta;
    r.allocated_bytes = alloc.clamp(0, u64::MAX as i128) as u64;
    let mut counted: u128 = r.large.bytes as u128;
    r.objects = r.large.objects;
    for c in 0..NCLASSES {
        let slabs_hdr = h.u64(OFF_CLASSES + c * CLASS_STATE_SIZE + CLASS_OFF_SLABS);
        if r.walk.complete && slabs_hdr != w.slabs[c] {
            problems.add(format!(
                "class {c} ({} B): the header counts {slabs_hdr} slabs, the page map {}",
                sizes[c], w.slabs[c]
            ));
        }
        if w.slabs[c] == 0 && free[c] == 0 {
            continue;
        }
        let objects = if free[c] <= w.capacity[c] {
            w.capacity[c] - free[c]
        } else {
            if r.walk.complete {
                problems.add(format!(
                    "class {c} ({} B): {} free blocks counted, but its slabs hold {}",
                    sizes[c], free[c], w.capacity[c]
                ));
            }
            0
        };
        let bytes = objects * sizes[c] as u64;
        counted += bytes as u128;
        r.objects += objects;
        r.classes.push(ClassUse {
            class: c as u32,
            size: sizes[c],
            slabs: w.slabs[c],
            capacity: w.capacity[c],
            free: free[c],
            objects,
            bytes,
        });
    }
    r.counted_bytes = counted.min(u64::MAX as u128) as u64;
    if r.walk.complete && r.counted_bytes != r.allocated_bytes {
        problems.add(format!(
            "the runtime counts {} bytes allocated, the walk {} (read while the app allocates, \
             or a block lost by a thread that died in the allocator)",
            r.allocated_bytes, r.counted_bytes
        ));
    }
}

fn roots<S: ByteSource + ?Sized>(
    r: &mut ArenaReport,
    h: &Fields,
    src: &S,
    geo: Option<&Geometry>,
    sizes: &[u32; NCLASSES],
    problems: &mut Problems,
) {
    let Some(table) = h.0.get(OFF_ROOTS..OFF_ROOTS + MAX_ROOTS * ROOT_SIZE) else {
        return; // a header shorter than the layout: refused before this
    };
    r.roots_ok = arena::fnv1a(table) == h.u64(OFF_ROOTS_CHECKSUM);
    if !r.roots_ok {
        problems.add("roots checksum mismatch".into());
    }
    // a root needs one or two entries
    let mut map = geo.map(|g| PageMap::new(src, g.map_offset, g.end_page(), 1));
    for i in 0..MAX_ROOTS {
        let slot = &table[i * ROOT_SIZE..(i + 1) * ROOT_SIZE];
        let raw_name = &slot[ROOT_OFF_NAME..ROOT_OFF_NAME + ROOT_NAME_LEN];
        if raw_name[0] == 0 {
            continue; // an empty slot
        }
        let at = OFF_ROOTS + i * ROOT_SIZE;
        let name = match h.cstr(at + ROOT_OFF_NAME, ROOT_NAME_LEN) {
            Some(n) => n,
            None => {
                problems.add(format!("root slot {i}: the name has no NUL"));
                String::from_utf8_lossy(raw_name).into_owned()
            }
        };
        let address = h.u64(at + ROOT_OFF_PTR);
        let off = address.wrapping_sub(r.base);
        let in_arena = address >= r.base && off < r.max_bytes;
        let in_heap = in_arena && geo.is_some_and(|g| off >= g.heap_offset && off < g.heap_end);
        if !in_arena {
            problems.add(format!(
                "root {name:?} = {address:#x} points outside the arena"
            ));
        }
        let target = match (in_heap, geo, map.as_mut()) {
            (true, Some(g), Some(m)) => target_of(src, g, m, off, sizes),
            _ => None,
        };
        r.roots.push(Root {
            name,
            address,
            in_arena,
            in_heap,
            target,
        });
    }
}

/// The object whose first byte is at offset off of the arena, if any (alloc.c's
/// run_of and object_start).
fn target_of<S: ByteSource + ?Sized>(
    src: &S,
    g: &Geometry,
    map: &mut PageMap<S>,
    off: u64,
    sizes: &[u32; NCLASSES],
) -> Option<Target> {
    let mut page = off / PAGE;
    let mut e = map.get(page).ok()?;
    if pg_kind(e) == PG_CONT {
        let back = pg_n(e);
        if back > page - g.first_page() {
            return None;
        }
        page -= back;
        e = map.get(page).ok()?;
    }
    let n = pg_n(e);
    match pg_kind(e) {
        PG_SLAB if (pg_class(e) as usize) < NCLASSES => {
            let c = pg_class(e);
            let s = read_slab(src, g.base, page, c, n, sizes).ok()?;
            let size = sizes[c as usize] as u64;
            let at = g.base.wrapping_add(off);
            let rel = at.checked_sub(s.first)?;
            (rel.is_multiple_of(size) && rel / size < s.nobjs)
                .then_some(Target { kind: "slab", size })
        }
        PG_LARGE if off == page * PAGE && n > 0 => Some(Target {
            kind: "large",
            size: n * PAGE,
        }),
        _ => None,
    }
}

/// Gives each arena the open unsafe regions the control block shows for
/// it (by name; the block lists an arena once, with its first slot).
pub fn attach_regions(arenas: &mut [ArenaReport], regions: &[OpenRegion]) {
    for a in arenas {
        a.open_regions = regions
            .iter()
            .filter(|r| r.arena == a.name)
            .map(|r| Region {
                tid: r.tid,
                depth: r.depth,
            })
            .collect();
    }
}

#[cfg(test)]
mod tests;
