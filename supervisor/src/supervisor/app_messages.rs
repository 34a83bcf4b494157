//! What the app says: messages on the socket pair (ATTACH, HELLO, FDS,
//! RESTARTING, READY, RESTART_FAILED), its sd_notify datagrams, and the
//! fd set held for it (parked in systemd's fd store).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::report::Record;
use super::{App, Held, Pending, Supervisor, dur_ns};
use crate::app_link::{self, Recv};
use crate::clock::{self, now_ns};
use crate::control_block::{Damage, Fields};
use crate::decide::Mode;
use crate::event::ev;
use crate::lifecycle::{HelloOutcome, RestartPath, RestartingOutcome};
use crate::notify::{self, Notice};
use crate::proto::{self, AppMsg, FdKind, Hello, Inherit, Restarting, StartKind, SupMsg};
use crate::reason::Reason;

impl Supervisor {
    pub(super) fn on_app_readable(&mut self, hup: bool) {
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
    pub(super) fn drain_app(&mut self) {
        self.read_app(|_, _| false);
    }

    /// Up to 256 receives from the app's socket: messages go to
    /// on_app_message; anything else to `other`, which says whether to go on.
    pub(super) fn read_app(
        &mut self,
        mut other: impl FnMut(&mut Self, std::io::Result<Recv>) -> bool,
    ) {
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

    pub(super) fn close_app_sock(&mut self) {
        if let Some(a) = &mut self.app {
            a.sock = None;
        }
    }

    pub(super) fn reply_error(&mut self, what: &str) {
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
            self.report.event(
                ev("error")
                    .s("what", "malformed message from the app")
                    .s("error", what),
            );
        } else if n == 21 {
            self.report.event(ev("error").s(
                "what",
                "more malformed messages from the app; no longer logged",
            ));
        }
    }

    pub(super) fn on_app_message(&mut self, data: &[u8], fds: Vec<OwnedFd>, truncated: bool) {
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
            AppMsg::Attach { pid, caps } => self.on_attach(pid, caps),
            AppMsg::Hello(h) => self.on_hello(h),
            AppMsg::Fds(entries) => self.on_fds(entries, fds),
            AppMsg::Restarting(r) => self.on_restarting(r),
            AppMsg::Ready { .. } => self.on_ready("socket"),
            AppMsg::RestartFailed { errno, generation } => {
                self.on_restart_failed(errno, generation)
            }
            AppMsg::Lazy { errno, regions } => self.on_lazy(errno, regions, fds),
        }
    }

    /// The app's in-place exec failed and it carries on: watch it again
    /// (hangs, leaks, restart requests) as before its RESTARTING.
    pub(super) fn on_restart_failed(&mut self, errno: i32, generation: u32) {
        let Some(a) = &mut self.app else { return };
        let was_in_place = a.state.on_restart_failed();
        self.pending = None;
        self.report.event(
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

    pub(super) fn on_attach(&mut self, pid: u32, caps: u32) {
        self.lazy_check_caps(caps);
        let Some(a) = &mut self.app else { return };
        if a.attach_answered {
            self.reply_error("ATTACH already answered for this incarnation");
            return;
        }
        a.attach_answered = true;
        if pid != a.pid as u32 {
            let apid = a.pid;
            self.report.event(ev("error").s(
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
            decision_code: p.decision_code,
            dropped: p.dropped,
            flags: if p.restored {
                proto::INHERIT_RESTORED | self.lazy_inherit_flags()
            } else {
                0
            },
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
            Ok(true) => self.report.event(
                ev("inherit")
                    .s("mode", p_mode_str(self.app.as_ref()))
                    .u("generation", self.generation as u64)
                    .u("fds", nfds as u64),
            ),
            Ok(false) => self
                .report
                .event(ev("error").s("what", "INHERIT not sent: socket full")),
            Err(e) => self
                .report
                .event(ev("error").s("what", format!("INHERIT not sent: {e}"))),
        }
    }

    pub(super) fn on_hello(&mut self, h: Hello) {
        self.lazy_no_answer();
        let now = now_ns();
        let Some(a) = &mut self.app else { return };
        if h.pid != a.pid as u32 {
            let apid = a.pid;
            self.report.event(ev("error").s(
                "what",
                format!("HELLO from pid {}, the app is pid {apid}", h.pid),
            ));
        }
        let signaled = h.reason.starts_with("signal ");
        let Some(a) = &mut self.app else { return };
        let mut outcome = a.state.on_hello(signaled);
        if let HelloOutcome::Unnoted(kind) = outcome {
            // an in-place restart whose RESTARTING was lost, and no failure
            // noted for it: note it now
            if self.note_failure(kind, 0, None, &h.reason, true) {
                return;
            }
            let Some(a) = &mut self.app else { return };
            outcome = a.state.on_hello(signaled);
        }
        if let HelloOutcome::Restarted {
            failure,
            lost_restarting: true,
        } = &outcome
        {
            // its decision was in the lost RESTARTING: the HELLO's instead
            self.report.record(Record::Decision {
                mode: h.kind.as_str(),
                reason: &h.decision,
                code: Some(h.decision_code),
                path: Some(RestartPath::InPlace),
                failure: Some(failure.kind.as_str()),
            });
            self.pending = Some(Pending {
                path: RestartPath::InPlace,
                failure: failure.kind,
                t_failure_ns: None,
                t_detect_ns: failure.t_detect_ns,
                decided: if h.kind == StartKind::Warm {
                    Mode::Warm
                } else {
                    Mode::Cold
                },
            });
        }
        let Some(a) = &mut self.app else { return };
        a.generation = h.generation;
        a.start_kind = h.kind;
        if outcome != HelloOutcome::First {
            a.started_ns = now;
        }
        let pid = a.pid;
        self.generation = h.generation;
        self.report.record(Record::Up { pid, hello: &h });
        if let Some(p) = self.pending.take() {
            self.complete_restart(p, h.kind, now, h.preserved_bytes);
        }
        self.report.systemd_ready();
    }

    pub(super) fn on_fds(&mut self, entries: Vec<proto::FdEntry>, fds: Vec<OwnedFd>) {
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
        self.snapshot_held();
        let arenas: Vec<&str> = self
            .held
            .iter()
            .filter(|h| h.kind == FdKind::Arena)
            .map(|h| h.name.as_str())
            .collect();
        let ranges = self.held.iter().filter(|h| h.kind == FdKind::Range).count();
        self.report.event(
            ev("fds")
                .u("count", self.held.len() as u64)
                .v("arenas", arenas)
                .u("ranges", ranges as u64),
        );
        self.sd_store();
    }

    pub(super) fn on_restarting(&mut self, r: Restarting) {
        // The runtime found the block damaged, went cold, and gave the block
        // its header back before this message: report what the periodic
        // check may not have seen.
        if r.decision_code == Reason::ControlBlockCorrupt
            && self.ctl_damage.is_none()
            && let Some(d) = Damage::from_words(&r.decision)
        {
            self.report.record(Record::ControlBlockCorrupt(d));
            if self.ctl.damage().is_none() {
                self.report.record(Record::ControlBlockRepaired);
            }
        }
        let now = now_ns();
        let kill_ns = dur_ns(self.cfg.kill_timeout);
        let signaled = r.signal != 0;
        let Some(a) = &mut self.app else { return };
        let mut outcome = a.state.on_restarting(signaled, now, kill_ns);
        if let RestartingOutcome::Unnoted(kind) = outcome {
            // the app's own restart (a fault, rk_restart): a failure to note
            if self.note_failure(kind, r.signal, None, &r.reason, true) {
                return;
            }
            let Some(a) = &mut self.app else { return };
            outcome = a.state.on_restarting(signaled, now, kill_ns);
        }
        let failure = match outcome {
            RestartingOutcome::InPlace(f) => f,
            RestartingOutcome::Refused => {
                self.reply_error("RESTARTING while a restart is already under way");
                return;
            }
            // noted just above: cannot be
            RestartingOutcome::Unnoted(_) => return,
        };
        let t_detect = failure.t_detect_ns;
        let t_failure = failure.t_failure_ns.unwrap_or(r.t_ns);
        let mode = if r.warm { Mode::Warm } else { Mode::Cold };
        self.report.record(Record::Decision {
            mode: mode.as_str(),
            reason: &r.decision,
            code: Some(r.decision_code),
            path: Some(RestartPath::InPlace),
            failure: Some(failure.kind.as_str()),
        });
        self.pending = Some(Pending {
            path: RestartPath::InPlace,
            failure: failure.kind,
            t_failure_ns: Some(t_failure.min(t_detect)),
            t_detect_ns: t_detect,
            decided: mode,
        });
    }

    pub(super) fn on_ready(&mut self, via: &str) {
        let now = now_ns();
        let Some(a) = &mut self.app else { return };
        if !a.state.on_ready() {
            return;
        }
        let (pid, generation) = (a.pid, a.generation);
        let ready_us = self
            .ready_wait
            .take()
            .map(|t| clock::us(now.saturating_sub(t)));
        self.report.record(Record::Ready {
            pid,
            generation,
            via,
            ready_us,
        });
    }

    pub(super) fn on_notify(&mut self) {
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
                    Notice::Status(s) => self.report.record(Record::AppStatus(s)),
                    Notice::Stopping | Notice::Other(_) => {}
                }
            }
        }
    }

    pub(super) fn sd_store(&mut self) {
        let Some(sd) = self.report.systemd() else {
            return;
        };
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

    pub(super) fn drop_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        self.held.clear();
        self.sd_store();
    }
}

fn p_mode_str(a: Option<&App>) -> &'static str {
    a.map(|a| a.plan.mode.as_str()).unwrap_or("fresh")
}
