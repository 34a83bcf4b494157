//! What the supervisor asks of the running app: a restart (control-block
//! request, restart signal, SIGKILL after --kill-timeout) or a stop.

use super::report::Record;
use super::*;
use crate::clock::{self, now_ns};
use crate::decide::Mode;
use crate::event::ev;
use crate::lifecycle::{self, Ask, Due, Refusal};

impl Supervisor {
    /// Asks the running app to restart: control-block request, then the
    /// restart signal (at once for a hang or an app that does not beat),
    /// then SIGKILL after --kill-timeout.
    pub(super) fn ask_restart(
        &mut self,
        mode: Mode,
        reason: String,
        kind: FailureKind,
        counts: bool,
    ) -> Result<(), String> {
        let now = now_ns();
        match lifecycle::ask_refusal(self.stopping.is_some(), self.app.as_ref().map(|a| &a.state)) {
            None => {}
            Some(Refusal::Stopping) => return Err("the supervisor is stopping".into()),
            Some(Refusal::Busy) => return Err("a restart is already under way".into()),
            Some(Refusal::NoApp) => {
                return Err(match &self.next_spawn {
                    Some((t, _)) => format!(
                        "no app running; next start in {} ms",
                        clock::ms(t.saturating_sub(now))
                    ),
                    None => "no app running".into(),
                });
            }
        }
        let Some((pid, linked)) = self.app.as_ref().map(|a| (a.pid, a.state.linked())) else {
            return Err("no app running".into());
        };
        if self.note_failure(kind, 0, None, &reason, counts) {
            return Ok(()); // gave up: the app is being stopped
        }
        let beats = self.ctl.pid() == pid as u32 && self.ctl.heartbeat_ns() != 0;
        self.ctl
            .request(if mode == Mode::Cold { 2 } else { 1 }, &reason);
        let kill_ns = dur_ns(self.cfg.kill_timeout);
        let ask = if kind != FailureKind::Hang && beats && linked {
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
            self.report.event(
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
            a.state.ask_restart(ask);
        }
        Ok(())
    }

    /// The request's deadlines: the restart signal if no heartbeat took it,
    /// SIGKILL if no HELLO came.
    pub(super) fn request_deadlines(&mut self, now: u64) {
        let kill_ns = dur_ns(self.cfg.kill_timeout);
        let Some(a) = &mut self.app else { return };
        let pid = a.pid;
        for due in a.state.take_due(now, kill_ns) {
            let s = match due {
                Due::RestartSignal => self.cfg.restart_signal,
                Due::Term => libc::SIGTERM,
                Due::Kill => {
                    send_signal(pid, libc::SIGKILL);
                    self.report.event(ev("kill").i("pid", pid as i64).s(
                        "reason",
                        format!("no HELLO within {} ms", self.cfg.kill_timeout.as_millis()),
                    ));
                    continue;
                }
            };
            send_signal(pid, s);
            self.report.event(
                ev("signal")
                    .i("pid", pid as i64)
                    .s("signal", sig_name(s))
                    .s("reason", "restart request not taken at a heartbeat"),
            );
        }
    }

    pub(super) fn begin_stop(&mut self, by: &str, code: i32) {
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
                self.report.record(Record::Stopping);
            }
            None => {
                self.report.event(ev("stop").s("by", by));
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
}
