//! Why a start is warm or cold, as a stable code: the same numbers as
//! `enum rk_reason` in runtime/include/rekindle.h (checked by
//! tests/layout.rs), carried in the protocol (HELLO, RESTARTING, INHERIT)
//! and, by name, in events.  Numbers are never reused.

/// `enum rk_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Reason {
    None = 0,
    AllChecksPassed = 1,
    ColdRequested = 2,
    FaultInRuntime = 3,
    NoManifest = 4,
    ControlBlockCorrupt = 5,
    CrashLoop = 6,
    RepeatedFault = 7,
    ManifestBusy = 8,
    WarmDisabled = 9,
    HookCold = 10,
    UnsafeRegionOpen = 11,
    ArenaCheckFailed = 12,
    IndependentDropped = 13,
    CrosscheckMismatch = 14,
    ManifestCorrupt = 15,
    AddressTaken = 16,
    ForeignFd = 17,
    Restored = 18,
}

impl Reason {
    pub const ALL: [Reason; 19] = [
        Reason::None,
        Reason::AllChecksPassed,
        Reason::ColdRequested,
        Reason::FaultInRuntime,
        Reason::NoManifest,
        Reason::ControlBlockCorrupt,
        Reason::CrashLoop,
        Reason::RepeatedFault,
        Reason::ManifestBusy,
        Reason::WarmDisabled,
        Reason::HookCold,
        Reason::UnsafeRegionOpen,
        Reason::ArenaCheckFailed,
        Reason::IndependentDropped,
        Reason::CrosscheckMismatch,
        Reason::ManifestCorrupt,
        Reason::AddressTaken,
        Reason::ForeignFd,
        Reason::Restored,
    ];

    pub fn code(self) -> u32 {
        self as u32
    }

    /// A number from the wire; one this supervisor does not know (a newer
    /// runtime) is `None`: the text still says why.
    pub fn from_code(c: u32) -> Reason {
        Reason::ALL
            .iter()
            .copied()
            .find(|r| r.code() == c)
            .unwrap_or(Reason::None)
    }

    /// A cold decision for this reason starts from the store's newest
    /// snapshot instead, when the app takes snapshots: the cut was taken
    /// with no unsafe region open, so it is consistent, and the change cut
    /// short is not in it.  Both are read in the control block, so the
    /// runtime leaves such a restart to us (it dies instead of exec'ing
    /// itself cold).  Other cold reasons are the app's or the operator's
    /// choice, or evidence only the runtime sees.  The runtime's
    /// `rk_reason_restorable` is the same set (tests/layout.rs).
    pub fn restorable(self) -> bool {
        matches!(self, Reason::UnsafeRegionOpen | Reason::ControlBlockCorrupt)
    }

    /// The stable name, as `rk_reason_name()` gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::None => "none",
            Reason::AllChecksPassed => "all_checks_passed",
            Reason::ColdRequested => "cold_requested",
            Reason::FaultInRuntime => "fault_in_runtime",
            Reason::NoManifest => "no_manifest",
            Reason::ControlBlockCorrupt => "control_block_corrupt",
            Reason::CrashLoop => "crash_loop",
            Reason::RepeatedFault => "repeated_fault",
            Reason::ManifestBusy => "manifest_busy",
            Reason::WarmDisabled => "warm_disabled",
            Reason::HookCold => "hook_cold",
            Reason::UnsafeRegionOpen => "unsafe_region_open",
            Reason::ArenaCheckFailed => "arena_check_failed",
            Reason::IndependentDropped => "independent_dropped",
            Reason::CrosscheckMismatch => "crosscheck_mismatch",
            Reason::ManifestCorrupt => "manifest_corrupt",
            Reason::AddressTaken => "address_taken",
            Reason::ForeignFd => "foreign_fd",
            Reason::Restored => "restored",
        }
    }

    pub fn from_name(s: &str) -> Option<Reason> {
        Reason::ALL.iter().copied().find(|r| r.as_str() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_names_are_unique() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.code() as usize, i);
            assert_eq!(Reason::from_code(r.code()), *r);
            assert_eq!(Reason::from_name(r.as_str()), Some(*r));
        }
        assert_eq!(Reason::from_code(9999), Reason::None);
        let mut names: Vec<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len());
    }
}
