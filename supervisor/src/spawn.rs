//! fork + execve of one incarnation with the fd layout of the contract:
//! listening sockets at 3.., the app's end of the socket pair at 3+L, the
//! control block at 4+L, everything else above 2 closed.  Everything the
//! child needs is allocated before the fork; the child only makes
//! async-signal-safe system calls.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Why PROGRAM cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    #[error("empty program name")]
    Empty,
    #[error("{0}: not found")]
    NotFound(PathBuf),
    #[error("{0}: not found in PATH")]
    NotFoundInPath(PathBuf),
    #[error("{0}: not executable ({1})")]
    NotExecutable(PathBuf, NotExecutable),
}

/// Why a file that exists cannot be executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotExecutable {
    Directory,
    NotAFile,
    NoPermission,
}

impl std::fmt::Display for NotExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotExecutable::Directory => "a directory",
            NotExecutable::NotAFile => "not a regular file",
            NotExecutable::NoPermission => "no execute permission",
        })
    }
}

/// What a path names, for `resolve_program`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Candidate {
    Missing,
    Executable,
    Not(NotExecutable),
}

fn candidate(p: &Path) -> Candidate {
    let Ok(md) = p.metadata() else {
        return Candidate::Missing;
    };
    if md.is_dir() {
        return Candidate::Not(NotExecutable::Directory);
    }
    if !md.is_file() {
        return Candidate::Not(NotExecutable::NotAFile);
    }
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return Candidate::Missing;
    };
    // SAFETY: access with a valid C string.
    if unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 {
        Candidate::Executable
    } else {
        Candidate::Not(NotExecutable::NoPermission)
    }
}

/// Resolves PROGRAM like execvp: a name with a '/' is used as is, anything
/// else is searched in $PATH (default "/usr/local/bin:/usr/bin:/bin"),
/// where files that cannot be executed are skipped.
pub fn resolve_program(prog: &OsStr) -> Result<PathBuf, ProgramError> {
    let p = Path::new(prog);
    if prog.as_bytes().contains(&b'/') {
        return match candidate(p) {
            Candidate::Executable => Ok(p.to_path_buf()),
            Candidate::Missing => Err(ProgramError::NotFound(p.to_path_buf())),
            Candidate::Not(why) => Err(ProgramError::NotExecutable(p.to_path_buf(), why)),
        };
    }
    if prog.is_empty() {
        return Err(ProgramError::Empty);
    }
    let path =
        std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    for dir in std::env::split_paths(&path) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let cand = dir.join(p);
        if candidate(&cand) == Candidate::Executable {
            return Ok(cand);
        }
    }
    Err(ProgramError::NotFoundInPath(p.to_path_buf()))
}

/// What stays the same for every incarnation.
pub struct Program {
    pub path: CString,
    pub argv: Vec<CString>,
}

impl Program {
    pub fn new(path: &Path, args: &[OsString]) -> Result<Self> {
        let path = CString::new(path.as_os_str().as_bytes()).context("program path holds a NUL")?;
        let argv = args
            .iter()
            .map(|a| CString::new(a.clone().into_vec()).context("an argument holds a NUL"))
            .collect::<Result<Vec<_>>>()?;
        Ok(Program { path, argv })
    }
}

/// The fds of one spawn, in target order.
pub struct ChildFds<'a> {
    pub listen: Vec<BorrowedFd<'a>>,
    pub app_sock: BorrowedFd<'a>,
    pub control: BorrowedFd<'a>,
    /// With snapshots: the app's end of the snapshot socket pair (5+L).
    pub snapshot: Option<BorrowedFd<'a>>,
    /// The redo log's ring, kick and done fds, then a replay if any (after
    /// the snapshot socket; `$REKINDLE_REDO_FDS` names them).
    pub redo: Vec<BorrowedFd<'a>>,
}

/// Builds "KEY=VALUE" strings.
pub fn env_entry(k: &str, v: impl AsRef<OsStr>) -> CString {
    let mut b = Vec::with_capacity(k.len() + 1 + v.as_ref().len());
    b.extend_from_slice(k.as_bytes());
    b.push(b'=');
    b.extend(v.as_ref().as_bytes().iter().copied().filter(|&c| c != 0));
    CString::new(b).unwrap_or_default()
}

/// The supervisor's environment without the variables it sets itself.
pub fn base_env(drop: &[&str]) -> Vec<CString> {
    std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.as_bytes();
            !drop.iter().any(|d| d.as_bytes() == k)
        })
        .filter_map(|(k, v)| {
            let mut b = k.into_vec();
            b.push(b'=');
            b.extend(v.into_vec());
            CString::new(b).ok()
        })
        .collect()
}

/// Forks and execs; returns the child's pid.  `env` must not contain
/// LISTEN_PID: with `listen_pid`, the child writes its own pid into a
/// buffer prepared here.
pub fn spawn(
    prog: &Program,
    env: &[CString],
    fds: &ChildFds<'_>,
    listen_pid: bool,
) -> io::Result<libc::pid_t> {
    let mut src: Vec<RawFd> = fds.listen.iter().map(|f| f.as_raw_fd()).collect();
    src.push(fds.app_sock.as_raw_fd());
    src.push(fds.control.as_raw_fd());
    if let Some(s) = fds.snapshot {
        src.push(s.as_raw_fd());
    }
    src.extend(fds.redo.iter().map(|f| f.as_raw_fd()));
    let first_free: RawFd = 3 + src.len() as RawFd;
    let mut tmp: Vec<RawFd> = vec![-1; src.len()];

    // LISTEN_PID=<pid>: 11 bytes of key, room for 10 digits and the NUL.
    let mut listen_pid_buf: Vec<u8> = b"LISTEN_PID=".to_vec();
    listen_pid_buf.resize(11 + 12, 0);
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|c| c.as_ptr()).collect();
    if listen_pid {
        envp.push(listen_pid_buf.as_ptr().cast());
    }
    envp.push(std::ptr::null());
    let mut argv: Vec<*const libc::c_char> = prog.argv.iter().map(|c| c.as_ptr()).collect();
    argv.push(std::ptr::null());
    let pid_digits: *mut u8 = listen_pid_buf[11..].as_mut_ptr();
    let exec_failed: &[u8] = b"rekindle: execve of the program failed\n";

    // SAFETY: fork (the supervisor may run its snapshot thread: the child
    // below touches no lock and no allocator); the child calls only
    // async-signal-safe functions on memory prepared before the fork, and
    // ends in execve or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid > 0 {
        return Ok(pid);
    }
    // ---- child ----
    // SAFETY: see above; no allocation, no locks.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        // Rust's runtime ignores SIGPIPE; an ignored signal stays ignored
        // across execve, which the app must not inherit.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::setpgid(0, 0);
        // 1. every source above the target range, so that no dup2 below can
        //    close a source that sits on another one's target
        for (i, &s) in src.iter().enumerate() {
            let t = libc::fcntl(s, libc::F_DUPFD, first_free);
            if t < 0 {
                libc::_exit(126);
            }
            *tmp.as_mut_ptr().add(i) = t;
        }
        // 2. onto 3, 4, ...: dup2 leaves FD_CLOEXEC clear on the copy
        for (i, &t) in tmp.iter().enumerate() {
            if libc::dup2(t, 3 + i as RawFd) < 0 {
                libc::_exit(126);
            }
        }
        // 3. everything else above them goes
        if libc::syscall(
            libc::SYS_close_range,
            first_free as libc::c_uint,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        ) < 0
        {
            let mut rl: libc::rlimit = std::mem::zeroed();
            let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0
                && rl.rlim_cur != libc::RLIM_INFINITY
            {
                rl.rlim_cur.min(1 << 20) as RawFd
            } else {
                65536
            };
            for fd in first_free..max {
                libc::close(fd);
            }
        }
        if listen_pid {
            let mut p = libc::getpid() as u32;
            let mut digits = [0u8; 10];
            let mut n = 0;
            loop {
                digits[n] = b'0' + (p % 10) as u8;
                n += 1;
                p /= 10;
                if p == 0 {
                    break;
                }
            }
            for i in 0..n {
                *pid_digits.add(i) = digits[n - 1 - i];
            }
            *pid_digits.add(n) = 0;
        }
        libc::execve(prog.path.as_ptr(), argv.as_ptr(), envp.as_ptr());
        libc::write(2, exec_failed.as_ptr().cast(), exec_failed.len());
        libc::_exit(127);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_execvp() {
        assert!(resolve_program(OsStr::new("sh")).is_ok_and(|p| p.ends_with("sh")));
        assert!(resolve_program(OsStr::new("/bin/sh")).is_ok());
        assert!(resolve_program(OsStr::new("no-such-program-rekindle")).is_err());
        assert!(resolve_program(OsStr::new("/etc/passwd")).is_err());
        assert!(resolve_program(OsStr::new("")).is_err());
    }

    #[test]
    fn says_not_found_or_not_executable() {
        let r = |s: &str| resolve_program(OsStr::new(s)).map_err(|e| e.to_string());
        assert_eq!(
            r("/no/such/program"),
            Err("/no/such/program: not found".into())
        );
        assert_eq!(
            r("no-such-program-rekindle"),
            Err("no-such-program-rekindle: not found in PATH".into())
        );
        assert_eq!(
            r("/etc/passwd"),
            Err("/etc/passwd: not executable (no execute permission)".into())
        );
        assert_eq!(r("/etc"), Err("/etc: not executable (a directory)".into()));
        assert_eq!(r(""), Err("empty program name".into()));
    }

    #[test]
    fn env_entries() {
        assert_eq!(env_entry("A", "b").as_bytes(), b"A=b");
        assert_eq!(env_entry("A", "b\0c").as_bytes(), b"A=bc");
        let e = base_env(&["PATH"]);
        assert!(!e.iter().any(|c| c.as_bytes().starts_with(b"PATH=")));
    }
}
