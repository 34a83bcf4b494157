//! Snapshot manifests, `snapshots/<id>.json`: pretty JSON a person can read,
//! then one last line `{"blake3":"<hex>"}` holding the blake3 of every byte
//! before it.  A file without that line is truncated; one whose bytes do not
//! hash to it is corrupt.

use std::path::Path;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::error::{StoreError, io_at};
use super::format::{SnapshotId, from_unix_ns};

pub const FORMAT_NAME: &str = "rekindle-snapshot";
/// The version of a manifest that carries a redo mark: a reader that does
/// not know the redo log must refuse it (it would restore without the
/// acknowledged writes the log holds), not ignore the field.
pub const REDO_VERSION: u32 = 2;

/// Where a snapshot stands in the app's redo log (redo/mod.rs): its line,
/// and the position before which every record's change is in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedoMark {
    pub line: u64,
    pub at: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegionKind {
    Arena,
    Static,
    Range,
}

impl RegionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RegionKind::Arena => "arena",
            RegionKind::Static => "static",
            RegionKind::Range => "range",
        }
    }

    pub fn parse(s: &str) -> Option<RegionKind> {
        match s {
            "arena" => Some(RegionKind::Arena),
            "static" => Some(RegionKind::Static),
            "range" => Some(RegionKind::Range),
            _ => None,
        }
    }
}

/// One region of a snapshot: what the engine preserved and where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegionMeta {
    pub kind: RegionKind,
    pub name: String,
    pub addr: u64,
    pub size: u64,
    /// Opaque to the store; the snapshot engine fills it.
    #[serde(default)]
    pub layout: serde_json::Value,
}

impl RegionMeta {
    /// Same region as a parent's: pages inherit only between these.
    pub fn same_shape(&self, o: &RegionMeta) -> bool {
        self.kind == o.kind && self.name == o.name && self.addr == o.addr && self.size == o.size
    }

    pub fn page_count(&self) -> u64 {
        self.size.div_ceil(super::format::PAGE as u64)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestRegion {
    #[serde(flatten)]
    pub meta: RegionMeta,
    /// The snapshot holds this region whole (`put_bytes`): it inherits no
    /// page from the parent.
    #[serde(default)]
    pub whole: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    Full,
    Delta,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapRef {
    pub file: String,
    pub size: u64,
    pub blake3: String,
    pub entries: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestStats {
    /// Page entries in this snapshot's own map (changed pages for a delta).
    pub pages: u64,
    pub zero_pages: u64,
    pub new_chunks: u64,
    pub dedup_hits: u64,
    pub new_bytes_compressed: u64,
    /// The bytes a restore produces: the regions' sizes, or for a region
    /// whose `layout.memfd_bytes` says how much of it is backed, that.
    pub logical_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub id: SnapshotId,
    pub parent: Option<SnapshotId>,
    pub kind: SnapshotKind,
    pub epoch: u64,
    pub generation: u64,
    pub created_ns: u64,
    /// RFC 3339, for people; `created_ns` is what counts.
    pub created: String,
    pub app: String,
    pub tags: Vec<String>,
    pub regions: Vec<ManifestRegion>,
    pub map: MapRef,
    /// The pack this snapshot wrote, if it wrote new chunks.
    pub pack: Option<String>,
    /// Every pack holding a chunk this snapshot's own map names.
    pub packs: Vec<String>,
    pub stats: ManifestStats,
    /// Where the snapshot stands in the app's redo log, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redo: Option<RedoMark>,
}

/// What `Store::list` returns for each snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    pub id: SnapshotId,
    pub parent: Option<SnapshotId>,
    pub epoch: u64,
    pub generation: u64,
    pub created: SystemTime,
    pub app: String,
    pub tags: Vec<String>,
    pub full: bool,
    /// Page entries in this snapshot's own map (see `ManifestStats::pages`).
    pub pages: u64,
    pub new_bytes_compressed: u64,
    pub logical_bytes: u64,
    /// Appended to the journal, not published yet (a fold publishes it).
    pub journaled: bool,
    pub redo: Option<RedoMark>,
}

impl Manifest {
    pub fn info(&self) -> SnapshotInfo {
        SnapshotInfo {
            id: self.id.clone(),
            parent: self.parent.clone(),
            epoch: self.epoch,
            generation: self.generation,
            created: from_unix_ns(self.created_ns),
            app: self.app.clone(),
            tags: self.tags.clone(),
            full: self.kind == SnapshotKind::Full,
            pages: self.stats.pages,
            new_bytes_compressed: self.stats.new_bytes_compressed,
            logical_bytes: self.stats.logical_bytes,
            journaled: false,
            redo: self.redo,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        // a derive(Serialize) struct of strings and numbers cannot fail
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        let sum = blake3::hash(&out);
        out.extend_from_slice(format!("{{\"blake3\":\"{}\"}}\n", sum.to_hex()).as_bytes());
        out
    }

    pub fn decode(path: &Path, bytes: &[u8]) -> Result<Manifest, StoreError> {
        let corrupt = |detail: String| StoreError::ManifestCorrupt {
            path: path.to_path_buf(),
            detail,
        };
        // the checksum line: {"blake3":"<64 hex>"}\n, exactly
        const LINE: usize = 11 + 64 + 3;
        let truncated = StoreError::ManifestTruncated {
            path: path.to_path_buf(),
        };
        if bytes.len() < LINE + 1 || bytes[bytes.len() - 1] != b'\n' {
            return Err(truncated);
        }
        let (body, line) = bytes.split_at(bytes.len() - LINE);
        let want = line
            .strip_prefix(b"{\"blake3\":\"")
            .and_then(|l| l.strip_suffix(b"\"}\n"))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| blake3::Hash::from_hex(h).ok());
        let Some(want) = want else {
            return Err(truncated);
        };
        if !body.ends_with(b"\n") {
            return Err(truncated);
        }
        if blake3::hash(body) != want {
            return Err(corrupt("checksum mismatch".into()));
        }
        let v: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| corrupt(format!("json: {e}")))?;
        if v.get("format").and_then(|f| f.as_str()) != Some(FORMAT_NAME) {
            return Err(corrupt(format!("\"format\" is not {FORMAT_NAME:?}")));
        }
        if let Some(ver) = v.get("version").and_then(|f| f.as_u64())
            && ver > REDO_VERSION as u64
        {
            return Err(StoreError::NewerVersion {
                path: path.to_path_buf(),
                found: ver as u32,
                supported: REDO_VERSION,
            });
        }
        let m: Manifest = serde_json::from_value(v).map_err(|e| corrupt(format!("json: {e}")))?;
        m.validate(path)?;
        Ok(m)
    }

    fn validate(&self, path: &Path) -> Result<(), StoreError> {
        let corrupt = |detail: &str| StoreError::ManifestCorrupt {
            path: path.to_path_buf(),
            detail: detail.into(),
        };
        if !self.id.is_valid() {
            return Err(corrupt("malformed id"));
        }
        if path.file_stem().and_then(|s| s.to_str()) != Some(self.id.as_str()) {
            return Err(corrupt("id differs from the file's name"));
        }
        if let Some(p) = &self.parent
            && (!p.is_valid() || p >= &self.id)
        {
            return Err(corrupt("parent id malformed or not older"));
        }
        if self.kind == SnapshotKind::Delta && self.parent.is_none() {
            return Err(corrupt("a delta without a parent"));
        }
        let name_ok = |n: &str| !n.is_empty() && !n.contains('/') && !n.starts_with('.');
        if !name_ok(&self.map.file) || self.pack.as_deref().is_some_and(|p| !name_ok(p)) {
            return Err(corrupt("bad file name"));
        }
        if self.packs.iter().any(|p| !name_ok(p)) {
            return Err(corrupt("bad pack name"));
        }
        Ok(())
    }
}

/// Reads and checks `snapshots/<id>.json`.
pub fn load(path: &Path) -> Result<Manifest, StoreError> {
    let bytes = std::fs::read(path).map_err(io_at("read", path))?;
    Manifest::decode(path, &bytes)
}
