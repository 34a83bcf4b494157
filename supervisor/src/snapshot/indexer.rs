//! The engine's location-index writer (store/location_index.rs): after a
//! commit, a thread of its own (at a lower priority than the app) writes
//! the index of the newest snapshot, at most once per `MIN_GAP`, so that a
//! restore after the machine dies finds the pages' chunks without folding
//! the chain.  It starts from the newest index already there and folds
//! only the deltas since; the older index is then removed.  Jobs start at
//! least `MIN_GAP` apart, and `DUTY` times the CPU time the last one used
//! (its thread's: a job at nice 10 on a busy machine waits for the CPU,
//! and that wait costs nobody anything, so counting wall time spaced the
//! indexes 20-30 s apart under load and a restore then folded 7-9 big
//! deltas, 250-380 ms at 5 M keys).  A snapshot
//! committed since the last index is restored through that index and the
//! deltas after it: the gap bounds what such a restore folds.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::store::location_index::SUFFIX;
use crate::store::{SnapshotId, Store, StoreError};

/// The least time between two index writes (each rewrites the whole
/// index: about 56 bytes a present page, 15 MB for a 1 GiB arena).
pub const MIN_GAP: Duration = Duration::from_secs(2);
/// And at least this many times the last job's CPU time: the jobs take at
/// most a tenth of a core, however slow the machine or large the arena.
pub const DUTY: u32 = 10;

/// What a finished job did.
#[derive(Debug, Clone)]
pub struct Indexed {
    pub id: SnapshotId,
    pub bytes: u64,
    pub took: Duration,
    /// The job thread's CPU time (what `DUTY` multiplies).
    pub cpu: Duration,
    /// How the job's own open went: "index_used" (from an older index
    /// and the deltas after it) or why it folded the chain.
    pub from: &'static str,
    pub deltas: usize,
    /// Older indexes removed.
    pub removed: usize,
}

pub struct Indexer {
    dir: PathBuf,
    job: Option<JoinHandle<Result<Indexed, StoreError>>>,
    /// The newest snapshot committed and not yet given to a job.
    pending: Option<SnapshotId>,
    last_start: Option<Instant>,
    /// The CPU time of the last job (its wall time if it failed).
    last_took: Duration,
}

impl Indexer {
    pub fn new(dir: PathBuf) -> Indexer {
        Indexer {
            dir,
            job: None,
            pending: None,
            last_start: None,
            last_took: Duration::ZERO,
        }
    }

    /// A snapshot was committed: index it when the gap allows.
    pub fn committed(&mut self, id: SnapshotId) {
        // a background fold reported after a newer published snapshot
        let older = |p: &SnapshotId| matches!((id.seq(), p.seq()), (Some(a), Some(b)) if a < b);
        if !self.pending.as_ref().is_some_and(older) {
            self.pending = Some(id);
        }
    }

    /// At every turn of the engine's loop: what a job that finished did;
    /// starts the next job if one is due.
    pub fn tick(&mut self) -> Option<(SnapshotId, Result<Indexed, StoreError>)> {
        let mut out = None;
        if self.job.as_ref().is_some_and(|j| j.is_finished())
            && let Some(j) = self.job.take()
        {
            let r = j.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            self.last_took = match &r {
                Ok(d) => d.cpu,
                Err(_) => self.last_start.map_or(Duration::ZERO, |t| t.elapsed()),
            };
            let id = match &r {
                Ok(d) => d.id.clone(),
                Err(_) => SnapshotId(String::new()),
            };
            out = Some((id, r));
        }
        let due = self.last_start.is_none_or(|t| t.elapsed() >= self.gap());
        if self.job.is_none()
            && due
            && let Some(id) = self.pending.take()
        {
            let dir = self.dir.clone();
            let spawned = std::thread::Builder::new()
                .name("rk-loc-index".into())
                .spawn(move || write_index(&dir, &id));
            match spawned {
                Ok(h) => {
                    self.job = Some(h);
                    self.last_start = Some(Instant::now());
                }
                Err(e) => {
                    let err = StoreError::Io {
                        path: self.dir.clone(),
                        op: "starting the location index thread",
                        detail: e.to_string(),
                    };
                    out = Some((SnapshotId(String::new()), Err(err)));
                }
            }
        }
        out
    }

    /// The time between two jobs' starts.
    fn gap(&self) -> Duration {
        MIN_GAP.max(self.last_took.saturating_mul(DUTY))
    }

    /// How long the engine may sleep before `tick` has something to do.
    pub fn wait(&self) -> Option<Duration> {
        if self.job.is_some() {
            return Some(Duration::from_millis(100));
        }
        self.pending.as_ref()?;
        Some(
            self.last_start
                .map_or(Duration::ZERO, |t| self.gap().saturating_sub(t.elapsed())),
        )
    }
}

/// The job: open the snapshot (through the newest index of its chain),
/// write its index, remove the store's older ones.
fn write_index(dir: &std::path::Path, id: &SnapshotId) -> Result<Indexed, StoreError> {
    super::lower_this_thread(10); // off the app's path
    let t0 = Instant::now();
    let cpu0 = thread_cpu();
    let store = Store::open_unindexed(dir)?;
    let (reader, how) = store.open_snapshot_traced(id)?;
    let (path, bytes) = store.write_location_index(&reader)?;
    let mut removed = 0;
    let own = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let snaps = path.parent().unwrap_or(dir);
    if let Ok(rd) = std::fs::read_dir(snaps) {
        for ent in rd.flatten() {
            let name = ent.file_name();
            let Some(n) = name.to_str() else { continue };
            // older ones only: a newer snapshot's index may be being written
            if n.ends_with(SUFFIX) && n < own && std::fs::remove_file(ent.path()).is_ok() {
                removed += 1;
            }
        }
    }
    Ok(Indexed {
        id: id.clone(),
        bytes,
        took: t0.elapsed(),
        cpu: thread_cpu().saturating_sub(cpu0),
        from: how.code(),
        deltas: how.deltas,
        removed,
    })
}

/// The calling thread's CPU time.  (The short-lived helpers of an open,
/// such as the checksum of an index read on a second core, are not
/// counted.)
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_wait_for_the_gap_and_a_slow_job_widens_it() {
        let mut ix = Indexer::new(PathBuf::from("/nonexistent"));
        assert_eq!(ix.wait(), None, "nothing committed: nothing to do");
        ix.committed(SnapshotId("000000000001-x".into()));
        assert_eq!(ix.wait(), Some(Duration::ZERO));
        assert_eq!(ix.gap(), MIN_GAP);
        ix.last_took = Duration::from_secs(1);
        assert_eq!(ix.gap(), Duration::from_secs(10));
        // a job on a store that is not there fails, and says so
        assert!(ix.tick().is_none(), "started, not finished");
        let deadline = Instant::now() + Duration::from_secs(10);
        let done = loop {
            if let Some(r) = ix.tick() {
                break r;
            }
            assert!(Instant::now() < deadline, "the job did not end");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(done.1.is_err());
        ix.committed(SnapshotId("000000000002-x".into()));
        let w = ix.wait().unwrap_or_default();
        assert!(w > Duration::from_secs(1), "within the gap: {w:?}");
    }

    #[test]
    fn an_older_snapshot_reported_late_does_not_replace_a_newer_one() {
        let mut ix = Indexer::new(PathBuf::from("/nonexistent"));
        ix.committed(SnapshotId("000000000009-x".into()));
        // a background fold's run, reported after a newer published one
        ix.committed(SnapshotId("000000000007-x".into()));
        assert_eq!(ix.pending, Some(SnapshotId("000000000009-x".into())));
        ix.committed(SnapshotId("000000000012-x".into()));
        assert_eq!(ix.pending, Some(SnapshotId("000000000012-x".into())));
    }
}
