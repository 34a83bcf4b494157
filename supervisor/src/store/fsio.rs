//! The store's I/O steps (write, fsync, rename, unlink), each counted for
//! the test-only fault hook: with `REKINDLE_STORE_FAULT_AT=N` in the
//! environment the process aborts (SIGABRT, no cleanup) just before its
//! Nth step, so tests can kill a writer at every point deterministically.
//! `REKINDLE_STORE_FAULT_TRACE=1` prints each step to stderr (to count them).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use super::error::{StoreError, io_at};

static STEP: AtomicU64 = AtomicU64::new(0);

fn fault_at() -> Option<u64> {
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    *AT.get_or_init(|| {
        std::env::var("REKINDLE_STORE_FAULT_AT")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("REKINDLE_STORE_FAULT_TRACE").is_some())
}

/// Counts one I/O step; aborts the process at the configured one.
pub fn step(what: &str, path: &Path) {
    let n = STEP.fetch_add(1, Ordering::Relaxed) + 1;
    if trace() {
        eprintln!("store-step {n} {what} {}", path.display());
    }
    if fault_at() == Some(n) {
        eprintln!(
            "rekindle: REKINDLE_STORE_FAULT_AT={n}: aborting before {what} {}",
            path.display()
        );
        std::process::abort();
    }
}

/// Creates a new file for writing (fails if it exists), mode 0644.
pub fn create_new(path: &Path) -> Result<File, StoreError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(io_at("create", path))
}

pub fn write_all(f: &mut File, path: &Path, data: &[u8]) -> Result<(), StoreError> {
    step("write", path);
    f.write_all(data).map_err(io_at("write", path))
}

pub fn fsync(f: &File, path: &Path) -> Result<(), StoreError> {
    step("fsync", path);
    f.sync_all().map_err(io_at("fsync", path))
}

pub fn rename(from: &Path, to: &Path) -> Result<(), StoreError> {
    step("rename", to);
    std::fs::rename(from, to).map_err(io_at("rename", to))
}

pub fn unlink(path: &Path) -> Result<(), StoreError> {
    step("unlink", path);
    std::fs::remove_file(path).map_err(io_at("unlink", path))
}

pub fn fsync_dir(dir: &Path) -> Result<(), StoreError> {
    step("fsync-dir", dir);
    let f = File::open(dir).map_err(io_at("open", dir))?;
    f.sync_all().map_err(io_at("fsync", dir))
}

/// Writes all of `data` at `off` (a memfd being restored into, mostly).
pub fn pwrite_all(fd: std::os::fd::BorrowedFd<'_>, data: &[u8], off: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < data.len() {
        let n = nix::sys::uio::pwrite(fd, &data[done..], (off + done as u64) as i64)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        done += n;
    }
    Ok(())
}

/// Writes a whole new file, without fsync; returns it open.
pub fn write_new(path: &Path, data: &[u8]) -> Result<File, StoreError> {
    let _ = std::fs::remove_file(path); // a leftover of a crashed write
    let mut f = create_new(path)?;
    write_all(&mut f, path, data)?;
    Ok(f)
}

/// fsyncs files in parallel: a journaling file system commits them
/// together, so a commit waits about one fsync instead of one per file.
/// The caller syncs the first; the others go to long-lived threads (a
/// snapshot every 10 ms would otherwise start and stop two threads each
/// time).  Their steps are counted here, in order, before any is synced.
pub fn fsync_many(files: &[(&File, &Path)]) -> Result<(), StoreError> {
    let Some((&(first, first_path), others)) = files.split_first() else {
        return Ok(());
    };
    for &(_, p) in files {
        step("fsync", p);
    }
    let (done, results) = mpsc::channel();
    let mut r = Ok(());
    let mut handed = 0;
    for &(f, p) in others {
        if fsync_pool::hand_over(f, p, &done) {
            handed += 1;
        } else {
            keep_first_error(&mut r, f.sync_all().map_err(io_at("fsync", p)));
        }
    }
    keep_first_error(&mut r, first.sync_all().map_err(io_at("fsync", first_path)));
    // a job dropped unanswered (its thread gone) then ends the wait below
    drop(done);
    for _ in 0..handed {
        let res = results.recv().unwrap_or_else(|_| {
            Err(StoreError::Io {
                path: Default::default(),
                op: "fsync",
                detail: "the fsync thread is gone".into(),
            })
        });
        keep_first_error(&mut r, res);
    }
    r
}

fn keep_first_error(r: &mut Result<(), StoreError>, next: Result<(), StoreError>) {
    if r.is_ok() {
        *r = next;
    }
}

/// The threads `fsync_many` hands files to, started on first use.
/// Starts a thread with every signal blocked, which it keeps: a thread may
/// start before the supervisor blocks SIGTERM for its signalfd, and one that
/// does not block it would take the default action (see fsync_pool).
pub fn spawn_quiet<F>(name: &str, f: F) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
    let all = SigSet::all();
    let mut before = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&all), Some(&mut before))
        .map_err(std::io::Error::from)?;
    let r = std::thread::Builder::new().name(name.into()).spawn(f);
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
    r
}

mod fsync_pool {
    use std::fs::File;
    use std::path::{Path, PathBuf};
    use std::sync::mpsc::{Receiver, Sender, channel};
    use std::sync::{Arc, Mutex, OnceLock};

    use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};

    use super::{StoreError, io_at};

    /// A commit syncs at most three files at once: the caller and two.
    const THREADS: usize = 2;

    struct Job {
        file: File,
        path: PathBuf,
        done: Sender<Result<(), StoreError>>,
    }

    fn jobs() -> Option<&'static Sender<Job>> {
        static JOBS: OnceLock<Option<Sender<Job>>> = OnceLock::new();
        JOBS.get_or_init(|| {
            let (tx, rx) = channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            // Started with every signal blocked, which they keep: they may
            // start before the supervisor blocks SIGTERM for its signalfd
            // (a restore folds a journal first), and a thread that does not
            // block it would take the default action, killing the
            // supervisor and orphaning its app.
            let all = SigSet::all();
            let mut before = SigSet::empty();
            if pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&all), Some(&mut before)).is_err() {
                return None;
            }
            let started = (0..THREADS)
                .filter(|_| {
                    let rx = Arc::clone(&rx);
                    std::thread::Builder::new()
                        .name("rk-fsync".into())
                        .spawn(move || work(&rx))
                        .is_ok()
                })
                .count();
            let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
            (started > 0).then_some(tx)
        })
        .as_ref()
    }

    fn work(rx: &Mutex<Receiver<Job>>) {
        loop {
            let job = match rx.lock() {
                Ok(rx) => rx.recv(),
                Err(_) => return,
            };
            let Ok(job) = job else { return };
            let r = job.file.sync_all().map_err(io_at("fsync", &job.path));
            let _ = job.done.send(r);
        }
    }

    /// False: no thread took it (none could start, or the fd could not be
    /// duplicated); the caller syncs it itself.
    pub(super) fn hand_over(f: &File, path: &Path, done: &Sender<Result<(), StoreError>>) -> bool {
        let (Some(jobs), Ok(file)) = (jobs(), f.try_clone()) else {
            return false;
        };
        jobs.send(Job {
            file,
            path: path.to_path_buf(),
            done: done.clone(),
        })
        .is_ok()
    }
}

/// fsyncs directories in parallel (see `fsync_many`).
pub fn fsync_dirs(dirs: &[&Path]) -> Result<(), StoreError> {
    let mut opened = Vec::with_capacity(dirs.len());
    for d in dirs {
        opened.push((File::open(d).map_err(io_at("open", d))?, *d));
    }
    let refs: Vec<(&File, &Path)> = opened.iter().map(|(f, d)| (f, *d)).collect();
    fsync_many(&refs)
}

/// Writes a whole small file and fsyncs it (the caller renames it).
pub fn write_file_durable(path: &Path, data: &[u8]) -> Result<(), StoreError> {
    let _ = std::fs::remove_file(path); // a leftover of a crashed write
    let mut f = create_new(path)?;
    write_all(&mut f, path, data)?;
    fsync(&f, path)
}

/// Publishes `data` at `to` atomically: temp file, fsync, rename.  The
/// caller fsyncs the directory.
pub fn publish_file(tmp: &Path, to: &Path, data: &[u8]) -> Result<(), StoreError> {
    write_file_durable(tmp, data)?;
    if let Err(e) = rename(tmp, to) {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    Ok(())
}
