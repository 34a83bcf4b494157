//! The arena header check the supervisor makes on a held arena fd before it
//! decides warm (struct rk_arena_hdr in runtime/src/rk_internal.h): magic at
//! offset 0, version 1 at offset 8, and the FNV-1a 64 checksum of bytes
//! [0, 112) stored at offset 112.  The runtime makes fuller checks when it
//! maps the arena; this one catches a header that a dying process scribbled
//! on, so the supervisor can say why it went cold.

use std::os::fd::{AsRawFd, BorrowedFd};

pub const ARENA_MAGIC: u64 = 0x414e_4552_414b_5231; // "1RKARENA"
pub const ARENA_VERSION: u32 = 1;
pub const OFF_MAGIC: usize = 0;
pub const OFF_VERSION: usize = 8;
/// The checksum covers [0, CHECKED_LEN) and is stored at CHECKED_LEN
/// (checked against the C header by tests/layout.rs).
pub const CHECKED_LEN: usize = 112;
pub const HDR_PREFIX: usize = 120;

pub fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Checks the first 120 bytes of an arena header; Err says what is wrong.
pub fn check_header_bytes(b: &[u8]) -> Result<(), String> {
    if b.len() < HDR_PREFIX {
        return Err(format!("header truncated ({} bytes)", b.len()));
    }
    let u64_at = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let magic = u64_at(OFF_MAGIC);
    if magic != ARENA_MAGIC {
        return Err(format!("header magic {magic:#x} is wrong"));
    }
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[OFF_VERSION..OFF_VERSION + 4]);
    let version = u32::from_le_bytes(v);
    if version != ARENA_VERSION {
        return Err(format!("header version {version} is not {ARENA_VERSION}"));
    }
    if u64_at(CHECKED_LEN) != fnv1a(&b[..CHECKED_LEN]) {
        return Err("header checksum mismatch".into());
    }
    Ok(())
}

/// Whether fd is one of the runtime's memfds ("/memfd:rekindle:..." and a
/// regular file): only those are held, and only those are ever read.
pub fn is_rekindle_memfd(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: fstat into a zeroed struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0
        || st.st_mode & libc::S_IFMT != libc::S_IFREG
    {
        return false;
    }
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|t| t.to_string_lossy().starts_with("/memfd:rekindle:"))
        .unwrap_or(false)
}

/// Reads the header prefix from an arena memfd with pread (no mapping, so a
/// memfd that was truncated cannot SIGBUS the supervisor).
pub fn check_header_fd(fd: BorrowedFd<'_>) -> Result<(), String> {
    if !is_rekindle_memfd(fd) {
        return Err("not a rekindle memfd".into());
    }
    let mut buf = [0u8; HDR_PREFIX];
    let mut got = 0usize;
    while got < HDR_PREFIX {
        // SAFETY: pread into our own buffer, within its bounds.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf[got..].as_mut_ptr().cast(),
                HDR_PREFIX - got,
                got as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("cannot read the header: {e}"));
        }
        if n == 0 {
            break;
        }
        got += n as usize;
    }
    check_header_bytes(&buf[..got])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

    fn valid_header() -> Vec<u8> {
        let mut h = vec![0u8; 4096];
        h[0..8].copy_from_slice(&ARENA_MAGIC.to_le_bytes());
        h[8..12].copy_from_slice(&1u32.to_le_bytes());
        h[12..16].copy_from_slice(&4096u32.to_le_bytes());
        h[64..69].copy_from_slice(b"table");
        let c = fnv1a(&h[..CHECKED_LEN]);
        h[112..120].copy_from_slice(&c.to_le_bytes());
        h
    }

    fn memfd_with(bytes: &[u8]) -> OwnedFd {
        // SAFETY: memfd_create with a static NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"rekindle:test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd is a fresh descriptor that we own.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut f = std::fs::File::from(owned);
        f.write_all(bytes).unwrap_or_else(|e| panic!("{e}"));
        OwnedFd::from(f)
    }

    #[test]
    fn only_rekindle_memfds_are_accepted() {
        let fd = memfd_with(&valid_header()); // "rekindle:test"
        assert!(is_rekindle_memfd(fd.as_fd()));
        let f = std::fs::File::open("/proc/self/status").unwrap_or_else(|e| panic!("{e}"));
        assert!(!is_rekindle_memfd(f.as_fd()));
        // SAFETY: memfd_create with a static name.
        let raw = unsafe { libc::memfd_create(c"other".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: fresh fd, ours.
        let other = unsafe { OwnedFd::from_raw_fd(raw) };
        assert!(!is_rekindle_memfd(other.as_fd()));
    }

    #[test]
    fn fnv1a_known_values() {
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn valid_header_on_a_memfd_passes() {
        let fd = memfd_with(&valid_header());
        assert_eq!(check_header_fd(fd.as_fd()), Ok(()));
    }

    #[test]
    fn corrupted_headers_fail_with_a_reason() {
        let mut h = valid_header();
        h[100] ^= 0x5a; // inside the name: the checksum no longer matches
        let fd = memfd_with(&h);
        assert_eq!(
            check_header_fd(fd.as_fd()),
            Err("header checksum mismatch".into())
        );

        let mut h = valid_header();
        h[0] = 0;
        assert!(check_header_fd(memfd_with(&h).as_fd()).is_err_and(|e| e.contains("magic")));

        let mut h = valid_header();
        h[8] = 2;
        assert!(check_header_fd(memfd_with(&h).as_fd()).is_err_and(|e| e.contains("version")));

        assert!(check_header_fd(memfd_with(&[]).as_fd()).is_err_and(|e| e.contains("truncated")));
    }
}
