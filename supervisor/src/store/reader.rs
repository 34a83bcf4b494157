//! `SnapshotReader`: a snapshot's chain folded into one page table
//! (region, page) -> chunk, checked on open (manifests, maps, packs present)
//! and per page on read (decompressed length and blake3).

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{StoreError, io_at};
use super::format::{Hash, PAGE, SNAPSHOTS, SnapshotId, hex};
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
        let mut state: Vec<(RegionMeta, Vec<(u64, Hash)>)> = Vec::new();
        for (_, m) in chain.iter().rev() {
            self.check_packs(m)?;
            let entries = self.load_map(m)?;
            let mut rest = &entries[..];
            let mut next: Vec<(RegionMeta, Vec<(u64, Hash)>)> = Vec::with_capacity(m.regions.len());
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
                next.push((r.meta.clone(), merge_pages(base, delta)));
            }
            state = next;
        }
        Ok(state.into_iter().map(|(_, p)| p).collect())
    }

    /// Opens a snapshot for reading: folds its chain and checks every
    /// manifest, map and pack it needs (chunks are checked as they are read).
    pub fn open_snapshot(&self, id: &SnapshotId) -> Result<SnapshotReader, StoreError> {
        let chain = self.chain(id)?;
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
        let (pages, packs) = self.locate(folded?, indexes?, top_path)?;
        Ok(SnapshotReader {
            info: top.info(),
            regions: top.regions.iter().map(|r| r.meta.clone()).collect(),
            pages,
            packs,
        })
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

    /// Where each page's chunk is.  The hashes needed, sorted, are merged
    /// with each pack's index (sorted by hash on disk): first the packs the
    /// chain's manifests name (`indexes`), then, if a chunk is still
    /// missing, the store's other packs.  No table of every chunk in the
    /// store is built.
    #[allow(clippy::type_complexity)]
    fn locate(
        &self,
        folded: Vec<Vec<(u64, Hash)>>,
        indexes: Vec<(u32, Vec<IndexEntry>)>,
        top_path: &Path,
    ) -> Result<(Vec<Vec<Slot>>, Vec<(PathBuf, Arc<File>)>), StoreError> {
        let mut need: Vec<Needed> = Vec::new();
        let mut pages: Vec<Vec<Slot>> = Vec::with_capacity(folded.len());
        for (r, region) in folded.into_iter().enumerate() {
            let mut slots = Vec::with_capacity(region.len());
            for (i, (page, hash)) in region.into_iter().enumerate() {
                need.push(Needed {
                    key: u64::from_be_bytes(prefix(&hash)),
                    hash,
                    region: r as u32,
                    index: i as u32,
                });
                slots.push(Slot {
                    page,
                    pack: u32::MAX,
                    entry: IndexEntry {
                        hash,
                        offset: 0,
                        len: 0,
                        flags: 0,
                    },
                });
            }
            pages.push(slots);
        }
        // the first 8 bytes, big-endian, order as the hash does
        need.sort_unstable_by(|a, b| a.key.cmp(&b.key).then_with(|| a.hash.cmp(&b.hash)));
        let named: Vec<u32> = indexes.iter().map(|(p, _)| *p).collect();
        let others = (0..self.packs.len() as u32).filter(|p| !named.contains(p));
        let mut sources = indexes
            .into_iter()
            .map(|(p, e)| Ok((p, e)))
            .chain(others.map(|p| self.pack_entries(p).map(|e| (p, e))));
        let mut packs: Vec<(PathBuf, Arc<File>)> = Vec::new();
        while !need.is_empty() {
            let Some(source) = sources.next() else {
                return Err(StoreError::MissingChunk {
                    path: top_path.to_path_buf(),
                    hash: hex(&need[0].hash),
                });
            };
            let (p, entries) = source?;
            let local = packs.len() as u32;
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
            if used {
                let (path, file) = self.pack_file(p)?;
                packs.push((path.to_path_buf(), file.clone()));
            }
        }
        Ok((pages, packs))
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

impl SnapshotReader {
    pub fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    pub fn regions(&self) -> &[RegionMeta] {
        &self.regions
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
