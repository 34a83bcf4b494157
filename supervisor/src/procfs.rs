//! What /proc says about the app.

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
}
