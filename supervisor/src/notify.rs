//! sd_notify both ways, and the systemd fd store.
//!
//! * Upward: when the supervisor runs under systemd ($NOTIFY_SOCKET), it
//!   sends READY=1, WATCHDOG=1, STATUS=..., and parks the held fds with
//!   FDSTORE=1 / FDNAME=rekindle-... (FDSTOREREMOVE=1 for dropped ones).
//! * Downward: the app gets our own datagram socket as $NOTIFY_SOCKET;
//!   READY=1 counts as ready, WATCHDOG=1 as a heartbeat.
//! * At start, fds systemd hands back in LISTEN_FDS/LISTEN_FDNAMES named
//!   rekindle-* are adopted as the held set; the others are listening
//!   sockets (socket activation).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, UnixAddr, sendmsg, socket,
};

use crate::proto::FdKind;

/// One assignment from a notify datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Ready,
    Watchdog,
    Stopping,
    Status(String),
    Other(String),
}

/// Parses a notify datagram: newline-separated KEY=VALUE assignments.
pub fn parse_notify(data: &[u8]) -> Vec<Notice> {
    let text = String::from_utf8_lossy(data);
    text.split('\n')
        .filter(|l| !l.is_empty())
        .take(64)
        .map(|l| match l.split_once('=') {
            Some(("READY", "1")) => Notice::Ready,
            Some(("WATCHDOG", "1")) => Notice::Watchdog,
            Some(("STOPPING", "1")) => Notice::Stopping,
            Some(("STATUS", s)) => Notice::Status(s.chars().take(256).collect()),
            _ => Notice::Other(l.chars().take(64).collect()),
        })
        .collect()
}

// ---- FDNAME encoding ---------------------------------------------------------

/// systemd fd names may not hold ':' or control characters; percent-encode
/// anything outside [A-Za-z0-9._-].
pub fn fdname_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

pub fn fdname_unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// FDNAME for a held fd: rekindle-manifest, rekindle-arena-NAME,
/// rekindle-range-ADDR.
pub fn fdname(kind: FdKind, name: &str) -> String {
    match kind {
        FdKind::Manifest => "rekindle-manifest".into(),
        FdKind::Arena => format!("rekindle-arena-{}", fdname_escape(name)),
        FdKind::Range => format!(
            "rekindle-range-{}",
            fdname_escape(name.strip_prefix("range:").unwrap_or(name))
        ),
    }
}

/// The inverse of `fdname`: (kind, protocol name), or None if not ours.
pub fn parse_fdname(n: &str) -> Option<(FdKind, String)> {
    if n == "rekindle-manifest" {
        return Some((FdKind::Manifest, "manifest".into()));
    }
    if let Some(a) = n.strip_prefix("rekindle-arena-") {
        return Some((FdKind::Arena, fdname_unescape(a)?));
    }
    if let Some(r) = n.strip_prefix("rekindle-range-") {
        return Some((FdKind::Range, format!("range:{}", fdname_unescape(r)?)));
    }
    None
}

// ---- LISTEN_FDS from systemd -----------------------------------------------

pub struct Inherited {
    /// (kind, name, fd) named rekindle-*.
    pub held: Vec<(FdKind, String, OwnedFd)>,
    /// Everything else: listening sockets from socket activation.
    pub listen: Vec<(String, OwnedFd)>,
}

/// Takes the fds systemd passed us (LISTEN_PID must be our pid) and unsets
/// LISTEN_FDS, LISTEN_PID and LISTEN_FDNAMES.
pub fn take_listen_fds() -> Inherited {
    let mut inh = Inherited {
        held: Vec::new(),
        listen: Vec::new(),
    };
    let pid_ok = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    let n = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.trim().parse::<u32>().ok())
        .unwrap_or(0);
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    // SAFETY: single-threaded at start-up, before anything reads the environment concurrently.
    unsafe {
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDNAMES");
    }
    if !pid_ok || n == 0 || n > 4096 {
        return inh;
    }
    let names: Vec<&str> = names.split(':').collect();
    for i in 0..n as usize {
        let raw = 3 + i as RawFd;
        // SAFETY: fcntl on an fd number; F_GETFD fails harmlessly if closed.
        if unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
            continue;
        }
        // SAFETY: systemd passed this fd to us; from here on we own it.
        unsafe { libc::fcntl(raw, libc::F_SETFD, libc::FD_CLOEXEC) };
        // SAFETY: as above.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let name = names.get(i).copied().unwrap_or("");
        match parse_fdname(name) {
            Some((k, n)) => inh.held.push((k, n, fd)),
            None => inh.listen.push((name.to_string(), fd)),
        }
    }
    inh
}

// ---- upward: the supervisor's own NOTIFY_SOCKET -----------------------------

pub struct Systemd {
    sock: OwnedFd,
    addr: UnixAddr,
    pub watchdog_usec: Option<u64>,
}

impl Systemd {
    /// From $NOTIFY_SOCKET (unset afterwards, so the app does not get it).
    pub fn from_env() -> Option<Systemd> {
        let path = std::env::var_os("NOTIFY_SOCKET")?;
        let wd = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|&u| u > 0);
        let wd_pid_ok = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        // SAFETY: single-threaded at start-up.
        unsafe {
            std::env::remove_var("NOTIFY_SOCKET");
            std::env::remove_var("WATCHDOG_USEC");
            std::env::remove_var("WATCHDOG_PID");
        }
        let b = path.as_bytes();
        let addr = if let Some(abs) = b.strip_prefix(b"@") {
            UnixAddr::new_abstract(abs).ok()?
        } else {
            UnixAddr::new(Path::new(&path)).ok()?
        };
        let sock = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .ok()?;
        Some(Systemd {
            sock,
            addr,
            watchdog_usec: if wd_pid_ok { wd } else { None },
        })
    }

    pub fn send(&self, state: &str, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let iov = [io::IoSlice::new(state.as_bytes())];
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let cmsg = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
        sendmsg(
            self.sock.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            Some(&self.addr),
        )
        .map(|_| ())
        .map_err(io::Error::from)
    }
}

// ---- downward: the app's NOTIFY_SOCKET ----------------------------------------

pub struct AppNotify {
    sock: OwnedFd,
    /// What the app gets in $NOTIFY_SOCKET ('@' prefix for abstract).
    pub env_value: std::ffi::OsString,
    path: Option<(PathBuf, u64)>,
}

impl AppNotify {
    pub fn bind(path: &Path) -> io::Result<AppNotify> {
        let sock = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(io::Error::from)?;
        // SO_PASSCRED: each datagram says who sent it
        let one: libc::c_int = 1;
        // SAFETY: setsockopt with an int option on our socket.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        let _ = std::fs::remove_file(path);
        let (addr, env_value, kept) = match UnixAddr::new(path) {
            Ok(a) if path.as_os_str().len() < 100 => (a, path.as_os_str().to_owned(), true),
            _ => {
                // path too long for sockaddr_un: an abstract name instead
                let name = format!("rekindle/{}/notify", std::process::id());
                let a = UnixAddr::new_abstract(name.as_bytes()).map_err(io::Error::from)?;
                (a, std::ffi::OsString::from(format!("@{name}")), false)
            }
        };
        // SAFETY: umask is process-wide; we are single-threaded.
        let old = unsafe { libc::umask(0o177) };
        let r = nix::sys::socket::bind(sock.as_raw_fd(), &addr);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        r.map_err(io::Error::from)?;
        let path = if kept {
            let ino = std::fs::symlink_metadata(path)
                .map(|m| m.ino())
                .unwrap_or(0);
            Some((path.to_path_buf(), ino))
        } else {
            None
        };
        Ok(AppNotify {
            sock,
            env_value,
            path,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Reads one datagram: (sender pid, sender uid, text), or None when empty.
    pub fn recv(&self) -> io::Result<Option<(u32, u32, Vec<u8>)>> {
        let mut buf = vec![0u8; 4096];
        // any fds that came along are closed when `m` drops
        let Some(m) = crate::app_link::recv_raw(self.sock.as_fd(), &mut buf, 64)? else {
            return Ok(None);
        };
        let (pid, uid) = m.cred.unwrap_or((0, u32::MAX));
        buf.truncate(m.len);
        Ok(Some((pid, uid, buf)))
    }

    pub fn remove_file(&self) {
        if let Some((p, ino)) = &self.path
            && std::fs::symlink_metadata(p).map(|m| m.ino()).ok() == Some(*ino)
        {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A supervisor that fails to start, or ends, leaves no socket file behind.
impl Drop for AppNotify {
    fn drop(&mut self) {
        self.remove_file();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_text() {
        assert_eq!(
            parse_notify(b"READY=1\nSTATUS=serving\nWATCHDOG=1\nX=2\n"),
            vec![
                Notice::Ready,
                Notice::Status("serving".into()),
                Notice::Watchdog,
                Notice::Other("X=2".into())
            ]
        );
        assert_eq!(
            parse_notify(b"READY=0"),
            vec![Notice::Other("READY=0".into())]
        );
        assert!(parse_notify(b"").is_empty());
        let _ = parse_notify(&[0xff, 0xfe, b'\n', 0]);
    }

    #[test]
    fn fdnames_round_trip() {
        for (k, n) in [
            (FdKind::Manifest, "manifest"),
            (FdKind::Arena, "table"),
            (FdKind::Arena, "a:b c%"),
            (FdKind::Range, "range:7f0000001000"),
        ] {
            let f = fdname(k, n);
            assert!(!f.contains(':') && f.len() < 256, "{f}");
            assert_eq!(parse_fdname(&f), Some((k, n.to_string())), "{f}");
        }
        assert_eq!(parse_fdname("http"), None);
        assert_eq!(parse_fdname("rekindle-arena-%G1"), None);
    }

    #[test]
    fn app_notify_receives_with_credentials() {
        let dir = std::env::temp_dir().join(format!("rk-notify-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let p = dir.join("t.notify");
        let n = AppNotify::bind(&p).unwrap_or_else(|e| panic!("{e}"));
        let c = std::os::unix::net::UnixDatagram::unbound().unwrap_or_else(|e| panic!("{e}"));
        c.send_to(b"READY=1", &p).unwrap_or_else(|e| panic!("{e}"));
        let got = n.recv().unwrap_or_else(|e| panic!("{e}"));
        let (pid, _uid, text) = got.unwrap_or_else(|| panic!("nothing"));
        assert_eq!(pid, std::process::id());
        assert_eq!(text, b"READY=1");
        n.remove_file();
        assert!(!p.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
