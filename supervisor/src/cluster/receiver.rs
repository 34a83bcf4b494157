//! The standby's end of replication: connects to the primary etcd names,
//! joins with its store's term, newest snapshot and newest line (each
//! snapshot with its term: lineage.rs), drops what a primary of a newer
//! term does not share (its welcome's `base`), applies each snapshot
//! into its own store (published only at the stream's valid 'C': a torn or
//! damaged snapshot publishes nothing; a delta whose parent it lacks is
//! refused, so no gap is ever applied) and acknowledges it.  A primary of
//! an older term than the newest etcd has shown is refused, and the stream
//! of the current one is cut as soon as etcd shows a newer term: the
//! standby stops acknowledging a deposed primary at once (in sync mode that
//! stops its acknowledgements to clients).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::error::ClusterError;
use super::hot_image::{Advance, HotImage};
use super::lineage::{self, Lineage};
use super::records::LeaderRecord;
use super::wire::{self, Ack, Heartbeat, Join, PeerReader, Welcome};
use crate::store::stream;
use crate::store::{SnapshotId, Store};

/// What the receiver tells the node (events, status).
#[derive(Debug)]
pub enum ReceiverNote {
    Following {
        primary: String,
        epoch: u64,
        full: bool,
        /// Incremental from a snapshot of an older term's line.
        across_terms: bool,
    },
    /// Snapshots after the common one with a newer term's primary went.
    TailDropped {
        primary: String,
        epoch: u64,
        base: String,
        count: usize,
    },
    Applied {
        id: String,
        epoch: u64,
    },
    Lost {
        primary: String,
        code: &'static str,
        error: String,
    },
    /// The hot image was read whole from the store (it did not hold the
    /// snapshot's parent: the first snapshot after this node started).
    ImageRebuilt {
        id: String,
        pages: u64,
        took_ms: u64,
    },
    /// The hot image could not follow: unusable until rebuilt.
    ImageFailed {
        id: String,
        code: &'static str,
        error: String,
    },
}

#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// The term of the primary followed now (0: none).
    pub epoch: u64,
    pub newest: Option<String>,
    /// The primary's newest committed snapshot, as its last heartbeat said.
    pub primary_newest: Option<String>,
    pub last_heard: Option<Instant>,
    /// Bytes from the primary came and are being handled (`Heard`): the
    /// time that takes is this node's, not the primary's silence.
    pub busy: bool,
}

struct Shared {
    me: String,
    dir: PathBuf,
    /// The leader etcd shows now (the node updates it).
    leader: Mutex<Option<LeaderRecord>>,
    /// The newest term etcd has shown: a primary below it is deposed.
    newest_epoch: AtomicU64,
    /// Terms up to this one get no acknowledgement (an early takeover is
    /// under way: election.rs); 0: none refused.
    refused: AtomicU64,
    stop: AtomicBool,
    conn: Mutex<Option<TcpStream>>,
    progress: Mutex<Progress>,
    notes: Mutex<Vec<ReceiverNote>>,
    /// The hot image, once the thread is gone (hot_image.rs).
    image: Mutex<Option<HotImage>>,
    /// The store as the receiver had it open (indexed), once the thread is
    /// gone: an elected node's replication sender starts from it.
    store: Mutex<Option<Store>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct Receiver {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    pub fn start(me: &str, dir: PathBuf) -> Result<Receiver, ClusterError> {
        let shared = Arc::new(Shared {
            me: me.to_string(),
            dir,
            leader: Mutex::new(None),
            newest_epoch: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            conn: Mutex::new(None),
            progress: Mutex::new(Progress::default()),
            notes: Mutex::new(Vec::new()),
            image: Mutex::new(None),
            store: Mutex::new(None),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rk-repl-recv".into())
            .spawn(move || run(&sh))
            .map_err(|e| ClusterError::io("replication: thread", e))?;
        Ok(Receiver {
            shared,
            thread: Some(thread),
        })
    }

    /// etcd's view changed: follow `leader` (None: there is none), and
    /// `epoch` is the newest term seen.  A connection to a primary of an
    /// older term is cut now.
    pub fn set_leader(&self, leader: Option<LeaderRecord>, epoch: u64) {
        self.shared.newest_epoch.fetch_max(epoch, Ordering::SeqCst);
        let changed = {
            let mut l = lock(&self.shared.leader);
            let changed = *l != leader;
            *l = leader;
            changed
        };
        let following = lock(&self.shared.progress).epoch;
        if changed && following != 0 && following < self.shared.newest_epoch.load(Ordering::SeqCst)
        {
            self.cut();
        }
    }

    fn cut(&self) {
        if let Some(c) = lock(&self.shared.conn).as_ref() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// A handle the agent uses to stop acknowledging a term before it takes
    /// the term over (election.rs, early takeover).
    pub fn fence_handle(&self) -> ReceiverFence {
        ReceiverFence(self.shared.clone())
    }

    pub fn progress(&self) -> Progress {
        lock(&self.shared.progress).clone()
    }

    pub fn notes(&self) -> Vec<ReceiverNote> {
        std::mem::take(&mut *lock(&self.shared.notes))
    }

    /// The hot image of the newest snapshot published, after `stop`.
    pub fn take_image(&self) -> Option<HotImage> {
        lock(&self.shared.image).take()
    }

    /// The store open with its indexes, after `stop` (None if it was never
    /// opened).
    pub fn take_store(&self) -> Option<Store> {
        lock(&self.shared.store).take()
    }

    /// Stops following: the connection is cut (no more acknowledgements),
    /// and a snapshot in flight is not published.  Returns when the thread
    /// is gone.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.cut();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Stops the receiver acknowledging a term: from `refuse(E)` on, no
/// acknowledgement goes to a primary of term E or older (its connection is
/// cut and it is not followed again) until `allow()`.  Every acknowledgement
/// names a snapshot already published in the store, so what was
/// acknowledged before is in the store an elected node starts from.
#[derive(Clone)]
pub struct ReceiverFence(Arc<Shared>);

impl ReceiverFence {
    pub fn refuse(&self, epoch: u64) {
        self.0.refused.fetch_max(epoch, Ordering::SeqCst);
        if let Some(c) = lock(&self.0.conn).as_ref() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    pub fn allow(&self) {
        self.0.refused.store(0, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for ReceiverFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ReceiverFence(refused={})",
            self.0.refused.load(Ordering::SeqCst)
        )
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(sh: &Arc<Shared>) {
    // kept across reconnections: an incremental rejoin goes on from it
    let mut image = HotImage::default();
    let mut store = None;
    follow_leaders(sh, &mut image, &mut store);
    *lock(&sh.image) = Some(image);
    *lock(&sh.store) = store;
}

/// The store stays open across reconnections (`store`): opening it loads
/// every pack's index, which at millions of chunks would delay each rejoin
/// (a new primary's first writes wait for it).
fn follow_leaders(sh: &Arc<Shared>, image: &mut HotImage, store: &mut Option<Store>) {
    while !sh.stop.load(Ordering::SeqCst) {
        let leader = lock(&sh.leader).clone();
        let Some(l) = leader.filter(|l| {
            l.node != sh.me
                && l.epoch >= sh.newest_epoch.load(Ordering::SeqCst)
                && l.epoch > sh.refused.load(Ordering::SeqCst)
        }) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let r = follow(sh, &l, image, store);
        {
            let mut p = lock(&sh.progress);
            p.epoch = 0;
            p.last_heard = None;
            p.busy = false;
        }
        *lock(&sh.conn) = None;
        if let Err(e) = r {
            if !sh.stop.load(Ordering::SeqCst) {
                lock(&sh.notes).push(ReceiverNote::Lost {
                    primary: l.node.clone(),
                    code: e.code(),
                    error: e.to_string(),
                });
            }
            // short: a new primary is usually listening within a few ms
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// One connection attempt; the loop tries again 50 ms later.  A LAN's
/// handshake takes well under a millisecond; what this bounds is how long
/// an elected node waits for its receiver to let go of a dead primary.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(50);

fn connect(addr: &str) -> Result<TcpStream, ClusterError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| ClusterError::io(format!("replication: resolve {addr}"), e))?
        .collect();
    let mut last = None;
    for a in addrs {
        // short: a stop (this node elected) waits for a connect in progress
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(c) => return Ok(c),
            Err(e) => last = Some(e),
        }
    }
    Err(ClusterError::io(
        format!("replication: connect {addr}"),
        last.unwrap_or_else(|| std::io::Error::other("no address")),
    ))
}

fn follow(
    sh: &Arc<Shared>,
    l: &LeaderRecord,
    image: &mut HotImage,
    cached: &mut Option<Store>,
) -> Result<(), ClusterError> {
    let peer = format!("{}@{}", l.node, l.replication);
    let io = |what: &'static str| {
        let p = peer.clone();
        move |e| ClusterError::io(format!("replication from {p}: {what}"), e)
    };
    let conn = connect(&l.replication)?;
    conn.set_nodelay(true).map_err(io("nodelay"))?;
    conn.set_read_timeout(Some(wire::SILENCE))
        .map_err(io("timeout"))?;
    conn.set_write_timeout(Some(wire::SILENCE))
        .map_err(io("timeout"))?;
    *lock(&sh.conn) = Some(conn.try_clone().map_err(io("clone"))?);
    if sh.stop.load(Ordering::SeqCst) {
        return Ok(());
    }
    let mut out = conn.try_clone().map_err(io("clone"))?;
    let mut input = PeerReader {
        inner: Heard {
            inner: std::io::BufReader::with_capacity(1 << 20, conn),
            sh: sh.clone(),
        },
        timed_out: false,
    };
    let lin = lineage::read(&sh.dir)?;
    let line = match lin.epoch {
        0 => Vec::new(),
        _ => lineage::line_back(&sh.dir, 0, lineage::OFFERED)?,
    };
    let have = line.first().map(|i| i.0.clone());
    wire::send(
        &mut out,
        wire::JOIN,
        &Join {
            node: sh.me.clone(),
            lineage: lin.epoch,
            have: have.clone(),
            chain: lineage::labeled(&lin, &line, lineage::OFFERED),
        },
    )?;
    stream::read_header(&mut input)?;
    let (kind, payload) = wire::next(&peer, &mut input)?;
    if kind != wire::WELCOME {
        return Err(ClusterError::UnexpectedFrame {
            peer,
            kind: kind as char,
        });
    }
    let w: Welcome = wire::parse(&peer, &payload)?;
    let newest_seen = sh.newest_epoch.load(Ordering::SeqCst);
    if w.epoch < newest_seen || w.epoch != l.epoch {
        return Err(ClusterError::StaleEpoch {
            peer,
            theirs: w.epoch,
            ours: newest_seen.max(l.epoch),
        });
    }
    let mut across_terms = false;
    let mut start = have;
    if w.full {
        lineage::reset(&sh.dir)?;
    } else if let Some(base) = w.base.as_ref().map(|b| SnapshotId(b.clone())) {
        if !line.contains(&base) {
            // never drop anything on the word of a primary that names a
            // snapshot we did not offer
            return Err(ClusterError::Peer {
                peer,
                detail: format!("welcome names base {base}, which is not on our line"),
            });
        }
        // the primary continues from an older snapshot of our line: what we
        // hold after it is not on its line (docs/failover.md: it was never
        // acknowledged to a client); drop it, then label what comes next
        let count = lineage::drop_after(&sh.dir, &base)?;
        if count > 0 {
            lock(&sh.notes).push(ReceiverNote::TailDropped {
                primary: peer.clone(),
                epoch: w.epoch,
                base: base.0.clone(),
                count,
            });
        }
        across_terms = lin.epoch != w.epoch;
        if across_terms || count > 0 {
            lineage::write(&sh.dir, &lin.continue_with(w.epoch, base.seq()))?;
        }
        start = Some(base.0);
    }
    // a full resync moved the old store aside: it is opened again
    let store = match cached.take() {
        Some(s) if !w.full => cached.insert(s),
        _ => cached.insert(Store::create_or_open(&sh.dir)?),
    };
    let mut applied = if w.full { None } else { start };
    // the image holds the store's newest snapshot, or nothing
    if let Some(at) = image.at().cloned()
        && applied.as_deref() != Some(at.as_str())
    {
        let error = match &applied {
            Some(base) => format!("the store continues from {base}, the image held {at}"),
            None => format!("a full resync began; the image held {at}"),
        };
        lock(&sh.notes).push(ReceiverNote::ImageFailed {
            id: at.0.clone(),
            code: "hot_image_diverged",
            error: error.clone(),
        });
        image.invalidate("hot_image_diverged", error);
    }
    {
        let mut p = lock(&sh.progress);
        p.epoch = w.epoch;
        p.newest = applied.clone();
        p.last_heard = Some(Instant::now());
    }
    lock(&sh.notes).push(ReceiverNote::Following {
        primary: peer.clone(),
        epoch: w.epoch,
        full: w.full,
        across_terms,
    });
    let mut lineage_written = !w.full;
    let mut published: Option<SnapshotId> = None;
    loop {
        if sh.stop.load(Ordering::SeqCst)
            || sh.newest_epoch.load(Ordering::SeqCst) > w.epoch
            || sh.refused.load(Ordering::SeqCst) >= w.epoch
        {
            return Ok(()); // deposed, refused, or we stop: acknowledge nothing more
        }
        let (kind, payload) = wire::next(&peer, &mut input)?;
        match kind {
            wire::SNAPSHOT => {
                let got = store.recv_snapshot(&mut input, &payload).map_err(|e| {
                    if input.timed_out {
                        ClusterError::Silent { peer: peer.clone() }
                    } else {
                        e.into()
                    }
                });
                if let Some(id) = got? {
                    published = Some(id.clone());
                    if !lineage_written {
                        lineage::write(&sh.dir, &Lineage::whole(w.epoch))?;
                        lineage_written = true;
                    }
                    applied = Some(id.0.clone());
                    lock(&sh.notes).push(ReceiverNote::Applied {
                        id: id.0.clone(),
                        epoch: w.epoch,
                    });
                }
            }
            wire::HEARTBEAT => {
                let hb: Heartbeat = wire::parse(&peer, &payload)?;
                if hb.epoch != w.epoch {
                    return Err(ClusterError::StaleEpoch {
                        peer,
                        theirs: hb.epoch,
                        ours: w.epoch,
                    });
                }
                lock(&sh.progress).primary_newest = hb.newest;
            }
            k => {
                return Err(ClusterError::UnexpectedFrame {
                    peer,
                    kind: k as char,
                });
            }
        }
        lock(&sh.progress).newest = applied.clone();
        let deposed = sh.newest_epoch.load(Ordering::SeqCst) > w.epoch
            || sh.refused.load(Ordering::SeqCst) >= w.epoch;
        let acked = if deposed {
            Ok(()) // acknowledge nothing more
        } else {
            wire::send(
                &mut out,
                wire::ACK,
                &Ack {
                    epoch: w.epoch,
                    id: applied.clone(),
                },
            )
            .and_then(|_| out.flush().map_err(io("flush")))
        };
        // After the acknowledgement (the store holds what is acknowledged;
        // the image is what makes taking over fast), and on every way out
        // once a snapshot is published: an elected node's image must hold
        // the newest snapshot of its store, or the app would start from an
        // older one than the store says.
        if let Some(id) = published.take() {
            advance_image(sh, store, image, &id);
        }
        if deposed {
            return Ok(());
        }
        acked?;
    }
}

/// The stream from the primary, timing its silence: the clock runs only
/// while this thread waits for bytes (from each read's start); from the
/// moment bytes come until the next read, the thread is busy with them
/// (receiving the rest of a snapshot, publishing it with its fsyncs,
/// acknowledging it, writing the image) and that time is not the
/// primary's silence.  A primary cut off mid-snapshot is silent from the
/// read that waits for its next frame.
struct Heard<R: Read> {
    inner: R,
    sh: Arc<Shared>,
}

impl<R: Read> Read for Heard<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        {
            let mut p = lock(&self.sh.progress);
            p.last_heard = Some(Instant::now());
            p.busy = false;
        }
        let r = self.inner.read(buf);
        if matches!(r, Ok(n) if n > 0) {
            let mut p = lock(&self.sh.progress);
            p.last_heard = Some(Instant::now());
            p.busy = true;
        }
        r
    }
}

fn advance_image(sh: &Shared, store: &Store, image: &mut HotImage, id: &SnapshotId) {
    match image.advance(store, id) {
        Ok(Advance::Applied { .. }) => {}
        Ok(Advance::Rebuilt { pages, took }) => lock(&sh.notes).push(ReceiverNote::ImageRebuilt {
            id: id.0.clone(),
            pages,
            took_ms: took.as_millis() as u64,
        }),
        Err(e) => lock(&sh.notes).push(ReceiverNote::ImageFailed {
            id: id.0.clone(),
            code: e.code(),
            error: e.to_string(),
        }),
    }
}
