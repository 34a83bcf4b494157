//! The standby's hot image (cluster/hot_image.rs) against `rekindle
//! restore`: after every snapshot of a chain that exercises what a delta can
//! do (changed, zeroed and deduplicated pages, a page past the memfd's
//! recorded size, a new region, a region that changes shape, a memfd that
//! grows), the image's memfds hold byte for byte what a restore of the same
//! snapshot makes; an image that missed a snapshot is rebuilt from the
//! store; one that failed says why and is not handed over.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rekindle::cluster::hot_image::{Advance, HotImage, Unusable};
use rekindle::proto::FdKind;
use rekindle::snapshot::cut::MANIFEST_REGION;
use rekindle::snapshot::restore::{self, Source};
use rekindle::store::{NewSnapshot, PAGE, RegionKind, RegionMeta, SnapshotId, Store};

fn tmp() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::Builder::new()
        .prefix("rekindle-hot-image-")
        .tempdir()
        .unwrap_or_else(|e| panic!("{e}"));
    let p = t.path().join("store");
    (t, p)
}

fn arena(name: &str, pages: u64, memfd_pages: u64) -> RegionMeta {
    RegionMeta {
        kind: RegionKind::Arena,
        name: name.into(),
        addr: 0x7000_0000_0000,
        size: pages * PAGE as u64,
        layout: serde_json::json!({"memfd_bytes": memfd_pages * PAGE as u64}),
    }
}

fn manifest_region() -> RegionMeta {
    RegionMeta {
        kind: RegionKind::Static,
        name: MANIFEST_REGION.into(),
        addr: 0,
        size: PAGE as u64,
        layout: serde_json::json!({}),
    }
}

fn page(seed: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    if seed != 0 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for b in p.iter_mut().step_by(5) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    p
}

/// One snapshot: regions, then (region, page, seed) writes (seed 0: zeros).
fn write(
    store: &mut Store,
    parent: Option<&SnapshotId>,
    regions: Vec<RegionMeta>,
    pages: &[(u32, u64, u64)],
) -> SnapshotId {
    let manifest = regions.len() as u32 - 1;
    let mut w = store
        .begin(NewSnapshot {
            parent: parent.cloned(),
            full: parent.is_none(),
            epoch: 1,
            generation: 1,
            app: "test".into(),
            tags: vec![],
            regions,
            redo: None,
        })
        .unwrap_or_else(|e| panic!("begin: {e}"));
    w.put_bytes(
        manifest,
        &page(1000 + parent.map_or(0, |p| p.seq().unwrap_or(0))),
    )
    .unwrap_or_else(|e| panic!("manifest: {e}"));
    for &(r, p, seed) in pages {
        w.put_page(r, p, &page(seed))
            .unwrap_or_else(|e| panic!("put: {e}"));
    }
    w.commit().unwrap_or_else(|e| panic!("commit: {e}")).id
}

fn bytes(fd: &OwnedFd) -> Vec<u8> {
    let mut f = std::fs::File::from(fd.try_clone().unwrap_or_else(|e| panic!("dup: {e}")));
    let mut v = Vec::new();
    f.read_to_end(&mut v)
        .unwrap_or_else(|e| panic!("read: {e}"));
    v
}

type Image = Vec<(FdKind, String, Vec<u8>)>;

fn sorted(fds: &[(FdKind, String, OwnedFd)]) -> Image {
    let mut v: Image = fds
        .iter()
        .map(|(k, n, fd)| (*k, n.clone(), bytes(fd)))
        .collect();
    v.sort_by(|a, b| a.1.cmp(&b.1));
    v
}

fn restored(dir: &Path, id: &SnapshotId) -> Image {
    let r = restore::materialize(&Source {
        dir: dir.to_path_buf(),
        spec: id.as_str().to_string(),
    })
    .unwrap_or_else(|e| panic!("restore {id}: {e}"));
    sorted(&r.fds)
}

/// The page hashes a first snapshot compares with (snapshot/baseline.rs):
/// the image's must be the restore's, region by region.
fn same_baseline(what: &str, got: &restore::Restored, dir: &Path, id: &SnapshotId) {
    let want = restore::materialize(&Source {
        dir: dir.to_path_buf(),
        spec: id.as_str().to_string(),
    })
    .unwrap_or_else(|e| panic!("restore {id}: {e}"))
    .baseline
    .unwrap_or_else(|| panic!("{what}: an eager restore has a baseline"));
    let got = got
        .baseline
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: the image has no baseline"));
    assert_eq!(&got.id, id, "{what}: baseline id");
    assert_eq!(got.dir, dir, "{what}: baseline store");
    let names: Vec<&str> = got.regions.iter().map(|r| r.meta.name.as_str()).collect();
    for w in &want.regions {
        let Some(g) = got.regions.iter().find(|g| g.meta.name == w.meta.name) else {
            panic!(
                "{what}: region {} missing from the image's baseline {names:?}",
                w.meta.name
            );
        };
        assert_eq!(g.meta, w.meta, "{what}: {} meta", w.meta.name);
        assert_eq!(g.pages, w.pages, "{what}: {} page hashes", w.meta.name);
    }
    assert_eq!(got.regions.len(), want.regions.len(), "{what}: {names:?}");
}

fn same(what: &str, got: &Image, want: &Image) {
    assert_eq!(got.len(), want.len(), "{what}: regions");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.0, &g.1), (w.0, &w.1), "{what}: region");
        assert_eq!(g.2.len(), w.2.len(), "{what}: {} size", g.1);
        let differ: Vec<usize> = (0..g.2.len().div_ceil(PAGE))
            .filter(|p| g.2.get(p * PAGE..(p + 1) * PAGE) != w.2.get(p * PAGE..(p + 1) * PAGE))
            .collect();
        assert!(
            differ.is_empty(),
            "{what}: {} pages differ: {differ:?}",
            g.1
        );
    }
}

#[test]
fn the_image_follows_every_kind_of_delta_as_a_restore_reads_it() {
    let (_t, dir) = tmp();
    let mut s = Store::create_or_open(&dir).unwrap_or_else(|e| panic!("{e}"));
    let a = |pages, memfd| vec![arena("a", pages, memfd), manifest_region()];
    let mut ids = Vec::new();
    // full: page 10 lies past the recorded memfd size (8 pages)
    ids.push(write(
        &mut s,
        None,
        a(16, 8),
        &[(0, 0, 1), (0, 1, 2), (0, 2, 3), (0, 3, 4), (0, 10, 5)],
    ));
    // changed, zeroed, and a page with page 0's content (deduplicated)
    ids.push(write(
        &mut s,
        ids.last(),
        a(16, 8),
        &[(0, 1, 6), (0, 2, 0), (0, 3, 1)],
    ));
    // the memfd grows; a new region appears
    let mut two = a(16, 16);
    two.insert(1, arena("b", 4, 4));
    ids.push(write(
        &mut s,
        ids.last(),
        two.clone(),
        &[(0, 12, 7), (1, 0, 8), (1, 3, 9)],
    ));
    // nothing but the manifest changes
    ids.push(write(&mut s, ids.last(), two.clone(), &[]));
    // "a" changes shape: it inherits nothing
    let mut reshaped = two.clone();
    reshaped[0] = arena("a", 32, 32);
    ids.push(write(
        &mut s,
        ids.last(),
        reshaped.clone(),
        &[(0, 20, 10), (1, 1, 11)],
    ));
    // "b" goes away
    ids.push(write(
        &mut s,
        ids.last(),
        vec![reshaped[0].clone(), manifest_region()],
        &[(0, 0, 12)],
    ));

    for k in 0..ids.len() {
        let mut image = HotImage::default();
        for (i, id) in ids[..=k].iter().enumerate() {
            let how = image
                .advance(&s, id)
                .unwrap_or_else(|e| panic!("advance {id}: {e}"));
            assert!(
                matches!(how, Advance::Applied { .. }),
                "snapshot {i}: {how:?}"
            );
            assert_eq!(image.at(), Some(id));
        }
        let r = image.take(&dir).unwrap_or_else(|u| panic!("take: {u:?}"));
        assert_eq!(&r.info.id, &ids[k]);
        same(
            &format!("after snapshot {k}"),
            &sorted(&r.fds),
            &restored(&dir, &ids[k]),
        );
        same_baseline(&format!("after snapshot {k}"), &r, &dir, &ids[k]);
    }
}

#[test]
fn an_image_that_missed_a_snapshot_is_rebuilt_from_the_store() {
    let (_t, dir) = tmp();
    let mut s = Store::create_or_open(&dir).unwrap_or_else(|e| panic!("{e}"));
    let regs = vec![arena("a", 8, 8), manifest_region()];
    let s1 = write(&mut s, None, regs.clone(), &[(0, 0, 1), (0, 5, 2)]);
    let s2 = write(&mut s, Some(&s1), regs.clone(), &[(0, 5, 3)]);
    let s3 = write(&mut s, Some(&s2), regs.clone(), &[(0, 6, 4)]);
    let mut image = HotImage::default();
    assert!(matches!(
        image.advance(&s, &s1),
        Ok(Advance::Applied { .. })
    ));
    // s2 never reached the image: applying s3's own pages over s1 would
    // miss s2's page 5
    let how = image.advance(&s, &s3).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(how, Advance::Rebuilt { .. }), "{how:?}");
    let r = image.take(&dir).unwrap_or_else(|u| panic!("{u:?}"));
    same("rebuilt", &sorted(&r.fds), &restored(&dir, &s3));
    same_baseline("rebuilt", &r, &dir, &s3);
}

#[test]
fn an_image_that_failed_is_not_handed_over_and_says_why() {
    let (_t, dir) = tmp();
    let mut s = Store::create_or_open(&dir).unwrap_or_else(|e| panic!("{e}"));
    let regs = vec![arena("a", 8, 8), manifest_region()];
    let mut image = HotImage::default();
    assert_eq!(image.take(&dir).err(), Some(Unusable::NothingReceived));
    let s1 = write(&mut s, None, regs.clone(), &[(0, 0, 1)]);
    assert!(image.advance(&s, &s1).is_ok());
    let missing = SnapshotId("000000000099-20260101T000000Z".into());
    let e = image.advance(&s, &missing).err().map(|e| e.code());
    assert_eq!(e, Some("not_found"));
    match image.take(&dir) {
        Err(Unusable::Failed { code, .. }) => assert_eq!(code, "not_found"),
        other => panic!(
            "an image that failed was handed over: {:?}",
            other.map(|r| r.info.id)
        ),
    }
    // the next snapshot rebuilds it
    let s2 = write(&mut s, Some(&s1), regs, &[(0, 1, 2)]);
    assert!(matches!(
        image.advance(&s, &s2),
        Ok(Advance::Rebuilt { .. })
    ));
    let r = image.take(&dir).unwrap_or_else(|u| panic!("{u:?}"));
    same("after the failure", &sorted(&r.fds), &restored(&dir, &s2));
}
