//! `rekindle run`: the single-threaded poll(2) loop that spawns, watches,
//! decides and restarts one app (docs/supervisor-protocol.md).
//!
//! Sources: a signalfd (SIGCHLD, SIGTERM, SIGINT, SIGHUP), the app's socket
//! pair, the app's sd_notify socket, the control socket and its clients, the
//! metrics listener; the poll timeout drives the periodic checks (hang, RSS,
//! reaping), the backoff, kill deadlines and the systemd watchdog.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use serde_json::{Value, json};

use crate::app_link::{self, Recv};
use crate::cli::{Config, ListenAddr};
use crate::clock::{self, now_ns};
use crate::control_block::{ControlBlock, CtlState, Damage, Fields};
use crate::control_socket::{self, Request, error_reply};
use crate::decide::{self, Facts, Mode};
use crate::event::{EventLog, ev};
use crate::metrics::{self, Metrics};
use crate::notify::{self, AppNotify, Notice, Systemd};
use crate::orphan::{self, StartError};
use crate::proto::{self, AppMsg, FdKind, Hello, Inherit, Restarting, StartKind, SupMsg};
use crate::spawn::{self, ChildFds, Program};
use crate::{procfs, runtime_dir, signame};

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
    backoff_ms: u64,
    /// With Warm: arenas found half-changed (independent ones), not handed on.
    dropped: u32,
}

/// A failure noted for the running incarnation, not yet restarted from.
#[derive(Clone)]
struct Noted {
    kind: &'static str,
    reason: String,
    signal: i32,
    t_detect_ns: u64,
    /// When the failure happened, if known (a hang: the last heartbeat).
    t_failure_ns: Option<u64>,
}

/// A restart the supervisor asked for (hang, leak, `rekindle restart`).
struct Ask {
    mode: Mode,
    signal_at_ns: Option<u64>,
    kill_at_ns: Option<u64>,
}

/// A restart under way, waiting for the new incarnation's HELLO.
struct Pending {
    path: &'static str,
    failure: &'static str,
    t_failure_ns: Option<u64>,
    t_detect_ns: u64,
    decided: Mode,
}

struct App {
    pid: libc::pid_t,
    sock: Option<OwnedFd>,
    started_ns: u64,
    generation: u32,
    start_kind: StartKind,
    plan: Plan,
    attach_answered: bool,
    hello: bool,
    ready: bool,
    noted: Option<Noted>,
    ask: Option<Ask>,
    in_place: bool,
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
    events: EventLog,
    ctl: ControlBlock,
    program: Program,
    base_env: Vec<CString>,
    listen: Vec<(String, OwnedFd)>,
    /// `--listen unix:PATH` files we created, removed at exit.
    unix_listen: UnixListenFiles,
    held: Vec<Held>,
    app: Option<App>,
    next_spawn: Option<(u64, Plan)>,
    pending: Option<Pending>,
    ready_wait: Option<u64>,
    generation: u32,
    consecutive: u32,
    stopping: Option<Stopping>,
    exit: Option<i32>,
    ever_linked: bool,
    sigfd: SignalFd,
    control: control_socket::Server,
    app_notify: Option<AppNotify>,
    systemd: Option<Systemd>,
    sd_ready_sent: bool,
    sd_watchdog_next_ns: u64,
    sd_stored: Vec<String>,
    metrics: Metrics,
    metrics_server: Option<metrics::Server>,
    started_ns: u64,
    started_wall: String,
    restarts_warm: u64,
    restarts_cold: u64,
    failures: u64,
    last_failure: Option<Value>,
    last_decision: Option<Value>,
    preserved_bytes: u64,
    app_status: Option<String>,
    next_check_ns: u64,
    /// The control block's header was found damaged (reported once), and how
    /// many times that happened; a damaged block is replaced at the next death.
    ctl_damage: Option<Damage>,
    ctl_corruptions: u64,
}

fn sig_name(sig: i32) -> String {
    signame::name(sig)
}

fn send_signal(pid: libc::pid_t, sig: i32) -> bool {
    // SAFETY: kill(2) on a pid we spawned and have not reaped.
    unsafe { libc::kill(pid, sig) == 0 }
}

fn human_bytes(b: u64) -> String {
    if b >= 10 << 30 {
        format!("{} GiB", b >> 30)
    } else if b >= 10 << 20 {
        format!("{} MiB", b >> 20)
    } else if b >= 10 << 10 {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

impl Supervisor {
    pub fn new(cfg: Config) -> Result<Self> {
        ensure_stdio();
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
        let held = inherited
            .held
            .into_iter()
            .filter(|(_, _, fd)| crate::arena::is_rekindle_memfd(fd.as_fd()))
            .map(|(kind, name, fd)| Held { kind, name, fd })
            .collect::<Vec<_>>();

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
            "REKINDLE_NAME",
            "REKINDLE_MANIFEST_FD",
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
        let now = now_ns();
        let mut s = Supervisor {
            ctl: ControlBlock::create()?,
            events,
            program,
            base_env,
            unix_listen,
            listen,
            held,
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
            sd_ready_sent: false,
            sd_watchdog_next_ns: now,
            sd_stored: Vec::new(),
            systemd,
            metrics,
            metrics_server,
            started_ns: now,
            started_wall: humantime::format_rfc3339_millis(std::time::SystemTime::now())
                .to_string(),
            restarts_warm: 0,
            restarts_cold: 0,
            failures: 0,
            last_failure: None,
            last_decision: None,
            preserved_bytes: 0,
            app_status: None,
            next_check_ns: now,
            ctl_damage: None,
            ctl_corruptions: 0,
            cfg,
        };
        s.sort_held();
        Ok(s)
    }

    fn sort_held(&mut self) {
        self.held.sort_by_key(|h| h.kind.code());
    }

    // ---- the loop ------------------------------------------------------------

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
            .u("systemd", self.systemd.is_some() as u64);
        self.events.emit(start);

        // The first incarnation: fresh, or warm from fds systemd kept for us.
        let first = if self.held.is_empty() {
            Plan {
                mode: StartKind::Fresh,
                generation: 0,
                signal: 0,
                t_detect_ns: 0,
                reason: String::new(),
                decision: String::new(),
                backoff_ms: 0,
                dropped: 0,
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
            self.emit_decision(mode.as_str(), &why, "respawn", "supervisor-restart");
            let dropped = self.apply_decision(&d);
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
                backoff_ms: 0,
                dropped,
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
        if let Some(ask) = self.app.as_ref().and_then(|a| a.ask.as_ref()) {
            for t in [ask.signal_at_ns, ask.kill_at_ns].into_iter().flatten() {
                next = next.min(t);
            }
        }
        if let Some(s) = self.stopping.as_ref().filter(|s| !s.killed) {
            next = next.min(s.deadline_ns);
        }
        if self
            .systemd
            .as_ref()
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
            }
        }
        if metrics_active {
            self.serve_metrics();
        }
        self.control.sweep();
    }

    fn serve_metrics(&mut self) {
        if let Some(m) = &mut self.metrics_server {
            let reg = &self.metrics;
            m.serve(&|| reg.render());
        }
    }

    // ---- signals and reaping ---------------------------------------------------

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
                            "request",
                            false,
                        );
                        if let Err(e) = r {
                            self.events
                                .emit(ev("error").s("what", format!("SIGHUP: {e}")));
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

    // ---- timers ------------------------------------------------------------------

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
            self.events.emit(
                ev("kill")
                    .i("pid", a.pid as i64)
                    .s("reason", "stop timeout"),
            );
        }
        self.request_deadlines(now);
        if self.app.is_some() && now >= self.next_check_ns {
            self.next_check_ns = now + dur_ns(self.check_step());
            self.check_control_block();
            self.check_hang(now);
            self.check_rss();
        }
        self.sd_watchdog(now);
    }

    fn check_step(&self) -> Duration {
        let mut d = self.cfg.check_interval;
        if !self.cfg.hang_timeout.is_zero() {
            d = d
                .min(self.cfg.hang_timeout / 4)
                .max(Duration::from_millis(10));
        }
        d
    }

    fn request_deadlines(&mut self, now: u64) {
        let sig = self.cfg.restart_signal;
        let kill_ns = dur_ns(self.cfg.kill_timeout);
        let Some(a) = &mut self.app else { return };
        let linked = a.hello;
        let pid = a.pid;
        let Some(ask) = &mut a.ask else { return };
        if let Some(t) = ask.signal_at_ns
            && now >= t
        {
            ask.signal_at_ns = None;
            ask.kill_at_ns = Some(now + kill_ns);
            let s = if linked { sig } else { libc::SIGTERM };
            send_signal(pid, s);
            self.events.emit(
                ev("signal")
                    .i("pid", pid as i64)
                    .s("signal", sig_name(s))
                    .s("reason", "restart request not taken at a heartbeat"),
            );
        }
        if let Some(t) = ask.kill_at_ns
            && now >= t
        {
            ask.kill_at_ns = None;
            send_signal(pid, libc::SIGKILL);
            self.events.emit(ev("kill").i("pid", pid as i64).s(
                "reason",
                format!("no HELLO within {} ms", self.cfg.kill_timeout.as_millis()),
            ));
        }
    }

    fn check_hang(&mut self, now: u64) {
        if self.cfg.hang_timeout.is_zero() || self.stopping.is_some() {
            return;
        }
        let Some(a) = &self.app else { return };
        if a.ask.is_some() || a.in_place || a.noted.is_some() {
            return;
        }
        let ctl_hb = if self.ctl.pid() == a.pid as u32 && self.ctl.state() != CtlState::Restarting {
            self.ctl.heartbeat_ns()
        } else {
            0
        };
        let hb = ctl_hb.max(a.last_watchdog_ns);
        if hb == 0 || now <= hb {
            return;
        }
        let silent = now - hb;
        if silent > dur_ns(self.cfg.hang_timeout) {
            let reason = format!("hang: no heartbeat for {} ms", clock::ms(silent));
            if let Err(e) = self.ask_restart(Mode::Warm, reason, "hang", true) {
                self.events
                    .emit(ev("error").s("what", format!("hang restart: {e}")));
            }
            if let Some(n) = self.app.as_mut().and_then(|a| a.noted.as_mut()) {
                n.t_failure_ns = Some(hb);
            }
        }
    }

    /// The control block's header as written at creation, or its damage,
    /// reported when first seen: a wild write in the app, or another
    /// process with the fd, has taken away the evidence of unsafe regions.
    fn check_control_block(&mut self) -> Option<Damage> {
        let damage = self.ctl.damage();
        if let Some(d) = damage
            && self.ctl_damage.is_none()
        {
            self.ctl_corruptions += 1;
            self.events.emit(
                ev("control_block")
                    .s("status", "corrupt")
                    .s("code", d.code())
                    .s("why", d.describe())
                    .s("action", "the next restart is cold and gets a new block"),
            );
            self.metrics
                .control_block_corrupt
                .with_label_values(&[d.code()])
                .inc();
            self.metrics.control_block_ok.set(0);
        }
        self.ctl_damage = damage;
        damage
    }

    /// A damaged block cannot be trusted again: the next incarnation gets a
    /// new one (the dead one's mapping and fd go with the old).
    fn replace_control_block(&mut self) {
        match ControlBlock::create() {
            Ok(cb) => {
                self.ctl = cb;
                self.ctl_damage = None;
                self.metrics.control_block_ok.set(1);
                self.events
                    .emit(ev("control_block").s("status", "recreated"));
            }
            Err(e) => self
                .events
                .emit(ev("error").s("what", format!("recreating the control block: {e:#}"))),
        }
    }

    fn check_rss(&mut self) {
        let Some(max) = self.cfg.max_rss else { return };
        if self.stopping.is_some() {
            return;
        }
        let Some(a) = &self.app else { return };
        if a.ask.is_some() || a.in_place || a.noted.is_some() {
            return;
        }
        let Some(rss) = procfs::rss_anon(a.pid) else {
            return;
        };
        if rss > max {
            let reason = format!(
                "leak: RssAnon {} > max {}",
                human_bytes(rss),
                human_bytes(max)
            );
            if let Err(e) = self.ask_restart(Mode::Warm, reason, "leak", true) {
                self.events
                    .emit(ev("error").s("what", format!("leak restart: {e}")));
            }
        }
    }

    fn sd_watchdog(&mut self, now: u64) {
        let Some(sd) = &self.systemd else { return };
        let Some(usec) = sd.watchdog_usec else { return };
        if now < self.sd_watchdog_next_ns {
            return;
        }
        self.sd_watchdog_next_ns = now + usec * 1000 / 2;
        // healthy: no hang being handled
        let hung = self
            .app
            .as_ref()
            .is_some_and(|a| a.noted.as_ref().is_some_and(|n| n.kind == "hang"));
        if !hung {
            let _ = sd.send("WATCHDOG=1", &[]);
        }
    }

    // ---- spawn -------------------------------------------------------------------

    fn spawn(&mut self, plan: Plan) {
        let now = now_ns();
        let (sup_end, app_end) = match app_link::pair() {
            Ok(p) => p,
            Err(e) => {
                self.spawn_failed(plan, &format!("socketpair: {e}"));
                return;
            }
        };
        self.ctl.reset_for_spawn();
        let l = self.listen.len();
        let mut env = self.base_env.clone();
        env.push(spawn::env_entry(
            "REKINDLE_SUPERVISOR_FD",
            (3 + l).to_string(),
        ));
        env.push(spawn::env_entry("REKINDLE_CONTROL_FD", (4 + l).to_string()));
        env.push(spawn::env_entry(
            "REKINDLE_RESTART_SIGNAL",
            self.cfg.restart_signal.to_string(),
        ));
        env.push(spawn::env_entry(
            "REKINDLE_CRASHLOOP_MS",
            self.cfg.crashloop_window.as_millis().to_string(),
        ));
        env.push(spawn::env_entry("REKINDLE_NAME", &self.cfg.name));
        if let Some(n) = &self.app_notify {
            env.push(spawn::env_entry("NOTIFY_SOCKET", &n.env_value));
        }
        if l > 0 {
            env.push(spawn::env_entry("LISTEN_FDS", l.to_string()));
            let names: Vec<&str> = self.listen.iter().map(|(n, _)| n.as_str()).collect();
            env.push(spawn::env_entry("LISTEN_FDNAMES", names.join(":")));
        }
        let fds = ChildFds {
            listen: self.listen.iter().map(|(_, f)| f.as_fd()).collect(),
            app_sock: app_end.as_fd(),
            control: self.ctl.fd(),
        };
        let r = spawn::spawn(&self.program, &env, &fds, l > 0);
        drop(fds);
        drop(app_end);
        let pid = match r {
            Ok(pid) => pid,
            Err(e) => {
                self.spawn_failed(plan, &format!("fork: {e}"));
                return;
            }
        };
        self.generation = plan.generation;
        self.events.emit(
            ev("spawn")
                .i("pid", pid as i64)
                .u("generation", plan.generation as u64)
                .s("mode", plan.mode.as_str())
                .u("backoff_ms", plan.backoff_ms)
                .u(
                    "fds",
                    if plan.mode == StartKind::Warm {
                        self.held.len() as u64
                    } else {
                        0
                    },
                ),
        );
        self.metrics.up.set(1);
        self.metrics.generation.set(plan.generation as i64);
        self.app = Some(App {
            pid,
            sock: Some(sup_end),
            started_ns: now,
            generation: plan.generation,
            start_kind: plan.mode,
            plan,
            attach_answered: false,
            hello: false,
            ready: false,
            noted: None,
            ask: None,
            in_place: false,
            last_watchdog_ns: 0,
            bad_messages: 0,
        });
        self.next_check_ns = now + dur_ns(self.check_step());
        // An app without the runtime never says HELLO: its restart is done now.
        if !self.ever_linked
            && let Some(p) = self.pending.take()
        {
            self.emit_restart(
                p,
                self.app
                    .as_ref()
                    .map(|a| a.start_kind)
                    .unwrap_or(StartKind::Cold),
                now,
                0,
            );
        }
    }

    fn spawn_failed(&mut self, plan: Plan, what: &str) {
        self.events
            .emit(ev("error").s("what", format!("cannot start the app: {what}")));
        let n = decide::next_failure_count(self.consecutive, Duration::ZERO, self.cfg.stable_after);
        self.consecutive = n;
        if decide::gives_up(n, self.cfg.max_restarts) {
            self.give_up(&format!("cannot start the app: {what}"));
            self.exit = Some(1);
            return;
        }
        let b = decide::backoff(n.max(2), self.cfg.backoff_initial, self.cfg.backoff_max);
        let mut plan = plan;
        plan.backoff_ms = b.as_millis() as u64;
        self.next_spawn = Some((now_ns() + dur_ns(b), plan));
    }

    // ---- failures, decisions, restarts ----------------------------------------

    /// Records a failure of the running incarnation (once per incarnation).
    /// Returns true if it was one too many and the supervisor gives up.
    fn note_failure(
        &mut self,
        kind: &'static str,
        signal: i32,
        exit_code: Option<i32>,
        reason: &str,
        counts: bool,
    ) -> bool {
        let now = now_ns();
        let Some(a) = &mut self.app else { return false };
        let uptime = now.saturating_sub(a.started_ns);
        a.noted = Some(Noted {
            kind,
            reason: reason.to_string(),
            signal,
            t_detect_ns: now,
            t_failure_ns: None,
        });
        let (pid, generation) = (a.pid, a.generation);
        self.failures += 1;
        if counts {
            self.consecutive = decide::next_failure_count(
                self.consecutive,
                Duration::from_nanos(uptime),
                self.cfg.stable_after,
            );
        }
        let mut e = ev("failure")
            .s("kind", kind)
            .i("pid", pid as i64)
            .u("generation", generation as u64)
            .u("uptime_ms", clock::ms(uptime))
            .s("reason", reason)
            .u("consecutive", self.consecutive as u64);
        if signal != 0 {
            e = e.s("signal", sig_name(signal));
        }
        if let Some(c) = exit_code {
            e = e.i("exit_code", c as i64);
        }
        self.last_failure = Some(json!({
            "kind": kind, "reason": reason, "signal": if signal != 0 { Some(sig_name(signal)) } else { None },
            "exit_code": exit_code, "generation": generation, "ts": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        }));
        self.events.emit(e);
        self.metrics.failures.with_label_values(&[kind]).inc();
        self.metrics.last_failure.set(clock::unix_secs_f64());
        if let Some(sd) = &self.systemd {
            let _ = sd.send(&format!("STATUS=failure: {reason}"), &[]);
        }
        if counts && decide::gives_up(self.consecutive, self.cfg.max_restarts) {
            self.give_up(&format!(
                "{} consecutive failures (--max-restarts {}); last: {reason}",
                self.consecutive, self.cfg.max_restarts
            ));
            return true;
        }
        false
    }

    fn give_up(&mut self, why: &str) {
        self.emit_decision("giveup", why, "", "");
        self.events.emit(
            ev("giveup")
                .s("reason", why)
                .u("consecutive_failures", self.consecutive as u64)
                .u("max_restarts", self.cfg.max_restarts as u64),
        );
        if let Some(sd) = &self.systemd {
            let _ = sd.send(&format!("STATUS=gave up: {why}"), &[]);
        }
        self.next_spawn = None;
        match &self.app {
            Some(a) => {
                // still alive (an in-place restart loop): end it
                send_signal(a.pid, libc::SIGTERM);
                self.stopping = Some(Stopping {
                    deadline_ns: now_ns() + dur_ns(self.cfg.kill_timeout),
                    killed: false,
                    by: "giveup".into(),
                    code: 1,
                });
            }
            None => self.exit = Some(1),
        }
    }

    fn emit_decision(&mut self, mode: &str, reason: &str, path: &str, failure: &str) {
        let mut e = ev("decision").s("mode", mode).s("reason", reason);
        if !path.is_empty() {
            e = e.s("path", path);
        }
        if !failure.is_empty() {
            e = e.s("failure", failure);
        }
        self.last_decision = Some(json!({"mode": mode, "reason": reason, "path": path}));
        self.events.emit(e);
    }

    fn emit_restart(&mut self, p: Pending, kind: StartKind, now: u64, preserved: u64) {
        let spawn_ns = now.saturating_sub(p.t_detect_ns);
        let detect_ns = p
            .t_failure_ns
            .map(|t| p.t_detect_ns.saturating_sub(t))
            .unwrap_or(0);
        let mode = match kind {
            StartKind::Warm => "warm",
            StartKind::Cold => "cold",
            StartKind::Fresh => "fresh",
        };
        self.events.emit(
            ev("restart")
                .s("mode", mode)
                .s("path", p.path)
                .s("failure", p.failure)
                .s("decided", p.decided.as_str())
                .u("generation", self.generation as u64)
                .u("detect_us", clock::us(detect_ns))
                .u("spawn_us", clock::us(spawn_ns))
                .u("preserved_bytes", preserved),
        );
        if kind == StartKind::Warm {
            self.restarts_warm += 1;
        } else {
            self.restarts_cold += 1;
        }
        self.metrics
            .restarts
            .with_label_values(&[mode, p.failure])
            .inc();
        self.metrics.downtime.observe(spawn_ns as f64 / 1e9);
        self.ready_wait = Some(p.t_detect_ns);
        if let Some(sd) = &self.systemd {
            let _ = sd.send(
                &format!(
                    "STATUS=restarted {mode} ({}), generation {}",
                    p.failure, self.generation
                ),
                &[],
            );
        }
    }

    /// The process is gone: decide and schedule the next one.
    fn on_app_exit(&mut self, status: libc::c_int) {
        self.drain_app();
        let now = now_ns();
        let (signal, code) = if libc::WIFSIGNALED(status) {
            (libc::WTERMSIG(status), None)
        } else {
            (0, Some(libc::WEXITSTATUS(status)))
        };
        self.metrics.up.set(0);
        let exited = ev("exit")
            .i("pid", self.app.as_ref().map(|a| a.pid as i64).unwrap_or(0))
            .opt("signal", (signal != 0).then(|| sig_name(signal)))
            .opt("exit_code", code)
            .u(
                "uptime_ms",
                clock::ms(
                    now.saturating_sub(self.app.as_ref().map(|a| a.started_ns).unwrap_or(now)),
                ),
            );
        self.events.emit(exited);

        if let Some(s) = &self.stopping {
            let (by, code_out) = (s.by.clone(), s.code);
            self.app = None;
            if code_out == 0 {
                self.emit_decision("stop", &format!("stopped by {by}"), "", "");
                self.events.emit(
                    ev("stop")
                        .s("by", by)
                        .opt("signal", (signal != 0).then(|| sig_name(signal)))
                        .opt("exit_code", code),
                );
            }
            self.exit = Some(code_out);
            return;
        }
        let (noted, ask_mode, uptime, start_kind) = match &self.app {
            Some(a) => (
                a.noted.clone(),
                a.ask.as_ref().map(|k| k.mode),
                now.saturating_sub(a.started_ns),
                a.start_kind,
            ),
            None => return,
        };
        if code == Some(0) && noted.is_none() {
            self.app = None;
            self.emit_decision("exit", "the app exited with status 0", "", "");
            self.exit = Some(0);
            return;
        }
        let noted = match noted {
            Some(n) => n,
            None => {
                let (kind, reason) = match code {
                    Some(c) => ("exit", format!("exit {c}")),
                    None => ("signal", format!("signal {}", sig_name(signal))),
                };
                if self.note_failure(kind, signal, code, &reason, true) {
                    self.app = None;
                    self.exit = Some(1);
                    return;
                }
                match self.app.as_ref().and_then(|a| a.noted.clone()) {
                    Some(n) => n,
                    None => return,
                }
            }
        };
        self.app = None;
        let damage = self.check_control_block();
        let arenas = self.arena_facts(true);
        let unsafe_elsewhere = self
            .ctl
            .open_regions()
            .into_iter()
            .find(|r| !arenas.iter().any(|a| a.name == r.arena))
            .map(|r| r.describe());
        let facts = Facts {
            has_manifest: self.held.iter().any(|h| h.kind == FdKind::Manifest),
            control_damage: damage.map(|d| d.describe().to_string()),
            warm_disabled: self.ctl.warm_disabled(),
            unsafe_elsewhere,
            last_start_warm: start_kind == StartKind::Warm,
            uptime: Duration::from_nanos(uptime),
            crashloop_window: self.cfg.crashloop_window,
            arenas,
            cold_requested: ask_mode == Some(Mode::Cold),
        };
        let d = decide::decide(&facts);
        let (mode, why) = (d.mode, d.why.clone());
        self.emit_decision(mode.as_str(), &why, "respawn", noted.kind);
        let dropped = self.apply_decision(&d);
        if damage.is_some() {
            self.replace_control_block();
        }
        let backoff = if noted.kind == "request" && ask_mode.is_some() {
            Duration::ZERO
        } else {
            decide::backoff(
                self.consecutive,
                self.cfg.backoff_initial,
                self.cfg.backoff_max,
            )
        };
        let sig_for_inherit = if signal != 0 { signal } else { noted.signal };
        let plan = Plan {
            mode: if mode == Mode::Warm {
                StartKind::Warm
            } else {
                StartKind::Cold
            },
            generation: self.generation.wrapping_add(1),
            signal: sig_for_inherit,
            t_detect_ns: noted.t_detect_ns.min(now),
            reason: noted.reason.clone(),
            decision: why,
            backoff_ms: backoff.as_millis() as u64,
            dropped,
        };
        self.pending = Some(Pending {
            path: "respawn",
            failure: noted.kind,
            t_failure_ns: noted.t_failure_ns,
            t_detect_ns: plan.t_detect_ns,
            decided: mode,
        });
        self.next_spawn = Some((now + dur_ns(backoff), plan));
    }

    /// Per held arena: independence and open regions from the control block
    /// (`with_ctl`: it belongs to the incarnation that died), and the header check.
    fn arena_facts(&self, with_ctl: bool) -> Vec<decide::ArenaFacts> {
        let regions = if with_ctl {
            self.ctl.open_regions()
        } else {
            Vec::new()
        };
        let independent = if with_ctl {
            self.ctl.independent_mask()
        } else {
            0
        };
        self.held
            .iter()
            .filter(|h| h.kind == FdKind::Arena)
            .map(|h| {
                let index = if with_ctl {
                    self.ctl.arena_index(&h.name)
                } else {
                    None
                };
                decide::ArenaFacts {
                    name: h.name.clone(),
                    independent: index.is_some_and(|k| independent & (1u32 << k) != 0),
                    unsafe_open: regions
                        .iter()
                        .find(|r| r.arena == h.name)
                        .map(|r| r.describe()),
                    check: crate::arena::check_header_fd(h.fd.as_fd()),
                }
            })
            .collect()
    }

    /// Cold drops every held fd; warm drops the arenas the decision names.
    /// Returns how many arenas the next incarnation will not get.
    fn apply_decision(&mut self, d: &decide::Decision) -> u32 {
        if d.mode == Mode::Cold {
            self.drop_held();
            return 0;
        }
        let before = self.held.len();
        self.held
            .retain(|h| !(h.kind == FdKind::Arena && d.dropped.contains(&h.name)));
        if !d.dropped.is_empty() {
            self.events.emit(
                ev("arena_dropped")
                    .s("arenas", d.dropped.join(","))
                    .s("why", d.why.clone()),
            );
        }
        (before - self.held.len()) as u32
    }

    /// Asks the running app to restart: control-block request, then the
    /// restart signal (at once for a hang or an app that does not beat),
    /// then SIGKILL after --kill-timeout.
    fn ask_restart(
        &mut self,
        mode: Mode,
        reason: String,
        kind: &'static str,
        counts: bool,
    ) -> Result<(), String> {
        if self.stopping.is_some() {
            return Err("the supervisor is stopping".into());
        }
        let now = now_ns();
        let (pid, linked, busy) = match &self.app {
            Some(a) => (
                a.pid,
                a.hello,
                a.ask.is_some() || a.in_place || a.noted.is_some(),
            ),
            None => {
                return Err(match &self.next_spawn {
                    Some((t, _)) => format!(
                        "no app running; next start in {} ms",
                        clock::ms(t.saturating_sub(now))
                    ),
                    None => "no app running".into(),
                });
            }
        };
        if busy {
            return Err("a restart is already under way".into());
        }
        if self.note_failure(kind, 0, None, &reason, counts) {
            return Ok(()); // gave up: the app is being stopped
        }
        let beats = self.ctl.pid() == pid as u32 && self.ctl.heartbeat_ns() != 0;
        self.ctl
            .request(if mode == Mode::Cold { 2 } else { 1 }, &reason);
        let kill_ns = dur_ns(self.cfg.kill_timeout);
        let ask = if kind != "hang" && beats && linked {
            Ask {
                mode,
                signal_at_ns: Some(now + 1_000_000_000),
                kill_at_ns: None,
            }
        } else {
            let s = if linked {
                self.cfg.restart_signal
            } else {
                libc::SIGTERM
            };
            send_signal(pid, s);
            self.events.emit(
                ev("signal")
                    .i("pid", pid as i64)
                    .s("signal", sig_name(s))
                    .s("reason", &reason),
            );
            Ask {
                mode,
                signal_at_ns: None,
                kill_at_ns: Some(now + kill_ns),
            }
        };
        if let Some(a) = &mut self.app {
            a.ask = Some(ask);
        }
        Ok(())
    }

    fn begin_stop(&mut self, by: &str, code: i32) {
        let now = now_ns();
        if let Some(s) = &mut self.stopping {
            // asked again: no more waiting
            if let Some(a) = &self.app
                && !s.killed
            {
                s.killed = true;
                send_signal(a.pid, libc::SIGKILL);
                send_signal(-a.pid, libc::SIGKILL);
            }
            return;
        }
        self.next_spawn = None;
        match &self.app {
            Some(a) => {
                send_signal(a.pid, libc::SIGTERM);
                self.stopping = Some(Stopping {
                    deadline_ns: now + dur_ns(self.cfg.stop_timeout),
                    killed: false,
                    by: by.to_string(),
                    code,
                });
                if let Some(sd) = &self.systemd {
                    let _ = sd.send("STOPPING=1", &[]);
                }
            }
            None => {
                self.events.emit(ev("stop").s("by", by));
                self.stopping = Some(Stopping {
                    deadline_ns: now,
                    killed: true,
                    by: by.to_string(),
                    code,
                });
                self.exit = Some(code);
            }
        }
    }

    // ---- the app's socket ------------------------------------------------------

    fn on_app_readable(&mut self, hup: bool) {
        self.read_app(|me, r| match r {
            Ok(Recv::WouldBlock) => {
                if hup {
                    me.close_app_sock();
                }
                false
            }
            Ok(Recv::Empty) => {
                if hup {
                    me.close_app_sock();
                    return false;
                }
                me.reply_error("empty message");
                true
            }
            _ => {
                me.close_app_sock();
                false
            }
        });
    }

    /// Reads what the app sent before it died.
    fn drain_app(&mut self) {
        self.read_app(|_, _| false);
    }

    /// Up to 256 receives from the app's socket: messages go to
    /// on_app_message; anything else to `other`, which says whether to go on.
    fn read_app(&mut self, mut other: impl FnMut(&mut Self, std::io::Result<Recv>) -> bool) {
        for _ in 0..256 {
            let Some(sock) = self.app.as_ref().and_then(|a| a.sock.as_ref()) else {
                return;
            };
            match app_link::recv(sock.as_fd()) {
                Ok(Recv::Msg {
                    data,
                    fds,
                    truncated,
                }) => self.on_app_message(&data, fds, truncated),
                r => {
                    if !other(self, r) {
                        return;
                    }
                }
            }
        }
    }

    fn close_app_sock(&mut self) {
        if let Some(a) = &mut self.app {
            a.sock = None;
        }
    }

    fn reply_error(&mut self, what: &str) {
        let Some(a) = &mut self.app else { return };
        a.bad_messages += 1;
        let n = a.bad_messages;
        if let Some(sock) = &a.sock {
            let _ = app_link::send(
                sock.as_fd(),
                &proto::encode_sup(&SupMsg::Error(what.to_string())),
                &[],
            );
        }
        if n <= 20 {
            self.events.emit(
                ev("error")
                    .s("what", "malformed message from the app")
                    .s("error", what),
            );
        } else if n == 21 {
            self.events.emit(ev("error").s(
                "what",
                "more malformed messages from the app; no longer logged",
            ));
        }
    }

    fn on_app_message(&mut self, data: &[u8], fds: Vec<OwnedFd>, truncated: bool) {
        if truncated {
            self.reply_error(&format!(
                "message longer than {} bytes or with too many fds",
                proto::MSG_MAX
            ));
            return; // fds dropped: closed
        }
        let msg = match proto::parse_app(data, fds.len()) {
            Ok(m) => m,
            Err(e) => {
                self.reply_error(&e.to_string());
                return;
            }
        };
        self.ever_linked = true;
        match msg {
            AppMsg::Attach { pid } => self.on_attach(pid),
            AppMsg::Hello(h) => self.on_hello(h),
            AppMsg::Fds(entries) => self.on_fds(entries, fds),
            AppMsg::Restarting(r) => self.on_restarting(r),
            AppMsg::Ready { .. } => self.on_ready("socket"),
            AppMsg::RestartFailed { errno, generation } => {
                self.on_restart_failed(errno, generation)
            }
        }
    }

    /// The app's in-place exec failed and it carries on: watch it again
    /// (hangs, leaks, restart requests) as before its RESTARTING.
    fn on_restart_failed(&mut self, errno: i32, generation: u32) {
        let Some(a) = &mut self.app else { return };
        let was_in_place = a.in_place;
        a.in_place = false;
        a.noted = None;
        a.ask = None;
        self.pending = None;
        self.events.emit(
            ev("restart_failed")
                .i("errno", errno as i64)
                .u("generation", generation as u64)
                .s(
                    "what",
                    if was_in_place {
                        "the in-place exec failed; the app carries on, watched as before"
                    } else {
                        "RESTART_FAILED without a restart under way"
                    },
                ),
        );
    }

    fn on_attach(&mut self, pid: u32) {
        let Some(a) = &mut self.app else { return };
        if a.attach_answered {
            self.reply_error("ATTACH already answered for this incarnation");
            return;
        }
        a.attach_answered = true;
        if pid != a.pid as u32 {
            let apid = a.pid;
            self.events.emit(ev("error").s(
                "what",
                format!("ATTACH from pid {pid}, the app is pid {apid}"),
            ));
        }
        let Some(a) = &self.app else { return };
        let p = &a.plan;
        let inh = Inherit {
            mode: p.mode,
            generation: p.generation,
            signal: p.signal,
            t_detect_ns: p.t_detect_ns,
            reason: p.reason.clone(),
            decision: p.decision.clone(),
            dropped: p.dropped,
        };
        let bytes = proto::encode_sup(&SupMsg::Inherit(inh));
        let fds: Vec<BorrowedFd<'_>> = if p.mode == StartKind::Warm {
            self.held.iter().map(|h| h.fd.as_fd()).collect()
        } else {
            Vec::new()
        };
        let r = match &a.sock {
            Some(s) => app_link::send(s.as_fd(), &bytes, &fds),
            None => Ok(false),
        };
        let nfds = fds.len();
        drop(fds);
        match r {
            Ok(true) => self.events.emit(
                ev("inherit")
                    .s("mode", p_mode_str(self.app.as_ref()))
                    .u("generation", self.generation as u64)
                    .u("fds", nfds as u64),
            ),
            Ok(false) => self
                .events
                .emit(ev("error").s("what", "INHERIT not sent: socket full")),
            Err(e) => self
                .events
                .emit(ev("error").s("what", format!("INHERIT not sent: {e}"))),
        }
    }

    fn on_hello(&mut self, h: Hello) {
        let now = now_ns();
        let Some(a) = &mut self.app else { return };
        let second = a.hello;
        if h.pid != a.pid as u32 {
            let apid = a.pid;
            self.events.emit(ev("error").s(
                "what",
                format!("HELLO from pid {}, the app is pid {apid}", h.pid),
            ));
        }
        let Some(a) = &mut self.app else { return };
        if second && !a.in_place {
            // an in-place restart whose RESTARTING was lost
            let kind = match &a.noted {
                Some(n) => n.kind,
                None if h.reason.starts_with("signal ") => "signal",
                None => "request",
            };
            let gave_up = if a.noted.is_none() {
                self.note_failure(kind, 0, None, &h.reason, true)
            } else {
                false
            };
            if gave_up {
                return;
            }
            let t_detect = self
                .app
                .as_ref()
                .and_then(|a| a.noted.as_ref())
                .map(|n| n.t_detect_ns)
                .unwrap_or(now);
            self.emit_decision(h.kind.as_str(), &h.decision, "in-place", kind);
            self.pending = Some(Pending {
                path: "in-place",
                failure: kind,
                t_failure_ns: None,
                t_detect_ns: t_detect,
                decided: if h.kind == StartKind::Warm {
                    Mode::Warm
                } else {
                    Mode::Cold
                },
            });
        }
        let Some(a) = &mut self.app else { return };
        a.hello = true;
        a.ready = false;
        a.generation = h.generation;
        a.start_kind = h.kind;
        if second {
            a.started_ns = now;
        }
        a.noted = None;
        a.ask = None;
        a.in_place = false;
        let pid = a.pid;
        self.generation = h.generation;
        self.preserved_bytes = h.preserved_bytes;
        self.metrics.preserved_bytes.set(h.preserved_bytes as i64);
        self.metrics.generation.set(h.generation as i64);
        self.events.emit(
            ev("up")
                .i("pid", pid as i64)
                .u("generation", h.generation as u64)
                .s("kind", h.kind.as_str())
                .s("reason", &h.reason)
                .s("decision", &h.decision)
                .u("restart_us", h.restart_ns / 1000)
                .u("preserved_bytes", h.preserved_bytes)
                .u("narenas", h.narenas as u64),
        );
        if let Some(p) = self.pending.take() {
            self.emit_restart(p, h.kind, now, h.preserved_bytes);
        }
        if !self.sd_ready_sent {
            if let Some(sd) = &self.systemd {
                let _ = sd.send("READY=1\nSTATUS=running", &[]);
            }
            self.sd_ready_sent = true;
        }
    }

    fn on_fds(&mut self, entries: Vec<proto::FdEntry>, fds: Vec<OwnedFd>) {
        if !entries.iter().any(|e| e.kind == FdKind::Manifest) {
            self.reply_error("FDS without a manifest entry");
            return;
        }
        if let Some(i) = fds
            .iter()
            .position(|f| !crate::arena::is_rekindle_memfd(f.as_fd()))
        {
            self.reply_error(&format!(
                "FDS: fd {i} ({}) is not a rekindle memfd",
                entries[i].name
            ));
            return; // the set held so far stays
        }
        let new: Vec<Held> = entries
            .into_iter()
            .zip(fds)
            .map(|(e, fd)| Held {
                kind: e.kind,
                name: e.name,
                fd,
            })
            .collect();
        self.held = new; // the old set is closed here
        self.sort_held();
        let arenas: Vec<&str> = self
            .held
            .iter()
            .filter(|h| h.kind == FdKind::Arena)
            .map(|h| h.name.as_str())
            .collect();
        let ranges = self.held.iter().filter(|h| h.kind == FdKind::Range).count();
        self.events.emit(
            ev("fds")
                .u("count", self.held.len() as u64)
                .v("arenas", arenas)
                .u("ranges", ranges as u64),
        );
        self.sd_store();
    }

    fn on_restarting(&mut self, r: Restarting) {
        let now = now_ns();
        let Some(a) = &self.app else { return };
        if a.in_place {
            self.reply_error("RESTARTING while a restart is already under way");
            return;
        }
        let noted = a.noted.clone();
        let kind = match &noted {
            Some(n) => n.kind,
            None => {
                let kind = if r.signal != 0 { "signal" } else { "request" };
                if self.note_failure(kind, r.signal, None, &r.reason, true) {
                    return;
                }
                kind
            }
        };
        let t_detect = noted.as_ref().map(|n| n.t_detect_ns).unwrap_or(now);
        let t_failure = noted.and_then(|n| n.t_failure_ns).unwrap_or(r.t_ns);
        let mode = if r.warm { Mode::Warm } else { Mode::Cold };
        self.emit_decision(mode.as_str(), &r.decision, "in-place", kind);
        if let Some(a) = &mut self.app {
            a.in_place = true;
            // our request was taken: no signal now, but a deadline for the HELLO
            let kill_at = now + dur_ns(self.cfg.kill_timeout);
            if let Some(ask) = &mut a.ask {
                ask.signal_at_ns = None;
                ask.kill_at_ns = Some(ask.kill_at_ns.map_or(kill_at, |t| t.min(kill_at)));
            }
        }
        self.pending = Some(Pending {
            path: "in-place",
            failure: kind,
            t_failure_ns: Some(t_failure.min(t_detect)),
            t_detect_ns: t_detect,
            decided: mode,
        });
    }

    fn on_ready(&mut self, via: &str) {
        let now = now_ns();
        let Some(a) = &mut self.app else { return };
        if a.ready {
            return;
        }
        a.ready = true;
        let (pid, generation) = (a.pid, a.generation);
        let ready_us = self
            .ready_wait
            .take()
            .map(|t| clock::us(now.saturating_sub(t)));
        self.events.emit(
            ev("ready")
                .i("pid", pid as i64)
                .u("generation", generation as u64)
                .s("via", via)
                .opt("ready_us", ready_us),
        );
        if !self.sd_ready_sent {
            if let Some(sd) = &self.systemd {
                let _ = sd.send("READY=1\nSTATUS=running", &[]);
            }
            self.sd_ready_sent = true;
        }
    }

    // ---- sd_notify from the app ------------------------------------------------

    fn on_notify(&mut self) {
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        for _ in 0..64 {
            let Some(n) = &self.app_notify else { return };
            let (_pid, uid, data) = match n.recv() {
                Ok(Some(x)) => x,
                _ => return,
            };
            if uid != me && uid != 0 {
                continue;
            }
            for notice in notify::parse_notify(&data) {
                match notice {
                    Notice::Ready => self.on_ready("notify"),
                    Notice::Watchdog => {
                        if let Some(a) = &mut self.app {
                            a.last_watchdog_ns = now_ns();
                        }
                    }
                    Notice::Status(s) => {
                        if let Some(sd) = &self.systemd {
                            let _ = sd.send(&format!("STATUS={s}"), &[]);
                        }
                        self.app_status = Some(s);
                    }
                    Notice::Stopping | Notice::Other(_) => {}
                }
            }
        }
    }

    // ---- systemd fd store ------------------------------------------------------

    fn sd_store(&mut self) {
        let Some(sd) = &self.systemd else { return };
        for name in self.sd_stored.drain(..) {
            let _ = sd.send(&format!("FDSTOREREMOVE=1\nFDNAME={name}"), &[]);
        }
        for h in &self.held {
            let name = notify::fdname(h.kind, &h.name);
            if sd
                .send(&format!("FDSTORE=1\nFDNAME={name}"), &[h.fd.as_fd()])
                .is_ok()
            {
                self.sd_stored.push(name);
            }
        }
    }

    fn drop_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        self.held.clear();
        self.sd_store();
    }

    // ---- control socket ----------------------------------------------------------

    fn on_control_client(&mut self, id: u64) {
        let reqs = match self.control.client_mut(id) {
            Some(c) => {
                c.flush();
                c.read()
            }
            None => return,
        };
        for r in reqs {
            let reply = match r {
                Err(e) => error_reply(&e.to_string()),
                Ok(Request::Status) => self.status(),
                Ok(Request::Restart(mode)) => {
                    let reason = format!("supervisor: rekindle restart --{}", mode.as_str());
                    match self.ask_restart(mode, reason, "request", false) {
                        Ok(()) => json!({"ok": true, "mode": mode.as_str(),
                                          "pid": self.app.as_ref().map(|a| a.pid)}),
                        Err(e) => error_reply(&e),
                    }
                }
                Ok(Request::Stop) => {
                    if let Some(c) = self.control.client_mut(id) {
                        c.hold_open = true; // closes when the supervisor exits
                    }
                    self.begin_stop("rekindle stop", 0);
                    json!({"ok": true, "stopping": true})
                }
            };
            if let Some(c) = self.control.client_mut(id) {
                c.queue(&reply);
                c.flush();
            }
        }
    }

    fn status(&self) -> Value {
        let now = now_ns();
        let state = if self.stopping.is_some() {
            "stopping"
        } else if let Some(a) = &self.app {
            if a.in_place || a.ask.is_some() || a.noted.is_some() {
                "restarting"
            } else if a.ready {
                "ready"
            } else if a.hello {
                "running"
            } else {
                "starting"
            }
        } else if self.next_spawn.is_some() {
            "backoff"
        } else {
            "exited"
        };
        let hb = self.app.as_ref().and_then(|a| {
            let h = if self.ctl.pid() == a.pid as u32 {
                self.ctl.heartbeat_ns()
            } else {
                0
            };
            let h = h.max(a.last_watchdog_ns);
            (h != 0).then(|| clock::ms(now.saturating_sub(h)))
        });
        let held: Vec<Value> = self
            .held
            .iter()
            .map(|h| json!({"kind": h.kind.as_str(), "name": h.name}))
            .collect();
        let args: Vec<String> = self
            .cfg
            .args
            .iter()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        json!({
            "ok": true,
            "name": self.cfg.name,
            "supervisor_pid": std::process::id(),
            "state": state,
            "pid": self.app.as_ref().map(|a| a.pid),
            "generation": self.generation,
            "kind": self.app.as_ref().map(|a| a.start_kind.as_str()),
            "uptime_ms": self.app.as_ref().map(|a| clock::ms(now.saturating_sub(a.started_ns))),
            "supervisor_uptime_ms": clock::ms(now.saturating_sub(self.started_ns)),
            "started": self.started_wall,
            "linked": self.ever_linked,
            "ready": self.app.as_ref().is_some_and(|a| a.ready),
            "heartbeat_age_ms": hb,
            "restarts": {"warm": self.restarts_warm, "cold": self.restarts_cold,
                          "total": self.restarts_warm + self.restarts_cold},
            "failures": self.failures,
            "consecutive_failures": self.consecutive,
            "last_failure": self.last_failure,
            "last_decision": self.last_decision,
            "preserved_bytes": self.preserved_bytes,
            "control_block": {"ok": self.ctl_damage.is_none(),
                              "damage": self.ctl_damage.map(|d| d.describe()),
                              "corruptions": self.ctl_corruptions},
            "held_fds": held,
            "next_start_ms": self.next_spawn.as_ref().map(|(t, _)| clock::ms(t.saturating_sub(now))),
            "program": self.cfg.program_path.to_string_lossy(),
            "args": args,
            "app_status": self.app_status,
            "socket": self.control.path().to_string_lossy(),
        })
    }
}

fn p_mode_str(a: Option<&App>) -> &'static str {
    a.map(|a| a.plan.mode.as_str()).unwrap_or("fresh")
}

/// fds 0, 1 and 2 must be open, or a socket could land there.
fn ensure_stdio() {
    for fd in 0..3 {
        // SAFETY: fcntl probe, then open of /dev/null onto the lowest free fd.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFD) < 0 {
                libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            }
        }
    }
}

/// The `--listen unix:PATH` socket files we bound, by inode: removed at
/// exit, and on a failed start (Drop), if they are still ours.
#[derive(Default)]
struct UnixListenFiles(Vec<(std::path::PathBuf, u64)>);

impl UnixListenFiles {
    fn add(&mut self, p: &std::path::Path) {
        use std::os::unix::fs::MetadataExt;
        if let Ok(md) = std::fs::symlink_metadata(p) {
            self.0.push((p.to_path_buf(), md.ino()));
        }
    }

    fn remove_all(&mut self) {
        use std::os::unix::fs::MetadataExt;
        for (p, ino) in self.0.drain(..) {
            if std::fs::symlink_metadata(&p).map(|m| m.ino()).ok() == Some(ino) {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
}

impl Drop for UnixListenFiles {
    fn drop(&mut self) {
        self.remove_all();
    }
}

fn bind_listen(a: &ListenAddr) -> Result<OwnedFd> {
    match a {
        ListenAddr::Tcp(addr) => {
            let l =
                std::net::TcpListener::bind(addr).with_context(|| format!("--listen {addr}"))?;
            Ok(OwnedFd::from(l))
        }
        ListenAddr::Unix(p) => {
            use std::os::unix::fs::FileTypeExt;
            if let Ok(md) = std::fs::symlink_metadata(p)
                && md.file_type().is_socket()
            {
                let _ = std::fs::remove_file(p);
            }
            let l = std::os::unix::net::UnixListener::bind(p)
                .with_context(|| format!("--listen unix:{}", p.display()))?;
            Ok(OwnedFd::from(l))
        }
    }
}
