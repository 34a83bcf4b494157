//! `rekindle run --cluster ...`: one host of a failover cluster.
//!
//! ```text
//!   standby ──(elected: our term)──> primary ──(fenced)──> standby ...
//!      │                                │
//!      └──SIGTERM: exit 0               └──app stopped (SIGTERM, gave up): resign, exit
//! ```
//!
//! Standby: the receiver follows the primary etcd names and applies its
//! snapshots into `--snapshot-dir`; the agent campaigns when there is no
//! leader and this node is named in the newest term's in-sync set (with a
//! store of that term: insync.rs).  Elected: the receiver is
//! stopped first (nothing more is acknowledged to anyone), then the
//! supervisor starts the app warm from the newest snapshot (`restored`),
//! with the replication sender streaming each committed snapshot to the
//! standbys; with `--replication sync` the app's durable acknowledgements
//! (rk_durable_epoch) wait for the standbys' (link.rs).  Fenced (the agent
//! could not keep the lease, or was deposed): the supervisor kills the app
//! at once and the node stands by again; its store is of its old term, so
//! the next primary resumes it from the newest snapshot both hold with the
//! same term (its own newer ones go), or resynchronises it whole.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::args::{ClusterArgs, Replication};
use super::election::{Agent, AgentConfig, FenceReason, Suspicion, Takeover, Want};
use super::hot_image::HotImage;
use super::link::ReplicationLink;
use super::metrics::{ClusterMetrics, MetricsServer};
use super::receiver::{Receiver, ReceiverNote};
use super::records::{NodeRecord, Role};
use super::sender::{Sender, SenderNote};
use super::sentinel::{SentinelConfig, SentinelServer};
use crate::cli::{Config, ListenAddr, RunArgs};
use crate::event::{EventLog, ev};
use crate::store::preopened::Preopened;
use crate::store::{SnapshotId, Store};

type Events = Arc<Mutex<EventLog>>;

/// This process's node's metrics (one node per process), once started.
static METRICS: OnceLock<Arc<ClusterMetrics>> = OnceLock::new();

fn emit(events: &Events, e: crate::event::Event) {
    if let Some(m) = METRICS.get() {
        m.observe(&e);
    }
    events.lock().unwrap_or_else(|p| p.into_inner()).emit(e);
}

/// What the node publishes in etcd, and its gauges.
fn report(agent: &Agent, r: NodeRecord) {
    if let Some(m) = METRICS.get() {
        m.report(&r);
    }
    agent.report(r);
}

fn seq(id: Option<&str>) -> u64 {
    id.and_then(|s| SnapshotId(s.to_string()).seq())
        .unwrap_or(0)
}

/// Runs the node in the foreground; the exit status of `rekindle run`.
pub fn run(args: RunArgs) -> i32 {
    let ca: ClusterArgs = args.cluster.clone();
    let (Some(endpoints), Some(node), Some(addr), Some(dir)) = (
        ca.cluster.clone(),
        ca.node.clone(),
        ca.cluster_addr.clone(),
        args.snapshot_dir.clone(),
    ) else {
        eprintln!("rekindle: --cluster needs --node, --cluster-addr and --snapshot-dir");
        return 2;
    };
    // the name, as the supervisor will settle it
    let probe = match Config::from_args(args.clone()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rekindle: {e:#}");
            return 2;
        }
    };
    if ca.max_lag.is_some() && ca.replication == Replication::Sync {
        eprintln!(
            "rekindle: --max-lag bounds async replication's loss window; with --replication sync \
             nothing is acknowledged before a standby has it"
        );
        return 2;
    }
    let cluster = ca.cluster_name.clone().unwrap_or(probe.name.clone());
    // Signals are blocked before any thread starts (threads inherit the
    // mask), and read from a signalfd while standing by; the supervisor
    // makes its own while primary.
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ] {
        mask.add(s);
    }
    if let Err(e) = mask.thread_block() {
        eprintln!("rekindle: blocking signals: {e}");
        return 1;
    }
    let sigfd = match SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rekindle: signalfd: {e}");
            return 1;
        }
    };
    let events: Events = match EventLog::open(&probe.name, args.events.as_deref()) {
        Ok(l) => Arc::new(Mutex::new(l)),
        Err(e) => {
            eprintln!("rekindle: cannot open the events file: {e}");
            return 1;
        }
    };
    let serve: Vec<String> = args
        .listen
        .iter()
        .filter_map(|l| match l {
            ListenAddr::Tcp(a) => Some(a.clone()),
            ListenAddr::Unix(_) => None,
        })
        .collect();
    let mut agent = match Agent::start(AgentConfig {
        endpoints: super::args::endpoints(&endpoints),
        cluster: cluster.clone(),
        node: node.clone(),
        lease_ttl: ca.lease_ttl,
        drift_ppm: ca.clock_drift_ppm,
        replication: addr.clone(),
        serve,
        store: dir.clone(),
        sync_drop_after: ca.sync_drop_after,
        etcd_silence: ca.etcd_silence,
    }) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rekindle: {e} ({})", e.code());
            return 1;
        }
    };
    emit(
        &events,
        ev("cluster_start")
            .s("cluster", &cluster)
            .s("node", &node)
            .s("replication", ca.replication.as_str())
            .s("addr", &addr)
            .u("lease_ttl_s", ca.lease_ttl as u64)
            .u("clock_drift_ppm", ca.clock_drift_ppm)
            .u(
                "fence_after_ms",
                super::election::safe_for(ca.lease_ttl, ca.clock_drift_ppm).as_millis() as u64,
            ),
    );
    let _metrics_server = match &ca.cluster_metrics {
        Some(a) => {
            let started = ClusterMetrics::new(&cluster, &node)
                .map_err(|e| format!("{e}"))
                .and_then(|m| {
                    let m = Arc::new(m);
                    let srv = MetricsServer::start(a, m.clone()).map_err(|e| e.to_string())?;
                    let _ = METRICS.set(m);
                    Ok(srv)
                });
            match started {
                Ok(s) => Some(s),
                Err(e) => {
                    eprintln!("rekindle: --cluster-metrics: {e}");
                    agent.shutdown();
                    return 1;
                }
            }
        }
        None => None,
    };
    // the Sentinel endpoint runs whatever the role: it answers from etcd
    let _sentinel = match &ca.sentinel_addr {
        Some(a) => match SentinelServer::start(
            SentinelConfig {
                listen: a.clone(),
                endpoints: super::args::endpoints(&endpoints),
                clusters: vec![cluster.clone()],
            },
            events.clone(),
        ) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("rekindle: {e} ({})", e.code());
                agent.shutdown();
                return 1;
            }
        },
        None => None,
    };
    let sentinel_addr = _sentinel.as_ref().map(|s| s.addr.to_string());
    let early = Early {
        mode: ca.replication,
        heartbeat_timeout: ca.heartbeat_timeout,
    };
    loop {
        let (term, image, store) =
            match stand_by(&node, &dir, &agent, &events, &sigfd, early, &sentinel_addr) {
                Some(t) => t,
                None => {
                    agent.shutdown();
                    emit(&events, ev("cluster_stop").s("node", &node));
                    return 0;
                }
            };
        let code = serve_term(
            &args,
            &node,
            &addr,
            &dir,
            term,
            image,
            store,
            ca.replication,
            &agent,
            &events,
            &sentinel_addr,
        );
        let v = agent.view();
        match v.fenced {
            Some(r) if r != FenceReason::Resigned => {
                emit(
                    &events,
                    ev("fenced")
                        .s("node", &node)
                        .u("epoch", term)
                        .s("code", r.code())
                        .i("supervisor_exit", code as i64),
                );
                agent.rejoin();
            }
            _ => {
                agent.shutdown();
                emit(
                    &events,
                    ev("cluster_stop")
                        .s("node", &node)
                        .u("epoch", term)
                        .i("exit", code as i64),
                );
                return code;
            }
        }
    }
}

/// Failure detection on the replication stream (docs/failover.md).
#[derive(Debug, Clone, Copy)]
struct Early {
    mode: Replication,
    /// 0: off.
    heartbeat_timeout: Duration,
}

fn takeover_event(t: &Takeover) -> crate::event::Event {
    match t {
        Takeover::Watching { primary, epoch } => ev("takeover")
            .s("code", "watching_etcd")
            .s("primary", primary)
            .u("epoch", *epoch),
        Takeover::Declined { code, epoch } => ev("takeover").s("code", *code).u("epoch", *epoch),
        Takeover::Won { from, epoch } => ev("takeover")
            .s("code", "took_over")
            .s("from", from)
            .u("epoch", *epoch),
    }
}

/// Follows the primary until this node is elected: Some(term, the hot
/// image of what it received); None on SIGTERM/SIGINT.
fn stand_by(
    node: &str,
    dir: &std::path::Path,
    agent: &Agent,
    events: &Events,
    sigfd: &SignalFd,
    early: Early,
    sentinel: &Option<String>,
) -> Option<(u64, Option<HotImage>, Option<Store>)> {
    agent.want(Want::Campaign);
    let mut receiver = match Receiver::start(node, dir.to_path_buf()) {
        Ok(r) => r,
        Err(e) => {
            emit(
                events,
                ev("error")
                    .s("what", "cannot follow")
                    .s("code", e.code())
                    .s("error", e.to_string()),
            );
            return None;
        }
    };
    emit(
        events,
        ev("role").s("node", node).s("role", Role::Standby.as_str()),
    );
    let mut shown_leader: Option<(String, u64)> = None;
    let mut shown_ineligible = None;
    // a decision of an earlier stand-by (took_over) is not news
    let mut shown_takeover: Option<Takeover> = agent.view().takeover;
    // the last frame from the primary of a term (kept across reconnects)
    let mut contact: Option<(u64, Instant)> = None;
    let mut suspected: Option<u64> = None;
    agent.suspect(None);
    let term = loop {
        if stop_requested(sigfd) {
            receiver.stop();
            agent.suspect(None);
            return None;
        }
        let v = agent.view();
        if v.takeover != shown_takeover {
            if let Some(t) = &v.takeover {
                emit(events, takeover_event(t));
            }
            shown_takeover = v.takeover.clone();
        }
        if let Some(t) = v.our_term {
            emit(
                events,
                ev("elected")
                    .s("node", node)
                    .u("epoch", t)
                    .s("via", v.elected_via.map_or("no_leader", |e| e.code())),
            );
            break t;
        }
        let p = receiver.progress();
        if let (Some(l), Some(h)) = (&v.leader, p.last_heard)
            && p.epoch == l.epoch
        {
            // while a frame is being handled here, the primary is not silent
            contact = Some((l.epoch, if p.busy { Instant::now() } else { h }));
        }
        suspect_primary(
            node,
            &v,
            contact,
            &mut suspected,
            early,
            agent,
            &receiver,
            events,
        );
        receiver.set_leader(v.leader.clone(), v.epoch);
        let now_leader = v.leader.as_ref().map(|l| (l.node.clone(), l.epoch));
        if now_leader != shown_leader {
            emit(
                events,
                ev("leader")
                    .opt("node", now_leader.as_ref().map(|l| l.0.clone()))
                    .u("epoch", v.epoch),
            );
            shown_leader = now_leader;
        }
        if v.ineligible != shown_ineligible {
            if let Some(i) = &v.ineligible {
                emit(
                    events,
                    ev("ineligible")
                        .s("node", node)
                        .s("code", i.code())
                        .s("why", format!("{i:?}")),
                );
            }
            shown_ineligible = v.ineligible.clone();
        }
        for n in receiver.notes() {
            emit(events, receiver_event(n));
        }
        let lag = seq(p.primary_newest.as_deref()).saturating_sub(seq(p.newest.as_deref()));
        report(
            agent,
            NodeRecord {
                node: node.to_string(),
                role: Role::Standby,
                epoch: p.epoch,
                snapshot: p.newest.clone(),
                lag_snapshots: lag,
                primary_silent_ms: p.last_heard.map(|t| t.elapsed().as_millis() as u64),
                standbys: Vec::new(),
                sentinel: sentinel.clone(),
                updated_unix_ms: 0,
                eligibility: None,
                report_every_ms: None,
            },
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // nothing more is acknowledged to the old primary from here
    agent.suspect(None);
    receiver.stop();
    for n in receiver.notes() {
        emit(events, receiver_event(n));
    }
    Some((term, receiver.take_image(), receiver.take_store()))
}

/// The primary's stream has been silent for --heartbeat-timeout: suspect
/// it.  With sync replication the agent may then take the term early
/// (election.rs: only once etcd shows the primary silent too, and only after
/// our acknowledgements to it stop); with async it may not, because the old
/// primary acknowledges writes without us and could go on doing so until
/// its lease runs out: the standby waits for the lease.
#[allow(clippy::too_many_arguments)]
fn suspect_primary(
    node: &str,
    v: &super::election::View,
    contact: Option<(u64, Instant)>,
    suspected: &mut Option<u64>,
    early: Early,
    agent: &Agent,
    receiver: &Receiver,
    events: &Events,
) {
    if early.heartbeat_timeout.is_zero() {
        return;
    }
    let Some(l) = v.leader.as_ref().filter(|l| l.node != node) else {
        if suspected.take().is_some() {
            agent.suspect(None);
        }
        return;
    };
    // only a primary we have heard from can go silent
    let Some((epoch, heard)) = contact.filter(|c| c.0 == l.epoch) else {
        return;
    };
    let silent = heard.elapsed();
    if silent >= early.heartbeat_timeout && *suspected != Some(epoch) {
        *suspected = Some(epoch);
        let sync = early.mode == Replication::Sync;
        emit(
            events,
            ev("primary_suspect")
                .s("code", "heartbeat_timeout")
                .s("primary", &l.node)
                .u("epoch", epoch)
                .u("silent_ms", silent.as_millis() as u64)
                .s("replication", early.mode.as_str())
                .s("path", if sync { "early_takeover" } else { "lease_only" }),
        );
        if sync {
            agent.suspect(Some(Suspicion {
                epoch,
                fence: receiver.fence_handle(),
            }));
        }
    } else if silent < early.heartbeat_timeout && *suspected == Some(epoch) {
        *suspected = None;
        agent.suspect(None);
        emit(
            events,
            ev("primary_suspect_cleared")
                .s("code", "heartbeats_resumed")
                .s("primary", &l.node)
                .u("epoch", epoch),
        );
    }
}

fn receiver_event(n: ReceiverNote) -> crate::event::Event {
    match n {
        ReceiverNote::Following {
            primary,
            epoch,
            full,
            across_terms,
        } => ev("following")
            .s("primary", primary)
            .u("epoch", epoch)
            .s("sync", sync_code(full, across_terms)),
        ReceiverNote::TailDropped {
            primary,
            epoch,
            base,
            count,
        } => ev("diverged_tail_dropped")
            .s("primary", primary)
            .u("epoch", epoch)
            .s("base", base)
            .u("count", count as u64),
        ReceiverNote::Applied { id, epoch } => ev("replica_applied").s("id", id).u("epoch", epoch),
        ReceiverNote::Lost {
            primary,
            code,
            error,
        } => ev("replica_lost")
            .s("primary", primary)
            .s("code", code)
            .s("error", error),
        ReceiverNote::ImageRebuilt { id, pages, took_ms } => ev("hot_image")
            .s("state", "rebuilt")
            .s("id", id)
            .u("pages", pages)
            .u("took_ms", took_ms),
        ReceiverNote::ImageFailed { id, code, error } => ev("hot_image")
            .s("state", "unusable")
            .s("id", id)
            .s("code", code)
            .s("error", error),
    }
}

fn stop_requested(sigfd: &SignalFd) -> bool {
    let mut stop = false;
    while let Ok(Some(info)) = sigfd.read_signal() {
        let s = info.ssi_signo as i32;
        if s == libc::SIGTERM || s == libc::SIGINT {
            stop = true;
        }
    }
    stop
}

/// Runs the app for one term; the supervisor's exit status.
#[allow(clippy::too_many_arguments)]
fn serve_term(
    args: &RunArgs,
    node: &str,
    addr: &str,
    dir: &std::path::Path,
    term: u64,
    image: Option<HotImage>,
    store: Option<Store>,
    mode: Replication,
    agent: &Agent,
    events: &Events,
    sentinel: &Option<String>,
) -> i32 {
    emit(
        events,
        ev("role")
            .s("node", node)
            .s("role", Role::Primary.as_str())
            .u("epoch", term),
    );
    // where the time between the election and the app's start goes
    let t_role = Instant::now();
    let mut steps: Vec<(&str, f64)> = Vec::new();
    let mut step = |name: &'static str, since: &mut Instant| {
        steps.push((name, since.elapsed().as_secs_f64() * 1e3));
        *since = Instant::now();
    };
    let mut since = t_role;
    let fail = |what: &str, code: &str, err: String| {
        emit(
            events,
            ev("error").s("what", what).s("code", code).s("error", err),
        );
        agent.want(Want::Resign);
        1
    };
    let max_lag = args.cluster.max_lag.filter(|_| mode == Replication::Async);
    let link = match ReplicationLink::new(mode == Replication::Sync, max_lag) {
        Ok(l) => Arc::new(l),
        Err(e) => return fail("replication link", "io", e.to_string()),
    };
    // the store exists before the sender opens it (a first start has none);
    // an existing one is checked without loading its indexes, which at
    // millions of chunks would delay the app's start
    let exists = dir.join(crate::store::format::FORMAT_FILE).exists();
    let opened = if exists {
        Store::open_unindexed(dir)
    } else {
        Store::create_or_open(dir)
    };
    if let Err(e) = opened {
        return fail("cannot open the store", e.code(), e.to_string());
    }
    step("store_open_ms", &mut since);
    let board = agent.insync_board();
    // the snapshot engine and the sender each need the receiver's indexes:
    // one gets a copy made in memory, on a thread of its own while the app
    // starts (tens of ms at 1 M keys, which the first reply need not wait
    // for); each waits for its store when it first needs it, and opens one
    // itself should the copy never come
    let (engine_store, store) = match store {
        Some(s) if s.is_indexed() => {
            let (to_engine, engine_pre) = Preopened::coming();
            let (to_sender, sender_pre) = Preopened::coming();
            let copied = std::thread::Builder::new()
                .name("rk-store-copy".into())
                .spawn(move || {
                    let copy = s.duplicate();
                    let _ = to_engine.send(s);
                    let _ = to_sender.send(copy);
                });
            if let Err(e) = copied {
                return fail("store copy: thread", "io", e.to_string());
            }
            (Some(engine_pre), Some(sender_pre))
        }
        other => (None, other.map(|s| Preopened::Ready(Box::new(s)))),
    };
    step("store_copy_ms", &mut since);
    let mut sender = match Sender::start(
        addr,
        term,
        node,
        dir.to_path_buf(),
        link.clone(),
        board,
        store,
    ) {
        Ok(s) => s,
        Err(e) => return fail("cannot listen for standbys", e.code(), e.to_string()),
    };
    step("sender_ms", &mut since);
    let mut cfg = match Config::from_args(args.clone()) {
        Ok(c) => c,
        Err(e) => return fail("bad arguments", "usage", e.to_string()),
    };
    cfg.replication = Some(link.clone());
    cfg.store = engine_store;
    match image.map(|mut i| i.take(dir)) {
        Some(Ok(r)) => {
            cfg.restore_why =
                "elected: starting from this node's hot image of the newest replicated snapshot";
            cfg.restore = Some(crate::snapshot::restore::Source {
                dir: dir.to_path_buf(),
                spec: r.info.id.as_str().to_string(),
            });
            cfg.restored = Some(r);
        }
        not => {
            let code = match &not {
                Some(Err(u)) => u.code(),
                _ => "hot_image_none",
            };
            match Store::open_unindexed(dir).and_then(|s| s.latest()) {
                Ok(Some(_)) => {
                    emit(
                        events,
                        ev("hot_image")
                            .s("state", "not_used")
                            .s("code", code)
                            .s("why", "starting from the store instead"),
                    );
                    cfg.restore_why =
                        "elected: starting from the newest snapshot replicated to this node";
                    cfg.restore = Some(crate::snapshot::restore::Source {
                        dir: dir.to_path_buf(),
                        spec: String::new(),
                    });
                }
                Ok(None) => {}
                Err(e) => return fail("cannot read the store", e.code(), e.to_string()),
            }
        }
    }
    step("image_ms", &mut since);
    let mut start = ev("primary_start").u("epoch", term);
    for (name, ms) in steps {
        start = start.v(name, (ms * 10.0).round() / 10.0);
    }
    emit(events, start);
    // reports what the sender sees while the supervisor's loop runs
    let done = Arc::new(AtomicBool::new(false));
    let fence = match agent.fence_fd() {
        Ok(f) => f,
        Err(e) => return fail("fence fd", "io", e.to_string()),
    };
    let code = std::thread::scope(|scope| {
        let done2 = done.clone();
        let sender_ref = &sender;
        let link2 = link.clone();
        scope.spawn(move || {
            while !done2.load(Ordering::SeqCst) {
                for n in sender_ref.notes() {
                    emit(events, sender_event(n));
                }
                for c in agent.take_insync_changes() {
                    emit(events, insync_event(&c));
                }
                let newest = link2.newest_committed();
                let standbys = sender_ref.standbys();
                let lag = standbys
                    .iter()
                    .map(|s| {
                        seq(newest.as_ref().map(|n| n.as_str()))
                            .saturating_sub(seq(s.acked.as_ref().map(|a| a.as_str())))
                    })
                    .max()
                    .unwrap_or(0);
                report(
                    agent,
                    NodeRecord {
                        node: node.to_string(),
                        role: Role::Primary,
                        epoch: term,
                        snapshot: newest.map(|n| n.0),
                        lag_snapshots: lag,
                        primary_silent_ms: None,
                        standbys: standbys.iter().map(|s| s.node.clone()).collect(),
                        sentinel: sentinel.clone(),
                        updated_unix_ms: 0,
                        eligibility: None,
                        report_every_ms: None,
                    },
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let code = match crate::supervisor::Supervisor::new(cfg) {
            Ok(mut s) => {
                s.set_fence(fence);
                s.run()
            }
            Err(e) => {
                emit(
                    events,
                    ev("error")
                        .s("what", "cannot start the supervisor")
                        .s("error", format!("{e:#}")),
                );
                agent.want(Want::Resign);
                1
            }
        };
        done.store(true, Ordering::SeqCst);
        code
    });
    sender.stop();
    for n in sender.notes() {
        emit(events, sender_event(n));
    }
    code
}

fn sender_event(n: SenderNote) -> crate::event::Event {
    match n {
        SenderNote::Joined {
            node,
            peer,
            full,
            across_terms,
        } => ev("standby_joined")
            .s("standby", node)
            .s("peer", peer)
            .s("sync", sync_code(full, across_terms)),
        SenderNote::Synced { node, id } => ev("standby_synced").s("standby", node).s("id", id),
        SenderNote::Left {
            node,
            peer,
            code,
            error,
        } => ev("standby_left")
            .s("standby", node)
            .s("peer", peer)
            .s("code", code)
            .s("error", error),
    }
}

/// How a standby follows: `full`, `incremental` (within the term), or
/// `incremental_after_term_change` (from the newest snapshot its line
/// shares with a primary of a newer term).
fn sync_code(full: bool, across_terms: bool) -> &'static str {
    match (full, across_terms) {
        (true, _) => "full",
        (false, false) => "incremental",
        (false, true) => "incremental_after_term_change",
    }
}

fn insync_event(c: &super::election::InSyncChanged) -> crate::event::Event {
    let dropped: Vec<String> = c.change.dropped.iter().map(|d| d.0.clone()).collect();
    let why: Vec<&str> = c.change.dropped.iter().map(|d| d.1.code()).collect();
    ev("insync_changed")
        .u("epoch", c.epoch)
        .opt("standbys", Some(c.change.set.clone()))
        .opt("added", Some(c.change.added.clone()))
        .opt("dropped", Some(dropped))
        .s("code", why.first().copied().unwrap_or("caught_up"))
}
