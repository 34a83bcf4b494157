//! Journaled snapshots (the journal's file format is journal.rs): how a
//! writer appends one instead of publishing it, and how the journal's
//! records are folded into ordinary snapshots (pack, map, manifest) and the
//! journal reset.  Every writer that publishes (`begin`, `gc`, `recv`)
//! folds first, under the store's lock, so no published snapshot is ever
//! written on top of records that are not folded yet; a restore folds
//! first too (`fold_journal_at`), so it starts from every acknowledged
//! write.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use super::Store;
use super::error::StoreError;
use super::format::{SnapshotId, from_unix_ns};
use super::journal::{
    self, HEADER_BYTES, JOURNAL_BYTES, Journal, Record, RecordMeta, Scan, TornReason,
};
use super::manifest::ManifestRegion;
use super::writer::{NewSnapshot, Origin, SnapshotWriter, check_meta};

/// The journal as this process's writer knows it.
pub(crate) struct JournalState {
    j: Journal,
    /// The newest record: the next journaled snapshot's parent.
    last: Option<(SnapshotId, Vec<ManifestRegion>)>,
    /// The highest snapshot sequence number in use (ids are above it).
    seq_floor: u64,
    /// An append failed: what is on disk after it is unknown, so this
    /// process journals no more (its snapshots are published as usual).
    failed: bool,
}

/// What a fold did.
#[derive(Debug, Clone, Default)]
pub struct FoldReport {
    /// Records read (all folded or already published).
    pub records: u64,
    /// Snapshots published from them (one per run of records with the same
    /// regions: a run folds into one snapshot, the id of its last record).
    pub published: Vec<SnapshotId>,
    /// Runs found already published (a fold that died before its reset).
    pub already: u64,
    /// A torn or damaged tail ignored.
    pub torn: Option<TornReason>,
}

impl FoldReport {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "records": self.records,
            "published": self.published.iter().map(|i| i.as_str()).collect::<Vec<_>>(),
            "already_published": self.already,
            "torn_tail": self.torn.map(|t| t.code()),
        })
    }

    /// Anything worth saying (a fold, or a torn tail).
    pub fn is_news(&self) -> bool {
        self.records > 0 || self.torn.is_some()
    }
}

/// Waits this long for the lock when folding (another process's writer
/// holds it for one snapshot at a time).
const FOLD_LOCK_WAIT: Duration = Duration::from_secs(5);

/// Records whose regions are the same, in order: they fold into one snapshot.
fn runs(records: &[Record]) -> Vec<&[Record]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..records.len() {
        let (a, b) = (&records[i - 1].meta.regions, &records[i].meta.regions);
        let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.meta.same_shape(&y.meta));
        if records[i].meta.full || !same {
            out.push(&records[start..i]);
            start = i;
        }
    }
    if start < records.len() {
        out.push(&records[start..]);
    }
    out
}

impl Store {
    /// Folds the journal's records into ordinary snapshots and resets it,
    /// waiting a little for the lock.  Nothing to do without a journal.
    pub fn fold_journal(&mut self) -> Result<FoldReport, StoreError> {
        let deadline = Instant::now() + FOLD_LOCK_WAIT;
        let _lock = loop {
            match self.lock() {
                Ok(l) => break l,
                Err(StoreError::Locked { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e),
            }
        };
        self.fold_locked()
    }

    /// Under the lock: publishes every record of the journal (each run of
    /// records with the same regions as one snapshot, with the id of its
    /// last record, so the next record's parent exists), then resets it.
    pub(crate) fn fold_locked(&mut self) -> Result<FoldReport, StoreError> {
        let path = journal::path_of(&self.dir);
        let Some(scan) = journal::scan_file(&path)? else {
            return Ok(FoldReport::default());
        };
        let mut rep = FoldReport {
            records: scan.records.len() as u64,
            torn: scan.torn,
            ..FoldReport::default()
        };
        if scan.records.is_empty() && scan.torn.is_none() {
            return Ok(rep);
        }
        for run in runs(&scan.records) {
            let (first, last) = (&run[0].meta, &run[run.len() - 1].meta);
            if self.manifest_path(&last.id).exists() {
                rep.already += 1;
                continue;
            }
            let mut tags: BTreeSet<String> = BTreeSet::new();
            for r in run {
                tags.extend(r.meta.tags.iter().cloned());
            }
            let meta = NewSnapshot {
                parent: first.parent.clone(),
                full: first.full,
                epoch: last.epoch,
                generation: last.generation,
                app: last.app.clone(),
                tags: tags.into_iter().collect(),
                regions: last.regions.iter().map(|r| r.meta.clone()).collect(),
            };
            let origin = Origin {
                id: last.id.clone(),
                created: from_unix_ns(last.created_ns),
            };
            let mut w = self.begin_unlocked(meta, Some(origin), None)?;
            for r in run {
                replay(&mut w, r)?;
            }
            w.commit()?;
            rep.published.push(last.id.clone());
        }
        if self.journal.is_some() {
            self.sync_journal()?; // another process may have reset it meanwhile
        }
        match self.journal.as_mut() {
            Some(st) => {
                st.j.reset()?;
                st.last = None;
            }
            None => {
                let (mut j, _) = Journal::open_or_create(&self.dir)?;
                j.reset()?;
            }
        }
        Ok(rep)
    }

    /// Starts a journaled snapshot (its `commit` appends one record to the
    /// journal and fdatasyncs it).  Falls back to `begin` once an append
    /// has failed in this process.
    pub fn begin_journaled(&mut self, meta: NewSnapshot) -> Result<SnapshotWriter<'_>, StoreError> {
        if self.journal_off || self.journal.as_ref().is_some_and(|s| s.failed) {
            return self.begin(meta);
        }
        check_meta(self, &meta)?;
        let lock = self.lock()?;
        if let Err(e) = self.sync_journal() {
            // not silent: a line with its code, once; then published as usual
            eprintln!(
                "rekindle: journal_unavailable: {e} ({}); snapshots the app waits for are published \
                 in three fsync rounds instead",
                e.code()
            );
            self.journal_off = true;
            drop(lock);
            return self.begin(meta);
        }
        let parent_regions = match (
            &meta.parent,
            self.journal.as_ref().and_then(|s| s.last.as_ref()),
        ) {
            (Some(p), Some((id, regions))) if p == id => regions.clone(),
            _ => self.parent_regions(&meta)?,
        };
        let empty = self.journal.as_ref().is_none_or(|s| s.j.is_empty());
        if empty {
            // another writer may have published since: ids above theirs
            let listed = self.next_seq()?.saturating_sub(1);
            if let Some(st) = self.journal.as_mut() {
                st.seq_floor = st.seq_floor.max(listed);
            }
        }
        let seq = self.journal.as_ref().map_or(0, |s| s.seq_floor) + 1;
        let now = SystemTime::now();
        let id = SnapshotId::new(seq, now);
        self.writer(meta, Some(lock), id, now, parent_regions, true)
    }

    /// Opens the journal, or reopens it if another process has folded it
    /// since (its generation changed).
    fn sync_journal(&mut self) -> Result<(), StoreError> {
        let stale = match &self.journal {
            None => true,
            Some(st) => st.j.disk_generation()? != st.j.generation,
        };
        if stale {
            let (j, scan) = Journal::open_or_create(&self.dir)?;
            let last = scan
                .records
                .last()
                .map(|r| (r.meta.id.clone(), r.meta.regions.clone()));
            let floor = scan
                .records
                .iter()
                .filter_map(|r| r.meta.id.seq())
                .max()
                .unwrap_or(0);
            let failed = self.journal.as_ref().is_some_and(|s| s.failed);
            self.journal = Some(JournalState {
                j,
                last,
                seq_floor: floor,
                failed,
            });
        }
        Ok(())
    }

    /// Appends a journaled snapshot's record (the writer holds the lock).
    /// Ok(false): larger than an empty journal holds (publish it instead).
    pub(crate) fn journal_append(
        &mut self,
        meta: &RecordMeta,
        payload: &[u8],
    ) -> Result<bool, StoreError> {
        let need = payload.len() as u64 + 64;
        if need > JOURNAL_BYTES - HEADER_BYTES {
            return Ok(false);
        }
        if self.journal.as_ref().is_none_or(|s| need > s.j.room()) {
            self.fold_locked()?;
            self.sync_journal()?;
        }
        let Some(st) = self.journal.as_mut() else {
            return Ok(false);
        };
        if let Err(e) = st.j.append(payload) {
            st.failed = true;
            return Err(e);
        }
        st.last = Some((meta.id.clone(), meta.regions.clone()));
        st.seq_floor = st.seq_floor.max(meta.id.seq().unwrap_or(0));
        Ok(true)
    }

    /// This process has journaled snapshots that are not folded yet.
    pub fn journal_pending(&self) -> bool {
        self.journal.as_ref().is_some_and(|s| !s.j.is_empty())
    }

    /// What the journal holds now (None: the store has no journal).  For
    /// listings and verify: readers take no lock, so a journal being
    /// appended to may show one record less.
    pub fn journal_scan(&self) -> Result<Option<Scan>, StoreError> {
        journal::scan_file(&journal::path_of(&self.dir))
    }
}

/// One record's pages into the writer of its run.
fn replay(w: &mut SnapshotWriter<'_>, r: &Record) -> Result<(), StoreError> {
    for (i, reg) in r.meta.regions.iter().enumerate() {
        if reg.whole {
            w.restart_region(i as u32)?;
        }
    }
    for p in &r.pages {
        match &p.chunk {
            None => w.put_zero(p.region, p.page)?,
            Some((h, flags, bytes)) => w.put_checked_chunk(p.region, p.page, *h, bytes, *flags)?,
        }
    }
    Ok(())
}

/// Before a restore from `dir`: folds what its journal holds, so the
/// restore starts from the newest acknowledged state.  None: no journal,
/// or nothing in it.
pub fn fold_journal_at(dir: &Path) -> Result<Option<FoldReport>, StoreError> {
    let Some(scan) = journal::scan_file(&journal::path_of(dir))? else {
        return Ok(None);
    };
    if scan.records.is_empty() && scan.torn.is_none() {
        return Ok(None);
    }
    let mut s = Store::open_unindexed(dir)?;
    s.fold_journal().map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::PAGE;
    use crate::store::manifest::{RegionKind, RegionMeta};

    fn meta(parent: Option<SnapshotId>, full: bool) -> NewSnapshot {
        NewSnapshot {
            parent,
            full,
            epoch: 1,
            generation: 1,
            app: "t".into(),
            tags: vec![],
            regions: vec![RegionMeta {
                kind: RegionKind::Arena,
                name: "a".into(),
                addr: 0x1000_0000,
                size: 16 * PAGE as u64,
                layout: serde_json::Value::Null,
            }],
        }
    }

    fn page(b: u8) -> Vec<u8> {
        vec![b; PAGE]
    }

    fn read(dir: &Path, p: u64) -> Vec<u8> {
        let s = Store::open(dir).unwrap();
        let id = s.resolve("latest").unwrap();
        let r = s.open_snapshot(&id).unwrap();
        let mut out = vec![0u8; PAGE];
        r.read_page(0, p, &mut out).unwrap();
        out
    }

    /// A published base, then two journaled deltas: (store dir, ids).
    fn base_and_two(dir: &Path) -> Vec<SnapshotId> {
        let mut s = Store::create_or_open(dir).unwrap();
        let mut w = s.begin(meta(None, true)).unwrap();
        for p in 0..4 {
            w.put_page(0, p, &page(1)).unwrap();
        }
        let base = w.commit().unwrap().id;
        let mut w = s.begin_journaled(meta(Some(base.clone()), false)).unwrap();
        w.put_page(0, 1, &page(2)).unwrap();
        let j1 = w.commit().unwrap().id;
        let mut w = s.begin_journaled(meta(Some(j1.clone()), false)).unwrap();
        w.put_page(0, 1, &page(3)).unwrap();
        w.put_page(0, 2, &page(0)).unwrap();
        w.put_page(0, 5, &page(4)).unwrap();
        let j2 = w.commit().unwrap().id;
        assert!(s.journal_pending());
        vec![base, j1, j2]
    }

    #[test]
    fn journaled_snapshots_fold_into_one_published_with_every_write() {
        let d = tempfile::tempdir().unwrap();
        let ids = base_and_two(d.path());
        // not published yet: a reader sees the base, the journal two records
        let s = Store::open(d.path()).unwrap();
        assert_eq!(s.latest().unwrap().unwrap().id, ids[0]);
        assert_eq!(s.journal_scan().unwrap().unwrap().records.len(), 2);
        let rep = fold_journal_at(d.path()).unwrap().unwrap();
        assert_eq!(rep.records, 2);
        assert_eq!(rep.published, vec![ids[2].clone()]);
        assert!(rep.torn.is_none());
        let s = Store::open(d.path()).unwrap();
        assert_eq!(s.latest().unwrap().unwrap().id, ids[2]);
        assert_eq!(s.journal_scan().unwrap().unwrap().records.len(), 0);
        assert_eq!(read(d.path(), 0), page(1));
        assert_eq!(read(d.path(), 1), page(3));
        assert_eq!(read(d.path(), 2), page(0));
        assert_eq!(read(d.path(), 3), page(1));
        assert_eq!(read(d.path(), 5), page(4));
        assert!(s.verify(&mut |_| {}).unwrap().ok());
        // nothing left to fold
        assert!(fold_journal_at(d.path()).unwrap().is_none());
    }

    #[test]
    fn a_torn_last_record_is_ignored_and_the_rest_folds() {
        let d = tempfile::tempdir().unwrap();
        let ids = base_and_two(d.path());
        let jp = journal::path_of(d.path());
        let scan = journal::scan_file(&jp).unwrap().unwrap();
        let mut b = std::fs::read(&jp).unwrap();
        b[scan.end as usize - 1] ^= 0x40; // the last record's checksum
        std::fs::write(&jp, &b).unwrap();
        let rep = fold_journal_at(d.path()).unwrap().unwrap();
        assert_eq!(rep.records, 1);
        assert_eq!(rep.torn, Some(TornReason::Checksum));
        assert_eq!(rep.published, vec![ids[1].clone()]);
        assert_eq!(read(d.path(), 1), page(2));
        assert_eq!(read(d.path(), 5), vec![0u8; PAGE]);
    }

    #[test]
    fn a_fold_that_died_before_its_reset_is_not_published_twice() {
        let d = tempfile::tempdir().unwrap();
        let ids = base_and_two(d.path());
        let jp = journal::path_of(d.path());
        let before = std::fs::read(&jp).unwrap();
        fold_journal_at(d.path()).unwrap().unwrap();
        std::fs::write(&jp, &before).unwrap(); // as if the reset never happened
        let rep = fold_journal_at(d.path()).unwrap().unwrap();
        assert_eq!(rep.already, 1);
        assert!(rep.published.is_empty());
        assert_eq!(Store::open(d.path()).unwrap().list().unwrap().len(), 2);
        assert_eq!(read(d.path(), 1), page(3));
        let _ = ids;
    }

    #[test]
    fn a_writer_and_gc_fold_first() {
        let d = tempfile::tempdir().unwrap();
        let ids = base_and_two(d.path());
        let mut s = Store::open(d.path()).unwrap();
        let mut w = s.begin(meta(Some(ids[2].clone()), false)).unwrap();
        w.put_page(0, 7, &page(9)).unwrap();
        let next = w.commit().unwrap().id;
        assert!(next > ids[2]);
        assert_eq!(read(d.path(), 1), page(3));
        assert_eq!(read(d.path(), 7), page(9));
        let ids = base_and_two(tempfile::tempdir().unwrap().path());
        let _ = ids;
        let d2 = tempfile::tempdir().unwrap();
        let ids2 = base_and_two(d2.path());
        let mut s2 = Store::open(d2.path()).unwrap();
        let policy = crate::store::Retention {
            keep_last: Some(1),
            ..crate::store::Retention::default()
        };
        s2.gc(&policy, &mut |_| {}).unwrap();
        let l = s2.list().unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].id, ids2[2]);
        assert_eq!(read(d2.path(), 1), page(3));
        assert_eq!(read(d2.path(), 0), page(1));
    }
}
