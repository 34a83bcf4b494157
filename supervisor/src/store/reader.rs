//! `SnapshotReader`: a snapshot's chain folded into one page table
//! (region, page) -> chunk, checked on open (manifests, maps, packs present)
//! and per page on read (decompressed length and blake3).

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::time::Instant;

use super::error::{StoreError, io_at};
use super::format::{Hash, PAGE, SNAPSHOTS, SnapshotId, hex};
use super::location_index::{self, LocEntry, Reason, Rejected};
use super::manifest::{Manifest, RegionMeta, SnapshotInfo, SnapshotKind};
use super::map::{self, MapEntry};
use super::pack::{ChunkReader, IndexEntry};
use super::{Phase, Progress, Store};

/// A present page: which of the reader's packs, and the chunk's entry.
#[derive(Debug, Clone, Copy)]
struct Slot {
    page: u64,
    pack: u32,
    entry: IndexEntry,
}

impl Slot {
    /// A page whose chunk is still to be found (`pack` u32::MAX).
    fn unlocated(page: u64, hash: Hash) -> Slot {
        Slot {
            page,
            pack: u32::MAX,
            entry: IndexEntry {
                hash,
                offset: 0,
                len: 0,
                flags: 0,
            },
        }
    }
}

pub struct SnapshotReader {
    info: SnapshotInfo,
    regions: Vec<RegionMeta>,
    /// per region, sorted by page
    pages: Vec<Vec<Slot>>,
    packs: Vec<(PathBuf, Arc<File>)>,
}

thread_local! {
    static CHUNKS: RefCell<Option<ChunkReader>> = const { RefCell::new(None) };
}

impl Store {
    /// A snapshot's manifests from it back to the nearest full one
    /// (newest first).
    pub(crate) fn chain(&self, id: &SnapshotId) -> Result<Vec<(PathBuf, Manifest)>, StoreError> {
        let mut out: Vec<(PathBuf, Manifest)> = Vec::new();
        let mut next = id.clone();
        loop {
            let path = self.manifest_path(&next);
            let m = match self.load_manifest(&next) {
                Ok(m) => m,
                Err(StoreError::NotFound { .. }) if !out.is_empty() => {
                    return Err(StoreError::MissingParent {
                        path: out[out.len() - 1].0.clone(),
                        parent: next.to_string(),
                    });
                }
                Err(e) => return Err(e),
            };
            let parent = m.parent.clone();
            let full = m.kind == SnapshotKind::Full;
            out.push((path, m));
            match parent {
                Some(p) if !full => next = p,
                _ => return Ok(out),
            }
        }
    }

    /// Reads a manifest's page map and checks it against the manifest.
    pub(crate) fn load_map(&self, m: &Manifest) -> Result<Vec<MapEntry>, StoreError> {
        let path = self.sub(SNAPSHOTS).join(&m.map.file);
        let corrupt = |detail: &str| StoreError::MapCorrupt {
            path: path.clone(),
            detail: detail.into(),
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt("file missing"));
            }
            Err(e) => return Err(io_at("read", &path)(e)),
        };
        if bytes.len() as u64 != m.map.size {
            return Err(corrupt("size differs from the manifest's (truncated?)"));
        }
        if blake3::hash(&bytes).to_hex().as_str() != m.map.blake3 {
            return Err(corrupt("checksum mismatch"));
        }
        let entries = map::decode(&path, &bytes)?;
        if entries.len() as u64 != m.map.entries {
            return Err(corrupt("entry count differs from the manifest's"));
        }
        for e in &entries {
            let ok = m
                .regions
                .get(e.region as usize)
                .is_some_and(|r| e.page < r.meta.page_count());
            if !ok {
                return Err(corrupt(&format!(
                    "entry (region {}, page {}) out of range",
                    e.region, e.page
                )));
            }
        }
        Ok(entries)
    }

    /// One snapshot's own manifest and page map, checked (its packs present):
    /// what a copy kept up to date one snapshot at a time applies (the
    /// standby's hot image, cluster/hot_image.rs).
    pub fn own_changes(&self, id: &SnapshotId) -> Result<(Manifest, Vec<MapEntry>), StoreError> {
        let m = self.load_manifest(id)?;
        self.check_packs(&m)?;
        let entries = self.load_map(&m)?;
        Ok((m, entries))
    }

    /// Reads the chunk `hash` into `out` (a page), checked; the store must
    /// be opened with its indexes (`open`, `create_or_open`).
    pub fn read_chunk_by_hash(&self, hash: &Hash, out: &mut [u8]) -> Result<(), StoreError> {
        let loc = self
            .index
            .get(hash)
            .copied()
            .ok_or_else(|| StoreError::MissingChunk {
                path: self.dir().to_path_buf(),
                hash: hex(hash),
            })?;
        let (path, file) = self.pack_file(loc.pack)?;
        let e = IndexEntry {
            hash: *hash,
            offset: loc.offset,
            len: loc.len as u32,
            flags: loc.flags as u32,
        };
        read_chunk(file, path, &e, out)
    }

    /// Folds a chain (newest first) into per-region (page, hash) lists,
    /// sorted by page: each map is sorted by (region, page) on disk, so a
    /// delta is merged into what it inherits in one pass.
    pub(crate) fn fold(
        &self,
        chain: &[(PathBuf, Manifest)],
    ) -> Result<Vec<Vec<(u64, Hash)>>, StoreError> {
        self.fold_onto(Vec::new(), chain, merge_pages, &mut 0)
    }

    /// The fold's one pass: `deltas` (newest first) onto `state`, each
    /// region's delta merged (`merge`) into the list of the region of the
    /// same shape it inherits (none for a whole region or a full
    /// snapshot); `folded_entries` counts the map entries read.
    fn fold_onto<T>(
        &self,
        mut state: Vec<(RegionMeta, Vec<T>)>,
        deltas: &[(PathBuf, Manifest)],
        merge: fn(Vec<T>, &[MapEntry]) -> Vec<T>,
        folded_entries: &mut u64,
    ) -> Result<Vec<Vec<T>>, StoreError> {
        for (_, m) in deltas.iter().rev() {
            self.check_packs(m)?;
            let entries = self.load_map(m)?;
            *folded_entries += entries.len() as u64;
            let mut rest = &entries[..];
            let mut next = Vec::with_capacity(m.regions.len());
            for (i, r) in m.regions.iter().enumerate() {
                let inherited = if r.whole || m.kind == SnapshotKind::Full {
                    None
                } else {
                    state.iter().position(|(p, _)| p.same_shape(&r.meta))
                };
                let base = match inherited {
                    Some(k) => std::mem::take(&mut state[k].1),
                    None => Vec::new(),
                };
                let n = rest.partition_point(|e| e.region as usize == i);
                let (delta, after) = rest.split_at(n);
                rest = after;
                next.push((r.meta.clone(), merge(base, delta)));
            }
            state = next;
        }
        Ok(state.into_iter().map(|(_, p)| p).collect())
    }

    /// Opens a snapshot for reading: folds its chain and checks every
    /// manifest, map and pack it needs (chunks are checked as they are read).
    pub fn open_snapshot(&self, id: &SnapshotId) -> Result<SnapshotReader, StoreError> {
        self.open_snapshot_traced(id).map(|(r, _)| r)
    }

    /// As `open_snapshot`, through the newest usable location index of the
    /// chain (store/location_index.rs) when there is one: its pages, then
    /// the deltas after it folded in.  Says how it went (`IndexOutcome`).
    pub fn open_snapshot_traced(
        &self,
        id: &SnapshotId,
    ) -> Result<(SnapshotReader, IndexOutcome), StoreError> {
        let t0 = Instant::now();
        let chain = self.chain(id)?;
        let mut out = IndexOutcome {
            reason: Reason::Missing,
            index_of: None,
            deltas: 0,
            rejected: Vec::new(),
            chain_ms: ms(t0),
            index_ms: 0.0,
            fold_ms: 0.0,
            delta_entries: 0,
            packs_read: 0,
        };
        let t1 = Instant::now();
        for k in 0..chain.len() {
            match self.index_base(&chain[k]) {
                Ok(None) => continue,
                Ok(Some((state, packs, ids))) => {
                    out.index_ms = ms(t1);
                    let t2 = Instant::now();
                    let (top_path, top) = &chain[0];
                    let mut pages = self.fold_slots(state, &chain[..k], &mut out.delta_entries)?;
                    let mut packs = packs;
                    // chunks of the deltas after the index: first among the
                    // pages the index located, then the deltas' own packs,
                    // then the packs they name, then the rest of the store
                    let mut order: Vec<u32> = chain[..k]
                        .iter()
                        .filter_map(|(_, m)| m.pack.as_ref().and_then(|n| self.by_name.get(n)))
                        .copied()
                        .collect();
                    order.extend(self.named_packs(&chain[..k]));
                    out.packs_read = self.locate_missing(
                        &mut pages,
                        &mut packs,
                        ids,
                        Vec::new(),
                        order,
                        top_path,
                    )?;
                    out.fold_ms = ms(t2);
                    out.reason = Reason::Used;
                    out.index_of = Some(chain[k].1.id.clone());
                    out.deltas = k;
                    let reader = SnapshotReader {
                        info: top.info(),
                        regions: top.regions.iter().map(|r| r.meta.clone()).collect(),
                        pages,
                        packs,
                    };
                    return Ok((reader, out));
                }
                Err(r) => out.rejected.push(r),
            }
        }
        out.index_ms = ms(t1);
        if let Some(r) = out.rejected.first() {
            out.reason = r.reason;
        }
        let t2 = Instant::now();
        let named = self.named_packs(&chain);
        // the chain's maps and its packs' indexes are read at once, on two
        // cores: at millions of pages each takes about as long
        let (folded, indexes) = std::thread::scope(|s| {
            let indexes = s.spawn(|| {
                named
                    .iter()
                    .map(|&p| Ok((p, self.pack_entries(p)?)))
                    .collect::<Result<Vec<_>, StoreError>>()
            });
            let folded = self.fold(&chain);
            let indexes = indexes
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (folded, indexes)
        });
        let (top_path, top) = &chain[0];
        let mut pages: Vec<Vec<Slot>> = folded?
            .into_iter()
            .map(|region| {
                region
                    .into_iter()
                    .map(|(page, hash)| Slot::unlocated(page, hash))
                    .collect()
            })
            .collect();
        let mut packs = Vec::new();
        let indexes = indexes?;
        out.packs_read = indexes.len() as u32;
        out.packs_read += self.locate_missing(
            &mut pages,
            &mut packs,
            Vec::new(),
            indexes,
            Vec::new(),
            top_path,
        )?;
        out.fold_ms = ms(t2);
        let reader = SnapshotReader {
            info: top.info(),
            regions: top.regions.iter().map(|r| r.meta.clone()).collect(),
            pages,
            packs,
        };
        Ok((reader, out))
    }

    /// `snapshots/<id>.loc`.
    pub fn location_index_path(&self, id: &SnapshotId) -> PathBuf {
        self.sub(SNAPSHOTS)
            .join(format!("{id}{}", location_index::SUFFIX))
    }

    /// A snapshot's location index as the start of a fold: its pages (by
    /// region, with the manifest's region metas), its packs opened, and
    /// their ids in the store.  Ok(None): it has none.  Refused if it does
    /// not fit the manifest (its checksum, its regions) or the packs (each
    /// present, of the size it says).
    #[allow(clippy::type_complexity)]
    fn index_base(
        &self,
        (mpath, m): &(PathBuf, Manifest),
    ) -> Result<
        Option<(
            Vec<(RegionMeta, Vec<Slot>)>,
            Vec<(PathBuf, Arc<File>)>,
            Vec<u32>,
        )>,
        Rejected,
    > {
        let path = self.location_index_path(&m.id);
        let slot = |e: LocEntry| Slot {
            page: e.page,
            pack: e.pack,
            entry: IndexEntry {
                hash: e.hash,
                offset: e.offset,
                len: e.len as u32,
                flags: e.flags as u32,
            },
        };
        let Some(idx) = location_index::read(&path, slot)? else {
            return Ok(None);
        };
        let rej = |reason, detail: String| Rejected::new(reason, &path, detail);
        let mbytes = std::fs::read(mpath).map_err(|e| rej(Reason::Unreadable, e.to_string()))?;
        if blake3::hash(&mbytes).as_bytes() != &idx.manifest_sum {
            return Err(rej(
                Reason::Stale,
                "written for another version of the manifest".into(),
            ));
        }
        if idx.regions.len() != m.regions.len() {
            return Err(rej(
                Reason::Corrupt,
                "region count differs from the manifest's".into(),
            ));
        }
        let mut packs = Vec::with_capacity(idx.packs.len());
        let mut ids = Vec::with_capacity(idx.packs.len());
        for (name, size) in &idx.packs {
            let gone = || rej(Reason::PackChanged, format!("pack {name} missing"));
            let &p = self.by_name.get(name).ok_or_else(gone)?;
            let (ppath, file) = self.pack_file(p).map_err(|_| gone())?;
            let now = file.metadata().map(|md| md.len()).unwrap_or(u64::MAX);
            if now != *size {
                return Err(rej(
                    Reason::PackChanged,
                    format!("pack {name} is {now} bytes, not {size}"),
                ));
            }
            packs.push((ppath.to_path_buf(), file.clone()));
            ids.push(p);
        }
        let mut state = Vec::with_capacity(idx.regions.len());
        for (r, slots) in m.regions.iter().zip(idx.regions) {
            let pages = r.meta.page_count();
            if slots.last().is_some_and(|s| s.page >= pages) {
                return Err(rej(
                    Reason::Corrupt,
                    format!("a page beyond region {:?}", r.meta.name),
                ));
            }
            state.push((r.meta.clone(), slots));
        }
        Ok(Some((state, packs, ids)))
    }

    /// `verify`'s check of a snapshot's location index: it must load and
    /// fit (as a restore checks it), list exactly the pages of the folded
    /// chain with their hashes, and point each at that chunk's entry in
    /// its pack.  Ok(false): the snapshot has no index.
    pub(crate) fn check_location_index(&self, id: &SnapshotId) -> Result<bool, StoreError> {
        let chain = self.chain(id)?;
        let path = self.location_index_path(id);
        let (state, packs, _) = match self.index_base(&chain[0]) {
            Ok(None) => return Ok(false),
            Ok(Some(b)) => b,
            Err(r) => return Err(r.to_store_error()),
        };
        let bad = |detail: String| StoreError::IndexCorrupt {
            path: path.clone(),
            detail: format!("index_corrupt: {detail}"),
        };
        let folded = self.fold(&chain)?;
        let mut entries: Vec<Option<Vec<IndexEntry>>> = vec![None; packs.len()];
        for (r, ((_, slots), want)) in state.iter().zip(&folded).enumerate() {
            if slots.len() != want.len() {
                return Err(bad(format!(
                    "region {r}: {} pages, the snapshot has {}",
                    slots.len(),
                    want.len()
                )));
            }
            for (s, (page, hash)) in slots.iter().zip(want) {
                if s.page != *page || s.entry.hash != *hash {
                    return Err(bad(format!("region {r} page {page}: another chunk")));
                }
                let k = s.pack as usize;
                if entries[k].is_none() {
                    entries[k] = Some(super::pack::load(&packs[k].0)?.entries);
                }
                let list = entries[k].as_deref().unwrap_or_default();
                let ok = list
                    .binary_search_by(|e| e.hash.cmp(hash))
                    .is_ok_and(|i| list[i] == s.entry);
                if !ok {
                    return Err(bad(format!(
                        "region {r} page {page}: not where its pack has that chunk"
                    )));
                }
            }
        }
        Ok(true)
    }

    /// Writes the location index of `reader`'s snapshot (what its open
    /// found), replacing any; returns its path and size.
    pub fn write_location_index(
        &self,
        reader: &SnapshotReader,
    ) -> Result<(PathBuf, u64), StoreError> {
        let id = &reader.info.id;
        let mpath = self.manifest_path(id);
        let mbytes = std::fs::read(&mpath).map_err(io_at("read", &mpath))?;
        let sum = *blake3::hash(&mbytes).as_bytes();
        let mut packs = Vec::with_capacity(reader.packs.len());
        for (p, f) in &reader.packs {
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            let size = f.metadata().map_err(io_at("stat", p))?.len();
            packs.push((name, size));
        }
        let regions: Vec<Vec<LocEntry>> = reader
            .pages
            .iter()
            .map(|v| {
                v.iter()
                    .map(|s| LocEntry {
                        page: s.page,
                        hash: s.entry.hash,
                        offset: s.entry.offset,
                        pack: s.pack,
                        len: s.entry.len as u16,
                        flags: s.entry.flags as u16,
                    })
                    .collect()
            })
            .collect();
        let bytes = location_index::encode(&sum, &packs, &regions);
        let path = self.location_index_path(id);
        location_index::publish(&path, &bytes)?;
        Ok((path, bytes.len() as u64))
    }

    /// A fold (as `fold`) of `deltas` (newest first) onto `state`, keeping
    /// the located slots it inherits; the pages the deltas put are
    /// unlocated.
    fn fold_slots(
        &self,
        state: Vec<(RegionMeta, Vec<Slot>)>,
        deltas: &[(PathBuf, Manifest)],
        folded_entries: &mut u64,
    ) -> Result<Vec<Vec<Slot>>, StoreError> {
        self.fold_onto(state, deltas, merge_slots, folded_entries)
    }

    /// The packs the chain's manifests name, each once, newest first.
    fn named_packs(&self, chain: &[(PathBuf, Manifest)]) -> Vec<u32> {
        let mut order: Vec<u32> = Vec::new();
        for (_, m) in chain {
            for name in &m.packs {
                if let Some(&p) = self.by_name.get(name)
                    && !order.contains(&p)
                {
                    order.push(p);
                }
            }
        }
        order
    }

    /// Finds the chunk of every unlocated slot.  `packs` are the reader's
    /// packs so far (store ids `ids`).  The hashes needed, sorted, are
    /// looked up first among the located slots, then merged with each
    /// pack's index (sorted by hash on disk): `preloaded`, then `order`,
    /// then the store's other packs, each read only while a chunk is still
    /// missing.  No table of every chunk in the store is built.
    fn locate_missing(
        &self,
        pages: &mut [Vec<Slot>],
        packs: &mut Vec<(PathBuf, Arc<File>)>,
        mut ids: Vec<u32>,
        preloaded: Vec<(u32, Vec<IndexEntry>)>,
        order: Vec<u32>,
        top_path: &Path,
    ) -> Result<u32, StoreError> {
        let mut need: Vec<Needed> = Vec::new();
        for (r, region) in pages.iter().enumerate() {
            for (i, s) in region.iter().enumerate() {
                if s.pack == u32::MAX {
                    need.push(Needed {
                        key: u64::from_be_bytes(prefix(&s.entry.hash)),
                        hash: s.entry.hash,
                        region: r as u32,
                        index: i as u32,
                    });
                }
            }
        }
        if need.is_empty() {
            return Ok(0);
        }
        if !packs.is_empty() {
            // a page the deltas put may hold a chunk another page has
            let want: super::fasthash::FastMap<Hash, Option<(u32, IndexEntry)>> =
                need.iter().map(|n| (n.hash, None)).collect();
            let mut want = want;
            for region in pages.iter() {
                for s in region.iter().filter(|s| s.pack != u32::MAX) {
                    if let Some(w) = want.get_mut(&s.entry.hash) {
                        *w = Some((s.pack, s.entry));
                    }
                }
            }
            need.retain(|n| match want.get(&n.hash).copied().flatten() {
                Some((pack, entry)) => {
                    let slot = &mut pages[n.region as usize][n.index as usize];
                    slot.pack = pack;
                    slot.entry = entry;
                    false
                }
                None => true,
            });
        }
        // the first 8 bytes, big-endian, order as the hash does
        need.sort_unstable_by(|a, b| a.key.cmp(&b.key).then_with(|| a.hash.cmp(&b.hash)));
        let mut lazy: Vec<u32> = preloaded.iter().map(|(p, _)| *p).collect();
        let first = lazy.len();
        for p in order.into_iter().chain(0..self.packs.len() as u32) {
            if !lazy.contains(&p) {
                lazy.push(p);
            }
        }
        let lazy = lazy.split_off(first);
        let read = std::cell::Cell::new(0u32);
        let mut sources = preloaded
            .into_iter()
            .map(Ok)
            .chain(lazy.into_iter().map(|p| {
                read.set(read.get() + 1);
                self.pack_entries(p).map(|e| (p, e))
            }));
        while !need.is_empty() {
            let Some(source) = sources.next() else {
                return Err(StoreError::MissingChunk {
                    path: top_path.to_path_buf(),
                    hash: hex(&need[0].hash),
                });
            };
            let (p, entries) = source?;
            let local = match ids.iter().position(|&q| q == p) {
                Some(l) => l as u32,
                None => packs.len() as u32,
            };
            let (mut j, mut used) = (0, false);
            // one pass over both sorted lists; what is found leaves `need`
            need.retain(|n| {
                while j < entries.len() && entries[j].hash < n.hash {
                    j += 1;
                }
                if j < entries.len() && entries[j].hash == n.hash {
                    let slot = &mut pages[n.region as usize][n.index as usize];
                    slot.pack = local;
                    slot.entry = entries[j];
                    used = true;
                    return false;
                }
                true
            });
            if used && local as usize == packs.len() {
                let (path, file) = self.pack_file(p)?;
                packs.push((path.to_path_buf(), file.clone()));
                ids.push(p);
            }
        }
        drop(sources);
        Ok(read.get())
    }

    /// A pack's index entries, sorted by hash, read from the pack (checked
    /// as `open` checks it).
    fn pack_entries(&self, pack: u32) -> Result<Vec<IndexEntry>, StoreError> {
        let (path, _) = self.pack_file(pack)?;
        Ok(super::pack::load(path)?.entries)
    }
}

/// A page whose chunk is still to be found, sorted by `key` then `hash`.
struct Needed {
    key: u64,
    hash: Hash,
    region: u32,
    index: u32,
}

fn prefix(h: &Hash) -> [u8; 8] {
    let mut p = [0u8; 8];
    p.copy_from_slice(&h[..8]);
    p
}

/// A delta's entries for one region (sorted by page) applied to what the
/// region inherits (sorted by page): a page of the delta replaces the
/// inherited one, a zero entry removes it.
/// A region's (page, hash) list, sorted by page, with a delta's entries
/// (sorted by page; a zero entry removes the page) merged in.
pub(crate) fn merge_pages(base: Vec<(u64, Hash)>, delta: &[MapEntry]) -> Vec<(u64, Hash)> {
    if delta.is_empty() {
        return base;
    }
    let mut out = Vec::with_capacity(base.len() + delta.len());
    let mut b = base.into_iter().peekable();
    for e in delta {
        while let Some(&(page, h)) = b.peek() {
            if page >= e.page {
                break;
            }
            out.push((page, h));
            b.next();
        }
        if b.peek().is_some_and(|&(page, _)| page == e.page) {
            b.next();
        }
        if let Some(h) = e.hash {
            out.push((e.page, h));
        }
    }
    out.extend(b);
    out
}

/// As `merge_pages`, on slots: a page the delta puts is unlocated.  A
/// small delta is applied in place (a binary search per entry) rather than
/// by copying the region's slots.
fn merge_slots(mut base: Vec<Slot>, delta: &[MapEntry]) -> Vec<Slot> {
    if delta.is_empty() {
        return base;
    }
    if delta.len() * 64 < base.len() {
        for e in delta {
            match (base.binary_search_by_key(&e.page, |s| s.page), e.hash) {
                (Ok(i), Some(h)) => base[i] = Slot::unlocated(e.page, h),
                (Ok(i), None) => {
                    base.remove(i);
                }
                (Err(i), Some(h)) => base.insert(i, Slot::unlocated(e.page, h)),
                (Err(_), None) => {}
            }
        }
        return base;
    }
    let mut out = Vec::with_capacity(base.len() + delta.len());
    let mut b = base.into_iter().peekable();
    for e in delta {
        while let Some(s) = b.peek() {
            if s.page >= e.page {
                break;
            }
            out.extend(b.next());
        }
        if b.peek().is_some_and(|s| s.page == e.page) {
            b.next();
        }
        if let Some(h) = e.hash {
            out.push(Slot::unlocated(e.page, h));
        }
    }
    out.extend(b);
    out
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// How `open_snapshot_traced` found the pages' chunks.
#[derive(Debug, Clone)]
pub struct IndexOutcome {
    /// `Used`; or why no index was (the newest one refused, else
    /// `Missing`).
    pub reason: Reason,
    /// The snapshot whose index was used (this one or an ancestor).
    pub index_of: Option<SnapshotId>,
    /// Deltas folded onto that index.
    pub deltas: usize,
    /// Indexes of the chain that were refused, newest first.
    pub rejected: Vec<Rejected>,
    /// Reading the chain's manifests; finding and checking an index;
    /// folding (and locating) the rest.
    pub chain_ms: f64,
    pub index_ms: f64,
    pub fold_ms: f64,
    /// Map entries of the deltas folded after the index (0 when the
    /// whole chain was folded), and the pack indexes read to locate
    /// chunks.
    pub delta_entries: u64,
    pub packs_read: u32,
}

impl IndexOutcome {
    /// "index_used", or the reason code of the fallback.
    pub fn code(&self) -> &'static str {
        self.reason.code()
    }

    /// What to say of a fallback (None when an index was used and none refused).
    pub fn detail(&self) -> Option<String> {
        match (self.reason, self.rejected.first()) {
            (_, Some(r)) => Some(format!(
                "{}: {}: {}",
                r.reason.code(),
                r.path.display(),
                r.detail
            )),
            (Reason::Missing, None) => {
                Some("index_missing: no snapshot of the chain has a location index".into())
            }
            _ => None,
        }
    }
}

impl SnapshotReader {
    pub fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    pub fn regions(&self) -> &[RegionMeta] {
        &self.regions
    }

    /// The index of the region named `name`.
    pub fn region_index(&self, name: &str) -> Option<u32> {
        self.regions
            .iter()
            .position(|m| m.name == name)
            .map(|i| i as u32)
    }

    /// One page of the region named `name` into `out`, as `read_page`;
    /// zeros if the snapshot has no such region (the page of a region that
    /// came after it).
    pub fn read_page_named(&self, name: &str, page: u64, out: &mut [u8]) -> Result<(), StoreError> {
        match self.region_index(name) {
            Some(i) => self.read_page(i, page, out),
            None => {
                out.fill(0);
                Ok(())
            }
        }
    }

    /// The non-zero pages of a region, ascending (none for a bad index).
    pub fn pages(&self, region: u32) -> impl Iterator<Item = u64> + '_ {
        self.pages
            .get(region as usize)
            .into_iter()
            .flat_map(|v| v.iter().map(|s| s.page))
    }

    /// The non-zero pages of a region with their chunks' hashes, ascending
    /// (none for a bad index): what a later snapshot compares pages with
    /// (snapshot/baseline.rs).
    pub fn page_hashes(&self, region: u32) -> Vec<(u64, Hash)> {
        self.pages.get(region as usize).map_or_else(Vec::new, |v| {
            v.iter().map(|s| (s.page, s.entry.hash)).collect()
        })
    }

    /// Count of non-zero pages in a region.
    pub fn page_count(&self, region: u32) -> usize {
        self.pages.get(region as usize).map_or(0, |v| v.len())
    }

    fn slot(&self, region: u32, page: u64) -> Result<Option<&Slot>, StoreError> {
        let r = self
            .regions
            .get(region as usize)
            .ok_or_else(|| self.bad(format!("region {region} out of range")))?;
        if page >= r.page_count() {
            return Err(self.bad(format!("page {page} beyond region {:?}", r.name)));
        }
        let v = &self.pages[region as usize];
        Ok(v.binary_search_by_key(&page, |s| s.page)
            .ok()
            .map(|i| &v[i]))
    }

    fn bad(&self, detail: String) -> StoreError {
        StoreError::InvalidArgument {
            path: PathBuf::from(self.info.id.as_str()),
            detail,
        }
    }

    /// The hash of a page (`None`: zero).  For computing deltas.
    pub fn page_hash(&self, region: u32, page: u64) -> Result<Option<Hash>, StoreError> {
        Ok(self.slot(region, page)?.map(|s| s.entry.hash))
    }

    /// One page into `out` (4096 bytes): zeros if absent; otherwise the
    /// chunk, checked against its hash.  Safe to call from many threads.
    pub fn read_page(&self, region: u32, page: u64, out: &mut [u8]) -> Result<(), StoreError> {
        if out.len() != PAGE {
            return Err(self.bad(format!("page buffer of {} bytes, not {PAGE}", out.len())));
        }
        let Some(slot) = self.slot(region, page)? else {
            out.fill(0);
            return Ok(());
        };
        let (path, file) = &self.packs[slot.pack as usize];
        read_chunk(file, path, &slot.entry, out)
    }

    /// Writes every present page of a region to `out_fd` at page * 4096.
    /// Absent pages are not written: `out_fd` must read as zeros there (a
    /// fresh memfd or file of the region's size).
    pub fn read_region_into(
        &self,
        region: u32,
        out_fd: BorrowedFd,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(), StoreError> {
        let slots = self
            .pages
            .get(region as usize)
            .ok_or_else(|| self.bad(format!("region {region} out of range")))?;
        let total = slots.len() as u64;
        let mut buf = vec![0u8; PAGE];
        let fd_path = Path::new("<restore fd>");
        let size = self.regions[region as usize].size;
        for (i, s) in slots.iter().enumerate() {
            let (path, file) = &self.packs[s.pack as usize];
            read_chunk(file, path, &s.entry, &mut buf)?;
            // the last page of a region whose size is not a page multiple
            let len = (size - s.page * PAGE as u64).min(PAGE as u64) as usize;
            super::fsio::pwrite_all(out_fd, &buf[..len], s.page * PAGE as u64)
                .map_err(|e| super::error::io_err("pwrite", fd_path, &e))?;
            if i.is_multiple_of(4096) || i + 1 == slots.len() {
                progress(Progress {
                    phase: Phase::Restore,
                    done: i as u64 + 1,
                    total,
                });
            }
        }
        Ok(())
    }
}

/// Reads one chunk with this thread's reusable buffers.
pub(crate) fn read_chunk(
    file: &File,
    path: &Path,
    e: &IndexEntry,
    out: &mut [u8],
) -> Result<(), StoreError> {
    CHUNKS.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = Some(ChunkReader::new()?);
        }
        match c.as_mut() {
            Some(r) => r.read(file, path, e, out),
            None => unreachable!("set above"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(page: u64, h: Option<u8>) -> MapEntry {
        MapEntry {
            region: 0,
            page,
            hash: h.map(|b| [b; 32]),
        }
    }

    #[test]
    fn slots_merge_as_pages_do_small_delta_or_large() {
        let base: Vec<(u64, Hash)> = (0..200u64)
            .filter(|p| p % 3 != 0)
            .map(|p| (p, [p as u8; 32]))
            .collect();
        let slots = |v: &[(u64, Hash)]| -> Vec<(u64, Hash)> { v.to_vec() };
        for delta in [
            vec![e(0, Some(1)), e(1, None), e(4, Some(9)), e(300, Some(3))],
            (0..150u64)
                .map(|p| e(p, if p % 2 == 0 { Some(7) } else { None }))
                .collect(),
        ] {
            let want = merge_pages(slots(&base), &delta);
            let got: Vec<(u64, Hash)> = merge_slots(
                base.iter().map(|&(p, h)| Slot::unlocated(p, h)).collect(),
                &delta,
            )
            .iter()
            .map(|s| (s.page, s.entry.hash))
            .collect();
            assert_eq!(got, want, "a delta of {} entries", delta.len());
        }
    }

    #[test]
    fn a_delta_replaces_removes_and_adds_pages() {
        let base = vec![
            (1, [1u8; 32]),
            (3, [3u8; 32]),
            (5, [5u8; 32]),
            (9, [9u8; 32]),
        ];
        let delta = [
            e(0, Some(10)),
            e(3, None),
            e(4, None),
            e(5, Some(15)),
            e(12, Some(12)),
        ];
        let got = merge_pages(base.clone(), &delta);
        let want = vec![
            (0, [10u8; 32]),
            (1, [1u8; 32]),
            (5, [15u8; 32]),
            (9, [9u8; 32]),
            (12, [12u8; 32]),
        ];
        assert_eq!(got, want);
        assert_eq!(merge_pages(base.clone(), &[]), base);
        assert_eq!(
            merge_pages(Vec::new(), &[e(2, None), e(7, Some(7))]),
            vec![(7, [7u8; 32])]
        );
    }
}
