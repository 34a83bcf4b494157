//! The running app's lifecycle as the supervisor sees it: [`AppState`] and
//! its transitions, pure (no I/O; times come in as arguments) and
//! unit-tested, like `decide.rs`.
//!
//! Each transition changes the state and says what happened; the effects
//! (events, metrics, signals, the respawn) are the supervisor's.  Noting a
//! failure is one of them, since it may make the supervisor give up: a
//! transition that needs a failure noted first says so (`Unnoted`) and
//! changes nothing, and the caller notes it ([`AppState::fail`]) and offers
//! the input again.
//!
//! Over 600 lines: half of it is the unit tests of the transitions and of
//! the restart delivery, kept beside the code they pin down.

use crate::decide::Mode;
use crate::failure::{Failure, FailureKind};
use crate::signame;

/// How a restart happens: the runtime re-executes the process in place, or
/// the supervisor spawns a new one after a death.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPath {
    Respawn,
    InPlace,
}

impl RestartPath {
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPath::Respawn => "respawn",
            RestartPath::InPlace => "in-place",
        }
    }
}

/// A restart the supervisor asked for (hang, leak, `rekindle restart`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub mode: Mode,
    /// When to send the restart signal if no heartbeat took the request.
    pub signal_at_ns: Option<u64>,
    /// When to SIGKILL if no new HELLO came.
    pub kill_at_ns: Option<u64>,
}

/// Why a restart is under way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// The failure is noted and nothing was asked of the app: the supervisor
    /// gave up on it and is stopping the app.
    Noted,
    /// The supervisor asked for the restart and waits for the runtime.
    Asked(Ask),
    /// RESTARTING came: the app is re-executing itself, HELLO is due.  With
    /// `ask`, it took the supervisor's request, whose kill deadline stands.
    InPlace { ask: Option<Ask> },
}

/// A restart under way: at most one per incarnation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    /// HELLO came before it: the app runs the runtime (restart signal, not SIGTERM).
    pub linked: bool,
    pub ready: bool,
    pub failure: Failure,
    pub cause: Cause,
}

/// The app's state.  `ready` is in every state: an app without the runtime
/// never says HELLO, yet may say READY=1 on the sd_notify socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppState {
    /// Spawned; no HELLO yet.
    Starting { ready: bool },
    /// HELLO came; watched for hangs and leaks.
    Running { ready: bool },
    /// A failure was noted and the restart is under way.
    Restarting(Restart),
}

/// What a HELLO meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloOutcome {
    /// The first HELLO of this process (or of one that was asked to restart
    /// before it ever said HELLO): now Running.
    First,
    /// A second HELLO with no failure noted: an in-place restart whose
    /// RESTARTING was lost.  Note a failure of this kind, then offer again.
    Unnoted(FailureKind),
    /// A restart completed in place; now Running.  `lost_restarting`: its
    /// RESTARTING never came, so its decision was not reported yet.
    Restarted {
        failure: Failure,
        lost_restarting: bool,
    },
}

/// What a RESTARTING meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartingOutcome {
    /// An in-place restart is already under way: the message is an error.
    Refused,
    /// No failure noted: note one of this kind, then offer again.
    Unnoted(FailureKind),
    /// Now in place, restarting from this failure.
    InPlace(Failure),
}

/// A deadline of the supervisor's request that has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// No heartbeat took the request: send the restart signal.
    RestartSignal,
    /// The same for an app without the runtime: SIGTERM.
    Term,
    /// No HELLO within `--kill-timeout`: SIGKILL.
    Kill,
}

/// What the death of the process means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Death {
    /// The supervisor was stopping it: no respawn, whatever it was doing.
    Stopped,
    /// Exit status 0 with no failure noted: the app is done.
    Done,
    /// No failure noted: note this one, then ask again.
    Unnoted { kind: FailureKind, reason: String },
    /// Respawn after this failure.  `cold_requested`: `rekindle restart
    /// --cold` asked for it.  `at_once`: a restart the operator asked for
    /// skips the backoff.
    Failed {
        failure: Failure,
        cold_requested: bool,
        at_once: bool,
    },
}

/// Why the supervisor cannot ask for a restart now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Stopping,
    NoApp,
    Busy,
}

impl AppState {
    pub fn new() -> Self {
        AppState::Starting { ready: false }
    }

    /// HELLO came in this process: it runs the runtime.
    pub fn linked(&self) -> bool {
        match self {
            AppState::Starting { .. } => false,
            AppState::Running { .. } => true,
            AppState::Restarting(r) => r.linked,
        }
    }

    pub fn ready(&self) -> bool {
        match self {
            AppState::Starting { ready } | AppState::Running { ready } => *ready,
            AppState::Restarting(r) => r.ready,
        }
    }

    /// A restart is under way: no checks, no second request, not healthy.
    pub fn busy(&self) -> bool {
        matches!(self, AppState::Restarting(_))
    }

    pub fn failure(&self) -> Option<&Failure> {
        match self {
            AppState::Restarting(r) => Some(&r.failure),
            _ => None,
        }
    }

    pub fn failure_mut(&mut self) -> Option<&mut Failure> {
        match self {
            AppState::Restarting(r) => Some(&mut r.failure),
            _ => None,
        }
    }

    /// The supervisor's request under way, if any.
    pub fn ask(&self) -> Option<&Ask> {
        match self {
            AppState::Restarting(Restart {
                cause: Cause::Asked(a) | Cause::InPlace { ask: Some(a) },
                ..
            }) => Some(a),
            _ => None,
        }
    }

    fn ask_mut(&mut self) -> Option<&mut Ask> {
        match self {
            AppState::Restarting(Restart {
                cause: Cause::Asked(a) | Cause::InPlace { ask: Some(a) },
                ..
            }) => Some(a),
            _ => None,
        }
    }

    pub fn in_place(&self) -> bool {
        matches!(
            self,
            AppState::Restarting(Restart {
                cause: Cause::InPlace { .. },
                ..
            })
        )
    }

    /// A hang is being handled: the systemd watchdog is not fed meanwhile.
    pub fn hung(&self) -> bool {
        self.failure().is_some_and(|f| f.kind == FailureKind::Hang)
    }

    /// The `state` word of `rekindle status` for a running process.
    pub fn status_word(&self) -> &'static str {
        match self {
            AppState::Restarting(_) => "restarting",
            s if s.ready() => "ready",
            AppState::Running { .. } => "running",
            AppState::Starting { .. } => "starting",
        }
    }

    /// Notes the incarnation's failure: Restarting, nothing asked yet.
    /// False (and nothing changes) if one is noted already: one failure
    /// per incarnation.
    pub fn fail(&mut self, failure: Failure) -> bool {
        let (linked, ready) = match self {
            AppState::Restarting(_) => return false,
            AppState::Starting { ready } => (false, *ready),
            AppState::Running { ready } => (true, *ready),
        };
        *self = AppState::Restarting(Restart {
            linked,
            ready,
            failure,
            cause: Cause::Noted,
        });
        true
    }

    /// The supervisor asked for the restart of the failure it just noted.
    /// False if there is no such failure (or it asked already).
    pub fn ask_restart(&mut self, ask: Ask) -> bool {
        match self {
            AppState::Restarting(r) if r.cause == Cause::Noted => {
                r.cause = Cause::Asked(ask);
                true
            }
            _ => false,
        }
    }

    /// RESTARTING from the app: its exec is next.  A request of ours that it
    /// took needs no signal now, but its HELLO is due within `kill_ns`.
    pub fn on_restarting(&mut self, signaled: bool, now: u64, kill_ns: u64) -> RestartingOutcome {
        let r = match self {
            AppState::Restarting(r) => r,
            _ => return RestartingOutcome::Unnoted(FailureKind::of_app_restart(signaled)),
        };
        let ask = match &mut r.cause {
            Cause::InPlace { .. } => return RestartingOutcome::Refused,
            Cause::Noted => None,
            Cause::Asked(a) => {
                let kill_at = now.saturating_add(kill_ns);
                a.signal_at_ns = None;
                a.kill_at_ns = Some(a.kill_at_ns.map_or(kill_at, |t| t.min(kill_at)));
                Some(a.clone())
            }
        };
        r.cause = Cause::InPlace { ask };
        RestartingOutcome::InPlace(r.failure.clone())
    }

    /// HELLO from the app.  `signaled`: its reason names a signal ("signal
    /// SIGSEGV"), which is the kind of a restart it did by itself.
    pub fn on_hello(&mut self, signaled: bool) -> HelloOutcome {
        let out = match self {
            AppState::Starting { .. } => HelloOutcome::First,
            AppState::Restarting(r) if !r.linked => HelloOutcome::First,
            AppState::Running { .. } => {
                return HelloOutcome::Unnoted(FailureKind::of_app_restart(signaled));
            }
            AppState::Restarting(r) => HelloOutcome::Restarted {
                failure: r.failure.clone(),
                lost_restarting: !matches!(r.cause, Cause::InPlace { .. }),
            },
        };
        *self = AppState::Running { ready: false };
        out
    }

    /// READY (socket or sd_notify).  True if it was not ready yet.
    pub fn on_ready(&mut self) -> bool {
        let ready = match self {
            AppState::Starting { ready } | AppState::Running { ready } => ready,
            AppState::Restarting(r) => &mut r.ready,
        };
        !std::mem::replace(ready, true)
    }

    /// RESTART_FAILED: the exec failed and the app carries on; watch it as
    /// before, and forget the request.  True if an in-place restart was
    /// under way (else the message came out of turn).
    pub fn on_restart_failed(&mut self) -> bool {
        let AppState::Restarting(r) = self else {
            return false;
        };
        let was_in_place = matches!(r.cause, Cause::InPlace { .. });
        *self = if r.linked {
            AppState::Running { ready: r.ready }
        } else {
            AppState::Starting { ready: r.ready }
        };
        was_in_place
    }

    /// The earliest deadline of the supervisor's request, for the poll timeout.
    pub fn next_deadline(&self) -> Option<u64> {
        let a = self.ask()?;
        [a.signal_at_ns, a.kill_at_ns].into_iter().flatten().min()
    }

    /// The request's deadlines that have come by `now`, in order: the
    /// signal (which starts the `kill_ns` wait for HELLO), then SIGKILL.
    pub fn take_due(&mut self, now: u64, kill_ns: u64) -> Vec<Due> {
        let linked = self.linked();
        let Some(a) = self.ask_mut() else {
            return Vec::new();
        };
        let mut due = Vec::new();
        if a.signal_at_ns.is_some_and(|t| now >= t) {
            a.signal_at_ns = None;
            a.kill_at_ns = Some(now.saturating_add(kill_ns));
            due.push(if linked {
                Due::RestartSignal
            } else {
                Due::Term
            });
        }
        if a.kill_at_ns.is_some_and(|t| now >= t) {
            a.kill_at_ns = None;
            due.push(Due::Kill);
        }
        due
    }

    /// The process died (`signal` 0: it exited with `code`).
    pub fn on_death(&self, stopping: bool, signal: i32, code: Option<i32>) -> Death {
        if stopping {
            return Death::Stopped;
        }
        let AppState::Restarting(r) = self else {
            if code == Some(0) {
                return Death::Done;
            }
            return match code {
                Some(c) => Death::Unnoted {
                    kind: FailureKind::Exit,
                    reason: format!("exit {c}"),
                },
                None => Death::Unnoted {
                    kind: FailureKind::Signal,
                    reason: format!("signal {}", signame::name(signal)),
                },
            };
        };
        let ask = self.ask();
        Death::Failed {
            failure: r.failure.clone(),
            cold_requested: ask.is_some_and(|a| a.mode == Mode::Cold),
            at_once: r.failure.kind == FailureKind::Request && ask.is_some(),
        }
    }
}

impl Default for AppState {
    fn default() -> Self {
        Self::new()
    }
}

/// The app's heartbeat as the control block shows it when the supervisor
/// asks for a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// CLOCK_MONOTONIC of the last `rk_heartbeat()`; 0: none in this incarnation.
    pub last_ns: u64,
    /// `rk_heartbeat()` calls in this incarnation.
    pub count: u64,
    /// When the incarnation started.
    pub since_ns: u64,
}

impl Beat {
    /// The mean time between beats since the start, if it beat since.
    fn period_ns(&self) -> Option<u64> {
        (self.count > 0 && self.last_ns > self.since_ns)
            .then(|| (self.last_ns - self.since_ns) / self.count)
    }
}

/// The longest an app that beats is left to take a request at a heartbeat.
pub const HEARTBEAT_GRACE_NS: u64 = 1_000_000_000;

/// How a restart request reaches the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// It beats: the request waits for its next `rk_heartbeat()`, a safe
    /// point, and the restart signal goes at `signal_at_ns` if none took it.
    AtHeartbeat { signal_at_ns: u64 },
    /// The restart signal now (SIGTERM for an app without the runtime).
    SignalNow,
}

/// How to deliver a restart request.  The restart signal is always safe
/// (the runtime acts on it from wherever the app is, with the same checks
/// as after a fault); the heartbeat is preferred only for an app that
/// beats, since it restarts at a point the app chose.  An app that does
/// not beat gets the signal at once: one that is hung, never beat, has not
/// beaten for `check_interval_ns`, or has missed two of its usual beats
/// and sits in the kernel waiting (`blocked`, asked only then: it reads
/// /proc).  Otherwise the signal waits until the heartbeat has been still
/// for `check_interval_ns`, and at most [`HEARTBEAT_GRACE_NS`].
pub fn delivery(
    kind: FailureKind,
    linked: bool,
    beat: Beat,
    now: u64,
    check_interval_ns: u64,
    blocked: impl FnOnce() -> bool,
) -> Delivery {
    if kind == FailureKind::Hang || !linked || beat.last_ns == 0 {
        return Delivery::SignalNow;
    }
    let age = now.saturating_sub(beat.last_ns);
    if age >= check_interval_ns {
        return Delivery::SignalNow;
    }
    if beat.period_ns().is_some_and(|p| age >= p.saturating_mul(2)) && blocked() {
        return Delivery::SignalNow;
    }
    Delivery::AtHeartbeat {
        signal_at_ns: now
            .saturating_add(HEARTBEAT_GRACE_NS)
            .min(beat.last_ns.saturating_add(check_interval_ns)),
    }
}

/// Whether the supervisor may ask for a restart now.
pub fn ask_refusal(stopping: bool, app: Option<&AppState>) -> Option<Refusal> {
    match app {
        _ if stopping => Some(Refusal::Stopping),
        None => Some(Refusal::NoApp),
        Some(s) if s.busy() => Some(Refusal::Busy),
        Some(_) => None,
    }
}

/// The `state` of `rekindle status`.
pub fn status_word(stopping: bool, app: Option<&AppState>, spawn_planned: bool) -> &'static str {
    match app {
        _ if stopping => "stopping",
        Some(s) => s.status_word(),
        None if spawn_planned => "backoff",
        None => "exited",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KILL: u64 = 1_000;

    fn failure(kind: FailureKind, t: u64) -> Failure {
        Failure {
            kind,
            reason: format!("{} at {t}", kind.as_str()),
            signal: 0,
            t_detect_ns: t,
            t_failure_ns: None,
        }
    }

    fn ask(mode: Mode, signal_at: Option<u64>, kill_at: Option<u64>) -> Ask {
        Ask {
            mode,
            signal_at_ns: signal_at,
            kill_at_ns: kill_at,
        }
    }

    /// Spawned, HELLO, READY.
    fn running() -> AppState {
        let mut s = AppState::new();
        assert_eq!(s.on_hello(false), HelloOutcome::First);
        assert!(s.on_ready());
        s
    }

    #[test]
    fn start_hello_ready() {
        let mut s = AppState::new();
        assert_eq!(s.status_word(), "starting");
        assert!(!s.linked() && !s.busy() && !s.ready());
        assert_eq!(s.on_hello(false), HelloOutcome::First);
        assert_eq!(s, AppState::Running { ready: false });
        assert_eq!(s.status_word(), "running");
        assert!(s.on_ready());
        assert!(!s.on_ready(), "READY twice is reported once");
        assert_eq!(s.status_word(), "ready");
        assert!(s.linked());
        assert_eq!(s.next_deadline(), None);
        assert_eq!(s.take_due(u64::MAX, KILL), vec![]);
    }

    #[test]
    fn ready_without_hello_is_an_app_without_the_runtime() {
        let mut s = AppState::new();
        assert!(s.on_ready());
        assert_eq!(s.status_word(), "ready");
        assert!(!s.linked());
        // a HELLO after all starts over: not ready until it says so again
        assert_eq!(s.on_hello(false), HelloOutcome::First);
        assert!(!s.ready());
    }

    #[test]
    fn second_hello_is_an_in_place_restart_whose_restarting_was_lost() {
        let mut s = running();
        assert_eq!(s.on_hello(true), HelloOutcome::Unnoted(FailureKind::Signal));
        assert_eq!(
            s,
            AppState::Running { ready: true },
            "unchanged until noted"
        );
        assert_eq!(
            s.on_hello(false),
            HelloOutcome::Unnoted(FailureKind::Request)
        );
        let f = failure(FailureKind::Signal, 5);
        assert!(s.fail(f.clone()));
        assert_eq!(s.status_word(), "restarting");
        assert_eq!(
            s.on_hello(true),
            HelloOutcome::Restarted {
                failure: f,
                lost_restarting: true
            }
        );
        assert_eq!(s, AppState::Running { ready: false });
    }

    #[test]
    fn restarting_then_hello() {
        let mut s = running();
        assert_eq!(
            s.on_restarting(false, 10, KILL),
            RestartingOutcome::Unnoted(FailureKind::Request)
        );
        assert_eq!(
            s.on_restarting(true, 10, KILL),
            RestartingOutcome::Unnoted(FailureKind::Signal)
        );
        let f = failure(FailureKind::Signal, 10);
        assert!(s.fail(f.clone()));
        assert_eq!(
            s.on_restarting(true, 10, KILL),
            RestartingOutcome::InPlace(f.clone())
        );
        assert!(s.in_place() && s.busy());
        assert_eq!(s.ask(), None);
        assert_eq!(
            s.next_deadline(),
            None,
            "the app's own restart has no deadline"
        );
        assert_eq!(s.on_restarting(true, 11, KILL), RestartingOutcome::Refused);
        assert_eq!(
            s.on_hello(true),
            HelloOutcome::Restarted {
                failure: f,
                lost_restarting: false
            }
        );
        assert!(!s.busy());
    }

    #[test]
    fn one_failure_per_incarnation() {
        let mut s = running();
        assert!(s.fail(failure(FailureKind::Leak, 1)));
        assert!(!s.fail(failure(FailureKind::Hang, 2)));
        assert_eq!(s.failure().map(|f| f.kind), Some(FailureKind::Leak));
        // and one request
        assert!(s.ask_restart(ask(Mode::Warm, Some(100), None)));
        assert!(!s.ask_restart(ask(Mode::Cold, None, Some(5))));
        assert_eq!(s.ask().map(|a| a.mode), Some(Mode::Warm));
        // no request without a failure
        let mut s = running();
        assert!(!s.ask_restart(ask(Mode::Warm, Some(100), None)));
        assert!(!s.busy());
    }

    #[test]
    fn request_taken_at_a_heartbeat() {
        let mut s = running();
        assert!(s.fail(failure(FailureKind::Leak, 0)));
        assert!(s.ask_restart(ask(Mode::Warm, Some(100), None)));
        assert_eq!(s.next_deadline(), Some(100));
        assert_eq!(s.take_due(99, KILL), vec![]);
        // RESTARTING at 50: no signal now, HELLO due by 50 + KILL
        assert!(matches!(
            s.on_restarting(false, 50, KILL),
            RestartingOutcome::InPlace(_)
        ));
        assert_eq!(s.ask(), Some(&ask(Mode::Warm, None, Some(50 + KILL))));
        assert_eq!(s.take_due(100, KILL), vec![], "no signal after all");
        assert!(matches!(
            s.on_hello(false),
            HelloOutcome::Restarted {
                lost_restarting: false,
                ..
            }
        ));
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn restarting_keeps_an_earlier_kill_deadline() {
        let mut s = running();
        assert!(s.fail(failure(FailureKind::Hang, 0)));
        assert!(s.ask_restart(ask(Mode::Warm, None, Some(300))));
        assert!(matches!(
            s.on_restarting(true, 200, KILL),
            RestartingOutcome::InPlace(_)
        ));
        assert_eq!(s.next_deadline(), Some(300));
        assert_eq!(s.take_due(300, KILL), vec![Due::Kill]);
        assert_eq!(s.next_deadline(), None);
        assert!(s.busy(), "still restarting until the death");
    }

    #[test]
    fn request_not_taken_signal_then_kill() {
        let mut s = running();
        assert!(s.fail(failure(FailureKind::Request, 0)));
        assert!(s.ask_restart(ask(Mode::Warm, Some(100), None)));
        assert_eq!(s.take_due(150, KILL), vec![Due::RestartSignal]);
        assert_eq!(s.next_deadline(), Some(150 + KILL));
        assert_eq!(s.take_due(150 + KILL - 1, KILL), vec![]);
        assert_eq!(s.take_due(150 + KILL, KILL), vec![Due::Kill]);
        assert_eq!(s.take_due(u64::MAX, KILL), vec![]);
        // with no kill timeout both come at once
        let mut s = running();
        assert!(s.fail(failure(FailureKind::Request, 0)));
        assert!(s.ask_restart(ask(Mode::Warm, Some(100), None)));
        assert_eq!(s.take_due(100, 0), vec![Due::RestartSignal, Due::Kill]);
    }

    #[test]
    fn an_app_without_the_runtime_gets_sigterm_and_may_still_say_hello() {
        let mut s = AppState::new();
        assert!(s.fail(failure(FailureKind::Leak, 0)));
        assert!(s.ask_restart(ask(Mode::Warm, Some(10), None)));
        assert_eq!(s.take_due(10, KILL), vec![Due::Term]);
        // it was only slow: its first HELLO ends the restart, nothing to report
        assert_eq!(s.on_hello(false), HelloOutcome::First);
        assert_eq!(s, AppState::Running { ready: false });
    }

    #[test]
    fn restart_failed_goes_back_to_watching() {
        let mut s = running();
        assert!(s.fail(failure(FailureKind::Request, 0)));
        assert!(s.ask_restart(ask(Mode::Cold, Some(100), None)));
        assert!(matches!(
            s.on_restarting(false, 20, KILL),
            RestartingOutcome::InPlace(_)
        ));
        assert!(s.on_restart_failed());
        assert_eq!(s, AppState::Running { ready: true }, "ready as before");
        assert_eq!(s.next_deadline(), None, "the request is forgotten");
        // and it can be asked again
        assert_eq!(ask_refusal(false, Some(&s)), None);
        // out of turn: nothing changes
        assert!(!s.on_restart_failed());
        assert_eq!(s, AppState::Running { ready: true });
        // a failed restart asked of a supervisor's noted failure, not in place
        assert!(s.fail(failure(FailureKind::Leak, 1)));
        assert!(!s.on_restart_failed());
        assert!(!s.busy());
    }

    #[test]
    fn death_of_a_running_app() {
        let s = running();
        assert_eq!(s.on_death(false, 0, Some(0)), Death::Done);
        assert_eq!(
            s.on_death(false, 0, Some(3)),
            Death::Unnoted {
                kind: FailureKind::Exit,
                reason: "exit 3".into()
            }
        );
        assert_eq!(
            s.on_death(false, libc::SIGKILL, None),
            Death::Unnoted {
                kind: FailureKind::Signal,
                reason: "signal SIGKILL".into()
            }
        );
    }

    #[test]
    fn death_while_restarting() {
        // asked (rekindle restart --cold), then killed: cold, no backoff
        let mut s = running();
        let f = failure(FailureKind::Request, 7);
        assert!(s.fail(f.clone()));
        assert!(s.ask_restart(ask(Mode::Cold, None, Some(9))));
        assert_eq!(
            s.on_death(false, libc::SIGKILL, None),
            Death::Failed {
                failure: f.clone(),
                cold_requested: true,
                at_once: true
            }
        );
        // even a clean exit is a failure once one is noted
        assert!(matches!(
            s.on_death(false, 0, Some(0)),
            Death::Failed { .. }
        ));
        // a hang restart keeps the backoff
        let mut s = running();
        assert!(s.fail(failure(FailureKind::Hang, 7)));
        assert!(s.ask_restart(ask(Mode::Warm, None, Some(9))));
        assert!(matches!(
            s.on_death(false, libc::SIGKILL, None),
            Death::Failed {
                cold_requested: false,
                at_once: false,
                ..
            }
        ));
        // the app's own rk_restart() that died in its exec: not asked, backoff
        let mut s = running();
        assert!(s.fail(failure(FailureKind::Request, 7)));
        assert!(matches!(
            s.on_restarting(false, 8, KILL),
            RestartingOutcome::InPlace(_)
        ));
        assert!(matches!(
            s.on_death(false, libc::SIGSEGV, None),
            Death::Failed { at_once: false, .. }
        ));
    }

    #[test]
    fn stop_while_restarting() {
        let mut s = running();
        assert!(s.fail(failure(FailureKind::Leak, 0)));
        assert!(s.ask_restart(ask(Mode::Warm, Some(5), None)));
        assert_eq!(ask_refusal(true, Some(&s)), Some(Refusal::Stopping));
        assert_eq!(status_word(true, Some(&s), false), "stopping");
        assert_eq!(s.on_death(true, libc::SIGTERM, None), Death::Stopped);
        assert_eq!(running().on_death(true, 0, Some(0)), Death::Stopped);
    }

    #[test]
    fn refusals_and_status_words() {
        let s = running();
        assert_eq!(ask_refusal(false, Some(&s)), None);
        assert_eq!(ask_refusal(false, None), Some(Refusal::NoApp));
        assert_eq!(ask_refusal(true, None), Some(Refusal::Stopping));
        let mut b = running();
        assert!(b.fail(failure(FailureKind::Leak, 0)));
        assert_eq!(ask_refusal(false, Some(&b)), Some(Refusal::Busy));
        assert_eq!(status_word(false, Some(&s), true), "ready");
        assert_eq!(status_word(false, Some(&b), false), "restarting");
        assert_eq!(status_word(false, None, true), "backoff");
        assert_eq!(status_word(false, None, false), "exited");
        assert_eq!(status_word(true, None, false), "stopping");
    }

    #[test]
    fn only_a_hang_stops_the_watchdog() {
        let mut s = running();
        assert!(!s.hung());
        assert!(s.fail(failure(FailureKind::Leak, 0)));
        assert!(!s.hung());
        let mut s = running();
        assert!(s.fail(failure(FailureKind::Hang, 0)));
        assert!(s.hung());
        assert!(matches!(s.on_hello(false), HelloOutcome::Restarted { .. }));
        assert!(!s.hung());
    }

    #[test]
    fn gave_up_then_the_restart_completes_anyway() {
        // the supervisor noted a failure and gave up (stopping the app); the
        // app restarts in place meanwhile and says HELLO: reported as an
        // in-place restart from that failure
        let mut s = running();
        let f = failure(FailureKind::Signal, 3);
        assert!(s.fail(f.clone()));
        assert_eq!(s.ask(), None);
        assert_eq!(
            s.on_restarting(true, 4, KILL),
            RestartingOutcome::InPlace(f.clone())
        );
        assert_eq!(
            s.on_hello(true),
            HelloOutcome::Restarted {
                failure: f,
                lost_restarting: false
            }
        );
    }

    const MS: u64 = 1_000_000;
    const CHECK: u64 = 500 * MS;

    fn beat(last_ms: u64, count: u64) -> Beat {
        Beat {
            last_ns: last_ms * MS,
            count,
            since_ns: 0,
        }
    }

    fn never_blocked() -> bool {
        false
    }

    #[test]
    fn a_beating_app_takes_the_request_at_a_heartbeat() {
        // beats every 10 ms, last 4 ms ago; blocked in poll between beats
        let now = 10_000 * MS;
        let d = delivery(
            FailureKind::Request,
            true,
            beat(9_996, 1_000),
            now,
            CHECK,
            || true,
        );
        assert_eq!(
            d,
            Delivery::AtHeartbeat {
                signal_at_ns: 9_996 * MS + CHECK
            },
            "signal once the heartbeat has been still for a check interval"
        );
        // a long check interval: the grace caps the wait
        let d = delivery(
            FailureKind::Leak,
            true,
            beat(9_996, 1_000),
            now,
            60_000 * MS,
            never_blocked,
        );
        assert_eq!(
            d,
            Delivery::AtHeartbeat {
                signal_at_ns: now + HEARTBEAT_GRACE_NS
            }
        );
    }

    #[test]
    fn an_idle_app_gets_the_signal_at_once() {
        let now = 10_000 * MS;
        let asked = |b: Beat, blocked: bool| {
            let mut probed = false;
            let d = delivery(FailureKind::Request, true, b, now, CHECK, || {
                probed = true;
                blocked
            });
            (d, probed)
        };
        // still for a check interval: no need to look at /proc
        assert_eq!(
            asked(beat(9_500, 1_000), false),
            (Delivery::SignalNow, false)
        );
        assert_eq!(asked(beat(2_000, 3), false), (Delivery::SignalNow, false));
        // started at 9.8 s, beat 3 times in 30 ms, then asleep in
        // epoll_wait for 100 ms: ten of its beats missed
        let early = Beat {
            last_ns: 9_830 * MS,
            count: 3,
            since_ns: 9_800 * MS,
        };
        assert_eq!(asked(early, true), (Delivery::SignalNow, true));
        // the same, but busy on a CPU: it will beat (or hang and be caught)
        assert!(matches!(
            asked(early, false),
            (Delivery::AtHeartbeat { .. }, true)
        ));
        // within twice its usual period: /proc is not even read
        assert!(matches!(
            asked(beat(9_990, 1_000), true),
            (Delivery::AtHeartbeat { .. }, false)
        ));
        // no period known (its beats came before the HELLO the start counts
        // from): /proc alone does not decide
        let b = Beat {
            last_ns: 9_950 * MS,
            count: 1,
            since_ns: 9_960 * MS,
        };
        assert!(matches!(
            asked(b, true),
            (Delivery::AtHeartbeat { .. }, false)
        ));
    }

    #[test]
    fn no_heartbeat_path_for_hangs_apps_that_never_beat_or_lack_the_runtime() {
        let now = 10_000 * MS;
        let fresh = beat(9_999, 1_000);
        assert_eq!(
            delivery(FailureKind::Hang, true, fresh, now, CHECK, never_blocked),
            Delivery::SignalNow
        );
        assert_eq!(
            delivery(
                FailureKind::Request,
                false,
                fresh,
                now,
                CHECK,
                never_blocked
            ),
            Delivery::SignalNow
        );
        assert_eq!(
            delivery(
                FailureKind::Leak,
                true,
                beat(0, 0),
                now,
                CHECK,
                never_blocked
            ),
            Delivery::SignalNow
        );
        // a heartbeat "from the future" (garbage in the block) is not idle
        assert!(matches!(
            delivery(
                FailureKind::Leak,
                true,
                beat(20_000, 5),
                now,
                CHECK,
                never_blocked
            ),
            Delivery::AtHeartbeat { .. }
        ));
    }
}
