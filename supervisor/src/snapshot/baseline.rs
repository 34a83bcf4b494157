//! What the app's memfds held when it started from a snapshot: the
//! snapshot's id and, per region, the hash of every non-zero page.  The
//! first snapshot of such an incarnation would otherwise be full (the agent
//! has just begun tracking, so what was written before is unknown); with a
//! baseline it reads every page as a full one does but keeps only the pages
//! whose content differs from the snapshot it started from, and is a delta
//! of it (docs/snapshots.md, "The first snapshot after a restore").  The
//! comparison is by content, so it is right whatever the app wrote before
//! the agent's tracking began.

use std::path::PathBuf;

use crate::store::{Hash, RegionMeta, SnapshotId};

#[derive(Debug, Clone)]
pub struct BaseRegion {
    pub meta: RegionMeta,
    /// Non-zero pages and their chunks' blake3, ascending by page.
    pub pages: Vec<(u64, Hash)>,
}

#[derive(Debug, Clone)]
pub struct Baseline {
    /// The store the snapshot is in: a delta's parent must be in the store
    /// the delta is written to.
    pub dir: PathBuf,
    pub id: SnapshotId,
    pub regions: Vec<BaseRegion>,
}

impl Baseline {
    /// The pages of the region of the same shape (kind, name, address,
    /// size), if the snapshot had one: a region of another shape is not
    /// inherited by a delta (store/writer.rs) and is read whole.
    pub fn region_like(&self, meta: &RegionMeta) -> Option<&[(u64, Hash)]> {
        self.regions
            .iter()
            .find(|r| r.meta.same_shape(meta))
            .map(|r| r.pages.as_slice())
    }

    /// Every page the baseline holds, for events.
    pub fn page_count(&self) -> u64 {
        self.regions.iter().map(|r| r.pages.len() as u64).sum()
    }
}

/// A cursor over one region's baseline pages, for a pass over the region
/// in ascending page order: each page's baseline hash in amortized O(1).
pub struct BaseCursor<'a> {
    pages: &'a [(u64, Hash)],
    at: usize,
}

impl<'a> BaseCursor<'a> {
    pub fn new(pages: &'a [(u64, Hash)]) -> Self {
        BaseCursor { pages, at: 0 }
    }

    /// The baseline pages below `page` not yet passed (the caller saw no
    /// data there: they are zero now), then `page`'s own hash if it has one.
    pub fn advance_to(&mut self, page: u64, skipped: &mut Vec<u64>) -> Option<&'a Hash> {
        while self.at < self.pages.len() && self.pages[self.at].0 < page {
            skipped.push(self.pages[self.at].0);
            self.at += 1;
        }
        match self.pages.get(self.at) {
            Some((p, h)) if *p == page => {
                self.at += 1;
                Some(h)
            }
            _ => None,
        }
    }

    /// Passes the baseline pages below `page` without reporting them (the
    /// caller has looked at them another way).
    pub fn skip_below(&mut self, page: u64) {
        while self.at < self.pages.len() && self.pages[self.at].0 < page {
            self.at += 1;
        }
    }

    /// The baseline pages not yet passed (after the region's last data).
    pub fn rest(&mut self, skipped: &mut Vec<u64>) {
        skipped.extend(self.pages[self.at..].iter().map(|(p, _)| *p));
        self.at = self.pages.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_reports_pages_without_data_and_hashes_of_pages_with() {
        let h = |b: u8| [b; 32];
        let pages = vec![(1, h(1)), (3, h(3)), (4, h(4)), (9, h(9))];
        let mut c = BaseCursor::new(&pages);
        let mut gone = Vec::new();
        assert_eq!(c.advance_to(0, &mut gone), None);
        assert_eq!(c.advance_to(3, &mut gone), Some(&h(3)));
        assert_eq!(gone, vec![1]);
        assert_eq!(c.advance_to(5, &mut gone), None);
        assert_eq!(gone, vec![1, 4]);
        c.rest(&mut gone);
        assert_eq!(gone, vec![1, 4, 9]);
        c.rest(&mut gone);
        assert_eq!(gone, vec![1, 4, 9]);
        // an extent [1, 5) looked at another way: only 0 and 9 are outside
        let mut c = BaseCursor::new(&pages);
        let mut out = Vec::new();
        c.advance_to(1, &mut out);
        c.skip_below(5);
        c.rest(&mut out);
        assert_eq!(out, vec![9]);
    }
}
