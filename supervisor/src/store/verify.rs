//! `Store::verify`: reads every pack (index and every chunk: decompress,
//! blake3) and every manifest (checksum, page map, chain, every chunk it
//! needs present and sound), and lists leftovers of crashed writes.

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;

use super::error::StoreError;
use super::format::{Hash, PACKS, PAGE, SNAPSHOTS, SnapshotId, TMP};
use super::pack::{self, ChunkReader};
use super::{Phase, Progress, Store};

/// What `verify_packs` found wrong.
#[derive(Default)]
struct Bad {
    /// Chunks that failed their checks.
    chunks: HashSet<Hash>,
    /// Packs (by index) gone since the store was opened.
    packs_gone: HashSet<u32>,
}

/// One snapshot's verdict.
#[derive(Debug, Clone)]
pub struct VerifyStatus {
    pub id: SnapshotId,
    pub restorable: bool,
    /// Why not restorable (may be about an ancestor's file).
    pub error: Option<StoreError>,
}

#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Every problem found, once each.
    pub errors: Vec<StoreError>,
    pub snapshots: Vec<VerifyStatus>,
    /// Files no published snapshot needs (crashed writes); `gc` removes them.
    pub leftovers: Vec<PathBuf>,
    pub packs: u64,
    pub chunks: u64,
    pub pack_bytes: u64,
    /// Journaled snapshots not folded yet (their records check), and the
    /// code of a torn tail ignored after them (store.md, "Journal").
    pub journal_records: u64,
    pub journal_torn: Option<&'static str>,
    /// Snapshots published by a writer while this ran (their packs came
    /// after the store was opened): not checked, as if listed before.
    pub published_meanwhile: u64,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }

    fn error(&mut self, e: StoreError) {
        let dup = self
            .errors
            .iter()
            .any(|x| x.code() == e.code() && x.path() == e.path());
        if !dup {
            self.errors.push(e);
        }
    }
}

impl Store {
    pub fn verify(&self, progress: &mut dyn FnMut(Progress)) -> Result<VerifyReport, StoreError> {
        let mut rep = VerifyReport::default();
        let bad = self.verify_packs(&mut rep, progress)?;
        let listed = self.list_all()?;
        let total = listed.len() as u64;
        let mut maps = BTreeSet::new();
        let mut packs = BTreeSet::new();
        for (i, l) in listed.into_iter().enumerate() {
            let verdict = match l.manifest {
                Err(e) => Err(e),
                Ok(m) => {
                    maps.insert(m.map.file.clone());
                    // verify takes no lock: a writer may publish meanwhile
                    if self.published_after_open(&m) {
                        rep.published_meanwhile += 1;
                        continue;
                    }
                    packs.extend(m.packs.iter().cloned());
                    packs.extend(m.pack.iter().cloned());
                    self.verify_snapshot(&m.id, &bad)
                }
            };
            let error = verdict.err();
            if let Some(e) = &error {
                rep.error(e.clone());
            }
            rep.snapshots.push(VerifyStatus {
                id: l.id,
                restorable: error.is_none(),
                error,
            });
            progress(Progress {
                phase: Phase::VerifySnapshots,
                done: i as u64 + 1,
                total,
            });
        }
        // location indexes: each checked against its snapshot's fold; one
        // without a snapshot is a leftover (an index is never needed: a
        // restore without it folds the chain)
        let good: BTreeSet<String> = rep
            .snapshots
            .iter()
            .filter(|s| s.restorable)
            .map(|s| s.id.to_string())
            .collect();
        for n in self.names(SNAPSHOTS, super::location_index::SUFFIX)? {
            let id = n.trim_end_matches(super::location_index::SUFFIX);
            if !good.contains(id) {
                if !self.manifest_path(&SnapshotId(id.to_string())).exists() {
                    rep.leftovers.push(self.sub(SNAPSHOTS).join(&n));
                }
                continue;
            }
            if let Err(e) = self.check_location_index(&SnapshotId(id.to_string())) {
                rep.error(e);
            }
        }
        // leftovers: what no manifest names (corrupt manifests name nothing
        // we can read, so their own files are not called leftovers)
        let broken: Vec<String> = rep
            .snapshots
            .iter()
            .filter(|s| {
                s.error
                    .as_ref()
                    .is_some_and(|e| e.path() == self.manifest_path(&s.id))
            })
            .map(|s| s.id.to_string())
            .collect();
        let mine = |n: &str| broken.iter().any(|b| n.starts_with(b.as_str()));
        for n in self.names(TMP, "")? {
            rep.leftovers.push(self.sub(TMP).join(n));
        }
        for n in self.names(SNAPSHOTS, ".map")? {
            if !maps.contains(&n) && !mine(&n) {
                rep.leftovers.push(self.sub(SNAPSHOTS).join(n));
            }
        }
        for (i, p) in self.packs.iter().enumerate() {
            // (one a gc removed meanwhile is gone, not left over)
            if !packs.contains(&p.name) && !mine(&p.name) && !bad.packs_gone.contains(&(i as u32)) {
                rep.leftovers.push(self.sub(PACKS).join(&p.name));
            }
        }
        match self.journal_scan() {
            Ok(Some(s)) => {
                rep.journal_records = s.records.len() as u64;
                rep.journal_torn = s.torn.map(|t| t.code());
            }
            Ok(None) => {}
            Err(e) => rep.error(e),
        }
        Ok(rep)
    }

    /// The manifest names a pack this handle did not load that is there
    /// now: a writer published it after the store was opened (a pack goes
    /// in before the manifest that names it).  A pack that is not there is
    /// damage, and `check_packs` says so.
    fn published_after_open(&self, m: &super::manifest::Manifest) -> bool {
        m.packs
            .iter()
            .any(|p| !self.has_pack(p) && self.sub(PACKS).join(p).exists())
    }

    /// Every chunk of every pack; returns the hashes that failed and the
    /// packs that are gone.
    fn verify_packs(
        &self,
        rep: &mut VerifyReport,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Bad, StoreError> {
        let mut bad = Bad::default();
        let mut reader = ChunkReader::new()?;
        let mut page = vec![0u8; PAGE];
        let total: u64 = self.packs.iter().map(|p| p.chunks).sum();
        let mut done = 0u64;
        for (i, slot) in self.packs.iter().enumerate() {
            // load again: the index as it is on disk now, every entry
            let lp = match pack::load(&slot.path) {
                Ok(lp) => lp,
                // removed since the open: a gc removes a pack after the
                // manifests that named it, so only a snapshot listed below
                // that still needs it makes this an error (missing_pack)
                Err(StoreError::MissingPack { .. }) => {
                    bad.packs_gone.insert(i as u32);
                    continue;
                }
                Err(e) => {
                    rep.error(e);
                    continue;
                }
            };
            rep.packs += 1;
            rep.pack_bytes += lp.size;
            for e in &lp.entries {
                rep.chunks += 1;
                if let Err(err) = reader.read(&lp.file, &slot.path, e, &mut page) {
                    bad.chunks.insert(e.hash);
                    rep.error(err);
                }
                done += 1;
                if done.is_multiple_of(4096) {
                    progress(Progress {
                        phase: Phase::VerifyPacks,
                        done,
                        total,
                    });
                }
            }
        }
        progress(Progress {
            phase: Phase::VerifyPacks,
            done: total,
            total,
        });
        Ok(bad)
    }

    fn verify_snapshot(&self, id: &SnapshotId, bad: &Bad) -> Result<(), StoreError> {
        let chain = self.chain(id)?;
        let folded = self.fold(&chain)?;
        for region in &folded {
            for (_, h) in region {
                let Some(loc) = self.index.get(h) else {
                    return Err(StoreError::MissingChunk {
                        path: chain[0].0.clone(),
                        hash: super::format::hex(h),
                    });
                };
                if bad.packs_gone.contains(&loc.pack) {
                    let path = self.packs[loc.pack as usize].path.clone();
                    return Err(StoreError::MissingPack { path });
                }
                if bad.chunks.contains(h) {
                    let (path, _) = self.pack_file(loc.pack)?;
                    return Err(StoreError::ChunkChecksum {
                        path: path.to_path_buf(),
                        offset: loc.offset,
                        detail: format!("needed by {id}"),
                    });
                }
            }
        }
        Ok(())
    }
}
