//! The pages a fold rebuilds from delta records (docs/store.md, "Delta
//! records").  A delta applies to the page as the record before it left
//! it, or, for a page no record of the fold held yet, as the snapshot the
//! fold's first record follows has it (published: the journal is folded
//! in order).  The fold puts such a page whole, once, at its run's last
//! delta of it.
//!
//! What is kept of a page until then is what it was built from, not its
//! content: where its base is (the parent snapshot, zeros, or a record's
//! compressed chunk) and its deltas since, about 110 bytes each.  A page
//! whose deltas outgrow a page is rebuilt and kept as content.  A page is
//! forgotten after the fold's last delta of it.  So a fold of a full
//! journal file holds about what its records hold, not a page for every
//! page they changed.

use std::collections::BTreeSet;
use std::path::Path;

use super::Store;
use super::error::StoreError;
use super::fasthash::FastMap;
use super::format::{Hash, PAGE};
use super::journal::{PageData, Record, RecordPage, corrupt};
use super::manifest::RegionMeta;
use super::pack::{ChunkReader, IndexEntry};
use super::reader::SnapshotReader;

/// What a page is rebuilt from.
enum Base {
    /// The page as the fold's base snapshot has it.
    Parent,
    Zeros,
    /// A record's chunk, compressed as in the journal.
    Chunk {
        hash: Hash,
        flags: u32,
        bytes: Vec<u8>,
    },
}

enum Kept {
    /// `base`, then each delta in order (each after its length, u32 LE).
    Pending {
        base: Base,
        deltas: Vec<u8>,
    },
    Content(Box<[u8]>),
}

/// A page of the fold: (region, page), the region numbered by name
/// (indexes may differ between records of other shapes).
type Key = (u16, u64);

pub(super) struct KeptPages {
    names: Vec<String>,
    /// Every page some record holds as a delta: the index (in the fold)
    /// of the last such record.
    last_delta: FastMap<Key, usize>,
    pages: FastMap<Key, Kept>,
    /// Regions some record of the fold stored whole, or gave another shape
    /// (they inherit nothing then): their pages not kept yet are zeros,
    /// not the base's.
    restarted: BTreeSet<u16>,
    /// Each region's shape as the last record (or the base) had it.
    shapes: FastMap<u16, RegionMeta>,
    base: Option<SnapshotReader>,
    chunks: Option<ChunkReader>,
}

impl KeptPages {
    /// For the fold of `records`, in this order.
    pub(super) fn new(store: &Store, records: &[Record]) -> Result<KeptPages, StoreError> {
        let mut k = KeptPages {
            names: Vec::new(),
            last_delta: FastMap::default(),
            pages: FastMap::default(),
            restarted: BTreeSet::new(),
            shapes: FastMap::default(),
            base: None,
            chunks: None,
        };
        for (g, r) in records.iter().enumerate() {
            for &(reg, page) in &r.delta_pages {
                if let Some(m) = r.meta.regions.get(reg as usize) {
                    let id = k.intern(&m.meta.name);
                    k.last_delta.insert((id, page), g);
                }
            }
        }
        if k.last_delta.is_empty() {
            return Ok(k);
        }
        if let Some(p) = records.first().and_then(|r| r.meta.parent.as_ref()) {
            let base = store.open_snapshot(p)?;
            for m in base.regions() {
                let id = k.intern(&m.name);
                k.shapes.insert(id, m.clone());
            }
            k.base = Some(base);
        }
        Ok(k)
    }

    fn intern(&mut self, name: &str) -> u16 {
        match self.names.iter().position(|n| n == name) {
            Some(i) => i as u16,
            None => {
                self.names.push(name.to_string());
                (self.names.len() - 1) as u16
            }
        }
    }

    fn key(&self, r: &Record, region: u32, page: u64) -> Option<Key> {
        let name = &r.meta.regions.get(region as usize)?.meta.name;
        let id = self.names.iter().position(|n| n == name)?;
        Some((id as u16, page))
    }

    /// What record `g` of the fold (`r`, its `pages`) does to the kept
    /// pages.
    pub(super) fn follow(
        &mut self,
        dir: &Path,
        g: usize,
        r: &Record,
        pages: &[RecordPage],
    ) -> Result<(), StoreError> {
        if self.last_delta.is_empty() {
            return Ok(());
        }
        // the record's regions by number
        let mut ids = Vec::with_capacity(r.meta.regions.len());
        for reg in &r.meta.regions {
            let id = self.intern(&reg.meta.name);
            let reshaped = self
                .shapes
                .get(&id)
                .is_none_or(|m| !m.same_shape(&reg.meta));
            if reshaped {
                self.shapes.insert(id, reg.meta.clone());
            }
            if reg.whole || reshaped {
                // inherits nothing: what the record does not hold is zeros
                self.restarted.insert(id);
                for ((n, _), kept) in self.pages.iter_mut() {
                    if *n == id {
                        *kept = Kept::Pending {
                            base: Base::Zeros,
                            deltas: Vec::new(),
                        };
                    }
                }
            }
            ids.push(id);
        }
        for p in pages {
            let Some(&id) = ids.get(p.region as usize) else {
                return Err(corrupt(dir, "a page of a region the record does not have"));
            };
            let key = (id, p.page);
            // only what a delta of this record or a later one applies to
            if self.last_delta.get(&key).is_none_or(|&last| last < g) {
                continue;
            }
            let kept = match &p.data {
                PageData::Zero => Kept::Pending {
                    base: Base::Zeros,
                    deltas: Vec::new(),
                },
                PageData::Chunk(hash, flags, bytes) => Kept::Pending {
                    base: Base::Chunk {
                        hash: *hash,
                        flags: *flags,
                        bytes: bytes.clone(),
                    },
                    deltas: Vec::new(),
                },
                PageData::Delta(d) => {
                    let kept = self.pages.remove(&key).unwrap_or_else(|| Kept::Pending {
                        base: if self.restarted.contains(&id) {
                            Base::Zeros
                        } else {
                            Base::Parent
                        },
                        deltas: Vec::new(),
                    });
                    self.add_delta(dir, key, kept, d)?
                }
            };
            self.pages.insert(key, kept);
        }
        Ok(())
    }

    fn add_delta(
        &mut self,
        dir: &Path,
        key: Key,
        kept: Kept,
        d: &[u8],
    ) -> Result<Kept, StoreError> {
        match kept {
            Kept::Pending { base, mut deltas } => {
                deltas.extend_from_slice(&(d.len() as u32).to_le_bytes());
                deltas.extend_from_slice(d);
                if deltas.len() <= PAGE {
                    return Ok(Kept::Pending { base, deltas });
                }
                // outgrew a page: kept as content from here on
                Ok(Kept::Content(self.rebuild(dir, key, &base, &deltas)?))
            }
            Kept::Content(mut page) => {
                apply(dir, &mut page, d)?;
                Ok(Kept::Content(page))
            }
        }
    }

    fn rebuild(
        &mut self,
        dir: &Path,
        (id, page): Key,
        base: &Base,
        deltas: &[u8],
    ) -> Result<Box<[u8]>, StoreError> {
        let mut out = vec![0u8; PAGE].into_boxed_slice();
        match base {
            Base::Zeros => {}
            Base::Parent => {
                if let Some(b) = &self.base {
                    b.read_page_named(&self.names[id as usize], page, &mut out)?;
                }
            }
            Base::Chunk { hash, flags, bytes } => {
                let e = IndexEntry {
                    hash: *hash,
                    offset: 0,
                    len: bytes.len() as u32,
                    flags: *flags,
                };
                let c = match &mut self.chunks {
                    Some(c) => c,
                    None => self.chunks.insert(ChunkReader::new()?),
                };
                c.check_bytes(dir, &e, bytes, &mut out)?;
            }
        }
        let mut rest = deltas;
        while !rest.is_empty() {
            let (len, tail) = rest.split_at(4);
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            let (d, tail) = tail.split_at(len);
            apply(dir, &mut out, d)?;
            rest = tail;
        }
        Ok(out)
    }

    /// The page as record `g` (`r`) left it, for `put` (which puts it
    /// whole); forgotten after it if no later record holds it as a delta.
    pub(super) fn put_page(
        &mut self,
        dir: &Path,
        g: usize,
        r: &Record,
        region: u32,
        page: u64,
        put: impl FnOnce(&[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let not_kept = || corrupt(dir, "a delta's page was not kept");
        let key = self.key(r, region, page).ok_or_else(not_kept)?;
        let content = match self.pages.remove(&key).ok_or_else(not_kept)? {
            Kept::Content(c) => c,
            Kept::Pending { base, deltas } => self.rebuild(dir, key, &base, &deltas)?,
        };
        put(&content)?;
        if self.last_delta.get(&key).is_some_and(|&last| last > g) {
            self.pages.insert(key, Kept::Content(content));
        }
        Ok(())
    }

    /// Pages kept, and of them kept as content (for tests).
    #[cfg(test)]
    pub(super) fn held(&self) -> (usize, usize) {
        let content = self
            .pages
            .values()
            .filter(|k| matches!(k, Kept::Content(_)))
            .count();
        (self.pages.len(), content)
    }
}

fn apply(dir: &Path, page: &mut [u8], d: &[u8]) -> Result<(), StoreError> {
    super::delta::apply(page, d).map_err(|e| corrupt(dir, format!("a delta: {e}")))
}
