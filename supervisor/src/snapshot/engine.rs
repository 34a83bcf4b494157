//! The snapshot engine: a thread of the supervisor that owns the store and
//! talks to the app's snapshot agent.  The poll loop hands it what it needs
//! (each incarnation's snapshot socket, dups of the held memfds, checkpoint
//! requests) through `Handle`, and reads back `Note`s: the engine never
//! touches the supervisor's state, and compression and writes never run on
//! the poll loop or in the app.
//!
//! Back-pressure: snapshots are taken one after the other; when one takes
//! longer than the interval (a slow disk, a high write rate), the next one
//! starts as soon as it is done, so the interval stretches and every page
//! written meanwhile is in the next snapshot (its dirty state stays in the
//! page tables until then).  Memory: at most `staging_bytes` of copied
//! pages are held; beyond that they go to the store writer early.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::agent_link::{self, AgentMsg, RegionKind, SnapStatus};
use super::baseline::Baseline;
use super::cut::{self, AgentLink, BufMap, Done, Failure, HeldRegion, Plan};
use crate::app_link::{self, Recv};
use crate::proto::FdKind;
use crate::store::{FoldReport, Retention, SnapshotId, Store};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub dir: PathBuf,
    pub interval: Option<Duration>,
    pub app: String,
    /// Keep at most this many snapshots (gc after each published snapshot
    /// and each idle fold of the journal).
    pub keep: Option<usize>,
    pub staging_bytes: usize,
    pub freeze_timeout: Duration,
    pub precopy_rounds: u32,
    /// `--snapshot-publish-every`: interval snapshots go to the store's
    /// journal (one append and one fdatasync each), and what it holds is
    /// published on the fold thread at most this often.  None: each one is
    /// published (three files, three fsync rounds).
    pub publish_every: Option<Duration>,
    /// `--cluster`: each commit goes to the replication sender; with sync
    /// replication the app's durable epoch waits for the standbys' ack.
    pub replication: Option<std::sync::Arc<crate::cluster::link::ReplicationLink>>,
    /// Open the store (every pack's index) as soon as the engine starts,
    /// while the app starts; false during a lazy restore, whose app waits
    /// for its pages from the same disk and CPU (the engine gets no
    /// snapshot to take until the restore is over anyway).
    pub open_at_start: bool,
    /// The app's redo log: each cut records its position in it.
    pub redo: Option<std::sync::Arc<crate::redo::Redo>>,
    /// While the app logs its changes (the redo log open), an interval
    /// snapshot is taken only once this many bytes of records followed the
    /// last one: the log keeps them durable, a snapshot only bounds how much
    /// a restore replays.
    pub redo_snapshot_bytes: u64,
}

/// Why a restored incarnation's first snapshot is full after all (the
/// `snapshot_baseline` event's code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaselineUnused {
    /// The snapshot it started from is in another store than this one.
    OtherStore,
    /// It is not this store's newest (a rollback to an older one, or
    /// snapshots were taken since): its delta would fork the line.
    NotNewest,
}

impl BaselineUnused {
    pub fn code(self) -> &'static str {
        match self {
            BaselineUnused::OtherStore => "baseline_other_store",
            BaselineUnused::NotNewest => "baseline_not_newest",
        }
    }
}

pub enum Cmd {
    /// A new process: the supervisor's end of its snapshot socket pair.
    Incarnation {
        pid: i32,
        sock: OwnedFd,
    },
    /// The memfds the supervisor holds now (dups), by FDS name.
    Held(Vec<(FdKind, String, OwnedFd)>),
    /// The process is gone.
    Gone,
    /// The next incarnation starts from this snapshot's memfds.
    Baseline(Box<Baseline>),
    /// One snapshot now; `client` is answered with a `Note::Checkpoint`.
    Checkpoint {
        client: u64,
        tags: Vec<String>,
    },
    Shutdown,
}

/// What the engine tells the poll loop.
pub enum Note {
    AgentReady {
        pid: u32,
        generation: u32,
    },
    AgentUnavailable {
        pid: u32,
        status: SnapStatus,
        err: i32,
    },
    Snapshot(Box<Done>),
    /// An interval snapshot not taken: nothing had changed since the last.
    Unchanged,
    Failed {
        code: &'static str,
        detail: String,
    },
    Checkpoint {
        client: u64,
        reply: serde_json::Value,
    },
    Gc {
        removed: usize,
        freed_bytes: u64,
        took: Duration,
        /// Snapshots whose retention was put off until this one.
        put_off: u32,
    },
    /// The journal's records published as snapshots.
    JournalFolded {
        when: FoldWhen,
        took: Duration,
        records: u64,
        published: usize,
    },
    /// Async with `--max-lag`: replies began (held) or stopped waiting for
    /// the standbys.
    LagBound {
        held: bool,
        behind_ms: u64,
        max_ms: u64,
    },
    /// A restored incarnation's first snapshot could not be a delta of
    /// the snapshot it started from, and is full.
    BaselineUnused {
        id: String,
        why: BaselineUnused,
    },
    /// A location index written (or why not) for snapshot `id`.
    Indexed {
        id: crate::store::SnapshotId,
        result: Result<super::indexer::Indexed, crate::store::StoreError>,
    },
}

/// Which fold of the journal a `JournalFolded` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoldWhen {
    /// A journal file, on a thread of its own while the other took the
    /// appends: a full one, or under `--snapshot-publish-every` the one
    /// due.
    Background,
    /// The engine, idle for IDLE_FOLD_AFTER.
    Idle,
    /// The engine, stopping.
    Stop,
}

impl FoldWhen {
    pub fn as_str(self) -> &'static str {
        match self {
            FoldWhen::Background => "background",
            FoldWhen::Idle => "idle",
            FoldWhen::Stop => "stop",
        }
    }
}

pub struct Handle {
    tx: Sender<Cmd>,
    wake: OwnedFd,
    notes: Receiver<Note>,
    /// Readable when notes are waiting (an eventfd).
    pub notify: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

/// A wait as poll(2)'s timeout, rounded up: rounded down, the last
/// millisecond before a snapshot is due was a spin of poll(0) (7% of a core
/// at 10 ms intervals, measured with unchanged probes).
fn poll_ms(d: Duration) -> i32 {
    d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd returns a fresh fd or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn poke(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: an 8-byte write to an eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn drain(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: an 8-byte read from an eventfd.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

impl Handle {
    /// `store`: the store at `cfg.dir` already open with its indexes, if
    /// the caller has one (used instead of opening it again).
    pub fn start(
        cfg: EngineConfig,
        store: Option<crate::store::preopened::Preopened>,
    ) -> std::io::Result<Handle> {
        let (tx, rx) = channel();
        let (ntx, notes) = channel();
        let wake = eventfd()?;
        let notify = eventfd()?;
        let indexer = super::indexer::Indexer::new(cfg.dir.clone());
        let engine = Engine {
            cfg,
            rx,
            wake: wake.try_clone()?,
            notes: ntx,
            notify: notify.try_clone()?,
            store: None,
            preopened: store,
            sock: None,
            agent: None,
            held: HashMap::new(),
            last: None,
            newest: None,
            baseline: None,
            epoch: 0,
            carry: HashMap::new(),
            shadow: super::shadow::Shadow::new(super::shadow::shadow_bytes()),
            staging: super::staging::Staging::new(0),
            force_full: true,
            next_due: None,
            waiting: Vec::new(),
            agent_wait_until: None,
            failing_since: None,
            agent_since: None,
            durable_efd: None,
            request_efd: None,
            requested: false,
            last_busy: Instant::now(),
            last_app_commit: None,
            last_redo: None,
            last_publish: Instant::now(),
            last_pages: None,
            last_took: false,
            unchanged_skipped: 0,
            idle_fold_failed: None,
            last_retention: None,
            retention_put_off: 0,
            refused: 0,
            unacked: std::collections::VecDeque::new(),
            lagging: std::collections::VecDeque::new(),
            published: 0,
            lag_held: false,
            indexer,
        };
        let thread = std::thread::Builder::new()
            .name("rk-snapshots".into())
            .spawn(move || engine.run())?;
        Ok(Handle {
            tx,
            wake,
            notes,
            notify,
            thread: Some(thread),
        })
    }

    pub fn send(&self, c: Cmd) {
        if self.tx.send(c).is_ok() {
            poke(&self.wake);
        }
    }

    /// Every note waiting.
    pub fn notes(&self) -> Vec<Note> {
        drain(&self.notify);
        let mut v = Vec::new();
        while let Ok(n) = self.notes.try_recv() {
            v.push(n);
        }
        v
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.send(Cmd::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Engine {
    cfg: EngineConfig,
    rx: Receiver<Cmd>,
    wake: OwnedFd,
    notes: Sender<Note>,
    notify: OwnedFd,
    store: Option<Store>,
    /// Handed over at the start: becomes `store` when the engine opens it.
    preopened: Option<crate::store::preopened::Preopened>,
    /// The current process's snapshot socket (before its agent's HELLO).
    sock: Option<(i32, OwnedFd)>,
    agent: Option<AgentLink>,
    held: HashMap<String, HeldRegion>,
    /// The last snapshot this engine committed: the parent of the next.
    last: Option<SnapshotId>,
    /// The store's newest snapshot when the engine opened it.
    newest: Option<SnapshotId>,
    /// What the memfds held when the current incarnations began, until
    /// the first snapshot after them is committed.
    baseline: Option<Box<Baseline>>,
    epoch: u64,
    /// Pages reported for a snapshot that was abandoned.
    carry: HashMap<String, BTreeSet<u64>>,
    /// Pages as the newest snapshot holds them (delta records).
    shadow: super::shadow::Shadow,
    /// Where a snapshot's pages wait for the cut to complete (its memory
    /// kept from one snapshot to the next).
    staging: super::staging::Staging,
    force_full: bool,
    next_due: Option<Instant>,
    waiting: Vec<(u64, Vec<String>)>,
    /// Checkpoints waiting for an incarnation's agent are refused after.
    agent_wait_until: Option<Instant>,
    /// Continuous snapshots failing since (reported once per failure kind).
    failing_since: Option<&'static str>,
    /// When the current agent said HELLO.
    agent_since: Option<Instant>,
    /// The app's eventfds: written after each commit (rk_durable_fd), and
    /// read for rk_checkpoint()'s requests.
    durable_efd: Option<OwnedFd>,
    request_efd: Option<OwnedFd>,
    /// rk_checkpoint() asked for a snapshot.
    requested: bool,
    /// Snapshots the app asked for and could not have (an unsafe region
    /// open past the freeze timeout, ...) since the last that was taken:
    /// each is asked again after a delay doubling from REFUSED_RETRY.
    refused: u32,
    /// Sync replication: committed snapshots (id, the app's epoch of the
    /// cut) whose durable epoch waits for the standbys' ack, oldest first.
    unacked: std::collections::VecDeque<(SnapshotId, u64)>,
    /// Async with `--max-lag`: committed snapshots not yet acknowledged by
    /// the standbys (id, the app's epoch of the cut, when committed),
    /// oldest first; replies wait once the oldest is older than the bound.
    lagging: std::collections::VecDeque<(SnapshotId, u64, Instant)>,
    /// The newest epoch published to the app (it only grows).
    published: u64,
    /// Replies are held for the lag bound now (said once per change).
    lag_held: bool,
    /// Writes the newest snapshot's location index, off the app's path.
    indexer: super::indexer::Indexer,
    /// When the last snapshot ended or the app last asked for one: the
    /// journal is folded once nothing happened for IDLE_FOLD_AFTER.
    last_busy: Instant,
    /// When the app last asked for a snapshot (rk_checkpoint).
    last_app_commit: Option<Instant>,
    /// The redo mark of the last snapshot taken.
    last_redo: Option<crate::store::manifest::RedoMark>,
    /// When the journal's records were last handed to a fold, or a
    /// snapshot published: `publish_every` counts from then.
    last_publish: Instant,
    /// Pages the last snapshot taken in this incarnation copied (pre-copy
    /// and cut; a failed one changes nothing): after a large one an interval
    /// snapshot is published under `--snapshot-publish-every`
    /// (JOURNAL_INTERVAL_MAX_PAGES).
    last_pages: Option<u64>,
    /// The last snapshot attempt succeeded: the agent's last cut is the
    /// newest snapshot, which a probe compares with (Plan::probe).
    last_took: bool,
    /// Interval snapshots not taken since the last one: nothing had changed.
    unchanged_skipped: u64,
    /// When the last idle fold failed (reported): the next waits for a
    /// snapshot, or IDLE_FOLD_RETRY (interval snapshots that find nothing
    /// changed leave the engine idle for good).
    idle_fold_failed: Option<Instant>,
    /// When the last retention ended and how long it took: a retention
    /// after a snapshot waits until the engine has spent
    /// RETENTION_SHARE_MAX of its time since then on it.
    last_retention: Option<(Instant, Duration)>,
    /// Snapshots whose retention was put off since the last one ran: it
    /// runs when idle or at a stop.
    retention_put_off: u32,
}

/// A retention reads every kept snapshot's map and every pack's index
/// (gc.rs): at 10 ms snapshots and a store of a million pages, running it
/// after each snapshot left time for one snapshot a second.  After a
/// snapshot it runs only once the time since the last one is at least
/// 1/RETENTION_SHARE_MAX of that one's length; the store may hold more than
/// `--snapshot-keep` until then.  One put off runs when the engine is idle
/// or stops.
const RETENTION_SHARE_MAX: u32 = 10;

/// An engine that took no snapshot and was asked for none this long is
/// idle: it publishes what the journal holds then.  A poll that merely timed
/// out (the location indexer's schedule, a group commit's gather in the
/// app) is not idleness: a fold of a full journal takes 100-250 ms, which
/// every held reply would wait for.
const IDLE_FOLD_AFTER: Duration = Duration::from_millis(200);
/// An idle fold that failed is tried again after this, if no snapshot has
/// succeeded meanwhile (one folds the journal first).
const IDLE_FOLD_RETRY: Duration = Duration::from_secs(1);

/// Under `--snapshot-publish-every`, an interval snapshot after one that
/// copied more than this many pages is published, not journaled.  Such
/// snapshots come back to back (the app writes faster than the engine
/// copies): each one's fixed cost is spread over many pages already, and a
/// fold would compress the same pages again on top of an engine that runs
/// all the time (measured: SET -P 16 lost a third of its throughput).
const JOURNAL_INTERVAL_MAX_PAGES: u64 = 8192;

/// How long a checkpoint asked for while an incarnation starts waits for
/// its agent's HELLO.
const AGENT_START_WAIT: Duration = Duration::from_secs(5);
/// Right after an agent's HELLO the poll loop may not have handed over the
/// memfds of the arenas the app opened meanwhile: a missing fd then is
/// retried this soon, for this long, before it is reported.
const HELD_RETRY: Duration = Duration::from_millis(50);
const HELD_GRACE: Duration = Duration::from_secs(2);

/// A snapshot the app asked for (rk_checkpoint: its replies wait until it
/// is durable) that failed for a passing reason is taken again: after
/// 10 ms, then 20, 40, ... up to REFUSED_RETRY_MAX, so that an unsafe
/// region held for long is not frozen against every 10 ms.
const REFUSED_RETRY: Duration = Duration::from_millis(10);
const REFUSED_RETRY_MAX: Duration = Duration::from_secs(1);

impl Engine {
    fn note(&self, n: Note) {
        if self.notes.send(n).is_ok() {
            poke(&self.notify);
        }
    }

    fn run(mut self) {
        // The store now, while the app starts, not at the first snapshot:
        // opening it loads every pack's index (hundreds of ms at millions
        // of chunks), which a new primary's first acknowledged write would
        // otherwise wait for.  A failure here is met again, and reported,
        // at the first snapshot.  Not during a lazy restore (open_at_start).
        if self.cfg.open_at_start {
            let _ = self.open_store();
        }
        loop {
            let timeout = self.poll_timeout();
            let mut pfds = vec![libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            let sock_fd = self
                .agent
                .as_ref()
                .map(|a| a.sock.as_raw_fd())
                .or(self.sock.as_ref().map(|(_, s)| s.as_raw_fd()));
            let req_fd = self
                .request_efd
                .as_ref()
                .filter(|_| self.agent.is_some())
                .map(|f| f.as_raw_fd());
            if let Some(fd) = req_fd {
                pfds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let acked_fd = self
                .cfg
                .replication
                .as_ref()
                .filter(|l| l.waits_for_acks())
                .map(|l| l.acked_fd());
            let acked_at = pfds.len();
            if let Some(fd) = acked_fd {
                pfds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let sock_at = pfds.len();
            if let Some(fd) = sock_fd {
                pfds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            // SAFETY: a live array of pollfd.
            let ready =
                unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
            if ready == 0
                && self.next_due.is_none_or(|t| Instant::now() < t)
                && self.last_busy.elapsed() >= IDLE_FOLD_AFTER
                && self.idle_fold_due()
            {
                // idle: what the journal holds is published, then counted
                // (under --snapshot-publish-every, on its own schedule)
                if self.cfg.publish_every.is_none() {
                    self.idle_fold_failed =
                        (!self.fold_then_retention(FoldWhen::Idle)).then(Instant::now);
                }
                self.retention_if_put_off();
            }
            drain(&self.wake);
            loop {
                match self.rx.try_recv() {
                    Ok(Cmd::Shutdown) | Err(TryRecvError::Disconnected) => {
                        self.fold_then_retention(FoldWhen::Stop);
                        self.retention_if_put_off();
                        return;
                    }
                    Ok(c) => self.on_cmd(c),
                    Err(TryRecvError::Empty) => break,
                }
            }
            if req_fd.is_some() && pfds[1].revents != 0 {
                if let Some(f) = &self.request_efd {
                    drain(f);
                }
                self.requested = true;
                self.last_busy = Instant::now();
                self.last_app_commit = Some(self.last_busy);
            }
            if acked_fd.is_some() && pfds[acked_at].revents != 0 {
                self.on_replica_acked();
            }
            if pfds.len() > sock_at && pfds[sock_at].revents != 0 {
                self.on_agent_readable();
            }
            if let Some((id, r)) = self.indexer.tick() {
                self.note(Note::Indexed { id, result: r });
            }
            self.reap_background_fold();
            self.publish_journal_if_due();
            if self.agent.is_none() && self.agent_wait_until.is_some_and(|t| Instant::now() >= t) {
                self.refuse_waiting_no_agent();
            }
            let mut due = self.next_due.is_some_and(|t| Instant::now() >= t);
            if due && !self.requested && self.waiting.is_empty() && self.redo_defers() {
                // the redo log keeps the app's writes durable: a snapshot
                // now would cost the app a cut and the core a copy of every
                // page written, for a shorter replay only
                self.next_due = self.cfg.interval.map(|iv| Instant::now() + iv);
                due = false;
            }
            if due && !self.requested && self.waiting.is_empty() && self.app_commits_flowing() {
                // the app's own snapshots come more often than the interval
                // and each cuts every write: this one, published, would only
                // fold the journal on the reply path
                self.next_due = self.cfg.interval.map(|iv| Instant::now() + iv);
                due = false;
            }
            if self.agent.is_some() && (due || self.requested || !self.waiting.is_empty()) {
                let app_asked = std::mem::take(&mut self.requested) || self.refused > 0;
                // (a snapshot found unchanged leaves the engine idle: the
                // idle fold still comes)
                if self.snapshot(app_asked) {
                    self.last_busy = Instant::now();
                }
            }
        }
    }

    /// The app logs its changes in the redo log, which holds less than
    /// `redo_snapshot_bytes` since the last snapshot: an interval snapshot
    /// can wait.  (Not for an app that does not append: the line a cut
    /// opens is there for every app, and its changes are in snapshots only.)
    /// Only on a line the last snapshot is of: a line whose opening
    /// snapshot failed has none yet, and its records wait for one.
    fn redo_defers(&self) -> bool {
        let (Some(r), Some(last)) = (&self.cfg.redo, self.last_redo) else {
            return false;
        };
        r.in_use()
            && r.line() == last.line
            && r.committed().saturating_sub(last.at) < self.cfg.redo_snapshot_bytes
    }

    /// The app asks for snapshots (rkv `--durability sync`): the journal
    /// holds its records and the last came less than IDLE_FOLD_AFTER ago.
    fn app_commits_flowing(&self) -> bool {
        self.last_app_commit
            .is_some_and(|t| t.elapsed() < IDLE_FOLD_AFTER)
            && self.store.as_ref().is_some_and(|s| s.journal_pending())
    }

    fn idle_fold_due(&self) -> bool {
        self.idle_fold_failed
            .is_none_or(|t| t.elapsed() >= IDLE_FOLD_RETRY)
    }

    fn poll_timeout(&self) -> i32 {
        let until = |t: Instant| poll_ms(t.saturating_duration_since(Instant::now()));
        let ms = match (self.agent.is_some(), self.next_due, self.agent_wait_until) {
            (true, Some(t), _) => until(t).min(1000),
            (false, _, Some(t)) if !self.waiting.is_empty() => until(t).min(1000),
            _ => 1000,
        };
        let ms = match self.indexer.wait() {
            Some(w) => ms.min(poll_ms(w)),
            None => ms,
        };
        if self.idle_fold_due() && self.store.as_ref().is_some_and(|s| s.journal_pending()) {
            let left = match self.cfg.publish_every {
                None => IDLE_FOLD_AFTER.saturating_sub(self.last_busy.elapsed()),
                Some(every) => every.saturating_sub(self.last_publish.elapsed()),
            };
            ms.min(left.as_millis() as i32 + 1)
        } else {
            ms
        }
    }

    /// Checkpoints that waited AGENT_START_WAIT for an agent that never
    /// said HELLO.
    fn refuse_waiting_no_agent(&mut self) {
        self.agent_wait_until = None;
        for (client, _) in std::mem::take(&mut self.waiting) {
            self.note(Note::Checkpoint {
                client,
                reply: serde_json::json!({"ok": false, "code": "agent_not_ready",
                    "error": format!("the app's snapshot agent did not start within {} s (is the app linked with librekindle?)",
                        AGENT_START_WAIT.as_secs())}),
            });
        }
    }

    fn on_cmd(&mut self, c: Cmd) {
        match c {
            Cmd::Incarnation { pid, sock } => {
                self.agent = None;
                self.sock = Some((pid, sock));
            }
            Cmd::Held(v) => {
                self.held = v
                    .into_iter()
                    .filter_map(|(k, name, fd)| {
                        let kind = match k {
                            FdKind::Arena => RegionKind::Arena,
                            FdKind::Range => RegionKind::Range,
                            FdKind::Manifest => return None,
                        };
                        Some((name, HeldRegion::new(kind, fd)))
                    })
                    .collect();
            }
            Cmd::Gone => {
                self.agent = None;
                self.sock = None;
                self.durable_efd = None;
                self.request_efd = None;
                self.force_full = true;
                for (client, _) in std::mem::take(&mut self.waiting) {
                    self.note(Note::Checkpoint {
                        client,
                        reply: serde_json::json!({"ok": false, "code": "app_gone",
                            "error": "the app is gone; no snapshot was taken"}),
                    });
                }
            }
            Cmd::Checkpoint { client, tags } => {
                if self.agent.is_none() && self.sock.is_none() {
                    self.note(Note::Checkpoint {
                        client,
                        reply: serde_json::json!({"ok": false, "code": "agent_not_ready",
                            "error": "the app's snapshot agent has not started (is the app linked with librekindle, and up?)"}),
                    });
                    return;
                }
                if self.agent.is_none() && self.waiting.is_empty() {
                    // an incarnation is starting: the app may answer
                    // requests before its agent's HELLO is read here
                    self.agent_wait_until = Some(Instant::now() + AGENT_START_WAIT);
                }
                self.waiting.push((client, tags));
            }
            Cmd::Baseline(b) => self.baseline = Some(b),
            Cmd::Shutdown => {}
        }
    }

    /// A HELLO (a new incarnation's agent, also after an in-place restart
    /// on the same socket), or a stale answer to drop.
    fn on_agent_readable(&mut self) {
        let fd = match (&self.agent, &self.sock) {
            (Some(a), _) => a.sock.try_clone(),
            (None, Some((_, s))) => s.try_clone(),
            _ => return,
        };
        let Ok(fd) = fd else { return };
        loop {
            match app_link::recv(fd.as_fd()) {
                Ok(Recv::Msg { data, fds, .. }) => match agent_link::parse(&data) {
                    Ok(AgentMsg::Hello(h)) => self.on_hello(h, fds, &fd),
                    Ok(_) => {} // an abandoned snapshot's answer
                    Err(e) => self.note(Note::Failed {
                        code: "bad_report",
                        detail: format!("malformed message from the snapshot agent: {e}"),
                    }),
                },
                Ok(Recv::WouldBlock) => return,
                Ok(Recv::Empty) | Err(_) => {
                    self.agent = None;
                    self.sock = None;
                    return;
                }
            }
        }
    }

    /// The standbys acknowledged up to a snapshot: release the app's
    /// replies held for it and every older one (one write for them all).
    fn on_replica_acked(&mut self) {
        let Some(acked) = self.cfg.replication.as_ref().and_then(|l| l.take_acked()) else {
            return;
        };
        if self.cfg.replication.as_ref().is_some_and(|l| !l.sync) {
            self.release_within_lag(Some(&acked));
            return;
        }
        let mut release = None;
        while self.unacked.front().is_some_and(|(id, _)| id <= &acked) {
            release = self.unacked.pop_front().map(|(_, e)| e);
        }
        if let Some(e) = release {
            self.publish_durable(e);
        }
    }

    /// Async with `--max-lag`: releases the replies of every commit while
    /// the oldest unacknowledged one is younger than the bound; past it,
    /// only those the standbys have acknowledged (as in sync mode) until
    /// they catch up.  A write acknowledged at time t is therefore lost in
    /// a failover only if its snapshot was committed after t - max_lag.
    fn release_within_lag(&mut self, acked: Option<&SnapshotId>) {
        let Some(max) = self.cfg.replication.as_ref().and_then(|l| l.max_lag) else {
            return;
        };
        let mut release = None;
        while let Some((id, e, _)) = self.lagging.front() {
            if acked.is_none_or(|a| id > a) {
                break;
            }
            release = Some(*e);
            self.lagging.pop_front();
        }
        let oldest = self.lagging.front().map(|(_, _, t)| t.elapsed());
        let held = oldest.is_some_and(|age| age > max);
        if !held {
            release = self.lagging.back().map(|(_, e, _)| *e).or(release);
        }
        if held != self.lag_held {
            self.lag_held = held;
            self.note(Note::LagBound {
                held,
                behind_ms: oldest.map_or(0, |a| a.as_millis() as u64),
                max_ms: max.as_millis() as u64,
            });
        }
        if let Some(e) = release {
            self.publish_durable(e);
        }
    }

    /// rk_durable_epoch(), rk_durable_fd(): the app's cut `app_epoch` is
    /// durable (locally, or with sync replication on the standbys too).
    fn publish_durable(&mut self, app_epoch: u64) {
        if app_epoch <= self.published && self.published != 0 {
            return; // older than what the app has: it only grows
        }
        self.published = app_epoch;
        if let Some(a) = &self.agent {
            a.buf
                .set_epoch(agent_link::OFF_BUF_DURABLE_EPOCH, app_epoch);
        }
        if let Some(f) = &self.durable_efd {
            poke(f);
        }
    }

    fn on_hello(&mut self, h: agent_link::Hello, mut fds: Vec<OwnedFd>, sock: &OwnedFd) {
        // a new process's epochs: the old one's held replies died with it
        self.unacked.clear();
        self.lagging.clear();
        self.published = 0;
        self.last_pages = None;
        self.force_full = true; // a new address space: what was written before is unknown
        self.last_took = false; // its agent has no cut yet to compare with
        self.carry.clear();
        if h.status != SnapStatus::Ok || fds.len() != agent_link::HELLO_FDS {
            self.agent = None;
            self.note(Note::AgentUnavailable {
                pid: h.pid,
                status: h.status,
                err: h.err,
            });
            return;
        }
        let request = fds.pop();
        let durable = fds.pop();
        let buf = match BufMap::map(fds.remove(0).as_fd(), h.buf_size as usize) {
            Ok(b) => b,
            Err(e) => {
                self.note(Note::Failed {
                    code: "bad_report",
                    detail: format!("cannot map the agent's buffer: {e}"),
                });
                return;
            }
        };
        let Ok(sock) = sock.try_clone() else { return };
        self.durable_efd = durable;
        self.request_efd = request;
        self.agent_wait_until = None;
        self.agent = Some(AgentLink {
            sock,
            buf,
            pid: h.pid,
            generation: h.generation,
            seq: 0,
        });
        self.sock = None;
        self.agent_since = Some(Instant::now());
        self.note(Note::AgentReady {
            pid: h.pid,
            generation: h.generation,
        });
        // the first snapshot of an incarnation at once: it is the base
        self.next_due = self.cfg.interval.map(|_| Instant::now());
    }

    /// Publishes what the journal holds (a stop, an idle app), off the
    /// reply path, reports it, then runs `--snapshot-keep`'s retention (the
    /// snapshots it published count from now on).  A failure is reported;
    /// the records stay in the journal.  False: it failed.
    fn fold_then_retention(&mut self, when: FoldWhen) -> bool {
        let Some(store) = self.store.as_mut().filter(|s| s.journal_pending()) else {
            return true;
        };
        let t0 = Instant::now();
        match store.fold_journal() {
            Ok(rep) => {
                self.journal_folded(when, t0.elapsed(), &rep);
                self.retention();
                true
            }
            Err(e) => {
                self.note(Note::Failed {
                    code: e.code(),
                    detail: format!("folding the journal: {e}"),
                });
                false
            }
        }
    }

    /// A fold published the journal's records: the newest is indexed (a
    /// journaled snapshot is not, until then), and the fold is reported.
    fn journal_folded(&mut self, when: FoldWhen, took: Duration, rep: &FoldReport) {
        if let Some(id) = rep.published.last() {
            self.indexer.committed(id.clone());
        }
        self.note(Note::JournalFolded {
            when,
            took,
            records: rep.records,
            published: rep.published.len(),
        });
    }

    /// A journal file folded on a thread of its own (the other took the
    /// appends meanwhile): a failure is reported; its records stay, and are
    /// folded in the foreground when the other file fills.
    fn reap_background_fold(&mut self) {
        let Some(done) = self.store.as_mut().and_then(|s| s.reap_background_fold()) else {
            return;
        };
        match done.result {
            Ok(rep) => {
                self.journal_folded(FoldWhen::Background, done.took, &rep);
                // under --snapshot-publish-every this is where interval
                // snapshots become ones to count
                if self.cfg.publish_every.is_some() && !rep.published.is_empty() {
                    if self.retention_due() {
                        self.retention();
                    } else {
                        self.retention_put_off += 1;
                    }
                }
            }
            Err(e) => self.note(Note::Failed {
                code: e.code(),
                detail: format!("folding a journal file in the background: {e}"),
            }),
        }
    }

    /// `--snapshot-publish-every`: the journal's records are handed to the
    /// fold thread once the last publication is that old (the engine goes
    /// on journaling meanwhile).  A fold that cannot start now (one runs,
    /// or a failed one left records) is tried at the next turn.
    fn publish_journal_if_due(&mut self) {
        let Some(every) = self.cfg.publish_every else {
            return;
        };
        if self.last_publish.elapsed() < every {
            return;
        }
        let Some(store) = self.store.as_mut() else {
            return;
        };
        match store.fold_in_background() {
            Ok(true) => self.last_publish = Instant::now(),
            Ok(false) => {}
            Err(e) => {
                self.last_publish = Instant::now();
                self.note(Note::Failed {
                    code: e.code(),
                    detail: format!("starting a fold of the journal: {e}"),
                });
            }
        }
    }

    fn open_store(&mut self) -> Result<&mut Store, Failure> {
        if self.store.is_none() {
            // a copy still being made on an elected node is waited for here,
            // at the first snapshot, not before the app's start
            let dir = &self.cfg.dir;
            let same_dir = |s: &Store| match (s.dir().canonicalize(), dir.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            let pre = self.preopened.take().and_then(|p| p.take());
            let mut s = match pre.filter(|s| s.is_indexed() && same_dir(s)) {
                Some(s) => s,
                None => Store::create_or_open(dir)?,
            };
            // a journal left by a process that died: its records first
            s.fold_journal()?;
            let latest = s.latest()?;
            self.epoch = latest.as_ref().map_or(0, |i| i.epoch);
            self.newest = latest.map(|i| i.id);
            self.store = Some(s);
        }
        self.store.as_mut().ok_or(Failure::LayoutChanged)
    }

    /// One snapshot; `app_asked`: the app waits for it (rk_checkpoint), so a
    /// passing failure is retried rather than left for the next request.
    /// False if none was taken because nothing had changed (a probe).
    fn snapshot(&mut self, app_asked: bool) -> bool {
        let waiting = std::mem::take(&mut self.waiting);
        let mut tags: Vec<String> = waiting.iter().flat_map(|(_, t)| t.clone()).collect();
        tags.sort();
        tags.dedup();
        self.next_due = self.cfg.interval.map(|iv| Instant::now() + iv);
        // Journaled: a snapshot the app waits for, or an interval's under
        // --snapshot-publish-every after one that was not large, that nobody
        // names (no checkpoint client, no tag), a delta, without standbys
        // (they get published snapshots).  The rest are published, which
        // folds the journal first.
        let interval_journaled = self.cfg.publish_every.is_some()
            && self
                .last_pages
                .is_some_and(|n| n <= JOURNAL_INTERVAL_MAX_PAGES);
        let journal = (app_asked || interval_journaled)
            && waiting.is_empty()
            && !self.force_full
            && self.cfg.replication.is_none();
        let precopy = !(journal && app_asked);
        // an interval snapshot nobody waits for may find nothing changed
        let probe = !app_asked
            && waiting.is_empty()
            && precopy
            && self.last_took
            && !self.force_full
            && self.carry.is_empty()
            && self.cfg.replication.is_none();
        let r = match self.take(tags, journal, precopy, probe) {
            Ok(cut::Taken::Unchanged { app_epoch }) => {
                self.unchanged_skipped += 1;
                self.publish_durable(app_epoch);
                self.note(Note::Unchanged);
                return false;
            }
            Ok(cut::Taken::Snapshot(mut d)) => {
                d.unchanged_skipped = std::mem::take(&mut self.unchanged_skipped);
                Ok(*d)
            }
            Err(f) => Err(f),
        };
        self.last_took = r.is_ok();
        if let Ok(d) = &r {
            self.last_pages = Some(d.precopy_pages + d.cut_pages);
        }
        if r.is_ok() {
            self.refused = 0;
            self.idle_fold_failed = None;
        }
        match r {
            Ok(done) => {
                self.failing_since = None;
                // a journaled one is indexed once a fold has published it
                let journaled = done.info.journaled;
                if !journaled {
                    self.indexer.committed(done.info.id.clone());
                    // it folded the journal first: all is published
                    self.last_publish = Instant::now();
                }
                let reply = checkpoint_reply(&done);
                // the event first: a client that has its reply finds it logged
                self.note(Note::Snapshot(Box::new(done)));
                for (client, _) in &waiting {
                    self.note(Note::Checkpoint {
                        client: *client,
                        reply: reply.clone(),
                    });
                }
                // not after a journaled one: a gc folds the journal first,
                // which would put a fold on every group commit's reply path
                // (its records are not snapshots to count yet either)
                if !journaled {
                    if self.retention_due() {
                        self.retention();
                    } else {
                        self.retention_put_off += 1;
                    }
                }
            }
            // a checkpoint asked as the app starts waits for its regions too
            Err(f)
                if f.settles_at_start()
                    && self.agent_since.is_some_and(|t| t.elapsed() < HELD_GRACE) =>
            {
                self.waiting = waiting;
                self.next_due = Some(Instant::now() + HELD_RETRY);
            }
            // the app exited or was killed mid-snapshot: its death is the
            // supervisor's to report, not a snapshot failure
            Err(Failure::AgentGone) if waiting.is_empty() => {
                self.agent = None;
                self.sock = None;
            }
            Err(f) => {
                let code = f.code();
                for (client, _) in &waiting {
                    self.note(Note::Checkpoint {
                        client: *client,
                        reply: serde_json::json!({"ok": false, "code": code, "error": f.to_string()}),
                    });
                }
                // a continuous failure is reported when it starts, not every 10 ms
                if !waiting.is_empty() || self.failing_since != Some(code) {
                    self.note(Note::Failed {
                        code,
                        detail: f.to_string(),
                    });
                }
                self.failing_since = Some(code);
                let transient = f.transient();
                if transient && app_asked {
                    let delay = REFUSED_RETRY
                        .saturating_mul(1 << self.refused.min(16))
                        .min(REFUSED_RETRY_MAX);
                    self.refused = self.refused.saturating_add(1);
                    let retry = Instant::now() + delay;
                    self.next_due = Some(self.next_due.map_or(retry, |t| t.min(retry)));
                }
                match f {
                    // the new incarnation's HELLO came while we waited for
                    // the old one's answer: take it now
                    Failure::NewIncarnation(b) => {
                        if let Some(link) = self.agent.take() {
                            let (h, fds) = *b;
                            self.on_hello(h, fds, &link.sock);
                        }
                    }
                    // keep the socket: the agent may answer later, or a new
                    // incarnation's agent say HELLO on it
                    Failure::AgentLost(_) => {
                        if let Some(link) = self.agent.take() {
                            self.sock = Some((link.pid as i32, link.sock));
                        }
                    }
                    Failure::AgentGone => {
                        self.agent = None;
                        self.sock = None;
                    }
                    _ => {}
                }
                if !transient {
                    // the store is broken: no point in trying every interval
                    self.next_due = self
                        .cfg
                        .interval
                        .map(|i| Instant::now() + i.max(Duration::from_secs(1)));
                }
            }
        }
        true
    }

    fn take(
        &mut self,
        tags: Vec<String>,
        journal: bool,
        precopy: bool,
        probe: bool,
    ) -> Result<cut::Taken, Failure> {
        let epoch = {
            self.open_store()?;
            self.epoch + 1
        };
        let mut link = self
            .agent
            .take()
            .ok_or(Failure::AgentLost("no agent".into()))?;
        let carry = std::mem::take(&mut self.carry);
        let mut unpublished = cut::Unpublished::default();
        let baseline = self.usable_baseline();
        let plan = Plan {
            parent: match &baseline {
                Some(b) => Some(b.id.clone()),
                None => self.last.clone(),
            },
            baseline: baseline.as_deref(),
            force_full: self.force_full,
            epoch,
            generation: link.generation as u64,
            app: &self.cfg.app,
            tags,
            precopy_rounds: self.cfg.precopy_rounds,
            freeze_timeout_ms: self.cfg.freeze_timeout.as_millis().min(u32::MAX as u128) as u32,
            staging_bytes: self.cfg.staging_bytes,
            carry: &carry,
            journal,
            precopy,
            redo: self.cfg.redo.as_deref(),
            probe,
        };
        let store = self.store.as_mut().ok_or(Failure::LayoutChanged)?;
        let r = cut::take(
            &mut link,
            &self.held,
            store,
            plan,
            (&mut self.shadow, &mut self.staging),
            &mut unpublished,
        );
        self.agent = Some(link);
        if r.is_err() {
            self.baseline = baseline; // the next attempt compares with it again
        }
        match &r {
            Ok(cut::Taken::Unchanged { .. }) => {}
            Ok(cut::Taken::Snapshot(d)) => {
                self.last = Some(d.info.id.clone());
                self.last_redo = d.info.redo;
                self.epoch = epoch;
                self.force_full = false;
                self.baseline = None;
                // tell the app: rk_durable_epoch(), rk_durable_fd(); with
                // sync replication once the standbys have it too
                match &self.cfg.replication {
                    Some(l) if l.sync => {
                        self.unacked.push_back((d.info.id.clone(), d.app_epoch));
                        l.committed(&d.info.id);
                    }
                    Some(l) if l.max_lag.is_some() => {
                        self.lagging
                            .push_back((d.info.id.clone(), d.app_epoch, Instant::now()));
                        l.committed(&d.info.id);
                        let acked = l.acked_now();
                        self.release_within_lag(acked.as_ref());
                    }
                    Some(l) => {
                        l.committed(&d.info.id);
                        self.publish_durable(d.app_epoch);
                    }
                    None => {
                        self.publish_durable(d.app_epoch);
                        if let (Some(r), Some(m)) = (&self.cfg.redo, d.info.redo) {
                            r.snapshot_durable(m);
                        }
                    }
                }
            }
            Err(_) if unpublished.whole => {
                // pages no later report names were read: the next one reads
                // everything (cut.rs, Unpublished)
                self.force_full = true;
                self.carry = HashMap::new();
            }
            Err(_) => {
                // what was reported and not published must be copied next time
                let mut carry = carry;
                for (k, v) in unpublished.pages {
                    carry.entry(k).or_default().extend(v);
                }
                self.carry = carry;
            }
        }
        r
    }

    /// The baseline, taken, if this snapshot can be a delta of it: a full
    /// one is due (a new incarnation), and the snapshot the memfds came
    /// from is this store's newest.  Otherwise it is dropped, and said.
    fn usable_baseline(&mut self) -> Option<Box<Baseline>> {
        if !self.force_full {
            return None;
        }
        let b = self.baseline.take()?;
        let same_store = match (b.dir.canonicalize(), self.cfg.dir.canonicalize()) {
            (Ok(a), Ok(c)) => a == c,
            _ => false,
        };
        let newest = self.last.as_ref().or(self.newest.as_ref());
        let why = if !same_store {
            Some(BaselineUnused::OtherStore)
        } else if newest != Some(&b.id) {
            Some(BaselineUnused::NotNewest)
        } else {
            None
        };
        match why {
            None => Some(b),
            Some(why) => {
                self.note(Note::BaselineUnused {
                    id: b.id.as_str().to_string(),
                    why,
                });
                None
            }
        }
    }

    /// A retention after a snapshot may run: it has had less than
    /// 1/RETENTION_SHARE_MAX of the engine's time since the last one.
    fn retention_due(&self) -> bool {
        self.last_retention
            .is_none_or(|(ended, took)| ended.elapsed() >= took * (RETENTION_SHARE_MAX - 1))
    }

    fn retention_if_put_off(&mut self) {
        if self.retention_put_off > 0 {
            self.retention();
        }
    }

    fn retention(&mut self) {
        let Some(keep) = self.cfg.keep else { return };
        let Some(store) = self.store.as_mut() else {
            return;
        };
        let policy = Retention {
            keep_last: Some(keep),
            ..Retention::default()
        };
        let t0 = Instant::now();
        let r = store.gc(&policy, &mut |_| {});
        let took = t0.elapsed();
        self.last_retention = Some((Instant::now(), took));
        let put_off = std::mem::take(&mut self.retention_put_off);
        match r {
            Ok(r) => {
                if !r.deleted.is_empty() {
                    self.note(Note::Gc {
                        removed: r.deleted.len(),
                        freed_bytes: r.freed_bytes,
                        took,
                        put_off,
                    })
                }
            }
            Err(e) => self.note(Note::Failed {
                code: e.code(),
                detail: format!("retention: {e}"),
            }),
        }
    }
}

fn checkpoint_reply(d: &Done) -> serde_json::Value {
    serde_json::json!({
        "ok": true,
        "id": d.info.id.as_str(),
        "parent": d.info.parent.as_ref().map(|p| p.as_str().to_string()),
        "epoch": d.info.epoch,
        "full": d.full,
        "base": match d.unchanged_pages {
            Some(_) => "restored",
            None if d.full => "none",
            None => "parent",
        },
        "unchanged_pages": d.unchanged_pages.unwrap_or(0),
        "tracked_from_map": d.from_map_regions,
        "tags": d.info.tags,
        "pages": d.info.pages,
        "stop_us": d.stop_ns / 1000,
        "took_ms": d.took.as_millis() as u64,
        "new_bytes": d.bytes_compressed,
        "journaled": d.info.journaled,
        "durable": true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_rounds_up_to_whole_milliseconds() {
        assert_eq!(poll_ms(Duration::ZERO), 0);
        // less than a millisecond left is a wait, not poll(0)
        assert_eq!(poll_ms(Duration::from_micros(1)), 1);
        assert_eq!(poll_ms(Duration::from_micros(999)), 1);
        assert_eq!(poll_ms(Duration::from_millis(10)), 10);
        assert_eq!(poll_ms(Duration::from_micros(10_001)), 11);
        assert_eq!(poll_ms(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
