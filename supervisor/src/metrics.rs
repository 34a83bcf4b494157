//! Prometheus metrics, and a minimal HTTP/1.0 server for GET /metrics that
//! runs inside the poll loop (non-blocking sockets, small buffers).

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

use anyhow::{Context, Result};
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub restarts: IntCounterVec,
    pub downtime: Histogram,
    pub preserved_bytes: IntGauge,
    pub last_failure: Gauge,
    pub up: IntGauge,
    pub generation: IntGauge,
    pub failures: IntCounterVec,
    pub control_block_corrupt: IntCounterVec,
    pub control_block_ok: IntGauge,
    pub snapshot_stop: Histogram,
    pub snapshots: IntCounterVec,
    pub snapshot_pages: IntCounterVec,
    pub snapshot_bytes_written: IntCounter,
    pub snapshot_last_durable: Gauge,
    pub snapshot_dedup_ratio: Gauge,
    pub redo: RedoMetrics,
}

/// The redo writer's (redo/writer.rs), which it updates itself.
#[derive(Clone)]
pub struct RedoMetrics {
    pub bytes_written: IntCounter,
    pub flushes: IntCounter,
    pub flush_seconds: Histogram,
    /// Committed bytes not yet durable, after each flush.
    pub undurable_bytes: IntGauge,
}

impl Metrics {
    pub fn new(name: &str) -> Result<Self> {
        let registry =
            Registry::new_custom(None, Some([("name".to_string(), name.to_string())].into()))?;
        let restarts = IntCounterVec::new(
            Opts::new(
                "rekindle_restarts_total",
                "Restarts completed, by mode (warm, cold) and failure kind",
            ),
            &["mode", "failure"],
        )?;
        let failures = IntCounterVec::new(
            Opts::new("rekindle_failures_total", "Failures seen, by kind"),
            &["kind"],
        )?;
        let downtime = Histogram::with_opts(
            HistogramOpts::new(
                "rekindle_downtime_seconds",
                "Time from detecting a failure to the next incarnation's HELLO",
            )
            .buckets(vec![
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ]),
        )?;
        let preserved_bytes = IntGauge::new(
            "rekindle_preserved_bytes",
            "Bytes in use in the preserved arenas at the last start",
        )?;
        let last_failure = Gauge::new(
            "rekindle_last_failure_timestamp_seconds",
            "Unix time of the last failure (0: none yet)",
        )?;
        let up = IntGauge::new(
            "rekindle_up",
            "1 while an incarnation of the app is running",
        )?;
        let generation = IntGauge::new(
            "rekindle_generation",
            "Generation of the running incarnation",
        )?;
        let control_block_corrupt = IntCounterVec::new(
            Opts::new(
                "rekindle_control_block_corrupt_total",
                "Times the control block was found damaged, by what was wrong",
            ),
            &["damage"],
        )?;
        let control_block_ok = IntGauge::new(
            "rekindle_control_block_ok",
            "1 while the control block's header is intact",
        )?;
        control_block_ok.set(1);
        let snapshot_stop = Histogram::with_opts(
            HistogramOpts::new(
                "rekindle_snapshot_stop_seconds",
                "How long the app was held at the consistent cut of a snapshot",
            )
            .buckets(vec![
                0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
                1.0, 5.0,
            ]),
        )?;
        let snapshots = IntCounterVec::new(
            Opts::new(
                "rekindle_snapshots_total",
                "Snapshots taken (result=ok) or not, by the reason code",
            ),
            &["result"],
        )?;
        let snapshot_pages = IntCounterVec::new(
            Opts::new(
                "rekindle_snapshot_pages_total",
                "Pages put into snapshots: new (written to the store), dedup (already there), zero, \
                 delta (journaled as the bytes that changed)",
            ),
            &["kind"],
        )?;
        let snapshot_bytes_written = IntCounter::new(
            "rekindle_snapshot_bytes_written_total",
            "Bytes of new page data written to the snapshot store (compressed chunks, deltas)",
        )?;
        let snapshot_last_durable = Gauge::new(
            "rekindle_snapshot_last_durable_timestamp_seconds",
            "Unix time of the newest durable snapshot (time() minus it is the durable lag)",
        )?;
        let snapshot_dedup_ratio = Gauge::new(
            "rekindle_snapshot_dedup_ratio",
            "Of the non-zero pages put into snapshots, the share already in the store",
        )?;
        let redo = RedoMetrics {
            bytes_written: IntCounter::new(
                "rekindle_redo_bytes_written_total",
                "Bytes of the app's redo records written to the store's redo log",
            )?,
            flushes: IntCounter::new(
                "rekindle_redo_flushes_total",
                "Writes of the redo log, each one write and one fdatasync",
            )?,
            flush_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "rekindle_redo_flush_seconds",
                    "How long one write and fdatasync of the redo log took",
                )
                .buckets(vec![
                    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
                ]),
            )?,
            undurable_bytes: IntGauge::new(
                "rekindle_redo_undurable_bytes",
                "Redo records the app committed that are not durable yet",
            )?,
        };
        registry.register(Box::new(redo.bytes_written.clone()))?;
        registry.register(Box::new(redo.flushes.clone()))?;
        registry.register(Box::new(redo.flush_seconds.clone()))?;
        registry.register(Box::new(redo.undurable_bytes.clone()))?;
        registry.register(Box::new(snapshot_stop.clone()))?;
        registry.register(Box::new(snapshots.clone()))?;
        registry.register(Box::new(snapshot_pages.clone()))?;
        registry.register(Box::new(snapshot_bytes_written.clone()))?;
        registry.register(Box::new(snapshot_last_durable.clone()))?;
        registry.register(Box::new(snapshot_dedup_ratio.clone()))?;
        registry.register(Box::new(control_block_corrupt.clone()))?;
        registry.register(Box::new(control_block_ok.clone()))?;
        registry.register(Box::new(restarts.clone()))?;
        registry.register(Box::new(failures.clone()))?;
        registry.register(Box::new(downtime.clone()))?;
        registry.register(Box::new(preserved_bytes.clone()))?;
        registry.register(Box::new(last_failure.clone()))?;
        registry.register(Box::new(up.clone()))?;
        registry.register(Box::new(generation.clone()))?;
        Ok(Metrics {
            registry,
            restarts,
            downtime,
            preserved_bytes,
            last_failure,
            up,
            generation,
            control_block_corrupt,
            control_block_ok,
            failures,
            snapshot_stop,
            snapshots,
            snapshot_pages,
            snapshot_bytes_written,
            snapshot_last_durable,
            snapshot_dedup_ratio,
            redo,
        })
    }

    pub fn render(&self) -> String {
        render_registry(&self.registry)
    }
}

/// A registry in Prometheus's text format ("" if it cannot be encoded).
pub fn render_registry(registry: &Registry) -> String {
    let mut buf = Vec::new();
    if TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .is_err()
    {
        return String::new();
    }
    String::from_utf8_lossy(&buf).into_owned()
}

struct Conn {
    s: TcpStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    since: Instant,
    replied: bool,
}

pub struct Server {
    listener: TcpListener,
    conns: Vec<Conn>,
}

const MAX_CONNS: usize = 32;

impl Server {
    pub fn bind(addr: &str) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .with_context(|| format!("binding the metrics address {addr}"))?;
        listener.set_nonblocking(true)?;
        Ok(Server {
            listener,
            conns: Vec::new(),
        })
    }

    pub fn listener_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    pub fn conn_fds(&self) -> Vec<(BorrowedFd<'_>, bool)> {
        self.conns
            .iter()
            .map(|c| (c.s.as_fd(), !c.out.is_empty()))
            .collect()
    }

    pub fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    if self.conns.len() >= MAX_CONNS || s.set_nonblocking(true).is_err() {
                        continue; // dropped: closes
                    }
                    self.conns.push(Conn {
                        s,
                        inbuf: Vec::new(),
                        out: Vec::new(),
                        since: Instant::now(),
                        replied: false,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    }

    /// Serves every connection that can make progress; `body` renders the
    /// metrics when a request is complete.
    pub fn serve(&mut self, body: &dyn Fn() -> String) {
        for c in &mut self.conns {
            if !c.replied {
                let mut b = [0u8; 2048];
                loop {
                    match c.s.read(&mut b) {
                        Ok(0) => {
                            c.replied = true;
                            break;
                        }
                        Ok(n) => {
                            c.inbuf.extend_from_slice(&b[..n]);
                            if c.inbuf.len() > 16384 {
                                break;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    }
                }
                let complete = c.inbuf.windows(4).any(|w| w == b"\r\n\r\n")
                    || c.inbuf.windows(2).any(|w| w == b"\n\n");
                if complete || c.inbuf.len() > 16384 {
                    c.out = respond(&c.inbuf, body);
                    c.replied = true;
                }
            }
            while !c.out.is_empty() {
                match c.s.write(&c.out) {
                    Ok(0) => c.out.clear(),
                    Ok(n) => {
                        c.out.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => c.out.clear(),
                }
            }
        }
        // done, or stuck for more than 5 s
        self.conns
            .retain(|c| !(c.replied && c.out.is_empty()) && c.since.elapsed().as_secs() < 5);
    }
}

/// The reply to one HTTP request (pure; unit-tested).
pub fn respond(req: &[u8], body: &dyn Fn() -> String) -> Vec<u8> {
    let line = req.split(|&c| c == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, text) = match (method, path) {
        ("GET", "/metrics") | ("GET", "/") => {
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body())
        }
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "not found: try /metrics\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_string(),
        ),
    };
    let mut out = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        text.len()
    )
    .into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(text.as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_metric_names() {
        let m = Metrics::new("svc").unwrap_or_else(|e| panic!("{e}"));
        m.restarts.with_label_values(&["warm", "signal"]).inc();
        m.downtime.observe(0.002);
        m.preserved_bytes.set(4096);
        let t = m.render();
        for name in [
            "rekindle_restarts_total{",
            "rekindle_downtime_seconds_bucket",
            "rekindle_preserved_bytes",
            "rekindle_last_failure_timestamp_seconds",
            "rekindle_up",
            "rekindle_generation",
        ] {
            assert!(t.contains(name), "{name} missing in\n{t}");
        }
        let line = t
            .lines()
            .find(|l| l.starts_with("rekindle_restarts_total{"))
            .unwrap_or_default();
        assert!(
            line.contains("mode=\"warm\"") && line.ends_with(" 1"),
            "{line}"
        );
    }

    #[test]
    fn http_replies() {
        let r = String::from_utf8(respond(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
            &|| "m 1\n".into(),
        ))
        .unwrap_or_default();
        assert!(
            r.starts_with("HTTP/1.0 200 OK\r\n") && r.ends_with("\r\n\r\nm 1\n"),
            "{r}"
        );
        let r = String::from_utf8(respond(b"GET /x HTTP/1.0\r\n\r\n", &|| String::new()))
            .unwrap_or_default();
        assert!(r.starts_with("HTTP/1.0 404"));
        let r =
            String::from_utf8(respond(b"\xff\xfe\r\n\r\n", &|| String::new())).unwrap_or_default();
        assert!(r.starts_with("HTTP/1.0 405"));
    }
}
