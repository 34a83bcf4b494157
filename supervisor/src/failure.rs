//! What went wrong with an incarnation: the kinds of failure the supervisor
//! tells apart, and the failure it noted for the running one.

/// A failure's kind: the `kind` of `failure` events, the `failure` of
/// `decision` and `restart` events, and the metrics' `kind`/`failure` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Died of a signal, or restarted in place from a fatal signal.
    Signal,
    /// Exited with a non-zero status.
    Exit,
    /// No heartbeat for `--hang-timeout`.
    Hang,
    /// RssAnon above `--max-rss`.
    Leak,
    /// A restart asked for: `rekindle restart`, SIGHUP, or the app's own
    /// `rk_restart()`.
    Request,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Signal => "signal",
            FailureKind::Exit => "exit",
            FailureKind::Hang => "hang",
            FailureKind::Leak => "leak",
            FailureKind::Request => "request",
        }
    }

    /// The kind of a restart the app reports by itself (RESTARTING, or a
    /// second HELLO): from a fatal signal, or else its own request.
    pub fn of_app_restart(signaled: bool) -> Self {
        if signaled {
            FailureKind::Signal
        } else {
            FailureKind::Request
        }
    }
}

/// A failure noted for the running incarnation, not yet restarted from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailureKind,
    pub reason: String,
    /// The signal it died of or was restarted by (0: none).
    pub signal: i32,
    /// CLOCK_MONOTONIC when the supervisor noticed it.
    pub t_detect_ns: u64,
    /// When it happened, if known (a hang: the last heartbeat).
    pub t_failure_ns: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_the_event_words() {
        let all = [
            (FailureKind::Signal, "signal"),
            (FailureKind::Exit, "exit"),
            (FailureKind::Hang, "hang"),
            (FailureKind::Leak, "leak"),
            (FailureKind::Request, "request"),
        ];
        for (k, s) in all {
            assert_eq!(k.as_str(), s);
        }
        assert_eq!(FailureKind::of_app_restart(true), FailureKind::Signal);
        assert_eq!(FailureKind::of_app_restart(false), FailureKind::Request);
    }
}
