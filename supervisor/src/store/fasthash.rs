//! The hasher of the store's big in-memory tables: the chunk index (keys
//! are blake3 hashes) and a snapshot's page tables (keys are page numbers),
//! each hundreds of thousands of entries at a few GiB of arena.  std's
//! SipHash spent most of the time it took to open a snapshot for a restore;
//! these keys need no such strength: blake3 output is uniform and no one
//! chooses a page number.  A per-table random seed still keeps the bucket
//! positions unpredictable from outside.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// A `HashMap` with the seeded multiplicative hasher below.
pub type FastMap<K, V> = HashMap<K, V, Seeded>;

/// A `HashSet` with the same hasher (gc's set of the chunks kept snapshots
/// reference: every chunk of the store, at each retention).
pub type FastSet<K> = std::collections::HashSet<K, Seeded>;

/// Builds `Mix` hashers with one random seed per table.
#[derive(Clone, Copy)]
pub struct Seeded(u64);

impl Default for Seeded {
    fn default() -> Self {
        // RandomState draws its keys from the OS once per process and
        // varies them per instance: a cheap source of a random u64
        Seeded(std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64) | 1)
    }
}

impl BuildHasher for Seeded {
    type Hasher = Mix;
    fn build_hasher(&self) -> Mix {
        Mix(self.0)
    }
}

/// Word-at-a-time multiply-rotate (the FxHash recipe, seeded).
pub struct Mix(u64);

const K: u64 = 0x517c_c1b7_2722_0a95;

impl Mix {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
    }
}

impl Hasher for Mix {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    fn finish(&self) -> u64 {
        // hashbrown takes the bucket from the low bits and a tag from the
        // top 7: fold the well-mixed high half down
        self.0 ^ (self.0 >> 29)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_keys_hash_alike_and_tables_work() {
        let s = Seeded::default();
        let a = [7u8; 32];
        assert_eq!(s.hash_one(a), s.hash_one(a));
        assert_ne!(s.hash_one(1u64), s.hash_one(2u64));
        let mut m: FastMap<u64, u64> = FastMap::default();
        for i in 0..100_000u64 {
            m.insert(i, i * 3);
        }
        assert_eq!(m.len(), 100_000);
        assert!((0..100_000u64).all(|i| m.get(&i) == Some(&(i * 3))));
    }
}
