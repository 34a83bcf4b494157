//! `StoreError`: every way the store can refuse, each with a stable reason
//! code (`code()`) and the path it concerns.  Cloneable (no `io::Error`
//! inside) so a pack's load error can be kept and returned again to every
//! snapshot that needs that pack.

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: not a rekindle store: {detail}")]
    Foreign { path: PathBuf, detail: String },
    #[error("{path}: format version {found} is newer than this rekindle reads ({supported})")]
    NewerVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("{path}: manifest corrupt: {detail}")]
    ManifestCorrupt { path: PathBuf, detail: String },
    #[error("{path}: manifest truncated (no checksum line at its end)")]
    ManifestTruncated { path: PathBuf },
    #[error("{path}: page map corrupt: {detail}")]
    MapCorrupt { path: PathBuf, detail: String },
    #[error("{path}: pack corrupt: {detail}")]
    PackCorrupt { path: PathBuf, detail: String },
    #[error("{path}: chunk at offset {offset} fails its check: {detail}")]
    ChunkChecksum {
        path: PathBuf,
        offset: u64,
        detail: String,
    },
    #[error("{path}: pack missing")]
    MissingPack { path: PathBuf },
    #[error("{path}: chunk {hash} is in none of the store's packs")]
    MissingChunk { path: PathBuf, hash: String },
    #[error("{path}: parent snapshot {parent} missing")]
    MissingParent { path: PathBuf, parent: String },
    #[error("{path}: no space left on the device")]
    NoSpace { path: PathBuf },
    #[error("{path}: permission denied ({op})")]
    PermissionDenied { path: PathBuf, op: &'static str },
    #[error("{path}: {op}: {detail}")]
    Io {
        path: PathBuf,
        op: &'static str,
        detail: String,
    },
    #[error("{path}: {what} not found")]
    NotFound { path: PathBuf, what: String },
    #[error("{path}: another writer holds the store's lock")]
    Locked { path: PathBuf },
    #[error("{path}: invalid argument: {detail}")]
    InvalidArgument { path: PathBuf, detail: String },
    #[error("{path}: snapshot {since} is not an ancestor of {id}")]
    NotAncestor {
        path: PathBuf,
        since: String,
        id: String,
    },
    #[error("{path}: the reader closed the stream")]
    OutputClosed { path: PathBuf },
    #[error("{path}: stream is not a rekindle snapshot stream: {detail}")]
    StreamForeign { path: PathBuf, detail: String },
    #[error("{path}: stream corrupt: {detail}")]
    StreamCorrupt { path: PathBuf, detail: String },
    #[error("{path}: stream truncated: {detail}")]
    StreamTruncated { path: PathBuf, detail: String },
    #[error("{path}: location index unusable: {detail}")]
    IndexCorrupt { path: PathBuf, detail: String },
    #[error("{path}: journal corrupt: {detail}")]
    JournalCorrupt { path: PathBuf, detail: String },
    #[error("{path}: redo log corrupt at offset {offset}: {detail}")]
    RedoCorrupt {
        path: PathBuf,
        offset: u64,
        detail: String,
    },
    #[error("{path}: redo log of line {line:016x} has a gap at position {at}: {detail}")]
    RedoGap {
        path: PathBuf,
        line: u64,
        at: u64,
        detail: String,
    },
}

impl StoreError {
    /// The stable reason code (what scripts and tests match on).
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Foreign { .. } => "store_foreign",
            StoreError::NewerVersion { .. } => "store_newer_version",
            StoreError::ManifestCorrupt { .. } => "manifest_corrupt",
            StoreError::ManifestTruncated { .. } => "manifest_truncated",
            StoreError::MapCorrupt { .. } => "map_corrupt",
            StoreError::PackCorrupt { .. } => "pack_corrupt",
            StoreError::ChunkChecksum { .. } => "chunk_checksum",
            StoreError::MissingPack { .. } => "missing_pack",
            StoreError::MissingChunk { .. } => "missing_chunk",
            StoreError::MissingParent { .. } => "missing_parent",
            StoreError::NoSpace { .. } => "no_space",
            StoreError::PermissionDenied { .. } => "permission_denied",
            StoreError::Io { .. } => "io",
            StoreError::NotFound { .. } => "not_found",
            StoreError::Locked { .. } => "locked",
            StoreError::InvalidArgument { .. } => "invalid_argument",
            StoreError::NotAncestor { .. } => "not_ancestor",
            StoreError::OutputClosed { .. } => "output_closed",
            StoreError::StreamForeign { .. } => "stream_foreign",
            StoreError::StreamCorrupt { .. } => "stream_corrupt",
            StoreError::StreamTruncated { .. } => "stream_truncated",
            StoreError::IndexCorrupt { .. } => "index_corrupt",
            StoreError::JournalCorrupt { .. } => "journal_corrupt",
            StoreError::RedoCorrupt { .. } => "redo_corrupt",
            StoreError::RedoGap { .. } => "redo_gap",
        }
    }

    /// The file or directory the error is about.
    pub fn path(&self) -> &Path {
        match self {
            StoreError::Foreign { path, .. }
            | StoreError::NewerVersion { path, .. }
            | StoreError::ManifestCorrupt { path, .. }
            | StoreError::ManifestTruncated { path }
            | StoreError::MapCorrupt { path, .. }
            | StoreError::PackCorrupt { path, .. }
            | StoreError::ChunkChecksum { path, .. }
            | StoreError::MissingPack { path }
            | StoreError::MissingChunk { path, .. }
            | StoreError::MissingParent { path, .. }
            | StoreError::NoSpace { path }
            | StoreError::PermissionDenied { path, .. }
            | StoreError::Io { path, .. }
            | StoreError::NotFound { path, .. }
            | StoreError::Locked { path }
            | StoreError::InvalidArgument { path, .. }
            | StoreError::NotAncestor { path, .. }
            | StoreError::OutputClosed { path }
            | StoreError::StreamForeign { path, .. }
            | StoreError::StreamCorrupt { path, .. }
            | StoreError::StreamTruncated { path, .. }
            | StoreError::IndexCorrupt { path, .. } => path,
            StoreError::JournalCorrupt { path, .. }
            | StoreError::RedoCorrupt { path, .. }
            | StoreError::RedoGap { path, .. } => path,
        }
    }

    /// `{"code": ..., "path": ..., "message": ...}` for `--json` output.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "code": self.code(),
            "path": self.path().display().to_string(),
            "message": self.to_string(),
        })
    }
}

/// Maps an I/O error on `path` to the variant a caller can act on: a full
/// disk, a permission problem, a missing file, or a plain I/O error.
pub fn io_err(op: &'static str, path: &Path, e: &io::Error) -> StoreError {
    let path = path.to_path_buf();
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => StoreError::NoSpace { path },
        Some(libc::EACCES) | Some(libc::EPERM) => StoreError::PermissionDenied { path, op },
        Some(libc::ENOENT) => StoreError::NotFound {
            path,
            what: "file".into(),
        },
        _ => StoreError::Io {
            path,
            op,
            detail: e.to_string(),
        },
    }
}

/// A closure for `map_err`: `.map_err(io_at("read", &path))`.
pub fn io_at<'a>(op: &'static str, path: &'a Path) -> impl Fn(io::Error) -> StoreError + 'a {
    move |e| io_err(op, path, &e)
}
