//! The count in `DIR/lock`: how many times a writer has taken the store's
//! lock.  A writer that finds the count it left knows that no other writer
//! has changed the store since, and can trust what it listed then
//! (`Store::lock`).  One line of 20 decimal digits; an empty file is 0.
//! Nothing else reads it: the lock is the file's `flock`, not its bytes.

use std::os::fd::BorrowedFd;

const WIDTH: usize = 20;

/// The count, or `None` if the file cannot be read or holds something
/// else (then no listing is trusted under this lock).
pub(crate) fn read(fd: BorrowedFd<'_>) -> Option<u64> {
    let mut buf = [0u8; WIDTH + 2];
    let n = nix::sys::uio::pread(fd, &mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?.trim_end_matches('\n');
    if text.is_empty() {
        return Some(0);
    }
    if text.len() != WIDTH {
        return None;
    }
    text.parse().ok()
}

/// Writes `count` in place (same width every time: no truncation needed).
pub(crate) fn write(fd: BorrowedFd<'_>, count: u64) -> std::io::Result<()> {
    let line = format!("{count:0WIDTH$}\n");
    let n = nix::sys::uio::pwrite(fd, line.as_bytes(), 0)?;
    if n != line.len() {
        return Err(std::io::Error::other("short write"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_count_reads_back_and_an_empty_file_is_zero() {
        let f = tempfile::tempfile().unwrap();
        assert_eq!(read(f.as_fd()), Some(0));
        write(f.as_fd(), 41).unwrap();
        assert_eq!(read(f.as_fd()), Some(41));
        write(f.as_fd(), u64::MAX).unwrap();
        assert_eq!(read(f.as_fd()), Some(u64::MAX));
    }

    #[test]
    fn anything_else_is_no_count() {
        let f = tempfile::tempfile().unwrap();
        nix::sys::uio::pwrite(f.as_fd(), b"hello", 0).unwrap();
        assert_eq!(read(f.as_fd()), None);
    }
}
