//! Journaled snapshots (the journal's file format is journal.rs): how a
//! writer appends one instead of publishing it, and how the journal's
//! records are folded into ordinary snapshots (pack, map, manifest) and the
//! journal reset.  Every writer that publishes (`begin`, `gc`, `recv`)
//! folds first, under the store's lock, so no published snapshot is ever
//! written on top of records that are not folded yet; a restore folds
//! first too (`fold_journal_at`), so it starts from every acknowledged
//! write.
//!
//! The journal is two files.  When the one taking appends is full, appends
//! go on in the other (emptied, its generation made the higher) while the
//! full one is folded on a thread of its own, under the same lock: a commit
//! waits for a fold only when both files have filled before the fold ends.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::error::StoreError;
use super::fasthash::FastMap;
use super::fold_pages::KeptPages;
use super::format::{SnapshotId, from_unix_ns};
use super::journal::{
    self, HEADER_BYTES, Journal, PageData, Record, RecordMeta, RecordPage, Scan, TornReason,
};
use super::manifest::ManifestRegion;
use super::writer::{NewSnapshot, Origin, SnapshotWriter, check_meta};
use super::{Store, StoreLock};

/// The journal as this process's writer knows it.
pub(crate) struct JournalState {
    /// The file appends go to.
    j: Journal,
    /// The other file: empty (and of a higher generation once appends move
    /// to it), or holding records that a fold has not published yet.
    other: Journal,
    /// `other` may hold records (being folded, or its fold failed).
    other_pending: bool,
    /// The newest record: the next journaled snapshot's parent.
    last: Option<(SnapshotId, Vec<ManifestRegion>)>,
    /// The highest snapshot sequence number in use (ids are above it).
    seq_floor: u64,
    /// An append failed: what is on disk after it is unknown, so this
    /// process journals no more (its snapshots are published as usual).
    failed: bool,
    /// The fold of `other` running on its own thread.
    background: Option<BackgroundFold>,
    /// The store the background fold writes with, kept between folds (it
    /// loads no pack index: `Store::open_for_background_fold`).
    folder: Option<Box<Store>>,
}

/// What the fold thread gives back: its store (None if it could not open
/// one) and what the fold did.
type FoldThreadResult = (Option<Box<Store>>, Result<FoldReport, StoreError>);

/// A fold of one full journal file on a thread of its own.  The thread
/// holds a share of the store's lock until it ends.
struct BackgroundFold {
    handle: JoinHandle<FoldThreadResult>,
    started: Instant,
}

/// What a background fold did, for the engine to report.
#[derive(Debug)]
pub struct BackgroundFoldDone {
    pub took: Duration,
    pub result: Result<FoldReport, StoreError>,
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

    /// Under the lock: publishes every record of both journal files (each
    /// run of records with the same regions as one snapshot, with the id of
    /// its last record, so the next record's parent exists), then resets
    /// them.  A background fold is waited for first.
    pub(crate) fn fold_locked(&mut self) -> Result<FoldReport, StoreError> {
        self.wait_background_fold_keeping_its_report();
        let Some(scan) = journal::scan_dir(&self.dir)? else {
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
        self.publish_runs(&scan.records, &mut rep)?;
        // both files emptied, each with a generation above both
        let mut files = Vec::new();
        for p in journal::paths_of(&self.dir) {
            if p.exists() {
                files.push(Journal::open_or_create_at(&self.dir, &p)?.0);
            }
        }
        let top = files.iter().map(|j| j.generation).max().unwrap_or(0);
        for (k, j) in files.iter_mut().enumerate() {
            j.reset_to(top + 1 + k as u64)?;
        }
        if self.journal.is_some() {
            self.reload_journal()?;
            if let Some(st) = self.journal.as_mut() {
                st.last = None;
            }
        }
        Ok(rep)
    }

    /// Publishes each run of `records` (one snapshot per run), skipping a
    /// run a fold that died before its reset has published.
    fn publish_runs(&mut self, records: &[Record], rep: &mut FoldReport) -> Result<(), StoreError> {
        let mut pages = journal::PageReader::new(&self.dir);
        if records.iter().any(|r| !r.delta_pages.is_empty()) {
            // the base may be in a pack another handle published (a
            // background fold's)
            self.refresh_packs()?;
        }
        let mut kept = KeptPages::new(self, records)?;
        // each record's index in the fold
        let mut g = 0;
        for run in runs(records) {
            let (first, last) = (&run[0].meta, &run[run.len() - 1].meta);
            if self.manifest_path(&last.id).exists() {
                // published by a fold that died before its reset: what
                // later deltas apply to still follows its records
                for r in run {
                    kept.follow(&self.dir, g, r, &pages.pages(r)?)?;
                    g += 1;
                }
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
                redo: last.redo,
            };
            let origin = Origin {
                id: last.id.clone(),
                created: from_unix_ns(last.created_ns),
            };
            let last_delta = last_deltas(run);
            let dir = self.dir.clone();
            let mut w = self.begin_unlocked(meta, Some(origin), None)?;
            for (k, r) in run.iter().enumerate() {
                let ps = pages.pages(r)?;
                kept.follow(&dir, g, r, &ps)?;
                replay(&mut w, &dir, (g, r), &ps, &mut kept, |reg, page| {
                    last_delta.get(&(reg, page)) == Some(&k)
                })?;
                g += 1;
            }
            w.commit()?;
            rep.published.push(last.id.clone());
        }
        Ok(())
    }

    /// Starts a journaled snapshot (its `commit` appends one record to the
    /// journal and fdatasyncs it).  Falls back to `begin` once an append
    /// has failed in this process.
    pub fn begin_journaled(&mut self, meta: NewSnapshot) -> Result<SnapshotWriter<'_>, StoreError> {
        if self.journal_off || self.journal.as_ref().is_some_and(|s| s.failed) {
            return self.begin(meta);
        }
        check_meta(self, &meta)?;
        // shared with a background fold, if one runs: nobody else can
        // change the journal meanwhile
        let lock = self.lock()?;
        if let Err(e) = self.sync_journal() {
            // not silent: a line with its code, once; then published as usual
            eprintln!(
                "rekindle: journal_unavailable: {e} ({}); snapshots the app waits for are published \
                 in three fsync rounds instead",
                e.code()
            );
            self.journal_off = true;
            self.forget_listing();
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
        let empty = self
            .journal
            .as_ref()
            .is_none_or(|s| s.j.is_empty() && !s.other_pending);
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

    /// Opens the journal's files, or reopens them if another process has
    /// folded them since (the generation of the one taking appends changed).
    fn sync_journal(&mut self) -> Result<(), StoreError> {
        let stale = match &self.journal {
            None => true,
            Some(st) => st.j.disk_generation()? != st.j.generation,
        };
        if stale {
            self.reload_journal()?;
        }
        Ok(())
    }

    /// Reads both journal files afresh.  Appends go to the one of the
    /// higher generation if it holds records, else to the other if that
    /// does, else to the lower (the higher is then already above it).
    fn reload_journal(&mut self) -> Result<(), StoreError> {
        let [pa, pb] = journal::paths_of(&self.dir);
        let (a, sa) = Journal::open_or_create_at(&self.dir, &pa)?;
        let (b, sb) = Journal::open_or_create_at(&self.dir, &pb)?;
        let ((lo, slo), (hi, shi)) = if a.generation <= b.generation {
            ((a, sa), (b, sb))
        } else {
            ((b, sb), (a, sa))
        };
        let (j, sj, other, so) = if !shi.records.is_empty() || slo.records.is_empty() {
            if shi.records.is_empty() {
                (lo, slo, hi, shi)
            } else {
                (hi, shi, lo, slo)
            }
        } else {
            (lo, slo, hi, shi)
        };
        let last = sj
            .records
            .last()
            .or(so.records.last())
            .map(|r| (r.meta.id.clone(), r.meta.regions.clone()));
        let floor = sj
            .records
            .iter()
            .chain(&so.records)
            .filter_map(|r| r.meta.id.seq())
            .max()
            .unwrap_or(0);
        let old = self.journal.take();
        let (failed, background, folder) = match old {
            Some(o) => (o.failed, o.background, o.folder),
            None => (false, None, None),
        };
        self.journal = Some(JournalState {
            j,
            other_pending: !so.records.is_empty() || so.torn.is_some(),
            other,
            last,
            seq_floor: floor,
            failed,
            background,
            folder,
        });
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
        let size = self
            .journal
            .as_ref()
            .map_or_else(journal::journal_bytes, |s| s.j.size);
        if need > size - HEADER_BYTES {
            return Ok(false);
        }
        if self.journal.as_ref().is_none_or(|s| need > s.j.room()) {
            // the previous file's fold first (back-pressure: both filled)
            self.wait_background_fold_keeping_its_report();
            if !self.switch_journal_file()? {
                self.fold_locked()?;
                self.sync_journal()?;
            }
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

    /// Publishes the journal's records on the fold thread, without waiting:
    /// appends move to the other file as when one fills.  False: nothing
    /// to fold, a fold runs already, or the other file still holds records
    /// (a failed fold: the next publishing writer folds both).
    pub fn fold_in_background(&mut self) -> Result<bool, StoreError> {
        let ready = self
            .journal
            .as_ref()
            .is_some_and(|s| !s.failed && !s.j.is_empty() && !s.other_pending);
        if !ready || self.background_fold_running() {
            return Ok(false);
        }
        let _lock = self.lock()?;
        self.switch_journal_file()
    }

    /// The file taking appends is full: appends move to the other (empty,
    /// its generation made the higher) and the full one is folded on a
    /// thread of its own.  False: the other is not empty (a fold failed),
    /// the caller folds both.
    fn switch_journal_file(&mut self) -> Result<bool, StoreError> {
        let Some(lock) = self.held.upgrade() else {
            return Ok(false); // not under the lock: cannot happen in a writer
        };
        let dir = self.dir.clone();
        let Some(st) = self.journal.as_mut() else {
            return Ok(false);
        };
        if st.other_pending || st.j.is_empty() {
            return Ok(false);
        }
        // empty here; reset to a generation above the full file's, and to
        // the version that holds deltas if an older writer made it
        if st.other.generation <= st.j.generation || st.other.version < journal::VERSION {
            st.other
                .reset_to(st.j.generation.max(st.other.generation) + 1)?;
        }
        std::mem::swap(&mut st.j, &mut st.other);
        st.other_pending = true;
        let full = st.other.path.clone();
        let reset_to = st.j.generation + 1;
        let folder = st.folder.take();
        // the fold publishes through a handle of its own
        self.forget_listing();
        let handle = std::thread::Builder::new()
            .name("rk-journal-fold".into())
            .spawn(move || fold_file_in_background(dir, folder, full, reset_to, lock))
            .map_err(super::error::io_at("spawn a fold thread", &self.dir))?;
        if let Some(st) = self.journal.as_mut() {
            st.background = Some(BackgroundFold {
                handle,
                started: Instant::now(),
            });
        }
        Ok(true)
    }

    /// A background fold that has ended, taken (None: none, or still
    /// running), or one a foreground fold waited for since the last call.
    /// The engine reports what it did.
    pub fn reap_background_fold(&mut self) -> Option<BackgroundFoldDone> {
        if let Some(done) = self.fold_done_unreported.take() {
            return Some(done);
        }
        let st = self.journal.as_mut()?;
        if !st.background.as_ref()?.handle.is_finished() {
            return None;
        }
        self.wait_background_fold()
    }

    /// Waits for the background fold inside a foreground step: what it
    /// did is kept for the engine's next `reap_background_fold`.
    fn wait_background_fold_keeping_its_report(&mut self) {
        if let Some(done) = self.wait_background_fold() {
            self.fold_done_unreported = Some(done);
        }
    }

    /// Waits for the background fold, if one runs, and takes what it did.
    pub fn wait_background_fold(&mut self) -> Option<BackgroundFoldDone> {
        let st = self.journal.as_mut()?;
        let bg = st.background.take()?;
        let took = bg.started.elapsed();
        let result = match bg.handle.join() {
            Ok((folder, r)) => {
                st.folder = folder;
                r
            }
            Err(_) => Err(StoreError::InvalidArgument {
                path: st.other.path.clone(),
                detail: "the journal's fold thread panicked".into(),
            }),
        };
        if result.is_ok() {
            // reset by the fold, to a generation above the file in use
            match Journal::open_or_create_at(&self.dir, &st.other.path) {
                Ok((o, s)) if s.records.is_empty() && s.torn.is_none() => {
                    st.other = o;
                    st.other_pending = false;
                }
                _ => st.other_pending = true,
            }
        }
        let st = self.journal.as_mut()?;
        st.background = None;
        Some(BackgroundFoldDone { took, result })
    }

    /// The file taking appends holds delta pages (its header is of the
    /// version that has them): a journaled writer may put them.
    pub(crate) fn journal_takes_deltas(&self) -> bool {
        self.journal
            .as_ref()
            .is_some_and(|s| !s.failed && s.j.version >= journal::VERSION)
    }

    /// This process has journaled snapshots that are not folded yet.
    pub fn journal_pending(&self) -> bool {
        self.journal
            .as_ref()
            .is_some_and(|s| !s.j.is_empty() || s.other_pending)
    }

    /// A fold of this process's journal runs in the background now.
    pub fn background_fold_running(&self) -> bool {
        self.journal
            .as_ref()
            .is_some_and(|s| s.background.is_some())
    }

    /// What the journal holds now (None: the store has no journal).  For
    /// listings and verify: readers take no lock, so a journal being
    /// appended to may show one record less.
    pub fn journal_scan(&self) -> Result<Option<Scan>, StoreError> {
        journal::scan_dir(&self.dir)
    }
}

/// The background fold of one full journal file: its records published,
/// then the file reset to `reset_to` (above the file taking appends).  The
/// lock's share is let go when this returns.
fn fold_file_in_background(
    dir: PathBuf,
    folder: Option<Box<Store>>,
    path: PathBuf,
    reset_to: u64,
    lock: StoreLock,
) -> FoldThreadResult {
    let mut store = match folder {
        Some(s) => s,
        None => match Store::open_for_background_fold(&dir) {
            Ok(s) => Box::new(s),
            // the fold is retried in the foreground when the next file fills
            Err(e) => return (None, Err(e)),
        },
    };
    let r = fold_one_file(&mut store, &path, reset_to);
    drop(lock);
    (Some(store), r)
}

fn fold_one_file(store: &mut Store, path: &Path, reset_to: u64) -> Result<FoldReport, StoreError> {
    let (mut j, scan) = Journal::open_or_create_at(&store.dir, path)?;
    let mut rep = FoldReport {
        records: scan.records.len() as u64,
        torn: scan.torn,
        ..FoldReport::default()
    };
    if let Some(t) = scan.torn {
        // the file taking appends follows this one: leave both for a fold
        // in the foreground, which reads them in order
        return Err(journal_corrupt(path, t));
    }
    store.publish_runs(&scan.records, &mut rep)?;
    j.reset_to(reset_to)?;
    Ok(rep)
}

fn journal_corrupt(path: &Path, t: TornReason) -> StoreError {
    StoreError::JournalCorrupt {
        path: path.to_path_buf(),
        detail: format!(
            "a full journal file ends in a damaged record ({})",
            t.code()
        ),
    }
}

/// One record's pages (record `g` of the fold) into the writer of its run.
/// A delta's page is put whole, as `kept` rebuilds it after this record,
/// and only from the run's last record to hold it as a delta
/// (`put_delta_here`): hashed and compressed once however many records
/// changed it.
fn replay(
    w: &mut SnapshotWriter<'_>,
    dir: &Path,
    (g, r): (usize, &Record),
    pages: &[RecordPage],
    kept: &mut KeptPages,
    put_delta_here: impl Fn(u32, u64) -> bool,
) -> Result<(), StoreError> {
    for (i, reg) in r.meta.regions.iter().enumerate() {
        if reg.whole {
            w.restart_region(i as u32)?;
        }
    }
    for p in pages {
        match &p.data {
            PageData::Zero => w.put_zero(p.region, p.page)?,
            PageData::Chunk(h, flags, bytes) => {
                w.put_checked_chunk(p.region, p.page, *h, bytes, *flags)?
            }
            PageData::Delta(_) if put_delta_here(p.region, p.page) => {
                kept.put_page(dir, g, r, p.region, p.page, |page| {
                    w.put_page(p.region, p.page, page)
                })?
            }
            PageData::Delta(_) => {}
        }
    }
    Ok(())
}

/// For each page a run holds as a delta: the index in the run of the last
/// record that does.
fn last_deltas(run: &[Record]) -> FastMap<(u32, u64), usize> {
    let mut m = FastMap::default();
    for (k, r) in run.iter().enumerate() {
        for &key in &r.delta_pages {
            m.insert(key, k);
        }
    }
    m
}

/// Before a restore from `dir`: folds what its journal holds, so the
/// restore starts from the newest acknowledged state.  None: no journal,
/// or nothing in it.
pub fn fold_journal_at(dir: &Path) -> Result<Option<FoldReport>, StoreError> {
    let Some(scan) = journal::scan_dir(dir)? else {
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
            redo: None,
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

    /// `--snapshot-publish-every`: a journal that is not full is handed to
    /// the fold thread on request; appends go on in the other file, and a
    /// second request while that fold runs, or with nothing to fold, starts
    /// nothing.
    #[test]
    fn a_journal_not_full_is_folded_in_the_background_on_request() {
        let d = tempfile::tempdir().unwrap();
        let ids = base_and_two(d.path());
        let mut s = Store::create_or_open(d.path()).unwrap();
        // a new handle finds the records and takes over the journal
        let mut w = s
            .begin_journaled(meta(Some(ids[2].clone()), false))
            .unwrap();
        w.put_page(0, 6, &page(6)).unwrap();
        let j3 = w.commit().unwrap().id;
        assert!(s.fold_in_background().unwrap(), "no fold started");
        assert!(s.background_fold_running());
        assert!(!s.fold_in_background().unwrap(), "a second fold started");
        // appends go on meanwhile, in the other file
        let mut w = s.begin_journaled(meta(Some(j3.clone()), false)).unwrap();
        w.put_page(0, 7, &page(7)).unwrap();
        let j4 = w.commit().unwrap().id;
        let done = s.wait_background_fold().expect("the fold's report");
        let rep = done.result.unwrap();
        assert_eq!(rep.published, vec![j3.clone()]);
        assert_eq!(
            Store::open(d.path()).unwrap().latest().unwrap().unwrap().id,
            j3
        );
        assert!(s.journal_pending(), "the record appended during the fold");
        assert!(s.fold_in_background().unwrap());
        s.wait_background_fold().unwrap().result.unwrap();
        assert!(!s.journal_pending());
        assert!(
            !s.fold_in_background().unwrap(),
            "a fold of nothing started"
        );
        assert_eq!(
            Store::open(d.path()).unwrap().latest().unwrap().unwrap().id,
            j4
        );
        assert_eq!(read(d.path(), 1), page(3));
        assert_eq!(read(d.path(), 6), page(6));
        assert_eq!(read(d.path(), 7), page(7));
    }

    /// A page no other page equals, that zstd cannot shrink.
    fn noise(seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..PAGE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn a_full_file_is_folded_in_the_background_while_the_other_takes_appends() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create_or_open(d.path()).unwrap();
        let mut w = s.begin(meta(None, true)).unwrap();
        w.put_page(0, 0, &page(1)).unwrap();
        let mut parent = w.commit().unwrap().id;
        let mut want: Vec<Vec<u8>> = vec![vec![0u8; PAGE]; 16];
        want[0] = page(1);
        let (mut saw_background, mut published_meanwhile) = (false, false);
        // 4 pages of noise a record: about 60 records fill a 1 MiB file
        for k in 0..150u64 {
            let mut w = s.begin_journaled(meta(Some(parent), false)).unwrap();
            for i in 0..4 {
                let p = (k * 4 + i) % 16;
                want[p as usize] = noise(k * 16 + p + 1);
                w.put_page(0, p, &want[p as usize]).unwrap();
            }
            parent = w.commit().unwrap().id;
            saw_background |= s.background_fold_running();
            if let Some(done) = s.reap_background_fold() {
                done.result.unwrap();
                published_meanwhile |= Store::open(d.path()).unwrap().list().unwrap().len() > 1;
            }
        }
        assert!(saw_background, "no file filled");
        assert!(
            published_meanwhile,
            "nothing was published while appends went on"
        );
        assert!(s.journal_pending());
        // the supervisor dies here: a restore folds what is left, in order
        drop(s);
        let rep = fold_journal_at(d.path()).unwrap().unwrap();
        assert!(rep.records > 0 && rep.torn.is_none());
        assert_eq!(
            Store::open(d.path()).unwrap().latest().unwrap().unwrap().id,
            parent
        );
        for (p, bytes) in want.iter().enumerate() {
            assert_eq!(&read(d.path(), p as u64), bytes, "page {p}");
        }
        assert!(
            Store::open(d.path())
                .unwrap()
                .verify(&mut |_| {})
                .unwrap()
                .ok()
        );
    }

    /// Files reused after a reset hold the old records past the new ones;
    /// with records of other sizes the new ones end inside an old one.
    /// That is the clean end of the file, not damage: every background
    /// fold succeeds, and a restore after them loses nothing.  (A
    /// misaligned tail was read as torn: each background fold of a reused
    /// file failed, and the foreground fold that followed dropped the
    /// other file's records.)
    #[test]
    fn records_of_any_size_in_reused_files_fold_without_loss() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create_or_open(d.path()).unwrap();
        let mut w = s.begin(meta(None, true)).unwrap();
        w.put_page(0, 0, &page(1)).unwrap();
        let mut parent = w.commit().unwrap().id;
        let mut want: Vec<Vec<u8>> = vec![vec![0u8; PAGE]; 16];
        want[0] = page(1);
        let mut folds = 0;
        // 1 to 7 pages of noise a record: each 1 MiB file fills 4-5 times
        for k in 0..600u64 {
            let mut w = s.begin_journaled(meta(Some(parent), false)).unwrap();
            for i in 0..1 + (k * 5 + k / 7) % 7 {
                let p = (k * 3 + i) % 16;
                want[p as usize] = noise(k * 16 + p + 1);
                w.put_page(0, p, &want[p as usize]).unwrap();
            }
            parent = w.commit().unwrap().id;
            if let Some(done) = s.reap_background_fold() {
                let rep = done.result.expect("a background fold of a reused file");
                assert!(rep.torn.is_none());
                folds += 1;
            }
        }
        assert!(folds >= 6, "{folds} background folds");
        dies_and_restores_as(s, d.path(), &parent, &want);
    }

    /// The background fold ends, then the supervisor dies: a restore folds
    /// what the journal holds, and the newest snapshot is `parent` with
    /// region 0's pages as `want`.
    fn dies_and_restores_as(mut s: Store, dir: &Path, parent: &SnapshotId, want: &[Vec<u8>]) {
        if let Some(done) = s.wait_background_fold() {
            done.result.unwrap();
        }
        drop(s);
        fold_journal_at(dir).unwrap();
        let s = Store::open(dir).unwrap();
        assert_eq!(&s.latest().unwrap().unwrap().id, parent);
        for (p, bytes) in want.iter().enumerate() {
            assert!(&read(dir, p as u64) == bytes, "page {p}");
        }
    }

    /// A published full snapshot of pages 0..n as noise(seed + page): its
    /// id and those pages.
    fn noise_base(s: &mut Store, n: u64, seed: u64) -> (SnapshotId, Vec<Vec<u8>>) {
        let pages: Vec<Vec<u8>> = (0..n).map(|p| noise(seed + p)).collect();
        let mut w = s.begin(meta(None, true)).unwrap();
        for (p, bytes) in pages.iter().enumerate() {
            w.put_page(0, p as u64, bytes).unwrap();
        }
        (w.commit().unwrap().id, pages)
    }

    #[test]
    fn the_background_fold_loads_no_pack_index_and_its_snapshots_read_back() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create_or_open(d.path()).unwrap();
        let (mut parent, mut want) = noise_base(&mut s, 16, 1000);
        let mut folded = 0;
        for k in 0..150u64 {
            let mut w = s.begin_journaled(meta(Some(parent), false)).unwrap();
            for i in 0..4 {
                let p = (k * 4 + i) % 16;
                // every fourth page a copy of a chunk a pack already holds
                want[p as usize] = if i == 3 {
                    noise(1000 + (p + 1) % 16)
                } else {
                    noise(k * 16 + p + 1)
                };
                w.put_page(0, p, &want[p as usize]).unwrap();
            }
            parent = w.commit().unwrap().id;
            if let Some(done) = s.reap_background_fold() {
                assert!(!done.result.unwrap().published.is_empty());
                folded += 1;
                let folder = s.journal.as_ref().unwrap().folder.as_ref().unwrap();
                assert!(folder.index.is_empty(), "the fold thread loaded an index");
                assert!(!folder.is_indexed());
            }
        }
        assert!(folded > 0, "no file filled");
        s.fold_journal().unwrap();
        assert_eq!(s.latest().unwrap().unwrap().id, parent);
        for (p, bytes) in want.iter().enumerate() {
            assert_eq!(&read(d.path(), p as u64), bytes, "page {p}");
        }
        let mut s = Store::open(d.path()).unwrap();
        assert!(s.verify(&mut |_| {}).unwrap().ok());
        // a chunk in two packs: gc keeps what the newest snapshot needs
        s.gc(
            &crate::store::gc::Retention {
                keep_last: Some(1),
                ..Default::default()
            },
            &mut |_| {},
        )
        .unwrap();
        for (p, bytes) in want.iter().enumerate() {
            assert_eq!(&read(d.path(), p as u64), bytes, "page {p} after gc");
        }
        assert!(
            Store::open(d.path())
                .unwrap()
                .verify(&mut |_| {})
                .unwrap()
                .ok()
        );
    }

    #[test]
    fn a_background_fold_that_died_before_its_reset_is_folded_again_in_order() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create_or_open(d.path()).unwrap();
        let mut w = s.begin(meta(None, true)).unwrap();
        w.put_page(0, 0, &page(1)).unwrap();
        let mut parent = w.commit().unwrap().id;
        let jp = journal::path_of(d.path());
        let mut full = None;
        let mut want = vec![vec![0u8; PAGE]; 16];
        want[0] = page(1);
        for k in 0..100u64 {
            // the first file as it was when it filled
            let before = std::fs::read(&jp).unwrap_or_default();
            let mut w = s.begin_journaled(meta(Some(parent), false)).unwrap();
            for p in 0..4u64 {
                want[p as usize] = noise(k * 4 + p + 1);
                w.put_page(0, p, &want[p as usize]).unwrap();
            }
            parent = w.commit().unwrap().id;
            if s.background_fold_running() {
                s.wait_background_fold().unwrap().result.unwrap();
                full = Some(before);
                break;
            }
        }
        let full = full.expect("the first file never filled");
        drop(s);
        // as if the fold died after publishing and before its reset
        std::fs::write(&jp, &full).unwrap();
        let rep = fold_journal_at(d.path()).unwrap().unwrap();
        assert!(rep.records > 1, "{rep:?}");
        assert_eq!(
            Store::open(d.path()).unwrap().latest().unwrap().unwrap().id,
            parent
        );
        for (p, bytes) in want.iter().enumerate() {
            assert_eq!(&read(d.path(), p as u64), bytes, "page {p}");
        }
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

    /// `base` with `n` bytes at `at` rewritten from `seed` (a SET's change).
    fn changed(base: &[u8], at: usize, n: usize, seed: u64) -> Vec<u8> {
        let mut p = base.to_vec();
        let at = at % (PAGE - n);
        p[at..at + n].copy_from_slice(&noise(seed)[..n]);
        p
    }

    #[test]
    fn delta_records_fold_onto_the_base_onto_each_other_and_across_files() {
        use crate::store::delta;
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create_or_open(d.path()).unwrap();
        let (mut parent, mut want) = noise_base(&mut s, 8, 100);
        // what the parent holds: what a delta is taken against
        want.resize(16, vec![0u8; PAGE]);
        let (mut deltas, mut folds) = (0, 0);
        for k in 0..800u64 {
            let mut w = s.begin_journaled(meta(Some(parent), false)).unwrap();
            let mut next = Vec::new();
            for i in 0..3u64 {
                let p = ((k * 5 + i) % 12) as usize;
                let new = match (k + i) % 4 {
                    0 => noise(k * 16 + i + 7), // whole: fills the files
                    _ if k % 97 == 5 => vec![0u8; PAGE],
                    _ => changed(
                        &want[p],
                        (k * 37 + i * 11) as usize,
                        40 + (k % 70) as usize,
                        k + i,
                    ),
                };
                let mut dl = Vec::new();
                match delta::encode(&want[p], &new, PAGE / 4, &mut dl) {
                    Some(_) if w.takes_delta(0) => {
                        w.put_delta(0, p as u64, &dl).unwrap();
                        deltas += 1;
                    }
                    _ => w.put_page(0, p as u64, &new).unwrap(),
                }
                next.push((p, new));
            }
            parent = w.commit().unwrap().id;
            for (p, new) in next {
                want[p] = new;
            }
            if let Some(done) = s.reap_background_fold() {
                let rep = done.result.expect("a background fold of delta records");
                assert!(rep.torn.is_none());
                folds += 1;
            }
            if k == 400 {
                // a fold in the foreground too (an idle app)
                s.fold_journal().unwrap();
            }
        }
        assert!(deltas > 1000, "{deltas} deltas put");
        assert!(folds >= 1, "{folds} background folds");
        dies_and_restores_as(s, d.path(), &parent, &want);
    }

    #[test]
    fn a_journaled_snapshot_too_large_for_the_journal_makes_its_deltas_whole() {
        use crate::store::delta;
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create_or_open(d.path()).unwrap();
        let big = |parent, full| {
            let mut m = meta(parent, full);
            m.regions[0].size = 400 * PAGE as u64;
            m
        };
        let mut w = s.begin(big(None, true)).unwrap();
        w.put_page(0, 0, &noise(1)).unwrap();
        let base = w.commit().unwrap().id;
        // a first record: the journal file is then of the version that holds deltas
        let mut w = s.begin_journaled(big(Some(base), false)).unwrap();
        w.put_page(0, 1, &noise(2)).unwrap();
        let j1 = w.commit().unwrap().id;
        let mut w = s.begin_journaled(big(Some(j1), false)).unwrap();
        assert!(w.takes_delta(0));
        let new0 = changed(&noise(1), 100, 50, 9);
        let mut dl = Vec::new();
        delta::encode(&noise(1), &new0, PAGE, &mut dl).unwrap();
        w.put_delta(0, 0, &dl).unwrap();
        // more than a 1 MiB journal holds: published instead
        for p in 2..300 {
            w.put_page(0, p, &noise(50 + p)).unwrap();
        }
        let info = w.commit().unwrap();
        assert!(!info.journaled, "{info:?}");
        drop(s);
        assert_eq!(read(d.path(), 0), new0);
        assert_eq!(read(d.path(), 1), noise(2));
        assert_eq!(read(d.path(), 299), noise(349));
    }

    #[test]
    fn a_delta_goes_only_where_it_applies() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create_or_open(d.path()).unwrap();
        let mut w = s.begin(meta(None, true)).unwrap();
        assert!(!w.takes_delta(0), "not journaled, no parent");
        assert!(w.put_delta(0, 0, &[0, 0]).is_err());
        w.put_page(0, 0, &noise(1)).unwrap();
        let base = w.commit().unwrap().id;
        let mut w = s.begin_journaled(meta(Some(base.clone()), false)).unwrap();
        assert!(w.put_delta(0, 0, &[1, 0]).is_err(), "a damaged delta");
        w.put_page(0, 1, &noise(2)).unwrap();
        let j1 = w.commit().unwrap().id;
        let mut w = s.begin_journaled(meta(Some(j1), false)).unwrap();
        assert!(w.takes_delta(0));
        w.set_whole(0).unwrap();
        assert!(!w.takes_delta(0), "a region stored whole inherits nothing");
        w.abort();
        let mut w2 = s.begin(meta(Some(base), false)).unwrap();
        assert!(!w2.takes_delta(0), "published, not journaled");
        w2.put_page(0, 2, &noise(3)).unwrap();
    }

    #[test]
    fn a_fold_keeps_what_a_delta_page_is_built_from_not_its_content() {
        use crate::store::delta;
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::create_or_open(d.path()).unwrap();
        let (mut parent, mut want) = noise_base(&mut s, 16, 7);
        for k in 0..5u64 {
            let mut w = s.begin_journaled(meta(Some(parent), false)).unwrap();
            for (p, page) in want.iter_mut().enumerate() {
                let new = changed(page, p * 31 + k as usize * 7, 100, k * 16 + p as u64);
                let mut dl = Vec::new();
                delta::encode(page, &new, PAGE / 4, &mut dl).unwrap();
                w.put_delta(0, p as u64, &dl).unwrap();
                *page = new;
            }
            parent = w.commit().unwrap().id;
        }
        let scan = journal::scan_dir(d.path()).unwrap().unwrap();
        assert_eq!(scan.records.len(), 5);
        let mut pages = journal::PageReader::new(d.path());
        let mut kept = KeptPages::new(&s, &scan.records).unwrap();
        for (g, r) in scan.records.iter().enumerate() {
            kept.follow(d.path(), g, r, &pages.pages(r).unwrap())
                .unwrap();
        }
        // five deltas of about 110 bytes a page: kept as deltas, not pages
        assert_eq!(kept.held(), (16, 0));
        let last = scan.records.last().unwrap();
        for p in 0..16u64 {
            kept.put_page(d.path(), 4, last, 0, p, |got| {
                assert_eq!(got, &want[p as usize][..], "page {p}");
                Ok(())
            })
            .unwrap();
        }
        assert_eq!(kept.held(), (0, 0), "forgotten after their last delta");
    }
}
