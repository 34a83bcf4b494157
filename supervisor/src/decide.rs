//! The respawn decision, as pure functions of the facts the dead process
//! left behind, and the crash-loop arithmetic (failure count and backoff).

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Warm,
    Cold,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Warm => "warm",
            Mode::Cold => "cold",
        }
    }
}

/// What the supervisor knows when the app is gone.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// A manifest fd came with the last FDS message (or from the fd store).
    pub has_manifest: bool,
    /// Control block flags bit 0.
    pub warm_disabled: bool,
    /// An unsafe region open at death, as the runtime words it.
    pub unsafe_open: Option<String>,
    /// The incarnation that died started warm.
    pub last_start_warm: bool,
    /// How long it ran.
    pub uptime: Duration,
    /// `--crashloop-window` (0 = off).
    pub crashloop_window: Duration,
    /// Per held arena: its name and the result of its header check.
    pub arena_checks: Vec<(String, Result<(), String>)>,
    /// `rekindle restart --cold` asked for this restart.
    pub cold_requested: bool,
}

/// Warm only when every check passes; the reason names the first that failed.
pub fn decide(f: &Facts) -> (Mode, String) {
    if f.cold_requested {
        return (Mode::Cold, "cold restart requested".into());
    }
    if !f.has_manifest {
        return (
            Mode::Cold,
            "no preserved state held (the app never handed over a manifest)".into(),
        );
    }
    if f.warm_disabled {
        return (Mode::Cold, "warm restarts disabled by the app".into());
    }
    if let Some(u) = &f.unsafe_open {
        return (Mode::Cold, u.clone());
    }
    if f.last_start_warm && !f.crashloop_window.is_zero() && f.uptime < f.crashloop_window {
        return (
            Mode::Cold,
            format!(
                "second failure {} ms after a warm restart (window {} ms)",
                f.uptime.as_millis(),
                f.crashloop_window.as_millis()
            ),
        );
    }
    for (name, r) in &f.arena_checks {
        if let Err(why) = r {
            return (Mode::Cold, format!("arena {name}: {why}"));
        }
    }
    (Mode::Warm, "all checks passed".into())
}

/// The consecutive-failure count after one more failure: an incarnation
/// that ran at least `stable_after` starts the count again.
pub fn next_failure_count(prev: u32, uptime: Duration, stable_after: Duration) -> u32 {
    if uptime >= stable_after {
        1
    } else {
        prev.saturating_add(1)
    }
}

/// The delay before respawning after the `n`th consecutive failure: none for
/// the first, then `initial` doubled for each further one, at most `max`.
pub fn backoff(n: u32, initial: Duration, max: Duration) -> Duration {
    if n <= 1 {
        return Duration::ZERO;
    }
    let shift = (n - 2).min(40);
    let d = initial.checked_mul(1u32 << shift.min(31)).unwrap_or(max);
    let d = if shift > 31 { max } else { d };
    d.min(max)
}

/// Whether `n` consecutive failures are too many.
pub fn gives_up(n: u32, max_restarts: u32) -> bool {
    n > max_restarts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> Facts {
        Facts {
            has_manifest: true,
            uptime: Duration::from_secs(60),
            crashloop_window: Duration::from_secs(1),
            arena_checks: vec![("table".into(), Ok(()))],
            ..Facts::default()
        }
    }

    #[test]
    fn all_checks_pass_is_warm() {
        assert_eq!(decide(&good()), (Mode::Warm, "all checks passed".into()));
    }

    #[test]
    fn each_failed_check_goes_cold_with_its_reason() {
        let mut f = good();
        f.has_manifest = false;
        assert_eq!(decide(&f).0, Mode::Cold);

        let mut f = good();
        f.warm_disabled = true;
        assert_eq!(
            decide(&f),
            (Mode::Cold, "warm restarts disabled by the app".into())
        );

        let mut f = good();
        f.unsafe_open = Some("unsafe region open in arena table (tid 7)".into());
        assert_eq!(decide(&f).1, "unsafe region open in arena table (tid 7)");

        let mut f = good();
        f.last_start_warm = true;
        f.uptime = Duration::from_millis(300);
        let (m, why) = decide(&f);
        assert_eq!(m, Mode::Cold);
        assert!(
            why.starts_with("second failure 300 ms after a warm restart"),
            "{why}"
        );

        let mut f = good();
        f.arena_checks
            .push(("index".into(), Err("header checksum mismatch".into())));
        assert_eq!(
            decide(&f),
            (Mode::Cold, "arena index: header checksum mismatch".into())
        );

        let mut f = good();
        f.cold_requested = true;
        assert_eq!(decide(&f), (Mode::Cold, "cold restart requested".into()));
    }

    #[test]
    fn crashloop_window_only_after_a_warm_start_and_zero_turns_it_off() {
        let mut f = good();
        f.uptime = Duration::from_millis(10);
        assert_eq!(decide(&f).0, Mode::Warm, "the last start was not warm");
        f.last_start_warm = true;
        assert_eq!(decide(&f).0, Mode::Cold);
        f.crashloop_window = Duration::ZERO;
        assert_eq!(decide(&f).0, Mode::Warm);
    }

    #[test]
    fn failure_count_resets_after_a_stable_run() {
        let s = Duration::from_secs(10);
        assert_eq!(next_failure_count(0, Duration::from_secs(1), s), 1);
        assert_eq!(next_failure_count(3, Duration::from_secs(1), s), 4);
        assert_eq!(next_failure_count(3, Duration::from_secs(10), s), 1);
        assert_eq!(next_failure_count(u32::MAX, Duration::ZERO, s), u32::MAX);
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let i = Duration::from_millis(50);
        let m = Duration::from_secs(1);
        let seq: Vec<u128> = (1..=8).map(|n| backoff(n, i, m).as_millis()).collect();
        assert_eq!(seq, vec![0, 50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(1000, i, m), m);
        assert_eq!(backoff(40, Duration::from_secs(u64::MAX / 2), m), m);
    }

    #[test]
    fn giving_up() {
        assert!(!gives_up(3, 3));
        assert!(gives_up(4, 3));
        assert!(gives_up(1, 0));
    }
}
