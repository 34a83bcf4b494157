//! Pages copied out of the app's memfds for the snapshot being taken, held
//! until the cut is complete so that a page copied twice (before the cut and
//! again during it) is written to the store once.  Bounded: when it is full
//! its pages go to the store writer early (a page staged again later simply
//! replaces the one written: the writer keeps the last).
//!
//! One staging serves the engine's snapshots one after the other, and keeps
//! its memory between them up to `KEEP_BYTES`: a group commit copies its
//! pages while the app is stopped, and memory new to the process costs a
//! page fault and the kernel's zeroing per page, more than the copy itself.

use crate::store::fasthash::FastMap;

/// Memory kept between snapshots at most; a larger staging gives it back.
const KEEP_BYTES: usize = 16 << 20;

pub const PAGE: usize = 4096;

pub struct Staging {
    data: Vec<u8>,
    keys: Vec<(u32, u64)>,
    slot: FastMap<(u32, u64), usize>,
    cap_pages: usize,
    /// Most bytes held at once during this snapshot.
    pub peak_bytes: usize,
}

impl Staging {
    pub fn new(cap_bytes: usize) -> Staging {
        Staging {
            data: Vec::new(),
            keys: Vec::new(),
            slot: FastMap::default(),
            cap_pages: (cap_bytes / PAGE).max(1),
            peak_bytes: 0,
        }
    }

    /// Empty, for a new snapshot bounded by `cap_bytes`.
    pub fn begin(&mut self, cap_bytes: usize) {
        self.keys.clear();
        self.slot.clear();
        self.data.clear();
        self.cap_pages = (cap_bytes / PAGE).max(1);
        self.peak_bytes = 0;
    }

    /// After a snapshot: more memory than `KEEP_BYTES` goes back.
    pub fn trim(&mut self) {
        if self.data.capacity() > KEEP_BYTES {
            self.data = Vec::new();
            self.keys = Vec::new();
            self.slot = FastMap::default();
        }
    }

    pub fn is_full(&self) -> bool {
        self.keys.len() >= self.cap_pages
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Copies one page in (replacing an earlier copy of the same page).
    /// The caller flushes first when `is_full`.
    pub fn put(&mut self, region: u32, page: u64, bytes: &[u8]) {
        debug_assert_eq!(bytes.len(), PAGE);
        if let Some(&i) = self.slot.get(&(region, page)) {
            self.data[i * PAGE..(i + 1) * PAGE].copy_from_slice(bytes);
            return;
        }
        let i = self.keys.len();
        self.keys.push((region, page));
        self.slot.insert((region, page), i);
        self.data.extend_from_slice(bytes);
        self.peak_bytes = self.peak_bytes.max(self.data.len());
    }

    /// Every page held, then empty (the memory is kept for the next use).
    pub fn drain(
        &mut self,
        mut f: impl FnMut(u32, u64, &[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        let r = self
            .keys
            .iter()
            .enumerate()
            .try_for_each(|(i, &(region, page))| {
                f(region, page, &self.data[i * PAGE..(i + 1) * PAGE])
            });
        self.keys.clear();
        self.slot.clear();
        self.data.clear();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staging_serves_the_next_snapshot_and_gives_back_what_is_large() {
        let mut s = Staging::new(4 * PAGE);
        s.put(0, 1, &[1u8; PAGE]);
        s.begin(2 * PAGE);
        assert!(
            s.is_empty() && s.peak_bytes == 0,
            "begin forgets the last snapshot's pages"
        );
        s.put(0, 2, &[2u8; PAGE]);
        s.put(0, 3, &[3u8; PAGE]);
        assert!(s.is_full(), "the new bound holds");
        s.trim();
        assert_eq!(s.len(), 2, "a small staging keeps its memory");
        let mut big = Staging::new(KEEP_BYTES * 2);
        for p in 0..(KEEP_BYTES / PAGE + 1) as u64 {
            big.put(0, p, &[1u8; PAGE]);
        }
        big.drain(|_, _, _| Ok(()))
            .unwrap_or_else(|e| panic!("{e}"));
        big.trim();
        assert_eq!(big.data.capacity(), 0);
    }

    #[test]
    fn the_last_copy_of_a_page_wins_and_the_bound_holds() {
        let mut s = Staging::new(3 * PAGE);
        s.put(0, 1, &[1u8; PAGE]);
        s.put(0, 2, &[2u8; PAGE]);
        s.put(0, 1, &[9u8; PAGE]);
        assert_eq!(s.len(), 2);
        assert!(!s.is_full());
        s.put(1, 1, &[3u8; PAGE]);
        assert!(s.is_full());
        let mut seen = Vec::new();
        s.drain(|r, p, b| {
            seen.push((r, p, b[0]));
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(seen, vec![(0, 1, 9), (0, 2, 2), (1, 1, 3)]);
        assert!(s.is_empty());
        assert_eq!(s.peak_bytes, 3 * PAGE);
    }
}
