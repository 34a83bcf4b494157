//! Page maps: which page of which region holds which chunk (or zero), one
//! file per snapshot in `snapshots/`, named `<id>-<16 hex of its blake3>.map`
//! so a rewrite (retention folding) never overwrites the file a published
//! manifest names.
//!
//! ```text
//! header 32 B  "RKMAP\0\0\0", version u32, 0u32, entries u64, body length u64
//! body         zstd of entries, 45 B each, sorted by (region, page):
//!              region u32, page u64, kind u8 (0 zero, 1 chunk), hash[32]
//! ```
//! The manifest holds the file's length and blake3.

use std::path::Path;

use super::error::StoreError;
use super::format::{Hash, VERSION};

pub const MAGIC: &[u8; 8] = b"RKMAP\0\0\0";
const HEADER_LEN: usize = 32;
const ENTRY_LEN: usize = 45;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapEntry {
    pub region: u32,
    pub page: u64,
    /// `None`: the page is all zeros.
    pub hash: Option<Hash>,
}

pub fn encode(entries: &[MapEntry]) -> Result<Vec<u8>, StoreError> {
    let mut body = Vec::with_capacity(entries.len() * ENTRY_LEN);
    for e in entries {
        body.extend_from_slice(&e.region.to_le_bytes());
        body.extend_from_slice(&e.page.to_le_bytes());
        match &e.hash {
            None => {
                body.push(0);
                body.extend_from_slice(&[0u8; 32]);
            }
            Some(h) => {
                body.push(1);
                body.extend_from_slice(h);
            }
        }
    }
    let z = zstd::bulk::compress(&body, 1).map_err(|e| StoreError::Io {
        path: Default::default(),
        op: "zstd",
        detail: e.to_string(),
    })?;
    let mut out = Vec::with_capacity(HEADER_LEN + z.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&z);
    Ok(out)
}

/// Decodes a map whose checksum the caller has checked; still validates its
/// structure (a map written by a buggy or foreign program).
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Vec<MapEntry>, StoreError> {
    let bad = |detail: &str| StoreError::MapCorrupt {
        path: path.to_path_buf(),
        detail: detail.into(),
    };
    if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
        return Err(bad("bad header"));
    }
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap_or_default());
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
    if version == 0 || version > VERSION {
        return Err(bad("unknown version"));
    }
    let count = u64_at(16);
    let body_len = u64_at(24);
    if count.checked_mul(ENTRY_LEN as u64) != Some(body_len) || body_len > (1 << 40) {
        return Err(bad("entry count and body length disagree"));
    }
    let body = zstd::bulk::decompress(&bytes[HEADER_LEN..], body_len as usize)
        .map_err(|e| bad(&format!("zstd: {e}")))?;
    if body.len() as u64 != body_len {
        return Err(bad("body shorter than its header says"));
    }
    let mut out = Vec::with_capacity(count as usize);
    for b in body.chunks_exact(ENTRY_LEN) {
        let region = u32::from_le_bytes(b[0..4].try_into().unwrap_or_default());
        let page = u64::from_le_bytes(b[4..12].try_into().unwrap_or_default());
        let hash = match b[12] {
            0 => None,
            1 => {
                let mut h = [0u8; 32];
                h.copy_from_slice(&b[13..45]);
                Some(h)
            }
            _ => return Err(bad("bad entry kind")),
        };
        if let Some(p) = out.last().map(|p: &MapEntry| (p.region, p.page))
            && p >= (region, page)
        {
            return Err(bad("entries not sorted"));
        }
        out.push(MapEntry { region, page, hash });
    }
    Ok(out)
}
