//! Prometheus metrics of one cluster node (`--cluster-metrics HOST:PORT`),
//! whatever its role: the supervisor's own `--metrics` exist only while the
//! node is primary.  Gauges come from the node's report (role, term, lag),
//! counters from the node's decisions as they are logged (failovers, fences,
//! takeover decisions, replication errors): one definition of each
//! decision, the event, and the metric counts it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus::{Gauge, IntCounterVec, IntGauge, Opts, Registry};

use super::error::ClusterError;
use super::records::{NodeRecord, Role};
use crate::event::Event;

pub struct ClusterMetrics {
    registry: Registry,
    role: IntGauge,
    epoch: IntGauge,
    lag: IntGauge,
    standbys: IntGauge,
    primary_silent: Gauge,
    failovers: IntCounterVec,
    fences: IntCounterVec,
    takeovers: IntCounterVec,
    suspicions: IntCounterVec,
    replication_errors: IntCounterVec,
    hot_image: IntCounterVec,
}

fn counter(name: &str, help: &str, label: &str) -> Result<IntCounterVec, prometheus::Error> {
    IntCounterVec::new(Opts::new(name, help), &[label])
}

impl ClusterMetrics {
    pub fn new(cluster: &str, node: &str) -> Result<ClusterMetrics, prometheus::Error> {
        let labels = [
            ("cluster".to_string(), cluster.to_string()),
            ("node".to_string(), node.to_string()),
        ];
        let registry = Registry::new_custom(None, Some(labels.into()))?;
        let m = ClusterMetrics {
            role: IntGauge::new(
                "rekindle_cluster_primary",
                "1 while this node holds the term and runs the app, 0 while it stands by",
            )?,
            epoch: IntGauge::new(
                "rekindle_cluster_epoch",
                "The term this node serves (primary) or follows (standby); 0: none",
            )?,
            lag: IntGauge::new(
                "rekindle_cluster_lag_snapshots",
                "Standby: snapshots committed by the primary not yet applied here; \
                 primary: the most any standby is behind",
            )?,
            standbys: IntGauge::new(
                "rekindle_cluster_standbys",
                "Primary: standbys connected to its replication sender",
            )?,
            primary_silent: Gauge::new(
                "rekindle_cluster_primary_silent_seconds",
                "Standby: time since the primary's stream was last heard (0 on a primary)",
            )?,
            failovers: counter(
                "rekindle_cluster_elected_total",
                "Terms this node won, by how (no_leader: the lease ran out or there was none; \
                 heartbeat_timeout: the early takeover)",
                "via",
            )?,
            fences: counter(
                "rekindle_cluster_fenced_total",
                "Times this node stopped serving its term, by the fence's code",
                "code",
            )?,
            takeovers: counter(
                "rekindle_cluster_takeover_decisions_total",
                "Early takeover decisions, by code (took_over, primary_alive_in_etcd, raced, ...)",
                "code",
            )?,
            suspicions: counter(
                "rekindle_cluster_primary_suspected_total",
                "Times the primary's stream went silent for --heartbeat-timeout, by path \
                 (early_takeover, lease_only)",
                "path",
            )?,
            replication_errors: counter(
                "rekindle_cluster_replication_errors_total",
                "Replication connections ended by an error, by code (both ends)",
                "code",
            )?,
            hot_image: counter(
                "rekindle_cluster_hot_image_total",
                "The standby's hot image: rebuilt from the store, unusable, or not used at an election",
                "state",
            )?,
            registry,
        };
        m.registry.register(Box::new(m.role.clone()))?;
        m.registry.register(Box::new(m.epoch.clone()))?;
        m.registry.register(Box::new(m.lag.clone()))?;
        m.registry.register(Box::new(m.standbys.clone()))?;
        m.registry.register(Box::new(m.primary_silent.clone()))?;
        for c in [
            &m.failovers,
            &m.fences,
            &m.takeovers,
            &m.suspicions,
            &m.replication_errors,
            &m.hot_image,
        ] {
            m.registry.register(Box::new(c.clone()))?;
        }
        Ok(m)
    }

    /// The gauges, from what the node publishes in etcd.
    pub fn report(&self, r: &NodeRecord) {
        self.role.set(i64::from(r.role == Role::Primary));
        self.epoch.set(r.epoch as i64);
        self.lag.set(r.lag_snapshots as i64);
        self.standbys.set(r.standbys.len() as i64);
        self.primary_silent
            .set(r.primary_silent_ms.unwrap_or(0) as f64 / 1e3);
    }

    /// The counters, from the node's events.
    pub fn observe(&self, e: &Event) {
        let label = |k: &str| e.field(k).and_then(|v| v.as_str()).unwrap_or("unknown");
        let c = match e.kind() {
            "elected" => Some((&self.failovers, label("via"))),
            "fenced" => Some((&self.fences, label("code"))),
            "takeover" => Some((&self.takeovers, label("code"))),
            "primary_suspect" => Some((&self.suspicions, label("path"))),
            "replica_lost" | "standby_left" => Some((&self.replication_errors, label("code"))),
            "hot_image" => Some((&self.hot_image, label("state"))),
            _ => None,
        };
        if let Some((c, l)) = c {
            c.with_label_values(&[l]).inc();
        }
    }

    pub fn render(&self) -> String {
        crate::metrics::render_registry(&self.registry)
    }
}

/// GET /metrics on a thread of its own (one request at a time: a scrape
/// every few seconds), until dropped.
pub struct MetricsServer {
    pub addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    pub fn start(addr: &str, m: Arc<ClusterMetrics>) -> Result<MetricsServer, ClusterError> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| ClusterError::io(format!("cluster metrics: bind {addr}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| ClusterError::io("cluster metrics: listener", e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| ClusterError::io("cluster metrics: address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rk-cluster-metrics".into())
            .spawn(move || {
                while !s2.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((c, _)) => serve(c, &m),
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
            .map_err(|e| ClusterError::io("cluster metrics: thread", e))?;
        Ok(MetricsServer {
            addr: bound,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request: read the head (bounded in size and time), answer, close.
fn serve(mut c: TcpStream, m: &ClusterMetrics) {
    let _ = c.set_nonblocking(false);
    let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while req.len() < 8192 && !req.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    let _ = c.write_all(&crate::metrics::respond(&req, &|| m.render()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ev;

    #[test]
    fn events_count_and_reports_set_the_gauges() {
        let m = ClusterMetrics::new("rkv", "n2").unwrap_or_else(|e| panic!("{e}"));
        m.observe(&ev("elected").s("via", "heartbeat_timeout"));
        m.observe(&ev("takeover").s("code", "took_over"));
        m.observe(&ev("takeover").s("code", "primary_alive_in_etcd"));
        m.observe(&ev("replica_lost").s("code", "peer_silent"));
        m.observe(&ev("standby_left").s("code", "peer_silent"));
        m.observe(&ev("up")); // not a cluster decision: not counted
        m.report(&NodeRecord {
            node: "n2".into(),
            role: Role::Primary,
            epoch: 7,
            snapshot: None,
            lag_snapshots: 3,
            primary_silent_ms: None,
            standbys: vec!["n1".into(), "n3".into()],
            sentinel: None,
            updated_unix_ms: 0,
            eligibility: None,
            report_every_ms: None,
        });
        let text = m.render();
        // (name, its own labels sorted) -> value; the cluster and node
        // labels are on every sample, in no fixed order
        let sample = |name: &str, own: &[(&str, &str)]| -> Option<f64> {
            text.lines().find_map(|l| {
                let (head, value) = l.rsplit_once(' ')?;
                let (n, labels) = head.split_once('{')?;
                let mut got: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                got.sort();
                let mut want: Vec<String> =
                    own.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
                want.push("cluster=\"rkv\"".into());
                want.push("node=\"n2\"".into());
                want.sort();
                (n == name && got == want).then(|| value.parse().ok())?
            })
        };
        for (name, own, want) in [
            (
                "rekindle_cluster_elected_total",
                vec![("via", "heartbeat_timeout")],
                1.0,
            ),
            (
                "rekindle_cluster_takeover_decisions_total",
                vec![("code", "took_over")],
                1.0,
            ),
            (
                "rekindle_cluster_replication_errors_total",
                vec![("code", "peer_silent")],
                2.0,
            ),
            ("rekindle_cluster_primary", vec![], 1.0),
            ("rekindle_cluster_epoch", vec![], 7.0),
            ("rekindle_cluster_lag_snapshots", vec![], 3.0),
            ("rekindle_cluster_standbys", vec![], 2.0),
        ] {
            assert_eq!(sample(name, &own), Some(want), "{name} {own:?} in:\n{text}");
        }
        assert!(!text.contains("\"up\""));
    }
}
