//! The primary's end of replication: listens on `--cluster-addr`; for each
//! standby that joins, one thread sends the snapshots the engine commits
//! (initial sync first: the newest, whole, unless the standby's store is of
//! this term and we still hold its newest) and heartbeats while idle, and
//! one thread reads its acknowledgements.  A standby of an older term's
//! line resumes from the newest snapshot both stores hold with the same id
//! and term (lineage.rs).  Joins, acknowledgements and departures go to the
//! in-sync board (insync.rs), which tells the engine (link.rs) how far the
//! standbys that count have acknowledged; with sync replication the app's
//! replies wait for it.

use std::collections::HashMap;
use std::io::BufWriter;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::ClusterError;
use super::insync::InSyncBoard;
use super::lineage;
use super::link::ReplicationLink;
use super::wire::{self, Ack, Heartbeat, Join, PeerReader, Welcome};
use crate::store::preopened::Preopened;
use crate::store::stream::{self, SendState};
use crate::store::{SnapshotId, Store};

/// One standby as the sender sees it.
#[derive(Debug, Clone)]
pub struct StandbyView {
    pub node: String,
    pub peer: String,
    /// The newest snapshot it acknowledged.
    pub acked: Option<SnapshotId>,
    /// It has acknowledged a snapshot of this term (initial sync done).
    pub synced: bool,
}

/// What the sender tells the node (events).
#[derive(Debug)]
pub enum SenderNote {
    Joined {
        node: String,
        peer: String,
        full: bool,
        /// Incremental from a snapshot of an older term's line (`base`).
        across_terms: bool,
    },
    /// Its first acknowledgement of this term: it counts for sync replies.
    Synced { node: String, id: String },
    Left {
        node: String,
        peer: String,
        code: &'static str,
        error: String,
    },
}

struct Shared {
    epoch: u64,
    me: String,
    dir: PathBuf,
    link: Arc<ReplicationLink>,
    board: Arc<InSyncBoard>,
    stop: AtomicBool,
    standbys: Mutex<HashMap<u64, StandbyView>>,
    conns: Mutex<HashMap<u64, TcpStream>>,
    notes: Mutex<Vec<SenderNote>>,
    /// The store already open with its indexes (an elected standby's, from
    /// its receiver): the first standby to join sends from it instead of
    /// loading every pack's index again on the failover path.
    preopened: Mutex<Option<Preopened>>,
}

impl Shared {
    fn note(&self, n: SenderNote) {
        self.notes.lock().unwrap_or_else(|p| p.into_inner()).push(n);
    }
}

pub struct Sender {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Sender {
    pub fn start(
        addr: &str,
        epoch: u64,
        me: &str,
        dir: PathBuf,
        link: Arc<ReplicationLink>,
        board: Arc<InSyncBoard>,
        preopened: Option<Preopened>,
    ) -> Result<Sender, ClusterError> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| ClusterError::io(format!("replication: bind {addr}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ClusterError::io("replication: listener", e))?;
        let shared = Arc::new(Shared {
            epoch,
            me: me.to_string(),
            dir,
            link: link.clone(),
            board: board.clone(),
            stop: AtomicBool::new(false),
            standbys: Mutex::new(HashMap::new()),
            conns: Mutex::new(HashMap::new()),
            notes: Mutex::new(Vec::new()),
            preopened: Mutex::new(preopened),
        });
        board.attach(epoch, link);
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rk-repl-listen".into())
            .spawn(move || accept_loop(listener, sh))
            .map_err(|e| ClusterError::io("replication: thread", e))?;
        Ok(Sender {
            shared,
            thread: Some(thread),
        })
    }

    pub fn standbys(&self) -> Vec<StandbyView> {
        let s = self
            .shared
            .standbys
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        s.values().cloned().collect()
    }

    pub fn notes(&self) -> Vec<SenderNote> {
        std::mem::take(&mut *self.shared.notes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Closes every connection and the listener.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for c in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            let _ = c.shutdown(Shutdown::Both);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.board.detach();
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, sh: Arc<Shared>) {
    let mut next_id = 0u64;
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    while !sh.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((conn, peer)) => {
                next_id += 1;
                let id = next_id;
                let sh2 = sh.clone();
                let peer = peer.to_string();
                if let Ok(c) = conn.try_clone() {
                    sh.conns
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, c);
                }
                let t = std::thread::Builder::new()
                    .name("rk-repl-send".into())
                    .spawn(move || {
                        let r = serve(id, conn, &peer, &sh2);
                        let node = sh2
                            .standbys
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&id)
                            .map(|v| v.node)
                            .unwrap_or_default();
                        sh2.conns
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&id);
                        sh2.board.left(&node, id);
                        if let Err(e) = r {
                            sh2.note(SenderNote::Left {
                                node,
                                peer,
                                code: e.code(),
                                error: e.to_string(),
                            });
                        }
                    });
                if let Ok(t) = t {
                    threads.push(t);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
        threads.retain(|t| !t.is_finished());
    }
    for t in threads {
        let _ = t.join();
    }
}

/// One standby: its join, the initial sync, then every new snapshot.
fn serve(id: u64, conn: TcpStream, peer: &str, sh: &Arc<Shared>) -> Result<(), ClusterError> {
    let io = |what: &str| {
        let what = format!("replication to {peer}: {what}");
        move |e| ClusterError::io(what, e)
    };
    conn.set_nodelay(true).map_err(io("nodelay"))?;
    conn.set_read_timeout(Some(wire::ACK_SILENCE))
        .map_err(io("timeout"))?;
    conn.set_write_timeout(Some(wire::ACK_SILENCE))
        .map_err(io("timeout"))?;
    let mut reader = PeerReader {
        inner: conn.try_clone().map_err(io("clone"))?,
        timed_out: false,
    };
    let (kind, payload) = wire::next(peer, &mut reader)?;
    if kind != wire::JOIN {
        return Err(ClusterError::UnexpectedFrame {
            peer: peer.to_string(),
            kind: kind as char,
        });
    }
    let join: Join = wire::parse(peer, &payload)?;
    let pre = sh
        .preopened
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .and_then(Preopened::take);
    let mut store = match pre {
        Some(s) => s,
        None => Store::open(&sh.dir)?,
    };
    // incremental within this term from its newest, if we still hold it;
    // else from the newest snapshot both lines share (same id, same term)
    let same_term = join
        .have
        .as_ref()
        .map(|h| SnapshotId(h.clone()))
        .filter(|h| join.lineage == sh.epoch && h.is_valid() && store.resolve(h.as_str()).is_ok());
    let base = match same_term {
        Some(_) => None,
        None => common_base(&sh.dir, &join)?,
    };
    let since = same_term.or_else(|| base.clone());
    let full = since.is_none();
    let across_terms = base.is_some() && join.lineage != sh.epoch;
    let mut out = BufWriter::with_capacity(1 << 20, conn.try_clone().map_err(io("clone"))?);
    stream::write_header(&mut out)?;
    wire::send(
        &mut out,
        wire::WELCOME,
        &Welcome {
            node: sh.me.clone(),
            epoch: sh.epoch,
            full,
            base: base.map(|b| b.0),
        },
    )?;
    // The same standby again (it lost us and reconnected): its old
    // connection's acknowledgements are stale and must not hold the new
    // ones back until it times out.
    let stale: Vec<u64> = sh
        .standbys
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(k, v)| **k != id && v.node == join.node)
        .map(|(k, _)| *k)
        .collect();
    for k in stale {
        sh.standbys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&k);
        if let Some(c) = sh.conns.lock().unwrap_or_else(|p| p.into_inner()).get(&k) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
    sh.standbys
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            id,
            StandbyView {
                node: join.node.clone(),
                peer: peer.to_string(),
                acked: since.clone(),
                synced: false,
            },
        );
    sh.board.joined(&join.node, id, since.clone());
    sh.note(SenderNote::Joined {
        node: join.node.clone(),
        peer: peer.to_string(),
        full,
        across_terms,
    });

    // acknowledgements, on a thread of their own
    let sh2 = sh.clone();
    let peer2 = peer.to_string();
    let acks = std::thread::Builder::new()
        .name("rk-repl-acks".into())
        .spawn(move || read_acks(id, reader, &peer2, &sh2))
        .map_err(io("thread"))?;

    let mut state = SendState::default();
    let mut last: Option<SnapshotId> = since.clone();
    let mut seen = since;
    let mut last_sent_at = Instant::now();
    // A term that has committed nothing yet (a primary just elected, no
    // write since): the standby starts from what the app was started from,
    // the store's newest.
    let mut first = Ok(());
    if last.is_none() && sh.link.newest_committed().is_none() {
        first = store
            .latest()
            .map_err(ClusterError::from)
            .and_then(|newest| {
                let Some(info) = newest else { return Ok(()) };
                store.send_snapshot(&info.id, None, &mut state, &mut out)?;
                std::io::Write::flush(&mut out).map_err(io("write"))?;
                last = state.last().cloned();
                seen = Some(info.id);
                Ok(())
            });
    }
    let r = first.and_then(|_| {
        loop {
            if sh.stop.load(Ordering::SeqCst) || acks.is_finished() {
                break Ok(());
            }
            let newer = sh.link.wait_newer(seen.as_ref(), wire::HEARTBEAT_EVERY);
            if let Some(target) = newer {
                if let Err(e) = store.send_snapshot(&target, last.as_ref(), &mut state, &mut out) {
                    break Err(e.into());
                }
                if let Err(e) = std::io::Write::flush(&mut out) {
                    break Err(io("write")(e));
                }
                last = state.last().cloned();
                seen = Some(target);
                last_sent_at = Instant::now();
            } else if last_sent_at.elapsed() >= wire::HEARTBEAT_EVERY {
                let hb = Heartbeat {
                    epoch: sh.epoch,
                    newest: sh.link.newest_committed().map(|s| s.0),
                };
                if let Err(e) = wire::send(&mut out, wire::HEARTBEAT, &hb) {
                    break Err(e);
                }
                last_sent_at = Instant::now();
            }
        }
    });
    let _ = conn.shutdown(Shutdown::Both);
    let ack_r = acks.join().unwrap_or(Ok(()));
    r.and(ack_r)
}

fn read_acks(
    id: u64,
    mut reader: PeerReader<TcpStream>,
    peer: &str,
    sh: &Arc<Shared>,
) -> Result<(), ClusterError> {
    loop {
        let (kind, payload) = wire::next(peer, &mut reader)?;
        if kind != wire::ACK {
            return Err(ClusterError::UnexpectedFrame {
                peer: peer.to_string(),
                kind: kind as char,
            });
        }
        let ack: Ack = wire::parse(peer, &payload)?;
        if ack.epoch != sh.epoch {
            return Err(ClusterError::StaleEpoch {
                peer: peer.to_string(),
                theirs: ack.epoch,
                ours: sh.epoch,
            });
        }
        let acked = ack.id.map(SnapshotId).filter(|i| i.is_valid());
        let mut node = None;
        {
            let mut s = sh.standbys.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(v) = s.get_mut(&id) {
                node = Some(v.node.clone());
            }
            if let Some(v) = s.get_mut(&id)
                && acked.is_some()
                && acked > v.acked
            {
                v.acked = acked.clone();
                if !v.synced {
                    v.synced = true;
                    sh.note(SenderNote::Synced {
                        node: v.node.clone(),
                        id: acked.as_ref().map(|a| a.0.clone()).unwrap_or_default(),
                    });
                }
            }
        }
        if let (Some(n), Some(a)) = (node, acked.as_ref()) {
            sh.board.acked(&n, id, a);
        }
    }
}

/// The newest snapshot of the joining standby's line that ours holds with
/// the same id and term (None: nothing in common, a full resync).
fn common_base(dir: &std::path::Path, join: &Join) -> Result<Option<SnapshotId>, ClusterError> {
    if join.chain.is_empty() {
        return Ok(None);
    }
    let ours = lineage::read(dir)?;
    // back to the oldest snapshot the standby offered, no further
    let oldest = join
        .chain
        .iter()
        .filter_map(|c| SnapshotId(c.id.clone()).seq())
        .min();
    let line = lineage::line_back(dir, oldest.unwrap_or(0), usize::MAX)?;
    let labeled = lineage::labeled(&ours, &line, usize::MAX);
    Ok(lineage::pick_common(&join.chain, &labeled).map(SnapshotId))
}
