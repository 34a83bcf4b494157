//! The snapshot store through its Rust API (`rekindle::store`): round trips
//! of full and delta snapshots, folding, dedup, zero pages, regions that
//! change shape, retention that folds, gc, corruption detected by code.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rekindle::store::{
    NewSnapshot, PAGE, RegionKind, RegionMeta, Retention, SnapshotId, Store, StoreError,
};

/// A store path inside a temporary directory removed when the guard drops.
fn tmp(tag: &str) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::Builder::new()
        .prefix(&format!("rekindle-store-{tag}-"))
        .tempdir()
        .unwrap_or_else(|e| panic!("{e}"));
    let p = t.path().join("store");
    (t, p)
}

fn region(name: &str, addr: u64, size: u64) -> RegionMeta {
    RegionMeta {
        kind: RegionKind::Arena,
        name: name.into(),
        addr,
        size,
        layout: serde_json::json!({"t": name}),
    }
}

/// Deterministic page content: `seed` picks it; 0 is the zero page.
fn page(seed: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    if seed != 0 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for b in p.iter_mut().step_by(7) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    p
}

fn snap(parent: Option<&SnapshotId>, regions: Vec<RegionMeta>) -> NewSnapshot {
    NewSnapshot {
        parent: parent.cloned(),
        full: parent.is_none(),
        epoch: 1,
        generation: 2,
        app: "test".into(),
        tags: vec![],
        regions,
        redo: None,
    }
}

/// Writes pages (region, page, seed) and commits.
fn write(store: &mut Store, meta: NewSnapshot, pages: &[(u32, u64, u64)]) -> SnapshotId {
    let mut w = store.begin(meta).unwrap_or_else(|e| panic!("begin: {e}"));
    for &(r, p, seed) in pages {
        w.put_page(r, p, &page(seed))
            .unwrap_or_else(|e| panic!("put: {e}"));
    }
    w.commit().unwrap_or_else(|e| panic!("commit: {e}")).id
}

/// gc with `--keep N`.
fn keep_last(store: &mut Store, n: usize) -> rekindle::store::GcReport {
    store
        .gc(
            &Retention {
                keep_last: Some(n),
                ..Default::default()
            },
            &mut |_| {},
        )
        .unwrap_or_else(|e| panic!("gc: {e}"))
}

/// Every page of every region of a snapshot, as seeds are hard to invert:
/// the raw bytes.
fn contents(store: &Store, id: &SnapshotId) -> Vec<Vec<u8>> {
    let r = store
        .open_snapshot(id)
        .unwrap_or_else(|e| panic!("open {id}: {e}"));
    let mut out = Vec::new();
    for (i, m) in r.regions().iter().enumerate() {
        let mut all = vec![0u8; m.page_count() as usize * PAGE];
        for (p, chunk) in all.chunks_mut(PAGE).enumerate() {
            r.read_page(i as u32, p as u64, chunk)
                .unwrap_or_else(|e| panic!("read: {e}"));
        }
        out.push(all);
    }
    out
}

fn expect(seeds: &[u64]) -> Vec<u8> {
    seeds.iter().flat_map(|&s| page(s)).collect()
}

#[test]
fn full_then_deltas_fold_to_the_latest_pages() {
    let (_t_dir, dir) = tmp("fold");
    let mut s = Store::create_or_open(&dir).unwrap();
    let regs = vec![
        region("a", 0x10000, 4 * PAGE as u64),
        region("b", 0x90000, 2 * PAGE as u64),
    ];
    let s1 = write(
        &mut s,
        snap(None, regs.clone()),
        &[(0, 0, 1), (0, 1, 2), (0, 3, 3), (1, 0, 4)],
    );
    let s2 = write(
        &mut s,
        snap(Some(&s1), regs.clone()),
        &[(0, 1, 5), (1, 1, 6)],
    );
    // page 0 of a becomes zero; page 3 changes
    let s3 = write(
        &mut s,
        snap(Some(&s2), regs.clone()),
        &[(0, 0, 0), (0, 3, 7)],
    );
    assert_eq!(
        contents(&s, &s1),
        vec![expect(&[1, 2, 0, 3]), expect(&[4, 0])]
    );
    assert_eq!(
        contents(&s, &s2),
        vec![expect(&[1, 5, 0, 3]), expect(&[4, 6])]
    );
    assert_eq!(
        contents(&s, &s3),
        vec![expect(&[0, 5, 0, 7]), expect(&[4, 6])]
    );
    let r = s.open_snapshot(&s3).unwrap();
    assert_eq!(r.pages(0).collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!(r.info().parent.as_ref(), Some(&s2));
    assert!(!r.info().full);
    assert_eq!((r.info().epoch, r.info().generation), (1, 2));
    // the same from a fresh open (indexes loaded from the packs)
    let s = Store::open(&dir).unwrap();
    assert_eq!(
        contents(&s, &s3),
        vec![expect(&[0, 5, 0, 7]), expect(&[4, 6])]
    );
    assert_eq!(
        s.list()
            .unwrap()
            .iter()
            .map(|i| i.id.clone())
            .collect::<Vec<_>>(),
        vec![s1, s2, s3.clone()]
    );
    assert_eq!(s.resolve("latest").unwrap(), s3);
    assert!(s.verify(&mut |_| {}).unwrap().ok());
}

#[test]
fn a_store_opened_without_its_indexes_reads_the_same_and_writes_with_dedup() {
    let (_t_dir, dir) = tmp("unindexed");
    let mut s = Store::create_or_open(&dir).unwrap();
    let regs = vec![
        region("a", 0x10000, 64 * PAGE as u64),
        region("b", 0x90000, 8 * PAGE as u64),
    ];
    let full: Vec<(u32, u64, u64)> = (0..64).map(|p| (0, p, 100 + p)).collect();
    let s1 = write(&mut s, snap(None, regs.clone()), &full);
    let s2 = write(
        &mut s,
        snap(Some(&s1), regs.clone()),
        &[(0, 5, 7), (0, 63, 0), (1, 2, 8)],
    );
    let s3 = write(
        &mut s,
        snap(Some(&s2), regs.clone()),
        &[(0, 5, 9), (0, 6, 0), (1, 7, 101)],
    );
    let mut u = Store::open_unindexed(&dir).unwrap();
    for id in [&s1, &s2, &s3] {
        assert_eq!(contents(&u, id), contents(&s, id), "{id}");
    }
    let mut a = expect(&(100..164).collect::<Vec<_>>());
    a[5 * PAGE..6 * PAGE].copy_from_slice(&page(9));
    a[6 * PAGE..7 * PAGE].fill(0);
    a[63 * PAGE..].fill(0);
    assert_eq!(
        contents(&u, &s3),
        vec![a, expect(&[0, 0, 8, 0, 0, 0, 0, 101])]
    );
    // a writer on it dedups against every chunk already stored
    let mut w = u.begin(snap(Some(&s3), regs.clone())).unwrap();
    w.put_page(0, 1, &page(120)).unwrap();
    w.put_page(1, 0, &page(7)).unwrap();
    let st = w.stats();
    assert_eq!((st.dedup_hits, st.new_chunks), (2, 0));
    w.commit().unwrap();
}

#[test]
fn a_page_in_two_regions_and_two_snapshots_is_stored_once() {
    let (_t_dir, dir) = tmp("dedup");
    let mut s = Store::create_or_open(&dir).unwrap();
    let regs = vec![
        region("a", 0x10000, 4 * PAGE as u64),
        region("b", 0x90000, 4 * PAGE as u64),
    ];
    let mut w = s.begin(snap(None, regs.clone())).unwrap();
    for (r, p) in [(0, 0), (0, 1), (1, 2), (1, 3)] {
        w.put_page(r, p, &page(42)).unwrap();
    }
    w.put_page(0, 2, &page(0)).unwrap();
    let st = w.stats();
    assert_eq!(
        (st.pages_put, st.new_chunks, st.dedup_hits, st.zero_pages),
        (5, 1, 3, 1)
    );
    let s1 = w.commit().unwrap().id;
    let mut w = s.begin(snap(None, regs.clone())).unwrap();
    w.put_page(1, 0, &page(42)).unwrap();
    let st = w.stats();
    assert_eq!((st.new_chunks, st.dedup_hits), (0, 1));
    let s2 = w.commit().unwrap();
    assert_eq!(s2.new_bytes_compressed, 0);
    let packs: Vec<_> = std::fs::read_dir(dir.join("packs")).unwrap().collect();
    assert_eq!(packs.len(), 1, "the second snapshot wrote no pack");
    assert_eq!(contents(&s, &s1)[1], expect(&[0, 0, 42, 42]));
    assert_eq!(contents(&s, &s2.id)[1], expect(&[42, 0, 0, 0]));
}

#[test]
fn zero_pages_are_never_stored() {
    let (_t_dir, dir) = tmp("zero");
    let mut s = Store::create_or_open(&dir).unwrap();
    let mut w = s
        .begin(snap(None, vec![region("a", 0, 64 * PAGE as u64)]))
        .unwrap();
    w.put_bytes(0, &vec![0u8; 64 * PAGE]).unwrap();
    assert_eq!(w.stats().zero_pages, 64);
    let id = w.commit().unwrap();
    assert_eq!((id.pages, id.new_bytes_compressed), (0, 0));
    assert!(!dir.join("packs").read_dir().unwrap().any(|_| true));
    let r = s.open_snapshot(&id.id).unwrap();
    assert_eq!(r.pages(0).count(), 0);
    let mut out = vec![1u8; PAGE];
    r.read_page(0, 63, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0));
}

#[test]
fn a_region_that_changes_shape_inherits_nothing() {
    let (_t_dir, dir) = tmp("shape");
    let mut s = Store::create_or_open(&dir).unwrap();
    let s1 = write(
        &mut s,
        snap(
            None,
            vec![
                region("a", 0x1000, 2 * PAGE as u64),
                region("b", 0x9000, PAGE as u64),
            ],
        ),
        &[(0, 0, 1), (0, 1, 2), (1, 0, 3)],
    );
    // a grows, b moves: neither inherits; c is new
    let regs = vec![
        region("a", 0x1000, 3 * PAGE as u64),
        region("b", 0xa000, PAGE as u64),
        region("c", 0x20000, PAGE as u64),
    ];
    let s2 = write(&mut s, snap(Some(&s1), regs.clone()), &[(0, 2, 4)]);
    assert_eq!(
        contents(&s, &s2),
        vec![expect(&[0, 0, 4]), expect(&[0]), expect(&[0])]
    );
    // the same shape again inherits from s2
    let s3 = write(&mut s, snap(Some(&s2), regs), &[(2, 0, 5)]);
    assert_eq!(
        contents(&s, &s3),
        vec![expect(&[0, 0, 4]), expect(&[0]), expect(&[5])]
    );
    // put_bytes: whole region, no inheritance even with the same shape
    let regs = vec![region("a", 0x1000, 3 * PAGE as u64)];
    let mut w = s.begin(snap(Some(&s3), regs)).unwrap();
    w.put_bytes(0, &page(9)[..100]).unwrap();
    let s4 = w.commit().unwrap().id;
    let mut want = vec![0u8; 3 * PAGE];
    want[..100].copy_from_slice(&page(9)[..100]);
    assert_eq!(contents(&s, &s4), vec![want]);
}

#[test]
fn bad_arguments_are_refused_with_codes() {
    let (_t_dir, dir) = tmp("args");
    let mut s = Store::create_or_open(&dir).unwrap();
    let regs = vec![region("a", 0, 2 * PAGE as u64)];
    let code = |r: Result<(), StoreError>| r.err().map(|e| e.code());
    let mut w = s.begin(snap(None, regs.clone())).unwrap();
    assert_eq!(code(w.put_page(1, 0, &page(1))), Some("invalid_argument"));
    assert_eq!(code(w.put_page(0, 2, &page(1))), Some("invalid_argument"));
    assert_eq!(
        code(w.put_page(0, 0, &page(1)[..100])),
        Some("invalid_argument")
    );
    assert_eq!(
        code(w.put_bytes(0, &vec![1u8; 3 * PAGE])),
        Some("invalid_argument")
    );
    w.abort();
    let delta_without_parent = NewSnapshot {
        full: false,
        ..snap(None, regs.clone())
    };
    assert_eq!(
        s.begin(delta_without_parent).err().map(|e| e.code()),
        Some("invalid_argument")
    );
    let missing = SnapshotId::new(99, std::time::SystemTime::now());
    assert_eq!(
        s.begin(snap(Some(&missing), regs.clone()))
            .err()
            .map(|e| e.code()),
        Some("missing_parent")
    );
    let mut twice = snap(None, vec![region("a", 0, 4096), region("a", 8192, 4096)]);
    assert_eq!(
        s.begin(twice.clone()).err().map(|e| e.code()),
        Some("invalid_argument")
    );
    twice.regions.pop();
    twice.tags = vec!["has space".into()];
    assert_eq!(
        s.begin(twice).err().map(|e| e.code()),
        Some("invalid_argument")
    );
    assert_eq!(s.resolve("nope").err().map(|e| e.code()), Some("not_found"));
    assert_eq!(
        s.list().unwrap().len(),
        0,
        "nothing published by the aborted writer"
    );
    assert!(
        !dir.join("tmp").read_dir().unwrap().any(|_| true),
        "abort leaves no temp file"
    );
}

#[test]
fn one_writer_at_a_time() {
    let (_t_dir, dir) = tmp("lock");
    let mut a = Store::create_or_open(&dir).unwrap();
    let mut b = Store::open(&dir).unwrap();
    let w = a.begin(snap(None, vec![region("a", 0, 4096)])).unwrap();
    assert_eq!(
        b.begin(snap(None, vec![region("a", 0, 4096)]))
            .err()
            .map(|e| e.code()),
        Some("locked")
    );
    assert_eq!(
        b.gc(&Retention::default(), &mut |_| {})
            .err()
            .map(|e| e.code()),
        Some("locked")
    );
    w.abort();
    assert!(b.begin(snap(None, vec![region("a", 0, 4096)])).is_ok());
}

#[test]
fn retention_folds_children_and_keeps_every_kept_snapshot_identical() {
    let (_t_dir, dir) = tmp("retention");
    let mut s = Store::create_or_open(&dir).unwrap();
    let regs = vec![
        region("a", 0x1000, 8 * PAGE as u64),
        region("b", 0x9000, 2 * PAGE as u64),
    ];
    let mut ids = vec![write(
        &mut s,
        snap(None, regs.clone()),
        &[(0, 0, 1), (0, 1, 2), (1, 0, 3)],
    )];
    for i in 0..6u64 {
        let prev = ids.last().cloned();
        let pages = [
            (0, i % 8, 10 + i),
            (0, 7, if i % 2 == 0 { 0 } else { 20 + i }),
            (1, 1, 30 + i),
        ];
        ids.push(write(&mut s, snap(prev.as_ref(), regs.clone()), &pages));
    }
    let before: Vec<_> = ids.iter().map(|id| contents(&s, id)).collect();
    let dry = s
        .gc(
            &Retention {
                keep_last: Some(3),
                dry_run: true,
                ..Default::default()
            },
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(dry.deleted, ids[..4].to_vec());
    assert_eq!(s.list().unwrap().len(), 7, "a dry run changes nothing");
    let rep = keep_last(&mut s, 3);
    assert_eq!(rep.deleted, ids[..4].to_vec());
    assert_eq!(rep.kept, ids[4..].to_vec());
    assert_eq!(
        rep.rewritten,
        vec![ids[4].clone()],
        "only the oldest kept one loses its parent"
    );
    assert!(rep.freed_bytes > 0);
    let s = Store::open(&dir).unwrap();
    for (i, id) in ids.iter().enumerate().skip(4) {
        assert_eq!(contents(&s, id), before[i], "{id} restores as before");
    }
    let list = s.list().unwrap();
    assert!(list[0].full && !list[1].full && !list[2].full);
    let v = s.verify(&mut |_| {}).unwrap();
    assert!(
        v.ok() && v.leftovers.is_empty(),
        "{:?} {:?}",
        v.errors,
        v.leftovers
    );
}

#[test]
fn gc_frees_unreferenced_packs_and_leftovers_and_nothing_else() {
    let (_t_dir, dir) = tmp("gc");
    let mut s = Store::create_or_open(&dir).unwrap();
    let regs = vec![region("a", 0x1000, 4 * PAGE as u64)];
    let s1 = write(&mut s, snap(None, regs.clone()), &[(0, 0, 1), (0, 1, 2)]);
    // s2 replaces every page of s1: s1's pack dies with s1
    let s2 = write(&mut s, snap(None, regs.clone()), &[(0, 0, 3), (0, 1, 4)]);
    // s3 shares one chunk with s2 and adds one: s2's pack is partly live
    let s3 = write(&mut s, snap(None, regs.clone()), &[(0, 0, 3), (0, 1, 5)]);
    std::fs::write(dir.join("tmp/crashed.pack"), b"x").unwrap();
    std::fs::write(dir.join("snapshots/000000000000-x-0000.map"), b"x").unwrap();
    let pack = |id: &SnapshotId| dir.join("packs").join(format!("{id}.pack"));
    let size1 = std::fs::metadata(pack(&s1)).unwrap().len();
    let rep = keep_last(&mut s, 1);
    assert_eq!(rep.deleted, vec![s1.clone(), s2.clone()]);
    assert!(!pack(&s1).exists(), "dead pack removed");
    assert!(pack(&s2).exists() && pack(&s3).exists(), "live packs kept");
    assert_eq!(rep.partly_live.len(), 1);
    assert_eq!(rep.partly_live[0].0, format!("{s2}.pack"));
    assert!(rep.wasted_bytes > 0);
    assert!(rep.removed.iter().any(|p| p.ends_with("tmp/crashed.pack")));
    assert!(
        rep.removed
            .iter()
            .any(|p| p.ends_with("snapshots/000000000000-x-0000.map"))
    );
    assert!(rep.freed_bytes >= size1);
    assert_eq!(contents(&s, &s3), vec![expect(&[3, 5, 0, 0])]);
    // a second gc has nothing to do
    let again = keep_last(&mut s, 1);
    assert!(again.deleted.is_empty() && again.removed.is_empty());
    // tagged snapshots are kept whatever the policy
    let mut meta = snap(None, regs);
    meta.tags = vec!["keepme".into()];
    let t = write(&mut s, meta, &[(0, 0, 8)]);
    write(
        &mut s,
        snap(Some(&t), vec![region("a", 0x1000, 4 * PAGE as u64)]),
        &[(0, 1, 9)],
    );
    let rep = keep_last(&mut s, 1);
    assert!(rep.kept.contains(&t) && rep.deleted == vec![s3]);
    assert_eq!(s.resolve("keepme").unwrap(), t);
}

fn flip(path: &Path, at: u64) {
    let mut b = std::fs::read(path).unwrap();
    let i = (at as usize).min(b.len() - 1);
    b[i] ^= 0x10;
    std::fs::write(path, b).unwrap();
}

#[test]
fn damage_is_detected_with_its_code_and_older_snapshots_stay_readable() {
    let (_t_dir, dir) = tmp("damage");
    let mut s = Store::create_or_open(&dir).unwrap();
    let regs = vec![region("a", 0x1000, 4 * PAGE as u64)];
    let s1 = write(&mut s, snap(None, regs.clone()), &[(0, 0, 1), (0, 1, 2)]);
    let s2 = write(&mut s, snap(Some(&s1), regs.clone()), &[(0, 2, 3)]);
    let good = contents(&s, &s1);
    let pack2 = dir.join("packs").join(format!("{s2}.pack"));
    let man2 = dir.join("snapshots").join(format!("{s2}.json"));
    let orig_pack = std::fs::read(&pack2).unwrap();
    let orig_man = std::fs::read(&man2).unwrap();
    // the same code whether the store loaded every index or not
    let open_err = |dir: &Path, id: &SnapshotId| {
        let code = |s: Store| match s.open_snapshot(id) {
            Err(e) => e.code(),
            Ok(r) => {
                let mut p = vec![0u8; PAGE];
                r.read_page(0, 2, &mut p).err().map_or("ok", |e| e.code())
            }
        };
        let indexed = code(Store::open(dir).unwrap());
        assert_eq!(indexed, code(Store::open_unindexed(dir).unwrap()));
        indexed
    };
    // a flipped bit in the chunk
    flip(&pack2, 16 + 5);
    assert_eq!(open_err(&dir, &s2), "chunk_checksum");
    // a flipped bit in the index, in the trailer
    std::fs::write(&pack2, &orig_pack).unwrap();
    flip(&pack2, orig_pack.len() as u64 - 64 - 10);
    assert_eq!(open_err(&dir, &s2), "pack_corrupt");
    std::fs::write(&pack2, &orig_pack).unwrap();
    flip(&pack2, orig_pack.len() as u64 - 2);
    assert_eq!(open_err(&dir, &s2), "pack_corrupt");
    // truncated at every 97th offset
    for cut in (0..orig_pack.len()).step_by(97) {
        std::fs::write(&pack2, &orig_pack[..cut]).unwrap();
        assert_eq!(open_err(&dir, &s2), "pack_corrupt", "pack cut at {cut}");
    }
    std::fs::write(&pack2, &orig_pack).unwrap();
    // manifests: truncated, flipped
    for cut in (0..orig_man.len()).step_by(37) {
        std::fs::write(&man2, &orig_man[..cut]).unwrap();
        assert_eq!(
            open_err(&dir, &s2),
            "manifest_truncated",
            "manifest cut at {cut}"
        );
    }
    for at in (0..orig_man.len() - 80).step_by(53) {
        std::fs::write(&man2, &orig_man).unwrap();
        flip(&man2, at as u64);
        assert_eq!(
            open_err(&dir, &s2),
            "manifest_corrupt",
            "manifest flipped at {at}"
        );
    }
    std::fs::write(&man2, &orig_man).unwrap();
    // the page map
    let map = std::fs::read_dir(dir.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.to_string_lossy().contains(s2.as_str()) && p.extension().is_some_and(|e| e == "map")
        })
        .unwrap();
    flip(&map, 40);
    assert_eq!(open_err(&dir, &s2), "map_corrupt");
    // the older snapshot never stopped working
    let s = Store::open(&dir).unwrap();
    assert_eq!(contents(&s, &s1), good);
    let v = s.verify(&mut |_| {}).unwrap();
    assert_eq!(
        v.errors.iter().map(|e| e.code()).collect::<Vec<_>>(),
        vec!["map_corrupt"]
    );
    assert!(v.snapshots[0].restorable && !v.snapshots[1].restorable);
    // a missing parent
    std::fs::remove_file(dir.join("snapshots").join(format!("{s1}.json"))).unwrap();
    assert_eq!(open_err(&dir, &s2), "missing_parent");
    let seen: HashSet<&str> = v.errors.iter().map(|e| e.code()).collect();
    assert!(seen.contains("map_corrupt"));
}

#[test]
fn foreign_and_newer_stores_are_refused() {
    let (_t_dir, dir) = tmp("format");
    Store::create_or_open(&dir).unwrap();
    std::fs::write(dir.join("FORMAT"), "rekindle-store\nversion 2\n").unwrap();
    assert_eq!(
        Store::open(&dir).err().map(|e| e.code()),
        Some("store_newer_version")
    );
    std::fs::write(dir.join("FORMAT"), "something-else\n").unwrap();
    assert_eq!(
        Store::open(&dir).err().map(|e| e.code()),
        Some("store_foreign")
    );
    let (_t_other, other) = tmp("format-other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("data"), "x").unwrap();
    assert_eq!(
        Store::create_or_open(&other).err().map(|e| e.code()),
        Some("store_foreign")
    );
    assert_eq!(
        Store::open(&tmp("format-none").1).err().map(|e| e.code()),
        Some("not_found")
    );
}

#[test]
fn send_and_recv_round_trip_full_and_since() {
    let (_t_a, a) = tmp("send-a");
    let (_t_b, b) = tmp("send-b");
    let mut s = Store::create_or_open(&a).unwrap();
    let regs = vec![region("a", 0x1000, 4 * PAGE as u64)];
    let s1 = write(&mut s, snap(None, regs.clone()), &[(0, 0, 1), (0, 1, 2)]);
    let s2 = write(
        &mut s,
        snap(Some(&s1), regs.clone()),
        &[(0, 2, 3), (0, 0, 0)],
    );
    let s3 = write(&mut s, snap(Some(&s2), regs.clone()), &[(0, 3, 1)]);
    let mut buf = Vec::new();
    s.send(&s1, None, false, &mut buf, &mut |_| {}).unwrap();
    let mut r = Store::create_or_open(&b).unwrap();
    assert_eq!(
        r.recv(&mut &buf[..], &mut |_| {}).unwrap(),
        vec![s1.clone()]
    );
    let mut inc = Vec::new();
    s.send(&s3, Some(&s1), false, &mut inc, &mut |_| {})
        .unwrap();
    assert!(
        inc.len() < buf.len() + 2 * PAGE,
        "the increment carries only new chunks"
    );
    assert_eq!(
        r.recv(&mut &inc[..], &mut |_| {}).unwrap(),
        vec![s2.clone(), s3.clone()]
    );
    for id in [&s1, &s2, &s3] {
        assert_eq!(contents(&r, id), contents(&s, id));
    }
    // every prefix of a stream, and a flipped byte, publishes nothing new
    for cut in (0..inc.len()).step_by(211) {
        let (_t_c, c) = tmp("send-c");
        let mut t = Store::create_or_open(&c).unwrap();
        t.recv(&mut &buf[..], &mut |_| {}).unwrap();
        let e = t.recv(&mut &inc[..cut], &mut |_| {}).unwrap_err();
        assert!(
            ["stream_truncated", "stream_corrupt"].contains(&e.code()),
            "{cut}: {e}"
        );
        // a snapshot is published at its 'C' frame: a cut inside the
        // stream's final 'E' frame (kind, length, checksum: 37 bytes) has
        // both of its snapshots, and is still an error
        let n = t.list().unwrap().len();
        assert!(
            n == 1 || (n == 2 && cut > inc.len() / 2) || (n == 3 && cut >= inc.len() - 37),
            "cut {cut} of {}: {n} snapshots",
            inc.len()
        );
        assert!(t.verify(&mut |_| {}).unwrap().ok());
    }
    let mut bad = inc.clone();
    bad[40] ^= 1;
    let (_t_c, c) = tmp("send-d");
    let mut t = Store::create_or_open(&c).unwrap();
    t.recv(&mut &buf[..], &mut |_| {}).unwrap();
    assert_eq!(
        t.recv(&mut &bad[..], &mut |_| {}).unwrap_err().code(),
        "stream_corrupt"
    );
    assert_eq!(t.list().unwrap().len(), 1);
    // --since something that is not an ancestor
    let other = write(&mut s, snap(None, regs), &[(0, 0, 5)]);
    assert_eq!(
        s.send(&s3, Some(&other), false, &mut Vec::new(), &mut |_| {})
            .unwrap_err()
            .code(),
        "not_ancestor"
    );
    // a delta without its parent on the receiver
    let e = Store::create_or_open(&tmp("send-e").1)
        .unwrap()
        .recv(&mut &inc[..], &mut |_| {})
        .unwrap_err();
    assert_eq!(e.code(), "missing_parent");
}

#[test]
fn a_full_snapshot_sent_since_a_base_carries_only_what_the_base_lacks() {
    // 600 pages at the base, then a full snapshot (a new incarnation) with
    // the same pages but one, and a small delta: what the receiver of the
    // base holds is folded in, so the full snapshot's unchanged pages go
    // as references, not chunks
    let (_t_a, a) = tmp("relist-a");
    let (_t_b, b) = tmp("relist-b");
    let mut s = Store::create_or_open(&a).unwrap();
    let regs = vec![region("a", 0x1000, 1024 * PAGE as u64)];
    let mut pages: Vec<(u32, u64, u64)> = (0..600).map(|p| (0, p, p + 1)).collect();
    let base = write(&mut s, snap(None, regs.clone()), &pages);
    let mut first = Vec::new();
    s.send(&base, None, false, &mut first, &mut |_| {}).unwrap();
    let mut r = Store::create_or_open(&b).unwrap();
    r.recv(&mut &first[..], &mut |_| {}).unwrap();
    pages[10].2 = 9999;
    let mut full = snap(Some(&base), regs.clone());
    full.full = true;
    let again = write(&mut s, full, &pages);
    let later = write(&mut s, snap(Some(&again), regs), &[(0, 700, 5000)]);
    let mut inc = Vec::new();
    s.send(&later, Some(&base), false, &mut inc, &mut |_| {})
        .unwrap();
    assert!(
        inc.len() < first.len() / 10,
        "{} bytes for a full snapshot of one changed page (the base: {})",
        inc.len(),
        first.len()
    );
    r.recv(&mut &inc[..], &mut |_| {}).unwrap();
    assert_eq!(contents(&r, &later), contents(&s, &later));
}

#[test]
fn reads_from_many_threads() {
    let (_t_dir, dir) = tmp("threads");
    let mut s = Store::create_or_open(&dir).unwrap();
    let pages: Vec<(u32, u64, u64)> = (0..256).map(|p| (0, p, p + 1)).collect();
    let id = write(
        &mut s,
        snap(None, vec![region("a", 0, 256 * PAGE as u64)]),
        &pages,
    );
    let r = s.open_snapshot(&id).unwrap();
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let r = &r;
            sc.spawn(move || {
                let mut out = vec![0u8; PAGE];
                for p in (t..256).step_by(4) {
                    r.read_page(0, p, &mut out).unwrap();
                    assert_eq!(out, page(p + 1));
                }
            });
        }
    });
}

#[test]
fn the_newest_snapshot_is_the_newest_whose_manifest_loads() {
    let (_t, dir) = tmp("latest");
    let mut s = Store::create_or_open(&dir).unwrap();
    let regs = vec![region("a", 0, 4 * PAGE as u64)];
    let s1 = write(&mut s, snap(None, regs.clone()), &[(0, 0, 1)]);
    let s2 = write(&mut s, snap(Some(&s1), regs.clone()), &[(0, 1, 2)]);
    assert_eq!(s.latest().unwrap().map(|i| i.id), Some(s2.clone()));
    let s3 = write(&mut s, snap(Some(&s2), regs), &[(0, 2, 3)]);
    // the newest manifest torn: the one before is the newest, as in list()
    let m3 = dir.join("snapshots").join(format!("{}.json", s3.as_str()));
    let bytes = std::fs::read(&m3).unwrap();
    std::fs::write(&m3, &bytes[..bytes.len() / 2]).unwrap();
    let newest = s.latest().unwrap().map(|i| i.id);
    assert_eq!(newest, Some(s2));
    assert_eq!(newest, s.list().unwrap().pop().map(|i| i.id));
}

/// Review of `Store::duplicate` (an elected node's snapshot engine writes
/// through a copy of its receiver's store; the sender keeps the original):
/// the original sends what the copy wrote, new packs included, and after
/// the copy's retention removed packs and rewrote the chain, byte for byte.
#[test]
fn a_duplicate_writes_what_the_original_then_sends_intact() {
    use rekindle::store::stream::{self, SendState};
    let (_t_a, a) = tmp("dup-a");
    let (_t_b, b) = tmp("dup-b");
    let mut s = Store::create_or_open(&a).unwrap();
    let regs = vec![region("a", 0x1000, 64 * PAGE as u64)];
    let base = write(
        &mut s,
        snap(None, regs.clone()),
        &(0..40).map(|p| (0, p, p + 1)).collect::<Vec<_>>(),
    );
    let mut r = Store::create_or_open(&b).unwrap();
    let mut first = Vec::new();
    s.send(&base, None, false, &mut first, &mut |_| {}).unwrap();
    r.recv(&mut &first[..], &mut |_| {}).unwrap();

    let mut engine = s.duplicate();
    // new chunks, a chunk the base has at another page, a page zeroed
    let d1 = write(
        &mut engine,
        snap(Some(&base), regs.clone()),
        &[(0, 1, 1000), (0, 2, 5), (0, 3, 0), (0, 50, 1001)],
    );
    let d2 = write(
        &mut engine,
        snap(Some(&d1), regs.clone()),
        &[(0, 4, 1002), (0, 50, 0)],
    );
    let mut state = SendState::default();
    let send = |s: &mut Store, id: &SnapshotId, since: Option<&SnapshotId>, st: &mut SendState| {
        let mut out = Vec::new();
        stream::write_header(&mut out).unwrap();
        s.send_snapshot(id, since, st, &mut out)
            .unwrap_or_else(|e| panic!("send {id}: {e}"));
        stream::write_frame(&mut out, b'E', &[]).unwrap();
        out
    };
    let out = send(&mut s, &d1, Some(&base), &mut state);
    r.recv(&mut &out[..], &mut |_| {}).unwrap();
    assert_eq!(contents(&r, &d1), contents(&engine, &d1), "d1");
    let out = send(&mut s, &d2, Some(&d1), &mut state);
    r.recv(&mut &out[..], &mut |_| {}).unwrap();
    assert_eq!(contents(&r, &d2), contents(&engine, &d2), "d2");

    // the copy's retention: d2 alone stays (rewritten full), packs go
    let d3 = write(&mut engine, snap(Some(&d2), regs), &[(0, 5, 1003)]);
    let keep = Retention {
        keep_last: Some(1),
        ..Retention::default()
    };
    let rep = engine.gc(&keep, &mut |_| {}).unwrap();
    assert!(rep.deleted.contains(&base), "{rep:?}");
    let out = send(&mut s, &d3, Some(&d2), &mut state);
    r.recv(&mut &out[..], &mut |_| {}).unwrap();
    assert_eq!(contents(&r, &d3), contents(&engine, &d3), "d3 after gc");
    assert_eq!(
        contents(&s, &d3),
        contents(&engine, &d3),
        "the original reads d3"
    );
}

/// A location index (store/location_index.rs): a restore through it, or
/// through an ancestor's index and the deltas after it, reads exactly what
/// the fold reads; a damaged, stale or foreign index is refused with its
/// reason and the chain folded; verify checks it; gc removes it.
#[test]
fn a_location_index_reads_as_the_fold_and_a_bad_one_falls_back() {
    use rekindle::store::location_index::Reason;
    let (_t_dir, dir) = tmp("locidx");
    let mut s = Store::create_or_open(&dir).unwrap();
    let regs = vec![
        region("a", 0x10000, 8 * PAGE as u64),
        region("b", 0x90000, 2 * PAGE as u64),
    ];
    let s1 = write(
        &mut s,
        snap(None, regs.clone()),
        &[(0, 0, 1), (0, 1, 2), (0, 3, 3), (0, 7, 9), (1, 0, 4)],
    );
    let s2 = write(
        &mut s,
        snap(Some(&s1), regs.clone()),
        &[(0, 1, 5), (1, 1, 6)],
    );
    // page 0 becomes zero; page 5 takes a chunk page 3 holds (deduped, in
    // s1's pack: found among the pages the index located); page 3 changes
    let s3 = write(
        &mut s,
        snap(Some(&s2), regs.clone()),
        &[(0, 0, 0), (0, 5, 3), (0, 3, 7)],
    );
    let folded: Vec<_> = [&s1, &s2, &s3].iter().map(|id| contents(&s, id)).collect();
    let r = Store::open_unindexed(&dir).unwrap();
    let (_, how) = r.open_snapshot_traced(&s3).unwrap();
    assert_eq!(how.reason, Reason::Missing);

    // s1's index: s3 opens through it and the two deltas after it
    let r1 = r.open_snapshot(&s1).unwrap();
    let (p1, _) = r.write_location_index(&r1).unwrap();
    let (_, how) = r.open_snapshot_traced(&s3).unwrap();
    assert_eq!(how.reason, Reason::Used);
    assert_eq!((how.index_of.as_ref(), how.deltas), (Some(&s1), 2));
    for (k, id) in [&s1, &s2, &s3].iter().enumerate() {
        assert_eq!(contents(&r, id), folded[k], "{id} through s1's index");
    }
    // s3's own index
    let r3 = r.open_snapshot(&s3).unwrap();
    let (p3, _) = r.write_location_index(&r3).unwrap();
    let (_, how) = r.open_snapshot_traced(&s3).unwrap();
    assert_eq!((how.index_of.as_ref(), how.deltas), (Some(&s3), 0));
    assert_eq!(contents(&r, &s3), folded[2]);
    let rep = Store::open(&dir).unwrap().verify(&mut |_| {}).unwrap();
    assert!(rep.ok(), "{:?}", rep.errors);

    // damaged: s3's refused, s1's used; both gone: folded
    let good = std::fs::read(&p3).unwrap();
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 1;
    std::fs::write(&p3, &bad).unwrap();
    let (_, how) = r.open_snapshot_traced(&s3).unwrap();
    assert_eq!(
        (how.reason, how.index_of.as_ref()),
        (Reason::Used, Some(&s1))
    );
    assert_eq!(how.rejected[0].reason, Reason::Corrupt);
    std::fs::remove_file(&p1).unwrap();
    let (_, how) = r.open_snapshot_traced(&s3).unwrap();
    assert_eq!((how.reason, how.index_of), (Reason::Corrupt, None));
    assert_eq!(contents(&r, &s3), folded[2]);
    let rep = Store::open(&dir).unwrap().verify(&mut |_| {}).unwrap();
    assert!(
        rep.errors.iter().any(|e| e.code() == "index_corrupt"),
        "{:?}",
        rep.errors
    );
    assert!(rep.snapshots.iter().all(|v| v.restorable));
    // stale: another snapshot's index under s3's name
    std::fs::write(&p3, &good).unwrap();
    let r2 = r.open_snapshot(&s2).unwrap();
    let (p2, _) = r.write_location_index(&r2).unwrap();
    std::fs::rename(&p2, &p3).unwrap();
    let (_, how) = r.open_snapshot_traced(&s3).unwrap();
    assert_eq!(how.reason, Reason::Stale);
    // foreign, truncated
    std::fs::write(
        &p3,
        b"RKMAP\0\0\0 and then some bytes of no index at all...",
    )
    .unwrap();
    assert_eq!(
        r.open_snapshot_traced(&s3).unwrap().1.reason,
        Reason::Foreign
    );
    std::fs::write(&p3, &good[..20]).unwrap();
    assert_eq!(
        r.open_snapshot_traced(&s3).unwrap().1.reason,
        Reason::Truncated
    );

    // gc: s3's index goes when s3 is rewritten (its parent deleted), s1's
    // when s1 is deleted
    std::fs::write(&p3, &good).unwrap();
    r.write_location_index(&r1).unwrap();
    drop(r);
    let rep = keep_last(&mut s, 1);
    assert!(rep.rewritten.contains(&s3), "{:?}", rep.rewritten);
    assert!(!p1.exists() && !p3.exists());
    assert_eq!(contents(&s, &s3), folded[2]);
}

/// A writer keeps what it listed from one snapshot to the next (a snapshot
/// every 10 ms must not list thousands of files each time), but lists
/// again as soon as another handle has taken the lock: that one's
/// snapshot ids and its gc must never be missed.
#[test]
fn a_writer_lists_again_once_another_has_held_the_lock() {
    let (_t_dir, dir) = tmp("listing");
    let regs = || vec![region("a", 0x1000, 4 * PAGE as u64)];
    let mut a = Store::create_or_open(&dir).unwrap();
    let a1 = write(&mut a, snap(None, regs()), &[(0, 0, 1)]);
    // a file only a listing finds: kept while `a` trusts its own
    let stray = dir.join("tmp/stray");
    std::fs::write(&stray, b"x").unwrap();
    let a2 = write(&mut a, snap(Some(&a1), regs()), &[(0, 1, 2)]);
    assert!(stray.exists(), "no listing between one handle's snapshots");

    // another handle publishes the next id, then collects a1 and a2
    let mut b = Store::open(&dir).unwrap();
    let b1 = write(&mut b, snap(None, regs()), &[(0, 2, 3)]);
    assert!(!stray.exists(), "b's writer listed tmp/ and emptied it");
    let rep = keep_last(&mut b, 1);
    assert_eq!(rep.deleted, vec![a1.clone(), a2.clone()]);
    assert!(!dir.join("packs").join(format!("{a1}.pack")).exists());

    // `a` writes page 1 again (a chunk of the pack b removed): a new id
    // above b's, and the chunk stored again, not deduplicated against the
    // pack that is gone
    let a3 = write(&mut a, snap(None, regs()), &[(0, 0, 1), (0, 1, 2)]);
    assert!(a3 > b1, "{a3} after {b1}");
    assert_eq!(contents(&a, &a3), vec![expect(&[1, 2, 0, 0])]);
    assert_eq!(contents(&a, &b1), vec![expect(&[0, 0, 3, 0])]);
    let v = Store::open(&dir).unwrap().verify(&mut |_| {}).unwrap();
    assert!(v.ok(), "{v:?}");
}

/// verify takes no lock: a snapshot another handle publishes while it runs
/// names a pack the verifying handle did not load, and a gc may remove a
/// pack it loaded.  Neither is damage (it used to report `missing_pack`
/// for a store that was sound); a pack gone that a listed snapshot still
/// needs is.
#[test]
fn verify_of_a_live_store_reports_no_damage_a_writer_or_gc_made_meanwhile() {
    let (_t_dir, dir) = tmp("verify-live");
    let regs = vec![region("a", 0x1000, 4 * PAGE as u64)];
    let mut w = Store::create_or_open(&dir).unwrap();
    let s1 = write(&mut w, snap(None, regs.clone()), &[(0, 0, 1), (0, 1, 2)]);
    let s2 = write(&mut w, snap(None, regs.clone()), &[(0, 0, 3), (0, 1, 4)]);
    let v = Store::open(&dir).unwrap(); // the verifier's view: s1, s2
    // meanwhile: a new snapshot, and s1 (with its pack) collected
    write(&mut w, snap(Some(&s2), regs.clone()), &[(0, 2, 5)]);
    let gc = keep_last(&mut w, 2);
    assert_eq!(gc.deleted, vec![s1.clone()]);
    let rep = v.verify(&mut |_| {}).unwrap();
    assert!(rep.ok(), "{:?}", rep.errors);
    assert!(rep.leftovers.is_empty(), "{:?}", rep.leftovers);
    assert_eq!(rep.published_meanwhile, 1);
    assert_eq!(
        rep.snapshots
            .iter()
            .map(|s| s.id.clone())
            .collect::<Vec<_>>(),
        vec![s2.clone()]
    );
    // a pack that a listed snapshot needs, removed: damage, with its code
    let v = Store::open(&dir).unwrap();
    std::fs::remove_file(dir.join("packs").join(format!("{}.pack", s2.as_str()))).unwrap();
    let rep = v.verify(&mut |_| {}).unwrap();
    let bad: Vec<_> = rep.snapshots.iter().filter(|s| !s.restorable).collect();
    assert!(!bad.is_empty(), "a needed pack removed went unnoticed");
    assert!(
        bad.iter()
            .all(|s| s.error.as_ref().is_some_and(|e| e.code() == "missing_pack")),
        "{bad:?}"
    );
}
