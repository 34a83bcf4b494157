//! Durable snapshots of a running app (docs/snapshots.md): the protocol
//! with the app's snapshot agent (`agent_link`), one snapshot from reports
//! to the store (`cut`, with `staging` for the pages copied out, a
//! `baseline` for the first one after a restore, and the `shadow` of the
//! pages as the newest snapshot holds them, for delta records), and the thread that
//! schedules them and owns the store (`engine`), which has the newest
//! snapshot's location index written off the app's path (`indexer`).

pub mod agent_link;
pub mod baseline;
pub mod cut;
pub mod engine;
pub mod indexer;
pub mod lazy;
pub mod memfd_view;
pub mod restore;
pub mod shadow;
pub mod staging;

/// Puts the calling thread below the app's priority (nice `n`; a nice is
/// per thread on Linux): the snapshot and restore work that must not take
/// the CPU from the app it serves.  Advice only: a failure changes nothing
/// but the order in which the kernel runs things.
pub(crate) fn lower_this_thread(n: i32) {
    // SAFETY: plain syscalls on this thread.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, n);
    }
}
