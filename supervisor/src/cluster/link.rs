//! The snapshot engine's hand-off to the replication sender, shared by both
//! threads: the engine publishes each committed snapshot; the sender
//! reports how far the standbys have acknowledged; with sync replication
//! the engine releases the app's held replies (rk_durable_epoch) only up to
//! that point (group commit: every reply held for one snapshot shares its
//! one round trip to the standby).  Which standbys count is the in-sync
//! set's business (insync.rs): it calls `acked` with what every required
//! standby has.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::store::SnapshotId;

/// How many recent commits keep their time (for `behind_since`).
const COMMIT_TIMES: usize = 4096;

#[derive(Default)]
struct State {
    committed: Option<SnapshotId>,
    acked: Option<SnapshotId>,
    /// Recent commits and when they were made, oldest first.
    times: VecDeque<(SnapshotId, Instant)>,
}

pub struct ReplicationLink {
    /// The app's durable acknowledgements wait for a standby.
    pub sync: bool,
    /// Async: replies wait for the standbys once a commit older than this
    /// is unacknowledged (`--max-lag`).
    pub max_lag: Option<Duration>,
    state: Mutex<State>,
    cond: Condvar,
    /// Readable when `acked` advanced (the engine polls it).
    acked_efd: OwnedFd,
}

impl ReplicationLink {
    pub fn new(sync: bool, max_lag: Option<Duration>) -> std::io::Result<ReplicationLink> {
        // SAFETY: eventfd returns a fresh fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ReplicationLink {
            sync,
            max_lag,
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            // SAFETY: fresh and ours.
            acked_efd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine: `id` is committed to the local store.
    pub fn committed(&self, id: &SnapshotId) {
        {
            let mut g = self.lock();
            g.committed = Some(id.clone());
            g.times.push_back((id.clone(), Instant::now()));
            if g.times.len() > COMMIT_TIMES {
                g.times.pop_front();
            }
        }
        self.cond.notify_all();
    }

    /// When the oldest commit newer than `acked` was made: how long a
    /// standby that has `acked` has kept a commit waiting (None: it has
    /// them all).
    pub fn behind_since(&self, acked: Option<&SnapshotId>) -> Option<Instant> {
        let g = self.lock();
        let newest = g.committed.as_ref()?;
        if acked.is_some_and(|a| a >= newest) {
            return None;
        }
        g.times
            .iter()
            .find(|(id, _)| acked.is_none_or(|a| id > a))
            .map(|(_, t)| *t)
    }

    /// The sender: the newest committed snapshot if it is not `seen`,
    /// waiting at most `wait` for one.
    pub fn wait_newer(&self, seen: Option<&SnapshotId>, wait: Duration) -> Option<SnapshotId> {
        let g = self.lock();
        let newer = |s: &State| s.committed.as_ref().filter(|c| Some(*c) != seen).cloned();
        if let Some(c) = newer(&g) {
            return Some(c);
        }
        let (g, _) = self
            .cond
            .wait_timeout_while(g, wait, |s| newer(s).is_none())
            .unwrap_or_else(|p| p.into_inner());
        newer(&g)
    }

    pub fn newest_committed(&self) -> Option<SnapshotId> {
        self.lock().committed.clone()
    }

    /// Every snapshot up to `id` is on the standbys that count (insync.rs).
    pub fn acked(&self, id: &SnapshotId) {
        {
            let mut g = self.lock();
            if g.acked.as_ref().is_some_and(|a| a >= id) {
                return;
            }
            g.acked = Some(id.clone());
        }
        let one: u64 = 1;
        // SAFETY: an 8-byte write to an eventfd.
        unsafe { libc::write(self.acked_efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// The engine: how far the standbys have acknowledged (drains the fd).
    pub fn take_acked(&self) -> Option<SnapshotId> {
        let mut v: u64 = 0;
        // SAFETY: an 8-byte read from an eventfd.
        unsafe { libc::read(self.acked_efd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        self.lock().acked.clone()
    }

    /// How far the standbys have acknowledged (the fd is left as it is).
    pub fn acked_now(&self) -> Option<SnapshotId> {
        self.lock().acked.clone()
    }

    /// The engine waits for acknowledgements (sync, or async with a bound).
    pub fn waits_for_acks(&self) -> bool {
        self.sync || self.max_lag.is_some()
    }

    pub fn acked_fd(&self) -> i32 {
        self.acked_efd.as_raw_fd()
    }
}

impl std::fmt::Debug for ReplicationLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationLink")
            .field("sync", &self.sync)
            .finish_non_exhaustive()
    }
}
