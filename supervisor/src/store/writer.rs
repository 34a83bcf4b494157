//! `SnapshotWriter`: takes pages, stores the new ones (hash, dedup,
//! compress, append to this snapshot's pack) and publishes the snapshot
//! atomically on `commit`: pack, then page map, then manifest, each written
//! to `tmp/`, fsynced and renamed, the directories fsynced.  Until the
//! manifest's rename nothing is published; a crash leaves only leftovers.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use super::error::StoreError;
use super::fasthash::FastMap;
use super::format::{Hash, PACKS, PAGE, SNAPSHOTS, SnapshotId, TMP, VERSION, ZSTD_LEVEL, unix_ns};
use super::manifest::{
    Manifest, ManifestRegion, ManifestStats, MapRef, RegionMeta, SnapshotInfo, SnapshotKind,
};
use super::map::{self, MapEntry};
use super::pack::{ChunkCompressor, IndexEntry, PackWriter};
use super::{Loc, PackSlot, Store, fsio};

/// What a new snapshot is: its lineage, counters and regions.
#[derive(Debug, Clone)]
pub struct NewSnapshot {
    /// The snapshot this one follows.  A delta (`full == false`) needs one.
    pub parent: Option<SnapshotId>,
    /// Every non-zero page will be put (nothing inherited from the parent).
    pub full: bool,
    pub epoch: u64,
    pub generation: u64,
    pub app: String,
    pub tags: Vec<String>,
    pub regions: Vec<RegionMeta>,
    /// Where it stands in the app's redo log (known at the cut: `set_redo`).
    pub redo: Option<super::manifest::RedoMark>,
}

#[cfg(test)]
impl NewSnapshot {
    /// A first, full snapshot of `regions` (epoch and generation 1), for
    /// the unit tests that need a store to start from.
    pub(crate) fn full_for_test(regions: Vec<RegionMeta>) -> NewSnapshot {
        NewSnapshot {
            parent: None,
            full: true,
            epoch: 1,
            generation: 1,
            app: "t".into(),
            tags: Vec::new(),
            regions,
            redo: None,
        }
    }
}

/// Counters of one writer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    pub pages_put: u64,
    pub new_chunks: u64,
    pub dedup_hits: u64,
    pub zero_pages: u64,
    pub bytes_raw: u64,
    pub bytes_compressed: u64,
    /// Pages journaled as deltas, and their bytes.
    pub delta_pages: u64,
    pub delta_bytes: u64,
}

/// Overrides for `recv`: keep the sender's id and creation time.
pub(crate) struct Origin {
    pub id: SnapshotId,
    pub created: SystemTime,
}

pub struct SnapshotWriter<'a> {
    pub(crate) store: &'a mut Store,
    /// None while the journal is folded (the folding caller holds it).
    _lock: Option<super::StoreLock>,
    id: SnapshotId,
    created: SystemTime,
    meta: NewSnapshot,
    regions: Vec<ManifestRegion>,
    /// per region: pages absent from this snapshot come from the parent
    inherits: Vec<bool>,
    pack: Option<PackWriter>,
    new_chunks: HashMap<Hash, IndexEntry>,
    entries: Vec<MapEntry>,
    comp: ChunkCompressor,
    page: Box<[u8; PAGE]>,
    stats: WriteStats,
    /// files published so far by `commit` (removed again if it fails)
    published: Vec<PathBuf>,
    done: bool,
    /// Journaled (fold.rs): new chunks are kept here, not in a pack, and
    /// `commit` appends one journal record instead of publishing.
    pub(crate) journal: bool,
    pub(crate) jchunks: HashMap<Hash, (u32, Vec<u8>)>,
    /// Pages put as deltas (their entries carry no hash).
    jdeltas: FastMap<(u32, u64), Vec<u8>>,
    jbytes: usize,
}

/// A journaled snapshot holding more compressed bytes than this goes to a
/// pack instead (`spill`): a record stays small, memory stays bounded.
const JOURNAL_SPILL_BYTES: usize = 16 << 20;

fn bad(store: &Store, detail: impl Into<String>) -> StoreError {
    StoreError::InvalidArgument {
        path: store.dir.clone(),
        detail: detail.into(),
    }
}

/// A tag must not be mistaken for an id or for "latest", and becomes part
/// of a listing: printable, no spaces.
pub fn check_tag(t: &str) -> Result<(), String> {
    if t.is_empty() || t.len() > 128 {
        return Err(format!("tag {t:?}: 1 to 128 characters"));
    }
    if t == "latest" || SnapshotId(t.to_string()).is_valid() {
        return Err(format!("tag {t:?} reads as a snapshot id or \"latest\""));
    }
    if !t.chars().all(|c| c.is_ascii_graphic() && c != '@') {
        return Err(format!("tag {t:?}: printable ASCII without spaces or '@'"));
    }
    Ok(())
}

pub(crate) fn check_meta(store: &Store, meta: &NewSnapshot) -> Result<(), StoreError> {
    if !meta.full && meta.parent.is_none() {
        return Err(bad(store, "a delta snapshot needs a parent"));
    }
    for t in &meta.tags {
        check_tag(t).map_err(|d| bad(store, d))?;
    }
    let mut names = BTreeSet::new();
    for r in &meta.regions {
        if r.name.is_empty() || r.size == 0 {
            return Err(bad(
                store,
                format!("region {:?}: empty name or size 0", r.name),
            ));
        }
        if !names.insert(&r.name) {
            return Err(bad(store, format!("region name {:?} used twice", r.name)));
        }
        if r.addr.checked_add(r.size).is_none() {
            return Err(bad(
                store,
                format!("region {:?}: address + size overflows", r.name),
            ));
        }
    }
    Ok(())
}

impl Store {
    /// Starts a snapshot: takes the writers' lock (`locked` if another
    /// writer holds it), cleans a crashed writer's leftovers in `tmp/`.
    pub fn begin(&mut self, meta: NewSnapshot) -> Result<SnapshotWriter<'_>, StoreError> {
        self.begin_as(meta, None)
    }

    pub(crate) fn begin_as(
        &mut self,
        meta: NewSnapshot,
        origin: Option<Origin>,
    ) -> Result<SnapshotWriter<'_>, StoreError> {
        check_meta(self, &meta)?;
        let lock = self.lock()?;
        // a journal's records come first: this snapshot may follow them
        self.fold_locked()?;
        self.begin_unlocked(meta, origin, Some(lock))
    }

    /// `begin` for a caller that holds the lock and has folded (fold.rs).
    pub(crate) fn begin_unlocked(
        &mut self,
        meta: NewSnapshot,
        origin: Option<Origin>,
        lock: Option<super::StoreLock>,
    ) -> Result<SnapshotWriter<'_>, StoreError> {
        self.prepare_write()?;
        let parent_regions = self.parent_regions(&meta)?;
        let (id, created) = match origin {
            Some(o) => (o.id, o.created),
            None => {
                let now = SystemTime::now();
                (SnapshotId::new(self.next_seq()?, now), now)
            }
        };
        self.writer(meta, lock, id, created, parent_regions, false)
    }

    /// The parent's regions (what a delta inherits from).
    pub(crate) fn parent_regions(
        &self,
        meta: &NewSnapshot,
    ) -> Result<Vec<ManifestRegion>, StoreError> {
        Ok(match &meta.parent {
            None => Vec::new(),
            Some(p) => match self.load_manifest(p) {
                Ok(m) => m.regions,
                // a full snapshot names its parent for lineage only
                Err(StoreError::NotFound { .. }) if meta.full => Vec::new(),
                Err(StoreError::NotFound { .. }) => {
                    return Err(StoreError::MissingParent {
                        path: self.manifest_path(p),
                        parent: p.to_string(),
                    });
                }
                Err(e) => return Err(e),
            },
        })
    }

    pub(crate) fn writer(
        &mut self,
        meta: NewSnapshot,
        lock: Option<super::StoreLock>,
        id: SnapshotId,
        created: SystemTime,
        parent_regions: Vec<ManifestRegion>,
        journal: bool,
    ) -> Result<SnapshotWriter<'_>, StoreError> {
        let inherits = meta
            .regions
            .iter()
            .map(|r| !meta.full && parent_regions.iter().any(|p| p.meta.same_shape(r)))
            .collect();
        if let Some(p) = &meta.parent
            && p >= &id
        {
            return Err(bad(self, format!("parent {p} is not older than {id}")));
        }
        let regions = meta
            .regions
            .iter()
            .map(|r| ManifestRegion {
                meta: r.clone(),
                whole: false,
            })
            .collect();
        Ok(SnapshotWriter {
            _lock: lock,
            id,
            created,
            meta,
            regions,
            inherits,
            pack: None,
            new_chunks: HashMap::new(),
            entries: Vec::new(),
            comp: ChunkCompressor::new(ZSTD_LEVEL)?,
            page: Box::new([0u8; PAGE]),
            stats: WriteStats::default(),
            published: Vec::new(),
            done: false,
            journal,
            jchunks: HashMap::new(),
            jdeltas: FastMap::default(),
            jbytes: 0,
            store: self,
        })
    }
}

fn is_zero(data: &[u8]) -> bool {
    // an OR over the page vectorizes; an early-exit loop does not
    data.iter().fold(0u8, |a, &b| a | b) == 0
}

impl SnapshotWriter<'_> {
    pub fn id(&self) -> &SnapshotId {
        &self.id
    }

    /// The snapshot's place in the app's redo log, known at the cut.
    pub fn set_redo(&mut self, m: Option<super::manifest::RedoMark>) {
        self.meta.redo = m;
    }

    pub fn stats(&self) -> WriteStats {
        self.stats
    }

    fn check_page(&self, region: u32, page: u64) -> Result<(), StoreError> {
        let r = self
            .regions
            .get(region as usize)
            .ok_or_else(|| bad(self.store, format!("region {region} out of range")))?;
        if page >= r.meta.page_count() {
            return Err(bad(
                self.store,
                format!(
                    "page {page} beyond region {:?} ({} bytes)",
                    r.meta.name, r.meta.size
                ),
            ));
        }
        Ok(())
    }

    /// Stores one 4 KiB page of a region.  A page put twice keeps the last.
    pub fn put_page(&mut self, region: u32, page: u64, data: &[u8]) -> Result<(), StoreError> {
        if data.len() != PAGE {
            return Err(bad(
                self.store,
                format!("a page is {PAGE} bytes, not {}", data.len()),
            ));
        }
        self.check_page(region, page)?;
        if self.journal && !self.jdeltas.is_empty() {
            self.jdeltas.remove(&(region, page)); // the last put of a page wins
        }
        self.stats.pages_put += 1;
        self.stats.bytes_raw += PAGE as u64;
        if is_zero(data) {
            self.stats.zero_pages += 1;
            self.entries.push(MapEntry {
                region,
                page,
                hash: None,
            });
            return Ok(());
        }
        let hash = *blake3::hash(data).as_bytes();
        // a journal record carries every chunk it names (fold.rs)
        let known = if self.journal {
            self.jchunks.contains_key(&hash)
        } else {
            self.store.index.contains_key(&hash) || self.new_chunks.contains_key(&hash)
        };
        if known {
            self.stats.dedup_hits += 1;
        } else {
            // a copy: the compressor's buffer stays borrowed otherwise
            let (bytes, flags) = self.comp.compress(data);
            let bytes = bytes.to_vec();
            if self.journal {
                self.stats.new_chunks += 1;
                self.stats.bytes_compressed += bytes.len() as u64;
                self.jbytes += bytes.len();
                self.jchunks.insert(hash, (flags, bytes));
                if self.jbytes > JOURNAL_SPILL_BYTES {
                    self.spill()?;
                }
            } else {
                self.add_new_chunk(hash, &bytes, flags)?;
            }
        }
        self.entries.push(MapEntry {
            region,
            page,
            hash: Some(hash),
        });
        Ok(())
    }

    /// The regions that inherit nothing from the parent (stored whole, or
    /// of another shape): what the snapshot holds of them is what was put.
    pub fn fresh_regions(&self) -> Vec<String> {
        self.regions
            .iter()
            .zip(&self.inherits)
            .filter(|(r, inherits)| r.whole || !**inherits)
            .map(|(r, _)| r.meta.name.clone())
            .collect()
    }

    /// Whether `put_delta` takes a page of `region`: a journaled snapshot
    /// with a parent, into a journal file of the version that holds
    /// deltas, of a region that inherits its parent's pages.
    pub fn takes_delta(&self, region: u32) -> bool {
        self.journal
            && self.meta.parent.is_some()
            && self.inherits.get(region as usize).copied().unwrap_or(false)
            && self.regions.get(region as usize).is_some_and(|r| !r.whole)
            && self.store.journal_takes_deltas()
    }

    /// A page as the bytes that changed since the parent snapshot
    /// (store/delta.rs), in a journaled snapshot (`takes_delta`).  The
    /// caller computed the delta against the page the parent holds.
    pub fn put_delta(&mut self, region: u32, page: u64, delta: &[u8]) -> Result<(), StoreError> {
        if !self.takes_delta(region) {
            return Err(bad(
                self.store,
                format!("region {region} takes no delta in this snapshot"),
            ));
        }
        super::delta::check(delta).map_err(|e| bad(self.store, format!("a delta: {e}")))?;
        self.check_page(region, page)?;
        self.stats.pages_put += 1;
        self.stats.bytes_raw += PAGE as u64;
        self.stats.delta_pages += 1;
        self.stats.delta_bytes += delta.len() as u64;
        self.jbytes += delta.len();
        self.jdeltas.insert((region, page), delta.to_vec());
        self.entries.push(MapEntry {
            region,
            page,
            hash: None,
        });
        Ok(())
    }

    /// A journaled snapshot becomes an ordinary one: the journal is folded
    /// (this snapshot may follow its records), its chunks go to a pack.
    pub(crate) fn spill(&mut self) -> Result<(), StoreError> {
        if !self.journal {
            return Ok(());
        }
        self.journal = false;
        self.store.fold_locked()?;
        self.store.prepare_write()?;
        let chunks: Vec<(Hash, (u32, Vec<u8>))> = self.jchunks.drain().collect();
        self.jbytes = 0;
        for (h, (flags, bytes)) in chunks {
            if !self.store.index.contains_key(&h) {
                self.add_new_chunk_uncounted(h, &bytes, flags)?;
            }
        }
        self.materialise_deltas()
    }

    /// The pages put as deltas, made whole: the parent's page (published
    /// now: the journal was folded) with the delta applied, put again.
    /// Their entries come later than the delta's, so they win.
    fn materialise_deltas(&mut self) -> Result<(), StoreError> {
        if self.jdeltas.is_empty() {
            return Ok(());
        }
        let parent = self
            .meta
            .parent
            .clone()
            .ok_or_else(|| bad(self.store, "a delta without a parent".to_string()))?;
        let base = self.store.open_snapshot(&parent)?;
        let mut deltas: Vec<((u32, u64), Vec<u8>)> = self.jdeltas.drain().collect();
        deltas.sort_unstable_by_key(|(k, _)| *k);
        let mut page = vec![0u8; PAGE];
        for ((region, p), d) in deltas {
            base.read_page_named(&self.regions[region as usize].meta.name, p, &mut page)?;
            super::delta::apply(&mut page, &d)
                .map_err(|e| bad(self.store, format!("a delta: {e}")))?;
            self.put_page(region, p, &page)?;
        }
        Ok(())
    }

    /// Appends a chunk the store does not hold yet to this snapshot's pack.
    fn add_new_chunk(&mut self, hash: Hash, bytes: &[u8], flags: u32) -> Result<(), StoreError> {
        self.add_new_chunk_uncounted(hash, bytes, flags)?;
        self.stats.new_chunks += 1;
        self.stats.bytes_compressed += bytes.len() as u64;
        Ok(())
    }

    fn add_new_chunk_uncounted(
        &mut self,
        hash: Hash,
        bytes: &[u8],
        flags: u32,
    ) -> Result<(), StoreError> {
        if self.pack.is_none() {
            let tmp = self.store.sub(TMP).join(format!("{}.pack", self.id));
            self.pack = Some(PackWriter::create(tmp)?);
        }
        let e = match self.pack.as_mut() {
            Some(p) => p.add(hash, bytes, flags)?,
            None => unreachable!("created above"),
        };
        self.new_chunks.insert(hash, e);
        Ok(())
    }

    /// Stores a whole region from `data` (at most its size; the rest reads
    /// as zeros): the region inherits nothing from the parent.
    pub fn put_bytes(&mut self, region: u32, data: &[u8]) -> Result<(), StoreError> {
        let r = self
            .regions
            .get_mut(region as usize)
            .ok_or_else(|| bad(self.store, format!("region {region} out of range")))?;
        if data.len() as u64 > r.meta.size {
            return Err(bad(
                self.store,
                format!(
                    "{} bytes for region {:?} of {} bytes",
                    data.len(),
                    r.meta.name,
                    r.meta.size
                ),
            ));
        }
        r.whole = true;
        self.inherits[region as usize] = false;
        self.entries.retain(|e| e.region != region);
        for (i, chunk) in data.chunks(PAGE).enumerate() {
            if chunk.len() == PAGE {
                self.put_page(region, i as u64, chunk)?;
            } else {
                let mut page = std::mem::replace(&mut self.page, Box::new([0u8; PAGE]));
                page.fill(0);
                page[..chunk.len()].copy_from_slice(chunk);
                let r = self.put_page(region, i as u64, &page[..]);
                self.page = page;
                r?;
            }
        }
        Ok(())
    }

    /// Stores a page as a chunk already compressed and checked (recv: its
    /// bytes decompress to a page whose blake3 is `hash`): kept as it came,
    /// not compressed again.
    pub(crate) fn put_checked_chunk(
        &mut self,
        region: u32,
        page: u64,
        hash: Hash,
        bytes: &[u8],
        flags: u32,
    ) -> Result<(), StoreError> {
        self.check_page(region, page)?;
        self.stats.pages_put += 1;
        self.stats.bytes_raw += PAGE as u64;
        if self.store.index.contains_key(&hash) || self.new_chunks.contains_key(&hash) {
            self.stats.dedup_hits += 1;
        } else {
            self.add_new_chunk(hash, bytes, flags)?;
        }
        self.entries.push(MapEntry {
            region,
            page,
            hash: Some(hash),
        });
        Ok(())
    }

    /// Records a page whose chunk the store already holds (recv).
    pub(crate) fn put_known(
        &mut self,
        region: u32,
        page: u64,
        hash: Hash,
    ) -> Result<(), StoreError> {
        self.check_page(region, page)?;
        if !self.store.index.contains_key(&hash) && !self.new_chunks.contains_key(&hash) {
            return Err(StoreError::MissingChunk {
                path: self.store.dir.clone(),
                hash: super::format::hex(&hash),
            });
        }
        self.stats.pages_put += 1;
        self.stats.dedup_hits += 1;
        self.entries.push(MapEntry {
            region,
            page,
            hash: Some(hash),
        });
        Ok(())
    }

    /// Records a zero page (recv: the sender's map says so).
    pub(crate) fn put_zero(&mut self, region: u32, page: u64) -> Result<(), StoreError> {
        self.check_page(region, page)?;
        self.stats.pages_put += 1;
        self.stats.zero_pages += 1;
        self.entries.push(MapEntry {
            region,
            page,
            hash: None,
        });
        Ok(())
    }

    /// Marks a region whole and forgets the pages put in it so far: a
    /// journal record that stored the region whole, folded after others.
    pub(crate) fn restart_region(&mut self, region: u32) -> Result<(), StoreError> {
        self.set_whole(region)?;
        self.entries.retain(|e| e.region != region);
        Ok(())
    }

    /// Appends the snapshot to the store's journal (one write, one
    /// fdatasync); a record too large for the journal's room folds the
    /// journal first, one too large for an empty journal is published.
    fn commit_journaled(&mut self) -> Result<SnapshotInfo, StoreError> {
        let entries = self.final_entries();
        let mut pages = Vec::with_capacity(entries.len());
        for e in &entries {
            use super::journal::PageData;
            let data = match &e.hash {
                None => match self.jdeltas.get(&(e.region, e.page)) {
                    Some(d) => PageData::Delta(d.clone()),
                    None => PageData::Zero,
                },
                Some(h) => {
                    let (flags, bytes) = self.jchunks.get(h).ok_or_else(|| {
                        bad(self.store, "a journaled page without its chunk".to_string())
                    })?;
                    PageData::Chunk(*h, *flags, bytes.clone())
                }
            };
            pages.push(super::journal::RecordPage {
                region: e.region,
                page: e.page,
                data,
            });
        }
        let meta = super::journal::RecordMeta {
            id: self.id.clone(),
            parent: self.meta.parent.clone(),
            full: self.meta.full,
            epoch: self.meta.epoch,
            generation: self.meta.generation,
            created_ns: unix_ns(self.created),
            app: self.meta.app.clone(),
            tags: self.meta.tags.clone(),
            regions: self.regions.clone(),
            redo: self.meta.redo,
        };
        let payload = super::journal::encode_payload(&meta, &pages);
        if !self.store.journal_append(&meta, &payload)? {
            // larger than the whole journal: an ordinary snapshot
            self.entries = entries;
            self.spill()?;
            return self.commit_inner();
        }
        let nonzero = entries
            .iter()
            .filter(|e| e.hash.is_some() || self.jdeltas.contains_key(&(e.region, e.page)))
            .count() as u64;
        Ok(SnapshotInfo {
            id: self.id.clone(),
            parent: self.meta.parent.clone(),
            epoch: self.meta.epoch,
            generation: self.meta.generation,
            created: self.created,
            app: self.meta.app.clone(),
            tags: self.meta.tags.clone(),
            full: self.meta.full,
            pages: nonzero,
            new_bytes_compressed: self.stats.bytes_compressed,
            logical_bytes: 0,
            journaled: true,
            redo: self.meta.redo,
        })
    }

    /// Marks a region whole (it inherits nothing): recv of a `put_bytes`.
    pub(crate) fn set_whole(&mut self, region: u32) -> Result<(), StoreError> {
        let r = self
            .regions
            .get_mut(region as usize)
            .ok_or_else(|| bad(self.store, format!("region {region} out of range")))?;
        r.whole = true;
        self.inherits[region as usize] = false;
        Ok(())
    }

    /// The map: one entry per page (the last put wins), zero entries only
    /// where they hide a parent's page.
    pub(crate) fn final_entries(&mut self) -> Vec<MapEntry> {
        let mut es = std::mem::take(&mut self.entries);
        es.sort_by_key(|e| (e.region, e.page)); // stable: puts keep their order
        let mut out: Vec<MapEntry> = Vec::with_capacity(es.len());
        for e in es {
            match out.last_mut() {
                Some(l) if (l.region, l.page) == (e.region, e.page) => *l = e,
                _ => out.push(e),
            }
        }
        out.retain(|e| e.hash.is_some() || self.inherits[e.region as usize]);
        out
    }

    /// Publishes the snapshot (or, journaled, appends it to the journal);
    /// it is durable when this returns.
    pub fn commit(mut self) -> Result<SnapshotInfo, StoreError> {
        let r = if self.journal {
            self.commit_journaled()
        } else {
            self.commit_inner()
        };
        self.done = true;
        if r.is_err() {
            self.cleanup();
        }
        r
    }

    pub(crate) fn commit_inner(&mut self) -> Result<SnapshotInfo, StoreError> {
        let entries = self.final_entries();
        let packs_dir = self.store.sub(PACKS);
        let snaps_dir = self.store.sub(SNAPSHOTS);
        let tmp_dir = self.store.sub(TMP);
        // Three rounds, each waiting about one fsync: (1) pack, map and
        // manifest written to tmp/ and fsynced together; (2) pack and map
        // renamed, both directories fsynced; (3) the manifest renamed (the
        // commit point), snapshots/ fsynced.
        let mut tmp_files: Vec<(File, PathBuf)> = Vec::new();
        // the pack: a free name (a crashed recv of this id may have left one)
        let mut pack = None;
        if let Some(pw) = self.pack.take() {
            let tmp = pw.tmp.clone();
            tmp_files.push((pw.finish()?, tmp.clone()));
            let mut name = format!("{}.pack", self.id);
            let mut k = 1;
            while packs_dir.join(&name).exists() {
                name = format!("{}-r{k}.pack", self.id);
                k += 1;
            }
            pack = Some((tmp, name));
        }
        let pack_name = pack.as_ref().map(|(_, n)| n.clone());
        // which packs the map's chunks are in
        let mut packs = BTreeSet::new();
        for e in &entries {
            if let Some(h) = &e.hash {
                if self.new_chunks.contains_key(h) {
                    packs.insert(pack_name.clone().unwrap_or_default());
                } else if let Some(loc) = self.store.index.get(h) {
                    packs.insert(self.store.packs[loc.pack as usize].name.clone());
                }
            }
        }
        let map_bytes = map::encode(&entries)?;
        let map_sum = blake3::hash(&map_bytes);
        let map_name = format!("{}-{}.map", self.id, &map_sum.to_hex()[..16]);
        let map_tmp = tmp_dir.join(&map_name);
        tmp_files.push((fsio::write_new(&map_tmp, &map_bytes)?, map_tmp.clone()));
        let stats = ManifestStats {
            pages: entries.iter().filter(|e| e.hash.is_some()).count() as u64,
            zero_pages: entries.iter().filter(|e| e.hash.is_none()).count() as u64,
            new_chunks: self.stats.new_chunks,
            dedup_hits: self.stats.dedup_hits,
            new_bytes_compressed: self.stats.bytes_compressed,
            // an arena is reserved large and backed as it grows: what a
            // restore produces is its memfd's size, when the engine says it
            logical_bytes: self
                .meta
                .regions
                .iter()
                .map(|r| {
                    r.layout
                        .get("memfd_bytes")
                        .and_then(serde_json::Value::as_u64)
                        .map_or(r.size, |b| b.min(r.size))
                })
                .sum(),
        };
        let m = Manifest {
            format: super::manifest::FORMAT_NAME.into(),
            version: if self.meta.redo.is_some() {
                super::manifest::REDO_VERSION
            } else {
                VERSION
            },
            id: self.id.clone(),
            parent: self.meta.parent.clone(),
            kind: if self.meta.full {
                SnapshotKind::Full
            } else {
                SnapshotKind::Delta
            },
            epoch: self.meta.epoch,
            generation: self.meta.generation,
            created_ns: unix_ns(self.created),
            created: humantime::format_rfc3339_millis(self.created).to_string(),
            app: self.meta.app.clone(),
            tags: self.meta.tags.clone(),
            regions: self.regions.clone(),
            map: MapRef {
                file: map_name.clone(),
                size: map_bytes.len() as u64,
                blake3: map_sum.to_hex().to_string(),
                entries: entries.len() as u64,
            },
            pack: pack_name.clone(),
            packs: packs.into_iter().collect(),
            stats,
            redo: self.meta.redo,
        };
        let man_tmp = tmp_dir.join(format!("{}.json", self.id));
        tmp_files.push((fsio::write_new(&man_tmp, &m.encode())?, man_tmp.clone()));
        let refs: Vec<(&File, &std::path::Path)> =
            tmp_files.iter().map(|(f, p)| (f, p.as_path())).collect();
        fsio::fsync_many(&refs)?;
        drop(refs);
        tmp_files.clear();
        let mut dirs = vec![snaps_dir.as_path()];
        if let Some((tmp, name)) = &pack {
            let to = packs_dir.join(name);
            fsio::rename(tmp, &to)?;
            self.published.push(to);
            dirs.push(packs_dir.as_path());
        }
        let map_path = snaps_dir.join(&map_name);
        fsio::rename(&map_tmp, &map_path)?;
        self.published.push(map_path);
        fsio::fsync_dirs(&dirs)?;
        fsio::rename(&man_tmp, &self.store.manifest_path(&self.id))?;
        // published: from here on, a failure must not remove anything
        self.published.clear();
        fsio::fsync_dir(&snaps_dir)?;
        if let Some(name) = pack_name {
            self.register_pack(name);
        }
        self.store.note_published(&self.id);
        Ok(m.info())
    }

    /// Makes the new pack's chunks visible to the next writers' dedup.
    fn register_pack(&mut self, name: String) {
        let path = self.store.sub(PACKS).join(&name);
        let id = self.store.packs.len() as u32;
        let state = File::open(&path)
            .map(Arc::new)
            .map_err(|e| super::error::io_err("open", &path, &e));
        let ok = state.is_ok();
        self.store.packs.push(PackSlot {
            name: name.clone(),
            path,
            state,
            chunks: self.new_chunks.len() as u64,
        });
        self.store.by_name.insert(name, id);
        if ok && self.store.dedup_across_packs {
            for (h, e) in self.new_chunks.drain() {
                self.store.index.entry(h).or_insert(Loc::new(id, &e));
            }
        }
    }

    /// Drops the snapshot: nothing of it stays published.
    pub fn abort(mut self) {
        self.done = true;
        self.cleanup();
    }

    fn cleanup(&mut self) {
        // what it could not remove is for the next writer's listing
        self.store.forget_listing();
        if let Some(pw) = self.pack.take() {
            let _ = std::fs::remove_file(&pw.tmp);
        }
        for p in self.published.drain(..) {
            let _ = std::fs::remove_file(p);
        }
        // this snapshot's files in tmp/ (a write that failed half-way)
        let prefix = self.id.to_string();
        if let Ok(names) = self.store.names(TMP, "") {
            for n in names.into_iter().filter(|n| n.starts_with(&prefix)) {
                let _ = std::fs::remove_file(self.store.sub(TMP).join(n));
            }
        }
    }
}

impl Drop for SnapshotWriter<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.cleanup();
        }
    }
}
