//! The redo ring: a memfd the supervisor creates once and hands to every
//! incarnation of the app (`$REKINDLE_REDO_FDS`), so records the app has
//! committed survive its death until the writer has them on disk.  The
//! layout is `struct rk_redo_ring` of runtime/src/rk_internal.h;
//! supervisor/tests/layout.rs checks the offsets below against it.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

pub const MAGIC: u64 = 0x3147_4f4c_4f44_4552; // "REDOLOG1"
pub const VERSION: u32 = 1;
pub const HEADER: usize = 4096;
/// A record: a little-endian u32 length, then its bytes.
pub const REC_HEAD: usize = 4;
/// The ring's bytes by default; `REKINDLE_REDO_RING_BYTES` (64 KiB to
/// 1 GiB, a power of two) sets another size.
pub const RING_BYTES: usize = 16 << 20;
pub const RING_BYTES_ENV: &str = "REKINDLE_REDO_RING_BYTES";

// Offsets in the header (rk_internal.h).
pub const OFF_MAGIC: usize = 0;
pub const OFF_VERSION: usize = 8;
pub const OFF_HEADER_SIZE: usize = 12;
pub const OFF_RING_BYTES: usize = 16;
pub const OFF_COMMITTED: usize = 64;
pub const OFF_WANT: usize = 72;
pub const OFF_APP_GAPS: usize = 80;
pub const OFF_REPLAY_PENDING: usize = 88;
pub const OFF_STARTED_AT: usize = 96;
pub const OFF_STARTED_LINE: usize = 104;
pub const OFF_LINE: usize = 128;
pub const OFF_LINE_GAPS: usize = 136;
pub const OFF_LINE_START: usize = 144;
pub const OFF_DRAINED: usize = 152;
pub const OFF_DURABLE: usize = 160;
pub const OFF_WRITER_ERRNO: usize = 168;
pub const STRUCT_SIZE: usize = 192;

fn ring_bytes() -> usize {
    let Ok(v) = std::env::var(RING_BYTES_ENV) else {
        return RING_BYTES;
    };
    match v.parse::<usize>() {
        Ok(n) if (64 << 10..=1 << 30).contains(&n) && n.is_power_of_two() => n,
        _ => {
            eprintln!(
                "rekindle: {RING_BYTES_ENV}={v:?} ignored (redo_ring_bytes_invalid: a power of \
                 two from 65536 to 1073741824); the ring is {RING_BYTES} bytes"
            );
            RING_BYTES
        }
    }
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The ring's memfd mapped shared, and the two eventfds.
pub struct Ring {
    memfd: OwnedFd,
    /// The app writes it to ask for a flush.
    pub kick: OwnedFd,
    /// We write it when `durable` (or `drained`) advanced.
    pub done: OwnedFd,
    base: *mut u8,
    len: usize,
    size: u64,
}

// SAFETY: the mapping is shared memory accessed only through atomics (the
// header) or as bytes below `committed`, which the app no longer writes.
unsafe impl Send for Ring {}
unsafe impl Sync for Ring {}

impl Ring {
    pub fn create() -> std::io::Result<Ring> {
        let size = ring_bytes();
        let len = HEADER + size;
        let name = c"rekindle:redo";
        // SAFETY: plain syscalls on a fresh fd.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: our fd; ftruncate and mmap report errors by return value.
        let base = unsafe {
            if libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                memfd.as_raw_fd(),
                0,
            );
            if p == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            p.cast::<u8>()
        };
        let r = Ring {
            memfd,
            kick: eventfd()?,
            done: eventfd()?,
            base,
            len,
            size: size as u64,
        };
        // SAFETY: inside the mapping, aligned; nobody else has it yet.
        unsafe {
            base.add(OFF_MAGIC).cast::<u64>().write(MAGIC);
            base.add(OFF_VERSION).cast::<u32>().write(VERSION);
            base.add(OFF_HEADER_SIZE).cast::<u32>().write(HEADER as u32);
            base.add(OFF_RING_BYTES).cast::<u64>().write(size as u64);
        }
        Ok(r)
    }

    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= STRUCT_SIZE && off.is_multiple_of(8));
        // SAFETY: an aligned u64 inside the header, shared with the app,
        // which accesses it as _Atomic uint64_t.
        unsafe { &*self.base.add(off).cast::<AtomicU64>() }
    }

    pub fn committed(&self) -> u64 {
        self.u64_at(OFF_COMMITTED).load(Ordering::Acquire)
    }
    pub fn want(&self) -> u64 {
        self.u64_at(OFF_WANT).load(Ordering::Acquire)
    }
    pub fn app_gaps(&self) -> u64 {
        self.u64_at(OFF_APP_GAPS).load(Ordering::Acquire)
    }
    pub fn replay_pending(&self) -> bool {
        self.u64_at(OFF_REPLAY_PENDING).load(Ordering::Acquire) != 0
    }
    pub fn set_replay_pending(&self, on: bool) {
        self.u64_at(OFF_REPLAY_PENDING)
            .store(u64::from(on), Ordering::Release);
    }
    /// Where the running (or last) incarnation began: its line (0: the
    /// log was closed) and position.
    pub fn started(&self) -> (u64, u64) {
        (
            self.u64_at(OFF_STARTED_LINE).load(Ordering::Acquire),
            self.u64_at(OFF_STARTED_AT).load(Ordering::Acquire),
        )
    }
    pub fn line(&self) -> u64 {
        self.u64_at(OFF_LINE).load(Ordering::Acquire)
    }
    pub fn line_start(&self) -> u64 {
        self.u64_at(OFF_LINE_START).load(Ordering::Acquire)
    }
    pub fn line_gaps(&self) -> u64 {
        self.u64_at(OFF_LINE_GAPS).load(Ordering::Acquire)
    }
    pub fn drained(&self) -> u64 {
        self.u64_at(OFF_DRAINED).load(Ordering::Acquire)
    }
    pub fn set_drained(&self, v: u64) {
        self.u64_at(OFF_DRAINED).store(v, Ordering::Release);
    }
    pub fn durable(&self) -> u64 {
        self.u64_at(OFF_DURABLE).load(Ordering::Acquire)
    }
    pub fn set_durable(&self, v: u64) {
        self.u64_at(OFF_DURABLE).store(v, Ordering::Release);
    }
    pub fn writer_errno(&self) -> i32 {
        self.errno_cell().load(Ordering::Acquire)
    }
    pub fn set_writer_errno(&self, e: i32) {
        self.errno_cell().store(e, Ordering::Release);
    }
    fn errno_cell(&self) -> &AtomicI32 {
        // SAFETY: an aligned i32 inside the header (_Atomic int32_t there).
        unsafe { &*self.base.add(OFF_WRITER_ERRNO).cast::<AtomicI32>() }
    }

    /// The app may append (rk_redo_open's test).
    pub fn is_open(&self) -> bool {
        self.line() != 0 && self.line_gaps() == self.app_gaps() && self.writer_errno() == 0
    }

    /// Opens `line` at `at`, the app frozen (no append can race it): the
    /// gap count it saw goes with it, so a gap after this closes it again.
    pub fn open_line(&self, line: u64, at: u64, gaps: u64) {
        self.u64_at(OFF_LINE_START).store(at, Ordering::Release);
        self.u64_at(OFF_LINE_GAPS).store(gaps, Ordering::Release);
        self.u64_at(OFF_LINE).store(line, Ordering::Release);
    }

    /// Closes the line (appends refused until a cut opens another).
    pub fn close_line(&self) {
        self.u64_at(OFF_LINE).store(0, Ordering::Release);
    }

    /// Closes the log for the next incarnation (a start from a snapshot):
    /// every position at `at`, the app dead (nothing appends).
    pub fn reset_closed(&self, at: u64) {
        self.u64_at(OFF_LINE).store(0, Ordering::Release);
        for off in [
            OFF_COMMITTED,
            OFF_WANT,
            OFF_LINE_START,
            OFF_DRAINED,
            OFF_DURABLE,
        ] {
            self.u64_at(off).store(at, Ordering::Release);
        }
        self.set_writer_errno(0);
    }

    /// Copies the ring's bytes [from, to) into `out` (appended); `to - from`
    /// must not exceed the ring's size.
    pub fn copy_out(&self, from: u64, to: u64, out: &mut Vec<u8>) {
        debug_assert!(to >= from && to - from <= self.size);
        let mask = self.size - 1;
        let mut at = from;
        while at < to {
            let off = (at & mask) as usize;
            let n = ((to - at) as usize).min(self.size as usize - off);
            // SAFETY: [HEADER + off, HEADER + off + n) is inside the mapping;
            // these bytes are committed, so the app does not write them.
            let s = unsafe { std::slice::from_raw_parts(self.base.add(HEADER + off), n) };
            out.extend_from_slice(s);
            at += n as u64;
        }
    }

    /// Wakes the app's waits on `done`.
    pub fn wake_app(&self) {
        let one: u64 = 1;
        // SAFETY: an 8-byte write to our eventfd; EAGAIN (counter full)
        // still leaves it readable, which is all a wake needs.
        unsafe {
            libc::write(
                self.done.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }

    /// Clears the kick eventfd.
    pub fn drain_kick(&self) {
        let mut v: u64 = 0;
        // SAFETY: an 8-byte read from our non-blocking eventfd.
        unsafe {
            libc::read(
                self.kick.as_raw_fd(),
                (&mut v as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            );
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once.
        unsafe {
            libc::munmap(self.base.cast(), self.len);
        }
    }
}
