//! The cluster's command line: the options `rekindle run` takes to run as
//! one node of a cluster, and `rekindle cluster ...`.

use std::time::Duration;

use clap::{Args, Subcommand};

use crate::cli::parse_duration;

/// `sync`: a reply the app holds (rk_durable_fd) is released only once a
/// standby has the snapshot; `async`: once it is on the local disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Replication {
    Sync,
    Async,
}

impl Replication {
    pub fn as_str(self) -> &'static str {
        match self {
            Replication::Sync => "sync",
            Replication::Async => "async",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Run as one node of a failover cluster: etcd's client URLs, comma
    /// separated (http://10.0.0.9:2379,...).  The elected node runs the
    /// app, the others stand by (docs/failover.md).
    #[arg(long, value_name = "ENDPOINTS", requires_all = ["node", "cluster_addr", "snapshot_dir"])]
    pub cluster: Option<String>,

    /// With --cluster: this node's id, unique in the cluster.
    #[arg(long, value_name = "ID", requires = "cluster")]
    pub node: Option<String>,

    /// With --cluster: HOST:PORT of this node's replication endpoint (the
    /// primary listens there; standbys connect to the address the primary
    /// published).
    #[arg(long, value_name = "HOST:PORT", requires = "cluster")]
    pub cluster_addr: Option<String>,

    /// With --cluster: the cluster's name in etcd (default: --name).
    #[arg(long, value_name = "NAME", requires = "cluster")]
    pub cluster_name: Option<String>,

    /// With --cluster: sync holds the app's durable acknowledgements until a
    /// standby has the snapshot; async until the local disk has it.
    #[arg(long, value_enum, default_value = "sync", requires = "cluster")]
    pub replication: Replication,

    /// With --cluster: the primary's etcd lease, in whole seconds (etcd's
    /// unit; at least its minimum, 1.5 x its election timeout).
    #[arg(long, value_name = "SECONDS", default_value_t = 2, requires = "cluster",
          value_parser = clap::value_parser!(i64).range(1..=60))]
    pub lease_ttl: i64,

    /// With --cluster: the largest difference of clock *rates* between two
    /// hosts that safety relies on, in parts per million (offsets do not
    /// matter: only durations are measured).
    #[arg(long, value_name = "PPM", default_value_t = 10_000, requires = "cluster",
          value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub clock_drift_ppm: u64,

    /// With --cluster: also answer the Redis Sentinel protocol on HOST:PORT
    /// (the subset redis-py's `Sentinel` and `redis-cli SENTINEL
    /// get-master-addr-by-name` use), from etcd: clients find the primary
    /// of any term unchanged.  Give every node one; list them all in the
    /// clients' sentinel list (docs/failover.md).
    #[arg(long, value_name = "HOST:PORT", requires = "cluster")]
    pub sentinel_addr: Option<String>,

    /// With --cluster: a standby that has heard nothing on the replication
    /// stream (heartbeats come every 25 ms) for this long suspects the
    /// primary, and with --replication sync may take the term before the
    /// lease expires, once etcd also shows the primary silent
    /// (docs/failover.md, "Failure detection faster than the lease").
    /// 0: wait for the lease only.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "100ms",
          requires = "cluster")]
    pub heartbeat_timeout: Duration,

    /// With --cluster and --replication sync: the early takeover also
    /// needs etcd to show the suspected primary's own report unchanged this
    /// long (a primary rewrites it every quarter of its own setting, at
    /// most every 50 ms; a standby never waits fewer than four of the
    /// primary's intervals).  Shorter fails over sooner; a primary stalled
    /// this long on a loaded host loses its term (no acknowledged write:
    /// docs/failover.md, "Failure detection faster than the lease").
    /// Give every node the same value.
    #[arg(long, value_name = "DUR", value_parser = parse_etcd_silence, default_value = "200ms",
          requires = "cluster")]
    pub etcd_silence: Duration,

    /// With --cluster: serve this node's Prometheus metrics (role, term,
    /// lag, failovers, fences, takeover decisions, replication errors) on
    /// HOST:PORT, GET /metrics, whatever its role (docs/failover.md).
    #[arg(long, value_name = "HOST:PORT", requires = "cluster")]
    pub cluster_metrics: Option<String>,

    /// With --cluster: the primary writes a standby out of the in-sync set
    /// (in etcd; only then are writes acknowledged without it, and it may
    /// no longer be elected) once it has been disconnected, or has left a
    /// commit unacknowledged, this long.  The last member is never removed
    /// (docs/failover.md, "The in-sync set").
    #[arg(long, value_name = "DUR", value_parser = parse_positive_duration, default_value = "1s",
          requires = "cluster")]
    pub sync_drop_after: Duration,

    /// With --replication async: bound the writes a failover can lose.  A
    /// reply is released at once only while every snapshot committed more
    /// than DUR ago has been acknowledged by the in-sync standbys; beyond
    /// that, replies wait for the standbys as in sync mode until they catch
    /// up (Redis's min-replicas-max-lag, as back-pressure rather than an
    /// error).  Without it the loss window is unbounded and only reported
    /// (docs/failover.md, "Bounded loss in async mode").
    #[arg(long, value_name = "DUR", value_parser = parse_positive_duration, requires = "cluster")]
    pub max_lag: Option<Duration>,
}

/// A duration above zero (0 would drop every member at its first pending
/// commit).
fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("must be above 0".into()),
        d => Ok(d),
    }
}

/// The early takeover's etcd silence: a primary writes its report every
/// quarter of it, so under 40 ms etcd would take a write every few ms.
fn parse_etcd_silence(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d < Duration::from_millis(40) => Err("must be at least 40ms".into()),
        d if d > Duration::from_secs(60) => Err("must be at most 60s".into()),
        d => Ok(d),
    }
}

/// `rekindle sentinel`: the Sentinel endpoint without a node.
#[derive(Debug, Args)]
#[command(
    long_about = "Answer the subset of the Redis Sentinel protocol that unmodified clients use to \
 find a master (PING, HELLO, ROLE, INFO, SENTINEL get-master-addr-by-name / master / masters / \
 replicas / slaves / sentinels / ckquorum / myid) for the named clusters, from etcd: the master \
 is the node etcd's leader key names (attached to its lease), in the newest term, so a \
 deposed primary is never named.  Runs until SIGTERM/SIGINT.  `rekindle run --cluster ... \
 --sentinel-addr` serves the same on every node."
)]
pub struct SentinelArgs {
    /// etcd's client URLs, comma separated.
    #[arg(long, value_name = "ENDPOINTS")]
    pub cluster: String,
    /// HOST:PORT to listen on (Sentinel's usual port is 26379).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: String,
    /// The clusters served (clients call them master names).
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,
    /// Append events (JSON lines) here instead of stderr.
    #[arg(long, value_name = "PATH")]
    pub events: Option<std::path::PathBuf>,
}

/// `rekindle sentinel`: its exit status.
pub fn sentinel(a: SentinelArgs) -> i32 {
    use nix::sys::signal::{SigSet, Signal};
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGINT);
    if let Err(e) = mask.thread_block() {
        eprintln!("rekindle: blocking signals: {e}");
        return 1;
    }
    let events = match crate::event::EventLog::open("sentinel", a.events.as_deref()) {
        Ok(l) => std::sync::Arc::new(std::sync::Mutex::new(l)),
        Err(e) => {
            eprintln!("rekindle: cannot open the events file: {e}");
            return 1;
        }
    };
    let cfg = super::sentinel::SentinelConfig {
        listen: a.listen.clone(),
        endpoints: endpoints(&a.cluster),
        clusters: a.names.clone(),
    };
    let mut server = match super::sentinel::SentinelServer::start(cfg, events) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rekindle: {e} ({})", e.code());
            return 1;
        }
    };
    let _ = mask.wait();
    server.stop();
    0
}

/// `rekindle cluster ...`
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Show a cluster as etcd sees it: the term (fencing epoch), the
    /// primary, and each node's role, term, newest snapshot and lag.
    Status {
        /// etcd's client URLs, comma separated.
        #[arg(long, value_name = "ENDPOINTS")]
        cluster: String,
        /// The cluster's name (rekindle run --cluster-name, or --name).
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Give up on etcd after this long.
        #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "3s")]
        timeout: Duration,
    },
}

/// `rekindle failover NAME`: a planned switchover.
#[derive(Debug, Args)]
#[command(
    long_about = "Hand the primary's term over to a standby in sync, with no acknowledged write \
 lost: the primary kills its app at once and gives up its lease; the standby takes the next \
 term and starts the app warm from what it received.  Refused (exit 1, with a code) when \
 there is no primary, or the target (--to, else any standby) is not a standby in sync with \
 the current term; withdrawn if no new term comes within --timeout."
)]
pub struct FailoverArgs {
    /// etcd's client URLs, comma separated.
    #[arg(long, value_name = "ENDPOINTS")]
    pub cluster: String,
    /// The cluster's name (rekindle run --cluster-name, or --name).
    pub name: String,
    /// The node to hand over to (default: any standby in sync).
    #[arg(long, value_name = "NODE")]
    pub to: Option<String>,
    /// Give up (and withdraw the request) after this long.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn failover(a: FailoverArgs) -> i32 {
    super::switchover::command(&a.cluster, &a.name, a.to.as_deref(), a.timeout, a.json)
}

/// `rekindle cluster ...`: its exit status.
pub fn run_command(c: ClusterCommand) -> i32 {
    match c {
        ClusterCommand::Status {
            cluster,
            name,
            json,
            timeout,
        } => super::status::command(&cluster, &name, json, timeout),
    }
}

pub fn endpoints(s: &str) -> Vec<String> {
    s.split(',')
        .map(|e| e.trim())
        .filter(|e| !e.is_empty())
        .map(|e| {
            if e.contains("://") {
                e.to_string()
            } else {
                format!("http://{e}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_a_scheme() {
        assert_eq!(
            endpoints("10.0.0.1:2379, http://h:1,"),
            vec!["http://10.0.0.1:2379".to_string(), "http://h:1".to_string()]
        );
    }
}
