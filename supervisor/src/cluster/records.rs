//! The keys one cluster keeps in etcd and their values (JSON):
//!
//! ```text
//! /rekindle/<cluster>/epoch        the fencing epoch: the number of the newest term (decimal)
//! /rekindle/<cluster>/leader       LeaderRecord, attached to the primary's lease
//! /rekindle/<cluster>/nodes/<id>   NodeRecord: each node's own report (role, lag)
//! /rekindle/<cluster>/switchover   SwitchoverRecord: a planned handover asked for
//! /rekindle/<cluster>/insync       InSyncRecord: the standbys whose acknowledgement
//!                                  the primary of `epoch` waits for (insync.rs)
//! ```
//!
//! A term begins with one transaction that increments `epoch` and creates
//! `leader` together, so no two terms share an epoch (election.rs).

use serde::{Deserialize, Serialize};

use super::error::ClusterError;

pub fn prefix(cluster: &str) -> String {
    format!("/rekindle/{cluster}/")
}
pub fn epoch_key(cluster: &str) -> String {
    format!("{}epoch", prefix(cluster))
}
pub fn leader_key(cluster: &str) -> String {
    format!("{}leader", prefix(cluster))
}
pub fn switchover_key(cluster: &str) -> String {
    format!("{}switchover", prefix(cluster))
}
pub fn insync_key(cluster: &str) -> String {
    format!("{}insync", prefix(cluster))
}
pub fn nodes_prefix(cluster: &str) -> String {
    format!("{}nodes/", prefix(cluster))
}
pub fn node_key(cluster: &str, node: &str) -> String {
    format!("{}{node}", nodes_prefix(cluster))
}

/// Who serves in the current term.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    pub node: String,
    pub epoch: u64,
    /// HOST:PORT where its replication sender listens.
    pub replication: String,
    /// The app's service addresses (`--listen`), for clients.
    pub serve: Vec<String>,
}

/// `rekindle failover`: the primary of term `epoch` is asked to hand over
/// (to `to`, or to any standby in sync).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchoverRecord {
    pub from: String,
    pub epoch: u64,
    pub to: Option<String>,
}

/// The in-sync set: written only by the primary of `epoch`, in a
/// transaction guarded by its own `leader` value and the epoch; a new term
/// starts with it empty (insync.rs).  Only the nodes it names may take the
/// next term.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InSyncRecord {
    pub epoch: u64,
    pub standbys: Vec<String>,
    /// The node that won `epoch`'s campaign (the transaction that wrote
    /// this record first): it may take the next term even if it never
    /// learnt that it won (a reply lost, a death before it began the term;
    /// insync::verdict).  Absent in records of older rekindles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
}

/// Whether a node may take the next term, as it last found (its report).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eligibility {
    pub eligible: bool,
    /// Why not (a stable code: `not_in_sync`, `store_of_other_term`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A node's role as it reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Not yet in touch with etcd.
    Starting,
    /// Following the primary (or waiting for one).
    Standby,
    /// Elected: runs the app.
    Primary,
    /// Lost its lease or its term: the app is being killed.
    Fenced,
    /// Shutting down.
    Stopped,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Starting => "starting",
            Role::Standby => "standby",
            Role::Primary => "primary",
            Role::Fenced => "fenced",
            Role::Stopped => "stopped",
        }
    }
}

/// What a node reports of itself under `nodes/<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node: String,
    pub role: Role,
    /// The term it serves (primary) or follows (standby); 0: none.
    pub epoch: u64,
    /// The newest snapshot in its store.
    pub snapshot: Option<String>,
    /// Standby: snapshots the primary has committed that it has not yet
    /// applied; primary: the most any connected standby is behind.
    pub lag_snapshots: u64,
    /// Standby: milliseconds since it last heard from the primary.
    pub primary_silent_ms: Option<u64>,
    /// Primary: standbys connected to its replication sender.
    pub standbys: Vec<String>,
    /// HOST:PORT of its Sentinel endpoint (`--sentinel-addr`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<String>,
    /// Wall-clock time of this report (for display only: nothing decides on it).
    pub updated_unix_ms: u64,
    /// A node not serving: whether it may take the next term (the agent
    /// fills it in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eligibility: Option<Eligibility>,
    /// A primary: how often it rewrites this report (ms), which standbys'
    /// early takeover counts missed reports by (`--etcd-silence`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_every_ms: Option<u64>,
}

pub fn parse<T: for<'a> Deserialize<'a>>(key: &str, v: &[u8]) -> Result<T, ClusterError> {
    serde_json::from_slice(v).map_err(|e| ClusterError::BadRecord {
        key: key.to_string(),
        detail: e.to_string(),
    })
}

pub fn parse_epoch(key: &str, v: &[u8]) -> Result<u64, ClusterError> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| ClusterError::BadRecord {
            key: key.to_string(),
            detail: format!("not a number: {:?}", String::from_utf8_lossy(v)),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_refused() {
        let l = LeaderRecord {
            node: "n1".into(),
            epoch: 7,
            replication: "10.0.0.1:7400".into(),
            serve: vec!["10.0.0.1:6379".into()],
        };
        let v = serde_json::to_vec(&l).unwrap_or_default();
        assert_eq!(parse::<LeaderRecord>("k", &v).ok(), Some(l));
        let e = parse::<LeaderRecord>("k", b"{\"node\":1}");
        assert!(matches!(e, Err(ClusterError::BadRecord { .. })));
        assert_eq!(parse_epoch("k", b"12").ok(), Some(12));
        assert!(parse_epoch("k", b"-1").is_err());
        assert!(parse_epoch("k", b"x").is_err());
        assert_eq!(leader_key("c"), "/rekindle/c/leader");
        assert_eq!(node_key("c", "n2"), "/rekindle/c/nodes/n2");
        assert_eq!(insync_key("c"), "/rekindle/c/insync");
        let i = InSyncRecord {
            epoch: 3,
            standbys: vec!["n2".into()],
            primary: Some("n1".into()),
        };
        let v = serde_json::to_vec(&i).unwrap_or_default();
        assert_eq!(parse::<InSyncRecord>("k", &v).ok(), Some(i));
    }
}
