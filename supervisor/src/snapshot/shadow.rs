//! The engine's copy of pages as the newest snapshot holds them (the
//! *shadow*), so that a journaled snapshot can record a page as the bytes
//! that changed (store/delta.rs) instead of the page hashed and compressed:
//! docs/store.md, "Delta records".
//!
//! The shadow only ever holds exact content: a page is in it as the
//! snapshot `of` has it, or not at all.  What a snapshot puts is staged and
//! becomes the shadow when that snapshot is committed.  A journaled
//! incremental snapshot of `of` keeps the shadow; so does a published one
//! (an interval's, one asked for) once the shadow holds pages, so that the
//! group commits after it still go as deltas.  A full snapshot, one against
//! a baseline, a failed one, or one of another parent empties it.  So it
//! holds the pages an app's group commits write (rkv `--durability sync`),
//! and nothing for an app that is only snapshotted.  Bounded by
//! `REKINDLE_SNAPSHOT_SHADOW_BYTES` (default 256 MiB, 0: no deltas).
//!
//! A known page put as a delta is staged as that delta and applied to the
//! page in place at the commit; a page put whole is staged in a slot of its
//! own beside the old version.  At its bound the shadow keeps the pages it
//! has: a new page stays out (its next change is journaled whole), and an
//! eighth of the bound is held back for known pages put whole.  Giving a
//! known page's memory to a new one instead made it churn: every copy
//! paid, few deltas gained.

use crate::store::SnapshotId;
use crate::store::fasthash::FastMap;
use crate::store::format::PAGE;

pub const SHADOW_BYTES_ENV: &str = "REKINDLE_SNAPSHOT_SHADOW_BYTES";
const SHADOW_BYTES: usize = 256 << 20;

/// The bound of the shadow, from the environment (once per process; a
/// value that is not a number of bytes is said on stderr,
/// `shadow_bytes_invalid`, and the default used).
pub fn shadow_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| match std::env::var(SHADOW_BYTES_ENV) {
        Err(_) => SHADOW_BYTES,
        Ok(v) => v.parse::<usize>().unwrap_or_else(|_| {
            eprintln!(
                "rekindle: {SHADOW_BYTES_ENV}={v:?} ignored (shadow_bytes_invalid: a number of \
                 bytes, 0 for no delta records); {SHADOW_BYTES} bytes"
            );
            SHADOW_BYTES
        }),
    })
}

/// A page of the shadow: (region, page), the region by its number in
/// `names`.
type Key = (u16, u64);

/// Pages are kept in chunks of this many, allocated as needed (in huge
/// pages where the kernel gives them: the shadow is read at random).
const CHUNK_PAGES: usize = 1024;

/// A page's new version, staged until the snapshot is committed.
enum Staged {
    /// The whole page, in a slot of its own.
    Slot(u32),
    /// The bytes that changed since the version the shadow holds
    /// (`deltas[at..at + len]`), applied to it in place at the commit: a
    /// known page's new version costs neither a slot nor a page's copy
    /// into memory the cache does not hold.
    Delta { at: u32, len: u32 },
}

pub struct Shadow {
    /// Pages as the snapshot `of` holds them: their slots.
    index: FastMap<Key, u32>,
    of: Option<SnapshotId>,
    /// What the snapshot being taken put, for the shadow once committed.
    staged: FastMap<Key, Staged>,
    deltas: Vec<u8>,
    /// The snapshot being taken keeps the shadow (an incremental one of
    /// the snapshot it is of).
    active: bool,
    names: Vec<String>,
    chunks: Vec<Vec<u8>>,
    free: Vec<u32>,
    /// Slots handed out so far (the next new one).
    slots: u32,
    cap_pages: usize,
}

impl Shadow {
    pub fn new(cap_bytes: usize) -> Shadow {
        Shadow {
            index: FastMap::default(),
            of: None,
            staged: FastMap::default(),
            deltas: Vec::new(),
            active: false,
            names: Vec::new(),
            chunks: Vec::new(),
            free: Vec::new(),
            slots: 0,
            cap_pages: cap_bytes / PAGE,
        }
    }

    /// Before a snapshot whose parent is `parent`: `incremental`, a delta
    /// of it (not a full snapshot, not one against a baseline);
    /// `journaled`, its record goes to the journal.  The shadow is kept by
    /// an incremental snapshot of the snapshot it is of: a journaled one,
    /// or a published one if the shadow holds pages.
    pub fn begin(&mut self, parent: Option<&SnapshotId>, incremental: bool, journaled: bool) {
        self.unstage();
        let of_parent = parent.is_some() && self.of.as_ref() == parent;
        let keeps = incremental && of_parent && (journaled || !self.index.is_empty());
        if !keeps {
            self.clear();
        }
        self.active = incremental && (journaled || keeps) && self.cap_pages > 0;
    }

    /// Drops what was staged (a snapshot not committed).
    fn unstage(&mut self) {
        for (_, st) in self.staged.drain() {
            if let Staged::Slot(s) = st {
                self.free.push(s);
            }
        }
        self.deltas.clear();
    }

    /// Forgets every page and gives the memory back.
    pub fn clear(&mut self) {
        self.index.clear();
        self.staged.clear();
        self.deltas.clear();
        self.of = None;
        self.active = false;
        self.names.clear();
        self.chunks.clear();
        self.free.clear();
        self.slots = 0;
    }

    fn name_id(&self, region: &str) -> Option<u16> {
        self.names
            .iter()
            .position(|n| n == region)
            .map(|i| i as u16)
    }

    fn slot(&self, slot: u32) -> &[u8] {
        let (c, i) = (slot as usize / CHUNK_PAGES, slot as usize % CHUNK_PAGES);
        &self.chunks[c][i * PAGE..(i + 1) * PAGE]
    }

    fn slot_mut(&mut self, slot: u32) -> &mut [u8] {
        let (c, i) = (slot as usize / CHUNK_PAGES, slot as usize % CHUNK_PAGES);
        &mut self.chunks[c][i * PAGE..(i + 1) * PAGE]
    }

    /// Slots held back for the new versions of known pages.
    fn reserve(&self) -> usize {
        self.cap_pages.div_ceil(8)
    }

    /// A slot for a page's new version: a freed one, or a new one within
    /// the bound; a page the shadow does not know yet gets one only below
    /// the reserve.
    fn take_slot(&mut self, known: bool) -> Option<u32> {
        let in_use = self.slots as usize - self.free.len();
        let limit = if known {
            self.cap_pages
        } else {
            self.cap_pages - self.reserve()
        };
        if in_use >= limit {
            return None;
        }
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        if self.slots as usize == self.chunks.len() * CHUNK_PAGES {
            let n = CHUNK_PAGES.min(self.cap_pages - self.slots as usize) * PAGE;
            let mut c = crate::store::location_index::vec_for_millions::<u8>(n).ok()?;
            c.resize(n, 0);
            self.chunks.push(c);
        }
        // a short last chunk holds exactly the slots up to the bound
        let s = self.slots;
        self.slots += 1;
        Some(s)
    }

    /// The page as the parent holds it, if the shadow knows it.
    pub fn get(&self, region: &str, page: u64) -> Option<&[u8]> {
        let id = self.name_id(region)?;
        self.index.get(&(id, page)).map(|&s| self.slot(s))
    }

    /// The snapshot being taken puts `bytes` as this page.  A page the
    /// shadow does not know is kept only below the bound less the reserve;
    /// one it knows and cannot keep (a snapshot that changed more known
    /// pages than the reserve holds) is forgotten (it would be stale).
    pub fn stage(&mut self, region: &str, page: u64, bytes: &[u8]) {
        let Some(key) = self.staged_key(region, page) else {
            return;
        };
        match self.staged.remove(&key) {
            Some(Staged::Slot(s)) => {
                self.slot_mut(s).copy_from_slice(bytes);
                self.staged.insert(key, Staged::Slot(s));
                return;
            }
            Some(Staged::Delta { .. }) | None => {}
        }
        let known = self.index.contains_key(&key);
        match self.take_slot(known) {
            Some(s) => {
                self.slot_mut(s).copy_from_slice(bytes);
                self.staged.insert(key, Staged::Slot(s));
            }
            None => {
                if let Some(old) = self.index.remove(&key) {
                    self.free.push(old);
                }
            }
        }
    }

    /// The snapshot being taken puts this page as `delta` against the
    /// version the shadow holds (`get`'s): applied to it at the commit.
    pub fn stage_delta(&mut self, region: &str, page: u64, delta: &[u8]) {
        let Some(key) = self.staged_key(region, page) else {
            return;
        };
        if let Some(Staged::Slot(s)) = self.staged.remove(&key) {
            self.free.push(s);
        }
        if !self.index.contains_key(&key) {
            return; // not what the delta was taken against
        }
        let at = self.deltas.len() as u32;
        self.deltas.extend_from_slice(delta);
        self.staged.insert(
            key,
            Staged::Delta {
                at,
                len: delta.len() as u32,
            },
        );
    }

    /// The key of a page staged now (None: no snapshot keeps the shadow,
    /// or too many regions).
    fn staged_key(&mut self, region: &str, page: u64) -> Option<Key> {
        if !self.active {
            return None;
        }
        let id = match self.name_id(region) {
            Some(id) => id,
            None if self.names.len() < u16::MAX as usize => {
                self.names.push(region.to_string());
                (self.names.len() - 1) as u16
            }
            None => return None,
        };
        Some((id, page))
    }

    /// The snapshot was committed as `id`: what it put is the shadow now,
    /// and regions it did not inherit (stored whole, another shape) hold
    /// nothing it did not put.
    pub fn commit(&mut self, id: SnapshotId, fresh_regions: &[String]) {
        if !self.active {
            self.clear();
            return;
        }
        let fresh: Vec<u16> = fresh_regions
            .iter()
            .filter_map(|r| self.name_id(r))
            .collect();
        if !fresh.is_empty() {
            let free = &mut self.free;
            self.index.retain(|(r, _), s| {
                let keep = !fresh.contains(r);
                if !keep {
                    free.push(*s);
                }
                keep
            });
        }
        for (k, st) in self.staged.drain() {
            match st {
                Staged::Slot(s) => {
                    if let Some(old) = self.index.insert(k, s) {
                        self.free.push(old);
                    }
                }
                Staged::Delta { at, len } => {
                    let Some(&s) = self.index.get(&k) else {
                        continue; // its region was stored whole
                    };
                    let d = &self.deltas[at as usize..(at + len) as usize];
                    let (c, i) = (s as usize / CHUNK_PAGES, s as usize % CHUNK_PAGES);
                    let page = &mut self.chunks[c][i * PAGE..(i + 1) * PAGE];
                    if crate::store::delta::apply(page, d).is_err() {
                        // never kept stale (the writer checked it already)
                        self.index.remove(&k);
                        self.free.push(s);
                    }
                }
            }
        }
        self.deltas.clear();
        self.of = Some(id);
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> SnapshotId {
        SnapshotId::new(n, std::time::SystemTime::UNIX_EPOCH)
    }

    #[test]
    fn pages_become_the_shadow_once_committed_and_only_for_their_child() {
        let mut s = Shadow::new(4 * PAGE);
        s.begin(None, true, true);
        s.stage("a", 1, &[1u8; PAGE]);
        assert!(s.get("a", 1).is_none(), "not before the commit");
        s.commit(id(1), &[]);
        assert_eq!(s.get("a", 1), Some(&[1u8; PAGE][..]));
        // a delta of snapshot 1 keeps it; one of another parent does not
        s.begin(Some(&id(1)), true, true);
        s.stage("a", 1, &[2u8; PAGE]);
        s.stage("a", 2, &[3u8; PAGE]);
        assert_eq!(
            s.get("a", 1),
            Some(&[1u8; PAGE][..]),
            "the parent's until the commit"
        );
        s.commit(id(2), &[]);
        assert_eq!(s.get("a", 1), Some(&[2u8; PAGE][..]));
        s.begin(Some(&id(1)), true, true);
        assert!(s.is_empty(), "snapshot 1 is not what the shadow is of");
    }

    #[test]
    fn a_failed_full_or_fresh_snapshot_leaves_nothing_stale() {
        let mut s = Shadow::new(4 * PAGE);
        s.begin(None, true, true);
        s.stage("a", 1, &[1u8; PAGE]);
        s.stage("b", 1, &[1u8; PAGE]);
        s.commit(id(1), &[]);
        // a failure: the engine clears
        s.begin(Some(&id(1)), true, true);
        s.stage("a", 1, &[9u8; PAGE]);
        s.clear();
        assert!(s.get("a", 1).is_none());
        // a full snapshot, or one against a baseline, empties it
        s.begin(None, true, true);
        s.stage("a", 1, &[1u8; PAGE]);
        s.commit(id(3), &[]);
        s.begin(Some(&id(3)), false, false);
        assert!(s.is_empty());
        s.stage("a", 1, &[1u8; PAGE]);
        s.commit(id(4), &[]);
        s.begin(Some(&id(4)), true, true);
        assert!(s.is_empty(), "nothing kept from a full snapshot");
        // a region stored whole keeps only what this snapshot put
        s.stage("a", 1, &[1u8; PAGE]);
        s.stage("b", 1, &[1u8; PAGE]);
        s.commit(id(5), &[]);
        s.begin(Some(&id(5)), true, true);
        s.stage("b", 2, &[5u8; PAGE]);
        s.commit(id(6), &["b".to_string()]);
        assert!(s.get("b", 1).is_none() && s.get("b", 2).is_some() && s.get("a", 1).is_some());
    }

    #[test]
    fn a_published_snapshot_between_group_commits_keeps_and_updates_it() {
        let mut s = Shadow::new(4 * PAGE);
        // an app only snapshotted: nothing kept
        s.begin(None, true, false);
        s.stage("a", 1, &[1u8; PAGE]);
        s.commit(id(1), &[]);
        assert!(s.is_empty());
        // group commits, then an interval's published snapshot of them
        s.begin(Some(&id(1)), true, true);
        s.stage("a", 1, &[2u8; PAGE]);
        s.stage("a", 2, &[2u8; PAGE]);
        s.commit(id(2), &[]);
        s.begin(Some(&id(2)), true, false);
        s.stage("a", 2, &[3u8; PAGE]);
        assert_eq!(
            s.get("a", 2),
            Some(&[2u8; PAGE][..]),
            "the parent's until the commit"
        );
        s.commit(id(3), &[]);
        assert_eq!(s.get("a", 1), Some(&[2u8; PAGE][..]));
        assert_eq!(s.get("a", 2), Some(&[3u8; PAGE][..]));
        // a published one of another parent empties it
        s.begin(Some(&id(2)), true, false);
        assert!(s.is_empty());
    }

    #[test]
    fn a_delta_is_applied_to_the_page_at_the_commit() {
        use crate::store::delta;
        let mut s = Shadow::new(4 * PAGE);
        s.begin(None, true, true);
        s.stage("a", 1, &[1u8; PAGE]);
        s.stage("a", 2, &[1u8; PAGE]);
        s.commit(id(1), &[]);
        let mut new = vec![1u8; PAGE];
        new[100..140].fill(7);
        let mut d = Vec::new();
        delta::encode(&[1u8; PAGE], &new, PAGE, &mut d).unwrap();
        s.begin(Some(&id(1)), true, true);
        s.stage_delta("a", 1, &d);
        // a page staged whole and then as a delta: the delta wins
        s.stage("a", 2, &[9u8; PAGE]);
        s.stage_delta("a", 2, &d);
        assert_eq!(
            s.get("a", 1),
            Some(&[1u8; PAGE][..]),
            "the parent's until the commit"
        );
        s.commit(id(2), &[]);
        assert_eq!(s.get("a", 1), Some(&new[..]));
        assert_eq!(s.get("a", 2), Some(&new[..]));
        // a delta and then the whole page: the page wins; an uncommitted
        // delta changes nothing
        s.begin(Some(&id(2)), true, true);
        s.stage_delta("a", 1, &d);
        s.stage("a", 1, &[3u8; PAGE]);
        s.stage_delta("a", 2, &[1, 0, 0, 0, 1, 0, 5]);
        s.commit(id(3), &[]);
        assert_eq!(s.get("a", 1), Some(&[3u8; PAGE][..]));
        assert_eq!(
            s.get("a", 2),
            Some(
                &{
                    let mut p = new.clone();
                    p[0] = 5;
                    p
                }[..]
            )
        );
        s.begin(Some(&id(3)), true, true);
        s.stage_delta("a", 2, &d);
        s.begin(Some(&id(3)), true, true);
        assert_eq!(
            s.get("a", 2).map(|p| p[0]),
            Some(5),
            "not committed: not applied"
        );
    }

    #[test]
    fn at_the_bound_known_pages_stay_and_new_ones_stay_out() {
        // 16 pages: 2 held back for the new versions of known pages
        let mut s = Shadow::new(16 * PAGE);
        s.begin(None, true, true);
        for p in 0..20 {
            s.stage("a", p, &[p as u8; PAGE]);
        }
        s.commit(id(1), &[]);
        assert_eq!(s.len(), 14, "new pages stop below the reserve");
        assert!(s.get("a", 14).is_none());
        // a known page that changes keeps its place; a new one stays out
        s.begin(Some(&id(1)), true, true);
        s.stage("a", 3, &[42u8; PAGE]);
        s.stage("a", 15, &[15u8; PAGE]);
        s.commit(id(2), &[]);
        assert_eq!(s.get("a", 3), Some(&[42u8; PAGE][..]));
        assert!(s.get("a", 15).is_none());
        assert_eq!(s.len(), 14);
        // more known pages changed than the reserve holds: the one past it
        // is forgotten, never kept stale, and the others are kept
        s.begin(Some(&id(2)), true, true);
        for p in 0..3 {
            s.stage("a", p, &[100 + p as u8; PAGE]);
        }
        s.commit(id(3), &[]);
        let kept: Vec<u64> = (0..3).filter(|&p| s.get("a", p).is_some()).collect();
        for &p in &kept {
            assert_eq!(s.get("a", p), Some(&[100 + p as u8; PAGE][..]));
        }
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!(s.len(), 13);
        let mut off = Shadow::new(0);
        off.begin(None, true, true);
        off.stage("a", 1, &[1u8; PAGE]);
        off.commit(id(1), &[]);
        assert!(off.get("a", 1).is_none(), "0: no shadow");
    }
}
