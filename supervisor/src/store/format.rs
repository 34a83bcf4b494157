//! The store's fixed names and constants: the `FORMAT` file, the directory
//! layout, page size, hashes, and snapshot ids.

use std::fmt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::error::{StoreError, io_at};
use super::fsio;

pub const PAGE: usize = 4096;
/// The store format this code writes and the newest it reads.
pub const VERSION: u32 = 1;
/// First line of `DIR/FORMAT`.
pub const FORMAT_MAGIC: &str = "rekindle-store";
pub const FORMAT_FILE: &str = "FORMAT";
pub const LOCK_FILE: &str = "lock";
pub const PACKS: &str = "packs";
pub const SNAPSHOTS: &str = "snapshots";
pub const TMP: &str = "tmp";
/// zstd level for page chunks: level 1 is the fastest positive level; see
/// docs/store.md for the measurement against negative levels.
pub const ZSTD_LEVEL: i32 = 1;

/// A page's blake3 hash, all 256 bits (see docs/store.md: dedup trusts it).
pub type Hash = [u8; 32];

pub fn hex(h: &Hash) -> String {
    blake3::Hash::from_bytes(*h).to_hex().to_string()
}

pub fn parse_hex(s: &str) -> Option<Hash> {
    blake3::Hash::from_hex(s).ok().map(|h| *h.as_bytes())
}

/// A snapshot's id: `<12-digit sequence>-<UTC time>`, e.g.
/// `000000000042-20261123T212139Z`.  Sorts in creation order (the sequence
/// leads); the time is for people.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct SnapshotId(pub String);

impl SnapshotId {
    pub fn new(seq: u64, at: SystemTime) -> SnapshotId {
        let t = humantime::format_rfc3339_seconds(at).to_string();
        let compact: String = t.chars().filter(|c| *c != '-' && *c != ':').collect();
        SnapshotId(format!("{seq:012}-{compact}"))
    }

    /// The sequence number, if this is a well-formed id.
    pub fn seq(&self) -> Option<u64> {
        let (seq, rest) = self.0.split_once('-')?;
        if seq.len() != 12 || rest.is_empty() || !Self::safe_chars(&self.0) {
            return None;
        }
        seq.parse().ok()
    }

    /// Ids become file names: only these characters are allowed.
    fn safe_chars(s: &str) -> bool {
        s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    }

    pub fn is_valid(&self) -> bool {
        self.seq().is_some()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub fn from_unix_ns(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

/// Writes `DIR/FORMAT` (durably) for a new store.
pub fn write_format(dir: &Path) -> Result<(), StoreError> {
    let text = format!("{FORMAT_MAGIC}\nversion {VERSION}\n");
    let tmp = dir.join(TMP).join("FORMAT.tmp");
    fsio::write_file_durable(&tmp, text.as_bytes())?;
    fsio::rename(&tmp, &dir.join(FORMAT_FILE))?;
    fsio::fsync_dir(dir)
}

/// Reads `DIR/FORMAT`: refuses a foreign file and a newer version.
pub fn check_format(dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(FORMAT_FILE);
    let text = std::fs::read(&path).map_err(io_at("read", &path))?;
    let text = String::from_utf8_lossy(&text);
    let mut lines = text.lines();
    if lines.next() != Some(FORMAT_MAGIC) {
        return Err(StoreError::Foreign {
            path,
            detail: format!("first line is not {FORMAT_MAGIC:?}"),
        });
    }
    let version = lines
        .next()
        .and_then(|l| l.strip_prefix("version "))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .ok_or_else(|| StoreError::Foreign {
            path: path.clone(),
            detail: "no \"version N\" line".into(),
        })?;
    if version > VERSION {
        return Err(StoreError::NewerVersion {
            path,
            found: version,
            supported: VERSION,
        });
    }
    if version == 0 {
        return Err(StoreError::Foreign {
            path,
            detail: "version 0".into(),
        });
    }
    Ok(())
}
