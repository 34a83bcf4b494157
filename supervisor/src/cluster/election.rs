//! The agent: one thread that speaks to etcd for this node.  A follower
//! reads the leader and the epoch; asked to campaign, and eligible, it
//! takes the next term in one transaction (the leader key must be absent
//! and the epoch unchanged since it was read): `epoch` + 1 and `leader`
//! (attached to a fresh lease) together.  A primary keeps its lease alive
//! and fences itself (the fence eventfd; the supervisor kills the app) when
//!
//! - no keep-alive was confirmed for `ttl * (1 - drift) - FENCE_MARGIN`,
//!   counted from when the last confirmed request was *sent* (etcd renews
//!   the lease for `ttl` from when it receives it, which is later), on this
//!   host's monotonic clock: so etcd cannot expire the lease, and no other
//!   node be elected, before the app is killed, whatever the clocks' offsets,
//!   as long as their rates differ by less than `drift`;
//! - etcd says the lease has expired, or the leader key is no longer ours.
//!
//! Every etcd call is bounded by a timeout shorter than what remains of the
//! lease, so a hung etcd cannot delay the fence.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::ClusterError;
use super::etcd::{Cond, Etcd, Op};
use super::insync::{self, InSyncBoard, Verdict};
use super::lineage;
use super::receiver::ReceiverFence;
use super::records::{
    self, Eligibility, InSyncRecord, LeaderRecord, NodeRecord, Role, SwitchoverRecord,
};

/// Time the supervisor needs, once fenced, to have killed the app: its poll
/// loop wakes on the fence fd at once; this covers scheduling.
pub const FENCE_MARGIN: Duration = Duration::from_millis(200);
/// The agent's tick, at most: a primary's report comes every
/// `primary_report_every` (a quarter of `--etcd-silence`), which is shorter
/// when the silence asked for is under 200 ms.
const TICK: Duration = Duration::from_millis(50);
/// The tick while the node suspects the primary: the early takeover's
/// watch of etcd is this fine.
const SUSPECT_TICK: Duration = Duration::from_millis(10);
const CALL_TIMEOUT: Duration = Duration::from_millis(400);
/// A standby's report; a primary rewrites its own every
/// `primary_report_every`, which is what the early takeover watches.
const REPORT_EVERY: Duration = Duration::from_millis(250);
/// Early takeover: how long etcd must show the suspected primary's own
/// report unchanged, on top of the silent replication stream, by default
/// (`--etcd-silence`): four of its reports missed.
pub const ETCD_SILENT_FOR: Duration = Duration::from_millis(200);
/// How many of a primary's reports etcd must have missed before a standby
/// believes it silent there, whatever `--etcd-silence` says.
pub const REPORTS_MISSED: u32 = 4;
/// The report interval of a primary whose report does not say (a node of
/// an older version, which wrote every 50 ms).
const REPORT_EVERY_UNSAID: Duration = Duration::from_millis(50);

/// How often a primary rewrites its report in etcd: a quarter of the
/// silence it asks its standbys to wait for, never less often than TICK.
pub fn primary_report_every(etcd_silence: Duration) -> Duration {
    (etcd_silence / REPORTS_MISSED).min(TICK)
}

/// How long a standby configured with `etcd_silence` must see the
/// primary's report unchanged: its own setting, but never fewer than
/// REPORTS_MISSED of the intervals that primary says it writes at (so a
/// standby set shorter than its primary cannot take a live one's term).
pub fn required_silence(etcd_silence: Duration, primary_every: Option<Duration>) -> Duration {
    etcd_silence.max(primary_every.unwrap_or(REPORT_EVERY_UNSAID) * REPORTS_MISSED)
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub endpoints: Vec<String>,
    pub cluster: String,
    pub node: String,
    pub lease_ttl: i64,
    pub drift_ppm: u64,
    pub replication: String,
    pub serve: Vec<String>,
    pub store: PathBuf,
    /// A member of the in-sync set gone or behind this long is written out
    /// of it (insync.rs).
    pub sync_drop_after: Duration,
    /// Early takeover: how long etcd must show the primary's report
    /// unchanged (`--etcd-silence`); a primary reports every quarter of it.
    pub etcd_silence: Duration,
}

/// What the node asks of the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Follow; take the next term when there is no leader and we may.
    Campaign,
    /// Follow only (after a fence, until the node is ready again).
    Follow,
    /// Give up the term (planned stop): delete our leader key, revoke.
    Resign,
}

/// Why a primary stopped serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceReason {
    /// No keep-alive confirmed in time (etcd unreachable or slow).
    LeaseUnconfirmed,
    /// etcd answered that the lease is gone.
    LeaseExpired,
    /// The leader key names another node or term.
    Deposed,
    /// We resigned.
    Resigned,
    /// `rekindle failover`: handed over to a standby.
    HandedOver,
}

impl FenceReason {
    pub fn code(self) -> &'static str {
        match self {
            FenceReason::LeaseUnconfirmed => "lease_unconfirmed",
            FenceReason::LeaseExpired => "lease_expired",
            FenceReason::Deposed => "deposed",
            FenceReason::Resigned => "resigned",
            FenceReason::HandedOver => "handed_over",
        }
    }
}

/// Why a follower does not campaign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ineligible {
    /// Its store is of another term than the newest: it may lack
    /// acknowledged writes.
    StaleStore { store_epoch: u64, newest: u64 },
    /// The lineage file cannot be read.
    Unreadable(String),
    /// etcd holds no in-sync set, though terms exist.
    NoInSyncRecord { newest: u64 },
    /// The in-sync set is of another term.
    InSyncOfOtherTerm { insync_epoch: u64, newest: u64 },
    /// The primary of the newest term did not (or no longer) wait for
    /// this node's acknowledgements: it may lack acknowledged writes.
    NotInSync { newest: u64 },
}

impl Ineligible {
    pub fn code(&self) -> &'static str {
        match self {
            Ineligible::StaleStore { .. } => "store_of_other_term",
            Ineligible::Unreadable(_) => "lineage_unreadable",
            Ineligible::NoInSyncRecord { .. } => "no_insync_record",
            Ineligible::InSyncOfOtherTerm { .. } => "insync_of_other_term",
            Ineligible::NotInSync { .. } => "not_in_sync",
        }
    }
}

/// How a node came to hold its term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElectedVia {
    /// The leader key was gone (the old lease expired or was given up), or
    /// there was no term yet.
    NoLeader,
    /// Early takeover: the primary's stream and its etcd report were
    /// silent; the leader key was replaced in one transaction.
    HeartbeatTimeout,
}

impl ElectedVia {
    pub fn code(self) -> &'static str {
        match self {
            ElectedVia::NoLeader => "no_leader",
            ElectedVia::HeartbeatTimeout => "heartbeat_timeout",
        }
    }
}

/// The node suspects the primary of `epoch` (its stream went silent) and
/// asks for an early takeover; `fence` stops our acknowledgements to it.
#[derive(Debug, Clone)]
pub struct Suspicion {
    pub epoch: u64,
    pub fence: ReceiverFence,
}

/// An early takeover's guards: the leader key's exact value, the old
/// primary's report key and the revision watched, and who it was.
struct Over {
    leader: Vec<u8>,
    report_key: String,
    report_rev: i64,
    from: String,
}

/// A change of the in-sync set that etcd confirmed (event `insync_changed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InSyncChanged {
    pub epoch: u64,
    pub change: insync::Change,
}

/// Where an early takeover stands (events: `takeover`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Takeover {
    /// Waiting for etcd to show the primary silent for `--etcd-silence`.
    Watching { primary: String, epoch: u64 },
    /// Not now, with the reason.
    Declined { code: &'static str, epoch: u64 },
    /// Stopped acknowledging the old term, and took the next one.
    Won { from: String, epoch: u64 },
}

/// The agent's view, for the node.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub connected: bool,
    /// The newest term etcd holds (`epoch`).
    pub epoch: u64,
    pub leader: Option<LeaderRecord>,
    /// Our term while we are primary.
    pub our_term: Option<u64>,
    pub fenced: Option<FenceReason>,
    pub ineligible: Option<Ineligible>,
    /// `ineligible` has been worked out at least once (else the report
    /// says nothing of eligibility).
    pub eligibility_known: bool,
    pub last_error: Option<(&'static str, String)>,
    /// A primary: how long its lease is still known valid, in ms.
    pub lease_left_ms: Option<u64>,
    /// How the current term was won.
    pub elected_via: Option<ElectedVia>,
    /// The early takeover's latest decision.
    pub takeover: Option<Takeover>,
    /// A primary: the in-sync set changes etcd confirmed, oldest first
    /// (the node drains them into events).
    pub insync_changes: Vec<InSyncChanged>,
}

struct Shared {
    view: Mutex<View>,
    want: Mutex<Want>,
    report: Mutex<Option<NodeRecord>>,
    suspect: Mutex<Option<Suspicion>>,
    stop: AtomicBool,
    fence_efd: std::os::fd::OwnedFd,
    board: Arc<InSyncBoard>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct Agent {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Agent {
    pub fn start(cfg: AgentConfig) -> Result<Agent, ClusterError> {
        // SAFETY: eventfd returns a fresh fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(ClusterError::io("eventfd", std::io::Error::last_os_error()));
        }
        let shared = Arc::new(Shared {
            view: Mutex::new(View::default()),
            want: Mutex::new(Want::Campaign),
            report: Mutex::new(None),
            suspect: Mutex::new(None),
            stop: AtomicBool::new(false),
            // SAFETY: fresh and ours.
            fence_efd: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) },
            board: Arc::new(InSyncBoard::default()),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rk-cluster".into())
            .spawn(move || Worker::new(cfg, sh).run())
            .map_err(|e| ClusterError::io("cluster: thread", e))?;
        Ok(Agent {
            shared,
            thread: Some(thread),
        })
    }

    pub fn view(&self) -> View {
        lock(&self.shared.view).clone()
    }

    /// The in-sync board a term's sender reports to (insync.rs).
    pub fn insync_board(&self) -> Arc<InSyncBoard> {
        self.shared.board.clone()
    }

    /// The in-sync set changes since the last call.
    pub fn take_insync_changes(&self) -> Vec<InSyncChanged> {
        std::mem::take(&mut lock(&self.shared.view).insync_changes)
    }

    pub fn want(&self, w: Want) {
        *lock(&self.shared.want) = w;
    }

    /// The node suspects the primary (its stream is silent): Some asks for
    /// an early takeover (sync replication only: node.rs), None withdraws.
    pub fn suspect(&self, s: Option<Suspicion>) {
        *lock(&self.shared.suspect) = s;
    }

    /// After a fence, once the app is gone: follow again (and campaign).
    pub fn rejoin(&self) {
        lock(&self.shared.view).fenced = None;
        let mut v = 0u64;
        // SAFETY: an 8-byte read from an eventfd (drains it).
        unsafe {
            libc::read(
                std::os::fd::AsRawFd::as_raw_fd(&self.shared.fence_efd),
                (&mut v as *mut u64).cast(),
                8,
            )
        };
        self.want(Want::Campaign);
    }

    /// A dup of the fence fd: readable once this node must stop serving.
    pub fn fence_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.shared.fence_efd.try_clone()
    }

    /// What to publish under nodes/<id> (the agent adds the time).
    pub fn report(&self, r: NodeRecord) {
        *lock(&self.shared.report) = Some(r);
    }

    /// Resigns if primary (bounded), then stops the thread.
    pub fn shutdown(&mut self) {
        self.want(Want::Resign);
        let t0 = Instant::now();
        while self.view().our_term.is_some() && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Term {
    epoch: u64,
    lease: i64,
    record: Vec<u8>,
    /// Until when (this host's monotonic clock) we may serve.
    valid_until: Instant,
    /// What the lease is known good for after a confirmed request.
    good_for: Duration,
}

struct Worker {
    cfg: AgentConfig,
    sh: Arc<Shared>,
    etcd: Option<Etcd>,
    term: Option<Term>,
    last_report: Option<Instant>,
    /// The leader's own report as last read: (node, epoch, mod_revision,
    /// when this revision was first seen), on this host's clock.
    watched: Option<(String, u64, i64, Instant)>,
    /// A primary: the in-sync key's mod_revision as we last wrote or read
    /// it (None: read it again).
    insync_rev: Option<i64>,
}

impl Worker {
    fn new(cfg: AgentConfig, sh: Arc<Shared>) -> Worker {
        Worker {
            cfg,
            sh,
            etcd: None,
            term: None,
            last_report: None,
            watched: None,
            insync_rev: None,
        }
    }

    fn run(mut self) {
        while !self.sh.stop.load(Ordering::SeqCst) {
            let t0 = Instant::now();
            if let Err(e) = self.tick() {
                let mut v = lock(&self.sh.view);
                v.last_error = Some((e.code(), e.to_string()));
                if matches!(e, ClusterError::Etcd { .. }) {
                    v.connected = false;
                }
            }
            self.check_deadline();
            let tick = if lock(&self.sh.suspect).is_some() {
                SUSPECT_TICK
            } else {
                // a standby sees each of the primary's reports within one
                // of their intervals, a primary writes one each
                primary_report_every(self.cfg.etcd_silence)
            };
            let spent = t0.elapsed();
            if spent < tick {
                std::thread::sleep(tick - spent);
            }
        }
        // a stop while primary without resigning (the node died of an
        // error): the lease expires by itself; revoking shortens that
        if let (Some(t), Some(e)) = (self.term.take(), self.etcd.as_mut()) {
            let _ = e.revoke(t.lease, CALL_TIMEOUT);
        }
    }

    fn etcd(&mut self) -> Result<&mut Etcd, ClusterError> {
        if self.etcd.is_none() {
            self.etcd = Some(Etcd::connect(&self.cfg.endpoints, CALL_TIMEOUT)?);
        }
        self.etcd.as_mut().ok_or(ClusterError::EtcdTimeout {
            what: "connect",
            ms: CALL_TIMEOUT.as_millis() as u64,
        })
    }

    /// A call's timeout: never past the moment we must fence.
    fn bound(&self) -> Duration {
        match &self.term {
            Some(t) => t
                .valid_until
                .saturating_duration_since(Instant::now())
                .min(CALL_TIMEOUT)
                .max(Duration::from_millis(1)),
            None => CALL_TIMEOUT,
        }
    }

    fn tick(&mut self) -> Result<(), ClusterError> {
        let want = *lock(&self.sh.want);
        if self.term.is_some() {
            if want == Want::Resign {
                return self.resign();
            }
            self.keep_term()?;
            self.keep_insync()?;
        } else {
            self.follow(want)?;
        }
        self.publish_report()
    }

    fn check_deadline(&mut self) {
        if let Some(t) = &self.term
            && Instant::now() >= t.valid_until
        {
            self.fence(FenceReason::LeaseUnconfirmed);
        }
    }

    fn fence(&mut self, why: FenceReason) {
        let Some(t) = self.term.take() else { return };
        self.last_report = None;
        {
            let mut v = lock(&self.sh.view);
            v.our_term = None;
            v.fenced = Some(why);
            v.lease_left_ms = None;
        }
        *lock(&self.sh.want) = Want::Follow;
        let one: u64 = 1;
        // SAFETY: an 8-byte write to an eventfd.
        unsafe {
            libc::write(
                std::os::fd::AsRawFd::as_raw_fd(&self.sh.fence_efd),
                (&one as *const u64).cast(),
                8,
            )
        };
        // others need not wait for the lease to run out
        if let Some(e) = self.etcd.as_mut() {
            let _ = e.revoke(t.lease, CALL_TIMEOUT);
        }
    }

    fn resign(&mut self) -> Result<(), ClusterError> {
        let Some(t) = self.term.as_ref() else {
            return Ok(());
        };
        let (record, lease) = (t.record.clone(), t.lease);
        let key = records::leader_key(&self.cfg.cluster);
        let b = self.bound();
        let e = self.etcd()?;
        // delete the leader key only if it is still ours
        let _ = e.txn(
            vec![Cond::Value(key.clone(), record)],
            vec![Op::Delete(key)],
            b,
        );
        let _ = e.revoke(lease, b);
        self.fence(FenceReason::Resigned);
        Ok(())
    }

    fn keep_term(&mut self) -> Result<(), ClusterError> {
        let sent = Instant::now();
        let (lease, epoch, record) = match &self.term {
            Some(t) => (t.lease, t.epoch, t.record.clone()),
            None => return Ok(()),
        };
        let b = self.bound();
        let ttl = self.etcd()?.keep_alive(lease, b)?;
        if ttl <= 0 {
            self.fence(FenceReason::LeaseExpired);
            return Ok(());
        }
        if let Some(t) = self.term.as_mut() {
            t.valid_until = t.valid_until.max(sent + t.good_for);
        }
        let key = records::leader_key(&self.cfg.cluster);
        let b = self.bound();
        let cur = self.etcd()?.get(&key, b)?;
        if cur.as_ref().map(|kv| kv.value.as_slice()) != Some(record.as_slice()) {
            self.fence(FenceReason::Deposed);
            return Ok(());
        }
        // `rekindle failover`: hand this term over
        let skey = records::switchover_key(&self.cfg.cluster);
        let b = self.bound();
        if let Some(kv) = self.etcd()?.get(&skey, b)? {
            let req: SwitchoverRecord = records::parse(&skey, &kv.value)?;
            if req.epoch == epoch && req.from == self.cfg.node {
                self.fence(FenceReason::HandedOver);
                return Ok(());
            }
        }
        let mut v = lock(&self.sh.view);
        v.connected = true;
        v.epoch = v.epoch.max(epoch);
        v.last_error = None;
        v.lease_left_ms = self.term.as_ref().map(|t| {
            t.valid_until
                .saturating_duration_since(Instant::now())
                .as_millis() as u64
        });
        Ok(())
    }

    fn follow(&mut self, want: Want) -> Result<(), ClusterError> {
        let lkey = records::leader_key(&self.cfg.cluster);
        let ekey = records::epoch_key(&self.cfg.cluster);
        // at one revision: a new term writes both in one transaction, and
        // two reads could see its leader with the old epoch or the reverse
        let mut both = self.etcd()?.get_at_once(&[&lkey, &ekey], CALL_TIMEOUT)?;
        let epoch_kv = both.pop().flatten();
        let leader_kv = both.pop().flatten();
        let (epoch, epoch_rev) = match &epoch_kv {
            Some(kv) => (records::parse_epoch(&ekey, &kv.value)?, kv.mod_revision),
            None => (0, 0),
        };
        let leader = match &leader_kv {
            Some(kv) => Some(records::parse::<LeaderRecord>(&lkey, &kv.value)?),
            None => None,
        };
        {
            let mut v = lock(&self.sh.view);
            v.connected = true;
            v.epoch = epoch;
            v.leader = leader.clone();
            v.last_error = None;
        }
        if let (Some(l), Some(kv)) = (&leader, &leader_kv)
            && l.node != self.cfg.node
        {
            let raw = kv.value.clone();
            return self.watch_leader(l, raw, epoch, epoch_rev, want);
        }
        self.watched = None;
        if want != Want::Campaign {
            return Ok(());
        }
        // a handover of the newest term under way: only its target (any
        // node but the one handing over, without --to) may take the next
        let skey = records::switchover_key(&self.cfg.cluster);
        if let Some(kv) = self.etcd()?.get(&skey, CALL_TIMEOUT)? {
            let req: SwitchoverRecord = records::parse(&skey, &kv.value)?;
            let me = &self.cfg.node;
            if req.epoch == epoch && (&req.from == me || req.to.as_ref().is_some_and(|t| t != me)) {
                return Ok(());
            }
        }
        let Some(insync_rev) = self.eligible(epoch)? else {
            return Ok(());
        };
        self.campaign(epoch, epoch_rev, insync_rev, None)
            .map(|_| ())
    }

    /// Records whether this node may take the next term after `epoch`:
    /// no term yet, or named in the in-sync set of `epoch` (or its primary)
    /// with a store of that term.  Some(the in-sync key's mod_revision, 0: absent), which
    /// the campaign guards on, if it may.
    fn eligible(&mut self, epoch: u64) -> Result<Option<i64>, ClusterError> {
        let ikey = records::insync_key(&self.cfg.cluster);
        let kv = self.etcd()?.get(&ikey, CALL_TIMEOUT)?;
        let rec = match &kv {
            Some(kv) => Some(records::parse::<InSyncRecord>(&ikey, &kv.value)?),
            None => None,
        };
        let ineligible = match lineage::read(&self.cfg.store) {
            Err(e) => Some(Ineligible::Unreadable(e.to_string())),
            Ok(l) => match insync::verdict(epoch, rec.as_ref(), &self.cfg.node, &l) {
                Verdict::Eligible => None,
                Verdict::NoInSyncRecord => Some(Ineligible::NoInSyncRecord { newest: epoch }),
                Verdict::InSyncOfOtherTerm { insync_epoch } => {
                    Some(Ineligible::InSyncOfOtherTerm {
                        insync_epoch,
                        newest: epoch,
                    })
                }
                Verdict::NotInSync => Some(Ineligible::NotInSync { newest: epoch }),
                Verdict::StoreOfOtherTerm { store_epoch } => Some(Ineligible::StaleStore {
                    store_epoch,
                    newest: epoch,
                }),
            },
        };
        let ok = ineligible.is_none();
        {
            let mut v = lock(&self.sh.view);
            v.ineligible = ineligible;
            v.eligibility_known = true;
        }
        Ok(ok.then(|| kv.map_or(0, |kv| kv.mod_revision)))
    }

    fn set_takeover(&self, t: Takeover) {
        lock(&self.sh.view).takeover = Some(t);
    }

    /// Another node holds the term: tracks its own report in etcd and, when
    /// the node suspects it (sync replication, silent stream) and etcd has
    /// shown the report unchanged for `required_silence`, takes the next term
    /// at once: our acknowledgements to it stop first, then one transaction
    /// replaces the leader key, guarded by its exact value, by the report's
    /// revision (the primary has written nothing since) and by the epoch's.
    fn watch_leader(
        &mut self,
        l: &LeaderRecord,
        raw: Vec<u8>,
        epoch: u64,
        epoch_rev: i64,
        want: Want,
    ) -> Result<(), ClusterError> {
        let nkey = records::node_key(&self.cfg.cluster, &l.node);
        let report = self.etcd()?.get(&nkey, CALL_TIMEOUT)?;
        let rev = report.as_ref().map_or(0, |kv| kv.mod_revision);
        // a report we cannot read says no interval: the older, longer one
        let primary_every = report
            .as_ref()
            .and_then(|kv| records::parse::<NodeRecord>(&nkey, &kv.value).ok())
            .and_then(|r| r.report_every_ms)
            .map(Duration::from_millis);
        let silence = required_silence(self.cfg.etcd_silence, primary_every);
        // eligibility (and the in-sync key's revision) for the report,
        // and for a takeover below
        let eligible = self.eligible(epoch)?;
        let now = Instant::now();
        let prev = self.watched.take();
        let changed = prev
            .as_ref()
            .is_some_and(|(n, e, r, _)| *n == l.node && *e == l.epoch && *r != rev);
        let since = match prev {
            Some((n, e, r, t)) if n == l.node && e == l.epoch && r == rev => t,
            _ => now,
        };
        self.watched = Some((l.node.clone(), l.epoch, rev, since));
        let suspicion = lock(&self.sh.suspect).clone();
        let Some(sus) = suspicion.filter(|s| s.epoch == l.epoch && want == Want::Campaign) else {
            lock(&self.sh.view).takeover = None;
            return Ok(());
        };
        if l.epoch != epoch {
            // cannot happen (one transaction writes both); never guess
            self.set_takeover(Takeover::Declined {
                code: "epoch_mismatch",
                epoch: l.epoch,
            });
            return Ok(());
        }
        if now.duration_since(since) < silence {
            let mut v = lock(&self.sh.view);
            if changed {
                // it wrote to etcd since: alive; only our link to it is down
                v.takeover = Some(Takeover::Declined {
                    code: "primary_alive_in_etcd",
                    epoch,
                });
            } else if v.takeover.is_none() {
                v.takeover = Some(Takeover::Watching {
                    primary: l.node.clone(),
                    epoch,
                });
            }
            return Ok(());
        }
        let skey = records::switchover_key(&self.cfg.cluster);
        if self.etcd()?.get(&skey, CALL_TIMEOUT)?.is_some() {
            self.set_takeover(Takeover::Declined {
                code: "switchover_pending",
                epoch,
            });
            return Ok(());
        }
        // Named in the in-sync set: the primary releases no write without
        // our acknowledgement unless it first writes us out of the set, which
        // changes the key's revision our transaction guards on.
        let Some(insync_rev) = eligible else {
            let code = match lock(&self.sh.view).ineligible {
                Some(Ineligible::NotInSync { .. }) => "not_in_sync",
                _ => "ineligible",
            };
            self.set_takeover(Takeover::Declined { code, epoch });
            return Ok(());
        };
        // From here the old primary gets no acknowledgement from us: in
        // sync mode it can acknowledge no more writes.
        sus.fence.refuse(epoch);
        let over = Over {
            leader: raw,
            report_key: nkey,
            report_rev: rev,
            from: l.node.clone(),
        };
        let won = self.campaign(epoch, epoch_rev, insync_rev, Some(over));
        if !matches!(won, Ok(true)) {
            sus.fence.allow();
            self.watched = None;
            self.set_takeover(Takeover::Declined {
                code: if won.is_ok() { "raced" } else { "etcd_error" },
                epoch,
            });
        }
        won.map(|_| ())
    }

    /// Takes term `epoch` + 1: Ok(true) if won.  `insync_rev`: the in-sync
    /// key's revision when this node found itself in it (the set must not
    /// have changed since).  `over`: the leader key's exact value, the old
    /// primary's report key and its revision, for an early takeover; None:
    /// the leader key must be absent.  The new term's in-sync set is empty.
    fn campaign(
        &mut self,
        epoch: u64,
        epoch_rev: i64,
        insync_rev: i64,
        over: Option<Over>,
    ) -> Result<bool, ClusterError> {
        let lkey = records::leader_key(&self.cfg.cluster);
        let ekey = records::epoch_key(&self.cfg.cluster);
        let next = epoch + 1;
        let rec = LeaderRecord {
            node: self.cfg.node.clone(),
            epoch: next,
            replication: self.cfg.replication.clone(),
            serve: self.cfg.serve.clone(),
        };
        let record = serde_json::to_vec(&rec).unwrap_or_default();
        let (ttl, drift, store) = (
            self.cfg.lease_ttl,
            self.cfg.drift_ppm,
            self.cfg.store.clone(),
        );
        let skey = records::switchover_key(&self.cfg.cluster);
        let (via, took) = match &over {
            Some(o) => (
                ElectedVia::HeartbeatTimeout,
                Some(Takeover::Won {
                    from: o.from.clone(),
                    epoch: next,
                }),
            ),
            None => (ElectedVia::NoLeader, None),
        };
        let ikey = records::insync_key(&self.cfg.cluster);
        let empty = InSyncRecord {
            epoch: next,
            standbys: Vec::new(),
            primary: Some(self.cfg.node.clone()),
        };
        let mut conds = vec![
            Cond::ModRevision(ekey.clone(), epoch_rev),
            Cond::ModRevision(ikey.clone(), insync_rev),
        ];
        match over {
            Some(o) => {
                conds.push(Cond::Value(lkey.clone(), o.leader));
                conds.push(Cond::ModRevision(o.report_key, o.report_rev));
            }
            None => conds.push(Cond::Absent(lkey.clone())),
        }
        let sent = Instant::now();
        let e = self.etcd()?;
        let (lease, granted) = e.grant(ttl, CALL_TIMEOUT)?;
        let won = e.txn_rev(
            conds,
            vec![
                Op::Put {
                    key: ikey,
                    value: serde_json::to_vec(&empty).unwrap_or_default(),
                    lease: None,
                },
                Op::Put {
                    key: ekey,
                    value: next.to_string().into_bytes(),
                    lease: None,
                },
                Op::Put {
                    key: lkey,
                    value: record.clone(),
                    lease: Some(lease),
                },
                // a handover request is answered by the new term
                Op::Delete(skey),
            ],
            CALL_TIMEOUT,
        );
        let won = match won {
            Ok(w) => w,
            Err(err) => {
                let _ = e.revoke(lease, CALL_TIMEOUT);
                return Err(err);
            }
        };
        let Some(insync_at) = won else {
            let _ = e.revoke(lease, CALL_TIMEOUT);
            return Ok(false);
        };
        let good_for = safe_for(granted, drift);
        // The store now belongs to this term: its next snapshots are ours.
        if let Err(err) = lineage::begin_term(&store, next) {
            // cannot record it: do not serve (a later election would trust
            // a store of the wrong term)
            let _ = e.revoke(lease, CALL_TIMEOUT);
            return Err(err);
        }
        self.term = Some(Term {
            epoch: next,
            lease,
            record,
            valid_until: sent + good_for,
            good_for,
        });
        self.last_report = None; // tell the new role at once
        self.insync_rev = Some(insync_at);
        let mut v = lock(&self.sh.view);
        v.our_term = Some(next);
        v.epoch = next;
        v.leader = Some(rec);
        v.fenced = None;
        v.ineligible = None;
        v.elected_via = Some(via);
        // with our_term, so that the node sees both at once
        v.takeover = took;
        Ok(true)
    }

    /// A primary: writes the in-sync set's next state (insync::decide) to
    /// etcd, in a transaction that holds only while `leader` is still our
    /// record, `epoch` our term and the set what we last wrote or read; the
    /// board counts a removal only once etcd confirmed it, and an addition
    /// from before the write.
    fn keep_insync(&mut self) -> Result<(), ClusterError> {
        let Some((epoch, record)) = self.term.as_ref().map(|t| (t.epoch, t.record.clone())) else {
            return Ok(());
        };
        let board = self.sh.board.clone();
        if board.term() != epoch {
            return Ok(()); // the sender is not running yet
        }
        let ikey = records::insync_key(&self.cfg.cluster);
        let rev = match self.insync_rev {
            Some(r) => r,
            None => {
                let b = self.bound();
                let Some(kv) = self.etcd()?.get(&ikey, b)? else {
                    return Ok(()); // gone: only a newer term's campaign rewrites it
                };
                let rec: InSyncRecord = records::parse(&ikey, &kv.value)?;
                if rec.epoch != epoch {
                    return Ok(()); // a newer term's: we are being deposed
                }
                board.seen(epoch, &rec.standbys);
                self.insync_rev = Some(kv.mod_revision);
                kv.mod_revision
            }
        };
        let Some(facts) = board.facts() else {
            return Ok(());
        };
        let change = insync::decide(&facts, Instant::now(), self.cfg.sync_drop_after);
        if change.is_none() && !board.unsettled() {
            return Ok(());
        }
        let set = change
            .as_ref()
            .map_or_else(|| facts.confirmed.clone(), |c| c.set.clone());
        board.begin(&set);
        let value = serde_json::to_vec(&InSyncRecord {
            epoch,
            standbys: set.clone(),
            primary: Some(self.cfg.node.clone()),
        })
        .unwrap_or_default();
        let lkey = records::leader_key(&self.cfg.cluster);
        let ekey = records::epoch_key(&self.cfg.cluster);
        let b = self.bound();
        let r = self.etcd()?.txn_rev(
            vec![
                Cond::Value(lkey, record),
                Cond::Value(ekey, epoch.to_string().into_bytes()),
                Cond::ModRevision(ikey.clone(), rev),
            ],
            vec![Op::Put {
                key: ikey,
                value,
                lease: None,
            }],
            b,
        );
        match r {
            Ok(Some(at)) => {
                self.insync_rev = Some(at);
                board.confirm(epoch, &set);
                if let Some(change) = change {
                    lock(&self.sh.view)
                        .insync_changes
                        .push(InSyncChanged { epoch, change });
                }
                Ok(())
            }
            Ok(None) => {
                // the term or the set changed under us: read it again (a
                // lost term fences us at the next keep-alive check)
                self.insync_rev = None;
                Ok(())
            }
            Err(e) => {
                self.insync_rev = None;
                Err(e)
            }
        }
    }

    fn publish_report(&mut self) -> Result<(), ClusterError> {
        let every = if self.term.is_some() {
            // written at every tick of that length: a tick that comes a
            // little early must not skip one
            primary_report_every(self.cfg.etcd_silence) * 3 / 4
        } else {
            REPORT_EVERY
        };
        if self.last_report.is_some_and(|t| t.elapsed() < every) {
            return Ok(());
        }
        let Some(mut r) = lock(&self.sh.report).clone() else {
            return Ok(());
        };
        r.updated_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if let Some(t) = &self.term {
            r.role = Role::Primary;
            r.epoch = t.epoch;
            r.report_every_ms =
                Some(primary_report_every(self.cfg.etcd_silence).as_millis() as u64);
        } else {
            let v = lock(&self.sh.view);
            r.eligibility = v.eligibility_known.then(|| Eligibility {
                eligible: v.ineligible.is_none(),
                reason: v.ineligible.as_ref().map(|i| i.code().to_string()),
            });
        }
        let key = records::node_key(&self.cfg.cluster, &self.cfg.node);
        let b = self.bound();
        self.etcd()?
            .put(&key, serde_json::to_vec(&r).unwrap_or_default(), b)?;
        self.last_report = Some(Instant::now());
        Ok(())
    }
}

/// How long after sending a confirmed keep-alive (or the grant) a primary
/// may serve: the TTL shrunk by the clock-rate bound, less the time the
/// fence takes.
pub fn safe_for(ttl_s: i64, drift_ppm: u64) -> Duration {
    let ttl = Duration::from_secs(ttl_s.max(0) as u64);
    let shrunk = ttl.mul_f64(1.0 - drift_ppm.min(1_000_000) as f64 / 1e6);
    shrunk.saturating_sub(FENCE_MARGIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_safe_window_is_inside_the_lease() {
        assert_eq!(safe_for(2, 10_000), Duration::from_millis(1780));
        assert_eq!(safe_for(1, 0), Duration::from_millis(800));
        assert_eq!(safe_for(0, 0), Duration::ZERO);
        for ttl in 1..10 {
            for ppm in [0, 100, 10_000, 100_000] {
                let s = safe_for(ttl, ppm);
                // measured at a clock up to ppm fast or slow, still shorter
                let worst = s.mul_f64(1.0 + ppm as f64 / 1e6);
                assert!(worst < Duration::from_secs(ttl as u64), "{ttl} {ppm}");
            }
        }
    }

    #[test]
    fn a_primary_reports_four_times_per_silence_and_at_least_every_tick() {
        let ms = Duration::from_millis;
        assert_eq!(primary_report_every(ms(200)), ms(50));
        assert_eq!(primary_report_every(ms(100)), ms(25));
        assert_eq!(primary_report_every(ms(40)), ms(10));
        // a long silence does not make the primary report less often
        assert_eq!(primary_report_every(ms(2000)), TICK);
    }

    #[test]
    fn a_standby_never_waits_fewer_than_four_of_the_primarys_intervals() {
        let ms = Duration::from_millis;
        // both set alike
        assert_eq!(required_silence(ms(100), Some(ms(25))), ms(100));
        // the standby set shorter than its primary: the primary's count
        assert_eq!(required_silence(ms(100), Some(ms(50))), ms(200));
        // the standby set longer: its own
        assert_eq!(required_silence(ms(400), Some(ms(25))), ms(400));
        // a primary that does not say: the old 50 ms interval
        assert_eq!(required_silence(ms(100), None), ms(200));
    }
}
