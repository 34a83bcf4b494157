//! The blocking façade over the async etcd client: one small
//! current-thread tokio runtime per `Etcd`, every call bounded by a timeout,
//! so the rest of the supervisor stays synchronous (poll loops and threads)
//! and no call can block past its deadline.
//!
//! It talks to one member at a time.  A call that member refused before
//! anything was sent (connection refused: the member is dead) is made
//! again at the next member, within the same deadline; any other transport
//! failure or a timeout fails the call and moves the next call on to the
//! next member (a request that may have been applied is never sent twice:
//! a transaction's outcome must not be taken from its second try).  With
//! `require_leader`, a member cut off from etcd's quorum answers at once
//! instead of waiting.

use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaseKeepAliveStream, LeaseKeeper,
    PutOptions, Txn, TxnOp,
};

use super::error::ClusterError;

pub struct Etcd {
    rt: tokio::runtime::Runtime,
    client: Client,
    /// Every member's client URL, and the one `client` talks to.
    members: Vec<String>,
    current: usize,
    opts: ConnectOptions,
    endpoints: String,
    keeper: Option<(i64, LeaseKeeper, LeaseKeepAliveStream)>,
}

/// One key's value and revisions.
#[derive(Debug, Clone)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub lease: i64,
}

/// A condition of a transaction.
pub enum Cond {
    /// The key does not exist.
    Absent(String),
    /// The key was last modified at this revision (0: it does not exist).
    ModRevision(String, i64),
    /// The key holds exactly this value.
    Value(String, Vec<u8>),
}

/// An operation of a transaction.
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<i64>,
    },
    Delete(String),
}

impl Etcd {
    /// Connects (lazily: the first call finds out whether etcd is there),
    /// to the first of `endpoints`; the others are where calls go when it
    /// fails.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<Etcd, ClusterError> {
        let joined = endpoints.join(",");
        let err = |detail: String| ClusterError::Etcd {
            endpoints: joined.clone(),
            detail,
        };
        if endpoints.is_empty() {
            return Err(err("no endpoint".into()));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err(format!("tokio runtime: {e}")))?;
        let opts = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(Duration::from_millis(500), timeout)
            .with_require_leader(true);
        let client = Self::member(&rt, &endpoints[0], &opts, timeout)
            .map_err(|e| e.unwrap_or_else(|| err("connect".into())))?;
        Ok(Etcd {
            rt,
            client,
            members: endpoints.to_vec(),
            current: 0,
            opts,
            endpoints: joined,
            keeper: None,
        })
    }

    /// A client of one member.  Err(None): the connect timed out.
    fn member(
        rt: &tokio::runtime::Runtime,
        url: &str,
        opts: &ConnectOptions,
        timeout: Duration,
    ) -> Result<Client, Option<ClusterError>> {
        rt.block_on(async {
            tokio::time::timeout(timeout, Client::connect([url], Some(opts.clone()))).await
        })
        .map_err(|_| None)?
        .map_err(|e| {
            Some(ClusterError::Etcd {
                endpoints: url.to_string(),
                detail: e.to_string(),
            })
        })
    }

    /// The next call goes to the next member (a no-op with one).
    fn next_member(&mut self, timeout: Duration) {
        if self.members.len() < 2 {
            return;
        }
        let next = (self.current + 1) % self.members.len();
        if let Ok(c) = Self::member(&self.rt, &self.members[next], &self.opts, timeout) {
            self.client = c;
            self.current = next;
            self.keeper = None; // a keep-alive stream belongs to its member
        }
    }

    fn err(&self, e: etcd_client::Error) -> ClusterError {
        ClusterError::Etcd {
            endpoints: self.endpoints.clone(),
            detail: e.to_string(),
        }
    }

    /// `f` at the current member, and at the next ones while each refuses
    /// the connection (nothing was sent), all within `timeout`.
    fn run<T>(
        &mut self,
        what: &'static str,
        timeout: Duration,
        mut f: impl AsyncFnMut(&mut Client) -> Result<T, etcd_client::Error>,
    ) -> Result<T, ClusterError> {
        let deadline = Instant::now() + timeout;
        let mut tries = 0;
        loop {
            tries += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            let client = &mut self.client;
            let r = self
                .rt
                .block_on(async { tokio::time::timeout(left, f(client)).await });
            match r {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if never_sent(&e) && tries < self.members.len() => {
                    self.next_member(left);
                }
                Ok(Err(e)) => {
                    let out = self.err(e);
                    self.next_member(left);
                    return Err(out);
                }
                Err(_) => {
                    self.next_member(timeout);
                    return Err(ClusterError::EtcdTimeout {
                        what,
                        ms: timeout.as_millis() as u64,
                    });
                }
            }
        }
    }

    fn kv(kv: &etcd_client::KeyValue) -> Kv {
        Kv {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value: kv.value().to_vec(),
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
        }
    }

    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<Option<Kv>, ClusterError> {
        let key = key.to_string();
        let r = self.run("get", timeout, async |c: &mut Client| {
            c.get(key.clone(), None).await
        })?;
        Ok(r.kvs().first().map(Self::kv))
    }

    /// Several keys read at one revision (one transaction of gets): what
    /// a writer puts together in one transaction is seen together.
    pub fn get_at_once(
        &mut self,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Option<Kv>>, ClusterError> {
        let ops: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(k.to_string(), None))
            .collect();
        let txn = Txn::new().and_then(ops);
        let r = self.run("get", timeout, async |c: &mut Client| {
            c.txn(txn.clone()).await
        })?;
        let mut out = Vec::with_capacity(keys.len());
        for op in r.op_responses() {
            match op {
                etcd_client::TxnOpResponse::Get(g) => out.push(g.kvs().first().map(Self::kv)),
                _ => out.push(None),
            }
        }
        if out.len() != keys.len() {
            return Err(ClusterError::io(
                "etcd: a read of several keys",
                std::io::Error::other(format!("{} answers to {} gets", out.len(), keys.len())),
            ));
        }
        Ok(out)
    }

    pub fn get_prefix(&mut self, prefix: &str, timeout: Duration) -> Result<Vec<Kv>, ClusterError> {
        let p = prefix.to_string();
        let r = self.run("get", timeout, async |c: &mut Client| {
            c.get(p.clone(), Some(GetOptions::new().with_prefix()))
                .await
        })?;
        Ok(r.kvs().iter().map(Self::kv).collect())
    }

    pub fn put(
        &mut self,
        key: &str,
        value: Vec<u8>,
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        let key = key.to_string();
        self.run("put", timeout, async |c: &mut Client| {
            c.put(key.clone(), value.clone(), None).await
        })?;
        Ok(())
    }

    /// All of `ops` if every condition holds, else nothing: Ok(false).
    pub fn txn(
        &mut self,
        conds: Vec<Cond>,
        ops: Vec<Op>,
        timeout: Duration,
    ) -> Result<bool, ClusterError> {
        let txn = Txn::new().when(compares(conds)).and_then(txn_ops(ops));
        let r = self.run("txn", timeout, async |c: &mut Client| {
            c.txn(txn.clone()).await
        })?;
        Ok(r.succeeded())
    }

    /// As `txn`; on success, the revision it wrote at (the `mod_revision`
    /// of every key it put).
    pub fn txn_rev(
        &mut self,
        conds: Vec<Cond>,
        ops: Vec<Op>,
        timeout: Duration,
    ) -> Result<Option<i64>, ClusterError> {
        let txn = Txn::new().when(compares(conds)).and_then(txn_ops(ops));
        let r = self.run("txn", timeout, async |c: &mut Client| {
            c.txn(txn.clone()).await
        })?;
        Ok(r.succeeded()
            .then(|| r.header().map_or(0, |h| h.revision())))
    }

    /// A new lease of `ttl` seconds; returns its id and the TTL etcd granted.
    pub fn grant(&mut self, ttl: i64, timeout: Duration) -> Result<(i64, i64), ClusterError> {
        let r = self.run("lease grant", timeout, async |c: &mut Client| {
            c.lease_grant(ttl, None).await
        })?;
        Ok((r.id(), r.ttl()))
    }

    /// One keep-alive round trip for `lease`; Ok(ttl) as etcd answered it
    /// (0: the lease has expired).
    pub fn keep_alive(&mut self, lease: i64, timeout: Duration) -> Result<i64, ClusterError> {
        let deadline = Instant::now() + timeout;
        if self.keeper.as_ref().is_none_or(|(id, _, _)| *id != lease) {
            let (k, s) = self.run("keep-alive", timeout, async |c: &mut Client| {
                c.lease_keep_alive(lease).await
            })?;
            self.keeper = Some((lease, k, s));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let Some((_, keeper, stream)) = self.keeper.as_mut() else {
            return Err(ClusterError::EtcdTimeout {
                what: "keep-alive",
                ms: timeout.as_millis() as u64,
            });
        };
        let r = self.rt.block_on(async {
            tokio::time::timeout(left, async {
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await
        });
        match r {
            Err(_) => {
                self.keeper = None; // a late answer must not be taken for the next one
                self.next_member(timeout);
                Err(ClusterError::EtcdTimeout {
                    what: "keep-alive",
                    ms: timeout.as_millis() as u64,
                })
            }
            Ok(Err(e)) => {
                self.keeper = None;
                let out = self.err(e);
                self.next_member(timeout);
                Err(out)
            }
            Ok(Ok(None)) => {
                self.keeper = None;
                self.next_member(timeout);
                Err(ClusterError::Etcd {
                    endpoints: self.endpoints.clone(),
                    detail: "the keep-alive stream ended".into(),
                })
            }
            Ok(Ok(Some(resp))) => Ok(resp.ttl()),
        }
    }

    pub fn revoke(&mut self, lease: i64, timeout: Duration) -> Result<(), ClusterError> {
        self.keeper = None;
        self.run("lease revoke", timeout, async |c: &mut Client| {
            c.lease_revoke(lease).await
        })?;
        Ok(())
    }
}

/// The member refused the connection: the request never left, so it is
/// safe to make at another member.  (etcd_client's error has no `source`:
/// the chain starts at what it wraps.)
fn never_sent(e: &etcd_client::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
        etcd_client::Error::TransportError(t) => Some(t),
        etcd_client::Error::IoError(io) => Some(io),
        _ => None,
    };
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused | HostUnreachable | NetworkUnreachable
            ) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

fn compares(conds: Vec<Cond>) -> Vec<Compare> {
    conds
        .into_iter()
        .map(|c| match c {
            Cond::Absent(k) => Compare::version(k, CompareOp::Equal, 0),
            Cond::ModRevision(k, r) => Compare::mod_revision(k, CompareOp::Equal, r),
            Cond::Value(k, v) => Compare::value(k, CompareOp::Equal, v),
        })
        .collect()
}

fn txn_ops(ops: Vec<Op>) -> Vec<TxnOp> {
    ops.into_iter()
        .map(|o| match o {
            Op::Put { key, value, lease } => {
                TxnOp::put(key, value, lease.map(|l| PutOptions::new().with_lease(l)))
            }
            Op::Delete(k) => TxnOp::delete(k, None),
        })
        .collect()
}
