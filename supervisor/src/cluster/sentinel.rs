//! The Sentinel endpoint (docs/failover.md, "Clients find the primary"):
//! the subset of the Redis Sentinel protocol that unmodified clients use to
//! find a master (redis-py's `Sentinel`, `redis-cli SENTINEL
//! get-master-addr-by-name`), answered from etcd.  Every answer is read
//! from etcd at the time of the request, in one read at one revision (the
//! cluster's prefix): the master is the node the `leader` key names, and
//! that key is attached to the primary's lease, so a node whose lease is
//! gone (expired, revoked, taken over) is never named.  A leader record
//! whose term is not the newest `epoch` is not named either.
//!
//! Standbys run no app, so `SENTINEL replicas` is empty (redis-py's
//! `slave_for` then falls back to the master).  Nothing here changes the
//! cluster: `SENTINEL FAILOVER` and friends are refused (`rekindle
//! failover` does a planned switchover).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::error::ClusterError;
use super::etcd::Etcd;
use super::records::{self, LeaderRecord, NodeRecord};
use super::resp::{self, Reply};
use crate::event::{EventLog, ev};

/// How long one etcd read may take before the request is answered without.
const ETCD_TIMEOUT: Duration = Duration::from_millis(500);
/// Connections served at once; more are refused with an error.
const MAX_CLIENTS: usize = 256;
/// A request still incomplete past this many bytes is refused (no
/// Sentinel request is anywhere near it).
const MAX_PENDING: usize = 1 << 20;

pub type Events = Arc<Mutex<EventLog>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn emit(events: &Events, e: crate::event::Event) {
    lock(events).emit(e);
}

#[derive(Debug, Clone)]
pub struct SentinelConfig {
    /// HOST:PORT to listen on.
    pub listen: String,
    pub endpoints: Vec<String>,
    /// The cluster names served (clients call them master names).
    pub clusters: Vec<String>,
}

/// One cluster as etcd shows it, read at one revision.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    pub epoch: u64,
    pub leader: Option<LeaderRecord>,
    pub nodes: Vec<NodeRecord>,
}

impl ClusterView {
    /// The parts of one cluster's prefix, all read at one revision.
    pub fn from_kvs(cluster: &str, kvs: &[super::etcd::Kv]) -> Result<ClusterView, ClusterError> {
        let ekey = records::epoch_key(cluster);
        let lkey = records::leader_key(cluster);
        let npre = records::nodes_prefix(cluster);
        let mut v = ClusterView::default();
        for kv in kvs {
            if kv.key == ekey {
                v.epoch = records::parse_epoch(&ekey, &kv.value)?;
            } else if kv.key == lkey {
                v.leader = Some(records::parse(&lkey, &kv.value)?);
            } else if kv.key.starts_with(&npre) {
                v.nodes.push(records::parse(&kv.key, &kv.value)?);
            }
        }
        v.nodes.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(v)
    }

    /// The primary of the newest term and the address its clients use:
    /// None when there is none (no leader key: no live lease), when the
    /// leader's term is not the newest, or when it publishes no address.
    pub fn master(&self) -> Option<(&LeaderRecord, String, u16)> {
        let l = self.leader.as_ref()?;
        if l.epoch != self.epoch {
            return None;
        }
        let (host, port) = client_addr(l)?;
        Some((l, host, port))
    }
}

/// The primary's first TCP service address; an unspecified host (0.0.0.0,
/// ::) is replaced by the host of its replication address.
fn client_addr(l: &LeaderRecord) -> Option<(String, u16)> {
    let serve: SocketAddr = l.serve.first()?.parse().ok()?;
    let host = if serve.ip().is_unspecified() {
        let repl: SocketAddr = l.replication.parse().ok()?;
        repl.ip().to_string()
    } else {
        serve.ip().to_string()
    };
    Some((host, serve.port()))
}

/// Reads the clusters from etcd, reconnecting after an error.
struct Source {
    endpoints: Vec<String>,
    etcd: Mutex<Option<Etcd>>,
}

impl Source {
    fn view(&self, cluster: &str) -> Result<ClusterView, ClusterError> {
        let mut g = lock(&self.etcd);
        if g.is_none() {
            *g = Some(Etcd::connect(&self.endpoints, ETCD_TIMEOUT)?);
        }
        let Some(e) = g.as_mut() else {
            return Err(ClusterError::EtcdTimeout {
                what: "connect",
                ms: ETCD_TIMEOUT.as_millis() as u64,
            });
        };
        match e.get_prefix(&records::prefix(cluster), ETCD_TIMEOUT) {
            Ok(kvs) => ClusterView::from_kvs(cluster, &kvs),
            Err(err) => {
                *g = None; // a fresh connection next time
                Err(err)
            }
        }
    }
}

struct Shared {
    cfg: SentinelConfig,
    /// The address bound (a sentinel does not list itself).
    addr: SocketAddr,
    /// 40 hex digits, as Sentinel's run ids.
    myid: String,
    source: Source,
    events: Events,
    stop: AtomicBool,
    clients: AtomicUsize,
    /// An etcd outage is logged once, not per request.
    etcd_down: AtomicBool,
}

pub struct SentinelServer {
    shared: Arc<Shared>,
    pub addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl SentinelServer {
    pub fn start(cfg: SentinelConfig, events: Events) -> Result<SentinelServer, ClusterError> {
        let listener = TcpListener::bind(&cfg.listen)
            .map_err(|e| ClusterError::io(format!("sentinel: listen on {}", cfg.listen), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ClusterError::io("sentinel: local address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ClusterError::io("sentinel: nonblocking", e))?;
        let myid = blake3::hash(format!("rekindle-sentinel {addr} {:?}", cfg.clusters).as_bytes())
            .to_hex()[..40]
            .to_string();
        emit(
            &events,
            ev("sentinel_listen")
                .s("addr", addr.to_string())
                .s("masters", cfg.clusters.join(",")),
        );
        let shared = Arc::new(Shared {
            source: Source {
                endpoints: cfg.endpoints.clone(),
                etcd: Mutex::new(None),
            },
            cfg,
            addr,
            myid,
            events,
            stop: AtomicBool::new(false),
            clients: AtomicUsize::new(0),
            etcd_down: AtomicBool::new(false),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rk-sentinel".into())
            .spawn(move || accept_loop(&sh, listener))
            .map_err(|e| ClusterError::io("sentinel: thread", e))?;
        Ok(SentinelServer {
            shared,
            addr,
            thread: Some(thread),
        })
    }

    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(sh: &Arc<Shared>, listener: TcpListener) {
    while !sh.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((conn, peer)) => {
                if sh.clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
                    sh.clients.fetch_sub(1, Ordering::SeqCst);
                    let mut c = conn;
                    let _ = c.write_all(b"-ERR max number of clients reached\r\n");
                    continue;
                }
                let sh2 = sh.clone();
                let spawned = std::thread::Builder::new()
                    .name("rk-sentinel-c".into())
                    .spawn(move || {
                        serve_client(&sh2, conn, peer);
                        sh2.clients.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    sh.clients.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                emit(
                    &sh.events,
                    ev("sentinel_error")
                        .s("code", "accept")
                        .s("error", e.to_string()),
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn serve_client(sh: &Shared, mut conn: TcpStream, peer: SocketAddr) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
    let mut conn_state = Conn { proto: 2 };
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    while !sh.stop.load(Ordering::SeqCst) {
        match conn.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => return,
        }
        let mut out = Vec::new();
        let mut quit = false;
        if buf.len() > MAX_PENDING {
            emit(
                &sh.events,
                ev("sentinel_bad_request")
                    .s("peer", peer.to_string())
                    .s("code", "request_too_large")
                    .u("bytes", buf.len() as u64),
            );
            let _ = conn.write_all(b"-ERR Protocol error: request too large\r\n");
            return;
        }
        loop {
            match resp::parse_request(&buf) {
                Ok(None) => break,
                Ok(Some((args, used))) => {
                    buf.drain(..used);
                    if args.is_empty() {
                        continue;
                    }
                    let (reply, close) = answer(sh, &mut conn_state, &args);
                    reply.encode(conn_state.proto, &mut out);
                    if close {
                        quit = true;
                        break;
                    }
                }
                Err(e) => {
                    emit(
                        &sh.events,
                        ev("sentinel_bad_request")
                            .s("peer", peer.to_string())
                            .s("code", e.code())
                            .s("error", e.to_string()),
                    );
                    Reply::Error(format!("ERR Protocol error: {e}"))
                        .encode(conn_state.proto, &mut out);
                    quit = true;
                    break;
                }
            }
        }
        if !out.is_empty() && conn.write_all(&out).is_err() {
            return;
        }
        if quit {
            return;
        }
    }
}

/// One connection's negotiated state.
struct Conn {
    /// 2 or 3 (HELLO).
    proto: u8,
}

fn lower(a: &[u8]) -> String {
    String::from_utf8_lossy(a).to_ascii_lowercase()
}

fn arity(cmd: &str) -> Reply {
    Reply::Error(format!("ERR wrong number of arguments for '{cmd}' command"))
}

/// The reply to one request, and whether to close the connection after it.
fn answer(sh: &Shared, conn: &mut Conn, args: &[Vec<u8>]) -> (Reply, bool) {
    let cmd = lower(&args[0]);
    let reply = match cmd.as_str() {
        "ping" => match args.len() {
            1 => Reply::Simple("PONG".into()),
            2 => Reply::Bulk(args[1].clone()),
            _ => arity("ping"),
        },
        "quit" => return (Reply::Simple("OK".into()), true),
        "hello" => hello(sh, conn, args),
        "client" => match args.get(1).map(|a| lower(a)).as_deref() {
            Some("setname" | "setinfo") => Reply::Simple("OK".into()),
            Some("getname") => Reply::Null,
            Some(s) => Reply::Error(format!(
                "ERR unknown subcommand '{s}'. Try CLIENT SETNAME, SETINFO, GETNAME."
            )),
            None => arity("client"),
        },
        "auth" => Reply::Error(
            "ERR AUTH <password> called without any password configured for the default user"
                .into(),
        ),
        "command" => Reply::Array(Vec::new()),
        "role" => Reply::Array(vec![
            Reply::bulk("sentinel"),
            Reply::Array(
                sh.cfg
                    .clusters
                    .iter()
                    .map(|c| Reply::bulk(c.clone()))
                    .collect(),
            ),
        ]),
        "info" => info(sh),
        "sentinel" => sentinel(sh, args),
        other => Reply::Error(format!(
            "ERR unknown command '{}', with args beginning with: {}",
            other,
            args[1..]
                .iter()
                .take(3)
                .map(|a| format!("'{}'", String::from_utf8_lossy(a)))
                .collect::<Vec<_>>()
                .join(" ")
        )),
    };
    (reply, false)
}

fn hello(sh: &Shared, conn: &mut Conn, args: &[Vec<u8>]) -> Reply {
    if let Some(v) = args.get(1) {
        match String::from_utf8_lossy(v).parse::<u8>() {
            Ok(p @ (2 | 3)) => conn.proto = p,
            _ => {
                return Reply::Error(
                    "NOPROTO sorry, this protocol version is not supported".into(),
                );
            }
        }
    }
    // AUTH and SETNAME options: no passwords here; names are accepted
    let mut i = 2;
    while i < args.len() {
        match lower(&args[i]).as_str() {
            "auth" if i + 2 < args.len() => {
                return Reply::Error(
                    "ERR AUTH <password> called without any password configured".into(),
                );
            }
            "setname" if i + 1 < args.len() => i += 2,
            _ => return Reply::Error("ERR syntax error in HELLO option".into()),
        }
    }
    Reply::Map(vec![
        (Reply::bulk("server"), Reply::bulk("rekindle-sentinel")),
        (Reply::bulk("version"), Reply::bulk("7.0.0")),
        (Reply::bulk("proto"), Reply::Int(conn.proto as i64)),
        (Reply::bulk("id"), Reply::Int(0)),
        (Reply::bulk("mode"), Reply::bulk("sentinel")),
        (Reply::bulk("role"), Reply::bulk("sentinel")),
        (Reply::bulk("modules"), Reply::Array(Vec::new())),
        (Reply::bulk("myid"), Reply::bulk(sh.myid.clone())),
    ])
}

/// The view of `name`, or the reply to give instead (an unknown name, or
/// etcd cannot be read: logged once per outage).
fn view_of(sh: &Shared, name: &[u8]) -> Result<ClusterView, Reply> {
    let name = String::from_utf8_lossy(name);
    if !sh.cfg.clusters.iter().any(|c| *c == name) {
        return Err(Reply::Error("ERR No such master with that name".into()));
    }
    read_view(sh, &name)
}

fn read_view(sh: &Shared, name: &str) -> Result<ClusterView, Reply> {
    match sh.source.view(name) {
        Ok(v) => {
            if sh.etcd_down.swap(false, Ordering::SeqCst) {
                emit(&sh.events, ev("sentinel_etcd").s("code", "etcd_back"));
            }
            Ok(v)
        }
        Err(e) => {
            if !sh.etcd_down.swap(true, Ordering::SeqCst) {
                emit(
                    &sh.events,
                    ev("sentinel_etcd")
                        .s("code", e.code())
                        .s("error", e.to_string()),
                );
            }
            Err(Reply::Error(format!(
                "ETCDUNAVAILABLE cannot read the cluster from etcd ({}): {e}",
                e.code()
            )))
        }
    }
}

/// The other sentinels of the cluster: the nodes that publish one.
fn other_sentinels<'a>(sh: &Shared, v: &'a ClusterView) -> Vec<(&'a NodeRecord, SocketAddr)> {
    v.nodes
        .iter()
        .filter_map(|n| {
            let a: SocketAddr = n.sentinel.as_ref()?.parse().ok()?;
            Some((n, a))
        })
        .filter(|(_, a)| *a != sh.addr)
        .collect()
}

/// The master's state, in Sentinel's field names (redis-py checks `flags`
/// and `num-other-sentinels`); `rekindle-*` fields are ours.
fn master_state(sh: &Shared, name: &str, v: &ClusterView) -> Reply {
    let others = other_sentinels(sh, v).len();
    let (ip, port, flags, runid, standbys) = match v.master() {
        Some((l, ip, port)) => {
            let standbys = v
                .nodes
                .iter()
                .find(|n| n.node == l.node)
                .map_or(0, |n| n.standbys.len());
            (ip, port, "master".to_string(), l.node.clone(), standbys)
        }
        // no primary with a live lease: down for every client
        None => (
            String::new(),
            0,
            "master,s_down,o_down".to_string(),
            String::new(),
            0,
        ),
    };
    Reply::str_map(&[
        ("name", name.to_string()),
        ("ip", ip),
        ("port", port.to_string()),
        ("runid", runid.clone()),
        ("flags", flags),
        ("link-pending-commands", "0".into()),
        ("link-refcount", "1".into()),
        ("last-ping-sent", "0".into()),
        ("last-ok-ping-reply", "0".into()),
        ("last-ping-reply", "0".into()),
        ("info-refresh", "0".into()),
        ("role-reported", "master".into()),
        ("role-reported-time", "0".into()),
        ("config-epoch", v.epoch.to_string()),
        ("num-slaves", "0".into()),
        ("num-other-sentinels", others.to_string()),
        ("quorum", "1".into()),
        ("parallel-syncs", "1".into()),
        ("rekindle-node", runid),
        ("rekindle-epoch", v.epoch.to_string()),
        ("rekindle-standbys", standbys.to_string()),
    ])
}

fn sentinel(sh: &Shared, args: &[Vec<u8>]) -> Reply {
    let Some(sub) = args.get(1).map(|a| lower(a)) else {
        return arity("sentinel");
    };
    let named = |n: usize| -> Result<&[u8], Reply> {
        if args.len() != n {
            return Err(arity(&format!("sentinel|{sub}")));
        }
        Ok(&args[2])
    };
    let r: Result<Reply, Reply> = (|| match sub.as_str() {
        "get-master-addr-by-name" => {
            let name = String::from_utf8_lossy(named(3)?).into_owned();
            if !sh.cfg.clusters.contains(&name) {
                return Ok(Reply::NullArray);
            }
            let v = read_view(sh, &name)?;
            Ok(match v.master() {
                Some((_, ip, port)) => {
                    Reply::Array(vec![Reply::bulk(ip), Reply::bulk(port.to_string())])
                }
                None => Reply::NullArray,
            })
        }
        "master" => {
            let name = named(3)?;
            let v = view_of(sh, name)?;
            Ok(master_state(sh, &String::from_utf8_lossy(name), &v))
        }
        "masters" => {
            if args.len() != 2 {
                return Err(arity("sentinel|masters"));
            }
            // a cluster etcd cannot be read for is left out (logged): a
            // client then asks its next sentinel
            let mut out = Vec::new();
            for c in &sh.cfg.clusters {
                if let Ok(v) = read_view(sh, c) {
                    out.push(master_state(sh, c, &v));
                }
            }
            Ok(Reply::Array(out))
        }
        "slaves" | "replicas" => {
            view_of(sh, named(3)?)?;
            Ok(Reply::Array(Vec::new()))
        }
        "sentinels" => {
            let v = view_of(sh, named(3)?)?;
            Ok(Reply::Array(
                other_sentinels(sh, &v)
                    .into_iter()
                    .map(|(n, a)| {
                        Reply::str_map(&[
                            ("name", n.node.clone()),
                            ("ip", a.ip().to_string()),
                            ("port", a.port().to_string()),
                            ("runid", n.node.clone()),
                            ("flags", "sentinel".into()),
                            ("rekindle-role", n.role.as_str().into()),
                            ("rekindle-epoch", n.epoch.to_string()),
                        ])
                    })
                    .collect(),
            ))
        }
        "ckquorum" => {
            let v = view_of(sh, named(3)?)?;
            Ok(match v.master() {
                Some(_) => Reply::Simple("OK 1 usable Sentinels. etcd decides the primary".into()),
                None => Reply::Error(format!(
                    "NOQUORUM no primary with a live lease in etcd (newest term {})",
                    v.epoch
                )),
            })
        }
        "myid" => Ok(Reply::bulk(sh.myid.clone())),
        "failover" => Ok(Reply::Error(
            "ERR this sentinel is read-only: for a planned switchover run `rekindle failover`"
                .into(),
        )),
        other => Ok(Reply::Error(format!(
            "ERR unknown or unsupported SENTINEL subcommand '{other}' (supported: \
             get-master-addr-by-name, master, masters, replicas, slaves, sentinels, ckquorum, myid)"
        ))),
    })();
    r.unwrap_or_else(|e| e)
}

fn info(sh: &Shared) -> Reply {
    let mut s = String::from("# Server\r\nredis_mode:sentinel\r\nrekindle:1\r\n\r\n# Sentinel\r\n");
    s.push_str(&format!("sentinel_masters:{}\r\n", sh.cfg.clusters.len()));
    let mut lines = BTreeMap::new();
    for (i, c) in sh.cfg.clusters.iter().enumerate() {
        let line = match read_view(sh, c) {
            Ok(v) => match v.master() {
                Some((_, ip, port)) => format!(
                    "name={c},status=ok,address={ip}:{port},slaves=0,sentinels={},epoch={}",
                    other_sentinels(sh, &v).len() + 1,
                    v.epoch
                ),
                None => format!(
                    "name={c},status=odown,address=,slaves=0,sentinels=1,epoch={}",
                    v.epoch
                ),
            },
            Err(_) => format!("name={c},status=etcd_unavailable,address=,slaves=0,sentinels=1"),
        };
        lines.insert(i, line);
    }
    for (i, l) in lines {
        s.push_str(&format!("master{i}:{l}\r\n"));
    }
    Reply::Bulk(s.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::etcd::Kv;

    fn kv(key: &str, value: &str) -> Kv {
        Kv {
            key: key.into(),
            value: value.as_bytes().to_vec(),
            mod_revision: 1,
            lease: 0,
        }
    }

    #[test]
    fn the_master_is_the_leader_of_the_newest_term_only() {
        let leader =
            r#"{"node":"n2","epoch":3,"replication":"10.0.0.2:7400","serve":["0.0.0.0:6379"]}"#;
        let v = ClusterView::from_kvs(
            "rkv",
            &[
                kv("/rekindle/rkv/epoch", "3"),
                kv("/rekindle/rkv/leader", leader),
            ],
        )
        .unwrap_or_default();
        let (l, ip, port) = v.master().unwrap_or_else(|| panic!("no master"));
        assert_eq!(
            (l.node.as_str(), ip.as_str(), port),
            ("n2", "10.0.0.2", 6379)
        );
        // a record of an older term than the newest is not named
        let v = ClusterView::from_kvs(
            "rkv",
            &[
                kv("/rekindle/rkv/epoch", "4"),
                kv("/rekindle/rkv/leader", leader),
            ],
        )
        .unwrap_or_default();
        assert!(v.master().is_none());
        // no leader key (the lease is gone): no master
        let v = ClusterView::from_kvs("rkv", &[kv("/rekindle/rkv/epoch", "3")]).unwrap_or_default();
        assert!(v.master().is_none());
        // a malformed record is an error, not a guess
        assert!(ClusterView::from_kvs("rkv", &[kv("/rekindle/rkv/leader", "{")]).is_err());
        assert!(ClusterView::from_kvs("rkv", &[kv("/rekindle/rkv/epoch", "x")]).is_err());
    }
}
