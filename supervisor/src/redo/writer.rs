//! The redo writer: a thread of the supervisor that moves the records the
//! app committed from the ring to DIR/redo (one write and one `fdatasync`
//! for everything committed since the last), then tells the app how far
//! they are durable.
//!
//! Durable means: after the machine dies, the restore brings the change
//! back.  A record on disk is that once some snapshot of its line is
//! durable (the restore starts from one and replays the line after it).
//! A record of a line with no durable snapshot yet is durable only once a
//! durable snapshot's position passes it (that snapshot holds its change).

use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use super::ring::Ring;
use crate::store::StoreError;
use crate::store::manifest::RedoMark;
use crate::store::redo::{RedoWriter, retain};

/// Without a kick, committed records are written this often.
const IDLE_FLUSH: Duration = Duration::from_millis(100);
/// Retention runs at most this often.
const RETAIN_EVERY: Duration = Duration::from_secs(1);

pub enum Msg {
    /// A cut opened `line` at `at` (sent before the app is released).
    OpenLine {
        line: u64,
        at: u64,
    },
    /// A snapshot with this mark is durable.
    SnapshotDurable(RedoMark),
    /// The app is dead: write everything it committed, then close the log;
    /// the reply says whether all of it is on disk.
    DrainAndClose(Sender<Result<u64, StoreError>>),
    Stop,
}

/// What the writer did, for metrics and the `redo` event.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub bytes: u64,
    pub flushes: u64,
    pub flush_us_total: u64,
    pub last_error: Option<String>,
}

pub struct Writer {
    pub ring: Arc<Ring>,
    pub dir: PathBuf,
    pub rx: Receiver<Msg>,
    pub stats: Arc<std::sync::Mutex<Stats>>,
    pub metrics: Option<crate::metrics::RedoMetrics>,
    /// The last write failed: the app's appends fail until one succeeds.
    pub failing: std::sync::atomic::AtomicBool,
}

struct State {
    files: Option<RedoWriter>,
    /// Lines in the order they opened: (id, start).
    lines: Vec<(u64, u64)>,
    /// Lines that have a durable snapshot.
    based: HashSet<u64>,
    /// The highest position of a durable snapshot.
    snapshot_at: u64,
    last_retain: Instant,
    /// The two newest durable snapshots' marks, newest last: a crash
    /// loop's restore takes the one from before the looping incarnation
    /// began, which is usually the one before the newest.
    marks: Vec<RedoMark>,
}

impl Writer {
    pub fn run(self) {
        crate::snapshot::lower_this_thread(0);
        let mut st = State {
            files: None,
            lines: Vec::new(),
            based: HashSet::new(),
            snapshot_at: 0,
            last_retain: Instant::now(),
            marks: Vec::new(),
        };
        loop {
            let kicked = self.wait_kick();
            // committed first, then the messages: an OpenLine sent before
            // the app appended past its start is seen below
            let committed = self.ring.committed();
            let mut close: Vec<Sender<Result<u64, StoreError>>> = Vec::new();
            loop {
                match self.rx.try_recv() {
                    Ok(Msg::OpenLine { line, at }) => st.lines.push((line, at)),
                    Ok(Msg::SnapshotDurable(m)) => {
                        st.based.insert(m.line);
                        st.snapshot_at = st.snapshot_at.max(m.at);
                        st.marks.push(m);
                        if st.marks.len() > 2 {
                            st.marks.remove(0);
                        }
                    }
                    Ok(Msg::DrainAndClose(reply)) => close.push(reply),
                    Ok(Msg::Stop) | Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        let _ = self.drain(&mut st, self.ring.committed());
                        return;
                    }
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                }
            }
            let committed = if close.is_empty() {
                committed
            } else {
                self.ring.committed()
            };
            if kicked || committed > self.ring.drained() || !close.is_empty() {
                let r = self.drain(&mut st, committed);
                if !close.is_empty() {
                    // closed whatever the write did: the next incarnation
                    // starts from a snapshot, and records it could not write
                    // were never durable (no reply waited for nothing)
                    self.ring.reset_closed(committed);
                    st.lines.clear();
                }
                for reply in close {
                    let _ = reply.send(r.clone().map(|_| committed));
                }
            }
            self.publish_durable(&st);
            if st.last_retain.elapsed() >= RETAIN_EVERY {
                self.retain(&mut st);
            }
        }
    }

    /// Waits for a kick (the app's flush, or a message: `Redo::send` kicks
    /// too) or the idle period; true if kicked.
    fn wait_kick(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.ring.kick.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on our eventfd.
        let n = unsafe { libc::poll(&mut p, 1, IDLE_FLUSH.as_millis() as i32) };
        if n > 0 && p.revents & libc::POLLIN != 0 {
            self.ring.drain_kick();
            return true;
        }
        false
    }

    /// Writes [drained, committed) to the files, each part under its line.
    fn drain(&self, st: &mut State, committed: u64) -> Result<(), StoreError> {
        let from = self.ring.drained();
        if committed <= from {
            return Ok(());
        }
        let t0 = Instant::now();
        let mut bytes = Vec::with_capacity((committed - from) as usize);
        self.ring.copy_out(from, committed, &mut bytes);
        let files = match &mut st.files {
            Some(f) => f,
            None => st
                .files
                .insert(RedoWriter::open(&self.dir).inspect_err(|e| {
                    self.failed(e);
                })?),
        };
        let mut at = from;
        while at < committed {
            // the line holding position `at`: the last to start at or before it
            let Some(i) = st.lines.iter().rposition(|&(_, s)| s <= at) else {
                let e = StoreError::InvalidArgument {
                    path: self.dir.clone(),
                    detail: format!("redo bytes at {at} belong to no open line"),
                };
                self.failed(&e);
                return Err(e);
            };
            let end = st
                .lines
                .get(i + 1)
                .map_or(committed, |&(_, s)| s.min(committed));
            let off = (at - from) as usize;
            let part = &bytes[off..off + (end - at) as usize];
            files.append(st.lines[i].0, at, part).inspect_err(|e| {
                self.failed(e);
            })?;
            at = end;
        }
        self.ring.set_drained(committed);
        if self
            .failing
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            // the records waited in the ring: every one is on disk now, and
            // the app may append again
            eprintln!("rekindle: redo_write_recovered: the redo log is written again");
            self.ring.set_writer_errno(0);
        }
        let took = t0.elapsed();
        if let Some(m) = &self.metrics {
            m.bytes_written.inc_by(committed - from);
            m.flushes.inc();
            m.flush_seconds.observe(took.as_secs_f64());
        }
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.bytes += committed - from;
        s.flushes += 1;
        s.flush_us_total += took.as_micros() as u64;
        Ok(())
    }

    fn failed(&self, e: &StoreError) {
        let errno = match e {
            StoreError::NoSpace { .. } => libc::ENOSPC,
            StoreError::PermissionDenied { .. } => libc::EACCES,
            _ => libc::EIO,
        };
        // never silent: the app's appends fail (-EIO) and this says why,
        // once; the records stay in the ring and every kick tries again
        if !self
            .failing
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            eprintln!(
                "rekindle: redo_write_failed: {e} ({}); the app's redo appends fail until a \
                 write succeeds (tried again at each flush)",
                e.code()
            );
        }
        self.ring.set_writer_errno(errno);
        self.stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_error = Some(format!("{} ({})", e, e.code()));
        self.ring.wake_app();
    }

    /// durable = how far every record is durable: written to disk in a
    /// line that has a durable snapshot, or below a durable snapshot's
    /// position (that snapshot holds its change).
    fn publish_durable(&self, st: &State) {
        let committed = self.ring.committed();
        let d = durable_position(
            &st.lines,
            &st.based,
            self.ring.drained(),
            st.snapshot_at.min(committed),
        );
        if let Some(m) = &self.metrics {
            m.undurable_bytes
                .set(committed.saturating_sub(d.max(self.ring.durable())) as i64);
        }
        if d > self.ring.durable() {
            self.ring.set_durable(d);
            self.ring.wake_app();
        }
    }

    /// Files below the two newest durable snapshots' positions, and of
    /// lines no restore would replay, go.
    fn retain(&self, st: &mut State) {
        st.last_retain = Instant::now();
        if st.marks.is_empty() {
            return;
        }
        let keep: Vec<(u64, u64)> = st.marks.iter().map(|m| (m.line, m.at)).collect();
        let current = st.lines.last().map(|&(l, _)| l);
        if let Err(e) = retain(&self.dir, &keep, current) {
            eprintln!("rekindle: redo_retain_failed: {e} ({})", e.code());
        }
    }
}

/// The first position whose record is not durable: the lines in the order
/// they opened (id, start), those with a durable snapshot, what is written,
/// and the highest durable snapshot's position.
fn durable_position(lines: &[(u64, u64)], based: &HashSet<u64>, written: u64, snap: u64) -> u64 {
    let mut d = written;
    for (i, &(line, start)) in lines.iter().enumerate() {
        let end = lines.get(i + 1).map_or(written, |&(_, s)| s.min(written));
        if start >= written {
            break;
        }
        if !based.contains(&line) && snap < end {
            d = snap.max(start);
            break;
        }
    }
    d.max(snap)
}

/// Receives with a timeout (for callers waiting on the writer's reply).
pub fn recv_reply<T>(rx: &Receiver<T>, timeout: Duration) -> Option<T> {
    rx.recv_timeout(timeout).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_durable_once_written_in_a_based_line_or_below_a_durable_snapshot() {
        let based: HashSet<u64> = [1, 3].into_iter().collect();
        // one based line: what is written
        assert_eq!(durable_position(&[(1, 0)], &based, 500, 0), 500);
        // a line without a durable snapshot yet: only what a snapshot holds
        assert_eq!(durable_position(&[(2, 0)], &based, 500, 120), 120);
        assert_eq!(durable_position(&[(1, 0), (2, 300)], &based, 500, 0), 300);
        // a line that never got its snapshot, then one that did: the later
        // line's records are durable once its snapshot passed the first
        assert_eq!(
            durable_position(&[(2, 0), (3, 300)], &based, 500, 300),
            500,
            "a line left without a snapshot must not hold back the ones after it"
        );
        // a snapshot ahead of what is written
        assert_eq!(durable_position(&[(2, 0)], &based, 100, 400), 400);
    }
}
