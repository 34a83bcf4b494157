//! The control socket's commands: status, restart, stop, inspect.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Supervisor;
use crate::clock::{self, now_ns};
use crate::control_block::Fields as _;
use crate::control_socket::{Request, error_reply};
use crate::failure::FailureKind;
use crate::inspect::{self, FdSource};
use crate::lifecycle;
use crate::proto::FdKind;

/// How long an inspect may read arenas, all of them together: the poll
/// loop waits meanwhile (a 16 GiB arena takes a fraction of it).
pub const INSPECT_BUDGET: Duration = Duration::from_secs(1);

impl Supervisor {
    pub(super) fn on_control_client(&mut self, id: u64) {
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
                    match self.ask_restart(mode, reason, FailureKind::Request, false) {
                        Ok(()) => json!({"ok": true, "mode": mode.as_str(),
                                          "pid": self.app.as_ref().map(|a| a.pid)}),
                        Err(e) => error_reply(&e.to_string()),
                    }
                }
                Ok(Request::Inspect) => self.inspect(),
                Ok(Request::Checkpoint { tags, wait }) => match self.checkpoint(id, tags, wait) {
                    Some(reply) => reply,
                    None => continue, // answered when the snapshot is durable
                },
                Ok(Request::Rollback { snapshot }) => self.rollback(&snapshot),
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

    /// Every held arena, read from its fd (inspect.rs), with the open
    /// unsafe regions of the control block.
    pub(super) fn inspect(&self) -> Value {
        let t0 = Instant::now();
        let regions = self.ctl.open_regions();
        let damage = self.ctl.damage();
        let mut arenas = Vec::new();
        for h in self.held.iter().filter(|h| h.kind == FdKind::Arena) {
            let left = INSPECT_BUDGET.saturating_sub(t0.elapsed());
            arenas.push(match FdSource::open(h.fd.as_fd()) {
                Ok(src) => inspect::inspect_arena(&h.name, &src, left),
                Err(e) => inspect::unreadable(&h.name, &format!("cannot stat the memfd: {e}")),
            });
        }
        inspect::attach_regions(&mut arenas, &regions);
        let arenas = match serde_json::to_value(&arenas) {
            Ok(v) => v,
            Err(e) => return error_reply(&format!("cannot encode the arenas: {e}")),
        };
        let open: Vec<Value> = regions
            .iter()
            .map(|r| json!({"arena": r.arena, "tid": r.tid, "depth": r.depth}))
            .collect();
        let state = lifecycle::status_word(
            self.stopping.is_some(),
            self.app.as_ref().map(|a| &a.state),
            self.next_spawn.is_some(),
        );
        json!({
            "ok": true,
            "name": self.cfg.name,
            "state": state,
            "pid": self.app.as_ref().map(|a| a.pid),
            "generation": self.generation,
            "kind": self.app.as_ref().map(|a| a.start_kind.as_str()),
            "linked": self.ever_linked,
            "arenas": arenas,
            "open_regions": open,
            "control_block": {"ok": damage.is_none(), "damage": damage.map(|d| d.describe())},
            "budget_ms": INSPECT_BUDGET.as_millis() as u64,
            "elapsed_us": t0.elapsed().as_micros() as u64,
        })
    }

    pub(super) fn status(&self) -> Value {
        let now = now_ns();
        let state = lifecycle::status_word(
            self.stopping.is_some(),
            self.app.as_ref().map(|a| &a.state),
            self.next_spawn.is_some(),
        );
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
        let h = &self.report.history;
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
            "ready": self.app.as_ref().is_some_and(|a| a.state.ready()),
            "heartbeat_age_ms": hb,
            "restarts": {"warm": h.restarts_warm, "cold": h.restarts_cold,
                          "total": h.restarts_warm + h.restarts_cold},
            "failures": h.failures,
            "consecutive_failures": self.consecutive,
            "last_failure": h.last_failure,
            "last_decision": h.last_decision,
            "preserved_bytes": h.preserved_bytes,
            "control_block": {"ok": self.ctl_damage.is_none(),
                              "damage": self.ctl_damage.map(|d| d.describe()),
                              "corruptions": h.ctl_corruptions},
            "held_fds": held,
            "next_start_ms": self.next_spawn.as_ref().map(|(t, _)| clock::ms(t.saturating_sub(now))),
            "program": self.cfg.program_path.to_string_lossy(),
            "args": args,
            "app_status": h.app_status,
            "socket": self.control.path().to_string_lossy(),
        })
    }
}
