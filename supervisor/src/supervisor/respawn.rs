//! A death and what follows: the decision from the facts the dead process
//! left, the backoff, and the spawn of the next incarnation.

use std::os::fd::AsFd;
use std::time::Duration;

use super::report::Record;
use super::{App, Pending, Plan, Supervisor, dur_ns, sig_name};
use crate::app_link;
use crate::clock::now_ns;
use crate::control_block::Fields;
use crate::decide::{self, Facts, Mode};
use crate::event::ev;
use crate::lifecycle::{AppState, Death, RestartPath};
use crate::proto::{FdKind, StartKind};
use crate::reason::Reason;
use crate::spawn::{self, ChildFds};

impl Supervisor {
    pub(super) fn spawn(&mut self, plan: Plan) {
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
        // rk_heartbeat_interval_ms(): how long the app may block between beats
        env.push(spawn::env_entry(
            "REKINDLE_HANG_TIMEOUT_MS",
            self.cfg.hang_timeout.as_millis().to_string(),
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
        // with snapshots: the agent's socket pair, at 5+L
        let snap = match self.snapshots.as_ref().map(|_| app_link::pair()) {
            Some(Ok(p)) => Some(p),
            Some(Err(e)) => {
                self.spawn_failed(plan, &format!("socketpair for snapshots: {e}"));
                return;
            }
            None => None,
        };
        if snap.is_some() {
            env.push(spawn::env_entry(
                "REKINDLE_SNAPSHOT_FD",
                (5 + l).to_string(),
            ));
        }
        // the redo log's fds after it; a replay only for this incarnation
        // (a replay also without a ring: a restore that takes no snapshots);
        // kept until a spawn succeeds, a failed one is tried again with it
        let replay = self.redo_replay.as_ref().map(|r| r.fd.try_clone());
        let replay = match replay {
            Some(Ok(fd)) => Some(fd),
            Some(Err(e)) => {
                self.spawn_failed(plan, &format!("dup of the redo replay: {e}"));
                return;
            }
            None => None,
        };
        let mut redo_fds = Vec::new();
        let first = 5 + l + usize::from(snap.is_some());
        if let Some(r) = &self.redo {
            env.push(spawn::env_entry(
                "REKINDLE_REDO_FDS",
                format!("{},{},{}", first, first + 1, first + 2),
            ));
            redo_fds.extend(r.fds());
        }
        if let Some(fd) = &replay {
            env.push(spawn::env_entry(
                "REKINDLE_REDO_REPLAY",
                (first + redo_fds.len()).to_string(),
            ));
            redo_fds.push(fd.as_fd());
            if let Some(r) = &self.redo {
                r.set_replay_pending(true);
            }
        }
        let fds = ChildFds {
            listen: self.listen.iter().map(|(_, f)| f.as_fd()).collect(),
            app_sock: app_end.as_fd(),
            control: self.ctl.fd(),
            snapshot: snap.as_ref().map(|(_, app)| app.as_fd()),
            redo: redo_fds,
        };
        let r = spawn::spawn(&self.program, &env, &fds, l > 0);
        drop(fds);
        drop(app_end);
        let snap_sup = snap.map(|(sup, _)| sup);
        let pid = match r {
            Ok(pid) => pid,
            Err(e) => {
                self.spawn_failed(plan, &format!("fork: {e}"));
                return;
            }
        };
        drop(replay);
        self.redo_replay = None; // this incarnation's: a later start gets its own
        self.generation = plan.generation;
        if let Some(sock) = snap_sup {
            self.lazy_snapshot_socket = self.lazy_hold_snapshot_socket(pid, sock);
        }
        self.report.record(Record::Spawn {
            pid,
            generation: plan.generation,
            mode: plan.mode,
            backoff_ms: plan.backoff_ms,
            fds: if plan.mode == StartKind::Warm {
                self.held.len() as u64
            } else {
                0
            },
        });
        self.app = Some(App {
            pid,
            sock: Some(sup_end),
            started_ns: now,
            generation: plan.generation,
            start_kind: plan.mode,
            plan,
            attach_answered: false,
            state: AppState::new(),
            last_watchdog_ns: 0,
            bad_messages: 0,
        });
        self.next_check_ns = now + dur_ns(self.check_step());
        // An app without the runtime never says HELLO: its restart is done now.
        if !self.ever_linked
            && let Some(p) = self.pending.take()
        {
            self.complete_restart(
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

    pub(super) fn spawn_failed(&mut self, plan: Plan, what: &str) {
        self.report
            .event(ev("error").s("what", format!("cannot start the app: {what}")));
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

    /// The process is gone: decide and schedule the next one.
    pub(super) fn on_app_exit(&mut self, status: libc::c_int) {
        self.drain_app();
        self.lazy_after_death();
        self.snapshot_gone();
        let now = now_ns();
        let (signal, code) = if libc::WIFSIGNALED(status) {
            (libc::WTERMSIG(status), None)
        } else {
            (0, Some(libc::WEXITSTATUS(status)))
        };
        self.report.record(Record::Exit {
            pid: self.app.as_ref().map_or(0, |a| a.pid),
            signal,
            code,
            uptime_ns: now.saturating_sub(self.app.as_ref().map_or(now, |a| a.started_ns)),
        });

        if self.rollback.is_some() && self.stopping.is_none() {
            self.respawn_rolled_back(now);
            return;
        }
        let Some(a) = &self.app else { return };
        let (uptime, start_kind) = (now.saturating_sub(a.started_ns), a.start_kind);
        let mut death = a.state.on_death(self.stopping.is_some(), signal, code);
        if let Death::Unnoted { kind, reason } = &death {
            if self.note_failure(*kind, signal, code, reason, true) {
                self.app = None;
                self.exit = Some(1);
                return;
            }
            death = match &self.app {
                Some(a) => a.state.on_death(false, signal, code),
                None => return,
            };
        }
        let (noted, cold_requested, at_once) = match death {
            Death::Failed {
                failure,
                cold_requested,
                at_once,
            } => (failure, cold_requested, at_once),
            Death::Stopped => {
                let (by, code_out) = match &self.stopping {
                    Some(s) => (s.by.clone(), s.code),
                    None => (String::new(), 0),
                };
                self.app = None;
                if code_out == 0 {
                    self.report.record(Record::Decision {
                        mode: "stop",
                        reason: &format!("stopped by {by}"),
                        code: None,
                        path: None,
                        failure: None,
                    });
                    self.report.event(
                        ev("stop")
                            .s("by", by)
                            .opt("signal", (signal != 0).then(|| sig_name(signal)))
                            .opt("exit_code", code),
                    );
                }
                self.exit = Some(code_out);
                return;
            }
            Death::Done => {
                self.app = None;
                self.report.record(Record::Decision {
                    mode: "exit",
                    reason: "the app exited with status 0",
                    code: None,
                    path: None,
                    failure: None,
                });
                self.exit = Some(0);
                return;
            }
            // noted just above: cannot be
            Death::Unnoted { .. } => return,
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
            cold_requested,
        };
        let d = decide::decide(&facts);
        // A cold restart with a store: the state of a snapshot, not none.
        // A crash loop takes the newest from before the loop began; another
        // restorable cold reason the newest (consistent: cut with no
        // unsafe region open).
        // a start whose redo replay did not finish holds the snapshot
        // without the records: restore it again, with them
        let replay_unfinished = self.redo.as_ref().is_some_and(|r| r.replay_pending());
        let pick = if d.code == Reason::CrashLoop {
            Some((
                std::time::SystemTime::now() - Duration::from_nanos(uptime),
                "crash_loop_restore",
                "taken before the loop began",
            ))
        } else if d.mode == Mode::Cold && d.code.restorable() {
            Some((std::time::SystemTime::now(), "cold_restore", "the newest"))
        } else if replay_unfinished {
            Some((
                std::time::SystemTime::now(),
                "cold_restore",
                "the newest, its redo replay not finished",
            ))
        } else {
            None
        };
        if let Some((before, event, which)) = pick
            && let Some(rb) = self.snapshot_before(before, event)
        {
            let why = format!(
                "{}; restored snapshot {} ({which}) instead of dropping the state",
                d.why, rb.what
            );
            self.report.record(Record::Decision {
                mode: "warm",
                reason: &why,
                code: Some(Reason::Restored),
                path: Some(RestartPath::Respawn),
                failure: Some(noted.kind.as_str()),
            });
            if damage.is_some() {
                self.replace_control_block();
            }
            let sig = if signal != 0 { signal } else { noted.signal };
            let replay = if d.code == Reason::CrashLoop {
                super::snapshots::ReplayFrom::BeforeTheLoop
            } else {
                super::snapshots::ReplayFrom::Line
            };
            let plan = self.plan_restored(rb, now, why, sig, replay);
            self.pending = Some(Pending {
                path: RestartPath::Respawn,
                failure: noted.kind,
                t_failure_ns: noted.t_failure_ns,
                t_detect_ns: now,
                decided: Mode::Warm,
            });
            let backoff = decide::backoff(
                self.consecutive,
                self.cfg.backoff_initial,
                self.cfg.backoff_max,
            );
            self.next_spawn = Some((now + dur_ns(backoff), plan));
            return;
        }
        let (mode, why) = (d.mode, d.why.clone());
        self.report.record(Record::Decision {
            mode: mode.as_str(),
            reason: &why,
            code: Some(d.code),
            path: Some(RestartPath::Respawn),
            failure: Some(noted.kind.as_str()),
        });
        let dropped = self.apply_decision(&d);
        if damage.is_some() {
            self.replace_control_block();
        }
        let backoff = if at_once {
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
            decision_code: d.code,
            backoff_ms: backoff.as_millis() as u64,
            dropped,
            restored: false,
        };
        self.pending = Some(Pending {
            path: RestartPath::Respawn,
            failure: noted.kind,
            t_failure_ns: noted.t_failure_ns,
            t_detect_ns: plan.t_detect_ns,
            decided: mode,
        });
        self.next_spawn = Some((now + dur_ns(backoff), plan));
    }

    /// Per held arena: independence and open regions from the control block
    /// (`with_ctl`: it belongs to the incarnation that died), and the header check.
    pub(super) fn arena_facts(&self, with_ctl: bool) -> Vec<decide::ArenaFacts> {
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
    pub(super) fn apply_decision(&mut self, d: &decide::Decision) -> u32 {
        if d.mode == Mode::Cold {
            self.drop_held();
            return 0;
        }
        let before = self.held.len();
        self.held
            .retain(|h| !(h.kind == FdKind::Arena && d.dropped.contains(&h.name)));
        if !d.dropped.is_empty() {
            self.report.event(
                ev("arena_dropped")
                    .s("arenas", d.dropped.join(","))
                    .s("why", d.why.clone()),
            );
        }
        (before - self.held.len()) as u32
    }
}
