//! `rekindle run`: the single-threaded poll(2) loop that spawns, watches,
//! decides and restarts one app (docs/supervisor-protocol.md).
//!
//! Sources: a signalfd (SIGCHLD, SIGTERM, SIGINT, SIGHUP), the app's socket
//! pair, the app's sd_notify socket, the control socket and its clients, the
//! metrics listener; the poll timeout drives the periodic checks (hang, RSS,
//! reaping), the backoff, kill deadlines and the systemd watchdog.
//!
//! This file holds the `Supervisor` struct, its setup and the loop; the
//! handlers are in `supervisor/`: `app_messages`, `control_commands`,
//! `checks`, `requests` (restart and stop asked of the app), `respawn`
//! (death, decision, spawn), `failures` and `report` (the one `record()`
//! path to events, metrics, systemd and status).  The app's state and its
//! transitions are the pure `lifecycle` module.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use serde_json::json;

use crate::cli::{Config, ListenAddr};
use crate::clock::now_ns;
use crate::control_block::{ControlBlock, Damage};
use crate::control_socket;
use crate::decide::{self, Facts, Mode};
use crate::event::{EventLog, ev};
use crate::failure::FailureKind;
use crate::lifecycle::{AppState, RestartPath};
use crate::metrics::{self, Metrics};
use crate::notify::{self, AppNotify, Systemd};
use crate::orphan::{self, StartError};
use crate::proto::{FdKind, StartKind};
use crate::reason::Reason;
use crate::spawn::{self, Program};
use crate::{runtime_dir, signame};

mod app_messages;
mod checks;
mod control_commands;
mod failures;
mod lazy_restore;
mod report;
mod requests;
mod respawn;
mod setup;
mod snapshots;

use report::{Record, Report};
use setup::{UnixListenFiles, bind_listen, ensure_stdio};

fn dur_ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// One fd the supervisor holds for the app.
struct Held {
    kind: FdKind,
    name: String,
    fd: OwnedFd,
}

/// How the next incarnation starts.
#[derive(Clone)]
struct Plan {
    mode: StartKind,
    generation: u32,
    signal: i32,
    t_detect_ns: u64,
    reason: String,
    decision: String,
    decision_code: Reason,
    backoff_ms: u64,
    /// With Warm: arenas found half-changed (independent ones), not handed on.
    dropped: u32,
    /// The held fds were made from a durable snapshot (rekindle restore):
    /// `reason` is its id.
    restored: bool,
}

/// A restart under way, waiting for the new incarnation's HELLO.
struct Pending {
    path: RestartPath,
    failure: FailureKind,
    t_failure_ns: Option<u64>,
    t_detect_ns: u64,
    decided: Mode,
}

/// The running process.
struct App {
    pid: libc::pid_t,
    sock: Option<OwnedFd>,
    started_ns: u64,
    generation: u32,
    start_kind: StartKind,
    plan: Plan,
    /// ATTACH is answered once per process.
    attach_answered: bool,
    state: AppState,
    last_watchdog_ns: u64,
    bad_messages: u32,
}

struct Stopping {
    deadline_ns: u64,
    killed: bool,
    by: String,
    code: i32,
}

pub struct Supervisor {
    cfg: Config,
    /// Events, metrics, systemd's STATUS and the status history.
    report: Report,
    ctl: ControlBlock,
    /// The control block's header was found damaged (reported once); a
    /// damaged block is replaced at the next death.
    ctl_damage: Option<Damage>,
    program: Program,
    base_env: Vec<CString>,
    listen: Vec<(String, OwnedFd)>,
    /// `--listen unix:PATH` files we created, removed at exit.
    unix_listen: UnixListenFiles,
    /// The fds held for the app (the last FDS set), manifest first.
    held: Vec<Held>,
    /// Their names in systemd's fd store.
    sd_stored: Vec<String>,
    app: Option<App>,
    next_spawn: Option<(u64, Plan)>,
    pending: Option<Pending>,
    /// Since when READY is awaited (the detection of the last failure).
    ready_wait: Option<u64>,
    generation: u32,
    /// Consecutive failures, towards --max-restarts.
    consecutive: u32,
    stopping: Option<Stopping>,
    exit: Option<i32>,
    /// Some incarnation spoke the protocol: the app runs the runtime.
    ever_linked: bool,
    sigfd: SignalFd,
    control: control_socket::Server,
    app_notify: Option<AppNotify>,
    metrics_server: Option<metrics::Server>,
    sd_watchdog_next_ns: u64,
    next_check_ns: u64,
    started_ns: u64,
    started_wall: String,
    /// The snapshot engine's thread (with --snapshot-dir).
    snapshots: Option<crate::snapshot::engine::Handle>,
    /// `rekindle rollback`: the memfds made from the snapshot, for the next
    /// incarnation once the running one (killed for it) is gone.
    rollback: Option<snapshots::Rollback>,
    /// The app's redo log (redo/mod.rs), with a store and no cluster.
    redo: Option<std::sync::Arc<crate::redo::Redo>>,
    /// For the next spawn: the records a start from a snapshot replays.
    redo_replay: Option<crate::redo::Replay>,
    /// `rekindle restore`: the snapshot the held fds were made from (its
    /// fds already held), until the first spawn.
    restored: Option<snapshots::Rollback>,
    /// `rekindle restore --restore-pages lazy`: the arenas being filled.
    lazy: Option<lazy_restore::Lazy>,
    lazy_snapshot_socket: lazy_restore::HeldBack,
    /// Continuous snapshots since the last `snapshot` event, and its time.
    snapshots_since_event: u64,
    snapshot_event_ns: u64,
    /// `--cluster`: readable once this node must stop serving (its lease or
    /// term is lost): the app is killed at once.
    fence: Option<OwnedFd>,
}

/// The supervisor's exit status after a fence (EX_TEMPFAIL).
pub const FENCED_EXIT: i32 = 75;

fn sig_name(sig: i32) -> String {
    signame::name(sig)
}

fn send_signal(pid: libc::pid_t, sig: i32) -> bool {
    // SAFETY: kill(2) on a pid we spawned and have not reaped.
    unsafe { libc::kill(pid, sig) == 0 }
}

impl Supervisor {
    pub fn new(mut cfg: Config) -> Result<Self> {
        ensure_stdio();
        // A restore reads the store on a thread of its own while the rest
        // of the setup runs (runtime directory, sockets, event log): on a
        // machine just rebooted, both wait on a cold disk.
        let reading = match (&cfg.restore, &cfg.restored) {
            // (a thread that cannot start: the store is read below instead)
            (Some(src), None) => {
                let (src, pages) = (src.clone(), cfg.restore_pages);
                std::thread::Builder::new()
                    .name("rk-restore-read".into())
                    .spawn(move || crate::snapshot::restore::materialize_with(&src, pages))
                    .ok()
            }
            _ => None,
        };
        // SAFETY: prctl with constant arguments.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        let mut mask = SigSet::empty();
        for s in [
            Signal::SIGCHLD,
            Signal::SIGTERM,
            Signal::SIGINT,
            Signal::SIGHUP,
        ] {
            mask.add(s);
        }
        mask.thread_block().context("blocking signals")?;
        let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .context("signalfd")?;

        let systemd = Systemd::from_env();
        let inherited = notify::take_listen_fds();
        let events = EventLog::open(&cfg.name, cfg.events.as_deref()).with_context(|| {
            let shown = cfg.events.as_deref().unwrap_or(std::path::Path::new("-"));
            format!("cannot open the events file {}", shown.display())
        })?;

        let (dir, dir_source) = runtime_dir::dir_with_source();
        runtime_dir::ensure(&dir, dir_source)?;
        let sock_path = runtime_dir::socket_path(&dir, &cfg.name);
        // No supervisor listens there: an app of a killed one may still run.
        if !control_socket::listening(&sock_path)
            && let Err(e) = orphan::check(&cfg.name, &sock_path)
        {
            let StartError::OrphanApp { orphans, .. } = &e;
            let pids: Vec<i64> = orphans.iter().map(|o| o.pid as i64).collect();
            let mut events = events;
            events.emit(
                ev("error")
                    .s("what", "cannot start")
                    .s("code", e.code())
                    .v("pids", pids)
                    .s("error", e.to_string()),
            );
            return Err(e.into());
        }
        let control = control_socket::Server::bind(&sock_path)?;
        let app_notify = match AppNotify::bind(&runtime_dir::notify_path(&dir, &cfg.name)) {
            Ok(n) => Some(n),
            Err(e) => {
                eprintln!("rekindle: no sd_notify socket for the app: {e}");
                None
            }
        };

        // From here on, every file bound is removed again on an early
        // return: the sockets' and UnixListenFiles' Drop.
        let mut listen: Vec<(String, OwnedFd)> = inherited.listen;
        let mut unix_listen = UnixListenFiles::default();
        for a in &cfg.listen {
            let fd = bind_listen(a)?;
            if let ListenAddr::Unix(p) = a {
                unix_listen.add(p);
            }
            listen.push((format!("listen{}", listen.len()), fd));
        }
        let mut held = inherited
            .held
            .into_iter()
            .filter(|(_, _, fd)| crate::arena::is_rekindle_memfd(fd.as_fd()))
            .map(|(kind, name, fd)| Held { kind, name, fd })
            .collect::<Vec<_>>();
        let mut lazy = None;
        let premade = cfg.restored.take();
        let from_image = premade.is_some();
        let restored = match &cfg.restore {
            Some(src) => {
                let pages = cfg.restore_pages;
                let made = match (premade, reading) {
                    (Some(r), _) => Ok(r),
                    (None, Some(thread)) => thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                    (None, None) => crate::snapshot::restore::materialize_with(src, pages),
                };
                let mut r = made.map_err(|e| {
                    let mut evs = EventLog::open(&cfg.name, cfg.events.as_deref()).ok();
                    if let Some(l) = evs.as_mut() {
                        l.emit(
                            ev("error")
                                .s("what", "cannot restore")
                                .s("code", e.code())
                                .s("error", e.to_string()),
                        );
                    }
                    anyhow::anyhow!(
                        "cannot restore from {}: {e} ({})",
                        src.dir.display(),
                        e.code()
                    )
                })?;
                lazy = r
                    .lazy
                    .take()
                    .map(|s| lazy_restore::Lazy::Waiting(Box::new(s)));
                let mut rb = snapshots::Rollback::new(&src.dir, r);
                rb.premade = from_image;
                held = std::mem::take(&mut rb.fds);
                Some(rb)
            }
            None => None,
        };

        let metrics = Metrics::new(&cfg.name)?;
        let metrics_server = match &cfg.metrics {
            Some(a) => Some(metrics::Server::bind(a)?),
            None => None,
        };
        let program = Program::new(&cfg.program_path, &cfg.args)?;
        let mut base_env = spawn::base_env(&[
            "REKINDLE_SUPERVISOR_FD",
            "REKINDLE_CONTROL_FD",
            "REKINDLE_RESTART_SIGNAL",
            "REKINDLE_CRASHLOOP_MS",
            "REKINDLE_HANG_TIMEOUT_MS",
            "REKINDLE_NAME",
            "REKINDLE_MANIFEST_FD",
            "REKINDLE_SNAPSHOT_FD",
            "REKINDLE_REDO_FDS",
            "REKINDLE_REDO_REPLAY",
            "NOTIFY_SOCKET",
            "LISTEN_FDS",
            "LISTEN_PID",
            "LISTEN_FDNAMES",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            orphan::SOCKET_ENV,
        ]);
        // names this supervisor in every incarnation: orphan::find
        base_env.push(spawn::env_entry(orphan::SOCKET_ENV, control.path()));
        // the redo log: a store's, not a cluster's (its records would
        // have to reach the standbys too)
        let redo = match &cfg.snapshots {
            Some(sc) if cfg.replication.is_none() => {
                match crate::redo::Redo::start(&sc.dir, Some(metrics.redo.clone())) {
                    Ok(r) => Some(r),
                    Err(e) => {
                        eprintln!(
                            "rekindle: redo_unavailable: cannot create the redo log's ring: {e}; \
                         the app's rk_redo_append returns -ENOTSUP"
                        );
                        None
                    }
                }
            }
            _ => None,
        };
        let snapshots = match &cfg.snapshots {
            Some(sc) => Some(snapshots::start_engine(
                sc,
                &cfg.name,
                cfg.replication.clone(),
                cfg.store.take(),
                lazy.is_none(),
                redo.clone(),
            )?),
            None => None,
        };
        let now = now_ns();
        let mut s = Supervisor {
            report: Report::new(events, metrics, systemd),
            ctl: ControlBlock::create()?,
            ctl_damage: None,
            program,
            base_env,
            unix_listen,
            listen,
            held,
            sd_stored: Vec::new(),
            app: None,
            next_spawn: None,
            pending: None,
            ready_wait: None,
            generation: 0,
            consecutive: 0,
            stopping: None,
            exit: None,
            ever_linked: false,
            sigfd,
            control,
            app_notify,
            metrics_server,
            sd_watchdog_next_ns: now,
            next_check_ns: now,
            started_ns: now,
            started_wall: humantime::format_rfc3339_millis(std::time::SystemTime::now())
                .to_string(),
            snapshots,
            restored,
            lazy,
            lazy_snapshot_socket: None,
            rollback: None,
            redo,
            redo_replay: None,
            snapshots_since_event: 0,
            snapshot_event_ns: 0,
            fence: None,
            cfg,
        };
        s.sort_held();
        s.snapshot_held();
        Ok(s)
    }

    /// `--cluster`: the fence fd (cluster/election.rs).
    pub fn set_fence(&mut self, fd: OwnedFd) {
        self.fence = Some(fd);
    }

    /// Fenced: SIGKILL now, no SIGTERM grace (the app must not answer
    /// another client), then exit like a stop.
    fn on_fence(&mut self) {
        self.fence = None;
        self.next_spawn = None;
        let now = now_ns();
        if let Some(a) = &self.app {
            send_signal(a.pid, libc::SIGKILL);
            send_signal(-a.pid, libc::SIGKILL);
        }
        // after the kill: the event's time bounds when the app last answered
        self.report
            .event(ev("fence").s("what", "lease or term lost: the app is killed"));
        self.stopping = Some(Stopping {
            deadline_ns: now,
            killed: true,
            by: "fence".into(),
            code: FENCED_EXIT,
        });
        if self.app.is_none() {
            self.exit = Some(FENCED_EXIT);
        }
    }

    fn sort_held(&mut self) {
        self.held.sort_by_key(|h| h.kind.code());
    }

    pub fn run(mut self) -> i32 {
        let c = &self.cfg;
        let args: Vec<String> = c
            .args
            .iter()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let opts = json!({
            "hang_timeout_ms": c.hang_timeout.as_millis() as u64,
            "kill_timeout_ms": c.kill_timeout.as_millis() as u64,
            "max_rss": c.max_rss,
            "check_interval_ms": c.check_interval.as_millis() as u64,
            "crashloop_window_ms": c.crashloop_window.as_millis() as u64,
            "max_restarts": c.max_restarts,
            "stable_after_ms": c.stable_after.as_millis() as u64,
            "backoff_initial_ms": c.backoff_initial.as_millis() as u64,
            "backoff_max_ms": c.backoff_max.as_millis() as u64,
            "stop_timeout_ms": c.stop_timeout.as_millis() as u64,
            "listen": c.listen.iter().map(|l| l.to_string()).collect::<Vec<_>>(),
            "metrics": c.metrics,
            "restart_signal": c.restart_signal,
        });
        let start = ev("start")
            .s("program", self.cfg.program_path.to_string_lossy())
            .v("args", args)
            .v("options", opts)
            .u("supervisor_pid", std::process::id() as u64)
            .s("socket", self.control.path().to_string_lossy())
            .u("listen_fds", self.listen.len() as u64)
            .u("adopted_fds", self.held.len() as u64)
            .u("systemd", self.report.systemd().is_some() as u64);
        self.report.event(start);

        // The first incarnation: fresh, or warm from fds systemd kept for us.
        let first = if self.held.is_empty() {
            Plan {
                mode: StartKind::Fresh,
                generation: 0,
                signal: 0,
                t_detect_ns: 0,
                reason: String::new(),
                decision: String::new(),
                decision_code: Reason::None,
                backoff_ms: 0,
                dropped: 0,
                restored: false,
            }
        } else {
            // A new control block: nothing known of regions or independence.
            let facts = Facts {
                has_manifest: self.held.iter().any(|h| h.kind == FdKind::Manifest),
                arenas: self.arena_facts(false),
                uptime: Duration::MAX,
                crashloop_window: self.cfg.crashloop_window,
                ..Facts::default()
            };
            let d = decide::decide(&facts);
            let (mode, why) = (d.mode, d.why.clone());
            self.report.record(Record::Decision {
                mode: mode.as_str(),
                reason: &why,
                code: Some(d.code),
                path: Some(RestartPath::Respawn),
                failure: Some("supervisor-restart"),
            });
            let dropped = self.apply_decision(&d);
            let restored = self.restored.take().filter(|_| mode == Mode::Warm);
            if let Some(mut rb) = restored {
                self.snapshot_baseline(rb.baseline.take());
                let mut e = ev("restore")
                    .s("snapshot", rb.what.as_str())
                    .s("id", rb.id.as_str())
                    .u("bytes", rb.bytes)
                    .v("read_ms", (rb.read_ms * 10.0).round() / 10.0)
                    .s("from", if rb.premade { "hot_image" } else { "store" })
                    .s("why", self.cfg.restore_why)
                    .v(
                        "journal",
                        rb.journal.take().unwrap_or(serde_json::Value::Null),
                    );
                if let Some(ix) = &rb.index {
                    let r1 = |x: f64| (x * 10.0).round() / 10.0;
                    e = e
                        .s("index", ix.code())
                        .s("index_of", ix.index_of.as_ref().map_or("", |i| i.as_str()))
                        .u("index_deltas", ix.deltas as u64)
                        .v("chain_ms", r1(ix.chain_ms))
                        .v("index_ms", r1(ix.index_ms))
                        .v("fold_ms", r1(ix.fold_ms))
                        .u("fold_entries", ix.delta_entries)
                        .u("pack_indexes_read", ix.packs_read as u64);
                    if let Some(d) = ix.detail() {
                        // never silent: why the restore folded the chain,
                        // or which index it refused before the one it used
                        if ix.index_of.is_none() {
                            eprintln!("rekindle: restore without a location index: {d}");
                        } else {
                            eprintln!("rekindle: restore: a location index refused: {d}");
                        }
                        e = e.s("index_detail", d);
                    }
                }
                self.report.event(e);
                let mut decision = format!("restored from snapshot {}", rb.what);
                match self.redo_before_start(&rb, snapshots::ReplayFrom::IfNewest) {
                    Ok(note) => decision.push_str(&note),
                    Err(err) => {
                        // the records are acknowledged writes: no start
                        // without them unless the operator says so
                        self.report.event(
                            ev("error")
                                .s("what", "cannot replay the redo log after the snapshot")
                                .s("code", err.code())
                                .s("error", err.to_string()),
                        );
                        eprintln!(
                            "rekindle: cannot replay the redo log after snapshot {}: {err} ({}); \
                             to start from the snapshot alone, move {} aside",
                            rb.what,
                            err.code(),
                            rb.dir.join(crate::store::redo::REDO_DIR).display()
                        );
                        return 1;
                    }
                }
                self.restored_plan(rb.id, decision, 0, now_ns(), dropped)
            } else {
                Plan {
                    mode: if mode == Mode::Warm {
                        StartKind::Warm
                    } else {
                        StartKind::Cold
                    },
                    generation: 1,
                    signal: 0,
                    t_detect_ns: now_ns(),
                    reason: "supervisor restarted".into(),
                    decision: why,
                    decision_code: d.code,
                    backoff_ms: 0,
                    dropped,
                    restored: false,
                }
            }
        };
        self.next_spawn = Some((now_ns(), first));

        let code = loop {
            self.reap();
            self.run_due();
            if let Some(code) = self.exit
                && self.app.is_none()
            {
                break code;
            }
            self.poll_once();
        };
        self.control.remove_file();
        if let Some(n) = &self.app_notify {
            n.remove_file();
        }
        self.unix_listen.remove_all();
        code
    }

    fn poll_timeout_ms(&self) -> i32 {
        let now = now_ns();
        let mut next = now + 1_000_000_000;
        if let Some((t, _)) = &self.next_spawn {
            next = next.min(*t);
        }
        if self.app.is_some() {
            next = next.min(self.next_check_ns);
        }
        if let Some(t) = self.app.as_ref().and_then(|a| a.state.next_deadline()) {
            next = next.min(t);
        }
        if let Some(s) = self.stopping.as_ref().filter(|s| !s.killed) {
            next = next.min(s.deadline_ns);
        }
        if self
            .report
            .systemd()
            .is_some_and(|s| s.watchdog_usec.is_some())
        {
            next = next.min(self.sd_watchdog_next_ns);
        }
        let ms = next.saturating_sub(now).div_ceil(1_000_000);
        ms.min(1000) as i32
    }

    fn poll_once(&mut self) {
        #[derive(Clone, Copy)]
        enum Src {
            Sig,
            App,
            Notify,
            CtlListen,
            Ctl(u64),
            MetListen,
            MetConn,
            Snap,
            Fence,
        }
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(16);
        let mut srcs: Vec<Src> = Vec::with_capacity(16);
        let mut add = |fd: BorrowedFd<'_>, events: i16, s: Src| {
            pfds.push(libc::pollfd {
                fd: fd.as_raw_fd(),
                events,
                revents: 0,
            });
            srcs.push(s);
        };
        add(self.sigfd.as_fd(), libc::POLLIN, Src::Sig);
        if let Some(sock) = self.app.as_ref().and_then(|a| a.sock.as_ref()) {
            add(sock.as_fd(), libc::POLLIN, Src::App);
        }
        if let Some(n) = &self.app_notify {
            add(n.fd(), libc::POLLIN, Src::Notify);
        }
        add(self.control.listener_fd(), libc::POLLIN, Src::CtlListen);
        for c in &self.control.clients {
            let ev = if c.wants_write() {
                libc::POLLIN | libc::POLLOUT
            } else {
                libc::POLLIN
            };
            add(c.fd(), ev, Src::Ctl(c.id));
        }
        if let Some(m) = &self.metrics_server {
            add(m.listener_fd(), libc::POLLIN, Src::MetListen);
            for (fd, w) in m.conn_fds() {
                add(
                    fd,
                    if w {
                        libc::POLLIN | libc::POLLOUT
                    } else {
                        libc::POLLIN
                    },
                    Src::MetConn,
                );
            }
        }
        if let Some(h) = &self.snapshots {
            add(h.notify.as_fd(), libc::POLLIN, Src::Snap);
        }
        if let Some(f) = &self.fence {
            add(f.as_fd(), libc::POLLIN, Src::Fence);
        }
        let timeout = self.poll_timeout_ms();
        // SAFETY: pfds is a live array of pollfd of the given length.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
        if n <= 0 {
            self.control.sweep(); // idle control connections time out
            return;
        }
        let mut metrics_active = false;
        for (p, s) in pfds.iter().zip(srcs.iter()) {
            if p.revents == 0 {
                continue;
            }
            match *s {
                Src::Sig => self.on_signals(),
                Src::App => self.on_app_readable(p.revents & (libc::POLLHUP | libc::POLLERR) != 0),
                Src::Notify => self.on_notify(),
                Src::CtlListen => {
                    // a newcomer's request may be there already: serve it now
                    for id in self.control.accept() {
                        self.on_control_client(id);
                    }
                }
                Src::Ctl(id) => self.on_control_client(id),
                Src::MetListen => {
                    if let Some(m) = &mut self.metrics_server {
                        m.accept();
                    }
                    metrics_active = true;
                }
                Src::MetConn => metrics_active = true,
                Src::Snap => self.on_snapshot_notes(),
                Src::Fence => self.on_fence(),
            }
        }
        if metrics_active {
            self.serve_metrics();
        }
        self.control.sweep();
    }

    fn serve_metrics(&mut self) {
        if let Some(m) = &mut self.metrics_server {
            let reg = self.report.metrics();
            m.serve(&|| reg.render());
        }
    }

    fn on_signals(&mut self) {
        loop {
            match self.sigfd.read_signal() {
                Ok(Some(info)) => {
                    let sig = info.ssi_signo as i32;
                    if sig == libc::SIGCHLD {
                        self.reap();
                    } else if sig == libc::SIGTERM || sig == libc::SIGINT {
                        self.begin_stop(&sig_name(sig), 0);
                    } else if sig == libc::SIGHUP {
                        let r = self.ask_restart(
                            Mode::Warm,
                            "supervisor: SIGHUP".into(),
                            FailureKind::Request,
                            false,
                        );
                        if let Err(e) = r {
                            self.report
                                .event(ev("error").s("what", format!("SIGHUP: {e}")));
                        }
                    }
                }
                Ok(None) => break,
                Err(_) => break,
            }
        }
    }

    fn reap(&mut self) {
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid with a valid status pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if pid <= 0 {
                break;
            }
            if self.app.as_ref().is_some_and(|a| a.pid == pid) {
                self.on_app_exit(status);
            }
        }
    }

    fn run_due(&mut self) {
        let now = now_ns();
        // backoff over: spawn
        let due = self.next_spawn.as_ref().is_some_and(|(t, _)| *t <= now);
        if due
            && self.app.is_none()
            && self.stopping.is_none()
            && self.exit.is_none()
            && let Some((_, plan)) = self.next_spawn.take()
        {
            self.spawn(plan);
        }
        // stop deadline
        if let (Some(s), Some(a)) = (&mut self.stopping, &self.app)
            && !s.killed
            && now >= s.deadline_ns
        {
            s.killed = true;
            send_signal(a.pid, libc::SIGKILL);
            send_signal(-a.pid, libc::SIGKILL);
            self.report.event(
                ev("kill")
                    .i("pid", a.pid as i64)
                    .s("reason", "stop timeout"),
            );
        }
        self.request_deadlines(now);
        self.lazy_poll();
        if self.app.is_some() && now >= self.next_check_ns {
            self.next_check_ns = now + dur_ns(self.check_step());
            self.check_control_block();
            self.check_hang(now);
            self.check_rss();
        }
        self.sd_watchdog(now);
    }
}
