//! A read-only mapping of a memfd the supervisor holds, from which the cut
//! copies the pages the agent reported while the app is frozen.  A `pread`
//! costs about 2.3 us a page here (a system call and a page-cache lookup
//! per page, and a cut's dirty pages are mostly one-page runs); a copy
//! from a mapping whose page table entries are already there is a memcpy.
//!
//! A read past a memfd's end through a mapping is SIGBUS, which would kill
//! the supervisor.  So a view is made only of a memfd sealed against
//! shrinking (`F_SEAL_SHRINK`: the runtime seals its arenas so), and a read
//! is served only below the size last seen by `fstat`; anything else reads
//! with `pread`.  Only dirty pages are read this way, and only while the
//! app is frozen: a read fault on a hole through a shared mapping would put
//! a page into the memfd, where `pread` reads zeros and leaves the hole.

use std::cell::Cell;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Why a memfd has no view (it is read with `pread`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoView {
    /// Not sealed against shrinking: its end may move down under a read.
    NotSealed,
    /// `mmap` refused (address space, limits).
    MapFailed,
}

impl NoView {
    pub fn code(self) -> &'static str {
        match self {
            NoView::NotSealed => "view_not_sealed",
            NoView::MapFailed => "view_map_failed",
        }
    }
}

pub struct MemfdView {
    ptr: *mut libc::c_void,
    len: usize,
    fd: i32,
    /// The memfd's size at the last fstat: it only grows (sealed).
    size: Cell<u64>,
}

// SAFETY: the mapping is owned by this value and only read; the engine's
// thread is the only user.
unsafe impl Send for MemfdView {}

impl MemfdView {
    /// A view of the first `len` bytes of `fd`'s address range (the
    /// region's length, which may be past the memfd's current end).  The
    /// view does not own the fd: its holder keeps it open for as long.
    pub fn open(fd: BorrowedFd<'_>, len: u64) -> Result<MemfdView, NoView> {
        let raw = fd.as_raw_fd();
        // SAFETY: fcntl on a valid fd.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(NoView::NotSealed);
        }
        let len = usize::try_from(len).map_err(|_| NoView::MapFailed)?;
        if len == 0 {
            return Err(NoView::MapFailed);
        }
        // SAFETY: a fresh read-only shared mapping; nothing else is at it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                raw,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(NoView::MapFailed);
        }
        Ok(MemfdView {
            ptr,
            len,
            fd: raw,
            size: Cell::new(0),
        })
    }

    /// The `len` bytes at `off` if they are all below the memfd's end;
    /// None: read them otherwise.  Only while the app is frozen: nobody
    /// writes them for as long as the slice is used.
    pub fn bytes(&self, off: u64, len: usize) -> Option<&[u8]> {
        let end = off.checked_add(len as u64)?;
        if end > self.len as u64 {
            return None;
        }
        if end > self.size.get() {
            self.size.set(fd_size(self.fd)); // 0 if fstat fails: refused
            if end > self.size.get() {
                return None;
            }
        }
        // SAFETY: [off, end) is inside the mapping and below the memfd's
        // end, which cannot move down (F_SEAL_SHRINK): no SIGBUS.  The app
        // is frozen, so nobody writes these bytes while we read them.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>().add(off as usize), len) })
    }
}

/// A file's size, 0 if fstat fails.
pub fn fd_size(fd: i32) -> u64 {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into a zeroed stat.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return 0;
    }
    st.st_size as u64
}

/// Seals a memfd the app will map against shrinking (`F_SEAL_SHRINK`; it
/// must have been made with `MFD_ALLOW_SEALING`): an arena only grows, and
/// only a memfd sealed so gets a view.
pub fn seal_against_shrinking(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    // SAFETY: fcntl on a valid fd.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for MemfdView {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

    fn memfd(seal: bool, size: i64) -> OwnedFd {
        let flags = libc::MFD_CLOEXEC | if seal { libc::MFD_ALLOW_SEALING } else { 0 };
        // SAFETY: a NUL-terminated name; then our fd.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"view".as_ptr(), flags)) };
        // SAFETY: sizing and sealing our memfd.
        unsafe {
            assert_eq!(libc::ftruncate(fd.as_raw_fd(), size), 0);
            if seal {
                assert_eq!(
                    libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK),
                    0
                );
            }
        }
        fd
    }

    #[test]
    fn reads_below_the_end_of_a_sealed_memfd_only() {
        let fd = memfd(true, 8192);
        let page: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        // SAFETY: writing our buffer into our memfd.
        assert_eq!(
            unsafe { libc::pwrite(fd.as_raw_fd(), page.as_ptr().cast(), 4096, 4096) },
            4096
        );
        let v = MemfdView::open(fd.as_fd(), 64 << 10).unwrap();
        assert_eq!(v.bytes(4096, 4096), Some(&page[..]));
        // past the end (it would be SIGBUS through the mapping): refused
        assert_eq!(v.bytes(8192, 4096), None);
        assert_eq!(v.bytes(4096, 8192), None);
        assert_eq!(v.bytes(u64::MAX - 10, 4096), None);
        // the memfd grows: the page is there now
        // SAFETY: growing our memfd.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 12288) }, 0);
        assert!(
            v.bytes(8192, 4096)
                .is_some_and(|b| b.iter().all(|&x| x == 0))
        );
        // past the view's length: refused
        assert_eq!(v.bytes(64 << 10, 4096), None);
    }

    #[test]
    fn a_memfd_that_may_shrink_has_no_view() {
        let fd = memfd(false, 8192);
        assert_eq!(
            MemfdView::open(fd.as_fd(), 8192).err(),
            Some(NoView::NotSealed)
        );
        let fd = memfd(true, 0);
        assert_eq!(
            MemfdView::open(fd.as_fd(), 0).err(),
            Some(NoView::MapFailed)
        );
    }
}
