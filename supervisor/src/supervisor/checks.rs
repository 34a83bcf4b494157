//! The periodic checks of the running app: heartbeat (hang), RSS (leak),
//! the control block's header, and the systemd watchdog they feed.

use std::time::Duration;

use super::report::Record;
use super::{Supervisor, dur_ns};
use crate::clock;
use crate::control_block::{ControlBlock, CtlState, Damage, Fields};
use crate::decide::Mode;
use crate::event::ev;
use crate::failure::FailureKind;
use crate::procfs;

impl Supervisor {
    pub(super) fn check_step(&self) -> Duration {
        let mut d = self.cfg.check_interval;
        if !self.cfg.hang_timeout.is_zero() {
            d = d
                .min(self.cfg.hang_timeout / 4)
                .max(Duration::from_millis(10));
        }
        d
    }

    pub(super) fn check_hang(&mut self, now: u64) {
        if self.cfg.hang_timeout.is_zero() || self.stopping.is_some() {
            return;
        }
        let Some(a) = &self.app else { return };
        if a.state.busy() {
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
            if let Err(e) = self.ask_restart(Mode::Warm, reason, FailureKind::Hang, true) {
                self.report
                    .event(ev("error").s("what", format!("hang restart: {e}")));
            }
            // the hang began at the last heartbeat
            if let Some(f) = self.app.as_mut().and_then(|a| a.state.failure_mut()) {
                f.t_failure_ns = Some(hb);
            }
        }
    }

    /// The control block's header as written at creation, or its damage,
    /// reported when first seen: a wild write in the app, or another
    /// process with the fd, has taken away the evidence of unsafe regions.
    pub(super) fn check_control_block(&mut self) -> Option<Damage> {
        let damage = self.ctl.damage();
        if let Some(d) = damage
            && self.ctl_damage.is_none()
        {
            self.report.record(Record::ControlBlockCorrupt(d));
        }
        if damage.is_none() && self.ctl_damage.is_some() {
            self.report.record(Record::ControlBlockRepaired);
        }
        self.ctl_damage = damage;
        damage
    }

    /// A damaged block cannot be trusted again: the next incarnation gets a
    /// new one (the dead one's mapping and fd go with the old).
    pub(super) fn replace_control_block(&mut self) {
        match ControlBlock::create() {
            Ok(cb) => {
                self.ctl = cb;
                self.ctl_damage = None;
                self.report.record(Record::ControlBlockRecreated);
            }
            Err(e) => self
                .report
                .event(ev("error").s("what", format!("recreating the control block: {e:#}"))),
        }
    }

    pub(super) fn check_rss(&mut self) {
        let Some(max) = self.cfg.max_rss else { return };
        if self.stopping.is_some() {
            return;
        }
        let Some(a) = &self.app else { return };
        if a.state.busy() {
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
            if let Err(e) = self.ask_restart(Mode::Warm, reason, FailureKind::Leak, true) {
                self.report
                    .event(ev("error").s("what", format!("leak restart: {e}")));
            }
        }
    }

    pub(super) fn sd_watchdog(&mut self, now: u64) {
        let Some(sd) = self.report.systemd() else {
            return;
        };
        let Some(usec) = sd.watchdog_usec else { return };
        if now < self.sd_watchdog_next_ns {
            return;
        }
        self.sd_watchdog_next_ns = now + usec * 1000 / 2;
        // healthy: no hang being handled
        let hung = self.app.as_ref().is_some_and(|a| a.state.hung());
        if !hung {
            let _ = sd.send("WATCHDOG=1", &[]);
        }
    }
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
