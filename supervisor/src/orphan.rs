//! Apps whose supervisor is gone.  A supervisor that is SIGKILLed (or
//! crashes) leaves its app running: it is in its own process group, holds
//! its listening sockets and its arenas, and serves on unsupervised, while
//! NAME.sock is left behind with nobody listening on it.
//!
//! Such an *orphan* is found by what every incarnation gets from its
//! supervisor: `REKINDLE_SOCKET=<path of NAME.sock>` in its environment
//! (as execve gave it: /proc/PID/environ; from older supervisors,
//! `NOTIFY_SOCKET=<path of NAME.notify>`) and the control block memfd
//! (`/memfd:rekindle:control`) among its fds.  The pair names one
//! supervisor (one runtime directory and name), and the fd excludes
//! unrelated processes that merely inherited the environment through an
//! exec.  A new `rekindle run` of that name refuses to start next to an
//! orphan (it could not bind the orphan's ports, and two copies of the app
//! would serve the same clients); `rekindle status` names it.
//!
//! Only /proc is read, with the rights `ps` has: the environment and the
//! fd links of processes of our own uid (all of them for root).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub const CONTROL_MEMFD: &str = "/memfd:rekindle:control";
pub const SOCKET_ENV: &str = "REKINDLE_SOCKET";

/// One process of an orphaned app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub comm: String,
}

fn assignment(key: &str, value: &Path) -> Vec<u8> {
    let mut v = Vec::with_capacity(key.len() + 1 + value.as_os_str().len());
    v.extend_from_slice(key.as_bytes());
    v.push(b'=');
    v.extend_from_slice(value.as_os_str().as_bytes());
    v
}

/// Whether a NUL-separated environment block names the supervisor of
/// `socket` (NAME.sock): REKINDLE_SOCKET=socket, or, from a supervisor older
/// than REKINDLE_SOCKET, NOTIFY_SOCKET=NAME.notify beside it (the app's
/// sd_notify socket, when its path was short enough to be one).
pub fn environ_names(environ: &[u8], socket: &Path) -> bool {
    let ours = assignment(SOCKET_ENV, socket);
    let notify = assignment("NOTIFY_SOCKET", &socket.with_extension("notify"));
    environ
        .split(|&c| c == 0)
        .any(|e| e == ours.as_slice() || e == notify.as_slice())
}

/// (state, ppid, pgid) from /proc/PID/stat: "pid (comm) state ppid pgrp ...",
/// where comm may hold spaces and parentheses.
pub fn parse_stat(stat: &str) -> Option<(char, i32, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut it = rest.split_whitespace();
    let state = it.next()?.chars().next()?;
    let ppid = it.next()?.parse().ok()?;
    let pgid = it.next()?.parse().ok()?;
    Some((state, ppid, pgid))
}

fn holds_control_block(pid: i32) -> bool {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    rd.filter_map(|e| e.ok()).any(|e| {
        std::fs::read_link(e.path())
            .map(|t| {
                t.as_os_str()
                    .as_bytes()
                    .starts_with(CONTROL_MEMFD.as_bytes())
            })
            .unwrap_or(false)
    })
}

/// The live processes that belong to the supervisor of `socket`, by pid.
/// Called when no supervisor listens there: then they are orphans.
pub fn find(socket: &Path) -> Vec<Orphan> {
    let me = std::process::id() as i32;
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<Orphan> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|&pid| pid != me)
        .filter(|&pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| environ_names(&env, socket))
        })
        .filter(|&pid| holds_control_block(pid))
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (state, ppid, pgid) = parse_stat(&stat)?;
            if state == 'Z' || state == 'X' {
                return None;
            }
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default();
            Some(Orphan {
                pid,
                ppid,
                pgid,
                comm,
            })
        })
        .collect();
    found.sort_by_key(|o| (o.pid != o.pgid, o.pid));
    found
}

/// "pid 1234 (service)", or "pids 1234 (sh), 1240 (sleep)": group leaders
/// (the app the supervisor started) first.
pub fn describe(orphans: &[Orphan]) -> String {
    let list: Vec<String> = orphans
        .iter()
        .map(|o| format!("{} ({})", o.pid, o.comm))
        .collect();
    match list.len() {
        1 => format!("pid {}", list[0]),
        _ => format!("pids {}", list.join(", ")),
    }
}

/// The command that stops them all: `kill PID`, or `kill -- -PGID` for a
/// process group of several.
pub fn kill_command(orphans: &[Orphan]) -> String {
    match orphans {
        [one] => format!("kill {}", one.pid),
        [first, rest @ ..] if rest.iter().all(|o| o.pgid == first.pgid) => {
            format!("kill -- -{}", first.pgid)
        }
        _ => {
            let pids: Vec<String> = orphans.iter().map(|o| o.pid.to_string()).collect();
            format!("kill {}", pids.join(" "))
        }
    }
}

/// A start refused because of an orphan.  `code()` is stable: scripts may
/// match it (it also starts the message, and is the `code` of the `error`
/// event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error(
        "orphan_app: the app of a previous `rekindle run --name {name}` still runs without its \
         supervisor (nobody listens at {}): {}. It serves unsupervised and holds its listening \
         sockets and preserved state, so a second copy cannot start beside it. Stop it with \
         `{}` (its preserved state goes with it), then run again",
        .socket.display(),
        describe(.orphans),
        kill_command(.orphans)
    )]
    OrphanApp {
        name: String,
        socket: std::path::PathBuf,
        orphans: Vec<Orphan>,
    },
}

impl StartError {
    pub fn code(&self) -> &'static str {
        match self {
            StartError::OrphanApp { .. } => "orphan_app",
        }
    }
}

/// Refuses a start next to orphans of the supervisor of `socket`.
pub fn check(name: &str, socket: &Path) -> Result<(), StartError> {
    let orphans = find(socket);
    if orphans.is_empty() {
        return Ok(());
    }
    Err(StartError::OrphanApp {
        name: name.to_string(),
        socket: socket.to_path_buf(),
        orphans,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_match_is_exact() {
        let s = Path::new("/run/user/1000/rekindle/svc.sock");
        let env = b"PATH=/bin\0REKINDLE_SOCKET=/run/user/1000/rekindle/svc.sock\0X=1\0";
        assert!(environ_names(env, s));
        assert!(!environ_names(env, Path::new("/run/user/1000/rekindle/sv")));
        assert!(!environ_names(
            b"REKINDLE_SOCKET=/run/user/1000/rekindle/svc.sock.old\0",
            s
        ));
        assert!(!environ_names(
            b"XREKINDLE_SOCKET=/run/user/1000/rekindle/svc.sock\0",
            s
        ));
        assert!(!environ_names(b"", s));
        // an app of a supervisor from before REKINDLE_SOCKET
        assert!(environ_names(
            b"NOTIFY_SOCKET=/run/user/1000/rekindle/svc.notify\0",
            s
        ));
        assert!(!environ_names(
            b"NOTIFY_SOCKET=/run/user/1000/rekindle/other.notify\0",
            s
        ));
    }

    #[test]
    fn stat_lines() {
        assert_eq!(
            parse_stat("1234 (service) S 1 1234 1234 0 -1 4194560 ..."),
            Some(('S', 1, 1234))
        );
        assert_eq!(parse_stat("77 (a) b) (c) R 5 70 70 0"), Some(('R', 5, 70)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S y 2"), None);
    }

    #[test]
    fn words_for_one_or_a_group() {
        let o = |pid, pgid, comm: &str| Orphan {
            pid,
            ppid: 1,
            pgid,
            comm: comm.into(),
        };
        let one = [o(1234, 1234, "service")];
        assert_eq!(describe(&one), "pid 1234 (service)");
        assert_eq!(kill_command(&one), "kill 1234");
        let group = [o(100, 100, "sh"), o(101, 100, "sleep")];
        assert_eq!(describe(&group), "pids 100 (sh), 101 (sleep)");
        assert_eq!(kill_command(&group), "kill -- -100");
        let mixed = [o(100, 100, "sh"), o(300, 300, "daemon")];
        assert_eq!(kill_command(&mixed), "kill 100 300");
        let e = StartError::OrphanApp {
            name: "svc".into(),
            socket: "/r/svc.sock".into(),
            orphans: one.to_vec(),
        };
        assert_eq!(e.code(), "orphan_app");
        let m = e.to_string();
        assert!(
            m.starts_with("orphan_app: the app of a previous `rekindle run --name svc`"),
            "{m}"
        );
        assert!(
            m.contains("supervisor (nobody listens at /r/svc.sock): pid 1234 (service)."),
            "{m}"
        );
        assert!(m.contains("Stop it with `kill 1234`"), "{m}");
    }

    #[test]
    fn finds_a_process_by_its_environment_and_control_block() {
        // a child with REKINDLE_SOCKET and a memfd named rekindle:control
        let sock = std::env::temp_dir().join(format!("orphan-test-{}.sock", std::process::id()));
        assert!(find(&sock).is_empty());
        // SAFETY: memfd_create with a static name; the fd is handed to the child as stdin.
        let fd = unsafe { libc::memfd_create(c"rekindle:control".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: fd is ours and open.
        let stdin = unsafe { <std::process::Stdio as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env(SOCKET_ENV, &sock)
            .stdin(stdin)
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let pid = child.id() as i32;
        let t0 = std::time::Instant::now();
        let mut got = Vec::new();
        while t0.elapsed() < std::time::Duration::from_secs(5) {
            got = find(&sock);
            if got.iter().any(|o| o.pid == pid) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(got.iter().any(|o| o.pid == pid), "{got:?}");
        assert!(!find(&sock).iter().any(|o| o.pid == pid));
    }
}
