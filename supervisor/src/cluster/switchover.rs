//! `rekindle failover NAME`: a planned switchover.  The command asks the
//! primary to hand its term over by writing `switchover` (only while the
//! leader key it read is unchanged); the primary's agent sees it, kills
//! the app at once (no acknowledgement after that point: with sync
//! replication the standby already has every acknowledged write) and
//! deletes its leader key by revoking its lease; the target standby (any
//! standby in sync without `--to`) takes the next term, deleting the
//! request in the same transaction; the old primary does not campaign
//! while the request names it.  The command waits for the new term and
//! withdraws the request if none comes in time (the old primary may then
//! be elected again).

use std::time::{Duration, Instant};

use serde_json::json;

use super::error::ClusterError;
use super::etcd::{Cond, Etcd, Op};
use super::records::{self, LeaderRecord, Role, SwitchoverRecord};

/// Why a switchover is refused or failed (exit 1, with the code).
#[derive(Debug, thiserror::Error)]
pub enum SwitchoverError {
    #[error("the cluster has no primary")]
    NoPrimary,
    #[error("{0} is the primary already")]
    AlreadyPrimary(String),
    #[error(
        "{node} is not a standby in sync with term {epoch} (role {role}, term {its_epoch}, lag {lag})"
    )]
    NotInSync {
        node: String,
        epoch: u64,
        role: &'static str,
        its_epoch: u64,
        lag: u64,
    },
    #[error("no standby is in sync with term {0}")]
    NoStandby(u64),
    #[error("the primary changed while the request was made")]
    Raced,
    #[error("no new term within {0:?}: the request is withdrawn")]
    Timeout(Duration),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

impl SwitchoverError {
    pub fn code(&self) -> &'static str {
        match self {
            SwitchoverError::NoPrimary => "no_primary",
            SwitchoverError::AlreadyPrimary(_) => "already_primary",
            SwitchoverError::NotInSync { .. } => "not_in_sync",
            SwitchoverError::NoStandby(_) => "no_standby",
            SwitchoverError::Raced => "raced",
            SwitchoverError::Timeout(_) => "timeout",
            SwitchoverError::Cluster(e) => e.code(),
        }
    }
}

pub struct Switched {
    pub from: LeaderRecord,
    pub to: LeaderRecord,
    pub took: Duration,
}

pub fn switch(
    endpoints: &[String],
    cluster: &str,
    to: Option<&str>,
    timeout: Duration,
) -> Result<Switched, SwitchoverError> {
    let call = Duration::from_secs(3).min(timeout);
    let st = super::status::read(endpoints, cluster, call)?;
    let Some(from) = st.leader.clone() else {
        return Err(SwitchoverError::NoPrimary);
    };
    if to == Some(from.node.as_str()) {
        return Err(SwitchoverError::AlreadyPrimary(from.node));
    }
    // a standby of this term, caught up, and named in the in-sync set
    // (else it could not campaign: election.rs)
    let named = |node: &str| {
        st.insync
            .as_ref()
            .is_some_and(|i| i.epoch == st.epoch && i.standbys.iter().any(|s| s == node))
    };
    let in_sync = |n: &&records::NodeRecord| {
        n.role == Role::Standby && n.epoch == st.epoch && n.lag_snapshots == 0 && named(&n.node)
    };
    match to {
        Some(t) => {
            let n = st.nodes.iter().find(|n| n.node == t);
            if !n.is_some_and(|n| in_sync(&n)) {
                return Err(SwitchoverError::NotInSync {
                    node: t.to_string(),
                    epoch: st.epoch,
                    role: n.map_or("unknown", |n| n.role.as_str()),
                    its_epoch: n.map_or(0, |n| n.epoch),
                    lag: n.map_or(0, |n| n.lag_snapshots),
                });
            }
        }
        None => {
            if !st.nodes.iter().any(|n| in_sync(&n)) {
                return Err(SwitchoverError::NoStandby(st.epoch));
            }
        }
    }
    let mut e = Etcd::connect(endpoints, call)?;
    let lkey = records::leader_key(cluster);
    let skey = records::switchover_key(cluster);
    let req = SwitchoverRecord {
        from: from.node.clone(),
        epoch: from.epoch,
        to: to.map(str::to_string),
    };
    let leader_value = serde_json::to_vec(&from).unwrap_or_default();
    let t0 = Instant::now();
    let ok = e.txn(
        vec![Cond::Value(lkey.clone(), leader_value)],
        vec![Op::Put {
            key: skey.clone(),
            value: serde_json::to_vec(&req).unwrap_or_default(),
            lease: None,
        }],
        call,
    )?;
    if !ok {
        return Err(SwitchoverError::Raced);
    }
    while t0.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(20));
        let Ok(Some(kv)) = e.get(&lkey, call) else {
            continue;
        };
        let l: LeaderRecord = records::parse(&lkey, &kv.value)?;
        if l.epoch > from.epoch {
            return Ok(Switched {
                from,
                to: l,
                took: t0.elapsed(),
            });
        }
    }
    // withdraw it, unless a new term took it meanwhile
    let _ = e.txn(
        vec![Cond::Value(
            skey.clone(),
            serde_json::to_vec(&req).unwrap_or_default(),
        )],
        vec![Op::Delete(skey)],
        call,
    );
    Err(SwitchoverError::Timeout(timeout))
}

/// The command; its exit status.
pub fn command(
    endpoints: &str,
    cluster: &str,
    to: Option<&str>,
    timeout: Duration,
    as_json: bool,
) -> i32 {
    let eps = super::args::endpoints(endpoints);
    match switch(&eps, cluster, to, timeout) {
        Ok(s) => {
            if as_json {
                println!(
                    "{}",
                    json!({"ok": true, "from": s.from, "to": s.to, "took_ms": s.took.as_millis() as u64})
                );
            } else {
                println!(
                    "{cluster}: primary {} (term {}) -> {} (term {}) in {} ms",
                    s.from.node,
                    s.from.epoch,
                    s.to.node,
                    s.to.epoch,
                    s.took.as_millis()
                );
            }
            0
        }
        Err(e) => {
            if as_json {
                println!(
                    "{}",
                    json!({"ok": false, "code": e.code(), "error": e.to_string()})
                );
            } else {
                eprintln!("rekindle: {}: {e}", e.code());
            }
            1
        }
    }
}
