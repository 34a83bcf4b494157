//! What /proc says about the app: its private memory, and whether it is
//! asleep in the kernel.

/// RssAnon of a process in bytes: its private, anonymous resident memory.
/// The arenas are shared memory (memfd pages, RssShmem) and do not count,
/// so a leak check against it sees what a restart would give back.
pub fn rss_anon(pid: libc::pid_t) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_rss_anon(&s)
}

pub fn parse_rss_anon(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let mut it = line["RssAnon:".len()..].split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    let mult = match it.next() {
        Some("kB") | None => 1024,
        Some("mB") => 1 << 20,
        Some(_) => return None,
    };
    n.checked_mul(mult)
}

/// Every thread of `pid` is asleep in a system call (state S: waiting for
/// an event, a timer or a lock): the app is idle, not busy between two
/// heartbeats.  False if a thread runs, is stopped or in uninterruptible
/// sleep, or if /proc cannot tell (the thread went away, no permission).
pub fn blocked_in_kernel(pid: libc::pid_t) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut threads = 0;
    for t in tasks {
        let Ok(t) = t else { return false };
        let dir = t.path();
        let state = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|s| stat_state(&s));
        if state != Some('S') {
            return false;
        }
        // In a system call, not asleep in a fault: the syscall file names
        // it; where it cannot be read, the wait channel does.
        let waits = match std::fs::read_to_string(dir.join("syscall")) {
            Ok(s) => syscall_waits(&s),
            Err(_) => std::fs::read_to_string(dir.join("wchan")).is_ok_and(|w| wchan_waits(&w)),
        };
        if !waits {
            return false;
        }
        threads += 1;
    }
    threads > 0
}

/// The state letter of a `/proc/PID/stat` line: the field after the
/// command, which is in parentheses and may itself hold ") ".
pub fn stat_state(stat: &str) -> Option<char> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// `/proc/PID/task/TID/syscall`: a syscall number while blocked in one,
/// "running", or "-1 ..." when blocked outside any (a fault).
pub fn syscall_waits(s: &str) -> bool {
    s.split_whitespace()
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .is_some()
}

/// `/proc/PID/task/TID/wchan`: the kernel function it sleeps in, or "0"
/// (or nothing) when it does not sleep.
pub fn wchan_waits(w: &str) -> bool {
    let w = w.trim();
    !w.is_empty() && w != "0"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        let s = "Name:\tservice\nVmRSS:\t  9000 kB\nRssAnon:\t    1234 kB\nRssFile:\t 2 kB\n";
        assert_eq!(parse_rss_anon(s), Some(1234 * 1024));
        assert_eq!(parse_rss_anon("Name: x\n"), None);
        assert_eq!(parse_rss_anon("RssAnon: x kB\n"), None);
        assert!(rss_anon(std::process::id() as libc::pid_t).is_some_and(|r| r > 0));
    }

    #[test]
    fn parses_stat_syscall_and_wchan() {
        assert_eq!(stat_state("1234 (sleep) S 1 2 3"), Some('S'));
        assert_eq!(stat_state("1234 (a) b) R 1 2 3"), Some('R'));
        assert_eq!(stat_state("1234 (odd"), None);
        assert_eq!(stat_state("1234 (x)"), None);
        assert!(syscall_waits(
            "232 0x4 0x7ffd 0x10 0xffffffff 0x0 0x0 0x7ffd 0x7f12\n"
        ));
        assert!(!syscall_waits("running\n"));
        assert!(!syscall_waits("-1 0x7ffd 0x55aa\n"));
        assert!(!syscall_waits(""));
        assert!(wchan_waits("do_epoll_wait"));
        assert!(!wchan_waits("0"));
        assert!(!wchan_waits(""));
    }

    #[test]
    fn a_sleeping_process_is_blocked_and_a_running_one_is_not() {
        // this thread is running while it reads /proc
        assert!(!blocked_in_kernel(std::process::id() as libc::pid_t));
        assert!(!blocked_in_kernel(-1));
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap_or_else(|e| panic!("sleep: {e}"));
        let pid = child.id() as libc::pid_t;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut blocked = false;
        while !blocked && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
            blocked = blocked_in_kernel(pid);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(blocked, "sleep(1) never seen asleep in nanosleep");
    }
}
