//! Which term a node's store belongs to: `<snapshot-dir>.lineage` (beside
//! the store, which refuses foreign files in its own directory), JSON
//! `{"epoch": E}`.  E is the term whose primary wrote the store's newest
//! snapshot: set by a standby once it has applied a snapshot of term E, and
//! by a node elected for term E.  Snapshot ids are unambiguous only within
//! a term (two primaries of different terms may both write sequence 42), so
//! a standby resumes incrementally only from a store of the primary's own
//! term, and is eligible for election only if its store is of the newest
//! term (docs/failover.md, "Who may be elected").

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::ClusterError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Lineage {
    pub epoch: u64,
}

pub fn path(store: &Path) -> PathBuf {
    let mut p = store.as_os_str().to_owned();
    p.push(".lineage");
    PathBuf::from(p)
}

/// The store's term; 0 when unknown (no file: a store of no term).
pub fn read(store: &Path) -> Result<Lineage, ClusterError> {
    let p = path(store);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| ClusterError::BadRecord {
            key: p.display().to_string(),
            detail: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Lineage::default()),
        Err(e) => Err(ClusterError::io(format!("read {}", p.display()), e)),
    }
}

/// Durably (write, fsync, rename, fsync of the directory).
pub fn write(store: &Path, l: Lineage) -> Result<(), ClusterError> {
    let p = path(store);
    let body = serde_json::to_vec(&l).unwrap_or_default();
    let mut tmp = p.as_os_str().to_owned();
    tmp.push(".tmp");
    crate::store::fsio::publish_file(Path::new(&tmp), &p, &body)?;
    let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
    crate::store::fsio::fsync_dir(parent.unwrap_or(Path::new(".")))?;
    Ok(())
}

/// A store of another lineage is moved aside to `<dir>.diverged` (the
/// previous such copy is removed) and the term forgotten first, so that a
/// crash half-way leaves either the old store of no term or no store.
pub fn reset(store: &Path) -> Result<(), ClusterError> {
    write(store, Lineage { epoch: 0 })?;
    if !store.exists() {
        return Ok(());
    }
    let mut aside = store.as_os_str().to_owned();
    aside.push(".diverged");
    let aside = PathBuf::from(aside);
    if aside.exists() {
        std::fs::remove_dir_all(&aside)
            .map_err(|e| ClusterError::io(format!("remove {}", aside.display()), e))?;
    }
    std::fs::rename(store, &aside).map_err(|e| {
        ClusterError::io(
            format!("rename {} to {}", store.display(), aside.display()),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lineage_round_trip_and_reset() {
        let d = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let store = d.path().join("snaps");
        assert_eq!(read(&store).ok(), Some(Lineage { epoch: 0 }));
        std::fs::create_dir_all(store.join("snapshots")).unwrap_or_else(|e| panic!("{e}"));
        write(&store, Lineage { epoch: 3 }).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&store).ok(), Some(Lineage { epoch: 3 }));
        reset(&store).unwrap_or_else(|e| panic!("{e}"));
        assert!(!store.exists());
        assert!(d.path().join("snaps.diverged/snapshots").exists());
        assert_eq!(read(&store).ok(), Some(Lineage { epoch: 0 }));
        std::fs::write(path(&store), b"{").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(read(&store), Err(ClusterError::BadRecord { .. })));
    }
}
