//! Store speed, run by hand (ignored by `cargo test`):
//! `cargo test --release --test store_bench -- --ignored --nocapture`
//! put_page MB/s for new pages, dedup hits and zero pages; commit time;
//! read_page latency (median, p99); zstd levels on the same pages.
//! Each figure is the median of ROUNDS rounds, with a same-run baseline
//! (blake3 alone over the same pages) to compare with.

use std::time::{Duration, Instant};

use rekindle::store::{NewSnapshot, PAGE, RegionKind, RegionMeta, Store};

const PAGES: u64 = 32768; // 128 MiB
const ROUNDS: usize = 5;
const DELTAS: u64 = 200;

/// Arena-like pages: records of a key, a length and a value drawn from a
/// small alphabet (compress about 2-3x), every 8th page random bytes.
fn pages() -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = vec![0u8; PAGES as usize * PAGE];
    for (i, p) in out.chunks_mut(PAGE).enumerate() {
        if i % 8 == 7 {
            for b in p.iter_mut() {
                *b = next() as u8;
            }
            continue;
        }
        let mut at = 0;
        while at + 64 <= PAGE {
            let rec = format!("key:{:08}|", next() % 10_000_000);
            p[at..at + rec.len()].copy_from_slice(rec.as_bytes());
            for b in &mut p[at + rec.len()..at + 64] {
                *b = b'a' + (next() % 16) as u8;
            }
            at += 64;
        }
    }
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn meta(full: bool, parent: Option<rekindle::store::SnapshotId>) -> NewSnapshot {
    NewSnapshot {
        parent,
        full,
        epoch: 0,
        generation: 0,
        app: "bench".into(),
        tags: vec![],
        regions: vec![RegionMeta {
            kind: RegionKind::Arena,
            name: "a".into(),
            addr: 0x7f00_0000_0000,
            size: PAGES * PAGE as u64,
            layout: serde_json::Value::Null,
        }],
        redo: None,
    }
}

#[test]
#[ignore]
fn store_speed() {
    let data = pages();
    let zero = vec![0u8; PAGE];
    let bytes = data.len();
    let (mut base, mut new, mut dedup, mut zeros, mut commit, mut ratio) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut lat_med = vec![];
    let mut lat_p99 = vec![];
    for round in 0..ROUNDS {
        let dir = std::env::temp_dir().join(format!(
            "rekindle-store-bench-{}-{round}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut s = Store::create_or_open(&dir).unwrap();
        // baseline: blake3 alone over the same pages
        let t = Instant::now();
        let mut acc = 0u8;
        for p in data.chunks(PAGE) {
            acc ^= blake3::hash(p).as_bytes()[0];
        }
        base.push(mbps(bytes, t.elapsed()));
        std::hint::black_box(acc);
        // new pages
        let mut w = s.begin(meta(true, None)).unwrap();
        let t = Instant::now();
        for (i, p) in data.chunks(PAGE).enumerate() {
            w.put_page(0, i as u64, p).unwrap();
        }
        new.push(mbps(bytes, t.elapsed()));
        let st = w.stats();
        ratio.push(st.bytes_raw as f64 / st.bytes_compressed as f64);
        let t = Instant::now();
        let first = w.commit().unwrap().id;
        commit.push(t.elapsed().as_secs_f64() * 1e3);
        // the same pages again: dedup hits
        let mut w = s.begin(meta(false, Some(first.clone()))).unwrap();
        let t = Instant::now();
        for (i, p) in data.chunks(PAGE).enumerate() {
            w.put_page(0, i as u64, p).unwrap();
        }
        dedup.push(mbps(bytes, t.elapsed()));
        assert_eq!(w.stats().new_chunks, 0);
        w.abort();
        // zero pages
        let mut w = s.begin(meta(false, Some(first.clone()))).unwrap();
        let t = Instant::now();
        for i in 0..PAGES {
            w.put_page(0, i, &zero).unwrap();
        }
        zeros.push(mbps(bytes, t.elapsed()));
        w.abort();
        // read_page latency, random order, page cache warm
        let r = s.open_snapshot(&first).unwrap();
        let mut out = vec![0u8; PAGE];
        let mut lat = Vec::with_capacity(PAGES as usize);
        let mut x: u64 = 88172645463325252;
        for _ in 0..PAGES {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p = x % PAGES;
            let t = Instant::now();
            r.read_page(0, p, &mut out).unwrap();
            lat.push(t.elapsed().as_nanos() as f64 / 1e3);
        }
        lat.sort_by(|a, b| a.total_cmp(b));
        lat_med.push(lat[lat.len() / 2]);
        lat_p99.push(lat[lat.len() * 99 / 100]);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let b = median(&mut base);
    println!(
        "store-bench pages={PAGES} ({} MiB) rounds={ROUNDS}",
        bytes >> 20
    );
    println!("baseline blake3 only        {b:8.0} MB/s");
    let n = median(&mut new);
    println!(
        "put_page new pages          {n:8.0} MB/s  ({:.2}x baseline) compression {:.2}x",
        n / b,
        median(&mut ratio)
    );
    let d = median(&mut dedup);
    println!(
        "put_page dedup hits         {d:8.0} MB/s  ({:.2}x baseline)",
        d / b
    );
    let z = median(&mut zeros);
    println!(
        "put_page zero pages         {z:8.0} MB/s  ({:.2}x baseline)",
        z / b
    );
    println!("commit of 128 MiB (fsyncs)  {:8.1} ms", median(&mut commit));
    println!(
        "read_page latency           median {:.1} us, p99 {:.1} us",
        median(&mut lat_med),
        median(&mut lat_p99)
    );
    // zstd levels, one context, same pages
    for level in [1, -1, -3, -5, 3] {
        let mut c = zstd::bulk::Compressor::new(level).unwrap();
        let mut d = zstd::bulk::Decompressor::new().unwrap();
        let mut buf = Vec::with_capacity(2 * PAGE);
        let mut page = vec![0u8; PAGE];
        let (mut cs, mut ds, mut rs) = (vec![], vec![], vec![]);
        for _ in 0..ROUNDS {
            let mut total = 0usize;
            let t = Instant::now();
            for p in data.chunks(PAGE) {
                buf.clear();
                total += c.compress_to_buffer(p, &mut buf).unwrap().min(PAGE);
            }
            cs.push(mbps(bytes, t.elapsed()));
            rs.push(bytes as f64 / total as f64);
            let comp: Vec<Vec<u8>> = data
                .chunks(PAGE)
                .take(4096)
                .map(|p| c.compress(p).unwrap())
                .collect();
            let t = Instant::now();
            for z in &comp {
                d.decompress_to_buffer(z, &mut page[..]).unwrap();
            }
            ds.push(mbps(4096 * PAGE, t.elapsed()));
        }
        println!(
            "zstd level {level:3}: compress {:6.0} MB/s, decompress {:6.0} MB/s, ratio {:.2}x",
            median(&mut cs),
            median(&mut ds),
            median(&mut rs)
        );
    }
}

/// Small deltas (10 new pages each): begin..commit latency, which the
/// fsyncs dominate.  `-- --ignored small_delta_commit --nocapture`
#[test]
#[ignore]
fn small_delta_commit() {
    let data = pages();
    let dir =
        std::env::temp_dir().join(format!("rekindle-store-bench-{}-small", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut s = Store::create_or_open(&dir).unwrap();
    let mut w = s.begin(meta(true, None)).unwrap();
    w.put_page(0, 0, &data[..PAGE]).unwrap();
    let mut parent = w.commit().unwrap().id;
    let mut lat = vec![];
    for i in 0..DELTAS {
        let t = Instant::now();
        let mut w = s.begin(meta(false, Some(parent.clone()))).unwrap();
        for p in 0..10 {
            let at = ((i * 10 + p) % PAGES) as usize * PAGE;
            w.put_page(0, p, &data[at..at + PAGE]).unwrap();
        }
        parent = w.commit().unwrap().id;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    println!(
        "10-page delta, begin..commit  median {:.2} ms, p99 {:.2} ms ({DELTAS} deltas)",
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a delta record would cost against a whole page (docs/store.md,
/// "Not done yet"): PAGES pages of 128-byte records (a 16-byte key, an
/// 8-byte header, a value over a 16-letter alphabet), and a second version
/// of each with one record's value and header rewritten, as a SET does.
/// Per page: the delta found and encoded against the first version, the
/// delta applied, the new version copied into a shadow (what the engine
/// would keep), and, as today, the new version hashed and compressed.
#[test]
#[ignore]
fn page_delta_cost() {
    use rekindle::store::delta;
    use rekindle::store::format::ZSTD_LEVEL;
    use rekindle::store::pack::ChunkCompressor;

    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let n = PAGES as usize;
    let mut old = vec![0u8; n * PAGE];
    for p in old.chunks_mut(PAGE) {
        for rec in p.chunks_mut(128) {
            let key = format!("key:{:012}", next() % 1_000_000);
            rec[..16].copy_from_slice(key.as_bytes());
            rec[16..24].copy_from_slice(&next().to_le_bytes());
            rec[24..]
                .iter_mut()
                .for_each(|b| *b = b'a' + (next() % 16) as u8);
        }
    }
    let mut new = old.clone();
    for p in new.chunks_mut(PAGE) {
        let at = (next() % (PAGE as u64 / 128)) as usize * 128;
        p[at + 16..at + 24].copy_from_slice(&next().to_le_bytes());
        p[at + 24..at + 124]
            .iter_mut()
            .for_each(|b| *b = b'a' + (next() % 16) as u8);
    }
    let per_page = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    let (mut enc, mut app, mut copy, mut whole) = (vec![], vec![], vec![], vec![]);
    let (mut delta_bytes, mut whole_bytes) = (0, 0);
    let mut comp = ChunkCompressor::new(ZSTD_LEVEL).unwrap_or_else(|e| panic!("{e}"));
    let mut shadow = vec![0u8; n * PAGE];
    for _ in 0..ROUNDS {
        let mut out = Vec::with_capacity(n * 160);
        let mut ends = Vec::with_capacity(n);
        let t = Instant::now();
        for (o, w) in old.chunks(PAGE).zip(new.chunks(PAGE)) {
            delta::encode(o, w, PAGE / 4, &mut out).unwrap_or_else(|| panic!("a small delta"));
            ends.push(out.len());
        }
        enc.push(per_page(t.elapsed()));
        delta_bytes = out.len() / n;
        let mut page = vec![0u8; PAGE];
        let mut from = 0;
        let t = Instant::now();
        for (o, &end) in old.chunks(PAGE).zip(&ends) {
            page.copy_from_slice(o);
            delta::apply(&mut page, &out[from..end]).unwrap_or_else(|e| panic!("{e}"));
            from = end;
        }
        app.push(per_page(t.elapsed()));
        assert!(
            page[..] == new[(n - 1) * PAGE..],
            "the last page comes back"
        );
        let t = Instant::now();
        for (sh, w) in shadow.chunks_mut(PAGE).zip(new.chunks(PAGE)) {
            sh.copy_from_slice(w);
            std::hint::black_box(&sh[0]);
        }
        copy.push(per_page(t.elapsed()));
        let t = Instant::now();
        let mut bytes = 0;
        for w in new.chunks(PAGE) {
            std::hint::black_box(blake3::hash(w));
            bytes += comp.compress(w).0.len();
        }
        whole.push(per_page(t.elapsed()));
        whole_bytes = bytes / n;
    }
    println!(
        "page_delta_cost ({PAGES} pages, one 108-byte change each; median of {ROUNDS} rounds, us per page):"
    );
    println!(
        "  delta found and encoded  {:6.2} us  {delta_bytes} B",
        median(&mut enc)
    );
    println!(
        "  delta applied            {:6.2} us  (includes a page copy)",
        median(&mut app)
    );
    println!("  new page into a shadow   {:6.2} us", median(&mut copy));
    println!(
        "  blake3 + zstd (today)    {:6.2} us  {whole_bytes} B",
        median(&mut whole)
    );
}
