//! The app's redo log (rekindle.h, "The redo log"; docs/snapshots.md,
//! "The redo log"): the ring the app appends records to (`ring`), the
//! thread that writes them to DIR/redo (`writer`; the files' format is
//! store/redo.rs), what a cut takes from it (the snapshot's position in the
//! log, `at_cut`) and what a start from a snapshot gets back (`replay_for`).
//!
//! Lines: records are replayed only on top of a snapshot of the same line.
//! A line opens at a cut (so its first snapshot is the one it starts from)
//! and lasts as long as the app's state is that snapshot plus the line's
//! records: through warm restarts, not through a start from a snapshot, a
//! gap the app declares (rk_redo_gap) or the writer failing.

pub mod ring;
pub mod writer;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::store::StoreError;
use crate::store::manifest::RedoMark;
use ring::Ring;
use writer::{Msg, Stats, Writer};

pub struct Redo {
    ring: Arc<Ring>,
    /// A cut's opening of a line and a start's closing of the log, one at
    /// a time (the engine thread and the supervisor's).
    lines: Mutex<()>,
    tx: Mutex<Sender<Msg>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    pub stats: Arc<Mutex<Stats>>,
    dir: PathBuf,
}

/// A line id: random, never 0 (0 is "closed").
fn new_line_id() -> u64 {
    let mut b = [0u8; 8];
    loop {
        // SAFETY: getrandom into our buffer.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        let v = u64::from_le_bytes(b);
        if n == 8 && v != 0 {
            return v;
        }
        if n != 8 {
            // no entropy source: time and pid are unique enough for a line
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            return (t ^ (u64::from(std::process::id()) << 48)) | 1;
        }
    }
}

impl Redo {
    /// Creates the ring and starts the writer for the store at `dir`.
    pub fn start(
        dir: &Path,
        metrics: Option<crate::metrics::RedoMetrics>,
    ) -> std::io::Result<Arc<Redo>> {
        let ring = Arc::new(Ring::create()?);
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(Stats::default()));
        let w = Writer {
            ring: ring.clone(),
            dir: dir.to_path_buf(),
            rx,
            stats: stats.clone(),
            metrics,
            failing: std::sync::atomic::AtomicBool::new(false),
        };
        let thread = crate::store::fsio::spawn_quiet("rekindle-redo", move || w.run())?;
        Ok(Arc::new(Redo {
            ring,
            lines: Mutex::new(()),
            tx: Mutex::new(tx),
            thread: Mutex::new(Some(thread)),
            stats,
            dir: dir.to_path_buf(),
        }))
    }

    fn send(&self, m: Msg) {
        let _ = self.tx.lock().unwrap_or_else(|p| p.into_inner()).send(m);
        let one: u64 = 1;
        // SAFETY: an 8-byte write to our eventfd (the writer's wake).
        unsafe {
            libc::write(
                self.ring.kick.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }

    /// The fds the app gets, in the order of `$REKINDLE_REDO_FDS`.
    pub fn fds(&self) -> [BorrowedFd<'_>; 3] {
        [
            self.ring.memfd(),
            self.ring.kick.as_fd(),
            self.ring.done.as_fd(),
        ]
    }

    /// At a cut, the app frozen: the snapshot's position in the log.  A
    /// closed log opens here, on a new line that starts from this snapshot.
    pub fn at_cut(&self) -> RedoMark {
        let _one = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let at = self.ring.committed();
        let (line, gaps) = (self.ring.line(), self.ring.app_gaps());
        if self.ring.writer_errno() != 0 || (line != 0 && self.ring.line_gaps() == gaps) {
            // open (or the writer failing: appends fail with -EIO, and the
            // line opens again at a cut after it recovers): where it stands
            return RedoMark { line, at };
        }
        let line = new_line_id();
        self.send(Msg::OpenLine { line, at });
        self.ring.open_line(line, at, gaps);
        RedoMark { line, at }
    }

    /// The snapshot with `m` is durable: so is every record before its
    /// position, and its line's records from now on.
    pub fn snapshot_durable(&self, m: RedoMark) {
        if m.line != 0 {
            self.send(Msg::SnapshotDurable(m));
        }
    }

    /// Before a start from a snapshot (the app is dead): every record it
    /// committed is written, then the log is closed until the next cut.
    /// Err if they could not all be written (the restore then replays what
    /// is on disk, and says so).
    pub fn drain_and_close(&self) -> Result<u64, StoreError> {
        let _one = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let (tx, rx) = mpsc::channel();
        self.send(Msg::DrainAndClose(tx));
        writer::recv_reply(&rx, Duration::from_secs(30)).unwrap_or_else(|| {
            // closed anyway: the next incarnation must not continue a line
            // past records the replay did not get (they were not durable:
            // the writer had not synced them)
            self.ring.close_line();
            Err(StoreError::Io {
                path: self.dir.clone(),
                op: "redo drain",
                detail: "the redo writer did not answer within 30 s".into(),
            })
        })
    }

    pub fn set_replay_pending(&self, on: bool) {
        self.ring.set_replay_pending(on);
    }

    /// The runtime's replay is not finished (a death now restores again).
    pub fn replay_pending(&self) -> bool {
        self.ring.replay_pending()
    }

    /// Where the last incarnation began in the log: (line or 0, position).
    pub fn incarnation_start(&self) -> (u64, u64) {
        self.ring.started()
    }

    pub fn committed(&self) -> u64 {
        self.ring.committed()
    }
    pub fn durable(&self) -> u64 {
        self.ring.durable()
    }
    pub fn is_open(&self) -> bool {
        self.ring.is_open()
    }

    /// The open line (0: closed).
    pub fn line(&self) -> u64 {
        self.ring.line()
    }

    /// The app logs its changes: the log is open and it has appended to
    /// the open line (an app that never appends is not a user of the log,
    /// and its changes are in snapshots only).
    pub fn in_use(&self) -> bool {
        self.ring.is_open() && self.ring.committed() > self.ring.line_start()
    }
}

impl std::fmt::Debug for Redo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redo")
            .field("committed", &self.committed())
            .field("durable", &self.durable())
            .field("open", &self.is_open())
            .finish()
    }
}

impl Drop for Redo {
    fn drop(&mut self) {
        self.send(Msg::Stop);
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// What a start from a snapshot replays: the records of its line after its
/// position, in a memfd the app maps (`$REKINDLE_REDO_REPLAY`).
pub struct Replay {
    pub fd: OwnedFd,
    pub records: u64,
    pub bytes: u64,
    pub line: u64,
    pub from: u64,
    pub end: u64,
}

/// The stream up to position `until` (a record boundary: an incarnation's
/// start is one), its records counted again.
fn cut_at(
    mut s: crate::store::redo::RedoStream,
    until: u64,
    dir: &Path,
) -> Result<crate::store::redo::RedoStream, StoreError> {
    let keep = until.saturating_sub(s.from) as usize;
    let mut at = 0usize;
    let mut records = 0u64;
    while at < keep {
        let Some(head) = s.bytes.get(at..at + ring::REC_HEAD) else {
            break;
        };
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        at += ring::REC_HEAD + len;
        records += 1;
    }
    if at != keep {
        return Err(StoreError::RedoCorrupt {
            path: dir.join(crate::store::redo::REDO_DIR),
            offset: until,
            detail: format!(
                "position {until} is not between two records of line {:016x}",
                s.line
            ),
        });
    }
    s.bytes.truncate(keep);
    s.end = until;
    s.records = records;
    Ok(s)
}

/// The replay for a start from a snapshot with `mark`, or None when no
/// record follows it.  An error (a damaged log) refuses the start: the
/// records are acknowledged writes, and starting without them would drop
/// them silently.
pub fn replay_for(
    store_dir: &Path,
    mark: RedoMark,
    until: Option<u64>,
) -> Result<Option<Replay>, StoreError> {
    if mark.line == 0 {
        return Ok(None);
    }
    let mut s = crate::store::redo::read_stream(store_dir, mark.line, mark.at)?;
    if let Some(u) = until.filter(|&u| u < s.end) {
        s = cut_at(s, u, store_dir)?;
    }
    if s.bytes.is_empty() {
        return Ok(None);
    }
    let io = |op: &'static str| {
        let path = store_dir.to_path_buf();
        move |e: std::io::Error| crate::store::error::io_err(op, &path, &e)
    };
    let name = c"rekindle:redo-replay";
    // SAFETY: plain syscall; the fd is owned from here on.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(io("memfd_create")(std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let f = std::fs::File::from(fd.try_clone().map_err(io("dup"))?);
    std::os::unix::fs::FileExt::write_all_at(&f, &s.bytes, 0).map_err(io("write"))?;
    Ok(Some(Replay {
        fd,
        records: s.records,
        bytes: s.bytes.len() as u64,
        line: mark.line,
        from: s.from,
        end: s.end,
    }))
}
