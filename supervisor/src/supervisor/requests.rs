//! What the supervisor asks of the running app: a restart (control-block
//! request, restart signal, SIGKILL after --kill-timeout) or a stop.

use super::report::Record;
use super::{Stopping, Supervisor, dur_ns, send_signal, sig_name};
use crate::clock::{self, now_ns};
use crate::control_block::RequestMode;
use crate::decide::Mode;
use crate::event::ev;
use crate::failure::FailureKind;
use crate::lifecycle::{self, Ask, Beat, Delivery, Due, Refusal};
use crate::procfs;

/// Why a restart cannot be asked for now (the control socket's error reply).
#[derive(Debug, thiserror::Error)]
pub(super) enum AskError {
    #[error("the supervisor is stopping")]
    Stopping,
    #[error("a restart is already under way")]
    Busy,
    #[error("no app running; next start in {0} ms")]
    NoAppYet(u64),
    #[error("no app running")]
    NoApp,
}

impl Supervisor {
    /// Asks the running app to restart: the control-block request, taken
    /// at the app's next heartbeat if it beats, else the restart signal at
    /// once (lifecycle::delivery); SIGKILL if no HELLO within --kill-timeout.
    pub(super) fn ask_restart(
        &mut self,
        mode: Mode,
        reason: String,
        kind: FailureKind,
        counts: bool,
    ) -> Result<(), AskError> {
        let now = now_ns();
        let refusal =
            lifecycle::ask_refusal(self.stopping.is_some(), self.app.as_ref().map(|a| &a.state));
        let (pid, linked, since_ns) = match (refusal, &self.app) {
            (None, Some(a)) => (a.pid, a.state.linked(), a.started_ns),
            (Some(Refusal::Stopping), _) => return Err(AskError::Stopping),
            (Some(Refusal::Busy), _) => return Err(AskError::Busy),
            (Some(Refusal::NoApp), _) | (None, None) => {
                return Err(match &self.next_spawn {
                    Some((t, _)) => AskError::NoAppYet(clock::ms(t.saturating_sub(now))),
                    None => AskError::NoApp,
                });
            }
        };
        if self.note_failure(kind, 0, None, &reason, counts) {
            return Ok(()); // gave up: the app is being stopped
        }
        // the block's heartbeat is this process's only once its rk_init ran
        let beat = if self.ctl.pid() == pid as u32 {
            Beat {
                last_ns: self.ctl.heartbeat_ns(),
                count: self.ctl.heartbeat_count(),
                since_ns,
            }
        } else {
            Beat {
                last_ns: 0,
                count: 0,
                since_ns,
            }
        };
        let request = match mode {
            Mode::Warm => RequestMode::Warm,
            Mode::Cold => RequestMode::Cold,
        };
        self.ctl.request(request, &reason);
        let check_ns = dur_ns(self.cfg.check_interval);
        let ask = match lifecycle::delivery(kind, linked, beat, now, check_ns, || {
            procfs::blocked_in_kernel(pid)
        }) {
            Delivery::AtHeartbeat { signal_at_ns } => Ask {
                mode,
                signal_at_ns: Some(signal_at_ns),
                kill_at_ns: None,
            },
            Delivery::SignalNow => {
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
                    kill_at_ns: Some(now.saturating_add(dur_ns(self.cfg.kill_timeout))),
                }
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
