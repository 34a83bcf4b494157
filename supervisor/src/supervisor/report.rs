//! Reporting: one `record()` for everything that is told in more than one
//! place (an event, the metrics, systemd's STATUS, `rekindle status`), so
//! that they cannot drift apart; plain events go through `event()`.

use serde_json::{Value, json};

use crate::control_block::Damage;
use crate::decide::Mode;
use crate::event::{Event, EventLog, ev};
use crate::failure::FailureKind;
use crate::lifecycle::RestartPath;
use crate::metrics::Metrics;
use crate::notify::Systemd;
use crate::proto::{Hello, StartKind};
use crate::reason::Reason;
use crate::{clock, signame};

/// Something that happened, with what each place needs to tell it.
pub(super) enum Record<'a> {
    /// A new process.
    Spawn {
        pid: libc::pid_t,
        generation: u32,
        mode: StartKind,
        backoff_ms: u64,
        fds: u64,
    },
    /// The process is gone (`signal` 0: it exited with `code`).
    Exit {
        pid: libc::pid_t,
        signal: i32,
        code: Option<i32>,
        uptime_ns: u64,
    },
    Failure {
        kind: FailureKind,
        pid: libc::pid_t,
        generation: u32,
        uptime_ns: u64,
        reason: &'a str,
        consecutive: u32,
        signal: i32,
        exit_code: Option<i32>,
    },
    /// `mode` is warm/cold, or giveup/stop/exit; `failure` is the failure's
    /// kind, or what else led to it ("supervisor-restart").
    Decision {
        mode: &'a str,
        reason: &'a str,
        /// A warm/cold decision's stable code (`enum rk_reason`); None for
        /// stop, exit and give-up.
        code: Option<Reason>,
        path: Option<RestartPath>,
        failure: Option<&'a str>,
    },
    GiveUp {
        reason: &'a str,
        consecutive: u32,
        max_restarts: u32,
    },
    /// A restart completed: the new incarnation said HELLO.
    Restart {
        kind: StartKind,
        path: RestartPath,
        failure: FailureKind,
        decided: Mode,
        generation: u32,
        detect_ns: u64,
        spawn_ns: u64,
        preserved: u64,
    },
    Up {
        pid: libc::pid_t,
        hello: &'a Hello,
    },
    Ready {
        pid: libc::pid_t,
        generation: u32,
        via: &'a str,
        ready_us: Option<u64>,
    },
    ControlBlockCorrupt(Damage),
    /// The runtime gave a damaged block its header back (after the cold
    /// in-place restart that damage decided).
    ControlBlockRepaired,
    ControlBlockRecreated,
    /// The supervisor began to stop the app.
    Stopping,
    /// The app's own `STATUS=` line (sd_notify).
    AppStatus(String),
}

/// The history `rekindle status` shows.
#[derive(Default)]
pub(super) struct History {
    pub(super) restarts_warm: u64,
    pub(super) restarts_cold: u64,
    pub(super) failures: u64,
    pub(super) last_failure: Option<Value>,
    pub(super) last_decision: Option<Value>,
    pub(super) preserved_bytes: u64,
    pub(super) ctl_corruptions: u64,
    pub(super) app_status: Option<String>,
}

pub(super) struct Report {
    events: EventLog,
    metrics: Metrics,
    systemd: Option<Systemd>,
    /// READY=1 goes to systemd once, for the first incarnation.
    sd_ready_sent: bool,
    pub(super) history: History,
}

impl Report {
    pub(super) fn new(events: EventLog, metrics: Metrics, systemd: Option<Systemd>) -> Self {
        Report {
            events,
            metrics,
            systemd,
            sd_ready_sent: false,
            history: History::default(),
        }
    }

    /// systemd's notify socket, if the supervisor runs under systemd (for
    /// the watchdog and the fd store, which are not reports).
    pub(super) fn systemd(&self) -> Option<&Systemd> {
        self.systemd.as_ref()
    }

    pub(super) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// An event that nothing else tells.
    pub(super) fn event(&mut self, e: Event) {
        self.events.emit(e);
    }

    fn sd(&self, line: &str) {
        if let Some(sd) = &self.systemd {
            // best effort: systemd's absence or a full socket changes nothing here
            let _ = sd.send(line, &[]);
        }
    }

    pub(super) fn record(&mut self, r: Record<'_>) {
        match r {
            Record::Spawn {
                pid,
                generation,
                mode,
                backoff_ms,
                fds,
            } => {
                self.event(
                    ev("spawn")
                        .i("pid", pid as i64)
                        .u("generation", generation as u64)
                        .s("mode", mode.as_str())
                        .u("backoff_ms", backoff_ms)
                        .u("fds", fds),
                );
                self.metrics.up.set(1);
                self.metrics.generation.set(generation as i64);
            }
            Record::Exit {
                pid,
                signal,
                code,
                uptime_ns,
            } => {
                self.metrics.up.set(0);
                self.event(
                    ev("exit")
                        .i("pid", pid as i64)
                        .opt("signal", (signal != 0).then(|| signame::name(signal)))
                        .opt("exit_code", code)
                        .u("uptime_ms", clock::ms(uptime_ns)),
                );
            }
            Record::Failure {
                kind,
                pid,
                generation,
                uptime_ns,
                reason,
                consecutive,
                signal,
                exit_code,
            } => {
                let kind = kind.as_str();
                let signal = (signal != 0).then(|| signame::name(signal));
                self.history.failures += 1;
                self.history.last_failure = Some(json!({
                    "kind": kind, "reason": reason, "signal": signal,
                    "exit_code": exit_code, "generation": generation,
                    "ts": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
                }));
                self.event(
                    ev("failure")
                        .s("kind", kind)
                        .i("pid", pid as i64)
                        .u("generation", generation as u64)
                        .u("uptime_ms", clock::ms(uptime_ns))
                        .s("reason", reason)
                        .u("consecutive", consecutive as u64)
                        .opt("signal", signal)
                        .opt("exit_code", exit_code.map(|c| c as i64)),
                );
                self.metrics.failures.with_label_values(&[kind]).inc();
                self.metrics.last_failure.set(clock::unix_secs_f64());
                self.sd(&format!("STATUS=failure: {reason}"));
            }
            Record::Decision {
                mode,
                reason,
                code,
                path,
                failure,
            } => {
                let path = path.map(|p| p.as_str());
                let code = code.map(|c| c.as_str());
                self.history.last_decision = Some(
                    json!({"mode": mode, "reason": reason, "code": code, "path": path.unwrap_or("")}),
                );
                self.event(
                    ev("decision")
                        .s("mode", mode)
                        .s("reason", reason)
                        .opt("code", code)
                        .opt("path", path)
                        .opt("failure", failure),
                );
            }
            Record::GiveUp {
                reason,
                consecutive,
                max_restarts,
            } => {
                self.record(Record::Decision {
                    mode: "giveup",
                    reason,
                    code: None,
                    path: None,
                    failure: None,
                });
                self.event(
                    ev("giveup")
                        .s("reason", reason)
                        .u("consecutive_failures", consecutive as u64)
                        .u("max_restarts", max_restarts as u64),
                );
                self.sd(&format!("STATUS=gave up: {reason}"));
            }
            Record::Restart {
                kind,
                path,
                failure,
                decided,
                generation,
                detect_ns,
                spawn_ns,
                preserved,
            } => {
                let mode = kind.as_str();
                self.event(
                    ev("restart")
                        .s("mode", mode)
                        .s("path", path.as_str())
                        .s("failure", failure.as_str())
                        .s("decided", decided.as_str())
                        .u("generation", generation as u64)
                        .u("detect_us", clock::us(detect_ns))
                        .u("spawn_us", clock::us(spawn_ns))
                        .u("preserved_bytes", preserved),
                );
                if kind == StartKind::Warm {
                    self.history.restarts_warm += 1;
                } else {
                    self.history.restarts_cold += 1;
                }
                self.metrics
                    .restarts
                    .with_label_values(&[mode, failure.as_str()])
                    .inc();
                self.metrics.downtime.observe(spawn_ns as f64 / 1e9);
                self.sd(&format!(
                    "STATUS=restarted {mode} ({}), generation {generation}",
                    failure.as_str()
                ));
            }
            Record::Up { pid, hello: h } => {
                self.history.preserved_bytes = h.preserved_bytes;
                self.metrics.preserved_bytes.set(h.preserved_bytes as i64);
                self.metrics.generation.set(h.generation as i64);
                self.event(
                    ev("up")
                        .i("pid", pid as i64)
                        .u("generation", h.generation as u64)
                        .s("kind", h.kind.as_str())
                        .s("reason", &h.reason)
                        .s("decision", &h.decision)
                        .s("code", h.decision_code.as_str())
                        .u("restart_us", h.restart_ns / 1000)
                        .u("preserved_bytes", h.preserved_bytes)
                        .u("narenas", h.narenas as u64),
                );
            }
            Record::Ready {
                pid,
                generation,
                via,
                ready_us,
            } => {
                self.event(
                    ev("ready")
                        .i("pid", pid as i64)
                        .u("generation", generation as u64)
                        .s("via", via)
                        .opt("ready_us", ready_us),
                );
                self.systemd_ready();
            }
            Record::ControlBlockCorrupt(d) => {
                self.history.ctl_corruptions += 1;
                self.event(
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
            Record::ControlBlockRepaired => {
                self.metrics.control_block_ok.set(1);
                self.event(ev("control_block").s("status", "repaired"));
            }
            Record::ControlBlockRecreated => {
                self.metrics.control_block_ok.set(1);
                self.event(ev("control_block").s("status", "recreated"));
            }
            Record::Stopping => self.sd("STOPPING=1"),
            Record::AppStatus(s) => {
                self.sd(&format!("STATUS={s}"));
                self.history.app_status = Some(s);
            }
        }
    }

    /// systemd hears READY=1 once, at the first HELLO or READY: an app
    /// with the runtime may never call rk_ready.
    pub(super) fn systemd_ready(&mut self) {
        if !self.sd_ready_sent {
            self.sd("READY=1\nSTATUS=running");
            self.sd_ready_sent = true;
        }
    }
}
