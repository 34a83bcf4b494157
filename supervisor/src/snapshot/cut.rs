//! One snapshot of a running app: reports of written pages from its agent
//! (agent_link.rs), the pages copied out of the memfds the supervisor holds,
//! the consistent cut, and the store writer.  Blocking; runs on the engine's
//! thread (engine.rs), never on the supervisor's poll loop.
//!
//! The sequence (docs/snapshots.md, "Taking a snapshot"):
//! 1. pre-copy rounds while the app runs: the agent reports the pages
//!    written since the last report and write-protects them again; we copy
//!    them (and, for a full snapshot, every page of every region);
//! 2. the cut: the agent freezes the app at a consistent point and reports
//!    the pages written since the last round, the holes the allocator
//!    punched since the last cut, and the manifest with the statics; we copy
//!    those pages while the app waits, then release it;
//! 3. the staged pages go to the store, which publishes the snapshot.
//!
//! A page copied in a round and not written since holds the cut's state; a
//! page written since is reported again at the cut and copied then.

use std::cell::{Cell, OnceCell};
use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use super::agent_link::{self, AgentMsg, Region, RegionKind, Report, SnapStatus};
use super::baseline::{BaseCursor, Baseline};
use super::memfd_view::{MemfdView, NoView, fd_size};
use super::shadow::Shadow;
use super::staging::{PAGE, Staging};
use crate::app_link::{self, Recv};
use crate::store::{
    self, Hash, NewSnapshot, RegionMeta, SnapshotId, SnapshotInfo, Store, StoreError,
};

/// Why a snapshot did not happen; `code()` is the stable reason code.
#[derive(Debug)]
pub enum Failure {
    /// The agent said no (an open region, a restart, ...).
    Agent {
        status: SnapStatus,
        err: i32,
    },
    /// The agent did not answer in time, or its socket failed.
    AgentLost(String),
    /// The app closed its end: it is gone (an exit, a kill).
    AgentGone,
    /// The agent's report broke the protocol.
    BadReport(String),
    /// The preserved set changed between two reports of one snapshot.
    LayoutChanged,
    /// The supervisor holds no fd for a region the agent reported.
    NoFd(String),
    /// The fd held for a region is not the memfd the app maps (its new
    /// one, after a cold restart in place, is not handed over yet).
    StaleFd(String),
    /// Reading a memfd failed.
    Read {
        region: String,
        err: std::io::Error,
    },
    Store(StoreError),
    /// The agent restarted (a new incarnation) in the middle: its HELLO.
    NewIncarnation(Box<(agent_link::Hello, Vec<OwnedFd>)>),
}

impl Failure {
    pub fn code(&self) -> &'static str {
        match self {
            Failure::Agent { status, .. } => status.name(),
            Failure::AgentLost(_) => "agent_lost",
            Failure::AgentGone => "app_gone",
            Failure::BadReport(_) => "bad_report",
            Failure::LayoutChanged => "layout_changed",
            Failure::NoFd(_) => "no_fd",
            Failure::StaleFd(_) => "stale_fd",
            Failure::Read { .. } => "memfd_read",
            Failure::Store(e) => e.code(),
            Failure::NewIncarnation(_) => "new_incarnation",
        }
    }
    /// Worth trying again at the next interval (the store is fine).
    pub fn transient(&self) -> bool {
        !matches!(self, Failure::Store(_))
    }
    /// What an app still making its regions right after its HELLO causes
    /// (an arena whose memfd is not handed over yet, one made during the
    /// cut): tried again shortly, even for a checkpoint waiting on it.
    pub fn settles_at_start(&self) -> bool {
        matches!(
            self,
            Failure::NoFd(_) | Failure::StaleFd(_) | Failure::LayoutChanged
        )
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Agent { status, err } => {
                write!(f, "the app's agent refused: {}", status.name())?;
                if *err != 0 {
                    write!(f, " ({})", std::io::Error::from_raw_os_error(*err))?;
                }
                Ok(())
            }
            Failure::AgentLost(w) => write!(f, "the app's agent did not answer: {w}"),
            Failure::AgentGone => write!(f, "the app is gone"),
            Failure::BadReport(w) => write!(f, "malformed report from the app's agent: {w}"),
            Failure::LayoutChanged => {
                write!(f, "the preserved regions changed during the snapshot")
            }
            Failure::NoFd(n) => write!(f, "no memfd held for region {n}"),
            Failure::StaleFd(n) => write!(
                f,
                "the memfd held for region {n} is not the one the app maps (not handed over yet)"
            ),
            Failure::Read { region, err } => write!(f, "reading region {region}: {err}"),
            Failure::Store(e) => write!(f, "{e}"),
            Failure::NewIncarnation(_) => write!(f, "the app restarted during the snapshot"),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// The agent of the current incarnation: its socket and shared buffer.
pub struct AgentLink {
    pub sock: OwnedFd,
    pub buf: BufMap,
    pub pid: u32,
    pub generation: u32,
    pub seq: u64,
}

/// The agent's shared buffer.  The supervisor writes only the epochs.
pub struct BufMap {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is owned by this value; only the engine's thread uses it.
unsafe impl Send for BufMap {}

impl BufMap {
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> std::io::Result<BufMap> {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat into a zeroed stat.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if (st.st_size as u64) < len as u64 || len < agent_link::BUF_HDR_LEN {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("snapshot buffer of {} bytes, {len} announced", st.st_size),
            ));
        }
        // SAFETY: a fresh shared mapping of a memfd of at least len bytes.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let b = BufMap { ptr, len };
        // the agent wrote the header before its HELLO; another version
        // speaks another protocol (a version-3 agent takes a probe for a cut)
        let h = b.bytes();
        let magic = u64::from_le_bytes(h[0..8].try_into().unwrap_or_default());
        let version = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
        if magic != agent_link::BUF_MAGIC || version != agent_link::BUF_VERSION {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the app's librekindle speaks snapshot protocol {version} (magic {magic:#x}), \
                     this supervisor {}: rebuild the app against this release",
                    agent_link::BUF_VERSION
                ),
            ));
        }
        Ok(b)
    }

    /// The buffer as the agent left it: read only while the agent waits for
    /// us (after its DIRTY, before our CONTINUE or RELEASE).
    fn bytes(&self) -> &[u8] {
        // SAFETY: mapped for len bytes for the life of self; the agent does
        // not write the parts we read while it waits for our answer.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl BufMap {
    /// Publishes an epoch to the app (`rk_epoch`, `rk_durable_epoch`).
    pub fn set_epoch(&self, off: usize, v: u64) {
        assert!(off.is_multiple_of(8) && off + 8 <= agent_link::BUF_HDR_LEN);
        // SAFETY: an aligned u64 inside the mapping, which the app reads
        // with atomic loads.
        let a = unsafe {
            &*(self
                .ptr
                .cast::<u8>()
                .add(off)
                .cast::<std::sync::atomic::AtomicU64>())
        };
        a.store(v, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for BufMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// A memfd the supervisor holds, by the FDS name the agent reports.
pub struct HeldRegion {
    pub kind: RegionKind,
    pub fd: OwnedFd,
    /// Its read-only view, made at the first cut that copies from it (or
    /// why there is none: it is read with `pread` then).
    view: OnceCell<Result<MemfdView, NoView>>,
    /// Why there is no view has been in a published snapshot's report
    /// (a failed snapshot's is lost: the next one says it).
    refusal_said: Cell<bool>,
    /// The memfd's inode (0 if fstat failed: then not checked).
    ino: u64,
}

impl HeldRegion {
    pub fn new(kind: RegionKind, fd: OwnedFd) -> HeldRegion {
        let ino = nix::sys::stat::fstat(fd.as_fd()).map_or(0, |st| st.st_ino);
        HeldRegion {
            kind,
            fd,
            view: OnceCell::new(),
            refusal_said: Cell::new(false),
            ino,
        }
    }

    /// Whether this is the memfd the agent reported (a region of the same
    /// name may have a new memfd not handed over yet: a cold restart in
    /// place made its arenas again).
    fn is(&self, r: &Region) -> bool {
        r.ino == 0 || self.ino == 0 || r.ino == self.ino
    }
}

pub struct Plan<'a> {
    pub parent: Option<SnapshotId>,
    /// With `force_full`: what the memfds held at the incarnation's start
    /// (its id is `parent`); the snapshot is then a delta of it.
    pub baseline: Option<&'a Baseline>,
    pub force_full: bool,
    pub epoch: u64,
    pub generation: u64,
    pub app: &'a str,
    pub tags: Vec<String>,
    pub precopy_rounds: u32,
    pub freeze_timeout_ms: u32,
    pub staging_bytes: usize,
    /// Pages an abandoned snapshot had reported (they are not reported again).
    pub carry: &'a HashMap<String, BTreeSet<u64>>,
    /// Append to the store's journal instead of publishing (a snapshot the
    /// app waits for, or an interval's under `--snapshot-publish-every`).
    pub journal: bool,
    /// Pre-copy rounds before the cut.  Not for a snapshot the app waits
    /// for: a group commit's few pages are copied faster at the cut than in
    /// a round trip to the agent more.
    pub precopy: bool,
    /// The app's redo log: the cut reads its position while the app is
    /// frozen (and opens a closed log on a new line).
    pub redo: Option<&'a crate::redo::Redo>,
    /// The first pre-copy round asks the agent whether anything changed
    /// since the last cut; if nothing did, no snapshot is taken
    /// (`Taken::Unchanged`).  Only when the last cut is this store's newest
    /// snapshot and nothing is carried: the agent compares with its last cut.
    pub probe: bool,
}

/// What `take` did.
#[derive(Debug)]
pub enum Taken {
    Snapshot(Box<Done>),
    /// Nothing changed since the last snapshot: none taken.  The app's
    /// state up to `app_epoch` is the last snapshot's, so durable with it.
    Unchanged {
        app_epoch: u64,
    },
}

/// What a snapshot cost and what it wrote.
#[derive(Debug, Clone)]
pub struct Done {
    pub info: SnapshotInfo,
    pub full: bool,
    pub stop_ns: u64,
    /// The cut's number in the app's process (its `rk_epoch()` before it).
    pub app_epoch: u64,
    pub freeze_ns: u64,
    /// The agent's scan at the cut, and our copying while the app waited.
    pub scan_ns: u64,
    pub cut_copy_ns: u64,
    pub cut_pages: u64,
    /// Regions that got no view at this snapshot (read with `pread`), why.
    pub views_refused: Vec<(String, NoView)>,
    pub precopy_pages: u64,
    /// Pre-copy rounds before the cut (0: straight to the cut).
    pub rounds: u32,
    pub punched_pages: u64,
    pub new_chunks: u64,
    pub dedup_hits: u64,
    pub zero_pages: u64,
    pub bytes_compressed: u64,
    /// Pages journaled as the bytes that changed, and those bytes.
    pub delta_pages: u64,
    pub delta_bytes: u64,
    /// Regions that inherit nothing from the parent (for the shadow).
    pub fresh_regions: Vec<String>,
    pub staging_peak: usize,
    pub took: Duration,
    /// Phases of `took`: the pre-copy rounds, the cut (freeze to release),
    /// putting the cut's pages (hash, compress), the store's commit.
    pub precopy_ns: u64,
    pub cut_ns: u64,
    pub put_ns: u64,
    pub commit_ns: u64,
    /// A delta of the snapshot the app started from: the pages read whole
    /// and found as that snapshot has them (not stored again).
    pub unchanged_pages: Option<u64>,
    /// Of such a delta: the regions that needed no read, tracked since the
    /// restore mapped them.
    pub from_map_regions: u32,
    /// Interval snapshots found unchanged and not taken since the last one
    /// (the engine's count).
    pub unchanged_skipped: u64,
}

/// Answer timeouts: an agent that does not answer a report in this time is
/// considered lost (its own cut timeout is shorter).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

impl AgentLink {
    fn send(&self, msg: &[u8]) -> Result<(), Failure> {
        match app_link::send(self.sock_fd(), msg, &[]) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Failure::AgentLost("its socket is full".into())),
            Err(e) => Err(Failure::AgentLost(e.to_string())),
        }
    }

    fn sock_fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.sock.as_fd()
    }

    /// The next message for this seq; a HELLO means a new incarnation.
    fn recv(&self, seq: u64) -> Result<AgentMsg, Failure> {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::AgentLost("timed out".into()));
            }
            let mut p = libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Failure::AgentLost(e.to_string()));
            }
            if n == 0 {
                continue;
            }
            match app_link::recv(self.sock_fd()) {
                Ok(Recv::Msg { data, fds, .. }) => match agent_link::parse(&data) {
                    Ok(AgentMsg::Hello(h)) => {
                        return Err(Failure::NewIncarnation(Box::new((h, fds))));
                    }
                    Ok(AgentMsg::Dirty(d)) if d.seq == seq => return Ok(AgentMsg::Dirty(d)),
                    Ok(AgentMsg::Released(r)) if r.seq == seq => return Ok(AgentMsg::Released(r)),
                    Ok(_) => continue, // an earlier snapshot's
                    Err(e) => return Err(Failure::BadReport(e.to_string())),
                },
                Ok(Recv::WouldBlock) => continue,
                Ok(Recv::Empty) => return Err(Failure::AgentGone),
                Err(e) => return Err(Failure::AgentLost(e.to_string())),
            }
        }
    }
}

/// The regions of one snapshot, fixed by its first report.
struct Layout {
    regions: Vec<Region>,
    manifest_size: u64,
}

impl Layout {
    fn same(&self, other: &[Region]) -> bool {
        self.regions.len() == other.len()
            && self.regions.iter().zip(other).all(|(a, b)| {
                a.name == b.name && a.kind == b.kind && a.addr == b.addr && a.len == b.len
            })
    }

    fn metas(&self, held: &HashMap<String, HeldRegion>) -> Vec<RegionMeta> {
        let mut v: Vec<RegionMeta> = self
            .regions
            .iter()
            .map(|r| {
                let file = held
                    .get(&r.name)
                    .map(|h| fd_size(h.fd.as_raw_fd()))
                    .unwrap_or(0);
                RegionMeta {
                    kind: match r.kind {
                        RegionKind::Arena => store::RegionKind::Arena,
                        RegionKind::Range => store::RegionKind::Range,
                    },
                    name: r.name.clone(),
                    addr: r.addr,
                    size: r.len,
                    layout: serde_json::json!({"memfd_bytes": file}),
                }
            })
            .collect();
        v.push(RegionMeta {
            kind: store::RegionKind::Static,
            name: MANIFEST_REGION.into(),
            addr: 0,
            size: self.manifest_size,
            layout: serde_json::json!({"what": "the runtime's manifest with the statics saved at the cut"}),
        });
        v
    }
}

/// The manifest (arena table, statics) travels as a region of its own.
pub const MANIFEST_REGION: &str = "manifest";

fn pread_full(fd: i32, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: buf[done..] is writable for its length.
        let n = unsafe {
            libc::pread(
                fd,
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break; // past the end of the file: zeros
        }
        done += n as usize;
    }
    buf[done..].fill(0);
    Ok(done)
}

/// The data extents of a memfd below `limit` (holes read as zeros and are
/// not copied): SEEK_DATA / SEEK_HOLE.
fn data_extents(fd: i32, limit: u64) -> std::io::Result<Vec<(u64, u64)>> {
    let mut v = Vec::new();
    let mut at = 0u64;
    while at < limit {
        // SAFETY: lseek on our fd.
        let d = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
        if d < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // no data from `at` on
            }
            return Err(e);
        }
        // SAFETY: as above.
        let h = unsafe { libc::lseek(fd, d, libc::SEEK_HOLE) };
        if h < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (s, e) = (
            (d as u64) & !(PAGE as u64 - 1),
            (h as u64).min(limit).div_ceil(PAGE as u64) * PAGE as u64,
        );
        if e > s {
            v.push((s, e));
        }
        at = h as u64;
    }
    Ok(v)
}

/// A delta longer than this is put as the whole page instead.
const DELTA_MAX: usize = PAGE / 4;

/// One staged page into the writer: as the bytes that changed since the
/// parent where the writer takes a delta and the shadow has the parent's
/// page (and the change is small), else whole; the shadow hears of it.
fn put_staged(
    w: &mut store::SnapshotWriter<'_>,
    shadow: &mut Shadow,
    delta_buf: &mut Vec<u8>,
    name: Option<&str>,
    region: u32,
    page: u64,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let Some(name) = name else {
        return w.put_page(region, page, bytes);
    };
    delta_buf.clear();
    let delta = w.takes_delta(region)
        && shadow
            .get(name, page)
            .is_some_and(|old| store::delta::encode(old, bytes, DELTA_MAX, delta_buf).is_some());
    if delta {
        w.put_delta(region, page, delta_buf)?;
        shadow.stage_delta(name, page, delta_buf);
    } else {
        w.put_page(region, page, bytes)?;
        shadow.stage(name, page, bytes);
    }
    Ok(())
}

/// A snapshot in the making.
struct Taking<'s, 'h> {
    writer: Option<store::SnapshotWriter<'s>>,
    store: Option<&'s mut Store>,
    held: &'h HashMap<String, HeldRegion>,
    layout: Option<Layout>,
    staging: &'h mut Staging,
    /// Pages as the parent holds them: a journaled page is put as a delta
    /// against its shadow when it has one.
    shadow: &'h mut Shadow,
    delta_buf: Vec<u8>,
    full: bool,
    plan_meta: Option<NewSnapshot>,
    journal: bool,
    /// Every page copied, as runs (region, first page, end page): carried
    /// to the next snapshot if this one is abandoned.  Runs, not pages: a
    /// cut copies hundreds of pages while the app is stopped.
    touched: Vec<(u32, u64, u64)>,
    copy_buf: Vec<u8>,
    skip_zero: bool,
    /// Pages copied by reading whole regions (a full snapshot).
    whole_pages: u64,
    /// Whole regions are read and compared with plan.baseline.
    against: bool,
    /// Regions of such a snapshot that needed no read (tracked since the
    /// restore mapped them).
    from_map_regions: u32,
    unchanged: u64,
    /// Scratch: the baseline's pages a region's data no longer covers.
    gone: Vec<u64>,
    /// Regions that got no view at this snapshot, and why.
    views_refused: Vec<(String, NoView)>,
    /// A report flagged a region NEW: the agent says so once, so if this
    /// snapshot is abandoned the next must read every region whole.
    saw_new: bool,
}

/// What an abandoned snapshot leaves to the next one.
#[derive(Debug, Default)]
pub struct Unpublished {
    /// The pages the agent reported: they must be copied next time.
    pub pages: HashMap<String, BTreeSet<u64>>,
    /// Pages were read that no report will name again (a full snapshot,
    /// or a region the agent had just begun to track): the next snapshot
    /// must be full.
    pub whole: bool,
}

/// How a copy reads a memfd's pages.
#[derive(Clone, Copy)]
enum ReadBy {
    Pread,
    /// Through the region's view where it has one: the pages the agent
    /// reported written, while the app is frozen (memfd_view.rs).
    FrozenView,
}

impl<'s, 'h> Taking<'s, 'h> {
    fn writer(&mut self) -> Result<&mut store::SnapshotWriter<'s>, Failure> {
        if self.writer.is_none() {
            let store = self.store.take().ok_or(Failure::LayoutChanged)?;
            let meta = self.plan_meta.take().ok_or(Failure::LayoutChanged)?;
            self.writer = Some(if self.journal {
                store.begin_journaled(meta)?
            } else {
                store.begin(meta)?
            });
        }
        self.writer.as_mut().ok_or(Failure::LayoutChanged)
    }

    fn flush(&mut self) -> Result<(), Failure> {
        self.writer()?;
        let Taking {
            writer: Some(w),
            staging,
            shadow,
            delta_buf,
            layout,
            ..
        } = self
        else {
            return Err(Failure::LayoutChanged);
        };
        let mut err = None;
        let r = staging.drain(|region, page, bytes| {
            let name = layout
                .as_ref()
                .and_then(|l| l.regions.get(region as usize))
                .map(|r| r.name.as_str());
            put_staged(w, shadow, delta_buf, name, region, page, bytes).map_err(|e| {
                let s = e.to_string();
                err = Some(e);
                s
            })
        });
        match (r, err) {
            (Ok(()), _) => Ok(()),
            (Err(_), Some(e)) => Err(Failure::Store(e)),
            (Err(s), None) => Err(Failure::BadReport(s)),
        }
    }

    /// Copies pages [from, to) (offsets in region idx's memfd) into staging.
    fn copy_pages(&mut self, idx: u32, from: u64, to: u64) -> Result<u64, Failure> {
        self.copy_pages_by(idx, from, to, ReadBy::Pread)
    }

    /// Copies pages [from, to) the agent reported written, `by` its view
    /// while the app is frozen.
    fn copy_pages_by(&mut self, idx: u32, from: u64, to: u64, by: ReadBy) -> Result<u64, Failure> {
        let all: &'h HashMap<String, HeldRegion> = self.held;
        let (held, len) = {
            let r = &self.layout.as_ref().ok_or(Failure::LayoutChanged)?.regions[idx as usize];
            let h = all
                .get(&r.name)
                .ok_or_else(|| Failure::NoFd(r.name.clone()))?;
            (h, r.len)
        };
        let fd = held.fd.as_raw_fd();
        let view = match by {
            ReadBy::Pread => None,
            ReadBy::FrozenView => {
                let v = held
                    .view
                    .get_or_init(|| MemfdView::open(held.fd.as_fd(), len));
                if let Err(why) = v
                    && !held.refusal_said.get()
                {
                    let name = self.region_name(idx);
                    if !self.views_refused.iter().any(|(n, _)| *n == name) {
                        self.views_refused.push((name, *why));
                    }
                }
                v.as_ref().ok()
            }
        };
        const BATCH: u64 = 64 * PAGE as u64;
        let mut copied = 0;
        let mut off = from;
        // (a scratch buffer: lost on an error, made again next time)
        let mut buf = std::mem::take(&mut self.copy_buf);
        while off < to {
            let n = (to - off).min(BATCH) as usize;
            // staged straight from the view, or read into buf
            let src: &[u8] = match view.and_then(|v| v.bytes(off, n)) {
                Some(b) => b,
                None => {
                    buf.resize(n, 0);
                    pread_full(fd, &mut buf[..n], off).map_err(|err| Failure::Read {
                        region: self.region_name(idx),
                        err,
                    })?;
                    &buf[..n]
                }
            };
            for i in 0..n / PAGE {
                let page = off / PAGE as u64 + i as u64;
                let bytes = &src[i * PAGE..(i + 1) * PAGE];
                if self.skip_zero && bytes.iter().all(|&b| b == 0) {
                    continue; // a full snapshot lists only non-zero pages
                }
                if self.staging.is_full() {
                    self.flush()?;
                }
                self.staging.put(idx, page, bytes);
                copied += 1;
            }
            off += n as u64;
        }
        self.copy_buf = buf;
        self.touched
            .push((idx, from / PAGE as u64, to.div_ceil(PAGE as u64)));
        Ok(copied)
    }

    fn region_name(&self, idx: u32) -> String {
        self.layout
            .as_ref()
            .and_then(|l| l.regions.get(idx as usize))
            .map_or_else(String::new, |r| r.name.clone())
    }

    /// Reads region idx whole, as `copy_whole`, but keeps only the pages
    /// whose content differs from `base` (the baseline's pages of the same
    /// region): a changed or new page is staged, a page now zero or in a
    /// hole that `base` holds is staged as zeros, an equal one is skipped.
    /// The pages are read and hashed on several threads (`find_changed`):
    /// at a million pages this is most of what the first snapshot after a
    /// failover costs, and the app is mostly idle then.
    fn copy_changed(&mut self, idx: u32, base: &[(u64, Hash)]) -> Result<u64, Failure> {
        let (name, fd, len) = {
            let r = &self.layout.as_ref().ok_or(Failure::LayoutChanged)?.regions[idx as usize];
            let h = self
                .held
                .get(&r.name)
                .ok_or_else(|| Failure::NoFd(r.name.clone()))?;
            (r.name.clone(), h.fd.as_raw_fd(), r.len)
        };
        let limit = fd_size(fd).min(len);
        let ext = data_extents(fd, limit).map_err(|err| Failure::Read {
            region: name.clone(),
            err,
        })?;
        let found = find_changed(fd, &ext, base).map_err(|err| Failure::Read {
            region: name.clone(),
            err,
        })?;
        self.unchanged += found.unchanged;
        let mut n = 0;
        let mut page = vec![0u8; PAGE];
        for &p in &found.changed {
            // read again: it may have been written since it was hashed,
            // and then it is reported at the cut anyway
            pread_full(fd, &mut page, p * PAGE as u64).map_err(|err| Failure::Read {
                region: name.clone(),
                err,
            })?;
            self.stage(idx, p, &page)?;
            n += 1;
        }
        // pages the snapshot had that are zero now: inside the data, or in
        // holes (the cursor walks the baseline past every extent)
        let zero = [0u8; PAGE];
        let mut gone = std::mem::take(&mut self.gone);
        gone.clear();
        gone.extend_from_slice(&found.zeroed);
        let mut cursor = BaseCursor::new(base);
        for &(s, e) in &ext {
            let (first, last) = (s / PAGE as u64, e.div_ceil(PAGE as u64));
            cursor.advance_to(first, &mut gone);
            cursor.skip_below(last);
        }
        cursor.rest(&mut gone);
        for &p in &gone {
            if p * (PAGE as u64) < len {
                self.stage(idx, p, &zero)?;
                n += 1;
            }
        }
        self.gone = gone;
        Ok(n)
    }

    /// One page into staging (flushed to the writer first when full).
    fn stage(&mut self, idx: u32, page: u64, bytes: &[u8]) -> Result<(), Failure> {
        if self.staging.is_full() {
            self.flush()?;
        }
        self.staging.put(idx, page, bytes);
        self.touched.push((idx, page, page + 1));
        Ok(())
    }

    fn copy_whole(&mut self, idx: u32) -> Result<u64, Failure> {
        let (name, fd, len) = {
            let r = &self.layout.as_ref().ok_or(Failure::LayoutChanged)?.regions[idx as usize];
            let h = self
                .held
                .get(&r.name)
                .ok_or_else(|| Failure::NoFd(r.name.clone()))?;
            (r.name.clone(), h.fd.as_raw_fd(), r.len)
        };
        let limit = fd_size(fd).min(len);
        let ext = data_extents(fd, limit).map_err(|err| Failure::Read { region: name, err })?;
        let mut n = 0;
        for (s, e) in ext {
            n += self.copy_pages(idx, s, e)?;
        }
        Ok(n)
    }
}

/// What `find_changed` found in a region's data against its baseline.
#[derive(Default)]
struct Changed {
    /// Non-zero pages whose hash differs from the baseline's, or that it
    /// does not have.
    changed: Vec<u64>,
    /// Zero pages (inside the data) that the baseline has non-zero.
    zeroed: Vec<u64>,
    /// Pages as the baseline has them.
    unchanged: u64,
}

/// Pages per work item of `find_changed` (4 MiB, one buffer per thread).
const HASH_ITEM_PAGES: u64 = 1024;

/// Reads the pages of `ext` (byte extents of `fd`) and compares each with
/// `base` (page, blake3), on up to 4 threads.
fn find_changed(fd: i32, ext: &[(u64, u64)], base: &[(u64, Hash)]) -> std::io::Result<Changed> {
    let page = PAGE as u64;
    let mut items = Vec::new();
    for &(s, e) in ext {
        let mut off = s;
        while off < e {
            let end = (off + HASH_ITEM_PAGES * page).min(e);
            items.push((off, end));
            off = end;
        }
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4)
        .min(items.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || -> std::io::Result<Changed> {
        let mut out = Changed::default();
        let mut buf = vec![0u8; (HASH_ITEM_PAGES * page) as usize];
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(&(s, e)) = items.get(i) else {
                return Ok(out);
            };
            let n = (e - s) as usize;
            pread_full(fd, &mut buf[..n], s)?;
            for (k, bytes) in buf[..n].chunks_exact(PAGE).enumerate() {
                let p = s / page + k as u64;
                let was = base
                    .binary_search_by_key(&p, |&(q, _)| q)
                    .ok()
                    .map(|j| &base[j].1);
                if bytes.iter().fold(0u8, |a, &b| a | b) == 0 {
                    if was.is_some() {
                        out.zeroed.push(p);
                    }
                } else if was.is_some_and(|h| blake3::hash(bytes).as_bytes() == h) {
                    out.unchanged += 1;
                } else {
                    out.changed.push(p);
                }
            }
        }
    };
    let parts: Vec<std::io::Result<Changed>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (1..threads).map(|_| sc.spawn(work)).collect();
        let mut v = vec![work()];
        v.extend(hs.into_iter().map(|h| {
            h.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        }));
        v
    });
    let mut all = Changed::default();
    for p in parts {
        let p = p?;
        all.changed.extend(p.changed);
        all.zeroed.extend(p.zeroed);
        all.unchanged += p.unchanged;
    }
    Ok(all)
}

/// Takes one snapshot.  On failure nothing is published, and `unpublished`
/// says what the next snapshot must copy.
pub fn take(
    link: &mut AgentLink,
    held: &HashMap<String, HeldRegion>,
    store: &mut Store,
    plan: Plan<'_>,
    (shadow, staging): (&mut Shadow, &mut Staging),
    unpublished: &mut Unpublished,
) -> Result<Taken, Failure> {
    let t0 = Instant::now();
    staging.begin(plan.staging_bytes);
    // kept by an incremental snapshot of the snapshot it is of
    shadow.begin(
        plan.parent.as_ref(),
        !plan.force_full && plan.baseline.is_none(),
        plan.journal,
    );
    let mut t = Taking {
        writer: None,
        store: Some(store),
        held,
        layout: None,
        staging,
        shadow,
        delta_buf: Vec::new(),
        full: plan.force_full || plan.parent.is_none(),
        plan_meta: None,
        journal: plan.journal,
        touched: Vec::new(),
        copy_buf: Vec::new(),
        skip_zero: false,
        whole_pages: 0,
        against: false,
        from_map_regions: 0,
        unchanged: 0,
        gone: Vec::new(),
        views_refused: Vec::new(),
        saw_new: false,
    };
    let r = run(link, &mut t, &plan, t0);
    if let Ok(Taken::Snapshot(d)) = &r {
        for (name, _) in &d.views_refused {
            if let Some(h) = held.get(name) {
                h.refusal_said.set(true);
            }
        }
    }
    match &r {
        Ok(Taken::Snapshot(d)) => t.shadow.commit(d.info.id.clone(), &d.fresh_regions),
        // still of the newest snapshot; nothing was staged
        Ok(Taken::Unchanged { .. }) => {}
        Err(_) => t.shadow.clear(),
    }
    t.staging.trim();
    if r.is_err() {
        // A full one is taken again whole.  It is full by the plan (which
        // the next attempt repeats) or because a region was NEW, which the
        // agent does not say twice: its pages from before the tracking
        // began, and the other regions' pages this one's reports named,
        // would be in no later report.
        unpublished.whole = t.full || t.saw_new;
        if let Some(l) = t.layout.as_ref().filter(|_| !unpublished.whole) {
            for &(idx, from, to) in &t.touched {
                if let Some(r) = l.regions.get(idx as usize) {
                    unpublished
                        .pages
                        .entry(r.name.clone())
                        .or_default()
                        .extend(from..to);
                }
            }
        }
        if let Some(w) = t.writer.take() {
            w.abort();
        }
    }
    r
}

const MAX_ROUNDS: u32 = 8;
const SMALL_ROUND_PAGES: u64 = 4096;

struct Counts {
    /// When the cut's first report arrived (the app waits from then on).
    first_dirty: Option<Instant>,
    /// A probe found nothing changed: the app's epoch it answered with.
    unchanged: Option<u64>,
    app_epoch: u64,
    precopy: u64,
    cut: u64,
    punched: u64,
}

fn run(
    link: &mut AgentLink,
    t: &mut Taking<'_, '_>,
    plan: &Plan<'_>,
    t0: Instant,
) -> Result<Taken, Failure> {
    let mut c = Counts {
        first_dirty: None,
        unchanged: None,
        app_epoch: 0,
        precopy: 0,
        cut: 0,
        punched: 0,
    };
    // Rounds until the last one copied little: what the cut must copy with
    // the app frozen is what was written during the last round.  A round
    // that copied no less than the one before will not converge (the app
    // writes as fast as we copy): the cut comes then, and takes longer.
    let mut last = u64::MAX;
    let rounds = if plan.precopy { MAX_ROUNDS } else { 0 };
    let mut rounds_done = 0;
    for round in 1..=rounds {
        let before = c.precopy + t.whole_pages;
        let scan = if plan.probe && round == 1 {
            Scan::Probe
        } else {
            Scan::Round
        };
        report(link, t, plan, scan, &mut c)?;
        rounds_done = round;
        if let Some(app_epoch) = c.unchanged {
            // (the agent saw nothing written; nothing was read whole either)
            if c.precopy + t.whole_pages == 0 && !t.full && !t.against {
                return Ok(Taken::Unchanged { app_epoch });
            }
        }
        let copied = c.precopy + t.whole_pages - before;
        if round >= plan.precopy_rounds && (copied <= SMALL_ROUND_PAGES || copied >= last) {
            break;
        }
        last = copied;
    }
    // The cut gets the whole staging budget: what the rounds copied goes to
    // the store now (a page written again is put again at the cut, and the
    // writer keeps the last), so no flush runs while the app waits.  (No
    // round: nothing is staged, and the writer begins at the cut's report.)
    if rounds > 0 {
        t.flush()?;
    }
    let t_cut = Instant::now();
    let precopy_ns = (t_cut - t0).as_nanos() as u64;
    let (freeze_ns, scan_ns, manifest) = report(link, t, plan, Scan::Cut, &mut c)?;
    // no region is open: the records before this position are exactly the
    // changes the cut holds
    let redo = plan.redo.map(|r| r.at_cut());
    // the app is frozen: release it
    let cut_copy_ns = c.first_dirty.map_or(0, |t| t.elapsed().as_nanos() as u64);
    link.send(&agent_link::encode_release(link.seq))?;
    let stop_ns = match link.recv(link.seq)? {
        AgentMsg::Released(r) if r.status == SnapStatus::Ok => r.stop_ns,
        AgentMsg::Released(r) => {
            return Err(Failure::Agent {
                status: r.status,
                err: 0,
            });
        }
        _ => return Err(Failure::BadReport("DIRTY where RELEASED was due".into())),
    };
    let t_put = Instant::now();
    let cut_ns = (t_put - t_cut).as_nanos() as u64;
    t.flush()?;
    let idx = t.layout.as_ref().map_or(0, |l| l.regions.len()) as u32;
    let w = t.writer()?;
    w.put_bytes(idx, &manifest)?;
    let stats = w.stats();
    let fresh_regions = w.fresh_regions();
    let mut w = t.writer.take().ok_or(Failure::LayoutChanged)?;
    w.set_redo(redo);
    let t_commit = Instant::now();
    let put_ns = (t_commit - t_put).as_nanos() as u64;
    let info = w.commit()?;
    let commit_ns = t_commit.elapsed().as_nanos() as u64;
    Ok(Taken::Snapshot(Box::new(Done {
        precopy_ns,
        cut_ns,
        put_ns,
        commit_ns,
        info,
        full: t.full,
        stop_ns,
        app_epoch: c.app_epoch,
        freeze_ns,
        scan_ns,
        cut_copy_ns,
        cut_pages: c.cut,
        views_refused: std::mem::take(&mut t.views_refused),
        precopy_pages: c.precopy + t.whole_pages,
        rounds: rounds_done,
        punched_pages: c.punched,
        new_chunks: stats.new_chunks,
        dedup_hits: stats.dedup_hits,
        zero_pages: stats.zero_pages,
        bytes_compressed: stats.bytes_compressed,
        delta_pages: stats.delta_pages,
        delta_bytes: stats.delta_bytes,
        fresh_regions,
        staging_peak: t.staging.peak_bytes,
        took: t0.elapsed(),
        unchanged_pages: t.against.then_some(t.unchanged),
        from_map_regions: t.from_map_regions,
        unchanged_skipped: 0,
    })))
}

/// What a report is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// A pre-copy round: the app runs.
    Round,
    /// The same, and the agent says if nothing changed since the last cut.
    Probe,
    /// The app frozen at a consistent point until our RELEASE.
    Cut,
}

/// What the agent waits for after its last DIRTY of a report.
#[derive(Clone, Copy)]
enum Awaiting {
    Nothing,
    /// It said `more`: our CONTINUE (it drops any other message meanwhile).
    Continue {
        cut: bool,
    },
    /// The cut's last batch: our RELEASE (the app is frozen until then).
    Release,
}

/// One report (its batches), its pages copied; for the cut, also the
/// punched pages and the manifest.  Returns (freeze time, scan time,
/// manifest bytes).  A report abandoned half-way (the layout changed, a
/// copy failed) is wound down with the agent: its remaining batches are
/// asked for and dropped and a frozen app is released, else the agent
/// would wait for a CONTINUE or RELEASE that never comes, keeping the app
/// frozen and dropping the next requests until its own timeout.
fn report(
    link: &mut AgentLink,
    t: &mut Taking<'_, '_>,
    plan: &Plan<'_>,
    scan: Scan,
    c: &mut Counts,
) -> Result<(u64, u64, Vec<u8>), Failure> {
    let mut awaiting = Awaiting::Nothing;
    let r = report_batches(link, t, plan, scan, c, &mut awaiting);
    if r.is_err() {
        wind_down(link, awaiting);
    }
    r
}

/// Best effort: the agent gets the CONTINUEs and the RELEASE it waits for.
fn wind_down(link: &mut AgentLink, mut awaiting: Awaiting) {
    let seq = link.seq;
    // bounded: a report has at most one batch per region and vector fill
    for _ in 0..1_000_000 {
        match awaiting {
            Awaiting::Nothing => return,
            Awaiting::Continue { cut } => {
                if link.send(&agent_link::encode_continue(seq)).is_err() {
                    return;
                }
                awaiting = match link.recv(seq) {
                    Ok(AgentMsg::Dirty(d)) if d.status == SnapStatus::Ok && d.more => {
                        Awaiting::Continue { cut }
                    }
                    Ok(AgentMsg::Dirty(d)) if d.status == SnapStatus::Ok && cut => {
                        Awaiting::Release
                    }
                    _ => return,
                };
            }
            Awaiting::Release => {
                if link.send(&agent_link::encode_release(seq)).is_ok() {
                    let _ = link.recv(seq);
                }
                return;
            }
        }
    }
}

fn report_batches(
    link: &mut AgentLink,
    t: &mut Taking<'_, '_>,
    plan: &Plan<'_>,
    scan: Scan,
    c: &mut Counts,
    awaiting: &mut Awaiting,
) -> Result<(u64, u64, Vec<u8>), Failure> {
    link.seq += 1;
    let seq = link.seq;
    let cut = scan == Scan::Cut;
    let flags = match scan {
        Scan::Round => 0,
        Scan::Probe => agent_link::SCAN_PROBE,
        Scan::Cut => agent_link::SCAN_CUT,
    };
    link.send(&agent_link::encode_scan(seq, flags, plan.freeze_timeout_ms))?;
    let mut first_batch = true;
    loop {
        let d = match link.recv(seq)? {
            AgentMsg::Dirty(d) => d,
            _ => return Err(Failure::BadReport("RELEASED where DIRTY was due".into())),
        };
        if d.status != SnapStatus::Ok {
            return Err(Failure::Agent {
                status: d.status,
                err: d.err,
            });
        }
        *awaiting = match (d.more, cut) {
            (true, _) => Awaiting::Continue { cut },
            (false, true) => Awaiting::Release,
            (false, false) => Awaiting::Nothing,
        };
        if cut && c.first_dirty.is_none() {
            c.first_dirty = Some(Instant::now());
        }
        let rep = Report::new(link.buf.bytes()).map_err(|e| Failure::BadReport(e.to_string()))?;
        let regions = rep
            .regions()
            .map_err(|e| Failure::BadReport(e.to_string()))?;
        if first_batch {
            first_batch = false;
            start_report(t, plan, &regions, rep.manifest_len as u64, cut)?;
        }
        if t.layout.as_ref().is_some_and(|l| !l.same(&regions)) {
            return Err(Failure::LayoutChanged);
        }
        // the app is frozen while the cut's batches come
        let by = if cut {
            ReadBy::FrozenView
        } else {
            ReadBy::Pread
        };
        for (i, r) in regions.iter().enumerate() {
            for run in rep.runs(r).map_err(|e| Failure::BadReport(e.to_string()))? {
                let n = t.copy_pages_by(i as u32, run.start - r.addr, run.end - r.addr, by)?;
                if cut {
                    c.cut += n;
                } else {
                    c.precopy += n;
                }
            }
        }
        if d.more {
            link.send(&agent_link::encode_continue(seq))?;
            *awaiting = Awaiting::Nothing;
            continue;
        }
        if !cut {
            if scan == Scan::Probe && d.unchanged {
                c.unchanged = Some(d.epoch);
            }
            return Ok((0, 0, Vec::new()));
        }
        if d.punch_overflow {
            // more holes than the log holds: which pages they hit is
            // unknown, so the cut cannot be trusted; the next one is full
            return Err(Failure::Agent {
                status: SnapStatus::LayoutChanging,
                err: libc::ENOSPC,
            });
        }
        // holes punched since the last cut: their pages read as the cut sees them
        for (addr, pages) in rep.punches() {
            if let Some((i, r)) = regions
                .iter()
                .enumerate()
                .find(|(_, r)| addr >= r.addr && addr < r.addr + r.len)
            {
                let from = addr - r.addr;
                let to = (from + pages.saturating_mul(PAGE as u64)).min(r.len);
                let keep = t.skip_zero;
                t.skip_zero = false;
                c.punched += t.copy_pages(i as u32, from, to)?;
                t.skip_zero = keep;
            }
        }
        c.app_epoch = d.epoch;
        return Ok((d.t_freeze_ns, d.t_scan_ns, rep.manifest().to_vec()));
    }
}

/// The first batch of a report: fixes the layout at the first report, and
/// copies what must be copied whole (every region of a full snapshot, the
/// regions the agent has just started tracking) and what an abandoned
/// snapshot carried over.
fn start_report(
    t: &mut Taking<'_, '_>,
    plan: &Plan<'_>,
    regions: &[Region],
    manifest_len: u64,
    cut: bool,
) -> Result<(), Failure> {
    let first = t.layout.is_none();
    if first {
        // copying from a memfd of the same name that is not the app's (its
        // new one not handed over yet) would put another state in the
        // snapshot: settle first, as for a region with no fd at all
        if let Some(r) = regions
            .iter()
            .find(|r| t.held.get(&r.name).is_some_and(|h| !h.is(r)))
        {
            return Err(Failure::StaleFd(r.name.clone()));
        }
        if regions.iter().any(|r| r.new) {
            t.full = true; // pages before the agent's tracking began are unknown
            t.saw_new = true;
        }
        let layout = Layout {
            regions: regions.to_vec(),
            manifest_size: manifest_len.div_ceil(PAGE as u64) * PAGE as u64,
        };
        let metas = layout.metas(t.held);
        // every page is read, as for a full snapshot, but compared with
        // what the app started from: the snapshot is a delta of that
        let against = plan
            .baseline
            .filter(|b| t.full && plan.parent.as_ref() == Some(&b.id));
        if against.is_some() {
            t.full = false;
            t.against = true;
        }
        t.plan_meta = Some(NewSnapshot {
            parent: plan.parent.clone(),
            full: t.full,
            epoch: plan.epoch,
            generation: plan.generation,
            app: plan.app.to_string(),
            tags: plan.tags.clone(),
            regions: metas.clone(),
            redo: None,
        });
        t.layout = Some(layout);
        if let Some(b) = against {
            for (i, meta) in metas.iter().enumerate().take(regions.len()) {
                let n = match b.region_like(meta) {
                    // tracked since the restore mapped it: this report's
                    // written pages and the holes punched are every change
                    // since the baseline, copied as any delta's are
                    Some(_) if regions[i].tracked_from_map => {
                        t.from_map_regions += 1;
                        0
                    }
                    Some(base) => t.copy_changed(i as u32, base)?,
                    None => {
                        // another shape: inherits nothing, read whole
                        t.skip_zero = true;
                        let n = t.copy_whole(i as u32);
                        t.skip_zero = false;
                        n?
                    }
                };
                t.whole_pages += n;
            }
        } else if t.full {
            t.skip_zero = true;
            for i in 0..regions.len() {
                t.whole_pages += t.copy_whole(i as u32)?;
            }
            t.skip_zero = false;
        } else {
            for (i, r) in regions.iter().enumerate() {
                if let Some(pages) = plan.carry.get(&r.name) {
                    for &p in pages {
                        let off = p * PAGE as u64;
                        if off < r.len {
                            t.copy_pages(i as u32, off, off + PAGE as u64)?;
                        }
                    }
                }
            }
        }
    } else if regions.iter().any(|r| r.new) {
        // a region began to be tracked after the snapshot's first report
        t.saw_new = true;
        return Err(Failure::LayoutChanged);
    }
    let _ = cut;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer whose header says another protocol version is refused at
    /// the HELLO: a version-3 agent would take a probe for a cut and keep
    /// the app frozen for its STOP_MAX_MS.
    #[test]
    fn a_buffer_of_another_version_is_refused() {
        for (version, ok) in [(agent_link::BUF_VERSION, true), (3, false)] {
            let name = std::ffi::CString::new("snapbuf").unwrap_or_default();
            // SAFETY: memfd_create with a valid name.
            let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0);
            let mut hdr = vec![0u8; 4096];
            hdr[0..8].copy_from_slice(&agent_link::BUF_MAGIC.to_le_bytes());
            hdr[8..12].copy_from_slice(&version.to_le_bytes());
            // SAFETY: our fd, a buffer of hdr.len() bytes.
            let n = unsafe { libc::pwrite(fd, hdr.as_ptr().cast(), hdr.len(), 0) };
            assert_eq!(n, hdr.len() as isize);
            // SAFETY: our fd, owned from here on.
            let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            let r = BufMap::map(owned.as_fd(), hdr.len());
            assert_eq!(r.is_ok(), ok, "version {version}");
            if let Err(e) = r {
                assert!(e.to_string().contains("snapshot protocol 3"), "{e}");
            }
        }
    }

    #[test]
    fn data_extents_skip_holes() {
        let name = std::ffi::CString::new("extents").unwrap_or_default();
        // SAFETY: memfd_create with a valid name.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: our fd; 1 MiB file, two written pages.
        unsafe {
            assert_eq!(libc::ftruncate(fd, 1 << 20), 0);
            let p = [7u8; PAGE];
            assert_eq!(
                libc::pwrite(fd, p.as_ptr().cast(), PAGE, 3 * PAGE as i64),
                PAGE as isize
            );
            assert_eq!(
                libc::pwrite(fd, p.as_ptr().cast(), PAGE, 100 * PAGE as i64),
                PAGE as isize
            );
        }
        let e = data_extents(fd, 1 << 20).unwrap_or_else(|e| panic!("{e}"));
        let pages: u64 = e.iter().map(|(s, e)| (e - s) / PAGE as u64).sum();
        assert_eq!(pages, 2, "{e:?}");
        let mut b = vec![1u8; 2 * PAGE];
        assert_eq!(
            pread_full(fd, &mut b, (1 << 20) - PAGE as u64).unwrap_or(0),
            PAGE
        );
        assert!(b[PAGE..].iter().all(|&x| x == 0));
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn a_held_fd_is_the_apps_only_if_its_inode_is_the_one_reported() {
        let memfd = |n: &str| {
            let name = std::ffi::CString::new(n).unwrap_or_default();
            // SAFETY: memfd_create with a valid name; the fd is owned below.
            let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0);
            // SAFETY: a fresh fd nobody else owns.
            unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
        };
        let (old, new) = (memfd("rekindle:a"), memfd("rekindle:a"));
        let ino = |fd: &OwnedFd| nix::sys::stat::fstat(fd.as_fd()).map_or(0, |s| s.st_ino);
        let held = HeldRegion::new(RegionKind::Arena, old.try_clone().unwrap());
        let region = |i: u64| Region {
            kind: RegionKind::Arena,
            new: false,
            tracked_from_map: false,
            name: "a".into(),
            addr: 0x4000_0000,
            len: 1 << 20,
            first: 0,
            count: 0,
            ino: i,
        };
        assert!(held.is(&region(ino(&old))));
        // the app maps another memfd of the same name: not ours to copy
        assert!(!held.is(&region(ino(&new))));
        assert!(
            held.is(&region(0)),
            "an agent that does not say is not refused"
        );
    }

    /// The app's memfd as the store would give it back: `len` bytes, past
    /// its end as zeros.
    fn memfd_bytes(fd: i32, len: u64) -> Vec<u8> {
        let mut b = vec![0u8; len as usize];
        pread_full(fd, &mut b, 0).unwrap_or_else(|e| panic!("{e}"));
        b
    }

    fn write_page(fd: i32, page: u64, byte: u8) {
        let p = [byte; PAGE];
        // SAFETY: our fd, a page-sized buffer.
        let n = unsafe { libc::pwrite(fd, p.as_ptr().cast(), PAGE, (page * PAGE as u64) as i64) };
        assert_eq!(n, PAGE as isize);
    }

    /// Review of `copy_changed` (the first snapshot after a restore): the
    /// restored memfd changed every way an app can change it (a page
    /// rewritten, one zeroed by a write, two punched, a new one, the memfd
    /// cut short below a page the snapshot had past its recorded size):
    /// the delta of the restored snapshot restores to the memfd's bytes.
    #[test]
    fn a_delta_against_the_restored_snapshot_restores_the_memfd_byte_for_byte() {
        use crate::snapshot::restore::{self, Source};
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = tmp.path().join("store");
        let mut store = Store::create_or_open(&dir).unwrap_or_else(|e| panic!("{e}"));
        let pages = 64u64;
        let len = pages * PAGE as u64;
        let arena = |memfd_pages: u64| RegionMeta {
            kind: store::RegionKind::Arena,
            name: "a".into(),
            addr: 0x4000_0000,
            size: len,
            layout: serde_json::json!({"memfd_bytes": memfd_pages * PAGE as u64}),
        };
        let manifest = RegionMeta {
            kind: store::RegionKind::Static,
            name: MANIFEST_REGION.into(),
            addr: 0,
            size: PAGE as u64,
            layout: serde_json::json!({}),
        };
        // S: pages 0..10, 20, and 40 (past its recorded memfd size, 32)
        let s = {
            let mut w = store
                .begin(NewSnapshot::full_for_test(vec![
                    arena(32),
                    manifest.clone(),
                ]))
                .unwrap_or_else(|e| panic!("{e}"));
            for p in (0..10).chain([20, 40]) {
                w.put_page(0, p, &[p as u8 + 1; PAGE])
                    .unwrap_or_else(|e| panic!("{e}"));
            }
            w.put_bytes(1, b"manifest one")
                .unwrap_or_else(|e| panic!("{e}"));
            w.commit().unwrap_or_else(|e| panic!("{e}")).id
        };
        let src = |id: &SnapshotId| Source {
            dir: dir.clone(),
            spec: id.as_str().to_string(),
        };
        let r = restore::materialize(&src(&s)).unwrap_or_else(|e| panic!("{e}"));
        let baseline = r.baseline.clone().unwrap_or_else(|| panic!("no baseline"));
        let sealed = r
            .fds
            .into_iter()
            .find(|(_, n, _)| n == "a")
            .map(|(_, _, fd)| fd)
            .unwrap_or_else(|| panic!("no memfd for a"));
        assert_eq!(
            fd_size(sealed.as_raw_fd()),
            41 * PAGE as u64,
            "the restore wrote page 40"
        );
        // the restore's memfd cannot shrink (F_SEAL_SHRINK); the app below
        // cuts its file short, as one without the seal could: a copy
        let fd = restore::memfd("a", 41 * PAGE as u64).unwrap_or_else(|e| panic!("{e}"));
        let raw = fd.as_raw_fd();
        let mut page = vec![0u8; PAGE];
        for p in 0..41 {
            pread_full(sealed.as_raw_fd(), &mut page, p * PAGE as u64).unwrap();
            if page.iter().any(|&b| b != 0) {
                // SAFETY: writing our buffer into our memfd.
                let n = unsafe {
                    libc::pwrite(raw, page.as_ptr().cast(), PAGE, (p * PAGE as u64) as i64)
                };
                assert_eq!(n, PAGE as isize);
            }
        }
        // what the restored app does to it
        write_page(raw, 1, 0xee); // rewritten
        write_page(raw, 2, 0); // zeroed by a write: data, all zero
        // SAFETY: our memfd; pages 3 and 20 freed, then the file cut to 36
        // pages (page 40, which S has, is past its end now)
        unsafe {
            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            assert_eq!(libc::fallocate(raw, punch, 3 * PAGE as i64, PAGE as i64), 0);
            assert_eq!(
                libc::fallocate(raw, punch, 20 * PAGE as i64, PAGE as i64),
                0
            );
            assert_eq!(libc::ftruncate(raw, 36 * PAGE as i64), 0);
        }
        write_page(raw, 33, 0x33); // new
        let want = memfd_bytes(raw, len);

        let mut held = HashMap::new();
        held.insert("a".to_string(), HeldRegion::new(RegionKind::Arena, fd));
        let layout = Layout {
            regions: vec![Region {
                kind: RegionKind::Arena,
                new: true,
                tracked_from_map: false,
                name: "a".into(),
                addr: 0x4000_0000,
                len,
                first: 0,
                count: 0,
                ino: 0,
            }],
            manifest_size: PAGE as u64,
        };
        let metas = layout.metas(&held);
        let base = baseline
            .region_like(&metas[0])
            .unwrap_or_else(|| panic!("the arena has a baseline region"))
            .to_vec();
        let mut shadow = Shadow::new(0);
        let mut staging = Staging::new(1 << 20);
        let mut t = Taking {
            writer: None,
            store: Some(&mut store),
            held: &held,
            layout: Some(layout),
            staging: &mut staging,
            shadow: &mut shadow,
            delta_buf: Vec::new(),
            full: false,
            journal: false,
            plan_meta: Some(NewSnapshot {
                parent: Some(s.clone()),
                full: false,
                epoch: 2,
                generation: 2,
                app: "t".into(),
                tags: Vec::new(),
                regions: metas,
                redo: None,
            }),
            touched: Vec::new(),
            copy_buf: Vec::new(),
            skip_zero: false,
            whole_pages: 0,
            against: true,
            from_map_regions: 0,
            unchanged: 0,
            gone: Vec::new(),
            views_refused: Vec::new(),
            saw_new: false,
        };
        let staged = t.copy_changed(0, &base).unwrap_or_else(|e| panic!("{e}"));
        // changed: 1, 33; zero now: 2, 3, 20, 40
        assert_eq!(staged, 6);
        assert_eq!(t.unchanged, 7, "pages 0 and 4..10 are as S has them");
        t.flush().unwrap_or_else(|e| panic!("{e}"));
        let w = t.writer().unwrap_or_else(|e| panic!("{e}"));
        w.put_bytes(1, b"manifest two")
            .unwrap_or_else(|e| panic!("{e}"));
        let d = t
            .writer
            .take()
            .unwrap_or_else(|| panic!("no writer"))
            .commit()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.parent.as_ref(), Some(&s));
        let back = restore::materialize(&src(&d.id)).unwrap_or_else(|e| panic!("{e}"));
        let got = back
            .fds
            .iter()
            .find(|(_, n, _)| n == "a")
            .map(|(_, _, fd)| memfd_bytes(fd.as_raw_fd(), len))
            .unwrap_or_else(|| panic!("no memfd for a"));
        let differ: Vec<usize> = (0..pages as usize)
            .filter(|&p| got[p * PAGE..(p + 1) * PAGE] != want[p * PAGE..(p + 1) * PAGE])
            .collect();
        assert!(differ.is_empty(), "pages differ from the memfd: {differ:?}");
    }
}
