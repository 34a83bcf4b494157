//! Failures and their bookkeeping: noting one (and counting it towards
//! `--max-restarts`), giving up, and closing a restart when the next
//! incarnation says HELLO.

use std::time::Duration;

use super::report::Record;
use super::{Pending, Stopping, Supervisor, dur_ns, send_signal};
use crate::clock::now_ns;
use crate::decide;
use crate::failure::{Failure, FailureKind};
use crate::proto::StartKind;

impl Supervisor {
    /// Records a failure of the running incarnation (once per incarnation:
    /// callers note only an app that is not restarting already).  `counts`:
    /// it counts towards `--max-restarts` (an operator's request does not).
    /// Returns true if it was one too many and the supervisor gives up.
    pub(super) fn note_failure(
        &mut self,
        kind: FailureKind,
        signal: i32,
        exit_code: Option<i32>,
        reason: &str,
        counts: bool,
    ) -> bool {
        let now = now_ns();
        let Some(a) = &mut self.app else { return false };
        let uptime_ns = now.saturating_sub(a.started_ns);
        let noted = a.state.fail(Failure {
            kind,
            reason: reason.to_string(),
            signal,
            t_detect_ns: now,
            t_failure_ns: None,
        });
        if !noted {
            return false;
        }
        let (pid, generation) = (a.pid, a.generation);
        if counts {
            self.consecutive = decide::next_failure_count(
                self.consecutive,
                Duration::from_nanos(uptime_ns),
                self.cfg.stable_after,
            );
        }
        self.report.record(Record::Failure {
            kind,
            pid,
            generation,
            uptime_ns,
            reason,
            consecutive: self.consecutive,
            signal,
            exit_code,
        });
        if counts && decide::gives_up(self.consecutive, self.cfg.max_restarts) {
            self.give_up(&format!(
                "{} consecutive failures (--max-restarts {}); last: {reason}",
                self.consecutive, self.cfg.max_restarts
            ));
            return true;
        }
        false
    }

    /// No more restarts: stop the app if it still runs, then exit 1.
    pub(super) fn give_up(&mut self, why: &str) {
        self.report.record(Record::GiveUp {
            reason: why,
            consecutive: self.consecutive,
            max_restarts: self.cfg.max_restarts,
        });
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

    /// The restart `p` is done: the new incarnation (`kind`) said HELLO at
    /// `now` (or, for an app without the runtime, was spawned).
    pub(super) fn complete_restart(
        &mut self,
        p: Pending,
        kind: StartKind,
        now: u64,
        preserved: u64,
    ) {
        let detect_ns = p
            .t_failure_ns
            .map(|t| p.t_detect_ns.saturating_sub(t))
            .unwrap_or(0);
        self.report.record(Record::Restart {
            kind,
            path: p.path,
            failure: p.failure,
            decided: p.decided,
            generation: self.generation,
            detect_ns,
            spawn_ns: now.saturating_sub(p.t_detect_ns),
            preserved,
        });
        // READY's latency counts from the detection too
        self.ready_wait = Some(p.t_detect_ns);
    }
}
