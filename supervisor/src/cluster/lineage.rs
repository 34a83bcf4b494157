//! Which term a node's store belongs to, and which term each of its
//! snapshots came from: `<snapshot-dir>.lineage` (beside the store, which
//! refuses foreign files in its own directory), JSON
//! `{"epoch": E, "terms": [{"term": T, "after": S}, ...]}`.
//!
//! - `epoch` is the term whose primary wrote the store's newest snapshot:
//!   set by a standby once it has applied a snapshot of term E, and by a
//!   node elected for term E.  A node is eligible for election only if its
//!   store is of the newest term (besides being named in etcd's in-sync
//!   set: docs/failover.md, "Who may be elected").
//! - `terms` labels the snapshots: a snapshot whose sequence number is
//!   above `after` (or any, for `after: null`) and at or below the next
//!   entry's `after` was received from, or committed by, the primary of
//!   `term`.  Snapshot ids are unique only within a term (two primaries of
//!   different terms may both write sequence 42), but one term has one
//!   primary, whose store holds one snapshot per id: so two stores that
//!   hold the same id with the same label hold the same snapshot.  A
//!   standby that joins the primary of a newer term resumes from the newest
//!   such common snapshot (`pick_common`) instead of starting over.
//!
//! A label may be unknown (a store of an older version: no `terms`), never
//! wrong: an unknown label only costs a full resynchronisation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::ClusterError;
use crate::store::{SnapshotId, Store};

/// How many of its newest line's snapshots a standby offers when it joins.
pub const OFFERED: usize = 64;

/// Snapshots with a sequence number above `after` (None: all) are of `term`,
/// up to the next entry's `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermStart {
    pub term: u64,
    pub after: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Lineage {
    pub epoch: u64,
    /// Oldest first; `after` never decreases.
    #[serde(default)]
    pub terms: Vec<TermStart>,
    /// The newest term this node was elected for: as that term's primary
    /// it holds every write the term acknowledged, so it may be elected
    /// again while that term is the newest (insync::verdict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elected: Option<u64>,
}

/// A snapshot id with the term it came from (the join offers these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Labeled {
    pub id: String,
    pub term: u64,
}

impl Lineage {
    /// A store of no term.
    pub fn none() -> Lineage {
        Lineage::default()
    }

    /// A store received whole from the primary of `term`: every snapshot in
    /// it is labelled `term`.
    pub fn whole(term: u64) -> Lineage {
        Lineage {
            epoch: term,
            terms: vec![TermStart { term, after: None }],
            elected: None,
        }
    }

    /// The term of the snapshot with sequence number `seq`, if known.
    pub fn label(&self, seq: u64) -> Option<u64> {
        self.terms
            .iter()
            .rev()
            .find(|t| t.after.is_none_or(|a| seq > a))
            .map(|t| t.term)
    }

    /// The store continues with snapshots of `term` after the one with
    /// sequence number `after` (the newer ones are gone): the labels of
    /// newer terms' snapshots beyond it are forgotten.
    pub fn continue_with(&self, term: u64, after: Option<u64>) -> Lineage {
        let mut terms: Vec<TermStart> = self
            .terms
            .iter()
            .copied()
            .filter(|t| match (t.after, after) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(a), Some(b)) => a < b,
            })
            .collect();
        terms.push(TermStart { term, after });
        Lineage {
            epoch: term,
            terms,
            elected: self.elected,
        }
    }
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
pub fn write(store: &Path, l: &Lineage) -> Result<(), ClusterError> {
    let p = path(store);
    let body = serde_json::to_vec(l).unwrap_or_default();
    let mut tmp = p.as_os_str().to_owned();
    tmp.push(".tmp");
    crate::store::fsio::publish_file(Path::new(&tmp), &p, &body)?;
    let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
    crate::store::fsio::fsync_dir(parent.unwrap_or(Path::new(".")))?;
    Ok(())
}

/// A node elected for `term`: the snapshots it commits from now on, after
/// the store's newest, are of `term`.
pub fn begin_term(store: &Path, term: u64) -> Result<(), ClusterError> {
    let newest = line_back(store, 0, 1)?.first().and_then(SnapshotId::seq);
    let mut l = read(store)?.continue_with(term, newest);
    l.elected = Some(term);
    write(store, &l)
}

/// A store of another lineage is moved aside to `<dir>.diverged` (the
/// previous such copy is removed) and the term forgotten first, so that a
/// crash half-way leaves either the old store of no term or no store.
pub fn reset(store: &Path) -> Result<(), ClusterError> {
    write(store, &Lineage::none())?;
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

/// The store's newest line: its newest snapshot, then its parent, and so on
/// (newest first; stops at a snapshot the store does not hold).
pub fn line(store: &Path) -> Result<Vec<SnapshotId>, ClusterError> {
    line_back(store, 0, usize::MAX)
}

/// The store's line from its newest snapshot back, read one manifest at a
/// time (a store of thousands of sync snapshots is not listed whole on the
/// failover path): at most `max` snapshots, none older than seq `down_to`.
pub fn line_back(store: &Path, down_to: u64, max: usize) -> Result<Vec<SnapshotId>, ClusterError> {
    if !store.exists() {
        return Ok(Vec::new());
    }
    let s = Store::open_unindexed(store)?;
    let mut out = Vec::new();
    let mut cur = s.latest()?.map(|i| i.id);
    while let Some(id) = cur {
        if out.len() >= max || id.seq().is_some_and(|q| q < down_to) {
            break;
        }
        // only what the store holds: a parent whose manifest is gone (or
        // does not load) ends the line
        let parent = match s.load_manifest(&id) {
            Ok(m) => m.parent,
            Err(_) if !out.is_empty() => break,
            Err(e) => return Err(e.into()),
        };
        out.push(id);
        cur = parent;
    }
    Ok(out)
}

/// The line's snapshots whose term is known, newest first, at most `max`.
pub fn labeled(l: &Lineage, line: &[SnapshotId], max: usize) -> Vec<Labeled> {
    line.iter()
        .filter_map(|id| {
            let term = l.label(id.seq()?)?;
            Some(Labeled {
                id: id.0.clone(),
                term,
            })
        })
        .take(max)
        .collect()
}

/// The newest snapshot a joining standby offers (`theirs`, newest first)
/// that this store holds on its own line with the same id *and* the same
/// term: the two stores agree up to it.
pub fn pick_common(theirs: &[Labeled], ours: &[Labeled]) -> Option<String> {
    let ours: HashMap<&str, u64> = ours.iter().map(|o| (o.id.as_str(), o.term)).collect();
    theirs
        .iter()
        .find(|t| ours.get(t.id.as_str()) == Some(&t.term))
        .map(|t| t.id.clone())
}

/// The standby side of an incremental rejoin from `base`: every snapshot
/// newer than `base` goes (their manifests are removed: the store's garbage
/// collection reclaims their chunks).  They were never acknowledged to a
/// client in sync mode (docs/failover.md).  Returns how many went.
pub fn drop_after(store: &Path, base: &SnapshotId) -> Result<usize, ClusterError> {
    if !store.exists() {
        return Ok(0);
    }
    let s = Store::open_unindexed(store)?;
    let mut n = 0;
    let dir = store.join(crate::store::format::SNAPSHOTS);
    // by name (the id): no manifest is read
    for name in s.names(crate::store::format::SNAPSHOTS, ".json")? {
        let id = SnapshotId(name.trim_end_matches(".json").to_string());
        if id.seq().is_some_and(|q| base.seq().is_some_and(|b| q > b)) {
            crate::store::fsio::unlink(&dir.join(&name))?;
            n += 1;
        }
    }
    if n > 0 {
        crate::store::fsio::fsync_dir(&dir)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
        r.unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn lineage_round_trip_and_reset() {
        let d = ok(tempfile::tempdir());
        let store = d.path().join("snaps");
        assert_eq!(read(&store).ok(), Some(Lineage::none()));
        ok(std::fs::create_dir_all(store.join("snapshots")));
        ok(write(&store, &Lineage::whole(3)));
        assert_eq!(read(&store).ok(), Some(Lineage::whole(3)));
        ok(reset(&store));
        assert!(!store.exists());
        assert!(d.path().join("snaps.diverged/snapshots").exists());
        assert_eq!(read(&store).ok(), Some(Lineage::none()));
        // a file of the older format (no terms): readable, labels unknown
        ok(std::fs::write(path(&store), b"{\"epoch\":4}"));
        let old = ok(read(&store));
        assert_eq!((old.epoch, old.label(1)), (4, None));
        ok(std::fs::write(path(&store), b"{"));
        assert!(matches!(read(&store), Err(ClusterError::BadRecord { .. })));
    }

    #[test]
    fn labels_follow_the_term_starts() {
        // received whole in term 2; elected for term 3 at seq 41
        let l = Lineage::whole(2).continue_with(3, Some(41));
        assert_eq!(l.epoch, 3);
        assert_eq!(l.label(1), Some(2));
        assert_eq!(l.label(41), Some(2));
        assert_eq!(l.label(42), Some(3));
        // a standby that had term 3 from seq 45 and rejoins term 4 at 41:
        // the entry of term 3 (after 45) goes with the dropped snapshots
        let s = Lineage::whole(2)
            .continue_with(3, Some(45))
            .continue_with(4, Some(41));
        assert_eq!(
            s.terms,
            vec![
                TermStart {
                    term: 2,
                    after: None
                },
                TermStart {
                    term: 4,
                    after: Some(41)
                }
            ]
        );
        assert_eq!(s.label(41), Some(2));
        assert_eq!(s.label(46), Some(4));
        assert_eq!(Lineage::none().label(5), None);
    }

    #[test]
    fn the_line_follows_parents_through_held_snapshots_only() {
        use crate::store::{NewSnapshot, PAGE, RegionKind, RegionMeta};
        let d = ok(tempfile::tempdir());
        let dir = d.path().join("snaps");
        assert!(ok(line(&dir)).is_empty());
        let mut s = ok(Store::create_or_open(&dir));
        let meta = |full: bool, parent: Option<SnapshotId>| NewSnapshot {
            parent,
            full,
            epoch: 1,
            generation: 1,
            app: "t".into(),
            tags: vec![],
            regions: vec![RegionMeta {
                kind: RegionKind::Arena,
                name: "a".into(),
                addr: 0x7f00_0000_0000,
                size: 2 * PAGE as u64,
                layout: serde_json::Value::Null,
            }],
            redo: None,
        };
        let mut w = ok(s.begin(meta(true, None)));
        ok(w.put_page(0, 0, &vec![1; PAGE]));
        let a = ok(w.commit()).id;
        let mut w = ok(s.begin(meta(false, Some(a.clone()))));
        ok(w.put_page(0, 1, &vec![2; PAGE]));
        let b = ok(w.commit()).id;
        assert_eq!(ok(line(&dir)), vec![b.clone(), a.clone()]);
        // what is newer than a goes; twice is a no-op
        assert_eq!(ok(drop_after(&dir, &a)), 1);
        assert_eq!(ok(line(&dir)), vec![a.clone()]);
        assert_eq!(ok(drop_after(&dir, &a)), 0);
        // a parent the store does not hold ends the line (never offered)
        let mut w = ok(s.begin(meta(false, Some(a.clone()))));
        ok(w.put_page(0, 1, &vec![3; PAGE]));
        let c = ok(w.commit()).id;
        ok(std::fs::remove_file(
            dir.join(format!("snapshots/{a}.json")),
        ));
        assert_eq!(ok(line(&dir)), vec![c]);
    }

    fn lab(id: &str, term: u64) -> Labeled {
        Labeled {
            id: id.into(),
            term,
        }
    }

    #[test]
    fn the_common_snapshot_needs_the_same_id_and_term() {
        // the standby has 42 of term 5 (the old primary's, never acked by
        // the new one); the new primary has its own 42 of term 6
        let theirs = vec![lab("42", 5), lab("41", 5), lab("40", 5)];
        let ours = vec![lab("43", 6), lab("42", 6), lab("41", 5), lab("40", 5)];
        assert_eq!(pick_common(&theirs, &ours), Some("41".into()));
        // same ids, terms all differ: nothing in common
        let other = vec![lab("41", 4), lab("40", 4)];
        assert_eq!(pick_common(&other, &ours), None);
        assert_eq!(pick_common(&[], &ours), None);
        // the newest common one wins
        let theirs = vec![lab("43", 6), lab("42", 6)];
        assert_eq!(pick_common(&theirs, &ours), Some("43".into()));
    }

    #[test]
    fn labeled_lines_skip_unknown_terms_and_are_bounded() {
        let l = Lineage::none().continue_with(7, Some(10));
        let line: Vec<SnapshotId> = (5..=12)
            .rev()
            .map(|s| SnapshotId(format!("{s:012}-20260101T000000Z")))
            .collect();
        let got = labeled(&l, &line, 64);
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|g| g.term == 7));
        assert_eq!(labeled(&Lineage::whole(1), &line, 3).len(), 3);
    }
}
