//! The snapshot store: a directory of content-addressed, zstd-compressed
//! 4 KiB page chunks in pack files, one manifest and page map per snapshot,
//! published atomically.  docs/store.md describes the format and its rules.
//!
//! ```text
//! DIR/FORMAT                      "rekindle-store", "version 1"
//! DIR/lock                        flock: one writer at a time (and a count)
//! DIR/packs/<id>.pack             chunks one snapshot added, index, trailer
//! DIR/snapshots/<id>.json         manifest (JSON, checksum line last)
//! DIR/snapshots/<id>-<h>.map      its page map (binary, zstd)
//! DIR/tmp/                        files being written (leftovers of a crash)
//! DIR/journal, DIR/journal-b      sync commits not folded yet (journal.rs)
//! DIR/redo/<line>-<first>.redo    the apps' redo logs (redo.rs)
//! ```

pub mod delta;
pub mod error;
pub mod fasthash;
pub mod fold;
mod fold_pages;
pub mod format;
pub mod fsio;
pub mod gc;
pub mod journal;
pub mod location_index;
mod lock_count;
pub mod manifest;
pub mod map;
pub mod pack;
pub mod preopened;
pub mod reader;
pub mod redo;
pub mod stream;
pub mod verify;
pub mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use nix::fcntl::{Flock, FlockArg};

/// The writers' lock, shared by what this process does under it: a
/// writer and the journal's background fold (fold.rs) hold it together,
/// and it is released when the last of them lets go.
pub(crate) type StoreLock = Arc<Flock<File>>;

pub use error::StoreError;
pub use fold::FoldReport;
pub use format::{Hash, PAGE, SnapshotId};
pub use gc::{GcReport, Retention};
pub use manifest::{Manifest, RegionKind, RegionMeta, SnapshotInfo};
pub use reader::SnapshotReader;
pub use verify::{VerifyReport, VerifyStatus};
pub use writer::{NewSnapshot, SnapshotWriter, WriteStats};

use error::io_at;
use format::{PACKS, SNAPSHOTS, TMP};
use pack::IndexEntry;

/// What a long operation reports as it goes (for a progress line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub phase: Phase,
    pub done: u64,
    pub total: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    VerifyPacks,
    VerifySnapshots,
    Gc,
    Restore,
    Send,
    Recv,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::VerifyPacks => "verify packs",
            Phase::VerifySnapshots => "verify snapshots",
            Phase::Gc => "gc",
            Phase::Restore => "restore",
            Phase::Send => "send",
            Phase::Recv => "recv",
        }
    }
}

/// Where a chunk lives: which of the store's packs, where in it.  16
/// bytes: the index holds one per chunk (a chunk is at most a page, so its
/// length fits 16 bits; `pack::load` checks it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Loc {
    pub offset: u64,
    pub pack: u32,
    pub len: u16,
    pub flags: u16,
}

impl Loc {
    pub fn new(pack: u32, e: &IndexEntry) -> Loc {
        Loc {
            offset: e.offset,
            pack,
            len: e.len as u16,
            flags: e.flags as u16,
        }
    }
}

/// One pack file known to the store; a pack that failed to load keeps its
/// error, returned to every snapshot that needs it.
pub(crate) struct PackSlot {
    pub name: String,
    pub path: PathBuf,
    pub state: Result<Arc<File>, StoreError>,
    pub chunks: u64,
}

/// A manifest file found in `snapshots/`, loaded or not.
pub struct Listed {
    pub id: SnapshotId,
    pub path: PathBuf,
    pub manifest: Result<Manifest, StoreError>,
}

/// An open store directory.
pub struct Store {
    dir: PathBuf,
    packs: Vec<PackSlot>,
    by_name: HashMap<String, u32>,
    index: fasthash::FastMap<Hash, Loc>,
    /// `index` holds every loaded pack's chunks (writers, verify, send and
    /// gc need it); a store opened with `open_unindexed` has it empty
    /// until a writer begins.
    indexed: bool,
    /// A writer deduplicates its chunks against every pack (loading their
    /// indexes first).  Off in the journal's background fold, which keeps
    /// no index at all: its chunks are mostly new, and the engine already
    /// holds one index of the whole store (docs/store.md, "Journal").
    dedup_across_packs: bool,
    /// The journal, once a journaled snapshot was written (fold.rs).
    journal: Option<fold::JournalState>,
    /// The journal could not be opened or created (no room for it, ...):
    /// journaled snapshots are published instead (said once on stderr).
    journal_off: bool,
    /// A background fold that a foreground one waited for and took: kept
    /// for the engine's next `reap_background_fold`, which reports it.
    fold_done_unreported: Option<fold::BackgroundFoldDone>,
    /// The lock this store holds now, if any holder is alive: taking it
    /// again shares it (a journaled commit while the journal's previous
    /// file is folded in the background).
    held: Weak<Flock<File>>,
    /// What this handle knows of `tmp/`, `packs/` and `snapshots/` without
    /// listing them again; `None` once another writer may have changed
    /// them.
    listing: Option<Listing>,
    /// The count this handle wrote to the lock file when it last took the
    /// lock (`None`: it could not read or write it, and keeps no listing).
    lock_count: Option<u64>,
}

/// A writer's view of the store's directories, kept from one of its
/// snapshots to the next so that a snapshot every 10 ms does not list
/// thousands of files each time (docs/store.md, "Locking and readers").
/// It stays true while every change goes through this handle: no other
/// handle or process has taken the lock since this one last did (the lock
/// file's count says so), and this handle shared its lock with no other.
#[derive(Debug, Clone, Copy)]
struct Listing {
    /// The lock file's count as this handle left it.
    lock_count: u64,
    /// The highest sequence number in use in `snapshots/` and `packs/`.
    max_seq: u64,
}

impl Store {
    /// Opens the store at `dir`, creating it (and `dir`) if it does not
    /// exist.  An existing directory that is not empty and has no `FORMAT`
    /// is refused (`store_foreign`).
    pub fn create_or_open(dir: &Path) -> Result<Store, StoreError> {
        if !dir.join(format::FORMAT_FILE).exists() {
            std::fs::create_dir_all(dir).map_err(io_at("mkdir", dir))?;
            let mut rd = std::fs::read_dir(dir).map_err(io_at("read", dir))?;
            if rd.next().is_some() {
                return Err(StoreError::Foreign {
                    path: dir.to_path_buf(),
                    detail: "not empty and has no FORMAT file".into(),
                });
            }
            for sub in [TMP, PACKS, SNAPSHOTS] {
                let p = dir.join(sub);
                std::fs::create_dir_all(&p).map_err(io_at("mkdir", &p))?;
            }
            format::write_format(dir)?;
        }
        Store::open(dir)
    }

    /// Opens an existing store; loads every pack's index (not its chunks).
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let mut s = Store::open_empty(dir)?;
        s.refresh_packs()?;
        Ok(s)
    }

    /// Opens an existing store for restoring and listing: the packs are
    /// opened but their indexes are not loaded (at millions of chunks that
    /// is most of the time before a restore can start); `open_snapshot`
    /// reads the indexes of the packs its snapshot needs.  `begin` loads
    /// them all first, as `open` does.
    pub fn open_unindexed(dir: &Path) -> Result<Store, StoreError> {
        let mut s = Store::open_empty(dir)?;
        s.indexed = false;
        s.refresh_packs()?;
        Ok(s)
    }

    /// Opens an existing store for the journal's background fold: no pack
    /// index is ever loaded, and a writer deduplicates only within its own
    /// snapshot (what it publishes names its own pack for every chunk).
    pub(crate) fn open_for_background_fold(dir: &Path) -> Result<Store, StoreError> {
        let mut s = Store::open_unindexed(dir)?;
        s.dedup_across_packs = false;
        Ok(s)
    }

    fn open_empty(dir: &Path) -> Result<Store, StoreError> {
        if !dir.is_dir() {
            return Err(StoreError::NotFound {
                path: dir.to_path_buf(),
                what: "store directory".into(),
            });
        }
        let fmt = dir.join(format::FORMAT_FILE);
        if !fmt.exists() {
            return Err(StoreError::Foreign {
                path: dir.to_path_buf(),
                detail: "no FORMAT file".into(),
            });
        }
        format::check_format(dir)?;
        Ok(Store {
            dir: dir.to_path_buf(),
            packs: Vec::new(),
            by_name: HashMap::new(),
            index: fasthash::FastMap::default(),
            indexed: true,
            dedup_across_packs: true,
            journal: None,
            journal_off: false,
            fold_done_unreported: None,
            held: Weak::new(),
            listing: None,
            lock_count: None,
        })
    }

    /// A second handle on the same open store, its pack files shared and
    /// its chunk index copied: what a thread that needs the indexes gets
    /// from one that has loaded them, in a copy of memory rather than a
    /// read of every pack (an elected standby's sender and snapshot engine
    /// both start from its receiver's store).
    pub fn duplicate(&self) -> Store {
        Store {
            dir: self.dir.clone(),
            packs: self
                .packs
                .iter()
                .map(|p| PackSlot {
                    name: p.name.clone(),
                    path: p.path.clone(),
                    state: p.state.clone(),
                    chunks: p.chunks,
                })
                .collect(),
            by_name: self.by_name.clone(),
            index: self.index.clone(),
            indexed: self.indexed,
            dedup_across_packs: self.dedup_across_packs,
            journal: None,
            journal_off: false,
            fold_done_unreported: None,
            held: Weak::new(),
            listing: None,
            lock_count: None,
        }
    }

    /// The store is open with every pack's index loaded (`open`,
    /// `create_or_open`), not `open_unindexed`.
    pub fn is_indexed(&self) -> bool {
        self.indexed
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn sub(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Names in a sub-directory ending in `suffix` (sorted); a directory a
    /// backup dropped because it was empty counts as empty.
    pub(crate) fn names(&self, sub: &str, suffix: &str) -> Result<Vec<String>, StoreError> {
        let d = self.sub(sub);
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_at("read", &d)(e)),
        };
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.map_err(io_at("read", &d))?;
            if let Some(n) = ent.file_name().to_str()
                && n.ends_with(suffix)
                && !n.starts_with('.')
            {
                out.push(n.to_string());
            }
        }
        out.sort();
        Ok(out)
    }

    /// Brings the pack list and the chunk index up to date with `packs/`
    /// (another process may have added or collected packs).
    pub(crate) fn refresh_packs(&mut self) -> Result<(), StoreError> {
        let names = self.names(PACKS, ".pack")?;
        let gone = self
            .packs
            .iter()
            .any(|p| names.binary_search(&p.name).is_err());
        if gone {
            self.packs.clear();
            self.by_name.clear();
            self.index.clear();
        }
        for n in names {
            if !self.by_name.contains_key(&n) {
                self.add_pack(n);
            }
        }
        Ok(())
    }

    /// Loads one pack's index into the store's (a failed load is kept).
    pub(crate) fn add_pack(&mut self, name: String) -> u32 {
        let path = self.sub(PACKS).join(&name);
        let id = self.packs.len() as u32;
        let loaded = if self.indexed {
            pack::load(&path)
        } else {
            pack::open_unloaded(&path)
        };
        let (state, chunks) = match loaded {
            Ok(lp) => {
                self.index.reserve(lp.entries.len());
                for e in &lp.entries {
                    self.index.entry(e.hash).or_insert(Loc::new(id, e));
                }
                (Ok(Arc::new(lp.file)), lp.entries.len() as u64)
            }
            Err(e) => (Err(e), 0),
        };
        self.packs.push(PackSlot {
            name: name.clone(),
            path,
            state,
            chunks,
        });
        self.by_name.insert(name, id);
        id
    }

    /// Every manifest file in `snapshots/`, oldest first, loaded or with
    /// the error that stopped it.
    pub fn list_all(&self) -> Result<Vec<Listed>, StoreError> {
        let dir = self.sub(SNAPSHOTS);
        Ok(self
            .names(SNAPSHOTS, ".json")?
            .into_iter()
            .map(|n| {
                let path = dir.join(&n);
                let id = SnapshotId(n.trim_end_matches(".json").to_string());
                let manifest = manifest::load(&path);
                Listed { id, path, manifest }
            })
            .collect())
    }

    /// The snapshots whose manifests load, oldest first (`verify` reports
    /// the others; `rekindle snapshots` lists them as broken).
    pub fn list(&self) -> Result<Vec<SnapshotInfo>, StoreError> {
        Ok(self
            .list_all()?
            .into_iter()
            .filter_map(|l| l.manifest.ok().map(|m| m.info()))
            .collect())
    }

    /// The newest snapshot whose manifest loads (as `list`'s last), read
    /// from the newest name back: a store of thousands of small sync
    /// snapshots is not read whole for it.
    pub fn latest(&self) -> Result<Option<SnapshotInfo>, StoreError> {
        let dir = self.sub(SNAPSHOTS);
        for n in self.names(SNAPSHOTS, ".json")?.iter().rev() {
            if let Ok(m) = manifest::load(&dir.join(n)) {
                return Ok(Some(m.info()));
            }
        }
        Ok(None)
    }

    /// `""` or `"latest"`: the newest snapshot; an id; or a tag (the
    /// newest snapshot carrying it).
    pub fn resolve(&self, spec: &str) -> Result<SnapshotId, StoreError> {
        let not_found = || StoreError::NotFound {
            path: self.sub(SNAPSHOTS),
            what: format!("snapshot {spec:?}"),
        };
        if spec.is_empty() || spec == "latest" {
            return self
                .latest()?
                .map(|i| i.id)
                .ok_or_else(|| StoreError::NotFound {
                    path: self.sub(SNAPSHOTS),
                    what: "any snapshot (the store is empty)".into(),
                });
        }
        let id = SnapshotId(spec.to_string());
        if id.is_valid() {
            let path = self.manifest_path(&id);
            return if path.exists() {
                Ok(id)
            } else {
                Err(not_found())
            };
        }
        self.list()?
            .into_iter()
            .rev()
            .find(|i| i.tags.iter().any(|t| t == spec))
            .map(|i| i.id)
            .ok_or_else(not_found)
    }

    pub(crate) fn manifest_path(&self, id: &SnapshotId) -> PathBuf {
        self.sub(SNAPSHOTS).join(format!("{id}.json"))
    }

    pub(crate) fn load_manifest(&self, id: &SnapshotId) -> Result<Manifest, StoreError> {
        manifest::load(&self.manifest_path(id))
    }

    /// Takes the writers' lock (`DIR/lock`), without waiting; shares it if
    /// this store holds it already.  Each taking adds one to the count the
    /// lock file holds: a count other than the one this handle left means
    /// another writer has been here, and the listing is read again.
    pub(crate) fn lock(&mut self) -> Result<StoreLock, StoreError> {
        if let Some(l) = self.held.upgrade() {
            return Ok(l);
        }
        let path = self.dir.join(format::LOCK_FILE);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_at("open", &path))?;
        let l =
            Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| match errno {
                nix::errno::Errno::EWOULDBLOCK => StoreError::Locked { path: path.clone() },
                e => error::io_err("flock", &path, &std::io::Error::from(e)),
            })?;
        let count = lock_count::read(l.as_fd());
        let next = count.map(|c| c.wrapping_add(1));
        let written = next.filter(|&c| lock_count::write(l.as_fd(), c).is_ok());
        match (self.listing.as_mut(), written) {
            // nobody took the lock since this handle left `count`
            (Some(ls), Some(c)) if Some(ls.lock_count) == count => ls.lock_count = c,
            _ => self.listing = None,
        }
        self.lock_count = written;
        let l = Arc::new(l);
        self.held = Arc::downgrade(&l);
        Ok(l)
    }

    /// Another handle (or thread) may change the directories from here on:
    /// the next writer lists them again.
    pub(crate) fn forget_listing(&mut self) {
        self.listing = None;
    }

    /// Under the lock: creates missing sub-directories and removes what a
    /// crashed writer left in `tmp/`.  Nothing to do while this handle's
    /// listing holds: every writer since was its own, and left `tmp/` empty.
    pub(crate) fn prepare_write(&mut self) -> Result<Vec<PathBuf>, StoreError> {
        if !self.indexed && self.dedup_across_packs {
            // a writer dedups against every chunk: load the indexes now
            self.packs.clear();
            self.by_name.clear();
            self.indexed = true;
            self.listing = None;
        }
        if self.listing.is_some() {
            return Ok(Vec::new());
        }
        for sub in [TMP, PACKS, SNAPSHOTS] {
            let p = self.sub(sub);
            std::fs::create_dir_all(&p).map_err(io_at("mkdir", &p))?;
        }
        let mut removed = Vec::new();
        let tmp = self.sub(TMP);
        for n in self.names(TMP, "")? {
            let p = tmp.join(n);
            fsio::unlink(&p)?;
            removed.push(p);
        }
        self.refresh_packs()?;
        if let Some(lock_count) = self.lock_count {
            self.listing = Some(Listing {
                lock_count,
                max_seq: self.listed_max_seq()?,
            });
        }
        Ok(removed)
    }

    /// The next snapshot's sequence number: above every id in use, even by
    /// leftovers (a pack or map of a crashed commit).
    pub(crate) fn next_seq(&self) -> Result<u64, StoreError> {
        match self.listing {
            Some(ls) => Ok(ls.max_seq + 1),
            None => Ok(self.listed_max_seq()? + 1),
        }
    }

    /// A snapshot this handle published: its id is in use from now on.
    pub(crate) fn note_published(&mut self, id: &SnapshotId) {
        if let Some(ls) = self.listing.as_mut() {
            ls.max_seq = ls.max_seq.max(id.seq().unwrap_or(0));
        }
    }

    fn listed_max_seq(&self) -> Result<u64, StoreError> {
        let mut max = 0;
        for (sub, suf) in [(SNAPSHOTS, ""), (PACKS, ".pack")] {
            for n in self.names(sub, suf)? {
                if let Some(seq) = n.get(..12).and_then(|s| s.parse::<u64>().ok()) {
                    max = max.max(seq);
                }
            }
        }
        Ok(max)
    }

    pub(crate) fn pack_file(&self, pack: u32) -> Result<(&Path, &Arc<File>), StoreError> {
        let slot = &self.packs[pack as usize];
        match &slot.state {
            Ok(f) => Ok((&slot.path, f)),
            Err(e) => Err(e.clone()),
        }
    }

    /// This handle loaded pack `name` when it opened the store.
    pub(crate) fn has_pack(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Checks that every pack a manifest names is present and loaded.
    pub(crate) fn check_packs(&self, m: &Manifest) -> Result<(), StoreError> {
        for p in &m.packs {
            match self.by_name.get(p) {
                Some(&i) => {
                    self.pack_file(i)?;
                }
                None => {
                    return Err(StoreError::MissingPack {
                        path: self.sub(PACKS).join(p),
                    });
                }
            }
        }
        Ok(())
    }
}
