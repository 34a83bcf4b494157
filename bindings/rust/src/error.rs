//! Errors of the binding: what the C runtime reported (`-errno`, or NULL with
//! `errno`), and what the safe layer refuses on its own.
use std::io;

/// Everything that can go wrong in a `rekindle` call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// [`init`](crate::init) was called a second time in this process.
    #[error("rekindle::init was already called in this process")]
    AlreadyInitialized,
    /// An arena was opened before [`init`](crate::init).
    #[error("rekindle::init must be called before {0}")]
    NotInitialized(&'static str),
    /// [`init`](crate::init) found other threads running: the runtime edits
    /// the process environment, which is only sound while no other thread
    /// can read it.
    #[error("rekindle::init must run before any other thread starts ({0} threads found)")]
    ThreadsRunning(usize),
    /// An arena or root name is empty, too long (47 bytes at most), holds a
    /// NUL, a character the runtime refuses, or a prefix the binding keeps
    /// for itself.
    #[error("invalid name {name:?}: {why}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The arena has no room left for the allocation (`max_bytes` reached).
    #[error("arena {arena:?} cannot hold {bytes} more bytes")]
    OutOfMemory {
        /// The arena's name.
        arena: &'static str,
        /// The size asked for.
        bytes: usize,
    },
    /// A root exists but was stored with another type than the one asked for.
    #[error(
        "root {name:?} holds a {found_size}-byte value of another type, not {expected} ({expected_size} bytes)"
    )]
    RootType {
        /// The root's name.
        name: String,
        /// The type asked for.
        expected: &'static str,
        /// Its size.
        expected_size: usize,
        /// The size recorded with the root.
        found_size: usize,
    },
    /// A root exists but carries no type record: it was set outside this
    /// binding (by C code, or raw), so its type cannot be checked.
    #[error("root {0:?} has no type record (set outside the Rust binding)")]
    UntypedRoot(String),
    /// A handle or buffer does not belong to the arena it was used with.
    #[error("{0} does not point into arena {1:?}")]
    ForeignHandle(&'static str, &'static str),
    /// A size computation overflowed.
    #[error("size overflow")]
    SizeOverflow,
    /// A call into the runtime failed with this OS error.
    #[error("{op}: {source}")]
    Os {
        /// The runtime function that failed.
        op: &'static str,
        /// The errno it reported.
        #[source]
        source: io::Error,
    },
}

/// `Result<T, rekindle::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// From a C return value `-errno`.
    pub(crate) fn from_neg_errno(op: &'static str, r: i32) -> Error {
        Error::Os {
            op,
            source: io::Error::from_raw_os_error(r.saturating_neg()),
        }
    }

    /// From `errno`, right after a C call returned NULL.
    pub(crate) fn last_os(op: &'static str) -> Error {
        Error::Os {
            op,
            source: io::Error::last_os_error(),
        }
    }

    /// The errno behind an [`Error::Os`], if that is what this is.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Os { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// Checks a C `int` return: negative is `-errno`.
pub(crate) fn check(op: &'static str, r: i32) -> Result<i32> {
    if r < 0 {
        Err(Error::from_neg_errno(op, r))
    } else {
        Ok(r)
    }
}
