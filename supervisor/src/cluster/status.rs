//! `rekindle cluster status`: the cluster as etcd holds it (the term, the
//! primary, the in-sync set, each node's own report, with whether it may
//! take the next term).  Reads only; exit 1 when etcd cannot
//! be reached or a record is malformed.

use std::time::Duration;

use serde_json::json;

use super::error::ClusterError;
use super::etcd::Etcd;
use super::records::{self, InSyncRecord, LeaderRecord, NodeRecord};

pub struct Status {
    pub epoch: u64,
    pub leader: Option<LeaderRecord>,
    pub insync: Option<InSyncRecord>,
    pub nodes: Vec<NodeRecord>,
}

pub fn read(
    endpoints: &[String],
    cluster: &str,
    timeout: Duration,
) -> Result<Status, ClusterError> {
    let mut e = Etcd::connect(endpoints, timeout)?;
    let ekey = records::epoch_key(cluster);
    let lkey = records::leader_key(cluster);
    let ikey = records::insync_key(cluster);
    // one revision: a term change writes these keys together
    let mut kvs = e.get_at_once(&[&ekey, &lkey, &ikey], timeout)?.into_iter();
    let (ekv, lkv, ikv) = (
        kvs.next().flatten(),
        kvs.next().flatten(),
        kvs.next().flatten(),
    );
    let epoch = match ekv {
        Some(kv) => records::parse_epoch(&ekey, &kv.value)?,
        None => 0,
    };
    let leader = match lkv {
        Some(kv) => Some(records::parse::<LeaderRecord>(&lkey, &kv.value)?),
        None => None,
    };
    let insync = match ikv {
        Some(kv) => Some(records::parse::<InSyncRecord>(&ikey, &kv.value)?),
        None => None,
    };
    let mut nodes = Vec::new();
    for kv in e.get_prefix(&records::nodes_prefix(cluster), timeout)? {
        nodes.push(records::parse::<NodeRecord>(&kv.key, &kv.value)?);
    }
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(Status {
        epoch,
        leader,
        insync,
        nodes,
    })
}

/// The command; its exit status.
pub fn command(endpoints: &str, cluster: &str, as_json: bool, timeout: Duration) -> i32 {
    let eps = super::args::endpoints(endpoints);
    let s = match read(&eps, cluster, timeout) {
        Ok(s) => s,
        Err(e) => {
            if as_json {
                println!(
                    "{}",
                    json!({"ok": false, "code": e.code(), "error": e.to_string()})
                );
            } else {
                eprintln!("rekindle: {}: {e}", e.code());
            }
            return 1;
        }
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    if as_json {
        let nodes: Vec<_> = s
            .nodes
            .iter()
            .map(|n| {
                let mut v = serde_json::to_value(n).unwrap_or_default();
                v["report_age_ms"] = json!(now_ms.saturating_sub(n.updated_unix_ms));
                v
            })
            .collect();
        println!(
            "{}",
            json!({"ok": true, "cluster": cluster, "epoch": s.epoch, "leader": s.leader,
                   "insync": s.insync, "nodes": nodes})
        );
        return 0;
    }
    match &s.leader {
        Some(l) => println!(
            "cluster {cluster}: epoch {}, primary {} (replication {}, serving {})",
            s.epoch,
            l.node,
            l.replication,
            l.serve.join(" ")
        ),
        None => println!("cluster {cluster}: epoch {}, no primary", s.epoch),
    }
    match &s.insync {
        Some(i) => println!(
            "in sync (epoch {}): {}",
            i.epoch,
            if i.standbys.is_empty() {
                "none".to_string()
            } else {
                i.standbys.join(" ")
            }
        ),
        None => println!("in sync: no record"),
    }
    println!(
        "{:<12} {:<8} {:>6} {:>6} {:>10}  {:<22} SNAPSHOT",
        "NODE", "ROLE", "EPOCH", "LAG", "REPORTED", "ELIGIBLE"
    );
    for n in &s.nodes {
        let eligible = match &n.eligibility {
            Some(e) if e.eligible => "yes".to_string(),
            Some(e) => format!("no ({})", e.reason.as_deref().unwrap_or("?")),
            None => "-".to_string(),
        };
        println!(
            "{:<12} {:<8} {:>6} {:>6} {:>8}ms  {:<22} {}",
            n.node,
            n.role.as_str(),
            n.epoch,
            n.lag_snapshots,
            now_ms.saturating_sub(n.updated_unix_ms),
            eligible,
            n.snapshot.as_deref().unwrap_or("-")
        );
    }
    0
}
