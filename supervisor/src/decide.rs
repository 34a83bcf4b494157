//! The respawn decision, as pure functions of the facts the dead process
//! left behind, and the crash-loop arithmetic (failure count and backoff).

use std::time::Duration;

use crate::reason::Reason;

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

/// An arena at the death: its name, whether the app declared it independent
/// (a failure that finds it half-changed drops only it), and its checks.
#[derive(Debug, Clone)]
pub struct ArenaFacts {
    pub name: String,
    pub independent: bool,
    /// An unsafe region (or allocator lock) open in it, as the runtime words it.
    pub unsafe_open: Option<String>,
    /// The result of its header check.
    pub check: Result<(), String>,
}

impl ArenaFacts {
    pub fn ok(name: &str) -> Self {
        ArenaFacts {
            name: name.into(),
            independent: false,
            unsafe_open: None,
            check: Ok(()),
        }
    }
}

/// What the supervisor knows when the app is gone.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// A manifest fd came with the last FDS message (or from the fd store).
    pub has_manifest: bool,
    /// What is wrong with the control block's header, if anything: then its
    /// slots and flags say nothing about the app's last moments.
    pub control_damage: Option<String>,
    /// Control block flags bit 0.
    pub warm_disabled: bool,
    /// An unsafe region open at death in an arena the supervisor holds no fd
    /// for (so cannot drop alone), as the runtime words it.
    pub unsafe_elsewhere: Option<String>,
    /// The incarnation that died started warm.
    pub last_start_warm: bool,
    /// How long it ran.
    pub uptime: Duration,
    /// `--crashloop-window` (0 = off).
    pub crashloop_window: Duration,
    /// Per held arena.
    pub arenas: Vec<ArenaFacts>,
    /// `rekindle restart --cold` asked for this restart.
    pub cold_requested: bool,
}

/// The decision: the mode, why (a stable code and words), and with Warm the
/// arenas not handed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub mode: Mode,
    pub code: Reason,
    pub why: String,
    pub dropped: Vec<String>,
}

fn cold(code: Reason, why: impl Into<String>) -> Decision {
    Decision {
        mode: Mode::Cold,
        code,
        why: why.into(),
        dropped: Vec::new(),
    }
}

/// Warm only when every check passes; the reason names the first that
/// failed, in the order the runtime's decider uses too (runtime/src/decide.c;
/// both run tests/contract/decisions.tsv): cold requested, no preserved
/// state, the control block, the crash loop, the app's veto, open regions,
/// arena checks.  An independent arena that is half-changed or fails its
/// header check is dropped alone and the rest stays warm.
pub fn decide(f: &Facts) -> Decision {
    if f.cold_requested {
        return cold(Reason::ColdRequested, "cold restart requested");
    }
    if !f.has_manifest {
        return cold(
            Reason::NoManifest,
            "no preserved state held (the app never handed over a manifest)",
        );
    }
    if let Some(why) = &f.control_damage {
        return cold(Reason::ControlBlockCorrupt, why.clone());
    }
    if f.last_start_warm && !f.crashloop_window.is_zero() && f.uptime < f.crashloop_window {
        return cold(
            Reason::CrashLoop,
            format!(
                "second failure {} ms after a warm restart (window {} ms)",
                f.uptime.as_millis(),
                f.crashloop_window.as_millis()
            ),
        );
    }
    if f.warm_disabled {
        return cold(Reason::WarmDisabled, "warm restarts disabled by the app");
    }
    if let Some(u) = &f.unsafe_elsewhere {
        return cold(Reason::UnsafeRegionOpen, u.clone());
    }
    if let Some(u) = f
        .arenas
        .iter()
        .filter(|a| !a.independent)
        .find_map(|a| a.unsafe_open.as_ref())
    {
        return cold(Reason::UnsafeRegionOpen, u.clone());
    }
    for a in f.arenas.iter().filter(|a| !a.independent) {
        if let Err(why) = &a.check {
            return cold(Reason::ArenaCheckFailed, format!("arena {}: {why}", a.name));
        }
    }
    let mut why = String::new();
    let mut dropped = Vec::new();
    for a in f.arenas.iter().filter(|a| a.independent) {
        let reason = match (&a.unsafe_open, &a.check) {
            (Some(u), _) => u.clone(),
            (None, Err(e)) => format!("arena {}: {e}", a.name),
            (None, Ok(())) => continue,
        };
        if why.is_empty() {
            why = format!("{reason}: independent, dropped alone; the rest warm");
        }
        dropped.push(a.name.clone());
    }
    let code = if dropped.is_empty() {
        why = "all checks passed".into();
        Reason::AllChecksPassed
    } else {
        Reason::IndependentDropped
    };
    Decision {
        mode: Mode::Warm,
        code,
        why,
        dropped,
    }
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
            arenas: vec![ArenaFacts::ok("table")],
            ..Facts::default()
        }
    }

    fn mode_why(d: Decision) -> (Mode, String) {
        (d.mode, d.why)
    }

    #[test]
    fn all_checks_pass_is_warm() {
        assert_eq!(
            decide(&good()),
            Decision {
                mode: Mode::Warm,
                code: Reason::AllChecksPassed,
                why: "all checks passed".into(),
                dropped: vec![]
            }
        );
    }

    #[test]
    fn each_failed_check_goes_cold_with_its_reason() {
        let mut f = good();
        f.has_manifest = false;
        assert_eq!(decide(&f).mode, Mode::Cold);

        let mut f = good();
        f.warm_disabled = true;
        assert_eq!(
            mode_why(decide(&f)),
            (Mode::Cold, "warm restarts disabled by the app".into())
        );

        let mut f = good();
        f.arenas[0].unsafe_open = Some("unsafe region open in arena table (tid 7)".into());
        assert_eq!(decide(&f).why, "unsafe region open in arena table (tid 7)");

        let mut f = good();
        f.unsafe_elsewhere = Some("unsafe region open in arena ? (tid 7)".into());
        assert_eq!(decide(&f).mode, Mode::Cold);

        let mut f = good();
        f.last_start_warm = true;
        f.uptime = Duration::from_millis(300);
        let (m, why) = mode_why(decide(&f));
        assert_eq!(m, Mode::Cold);
        assert!(
            why.starts_with("second failure 300 ms after a warm restart"),
            "{why}"
        );

        let mut f = good();
        let mut bad = ArenaFacts::ok("index");
        bad.check = Err("header checksum mismatch".into());
        f.arenas.push(bad);
        assert_eq!(
            mode_why(decide(&f)),
            (Mode::Cold, "arena index: header checksum mismatch".into())
        );

        // a clobbered control block outranks what its slots and flags say
        let mut f = good();
        f.control_damage = Some("control block corrupt: bad magic".into());
        f.warm_disabled = true;
        assert_eq!(
            mode_why(decide(&f)),
            (Mode::Cold, "control block corrupt: bad magic".into())
        );

        let mut f = good();
        f.cold_requested = true;
        assert_eq!(
            mode_why(decide(&f)),
            (Mode::Cold, "cold restart requested".into())
        );
    }

    #[test]
    fn an_independent_arena_is_dropped_alone() {
        let mut f = good();
        let mut sessions = ArenaFacts::ok("sessions");
        sessions.independent = true;
        sessions.unsafe_open = Some("unsafe region open in arena sessions (tid 9)".into());
        f.arenas.push(sessions);
        let d = decide(&f);
        assert_eq!(d.mode, Mode::Warm);
        assert_eq!(d.dropped, vec!["sessions".to_string()]);
        assert_eq!(
            d.why,
            "unsafe region open in arena sessions (tid 9): independent, dropped alone; the rest warm"
        );

        // a corrupt independent arena too
        let mut f = good();
        let mut c = ArenaFacts::ok("cache");
        c.independent = true;
        c.check = Err("bad magic".into());
        f.arenas.push(c);
        let d = decide(&f);
        assert_eq!((d.mode, d.dropped), (Mode::Warm, vec!["cache".to_string()]));

        // but a half-changed dependent arena still makes it all cold
        let mut f = good();
        let mut s = ArenaFacts::ok("sessions");
        s.independent = true;
        s.unsafe_open = Some("x".into());
        f.arenas.push(s);
        f.arenas[0].unsafe_open = Some("unsafe region open in arena table (tid 3)".into());
        let d = decide(&f);
        assert_eq!(d.mode, Mode::Cold);
        assert!(d.dropped.is_empty());
    }

    #[test]
    fn crashloop_window_only_after_a_warm_start_and_zero_turns_it_off() {
        let mut f = good();
        f.uptime = Duration::from_millis(10);
        assert_eq!(decide(&f).mode, Mode::Warm, "the last start was not warm");
        f.last_start_warm = true;
        assert_eq!(decide(&f).mode, Mode::Cold);
        f.crashloop_window = Duration::ZERO;
        assert_eq!(decide(&f).mode, Mode::Warm);
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
