//! The supervisor's side of a lazy restore (snapshot/lazy.rs; docs/
//! snapshots.md, "Lazy restore"): the first incarnation is told its arenas
//! come in lazily (INHERIT_LAZY), its LAZY message starts the serving
//! thread, and the end of the thread, or of the app, ends the restore.
//! Until then the control block's `lazy_pages` is set (the app restarts
//! warm only through us) and the snapshot engine does not get the app: a
//! snapshot read through the memfds would see the pages not in yet as
//! zeros.

use std::os::fd::{AsFd, OwnedFd};

use super::Supervisor;
use crate::app_link;
use crate::control_block::OFF_LAZY_PAGES;
use crate::event::ev;
use crate::proto::{self, LazyRegion, LazyStatus, SupMsg};
use crate::snapshot::lazy::{self, Filled, Finished, Server, Source};

/// A lazy restore under way.
pub(super) enum Lazy {
    /// Memfds made, the app not yet heard from.
    Waiting(Box<Source>),
    /// The thread serves the app's userfaultfd.
    Serving(Server),
}

/// The snapshot socket of the incarnation being filled, handed to the
/// engine once the restore is over.
pub(super) type HeldBack = Option<(libc::pid_t, OwnedFd)>;

impl Supervisor {
    /// INHERIT's flags for the first incarnation, and the control block's
    /// flag for it.
    pub(super) fn lazy_inherit_flags(&self) -> u32 {
        if matches!(self.lazy, Some(Lazy::Waiting(_))) {
            self.ctl.store_u32(OFF_LAZY_PAGES, 1);
            proto::INHERIT_LAZY
        } else {
            0
        }
    }

    /// The source of a restore still waiting for the app's LAZY; a restore
    /// being served stays as it is.
    fn lazy_take_waiting(&mut self) -> Option<Box<Source>> {
        match self.lazy.take() {
            Some(Lazy::Waiting(src)) => Some(src),
            other => {
                self.lazy = other;
                None
            }
        }
    }

    /// ATTACH from a runtime that cannot answer INHERIT_LAZY (older than
    /// lazy restores): every page goes into the memfds before INHERIT.
    pub(super) fn lazy_check_caps(&mut self, caps: u32) {
        if caps & proto::ATTACH_CAP_LAZY != 0 {
            return;
        }
        self.lazy_fill_waiting("runtime_not_lazy");
    }

    /// HELLO while still waiting for LAZY: the runtime went on without the
    /// arenas (a cold start); fill them so the restore can end.
    pub(super) fn lazy_no_answer(&mut self) {
        self.lazy_fill_waiting("no_lazy_message");
    }

    /// A restore still waiting for LAZY gets every page now, `why` said in
    /// its `filled` event.
    fn lazy_fill_waiting(&mut self, why: &'static str) {
        if let Some(src) = self.lazy_take_waiting() {
            let _ = self.lazy_fill_rest(&src, &Filled::new(&src), why);
        }
    }

    /// The snapshot socket of a new incarnation: to the engine now, or
    /// once the lazy restore is over.
    pub(super) fn lazy_hold_snapshot_socket(
        &mut self,
        pid: libc::pid_t,
        sock: OwnedFd,
    ) -> HeldBack {
        if self.lazy.is_some() {
            Some((pid, sock))
        } else {
            self.snapshot_spawned(pid, sock);
            None
        }
    }

    /// LAZY from the app: serve its userfaultfd, or fill every page first
    /// when it sent none; then answer.
    pub(super) fn on_lazy(&mut self, errno: i32, regions: Vec<LazyRegion>, fds: Vec<OwnedFd>) {
        let Some(src) = self.lazy_take_waiting() else {
            self.reply_error("LAZY without a lazy restore waiting for it");
            return;
        };
        let uffd = fds.into_iter().next();
        let pages = src.pages_to_fill();
        let status = match (errno, uffd) {
            (0, Some(uffd)) => {
                match Server::start(uffd, &regions, *src, self.cfg.restore_fill_rate) {
                    Ok(server) => {
                        self.report.event(
                            ev("lazy_restore")
                                .s("state", "serving")
                                .u("arenas", regions.len() as u64)
                                .u("pages", pages),
                        );
                        self.lazy = Some(Lazy::Serving(server));
                        LazyStatus::Serving
                    }
                    Err(failed) => {
                        let (e, src) = *failed;
                        self.report.event(
                        ev("error")
                            .s("what", "lazy restore: cannot serve the app's userfaultfd; reading every page first")
                            .s("code", e.code())
                            .s("error", e.to_string()),
                    );
                        if !self.lazy_fill_rest(&src, &Filled::new(&src), "eager") {
                            return;
                        }
                        LazyStatus::Filled
                    }
                }
            }
            (errno, _) => {
                self.report.event(
                    ev("lazy_restore")
                        .s("state", "eager")
                        .s(
                            "why",
                            "the app has no userfaultfd for kernel faults: every page read first",
                        )
                        .i("errno", errno as i64),
                );
                if !self.lazy_fill_rest(&src, &Filled::new(&src), "eager") {
                    return;
                }
                LazyStatus::Filled
            }
        };
        if let Some(sock) = self.app.as_ref().and_then(|a| a.sock.as_ref()) {
            let _ = app_link::send(
                sock.as_fd(),
                &proto::encode_sup(&SupMsg::LazyReply(status)),
                &[],
            );
        }
    }

    /// Called from the poll loop: the thread is done.
    pub(super) fn lazy_poll(&mut self) {
        if !matches!(&self.lazy, Some(Lazy::Serving(s)) if s.is_finished()) {
            return;
        }
        if let Some(Lazy::Serving(s)) = self.lazy.take() {
            let f = s.finish();
            self.lazy_finished(f, "done", true);
        }
    }

    /// The app is gone: whatever is not in yet goes straight into the
    /// memfds before anything reads them.
    pub(super) fn lazy_after_death(&mut self) {
        self.lazy_snapshot_socket = None; // that incarnation is gone
        match self.lazy.take() {
            None => {}
            Some(Lazy::Waiting(src)) => {
                let _ = self.lazy_fill_rest(&src, &Filled::new(&src), "app_gone");
            }
            Some(Lazy::Serving(s)) => {
                let f = s.finish();
                self.lazy_finished(f, "app_gone", false);
            }
        }
    }

    /// `alive`: the app still runs (else it was reaped: no signal to its pid).
    fn lazy_finished(&mut self, f: Finished, how: &'static str, alive: bool) {
        let st = &f.stats;
        let mut e = ev("lazy_restore")
            .s("state", how)
            .u("faulted_pages", st.faulted)
            .u("faulted_around_pages", st.faulted_around)
            .u("zero_faulted_pages", st.zero_faulted)
            .u("refaulted_pages", st.refaulted)
            .u("filled_pages", st.filled)
            .u("forks", st.forks)
            .u("max_fault_us", st.max_fault_us)
            .u("took_ms", st.took.as_millis() as u64);
        match &f.result {
            Ok(true) => {}
            Ok(false) => e = e.s("result", "stopped"),
            Err(err) => {
                e = e
                    .s("result", "failed")
                    .s("code", err.code())
                    .s("error", err.to_string())
            }
        }
        self.report.event(e);
        match f.result {
            // every page the app mapped is in; an arena it did not map (none
            // is expected) is written into its memfd for the next incarnation
            Ok(true) => {
                let _ = self.lazy_fill_rest(&f.source, &f.filled, "unmapped");
            }
            // the app cannot be served: it must not run on with pages missing
            Err(_) => {
                if let (true, Some(a)) = (alive, &self.app) {
                    super::send_signal(a.pid, libc::SIGKILL);
                }
                let _ = self.lazy_fill_rest(&f.source, &f.filled, "after_failure");
            }
            Ok(false) => {
                let _ = self.lazy_fill_rest(&f.source, &f.filled, how);
            }
        }
    }

    /// Writes the rest into the memfds; false (and the supervisor exits 1)
    /// when the snapshot cannot be read back.
    fn lazy_fill_rest(&mut self, src: &Source, filled: &Filled, why: &'static str) -> bool {
        match lazy::fill_rest(src, filled) {
            Ok(n) => {
                if n > 0 || why != "unmapped" {
                    self.report.event(
                        ev("lazy_restore")
                            .s("state", "filled")
                            .s("why", why)
                            .u("pages", n),
                    );
                }
                self.lazy_over();
                true
            }
            Err(e) => {
                self.report.event(
                    ev("error")
                        .s(
                            "what",
                            "lazy restore: the snapshot does not read back; stopping",
                        )
                        .s("code", e.code())
                        .s("error", e.to_string()),
                );
                if let Some(a) = &self.app {
                    super::send_signal(a.pid, libc::SIGKILL);
                }
                self.exit = Some(1);
                false
            }
        }
    }

    /// Every page is in: warm restarts in place again, snapshots again.
    fn lazy_over(&mut self) {
        self.ctl.store_u32(OFF_LAZY_PAGES, 0);
        self.lazy = None;
        if let Some((pid, sock)) = self.lazy_snapshot_socket.take() {
            self.snapshot_spawned(pid, sock);
        }
    }
}
