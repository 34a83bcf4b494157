//! Retention and garbage collection.  Retention picks the snapshots to
//! keep; a kept snapshot whose chain runs through a deleted one is first
//! rewritten as a full snapshot (its folded map, atomically), so no chain
//! breaks.  Then the deleted manifests and maps go, then every pack none of
//! whose chunks a kept snapshot needs, and the leftovers of crashed writes.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use super::error::StoreError;
use super::fasthash::FastSet;
use super::format::{Hash, PACKS, SNAPSHOTS, SnapshotId, TMP, unix_ns};
use super::manifest::{Manifest, MapRef, SnapshotKind};
use super::map::{self, MapEntry};
use super::{Phase, Progress, Store, fsio, pack};

/// Which snapshots to keep.  With no rule set, every snapshot is kept (gc
/// then only removes unreferenced packs and leftovers).  Otherwise a
/// snapshot is kept if any rule keeps it; the newest one and every tagged
/// one are always kept.
#[derive(Debug, Clone, Default)]
pub struct Retention {
    /// The N newest.
    pub keep_last: Option<usize>,
    /// Every snapshot younger than this.
    pub keep_within: Option<Duration>,
    /// The newest snapshot of each of the N most recent hours (UTC) that have one.
    pub keep_hourly: Option<usize>,
    /// The newest snapshot of each of the N most recent days (UTC) that have one.
    pub keep_daily: Option<usize>,
    /// Report what would go; change nothing.
    pub dry_run: bool,
}

impl Retention {
    fn any_rule(&self) -> bool {
        self.keep_last.is_some()
            || self.keep_within.is_some()
            || self.keep_hourly.is_some()
            || self.keep_daily.is_some()
    }
}

#[derive(Debug, Clone, Default)]
pub struct GcReport {
    pub dry_run: bool,
    pub kept: Vec<SnapshotId>,
    pub deleted: Vec<SnapshotId>,
    /// Kept snapshots rewritten as full because their parent went.
    pub rewritten: Vec<SnapshotId>,
    /// Files removed (or that would be, on a dry run).
    pub removed: Vec<PathBuf>,
    pub freed_bytes: u64,
    /// Packs kept because some of their chunks are live: (pack, bytes of dead chunks).
    pub partly_live: Vec<(String, u64)>,
    pub wasted_bytes: u64,
    /// Manifests that do not load: left alone (their own pack and maps too).
    pub broken: Vec<StoreError>,
}

/// The newest snapshot of each of the `n` most recent `bucket`-second
/// periods; `snaps` is newest first.
fn keep_per_bucket(
    snaps: &[(SnapshotId, u64)],
    bucket: u64,
    n: usize,
    keep: &mut BTreeSet<SnapshotId>,
) {
    let mut seen = BTreeSet::new();
    for (id, ns) in snaps {
        let b = ns / 1_000_000_000 / bucket;
        if seen.len() == n && !seen.contains(&b) {
            break;
        }
        if seen.insert(b) {
            keep.insert(id.clone());
        }
    }
}

fn size_of(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

impl Store {
    fn choose(&self, policy: &Retention, ms: &[Manifest], now: SystemTime) -> BTreeSet<SnapshotId> {
        let mut keep: BTreeSet<SnapshotId> = BTreeSet::new();
        if !policy.any_rule() {
            keep.extend(ms.iter().map(|m| m.id.clone()));
            return keep;
        }
        let newest: Vec<(SnapshotId, u64)> = ms
            .iter()
            .rev()
            .map(|m| (m.id.clone(), m.created_ns))
            .collect();
        if let Some((id, _)) = newest.first() {
            keep.insert(id.clone());
        }
        keep.extend(
            ms.iter()
                .filter(|m| !m.tags.is_empty())
                .map(|m| m.id.clone()),
        );
        if let Some(n) = policy.keep_last {
            keep.extend(newest.iter().take(n).map(|(id, _)| id.clone()));
        }
        if let Some(d) = policy.keep_within {
            let cut = unix_ns(now).saturating_sub(d.as_nanos() as u64);
            keep.extend(
                newest
                    .iter()
                    .filter(|(_, ns)| *ns >= cut)
                    .map(|(id, _)| id.clone()),
            );
        }
        if let Some(n) = policy.keep_hourly {
            keep_per_bucket(&newest, 3600, n, &mut keep);
        }
        if let Some(n) = policy.keep_daily {
            keep_per_bucket(&newest, 86400, n, &mut keep);
        }
        keep
    }

    /// Applies `policy`, then collects.  Takes the writers' lock.
    pub fn gc(
        &mut self,
        policy: &Retention,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<GcReport, StoreError> {
        let _lock = self.lock()?;
        // it deletes and rewrites files that no writer accounts for
        self.forget_listing();
        // retention must not delete what a journal record follows
        self.fold_locked()?;
        let mut rep = GcReport {
            dry_run: policy.dry_run,
            ..GcReport::default()
        };
        self.refresh_packs()?;
        let mut ms: Vec<Manifest> = Vec::new();
        for l in self.list_all()? {
            match l.manifest {
                Ok(m) => ms.push(m),
                // an unreadable manifest may name any pack: collecting now
                // could delete what it needs once it is readable again
                Err(e @ (StoreError::PermissionDenied { .. } | StoreError::Io { .. })) => {
                    return Err(e);
                }
                Err(e) => rep.broken.push(e),
            }
        }
        let mut keep = self.choose(policy, &ms, SystemTime::now());
        let by_id: HashMap<SnapshotId, usize> = ms
            .iter()
            .enumerate()
            .map(|(i, m)| (m.id.clone(), i))
            .collect();
        // kept snapshots whose chain runs through a deleted one: fold them
        let mut referenced: FastSet<Hash> = FastSet::default();
        let mut rewrites: Vec<(usize, Vec<MapEntry>)> = Vec::new();
        let total = ms.len() as u64;
        for (i, m) in ms.iter().enumerate() {
            progress(Progress {
                phase: Phase::Gc,
                done: i as u64,
                total,
            });
            if !keep.contains(&m.id) {
                continue;
            }
            // only a delta whose parent goes is rewritten (its kept
            // children stay deltas on it); the others need no chain read,
            // which at `--snapshot-keep N` would be N manifests each
            let parent_goes = m.kind == SnapshotKind::Delta
                && m.parent.as_ref().is_none_or(|p| !keep.contains(p));
            if !parent_goes {
                continue;
            }
            let chain = match self.chain(&m.id) {
                Ok(c) => c,
                Err(_) => {
                    // a broken chain: keep all of it, untouched
                    self.keep_chain_ids(m, &by_id, &ms, &mut keep);
                    continue;
                }
            };
            if chain.len() < 2 {
                continue;
            }
            match self.fold(&chain) {
                Ok(folded) => {
                    let mut entries = Vec::new();
                    for (r, pages) in folded.iter().enumerate() {
                        for &(page, h) in pages {
                            referenced.insert(h);
                            entries.push(MapEntry {
                                region: r as u32,
                                page,
                                hash: Some(h),
                            });
                        }
                    }
                    rewrites.push((i, entries));
                }
                Err(e) => {
                    rep.broken.push(e);
                    for (_, c) in &chain {
                        keep.insert(c.id.clone());
                    }
                }
            }
        }
        // every kept snapshot's own chunks (a rewritten one's folded
        // chunks were added above)
        for m in &ms {
            if keep.contains(&m.id) {
                self.own_hashes(m, &mut referenced);
            }
        }
        for (i, entries) in rewrites {
            let m = &ms[i];
            rep.rewritten.push(m.id.clone());
            if !policy.dry_run {
                let parent = self.nearest_kept(m, &by_id, &ms, &keep);
                self.rewrite_full(m, parent, &entries, &mut rep)?;
            }
        }
        // delete what retention dropped (no kept chain needs it now),
        // newest first: a crash half-way leaves no child without its parent
        let snaps = self.sub(SNAPSHOTS);
        for m in ms.iter().rev() {
            if keep.contains(&m.id) {
                rep.kept.push(m.id.clone());
                continue;
            }
            rep.deleted.push(m.id.clone());
            for p in [self.manifest_path(&m.id), snaps.join(&m.map.file)] {
                self.remove(&p, policy.dry_run, &mut rep)?;
            }
        }
        rep.kept.reverse();
        rep.deleted.reverse();
        if !policy.dry_run {
            fsio::fsync_dir(&snaps)?;
        }
        self.collect_files(&ms, &keep, &referenced, policy.dry_run, &mut rep)?;
        progress(Progress {
            phase: Phase::Gc,
            done: total,
            total,
        });
        if !policy.dry_run {
            self.refresh_packs()?;
        }
        Ok(rep)
    }

    fn own_hashes(&self, m: &Manifest, out: &mut FastSet<Hash>) {
        if let Ok(es) = self.load_map(m) {
            out.extend(es.iter().filter_map(|e| e.hash));
        }
    }

    fn keep_chain_ids(
        &self,
        m: &Manifest,
        by_id: &HashMap<SnapshotId, usize>,
        ms: &[Manifest],
        keep: &mut BTreeSet<SnapshotId>,
    ) {
        let mut cur = m;
        while let Some(p) = &cur.parent {
            if cur.kind == SnapshotKind::Full {
                break;
            }
            let Some(&i) = by_id.get(p) else { break };
            keep.insert(p.clone());
            cur = &ms[i];
        }
    }

    fn nearest_kept(
        &self,
        m: &Manifest,
        by_id: &HashMap<SnapshotId, usize>,
        ms: &[Manifest],
        keep: &BTreeSet<SnapshotId>,
    ) -> Option<SnapshotId> {
        let mut cur = m;
        while let Some(p) = &cur.parent {
            if keep.contains(p) {
                return Some(p.clone());
            }
            cur = &ms[*by_id.get(p)?];
        }
        None
    }

    fn remove(
        &self,
        p: &std::path::Path,
        dry_run: bool,
        rep: &mut GcReport,
    ) -> Result<(), StoreError> {
        let size = size_of(p);
        if !dry_run {
            match fsio::unlink(p) {
                Ok(()) => {}
                Err(StoreError::NotFound { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        rep.freed_bytes += size;
        rep.removed.push(p.to_path_buf());
        Ok(())
    }

    /// Replaces a snapshot's manifest by a full one with the given map:
    /// new map file, then the manifest (atomic rename), then the old map.
    fn rewrite_full(
        &self,
        m: &Manifest,
        parent: Option<SnapshotId>,
        entries: &[MapEntry],
        rep: &mut GcReport,
    ) -> Result<(), StoreError> {
        let snaps = self.sub(SNAPSHOTS);
        let tmp = self.sub(TMP);
        let bytes = map::encode(entries)?;
        let sum = blake3::hash(&bytes);
        let name = format!("{}-{}.map", m.id, &sum.to_hex()[..16]);
        fsio::publish_file(&tmp.join(&name), &snaps.join(&name), &bytes)?;
        let mut packs = BTreeSet::new();
        for e in entries {
            if let Some(h) = &e.hash {
                let loc = self.index.get(h).ok_or_else(|| StoreError::MissingChunk {
                    path: self.manifest_path(&m.id),
                    hash: super::format::hex(h),
                })?;
                packs.insert(self.packs[loc.pack as usize].name.clone());
            }
        }
        let mut n = m.clone();
        n.kind = SnapshotKind::Full;
        n.parent = parent;
        n.map = MapRef {
            file: name.clone(),
            size: bytes.len() as u64,
            blake3: sum.to_hex().to_string(),
            entries: entries.len() as u64,
        };
        n.packs = packs.into_iter().collect();
        n.stats.pages = entries.len() as u64;
        n.stats.zero_pages = 0;
        fsio::fsync_dir(&snaps)?;
        fsio::publish_file(
            &tmp.join(format!("{}.json", m.id)),
            &self.manifest_path(&m.id),
            &n.encode(),
        )?;
        fsio::fsync_dir(&snaps)?;
        if m.map.file != name {
            self.remove(&snaps.join(&m.map.file), false, rep)?;
        }
        Ok(())
    }

    /// Packs no kept snapshot needs, maps no manifest names, `tmp/`.
    fn collect_files(
        &self,
        ms: &[Manifest],
        keep: &BTreeSet<SnapshotId>,
        referenced: &FastSet<Hash>,
        dry_run: bool,
        rep: &mut GcReport,
    ) -> Result<(), StoreError> {
        let broken_ids: Vec<String> = self
            .list_all()?
            .into_iter()
            .filter(|l| l.manifest.is_err())
            .map(|l| l.id.to_string())
            .collect();
        let protected = |n: &str| broken_ids.iter().any(|b| n.starts_with(b.as_str()));
        let mut named: BTreeSet<String> = BTreeSet::new();
        for m in ms.iter().filter(|m| keep.contains(&m.id)) {
            named.extend(m.packs.iter().cloned());
        }
        for slot in &self.packs {
            if protected(&slot.name) {
                continue;
            }
            let entries = match pack::load(&slot.path) {
                Ok(lp) => lp.entries,
                Err(StoreError::MissingPack { .. }) => continue,
                // a corrupt pack no kept snapshot names: nothing to save
                Err(_) if !named.contains(&slot.name) => Vec::new(),
                Err(_) => continue,
            };
            let dead: u64 = entries
                .iter()
                .filter(|e| !referenced.contains(&e.hash))
                .map(|e| e.len as u64)
                .sum();
            let live = entries.iter().any(|e| referenced.contains(&e.hash));
            if live || named.contains(&slot.name) {
                if dead > 0 {
                    rep.partly_live.push((slot.name.clone(), dead));
                    rep.wasted_bytes += dead;
                }
            } else {
                self.remove(&self.sub(PACKS).join(&slot.name), dry_run, rep)?;
            }
        }
        if !dry_run {
            fsio::fsync_dir(&self.sub(PACKS))?;
        }
        // maps: those the remaining manifests name stay
        let live_maps: BTreeSet<String> = self
            .list_all()?
            .into_iter()
            .filter_map(|l| l.manifest.ok())
            .filter(|m| !dry_run || keep.contains(&m.id))
            .map(|m| m.map.file)
            .collect();
        for n in self.names(SNAPSHOTS, ".map")? {
            let p = self.sub(SNAPSHOTS).join(&n);
            if !live_maps.contains(&n) && !protected(&n) && !rep.removed.contains(&p) {
                self.remove(&p, dry_run, rep)?;
            }
        }
        // location indexes: of a kept snapshot, as it is now (a rewritten
        // one's index names its old manifest), else removed
        let live_ids: BTreeSet<String> = self
            .list_all()?
            .into_iter()
            .filter(|l| !dry_run || keep.contains(&l.id))
            .map(|l| l.id.to_string())
            .collect();
        for n in self.names(SNAPSHOTS, "")? {
            let id = n
                .strip_suffix(super::location_index::SUFFIX)
                .or_else(|| n.strip_suffix(".loc.tmp"));
            let Some(id) = id else { continue };
            let p = self.sub(SNAPSHOTS).join(&n);
            let stale = rep.rewritten.iter().any(|r| r.as_str() == id);
            // (a live snapshot's .loc.tmp may be being written by its engine)
            if (stale || !live_ids.contains(id)) && !rep.removed.contains(&p) {
                self.remove(&p, dry_run, rep)?;
            }
        }
        for n in self.names(TMP, "")? {
            self.remove(&self.sub(TMP).join(n), dry_run, rep)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(seq: u64) -> SnapshotId {
        SnapshotId(format!("{seq:012}-x"))
    }

    #[test]
    fn per_bucket_keeps_the_newest_of_each_of_the_latest_n_periods() {
        const H: u64 = 3600 * 1_000_000_000;
        // newest first: two in hour 10, one in hour 9, two in hour 7, one in hour 3
        let snaps: Vec<(SnapshotId, u64)> = [
            (6, 10 * H + 5),
            (5, 10 * H),
            (4, 9 * H + 1),
            (3, 7 * H + 9),
            (2, 7 * H),
            (1, 3 * H),
        ]
        .iter()
        .map(|&(s, ns)| (id(s), ns))
        .collect();
        let mut keep = BTreeSet::new();
        keep_per_bucket(&snaps, 3600, 3, &mut keep);
        assert_eq!(
            keep.into_iter().collect::<Vec<_>>(),
            vec![id(3), id(4), id(6)]
        );
        let mut keep = BTreeSet::new();
        keep_per_bucket(&snaps, 86400, 5, &mut keep);
        assert_eq!(
            keep.into_iter().collect::<Vec<_>>(),
            vec![id(6)],
            "all in one day"
        );
    }
}
