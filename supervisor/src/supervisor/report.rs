//! Reporting: failures, decisions, restarts and giving up, as events,
//! metrics, status and systemd STATUS lines.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::clock::{self, now_ns};
use crate::decide::{self};
use crate::event::ev;
use crate::failure::Failure;
use crate::proto::StartKind;

impl Supervisor {
    /// Records a failure of the running incarnation (once per incarnation:
    /// callers note only an app that is not restarting already).
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
        let uptime = now.saturating_sub(a.started_ns);
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
        self.failures += 1;
        if counts {
            self.consecutive = decide::next_failure_count(
                self.consecutive,
                Duration::from_nanos(uptime),
                self.cfg.stable_after,
            );
        }
        let kind = kind.as_str();
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

    pub(super) fn give_up(&mut self, why: &str) {
        self.emit_decision("giveup", why, None, None);
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

    pub(super) fn emit_decision(
        &mut self,
        mode: &str,
        reason: &str,
        path: Option<RestartPath>,
        failure: Option<&str>,
    ) {
        let mut e = ev("decision").s("mode", mode).s("reason", reason);
        if let Some(p) = path {
            e = e.s("path", p.as_str());
        }
        if let Some(f) = failure {
            e = e.s("failure", f);
        }
        let path = path.map_or("", |p| p.as_str());
        self.last_decision = Some(json!({"mode": mode, "reason": reason, "path": path}));
        self.events.emit(e);
    }

    pub(super) fn emit_restart(&mut self, p: Pending, kind: StartKind, now: u64, preserved: u64) {
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
                .s("path", p.path.as_str())
                .s("failure", p.failure.as_str())
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
            .with_label_values(&[mode, p.failure.as_str()])
            .inc();
        self.metrics.downtime.observe(spawn_ns as f64 / 1e9);
        self.ready_wait = Some(p.t_detect_ns);
        if let Some(sd) = &self.systemd {
            let _ = sd.send(
                &format!(
                    "STATUS=restarted {mode} ({}), generation {}",
                    p.failure.as_str(),
                    self.generation
                ),
                &[],
            );
        }
    }
}
