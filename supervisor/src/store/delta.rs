//! The bytes that changed between two versions of a page: what a journal
//! record holds of a page the engine's shadow knows (docs/store.md, "Delta
//! records").  A SET in rkv changes about 100 bytes of a page; hashed and
//! compressed whole, the page cost the engine about 12 us of CPU, where
//! finding and copying the changed bytes costs one to two (`store_bench`'s
//! `page_delta_cost`).
//!
//! ```text
//! delta   run count u16, then each run: offset u16, length u16, the new bytes
//! ```
//!
//! Runs are in page order, do not overlap or touch, lie inside the page and
//! are not empty; `check` and `apply` refuse anything else, so a damaged
//! delta is never applied in part.

use thiserror::Error;

use super::format::PAGE;

/// Equal bytes fewer than this between two changed stretches are carried
/// inside one run: a run's header is 4 bytes, and a split costs a header.
pub const GAP: usize = 16;

/// The block compared at once while looking for a change.
const BLOCK: usize = 64;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DeltaError {
    #[error("delta cut short")]
    Truncated,
    #[error("delta run at {off} of {len} bytes is empty or past the page")]
    RunOutsidePage { off: usize, len: usize },
    #[error("delta run at {off} overlaps or touches the run before it")]
    RunsOutOfOrder { off: usize },
    #[error("{0} bytes after the delta's last run")]
    Trailing(usize),
}

/// Where the first differing byte of two equal-length slices is, if any.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Appends the delta that turns `old` into `new` (both one page) to `out`
/// and returns its length, or returns None with `out` as it was when the
/// delta would be longer than `max` bytes (the whole page is then the
/// better record).  Equal pages give a delta of no runs (2 bytes).
pub fn encode(old: &[u8], new: &[u8], max: usize, out: &mut Vec<u8>) -> Option<usize> {
    assert!(
        old.len() == PAGE && new.len() == PAGE,
        "a delta is of whole pages"
    );
    let start_len = out.len();
    out.extend_from_slice(&0u16.to_le_bytes());
    let mut runs: u16 = 0;
    let mut i = 0;
    while i < PAGE {
        let k = (PAGE - i).min(BLOCK);
        // equal blocks are the common case: a slice compare (memcmp)
        // skips them at a fraction of the cost of finding the byte
        if old[i..i + k] == new[i..i + k] {
            i += k;
            continue;
        }
        let Some(d) = first_difference(&old[i..i + k], &new[i..i + k]) else {
            i += k;
            continue;
        };
        let start = i + d;
        // the run ends before the first GAP equal bytes after a change
        let (mut end, mut j) = (start + 1, start + 1);
        while j < PAGE && j - end < GAP {
            if old[j] != new[j] {
                end = j + 1;
            }
            j += 1;
        }
        out.extend_from_slice(&(start as u16).to_le_bytes());
        out.extend_from_slice(&((end - start) as u16).to_le_bytes());
        out.extend_from_slice(&new[start..end]);
        runs += 1;
        if out.len() - start_len > max {
            out.truncate(start_len);
            return None;
        }
        // the bytes up to j are equal: the next run starts after them
        i = j;
    }
    out[start_len..start_len + 2].copy_from_slice(&runs.to_le_bytes());
    Some(out.len() - start_len)
}

fn u16_at(d: &[u8], at: usize) -> Result<usize, DeltaError> {
    d.get(at..at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
        .ok_or(DeltaError::Truncated)
}

/// Calls `f` with each run of a delta (its offset, the new bytes), in
/// order, checking each as it is read: an error stops the walk.
fn walk(delta: &[u8], mut f: impl FnMut(usize, &[u8])) -> Result<(), DeltaError> {
    let runs = u16_at(delta, 0)?;
    let mut at = 2;
    let mut next_free = 0; // where the next run may start at the earliest
    for _ in 0..runs {
        let off = u16_at(delta, at)?;
        let len = u16_at(delta, at + 2)?;
        if len == 0 || off + len > PAGE {
            return Err(DeltaError::RunOutsidePage { off, len });
        }
        if off < next_free {
            return Err(DeltaError::RunsOutOfOrder { off });
        }
        let bytes = delta
            .get(at + 4..at + 4 + len)
            .ok_or(DeltaError::Truncated)?;
        f(off, bytes);
        at += 4 + len;
        next_free = off + len + 1;
    }
    match delta.len() - at {
        0 => Ok(()),
        t => Err(DeltaError::Trailing(t)),
    }
}

/// Checks a delta's structure (a journal record's, before anything is
/// applied).
pub fn check(delta: &[u8]) -> Result<(), DeltaError> {
    walk(delta, |_, _| {})
}

/// Applies a delta to a page; a delta that fails `check` changes nothing.
pub fn apply(page: &mut [u8], delta: &[u8]) -> Result<(), DeltaError> {
    assert_eq!(page.len(), PAGE, "a delta is applied to a whole page");
    check(delta)?;
    walk(delta, |off, bytes| {
        page[off..off + bytes.len()].copy_from_slice(bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    fn round_trip(old: &[u8], new: &[u8]) -> usize {
        let mut d = Vec::new();
        let n = encode(old, new, PAGE * 2, &mut d).unwrap_or_else(|| panic!("fits"));
        assert_eq!(n, d.len());
        check(&d).unwrap_or_else(|e| panic!("{e}"));
        let mut p = old.to_vec();
        apply(&mut p, &d).unwrap_or_else(|e| panic!("{e}"));
        assert!(p == new, "apply(old, encode(old, new)) is new");
        d.len()
    }

    #[test]
    fn equal_pages_give_no_runs_and_one_changed_value_one_run() {
        let old = vec![b'x'; PAGE];
        assert_eq!(round_trip(&old, &old), 2);
        let mut new = old.clone();
        new[1000..1100].fill(b'y');
        assert_eq!(round_trip(&old, &new), 2 + 4 + 100);
        // changes closer than GAP share a run; farther ones do not
        new[1100 + GAP - 1] = b'z';
        assert_eq!(round_trip(&old, &new), 2 + 4 + 100 + GAP);
        let mut far = old.clone();
        far[0] = 1;
        far[1 + GAP] = 2;
        far[PAGE - 1] = 3;
        assert_eq!(round_trip(&old, &far), 2 + 3 * 5);
    }

    #[test]
    fn random_changes_round_trip() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for case in 0..2000 {
            let mut old = vec![0u8; PAGE];
            old.iter_mut().for_each(|b| *b = xorshift(&mut x) as u8 % 4);
            let mut new = old.clone();
            for _ in 0..(case % 40) {
                let at = (xorshift(&mut x) % PAGE as u64) as usize;
                let len = ((xorshift(&mut x) % 200) as usize).min(PAGE - at);
                new[at..at + len]
                    .iter_mut()
                    .for_each(|b| *b = xorshift(&mut x) as u8);
            }
            round_trip(&old, &new);
        }
    }

    #[test]
    fn a_delta_longer_than_max_is_refused_and_out_is_kept() {
        let old = vec![0u8; PAGE];
        let new = vec![1u8; PAGE];
        let mut out = vec![7u8; 3];
        assert_eq!(encode(&old, &new, PAGE / 4, &mut out), None);
        assert_eq!(out, vec![7u8; 3]);
        assert!(encode(&old, &new, PAGE + 6, &mut out).is_some());
        assert_eq!(&out[..3], &[7u8; 3]);
    }

    #[test]
    fn damaged_deltas_are_refused_whole() {
        let old = vec![0u8; PAGE];
        let mut new = old.clone();
        new[10..20].fill(1);
        new[100..110].fill(2);
        let mut d = Vec::new();
        encode(&old, &new, PAGE, &mut d).unwrap_or_else(|| panic!("fits"));
        let refused = |bad: &[u8], want: DeltaError| {
            let mut p = old.clone();
            assert_eq!(apply(&mut p, bad), Err(want.clone()));
            assert_eq!(check(bad), Err(want));
            assert!(p == old, "nothing applied");
        };
        refused(&d[..d.len() - 1], DeltaError::Truncated);
        refused(&d[..1], DeltaError::Truncated);
        let mut longer = d.clone();
        longer.push(0);
        refused(&longer, DeltaError::Trailing(1));
        let mut past = d.clone();
        past[2..4].copy_from_slice(&(PAGE as u16 - 5).to_le_bytes());
        refused(
            &past,
            DeltaError::RunOutsidePage {
                off: PAGE - 5,
                len: 10,
            },
        );
        let mut empty = d.clone();
        empty[4..6].copy_from_slice(&0u16.to_le_bytes());
        refused(&empty, DeltaError::RunOutsidePage { off: 10, len: 0 });
        // the second run moved onto the first
        let second = 2 + 4 + 10;
        let mut back = d.clone();
        back[second..second + 2].copy_from_slice(&15u16.to_le_bytes());
        refused(&back, DeltaError::RunsOutOfOrder { off: 15 });
    }
}
