//! `rekindle restore`: new memfds filled from a durable snapshot, named as
//! the runtime names its own (`rekindle:NAME`, `rekindle:range:ADDR`,
//! `rekindle:manifest`), so that the supervisor hands them to the first
//! incarnation exactly as it hands over the memfds of a dead one; the
//! runtime then starts warm (decision `restored`, the snapshot's id in
//! `rk_restart_info.snapshot`).

use std::ffi::CString;
use std::io::IsTerminal;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::cut::MANIFEST_REGION;
use super::memfd_view::seal_against_shrinking;
use crate::proto::FdKind;
use crate::store::{self, Phase, Progress, SnapshotInfo, Store, StoreError};

/// `DIR[@ID|@TAG]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub dir: PathBuf,
    /// An id or a tag; "" for the newest.
    pub spec: String,
}

impl Source {
    pub fn parse(s: &str) -> Source {
        match s.rsplit_once('@') {
            Some((dir, spec)) if !dir.is_empty() && !spec.contains('/') => Source {
                dir: PathBuf::from(dir),
                spec: spec.to_string(),
            },
            _ => Source {
                dir: PathBuf::from(s),
                spec: String::new(),
            },
        }
    }
}

#[derive(Debug, Error)]
pub enum RestoreError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "snapshot {id} has no manifest region: it was not taken by `rekindle run --snapshot-dir`"
    )]
    NoManifest { id: String },
    #[error("snapshot {id}: region {name:?}: {what}")]
    Region {
        id: String,
        name: String,
        what: String,
    },
    #[error("cannot create a memfd for {name}: {err}")]
    Memfd { name: String, err: std::io::Error },
}

impl RestoreError {
    pub fn code(&self) -> &'static str {
        match self {
            RestoreError::Store(e) => e.code(),
            RestoreError::NoManifest { .. } => "snapshot_without_manifest",
            RestoreError::Region { .. } => "snapshot_region_invalid",
            RestoreError::Memfd { .. } => "memfd",
        }
    }
}

/// What a restore hands to the first incarnation.
pub struct Restored {
    pub info: SnapshotInfo,
    pub fds: Vec<(FdKind, String, OwnedFd)>,
    /// Bytes of page data in the snapshot's regions (read back, or to be).
    pub bytes: u64,
    /// `Pages::Lazy`: the arenas' memfds are empty; what fills them.
    pub lazy: Option<super::lazy::Source>,
    /// From the store's open to the memfds made.
    pub took: std::time::Duration,
    /// The pages' hashes, for the first snapshot after the start (a delta
    /// of this one); None where the memfds are not filled yet (lazy).
    pub baseline: Option<super::baseline::Baseline>,
    /// Whether the snapshot's pages were found through a location index,
    /// or why not (store/location_index.rs); None for a premade image.
    pub index: Option<store::reader::IndexOutcome>,
    /// What folding the store's journal before the restore did, if it held
    /// anything (records, a torn tail): for the `restore` event.
    pub journal: Option<serde_json::Value>,
}

/// How a restore reads the arenas back (`--restore-pages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pages {
    /// Every page before the app starts.
    Eager,
    /// The app starts at once; its arenas' pages come in on demand and in
    /// the background (docs/snapshots.md, "Lazy restore").
    Lazy,
}

/// What a snapshot's region becomes for the app: its fd kind and the
/// memfd's size; None for a region that is not handed over (a static other
/// than the manifest: the app's own statics come back through it).
pub(crate) fn region_fd(
    sid: &str,
    r: &store::RegionMeta,
) -> Result<Option<(FdKind, u64)>, RestoreError> {
    let bad = |what: &str| RestoreError::Region {
        id: sid.to_string(),
        name: r.name.clone(),
        what: what.to_string(),
    };
    match r.kind {
        store::RegionKind::Static if r.name == MANIFEST_REGION => {
            Ok(Some((FdKind::Manifest, r.size)))
        }
        store::RegionKind::Static => Ok(None),
        store::RegionKind::Arena | store::RegionKind::Range => {
            let file = r
                .layout
                .get("memfd_bytes")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(r.size);
            if file > r.size {
                return Err(bad("its memfd is larger than its mapping"));
            }
            if r.kind == store::RegionKind::Range && !r.name.starts_with("range:") {
                return Err(bad("a range's name must be range:ADDR"));
            }
            let kind = if r.kind == store::RegionKind::Arena {
                FdKind::Arena
            } else {
                FdKind::Range
            };
            Ok(Some((kind, file)))
        }
    }
}

/// A memfd named as the runtime names its own, of `size` bytes.
pub(crate) fn memfd(name: &str, size: u64) -> Result<OwnedFd, RestoreError> {
    let err = |e: std::io::Error| RestoreError::Memfd {
        name: name.to_string(),
        err: e,
    };
    let c = CString::new(format!("rekindle:{name}"))
        .map_err(|_| err(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    // SAFETY: a NUL-terminated name; the fd is fresh and ours.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: fresh and ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on our memfd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    Ok(fd)
}

/// Reads snapshot `src` into new memfds.  Progress goes to stderr when it
/// is a terminal.
pub fn materialize(src: &Source) -> Result<Restored, RestoreError> {
    materialize_with(src, Pages::Eager)
}

/// As `materialize`; with `Pages::Lazy` the arenas' memfds are left empty
/// (sized) and `Restored::lazy` holds the reader that fills them.
pub fn materialize_with(src: &Source, pages: Pages) -> Result<Restored, RestoreError> {
    let t0 = std::time::Instant::now();
    // acknowledged writes still in the journal are folded in first
    let journal = crate::store::fold::fold_journal_at(&src.dir)?.map(|r| r.to_json());
    let store = Store::open_unindexed(&src.dir)?;
    let id = store.resolve(&src.spec)?;
    let (reader, index) = store.open_snapshot_traced(&id)?;
    let info = reader.info().clone();
    let sid = info.id.as_str().to_string();
    let tty = std::io::stderr().is_terminal();
    let mut fds = Vec::new();
    let mut bytes = 0u64;
    let mut has_manifest = false;
    let mut lazy_arenas = Vec::new();
    for (i, r) in reader.regions().iter().enumerate() {
        let Some((kind, size)) = region_fd(&sid, r)? else {
            continue; // not ours to hand over
        };
        has_manifest |= kind == FdKind::Manifest;
        let fd = memfd(&r.name, size)?;
        // as the runtime seals what it makes.  (A hot image's memfds are
        // resized both ways while it follows: sealed when handed over.)
        seal_against_shrinking(fd.as_fd()).map_err(|err| RestoreError::Memfd {
            name: r.name.clone(),
            err,
        })?;
        let name = r.name.clone();
        bytes += reader.page_count(i as u32) as u64 * store::PAGE as u64;
        if pages == Pages::Lazy && kind == FdKind::Arena {
            let err = |err| RestoreError::Memfd {
                name: name.clone(),
                err,
            };
            // the header page now: the supervisor's own checks read it
            // through the memfd (lazy::Filled counts it in)
            let mut page = vec![0u8; store::PAGE];
            reader.read_page(i as u32, 0, &mut page)?;
            let n = (size as usize).min(store::PAGE);
            store::fsio::pwrite_all(fd.as_fd(), &page[..n], 0).map_err(err)?;
            let dup = fd.try_clone().map_err(err)?;
            lazy_arenas.push(super::lazy::LazyArena {
                name: name.clone(),
                region: i as u32,
                bytes: size,
                fd: dup,
            });
            fds.push((kind, name, fd));
            continue;
        }
        reader.read_region_into(i as u32, fd.as_fd(), &mut |p: Progress| {
            if tty && p.phase == Phase::Restore && p.total > 0 {
                eprint!("\rrekindle: restoring {name}: {}/{} pages", p.done, p.total);
                if p.done == p.total {
                    eprintln!();
                }
            }
        })?;
        fds.push((kind, r.name.clone(), fd));
    }
    if !has_manifest {
        return Err(RestoreError::NoManifest { id: sid });
    }
    let baseline = (pages == Pages::Eager).then(|| super::baseline::Baseline {
        dir: src.dir.clone(),
        id: info.id.clone(),
        regions: reader
            .regions()
            .iter()
            .enumerate()
            .map(|(i, r)| super::baseline::BaseRegion {
                meta: r.clone(),
                pages: reader.page_hashes(i as u32),
            })
            .collect(),
    });
    let lazy = (pages == Pages::Lazy).then(|| super::lazy::Source {
        reader,
        arenas: lazy_arenas,
    });
    Ok(Restored {
        info,
        fds,
        bytes,
        lazy,
        took: t0.elapsed(),
        baseline,
        index: Some(index),
        journal,
    })
}

/// For messages: "DIR@ID".
pub fn describe(dir: &Path, info: &SnapshotInfo) -> String {
    format!("{}@{}", dir.display(), info.id.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse() {
        assert_eq!(
            Source::parse("/var/lib/snaps@nightly"),
            Source {
                dir: "/var/lib/snaps".into(),
                spec: "nightly".into()
            }
        );
        assert_eq!(
            Source::parse("/var/lib/snaps"),
            Source {
                dir: "/var/lib/snaps".into(),
                spec: String::new()
            }
        );
        // an @ inside a directory name is part of the path
        assert_eq!(Source::parse("/a@b/snaps").spec, "");
    }
}
