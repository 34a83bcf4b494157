//! Start-up helpers of `rekindle run`: stdio, and the `--listen` sockets
//! (bound here, and their files removed at exit).

use std::os::fd::OwnedFd;

use anyhow::{Context, Result};

use crate::cli::ListenAddr;

/// fds 0, 1 and 2 must be open, or a socket could land there.
pub(super) fn ensure_stdio() {
    for fd in 0..3 {
        // SAFETY: fcntl probe, then open of /dev/null onto the lowest free fd.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFD) < 0 {
                libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            }
        }
    }
}

/// The `--listen unix:PATH` socket files we bound, by inode: removed at
/// exit, and on a failed start (Drop), if they are still ours.
#[derive(Default)]
pub(super) struct UnixListenFiles(Vec<(std::path::PathBuf, u64)>);

impl UnixListenFiles {
    pub(super) fn add(&mut self, p: &std::path::Path) {
        use std::os::unix::fs::MetadataExt;
        if let Ok(md) = std::fs::symlink_metadata(p) {
            self.0.push((p.to_path_buf(), md.ino()));
        }
    }

    pub(super) fn remove_all(&mut self) {
        use std::os::unix::fs::MetadataExt;
        for (p, ino) in self.0.drain(..) {
            if std::fs::symlink_metadata(&p).map(|m| m.ino()).ok() == Some(ino) {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
}

impl Drop for UnixListenFiles {
    fn drop(&mut self) {
        self.remove_all();
    }
}

pub(super) fn bind_listen(a: &ListenAddr) -> Result<OwnedFd> {
    match a {
        ListenAddr::Tcp(addr) => {
            let l =
                std::net::TcpListener::bind(addr).with_context(|| format!("--listen {addr}"))?;
            Ok(OwnedFd::from(l))
        }
        ListenAddr::Unix(p) => {
            use std::os::unix::fs::FileTypeExt;
            if let Ok(md) = std::fs::symlink_metadata(p)
                && md.file_type().is_socket()
            {
                let _ = std::fs::remove_file(p);
            }
            let l = std::os::unix::net::UnixListener::bind(p)
                .with_context(|| format!("--listen unix:{}", p.display()))?;
            Ok(OwnedFd::from(l))
        }
    }
}
