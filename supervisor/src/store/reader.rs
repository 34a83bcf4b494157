//! `SnapshotReader`: a snapshot's chain folded into one page table
//! (region, page) -> chunk, checked on open (manifests, maps, packs present)
//! and per page on read (decompressed length and blake3).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{StoreError, io_at};
use super::fasthash::FastMap;
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

    /// Folds a chain (newest first) into per-region page -> hash tables.
    pub(crate) fn fold(
        &self,
        chain: &[(PathBuf, Manifest)],
    ) -> Result<Vec<FastMap<u64, Hash>>, StoreError> {
        let mut state: Vec<(RegionMeta, FastMap<u64, Hash>)> = Vec::new();
        for (_, m) in chain.iter().rev() {
            self.check_packs(m)?;
            let entries = self.load_map(m)?;
            let mut next: Vec<(RegionMeta, FastMap<u64, Hash>)> =
                Vec::with_capacity(m.regions.len());
            for r in &m.regions {
                let inherited = if r.whole || m.kind == SnapshotKind::Full {
                    None
                } else {
                    state.iter().position(|(p, _)| p.same_shape(&r.meta))
                };
                let pages = match inherited {
                    Some(i) => std::mem::take(&mut state[i].1),
                    None => FastMap::default(),
                };
                next.push((r.meta.clone(), pages));
            }
            for e in entries {
                let pages = &mut next[e.region as usize].1;
                match e.hash {
                    Some(h) => pages.insert(e.page, h),
                    None => pages.remove(&e.page),
                };
            }
            state = next;
        }
        Ok(state.into_iter().map(|(_, p)| p).collect())
    }

    /// Opens a snapshot for reading: folds its chain and checks every
    /// manifest, map and pack it needs (chunks are checked as they are read).
    pub fn open_snapshot(&self, id: &SnapshotId) -> Result<SnapshotReader, StoreError> {
        let chain = self.chain(id)?;
        let folded = self.fold(&chain)?;
        let (top_path, top) = &chain[0];
        let mut packs: Vec<(PathBuf, Arc<File>)> = Vec::new();
        let mut local: HashMap<u32, u32> = HashMap::new();
        let mut pages = Vec::with_capacity(folded.len());
        for region in folded {
            let mut slots = Vec::with_capacity(region.len());
            for (page, hash) in region {
                let Some(loc) = self.index.get(&hash) else {
                    return Err(StoreError::MissingChunk {
                        path: top_path.clone(),
                        hash: hex(&hash),
                    });
                };
                let pack = match local.get(&loc.pack) {
                    Some(&i) => i,
                    None => {
                        let (path, file) = self.pack_file(loc.pack)?;
                        packs.push((path.to_path_buf(), file.clone()));
                        local.insert(loc.pack, packs.len() as u32 - 1);
                        packs.len() as u32 - 1
                    }
                };
                slots.push(Slot {
                    page,
                    pack,
                    entry: loc.entry(hash),
                });
            }
            slots.sort_unstable_by_key(|s| s.page);
            pages.push(slots);
        }
        Ok(SnapshotReader {
            info: top.info(),
            regions: top.regions.iter().map(|r| r.meta.clone()).collect(),
            pages,
            packs,
        })
    }
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
