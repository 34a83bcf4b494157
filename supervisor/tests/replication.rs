//! The standby's end of replication (cluster/receiver.rs) against a
//! primary played by the test over a real TCP socket: a good stream is
//! applied and acknowledged; a torn or damaged one, a stale term, a gap and
//! an unexpected frame are refused with their codes and publish nothing.

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use rekindle::cluster::receiver::{Receiver, ReceiverNote};
use rekindle::cluster::records::LeaderRecord;
use rekindle::cluster::wire::{self, Ack, Join, PeerReader, Welcome};
use rekindle::store::stream::{self, SendState};
use rekindle::store::{NewSnapshot, PAGE, RegionKind, RegionMeta, SnapshotId, Store};

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

/// A primary's store with a full snapshot and a delta on it.
fn primary_store(dir: &Path) -> (Store, SnapshotId, SnapshotId) {
    let mut s = ok(Store::create_or_open(dir));
    let meta = |full: bool, parent: Option<SnapshotId>| NewSnapshot {
        parent,
        full,
        epoch: 1,
        generation: 1,
        app: "t".into(),
        tags: vec![],
        regions: vec![RegionMeta {
            kind: RegionKind::Arena,
            name: "a".into(),
            addr: 0x7f00_0000_0000,
            size: 8 * PAGE as u64,
            layout: serde_json::Value::Null,
        }],
        redo: None,
    };
    let mut w = ok(s.begin(meta(true, None)));
    for p in 0..8u64 {
        ok(w.put_page(0, p, &vec![p as u8 + 1; PAGE]));
    }
    let a = ok(w.commit()).id;
    let mut w = ok(s.begin(meta(false, Some(a.clone()))));
    ok(w.put_page(0, 3, &vec![0xee; PAGE]));
    let b = ok(w.commit()).id;
    (s, a, b)
}

/// Plays the primary once: reads the join, sends the header, `welcome`,
/// then `body`, then reads acks for a while; returns the join and the acks.
fn play_primary(
    listener: TcpListener,
    welcome: Welcome,
    body: Vec<u8>,
) -> std::thread::JoinHandle<(Join, Vec<Ack>)> {
    std::thread::spawn(move || {
        let (conn, _) = ok(listener.accept());
        ok(conn.set_read_timeout(Some(Duration::from_millis(1500))));
        let mut r = PeerReader {
            inner: ok(conn.try_clone()),
            timed_out: false,
        };
        let (k, p) = ok(wire::next("standby", &mut r));
        assert_eq!(k, wire::JOIN);
        let join: Join = ok(wire::parse("standby", &p));
        let mut out = ok(conn.try_clone());
        ok(stream::write_header(&mut out));
        ok(wire::send(&mut out, wire::WELCOME, &welcome));
        ok(out.write_all(&body));
        ok(out.flush());
        // the end of what the primary says (the standby still acknowledges)
        ok(conn.shutdown(std::net::Shutdown::Write));
        let mut acks = Vec::new();
        while let Ok((k, p)) = wire::next("standby", &mut r) {
            if k == wire::ACK {
                acks.push(ok(wire::parse::<Ack>("standby", &p)));
            }
            if acks.len() >= 2 {
                break;
            }
        }
        (join, acks)
    })
}

fn leader(addr: &str, epoch: u64) -> LeaderRecord {
    LeaderRecord {
        node: "p".into(),
        epoch,
        replication: addr.to_string(),
        serve: vec![],
    }
}

/// Notes until one that ends a connection or applies the last snapshot.
fn notes_until(r: &Receiver, done: impl Fn(&[ReceiverNote]) -> bool) -> Vec<ReceiverNote> {
    let t0 = Instant::now();
    let mut all = Vec::new();
    while t0.elapsed() < Duration::from_secs(10) {
        all.extend(r.notes());
        if done(&all) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    all
}

fn lost_code(n: &[ReceiverNote]) -> Option<&'static str> {
    n.iter().find_map(|n| match n {
        ReceiverNote::Lost { code, .. } => Some(*code),
        _ => None,
    })
}

fn snapshot_frames(s: &mut Store, id: &SnapshotId, since: Option<&SnapshotId>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut st = SendState::default();
    ok(s.send_snapshot(id, since, &mut st, &mut out));
    out
}

#[test]
fn a_good_stream_is_applied_and_acknowledged() {
    let d = ok(tempfile::tempdir());
    let (mut ps, a, b) = primary_store(&d.path().join("p"));
    let mut body = snapshot_frames(&mut ps, &a, None);
    body.extend(snapshot_frames(&mut ps, &b, Some(&a)));
    let l = ok(TcpListener::bind("127.0.0.1:0"));
    let addr = ok(l.local_addr()).to_string();
    let primary = play_primary(
        l,
        Welcome {
            node: "p".into(),
            epoch: 4,
            full: true,
            base: None,
        },
        body,
    );
    let standby = d.path().join("s");
    let mut r = ok(Receiver::start("s", standby.clone()));
    r.set_leader(Some(leader(&addr, 4)), 4);
    let (join, acks) = primary.join().unwrap_or_else(|_| panic!("primary thread"));
    r.stop();
    assert_eq!(join.node, "s");
    assert_eq!(join.lineage, 0);
    assert_eq!(acks.last().and_then(|a| a.id.clone()), Some(b.0.clone()));
    assert!(acks.iter().all(|a| a.epoch == 4));
    let s = ok(Store::open(&standby));
    let ids: Vec<_> = ok(s.list()).into_iter().map(|i| i.id).collect();
    assert_eq!(ids, vec![a, b]);
    assert_eq!(
        ok(rekindle::cluster::lineage::read(&standby)).epoch,
        4,
        "the store now belongs to term 4"
    );
}

/// The standby gets `body` after a welcome of term `epoch` (it follows a
/// leader of term `leader_epoch`); returns the code it stopped with and
/// what its store holds.
fn refused(body: Vec<u8>, epoch: u64, leader_epoch: u64, full: bool) -> (String, usize) {
    let d = ok(tempfile::tempdir());
    let l = ok(TcpListener::bind("127.0.0.1:0"));
    let addr = ok(l.local_addr()).to_string();
    let primary = play_primary(
        l,
        Welcome {
            node: "p".into(),
            epoch,
            full,
            base: None,
        },
        body,
    );
    let standby = d.path().join("s");
    let mut r = ok(Receiver::start("s", standby.clone()));
    r.set_leader(Some(leader(&addr, leader_epoch)), leader_epoch);
    let notes = notes_until(&r, |n| lost_code(n).is_some());
    r.stop();
    let _ = primary.join();
    let held = Store::open(&standby)
        .ok()
        .map_or(0, |s| s.list().map_or(0, |l| l.len()));
    (lost_code(&notes).unwrap_or("none").to_string(), held)
}

#[test]
fn damaged_streams_are_refused_and_publish_nothing() {
    let d = ok(tempfile::tempdir());
    let (mut ps, a, b) = primary_store(&d.path().join("p"));
    let good = snapshot_frames(&mut ps, &a, None);

    // torn: the connection ends inside the snapshot
    let torn = good[..good.len() / 2].to_vec();
    let (code, held) = refused(torn, 1, 1, true);
    assert_eq!(code, "stream_truncated");
    assert_eq!(held, 0);

    // a flipped byte inside a frame: its checksum fails
    let mut bad = good.clone();
    let at = bad.len() / 2;
    bad[at] ^= 0x40;
    let (code, held) = refused(bad, 1, 1, true);
    assert_eq!(code, "stream_corrupt");
    assert_eq!(held, 0);

    // a gap: a delta whose parent the standby lacks
    let delta = snapshot_frames(&mut ps, &b, Some(&a));
    let (code, held) = refused(delta, 1, 1, true);
    assert_eq!(code, "missing_parent");
    assert_eq!(held, 0);

    // a primary of an older term than the leader etcd shows
    let (code, held) = refused(good.clone(), 1, 2, true);
    assert_eq!(code, "stale_epoch");
    assert_eq!(held, 0);

    // a frame the standby never expects from a primary
    let mut odd = Vec::new();
    ok(stream::write_frame(&mut odd, wire::JOIN, b"{}"));
    let (code, held) = refused(odd, 1, 1, true);
    assert_eq!(code, "unexpected_frame");
    assert_eq!(held, 0);
}

/// A standby whose store is of term 1 joins the primary of term 2, which
/// holds only the older of its two snapshots with the same term: the join
/// offers its line with terms, the standby drops the newer one, labels
/// what follows as term 2, and acknowledges the common snapshot.
#[test]
fn a_rejoin_across_terms_drops_the_tail_after_the_common_snapshot() {
    use rekindle::cluster::lineage::{self, Labeled, Lineage, TermStart};
    let d = ok(tempfile::tempdir());
    let standby = d.path().join("s");
    let (held, a, b) = primary_store(&standby);
    drop(held);
    ok(lineage::write(&standby, &Lineage::whole(1)));
    let mut body = Vec::new();
    ok(wire::send(
        &mut body,
        wire::HEARTBEAT,
        &wire::Heartbeat {
            epoch: 2,
            newest: Some(a.0.clone()),
        },
    ));
    let l = ok(TcpListener::bind("127.0.0.1:0"));
    let addr = ok(l.local_addr()).to_string();
    let primary = play_primary(
        l,
        Welcome {
            node: "p".into(),
            epoch: 2,
            full: false,
            base: Some(a.0.clone()),
        },
        body,
    );
    let mut r = ok(Receiver::start("s", standby.clone()));
    r.set_leader(Some(leader(&addr, 2)), 2);
    let notes = notes_until(&r, |n| {
        n.iter().any(|n| matches!(n, ReceiverNote::Lost { .. }))
    });
    let (join, acks) = primary.join().unwrap_or_else(|_| panic!("primary thread"));
    r.stop();
    assert_eq!((join.lineage, join.have.clone()), (1, Some(b.0.clone())));
    let offered: Vec<Labeled> = vec![
        Labeled {
            id: b.0.clone(),
            term: 1,
        },
        Labeled {
            id: a.0.clone(),
            term: 1,
        },
    ];
    assert_eq!(join.chain, offered);
    assert!(notes.iter().any(|n| matches!(
        n,
        ReceiverNote::TailDropped { count: 1, base, epoch: 2, .. } if *base == a.0
    )));
    assert!(notes.iter().any(|n| matches!(
        n,
        ReceiverNote::Following {
            full: false,
            across_terms: true,
            epoch: 2,
            ..
        }
    )));
    assert_eq!(acks.first().and_then(|k| k.id.clone()), Some(a.0.clone()));
    let ids: Vec<_> = ok(ok(Store::open(&standby)).list())
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(
        ids,
        vec![a.clone()],
        "the snapshot after the common one went"
    );
    let lin = ok(lineage::read(&standby));
    assert_eq!(lin.epoch, 2);
    assert_eq!(
        lin.terms.last(),
        Some(&TermStart {
            term: 2,
            after: a.seq()
        })
    );
}
