//! The standby's hot image: memfds holding the newest snapshot the standby
//! has published, kept up to date one snapshot at a time as they arrive,
//! so that an elected standby hands them to its app at once (a warm start,
//! decision `restored`) instead of reading the whole state back from its
//! store.  The memfds are made and named exactly as `rekindle restore`
//! makes them (snapshot/restore.rs); the store stays the durable copy and
//! what the image is rebuilt from when it cannot follow (docs/failover.md,
//! "The hot image").

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::proto::FdKind;
use crate::snapshot::baseline::{BaseRegion, Baseline};
use crate::snapshot::memfd_view::seal_against_shrinking;
use crate::snapshot::restore::{self, RestoreError, Restored};
use crate::store::fsio::pwrite_all;
use crate::store::manifest::SnapshotKind;
use crate::store::map::MapEntry;
use crate::store::reader::merge_pages;
use crate::store::{Hash, PAGE, RegionMeta, SnapshotId, SnapshotInfo, Store, StoreError};

#[derive(Debug, Error)]
pub enum ImageError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error("hot image: {what} {name}: {err}")]
    Io {
        what: &'static str,
        name: String,
        err: std::io::Error,
    },
    #[error("snapshot {id} has no manifest region: the app could not start from it")]
    NoManifest { id: String },
}

impl ImageError {
    pub fn code(&self) -> &'static str {
        match self {
            ImageError::Store(e) => e.code(),
            ImageError::Restore(e) => e.code(),
            ImageError::Io { .. } => "io",
            ImageError::NoManifest { .. } => "snapshot_without_manifest",
        }
    }
}

/// Why an elected standby has no image to start from (the restore event
/// says it, then the store is read as before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// No snapshot was received while this node stood by.
    NothingReceived,
    /// Bringing the image to a snapshot failed; it is not used again until
    /// it is rebuilt (at the next snapshot received).
    Failed { code: &'static str, error: String },
}

impl Unusable {
    pub fn code(&self) -> &'static str {
        match self {
            Unusable::NothingReceived => "hot_image_empty",
            Unusable::Failed { code, .. } => code,
        }
    }
}

struct ImageRegion {
    meta: RegionMeta,
    kind: FdKind,
    /// The memfd's size: the region's `memfd_bytes`, or more where pages
    /// were written past it.
    size: u64,
    fd: OwnedFd,
    /// Its non-zero pages' hashes, ascending: the baseline the elected
    /// node's first snapshot is a delta against (snapshot/baseline.rs).
    pages: Vec<(u64, Hash)>,
}

/// How `advance` brought the image to a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// Its own pages written over the parent's image.
    Applied { pages: u64 },
    /// Read whole from the store: the image did not hold the parent.
    Rebuilt { pages: u64, took: Duration },
}

pub struct HotImage {
    /// One per region of the snapshot the image holds (None: a region not
    /// handed to the app), in the snapshot's order.
    regions: Vec<Option<ImageRegion>>,
    at: Option<SnapshotInfo>,
    unusable: Unusable,
    page: Vec<u8>,
}

impl Default for HotImage {
    fn default() -> Self {
        HotImage {
            regions: Vec::new(),
            at: None,
            unusable: Unusable::NothingReceived,
            page: vec![0u8; PAGE],
        }
    }
}

fn io(what: &'static str, name: &str) -> impl FnOnce(std::io::Error) -> ImageError {
    let name = name.to_string();
    move |err| ImageError::Io { what, name, err }
}

fn resize(fd: &OwnedFd, name: &str, size: u64) -> Result<(), ImageError> {
    // SAFETY: ftruncate on a memfd of ours.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } < 0 {
        return Err(io("resize", name)(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Zeroes one page of a memfd by freeing it (a hole reads as zeros).
fn punch(fd: &OwnedFd, name: &str, offset: u64, len: u64) -> Result<(), ImageError> {
    // SAFETY: fallocate on a memfd of ours; KEEP_SIZE leaves its size.
    let r = unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r < 0 {
        return Err(io("zero a page of", name)(std::io::Error::last_os_error()));
    }
    Ok(())
}

impl HotImage {
    /// The snapshot the image holds, if it is usable.
    pub fn at(&self) -> Option<&SnapshotId> {
        self.at.as_ref().map(|i| &i.id)
    }

    /// Brings the image to `id`, which `store` has just published: its own
    /// changes are written over the image when the image holds its parent
    /// (or it is a full snapshot); otherwise the image is read whole from
    /// the store.  On an error the image is unusable until the next call
    /// rebuilds it.
    pub fn advance(&mut self, store: &Store, id: &SnapshotId) -> Result<Advance, ImageError> {
        let r = self.advance_inner(store, id);
        if let Err(e) = &r {
            self.regions.clear();
            self.at = None;
            self.unusable = Unusable::Failed {
                code: e.code(),
                error: e.to_string(),
            };
        }
        r
    }

    fn advance_inner(&mut self, store: &Store, id: &SnapshotId) -> Result<Advance, ImageError> {
        let (m, entries) = store.own_changes(id)?;
        let follows =
            m.kind == SnapshotKind::Full || (m.parent.is_some() && m.parent.as_ref() == self.at());
        if !follows {
            return self.rebuild(store, id);
        }
        self.at = None; // half-written from here until the end
        let full = m.kind == SnapshotKind::Full;
        let mut old = std::mem::take(&mut self.regions);
        let mut next = Vec::with_capacity(m.regions.len());
        let mut has_manifest = false;
        for r in &m.regions {
            let Some((kind, size)) = restore::region_fd(m.id.as_str(), &r.meta)? else {
                next.push(None);
                continue;
            };
            has_manifest |= kind == FdKind::Manifest;
            let reuse = if r.whole || full {
                None
            } else {
                old.iter()
                    .position(|o| o.as_ref().is_some_and(|o| o.meta.same_shape(&r.meta)))
            };
            let reg = match reuse.and_then(|k| old[k].take()) {
                Some(mut reg) => {
                    // grows only: a restore starts from the recorded size
                    // and writes every page the chain holds, beyond it too
                    if size > reg.size {
                        resize(&reg.fd, &r.meta.name, size)?;
                        reg.size = size;
                    }
                    reg.kind = kind;
                    reg.meta = r.meta.clone();
                    reg
                }
                None => ImageRegion {
                    meta: r.meta.clone(),
                    kind,
                    size,
                    fd: restore::memfd(&r.meta.name, size)?,
                    pages: Vec::new(),
                },
            };
            next.push(Some(reg));
        }
        if !has_manifest {
            return Err(ImageError::NoManifest {
                id: m.id.as_str().to_string(),
            });
        }
        let mut pages = 0u64;
        for e in &entries {
            let Some(Some(reg)) = next.get_mut(e.region as usize) else {
                continue;
            };
            // as a restore writes them (reader.rs, read_region_into): every
            // page of the mapping, past the memfd's recorded size too (it
            // is recorded before the cut, and a growing arena may have
            // written beyond it), the memfd growing with them
            let offset = e.page * PAGE as u64;
            let n = (reg.meta.size - offset).min(PAGE as u64);
            match &e.hash {
                None if offset < reg.size => punch(&reg.fd, &reg.meta.name, offset, n)?,
                None => {}
                Some(h) => {
                    store.read_chunk_by_hash(h, &mut self.page)?;
                    pwrite_all(reg.fd.as_fd(), &self.page[..n as usize], offset)
                        .map_err(io("write", &reg.meta.name))?;
                    reg.size = reg.size.max(offset + n);
                }
            }
            pages += 1;
        }
        // the map is sorted by (region, page): one merge per region
        let mut rest = &entries[..];
        for (i, reg) in next.iter_mut().enumerate() {
            let n = rest.partition_point(|e| e.region as usize == i);
            let (own, after): (&[MapEntry], _) = rest.split_at(n);
            rest = after;
            if let Some(reg) = reg {
                reg.pages = merge_pages(std::mem::take(&mut reg.pages), own);
            }
        }
        self.regions = next;
        self.at = Some(m.info());
        Ok(Advance::Applied { pages })
    }

    fn rebuild(&mut self, store: &Store, id: &SnapshotId) -> Result<Advance, ImageError> {
        let t0 = Instant::now();
        self.regions.clear();
        self.at = None;
        let reader = store.open_snapshot(id)?;
        let info = reader.info().clone();
        let mut regions = Vec::with_capacity(reader.regions().len());
        let mut pages = 0u64;
        let mut has_manifest = false;
        for (i, r) in reader.regions().iter().enumerate() {
            let Some((kind, size)) = restore::region_fd(info.id.as_str(), r)? else {
                regions.push(None);
                continue;
            };
            has_manifest |= kind == FdKind::Manifest;
            let fd = restore::memfd(&r.name, size)?;
            reader.read_region_into(i as u32, fd.as_fd(), &mut |_| {})?;
            pages += reader.page_count(i as u32) as u64;
            let size = std::fs::File::from(fd.try_clone().map_err(io("dup", &r.name))?)
                .metadata()
                .map_err(io("stat", &r.name))?
                .len();
            regions.push(Some(ImageRegion {
                meta: r.clone(),
                kind,
                size,
                fd,
                pages: reader.page_hashes(i as u32),
            }));
        }
        if !has_manifest {
            return Err(ImageError::NoManifest {
                id: info.id.as_str().to_string(),
            });
        }
        self.regions = regions;
        self.at = Some(info);
        Ok(Advance::Rebuilt {
            pages,
            took: t0.elapsed(),
        })
    }

    /// The store no longer ends at the image's snapshot (a rejoin dropped
    /// snapshots after an older base, or a full resync began): the image is
    /// not handed over until the next snapshot rebuilds it.
    pub fn invalidate(&mut self, code: &'static str, error: String) {
        self.regions.clear();
        self.at = None;
        self.unusable = Unusable::Failed { code, error };
    }

    /// Hands the memfds over for the app's first incarnation (they are no
    /// longer written here); Err says why there is nothing to hand over.
    /// `store_dir`: the store the image follows (the baseline's).
    pub fn take(&mut self, store_dir: &std::path::Path) -> Result<Restored, Unusable> {
        let t0 = Instant::now();
        let Some(info) = self.at.take() else {
            return Err(self.unusable.clone());
        };
        let mut bytes = 0u64;
        let mut base = Vec::new();
        let fds = std::mem::take(&mut self.regions)
            .into_iter()
            .flatten()
            .map(|r| {
                // no longer resized here: sealed as a restore's memfds
                // are.  A memfd the seal fails on is read with pread, and
                // the engine says so (snapshot_view).
                let _ = seal_against_shrinking(r.fd.as_fd());
                bytes += r.size;
                base.push(BaseRegion {
                    meta: r.meta.clone(),
                    pages: r.pages,
                });
                (r.kind, r.meta.name, r.fd)
            })
            .collect();
        self.unusable = Unusable::NothingReceived;
        let baseline = Baseline {
            dir: store_dir.to_path_buf(),
            id: info.id.clone(),
            regions: base,
        };
        Ok(Restored {
            info,
            fds,
            bytes,
            lazy: None,
            took: t0.elapsed(),
            baseline: Some(baseline),
            index: None,
            // a standby's store is written by its receiver, never journaled
            journal: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NewSnapshot, RegionKind};

    /// The memfds handed to the app are sealed against shrinking, as a
    /// restore's are: the engine then copies its cuts through views.
    #[test]
    fn the_memfds_handed_over_cannot_shrink() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = tmp.path().join("store");
        let mut store = Store::create_or_open(&dir).unwrap_or_else(|e| panic!("{e}"));
        let mut w = store
            .begin(NewSnapshot::full_for_test(vec![
                RegionMeta {
                    kind: RegionKind::Arena,
                    name: "a".into(),
                    addr: 0x4000_0000,
                    size: 16 * PAGE as u64,
                    layout: serde_json::json!({"memfd_bytes": 8 * PAGE as u64}),
                },
                RegionMeta {
                    kind: RegionKind::Static,
                    name: crate::snapshot::cut::MANIFEST_REGION.into(),
                    addr: 0,
                    size: PAGE as u64,
                    layout: serde_json::json!({}),
                },
            ]))
            .unwrap_or_else(|e| panic!("{e}"));
        w.put_page(0, 3, &[7u8; PAGE])
            .unwrap_or_else(|e| panic!("{e}"));
        w.put_bytes(1, b"manifest")
            .unwrap_or_else(|e| panic!("{e}"));
        let id = w.commit().unwrap_or_else(|e| panic!("{e}")).id;
        let mut image = HotImage::default();
        image.advance(&store, &id).unwrap_or_else(|e| panic!("{e}"));
        let r = image.take(&dir).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(!r.fds.is_empty());
        for (_, name, fd) in &r.fds {
            // SAFETY: fcntl on our fd.
            let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
            assert!(
                seals >= 0 && seals & libc::F_SEAL_SHRINK != 0,
                "{name}: seals {seals}"
            );
        }
    }
}
