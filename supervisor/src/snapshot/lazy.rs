//! Lazy restore (docs/snapshots.md, "Lazy restore"): the app starts before
//! its arenas are read back.  Their memfds are handed over empty; the app
//! maps them, registers the mappings with a userfaultfd in MISSING mode and
//! sends it over (LAZY, runtime/src/lazy.c).  A thread of ours then
//! installs each page the app touches (UFFDIO_COPY of the page read from
//! the store) and, between faults, the pages it has not touched yet, until
//! every page of the snapshot is in.  Then it unregisters the mappings.
//!
//! Only this thread puts pages in: a page the app can see came from us.  So
//! a fault on a page we already installed means the app punched it out (its
//! allocator gives memory back): it gets a zero page, which is what a hole
//! reads as.  UFFDIO_COPY fails with EEXIST on a page that is there, so a
//! page is never installed twice, whatever the order of faults and fills.
//! Forks are followed (UFFD_FEATURE_EVENT_FORK): a child's faults come on a
//! userfaultfd of its own, served the same way (the memfd is shared).
//!
//! If the app dies first, `fill_rest` writes the pages not yet in straight
//! into the memfds before anything reads them.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::proto::LazyRegion;
use crate::store::{PAGE, SnapshotReader, StoreError, fsio};

/// The kernel's userfaultfd ABI (linux/userfaultfd.h), checked against the
/// C headers by supervisor/tests/layout.rs.
pub const UFFDIO_COPY: u64 = 0xc028_aa03;
pub const UFFDIO_UNREGISTER: u64 = 0x8010_aa01;
pub const UFFDIO_WAKE: u64 = 0x8010_aa02;
pub const UFFD_MSG_LEN: usize = 32;
pub const UFFD_MSG_OFF_ADDRESS: usize = 16;
pub const UFFD_MSG_OFF_FORK_UFD: usize = 8;
pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
pub const UFFD_EVENT_FORK: u8 = 0x13;

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

/// Pages copied per UFFDIO_COPY in the background (contiguous ones).
const BATCH_PAGES: usize = 32;

/// Pages a fault brings in at most: the faulting one, then those after it
/// (`Serving::bring_after`).
const FAULT_AROUND: usize = 16;

/// One arena to fill: its region in the snapshot and its memfd (a dup of
/// the one the supervisor holds, for `fill_rest`).
pub struct LazyArena {
    pub name: String,
    pub region: u32,
    /// The memfd's size: no page at or past it exists.
    pub bytes: u64,
    pub fd: OwnedFd,
}

/// What fills the arenas: the snapshot's reader and the arenas.
pub struct Source {
    pub reader: SnapshotReader,
    pub arenas: Vec<LazyArena>,
}

impl Source {
    /// The non-zero pages of arena `k` in the snapshot, ascending, below
    /// its memfd's size (no page past it exists).
    fn arena_pages(&self, k: usize) -> impl Iterator<Item = u64> + '_ {
        let a = &self.arenas[k];
        let last = a.bytes.div_ceil(PAGE as u64);
        self.reader.pages(a.region).filter(move |&p| p < last)
    }

    /// The snapshot's pages still to come in (all but each header page).
    pub fn pages_to_fill(&self) -> u64 {
        (0..self.arenas.len())
            .map(|k| self.arena_pages(k).filter(|&p| p > 0).count() as u64)
            .sum()
    }
}

#[derive(Debug, Error)]
pub enum LazyError {
    #[error("LAZY names arena {0:?}, which the snapshot does not hold")]
    UnknownArena(String),
    #[error("LAZY maps arena {name:?} in {len} bytes, smaller than its memfd ({bytes})")]
    MappingTooSmall { name: String, len: u64, bytes: u64 },
    #[error("the app's address space is gone")]
    AppGone,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{op} failed: {err}")]
    Sys {
        op: &'static str,
        err: std::io::Error,
    },
}

impl LazyError {
    pub fn code(&self) -> &'static str {
        match self {
            LazyError::UnknownArena(_) | LazyError::MappingTooSmall { .. } => "lazy_bad_message",
            LazyError::AppGone => "app_gone",
            LazyError::Store(e) => e.code(),
            LazyError::Sys { .. } => "lazy_userfaultfd",
        }
    }
}

/// Which pages of each arena are in (installed by us or written by
/// `fill_rest`); shared by the fault server and the filler.
pub struct Filled {
    bits: Vec<Vec<AtomicU64>>,
}

impl Filled {
    /// Page 0 of each arena is in: `materialize_with` wrote it (the
    /// supervisor's header check reads it).
    pub fn new(src: &Source) -> Filled {
        let f = Filled {
            bits: src
                .arenas
                .iter()
                .map(|a| {
                    let words = a.bytes.div_ceil(PAGE as u64).div_ceil(64) as usize;
                    (0..words).map(|_| AtomicU64::new(0)).collect()
                })
                .collect(),
        };
        for k in 0..src.arenas.len() {
            f.set(k, 0);
        }
        f
    }
    fn get(&self, arena: usize, page: u64) -> bool {
        self.bits[arena]
            .get((page / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (page % 64)) != 0)
    }
    fn set(&self, arena: usize, page: u64) {
        if let Some(w) = self.bits[arena].get((page / 64) as usize) {
            w.fetch_or(1 << (page % 64), Ordering::AcqRel);
        }
    }
}

/// What the thread did.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Pages of the snapshot installed because the app touched them.
    pub faulted: u64,
    /// Pages installed with a faulting one (the present pages right after
    /// it that were not in yet: `FAULT_AROUND`).
    pub faulted_around: u64,
    /// Zero pages (none in the snapshot) the app touched: a zero page each.
    pub zero_faulted: u64,
    /// Faults on pages already in (punched since): given a zero page.
    pub refaulted: u64,
    /// Pages installed in the background.
    pub filled: u64,
    /// Forked children followed.
    pub forks: u64,
    /// The longest a fault waited for us, from our read of it.
    pub max_fault_us: u64,
    /// From the start to every page in.
    pub took: Duration,
}

/// The thread's result, with the source back for a `fill_rest`.
pub struct Finished {
    pub source: Source,
    pub filled: Filled,
    pub stats: Stats,
    /// Ok(true): every page in and the mappings unregistered; Ok(false):
    /// stopped first (the app is gone).
    pub result: Result<bool, LazyError>,
}

/// The serving thread.
pub struct Server {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Option<Finished>>,
    pub started: Instant,
}

/// An arena as the app mapped it.
struct Mapped {
    addr: u64,
    len: u64,
    arena: usize,
}

impl Server {
    /// Starts serving `uffd` for the arenas of `regions` (LAZY).  An error
    /// gives the source back: the caller fills it with `fill_rest`.
    /// `fill_rate`: background pages per second at most (0: no limit);
    /// faults are served at once whatever it is.
    pub fn start(
        uffd: OwnedFd,
        regions: &[LazyRegion],
        source: Source,
        fill_rate: u64,
    ) -> Result<Server, Box<(LazyError, Source)>> {
        let mut mapped = Vec::new();
        for r in regions {
            let Some(k) = source.arenas.iter().position(|a| a.name == r.name) else {
                return Err(Box::new((LazyError::UnknownArena(r.name.clone()), source)));
            };
            if r.len < source.arenas[k].bytes {
                let e = LazyError::MappingTooSmall {
                    name: r.name.clone(),
                    len: r.len,
                    bytes: source.arenas[k].bytes,
                };
                return Err(Box::new((e, source)));
            }
            mapped.push(Mapped {
                addr: r.addr,
                len: r.len,
                arena: k,
            });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        // the source comes back through the slot if the thread cannot start
        let slot = Arc::new(Mutex::new(Some(source)));
        let slot2 = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("rk-lazy-restore".into())
            .spawn(move || {
                let source = slot2.lock().ok().and_then(|mut s| s.take());
                source.map(|src| serve(uffd, mapped, src, fill_rate, &stop2))
            });
        match spawned {
            Ok(handle) => Ok(Server {
                stop,
                handle,
                started: Instant::now(),
            }),
            Err(err) => match slot.lock().ok().and_then(|mut s| s.take()) {
                Some(src) => Err(Box::new((
                    LazyError::Sys {
                        op: "starting the lazy restore thread",
                        err,
                    },
                    src,
                ))),
                None => unreachable!("the thread did not start, so the source is still here"),
            },
        }
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Stops (if it is still running) and waits for the thread.
    pub fn finish(self) -> Finished {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.join() {
            Ok(Some(f)) => f,
            Ok(None) => unreachable!("the slot is filled before the thread starts"),
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

fn sys(op: &'static str) -> LazyError {
    LazyError::Sys {
        op,
        err: std::io::Error::last_os_error(),
    }
}

/// What one UFFDIO_COPY did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Copied {
    /// The first `n` pages are in now (all of them, or the call stopped
    /// early for a reason the kernel does not say: the rest is unknown).
    Pages(usize),
    /// The first page was there already; nothing was copied.
    FirstExists,
}

/// UFFDIO_COPY of `pages` pages from `buf` to `dst`.  Only a successful
/// copy puts a page in, and only one can succeed per page: whoever gets
/// `Pages` counts those pages.
fn copy(fd: RawFd, dst: u64, buf: &[u8], pages: usize) -> std::io::Result<Copied> {
    loop {
        let mut c = UffdioCopy {
            dst,
            src: buf.as_ptr() as u64,
            len: (pages * PAGE) as u64,
            mode: 0,
            copy: 0,
        };
        // SAFETY: a valid uffdio_copy; the kernel reads `len` bytes of buf.
        let r = unsafe { libc::ioctl(fd, UFFDIO_COPY as _, &mut c) };
        if r == 0 {
            return Ok(Copied::Pages(pages));
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EEXIST) => return Ok(Copied::FirstExists),
            // a partial copy (the next page may exist, or the address
            // space changed: mremap, fork), or nothing copied because it
            // is changing: try again
            Some(libc::EAGAIN) if c.copy > 0 => return Ok(Copied::Pages(c.copy as usize / PAGE)),
            Some(libc::EAGAIN) => std::thread::yield_now(),
            _ => return Err(err),
        }
    }
}

/// A failed UFFDIO_COPY into the app: ESRCH when its address space is gone
/// (it died; the supervisor is about to hear of it).
fn copy_failed(err: std::io::Error) -> LazyError {
    match err.raw_os_error() {
        Some(libc::ESRCH) => LazyError::AppGone,
        _ => LazyError::Sys {
            op: "UFFDIO_COPY",
            err,
        },
    }
}

struct Serving<'a> {
    src: &'a Source,
    mapped: &'a [Mapped],
    filled: &'a Filled,
    stats: Stats,
    /// The app's userfaultfd first, then its forked children's.
    ctxs: Vec<OwnedFd>,
    page: Vec<u8>,
    zero: Vec<u8>,
    /// Faults served whose next pages are still to bring: (index into
    /// `mapped`, page), the newest last.
    after: Vec<(usize, u64)>,
}

impl Serving<'_> {
    /// Reads and serves every event waiting on ctxs[i]; false if that
    /// child's address space is gone (drop it).
    fn drain(&mut self, i: usize) -> Result<bool, LazyError> {
        let mut msg = [0u8; UFFD_MSG_LEN * 16];
        loop {
            let fd = self.ctxs[i].as_raw_fd();
            // SAFETY: reading into our buffer.
            let n = unsafe { libc::read(fd, msg.as_mut_ptr().cast(), msg.len()) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return match e.raw_os_error() {
                    // no fault waits: the pages after the last ones served
                    Some(libc::EAGAIN) => match self.after.pop() {
                        Some((mi, page)) => match self.bring_after(i, mi, page)? {
                            true => continue,
                            false => Ok(false),
                        },
                        None => Ok(true),
                    },
                    Some(libc::EINTR) => continue,
                    _ if i > 0 => Ok(false),
                    _ => Err(LazyError::Sys {
                        op: "read of the userfaultfd",
                        err: e,
                    }),
                };
            }
            if n == 0 {
                return Ok(i == 0);
            }
            for m in msg[..n as usize].chunks_exact(UFFD_MSG_LEN) {
                match m[0] {
                    UFFD_EVENT_PAGEFAULT => {
                        let mut a = [0u8; 8];
                        a.copy_from_slice(&m[UFFD_MSG_OFF_ADDRESS..UFFD_MSG_OFF_ADDRESS + 8]);
                        if !self.fault(i, u64::from_le_bytes(a))? {
                            return Ok(false);
                        }
                    }
                    UFFD_EVENT_FORK => {
                        let mut f = [0u8; 4];
                        f.copy_from_slice(&m[UFFD_MSG_OFF_FORK_UFD..UFFD_MSG_OFF_FORK_UFD + 4]);
                        // SAFETY: the kernel installed this fd in our table for us.
                        let child = unsafe { OwnedFd::from_raw_fd(i32::from_le_bytes(f)) };
                        self.ctxs.push(child);
                        self.stats.forks += 1;
                    }
                    _ => {} // not asked for
                }
            }
        }
    }

    /// One fault at `addr` on ctxs[i]; false if a child's address space
    /// is gone.
    fn fault(&mut self, i: usize, addr: u64) -> Result<bool, LazyError> {
        let t0 = Instant::now();
        let addr = addr & !(PAGE as u64 - 1);
        let Some(mi) = self
            .mapped
            .iter()
            .position(|m| addr >= m.addr && addr < m.addr + m.len)
        else {
            return Ok(true); // not ours: cannot be (only our ranges are registered)
        };
        let m = &self.mapped[mi];
        let (k, page) = (m.arena, (addr - m.addr) / PAGE as u64);
        let a = &self.src.arenas[k];
        let zero = self.src.reader.page_hash(a.region, page)?.is_none();
        // in before: installed, then punched out by the app since
        let refault = self.filled.get(k, page);
        let buf = if refault || zero {
            &self.zero[..]
        } else {
            self.src
                .reader
                .read_page(a.region, page, &mut self.page[..PAGE])?;
            &self.page[..PAGE]
        };
        let copied = match copy(self.ctxs[i].as_raw_fd(), addr, buf, 1) {
            Ok(c) => c,
            Err(_) if i > 0 => return Ok(false),
            Err(err) => return Err(copy_failed(err)),
        };
        if copied == Copied::FirstExists {
            // put in through another context (the filler's is the parent's):
            // that copy woke the faults waiting on its own context only, and
            // a forked child's waits on its own
            match wake(self.ctxs[i].as_raw_fd(), addr, PAGE as u64) {
                Ok(()) => {}
                Err(_) if i > 0 => return Ok(false),
                Err(err) => {
                    return Err(LazyError::Sys {
                        op: "UFFDIO_WAKE",
                        err,
                    });
                }
            }
        }
        self.filled.set(k, page);
        if copied == Copied::Pages(1) {
            let counter = match (refault, zero) {
                (true, _) => &mut self.stats.refaulted,
                (false, true) => &mut self.stats.zero_faulted,
                (false, false) => &mut self.stats.faulted,
            };
            *counter += 1;
        }
        self.stats.max_fault_us = self.stats.max_fault_us.max(t0.elapsed().as_micros() as u64);
        if !refault && !zero {
            // the app runs again (the copy woke it); the pages after it
            // come in once no other fault waits (drain)
            self.after.push((mi, page));
        }
        Ok(true)
    }

    /// Installs the pages after `page` of the mapping `mapped[mi]` that the
    /// snapshot holds and nobody put in yet, up to FAULT_AROUND - 1, through
    /// ctxs[i] (the memfds are shared: a page put in through any context is
    /// in for every mapping of it).  An app's start reads
    /// its arena's first pages one after another (rkv: 55 in a row), each
    /// fault a round trip through the kernel and this thread; and a page
    /// installed here at the app's priority is one the background fill (at
    /// nice 10, behind a busy app) need not bring.  False: a child's
    /// address space is gone.
    fn bring_after(&mut self, i: usize, mi: usize, page: u64) -> Result<bool, LazyError> {
        let m = &self.mapped[mi];
        let k = m.arena;
        let a = &self.src.arenas[k];
        let last = a.bytes.div_ceil(PAGE as u64).min(m.len / PAGE as u64);
        let mut n = 0;
        while n + 1 < FAULT_AROUND {
            let p = page + 1 + n as u64;
            if p >= last
                || self.filled.get(k, p)
                || self.src.reader.page_hash(a.region, p)?.is_none()
            {
                break;
            }
            let buf = &mut self.page[n * PAGE..(n + 1) * PAGE];
            self.src.reader.read_page(a.region, p, buf)?;
            n += 1;
        }
        if n == 0 {
            return Ok(true);
        }
        let dst = m.addr + (page + 1) * PAGE as u64;
        match copy(self.ctxs[i].as_raw_fd(), dst, &self.page[..n * PAGE], n) {
            Ok(Copied::Pages(d)) => {
                for j in 0..d as u64 {
                    self.filled.set(k, page + 1 + j);
                }
                self.stats.faulted_around += d as u64;
                Ok(true)
            }
            Ok(Copied::FirstExists) => Ok(true), // the fill got there first
            Err(_) if i > 0 => Ok(false),
            Err(err) => Err(copy_failed(err)),
        }
    }

    /// Serves whatever is waiting on any userfaultfd; waits up to
    /// `timeout_ms` for something.
    fn poll(&mut self, timeout_ms: i32) -> Result<(), LazyError> {
        let mut pfds: Vec<libc::pollfd> = self
            .ctxs
            .iter()
            .map(|c| libc::pollfd {
                fd: c.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: a valid array of pollfds.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as _, timeout_ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(());
            }
            return Err(LazyError::Sys { op: "poll", err: e });
        }
        let mut gone = Vec::new();
        for (i, p) in pfds.iter().enumerate() {
            if p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0 && !self.drain(i)? {
                gone.push(i);
            }
        }
        for i in gone.into_iter().rev() {
            if i > 0 {
                self.ctxs.remove(i);
            }
        }
        Ok(())
    }

    fn unregister(&self) -> Result<(), LazyError> {
        let ranges: Vec<(u64, u64)> = self.mapped.iter().map(|m| (m.addr, m.len)).collect();
        unregister_and_wake(self.ctxs[0].as_raw_fd(), &ranges)
    }
}

/// UFFDIO_UNREGISTER of each range, then UFFDIO_WAKE of it.  The kernel's
/// unregister wakes the faults waiting at that moment, but (Linux 6.18,
/// faults under the per-VMA lock) a fault can still come in after that
/// wake and before the range's VMA is cleared: it waits for a reply nobody
/// will send, for good (seen in a test as rkv asleep in handle_userfault
/// after every page was in).  Once the unregister returns no fault comes
/// in on these ranges any more, so the wake after it releases any that did.
fn unregister_and_wake(fd: RawFd, ranges: &[(u64, u64)]) -> Result<(), LazyError> {
    for &(start, len) in ranges {
        let mut r = UffdioRange { start, len };
        // SAFETY: a valid uffdio_range of a range the app registered.
        if unsafe { libc::ioctl(fd, UFFDIO_UNREGISTER as _, &mut r) } < 0 {
            return Err(sys("UFFDIO_UNREGISTER"));
        }
    }
    for &(start, len) in ranges {
        wake(fd, start, len).map_err(|err| LazyError::Sys {
            op: "UFFDIO_WAKE",
            err,
        })?;
    }
    Ok(())
}

/// UFFDIO_WAKE: the faults waiting on `fd` in [start, start + len) retry.
fn wake(fd: RawFd, start: u64, len: u64) -> std::io::Result<()> {
    let mut r = UffdioRange { start, len };
    // SAFETY: a valid uffdio_range; the kernel only reads it.
    if unsafe { libc::ioctl(fd, UFFDIO_WAKE as _, &mut r) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The background half: installs the pages the app has not touched yet,
/// in page order, a run of consecutive ones per UFFDIO_COPY, on a thread of
/// its own so that a fault never waits behind it.
struct Filler<'a> {
    src: &'a Source,
    mapped: &'a [Mapped],
    filled: &'a Filled,
    uffd: RawFd,
    filled_pages: u64,
}

impl Filler<'_> {
    /// Installs the next run of pages not in yet, starting at `next[k]`;
    /// false when there are none left.
    fn fill_some(&mut self, pages: &[Vec<u64>], next: &mut [usize]) -> Result<bool, LazyError> {
        let Some(k) = (0..pages.len()).find(|&k| next[k] < pages[k].len()) else {
            return Ok(false);
        };
        let Some(m) = self.mapped.iter().find(|m| m.arena == k) else {
            next[k] = pages[k].len(); // not mapped by the app: fill_rest's
            return Ok(true);
        };
        let (addr0, list) = (m.addr, &pages[k]);
        let mut i = next[k];
        while i < list.len() && self.filled.get(k, list[i]) {
            i += 1;
        }
        if i == list.len() {
            next[k] = i;
            return Ok(true);
        }
        // a run of consecutive pages, none in yet
        let first = list[i];
        let mut n = 0;
        while n < BATCH_PAGES
            && i + n < list.len()
            && list[i + n] == first + n as u64
            && !self.filled.get(k, list[i + n])
        {
            n += 1;
        }
        let mut buf = vec![0u8; n * PAGE];
        let region = self.src.arenas[k].region;
        for j in 0..n {
            self.src.reader.read_page(
                region,
                first + j as u64,
                &mut buf[j * PAGE..(j + 1) * PAGE],
            )?;
        }
        let (done, existed) =
            match copy(self.uffd, addr0 + first * PAGE as u64, &buf, n).map_err(copy_failed)? {
                Copied::Pages(d) => (d, 0),
                Copied::FirstExists => (0, 1), // the fault server put it in
            };
        for j in 0..done + existed {
            self.filled.set(k, first + j as u64);
        }
        self.filled_pages += done as u64;
        next[k] = i + done + existed;
        Ok(true)
    }

    /// Until every page is in (true) or one of `stops` is set (false); at
    /// most `fill_rate` pages a second when it is not 0.
    fn run(&mut self, fill_rate: u64, stops: &[&AtomicBool]) -> Result<bool, LazyError> {
        let t0 = Instant::now();
        let pages: Vec<Vec<u64>> = (0..self.src.arenas.len())
            .map(|k| self.src.arena_pages(k).collect())
            .collect();
        let mut next = vec![0usize; pages.len()];
        loop {
            if stops.iter().any(|s| s.load(Ordering::Relaxed)) {
                return Ok(false);
            }
            if let Some(ms) = (self.filled_pages * 1000).checked_div(fill_rate)
                && let Some(wait) = Duration::from_millis(ms).checked_sub(t0.elapsed())
            {
                std::thread::sleep(wait.min(Duration::from_millis(50)));
                continue;
            }
            if !self.fill_some(&pages, &mut next)? {
                return Ok(true);
            }
        }
    }
}

fn serve(
    uffd: OwnedFd,
    mapped: Vec<Mapped>,
    src: Source,
    fill_rate: u64,
    stop: &AtomicBool,
) -> Finished {
    let t0 = Instant::now();
    let filled = Filled::new(&src);
    let uffd_raw = uffd.as_raw_fd();
    let mut s = Serving {
        src: &src,
        mapped: &mapped,
        filled: &filled,
        stats: Stats::default(),
        ctxs: vec![uffd],
        page: vec![0u8; FAULT_AROUND * PAGE],
        zero: vec![0u8; PAGE],
        after: Vec::new(),
    };
    // the filler stops on `stop` (the app is gone) or on `over` (the
    // fault server failed); the server ends when the filler has
    let over = AtomicBool::new(false);
    let filler_done = AtomicBool::new(false);
    let (served, filler) = std::thread::scope(|sc| {
        let mut f = Filler {
            src: &src,
            mapped: &mapped,
            filled: &filled,
            uffd: uffd_raw,
            filled_pages: 0,
        };
        let (over, filler_done) = (&over, &filler_done);
        let h = sc.spawn(move || {
            // the background fill takes what CPU the app leaves: on a
            // machine just rebooted the app's start and first requests
            // wait for its faults, not for the rest of the arena
            super::lower_this_thread(10);
            let r = f.run(fill_rate, &[stop, over]);
            filler_done.store(true, Ordering::Release);
            (r, f.filled_pages)
        });
        let served: Result<(), LazyError> = (|| {
            while !filler_done.load(Ordering::Acquire) {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                s.poll(20)?;
            }
            Ok(())
        })();
        if served.is_err() {
            over.store(true, Ordering::Relaxed);
        }
        let filler = match h.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        };
        (served, filler)
    });
    let (fill_result, filled_pages) = filler;
    let result: Result<bool, LazyError> = match (served, fill_result) {
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        (Ok(()), Ok(false)) => Ok(false),
        // every page is in: what is left to fault is a zero page or a punched one
        (Ok(()), Ok(true)) => s.poll(0).and_then(|()| s.unregister()).map(|()| true),
    };
    let result = match result {
        Err(LazyError::AppGone) => Ok(false),
        r => r,
    };
    let mut stats = std::mem::take(&mut s.stats);
    stats.filled = filled_pages;
    stats.took = t0.elapsed();
    drop(s); // its userfaultfds closed before the source goes back
    Finished {
        source: src,
        filled,
        stats,
        result,
    }
}

/// Writes every page of the snapshot not in yet straight into the arenas'
/// memfds (no process maps them now, or the app sent no userfaultfd).
/// Returns the pages written.
pub fn fill_rest(src: &Source, filled: &Filled) -> Result<u64, LazyError> {
    let mut buf = vec![0u8; PAGE];
    let mut n = 0;
    for (k, a) in src.arenas.iter().enumerate() {
        for p in src.arena_pages(k) {
            if filled.get(k, p) {
                continue;
            }
            src.reader.read_page(a.region, p, &mut buf)?;
            let len = (a.bytes - p * PAGE as u64).min(PAGE as u64) as usize;
            fsio::pwrite_all(a.fd.as_fd(), &buf[..len], p * PAGE as u64).map_err(|err| {
                LazyError::Sys {
                    op: "pwrite into a memfd",
                    err,
                }
            })?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_bits() {
        let f = Filled {
            bits: vec![vec![AtomicU64::new(0), AtomicU64::new(0)]],
        };
        assert!(!f.get(0, 65));
        f.set(0, 65);
        assert!(f.get(0, 65) && !f.get(0, 64));
        f.set(0, 1000); // past the end: ignored
        assert!(!f.get(0, 1000));
    }
}

/// The unregister race (`unregister_and_wake`), in this process: two
/// threads touch fresh pages of a registered memfd mapping while a third
/// serves their faults with zero pages, and the ranges are unregistered in
/// the middle.  Each round every toucher must finish.  Without the wake
/// after the unregister 7-9 rounds in 200 left a toucher asleep in the
/// kernel for good on Linux 6.18 (2 vCPUs; 3 runs of 3 failed).
#[cfg(test)]
mod unregister_race {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    const UFFD_API: u64 = 0xaa;
    const UFFDIO_API: u64 = 0xc018_aa3f;
    const UFFDIO_REGISTER: u64 = 0xc020_aa00;
    const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
    const LEN: usize = 4 << 20;
    const ROUNDS: u32 = 200;

    /// A userfaultfd for user-mode faults, or None where this process may
    /// not have one.
    fn userfaultfd() -> Option<OwnedFd> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK | 1; // UFFD_USER_MODE_ONLY
        // SAFETY: a plain syscall.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the kernel just gave us this fd.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let mut api = [UFFD_API, 0, 0];
        // SAFETY: a valid uffdio_api.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, api.as_mut_ptr()) };
        assert_eq!(r, 0, "UFFDIO_API: {}", std::io::Error::last_os_error());
        Some(fd)
    }

    /// A shared mapping of a fresh memfd of LEN bytes, registered MISSING
    /// with `uffd`; its address.
    fn registered_mapping(uffd: RawFd) -> (OwnedFd, u64) {
        // SAFETY: a NUL-terminated name.
        let m = unsafe { libc::memfd_create(c"race".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(m >= 0);
        // SAFETY: our fd.
        let m = unsafe { OwnedFd::from_raw_fd(m) };
        // SAFETY: sizing our memfd, then a fresh shared mapping of it.
        let addr = unsafe {
            assert_eq!(libc::ftruncate(m.as_raw_fd(), LEN as i64), 0);
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                m.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        let mut reg = [addr as u64, LEN as u64, UFFDIO_REGISTER_MODE_MISSING, 0];
        // SAFETY: a valid uffdio_register of our mapping.
        let r = unsafe { libc::ioctl(uffd, UFFDIO_REGISTER as _, reg.as_mut_ptr()) };
        assert_eq!(r, 0, "UFFDIO_REGISTER: {}", std::io::Error::last_os_error());
        (m, addr as u64)
    }

    /// Serves every fault on `uffd` with a zero page until `stop`.
    fn serve_zeros(uffd: RawFd, stop: &AtomicBool) {
        let zero = vec![0u8; PAGE];
        let mut msg = [0u8; UFFD_MSG_LEN * 16];
        while !stop.load(Ordering::Acquire) {
            let mut p = libc::pollfd {
                fd: uffd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; then reading into our buffer.
            let n = unsafe {
                if libc::poll(&mut p, 1, 1) <= 0 {
                    continue;
                }
                libc::read(uffd, msg.as_mut_ptr().cast(), msg.len())
            };
            for m in msg[..n.max(0) as usize].chunks_exact(UFFD_MSG_LEN) {
                if m[0] == UFFD_EVENT_PAGEFAULT {
                    let a = u64::from_le_bytes(
                        m[UFFD_MSG_OFF_ADDRESS..UFFD_MSG_OFF_ADDRESS + 8]
                            .try_into()
                            .unwrap(),
                    );
                    let _ = copy(uffd, a & !(PAGE as u64 - 1), &zero, 1);
                }
            }
        }
    }

    #[test]
    fn no_fault_sleeps_on_after_the_ranges_are_unregistered() {
        let mut asleep = 0;
        for round in 0..ROUNDS {
            let Some(uffd) = userfaultfd() else {
                eprintln!("skipped: no userfaultfd for this process");
                return;
            };
            let (memfd, addr) = registered_mapping(uffd.as_raw_fd());
            let stop = AtomicBool::new(false);
            let touched = [AtomicUsize::new(0), AtomicUsize::new(0)];
            std::thread::scope(|sc| {
                sc.spawn(|| serve_zeros(uffd.as_raw_fd(), &stop));
                for (t, n) in touched.iter().enumerate() {
                    sc.spawn(move || {
                        let half = LEN / 2;
                        for off in (0..half).step_by(PAGE) {
                            let p = (addr as usize + t * half + off) as *mut u8;
                            // SAFETY: inside our mapping, kept until the scope ends.
                            unsafe { p.write_volatile(1) };
                            n.fetch_add(1, Ordering::Release);
                        }
                    });
                }
                // somewhere in the touchers' run (about 5 ms here)
                std::thread::sleep(Duration::from_micros(u64::from(round * 7919 % 1000)));
                unregister_and_wake(uffd.as_raw_fd(), &[(addr, LEN as u64)]).unwrap();
                stop.store(true, Ordering::Release);
                let deadline = Instant::now() + Duration::from_secs(2);
                let all = || {
                    touched
                        .iter()
                        .all(|n| n.load(Ordering::Acquire) == LEN / 2 / PAGE)
                };
                while !all() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if !all() {
                    asleep += 1;
                    wake(uffd.as_raw_fd(), addr, LEN as u64).unwrap(); // to end the round
                }
            });
            // SAFETY: our mapping; no thread touches it any more.
            unsafe { libc::munmap(addr as *mut libc::c_void, LEN) };
            drop(memfd);
        }
        assert_eq!(
            asleep, 0,
            "rounds with a toucher asleep after the unregister, of {ROUNDS}"
        );
    }
}
