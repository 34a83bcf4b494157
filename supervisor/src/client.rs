//! `rekindle status|ps|restart|stop`: talk to running supervisors through
//! their control sockets in the runtime directory.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::control_socket::{ConnectError, call};
use crate::orphan;
use crate::runtime_dir;

const TIMEOUT: Duration = Duration::from_secs(5);

/// The owner of `p`, or of the nearest of its directories we can see.
fn owner_of(p: &Path) -> Option<u32> {
    p.ancestors()
        .find_map(|a| std::fs::symlink_metadata(a).ok())
        .map(|m| m.uid())
}

fn denied(name: &str, p: &Path) -> anyhow::Error {
    let who = match owner_of(p) {
        Some(0) => "root".to_string(),
        Some(u) => format!("uid {u}"),
        None => "its owner".to_string(),
    };
    anyhow!(
        "supervisor {name:?}: permission denied at {} (it belongs to {who}): run as {who}",
        p.display()
    )
}

/// NAME.sock in the first search directory that has it.  A directory we
/// may not look into is not "no supervisor": it is said so.
fn socket_for(name: &str) -> Result<PathBuf> {
    runtime_dir::check_name(name)?;
    let dirs = runtime_dir::search_dirs();
    let mut denied_at: Option<PathBuf> = None;
    for d in &dirs {
        let p = runtime_dir::socket_path(d, name);
        match std::fs::symlink_metadata(&p) {
            Ok(_) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                denied_at.get_or_insert(p);
            }
            Err(_) => {}
        }
    }
    if let Some(p) = denied_at {
        return Err(denied(name, &p));
    }
    let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    bail!(
        "no supervisor named {name:?} (looked in {})",
        shown.join(", ")
    )
}

/// What a connect failure means for the supervisor NAME, in words.
fn explain(name: &str, e: anyhow::Error) -> anyhow::Error {
    match e.downcast_ref::<ConnectError>() {
        Some(ConnectError::Denied(p)) => denied(name, p),
        Some(ConnectError::Stale(p)) => {
            let orphans = orphan::find(p);
            if orphans.is_empty() {
                anyhow!(
                    "the supervisor {name:?} is not running: stale socket at {} (nobody listens \
                     on it; the next `rekindle run --name {name}` replaces it)",
                    p.display()
                )
            } else {
                anyhow!(
                    "the supervisor {name:?} is not running: stale socket at {}; its app still \
                     runs unsupervised: {}. Stop it with `{}`, then `rekindle run --name {name}` \
                     again",
                    p.display(),
                    orphan::describe(&orphans),
                    orphan::kill_command(&orphans)
                )
            }
        }
        Some(ConnectError::Absent(p)) => {
            anyhow!("no supervisor named {name:?} ({} went away)", p.display())
        }
        _ => e,
    }
}

/// One request to the supervisor NAME.
fn request(name: &str, req: &Value) -> Result<(Value, UnixStream)> {
    let p = socket_for(name)?;
    call(&p, req, TIMEOUT).map_err(|e| explain(name, e))
}

fn ok_or_err(v: Value) -> Result<Value> {
    if v.get("ok").and_then(Value::as_bool) == Some(true) {
        Ok(v)
    } else {
        bail!(
            "{}",
            v.get("error")
                .and_then(Value::as_str)
                .unwrap_or("the supervisor refused")
        )
    }
}

/// One socket found in a runtime directory.
enum Found {
    /// A live supervisor's status reply.
    Live(Value),
    /// A socket nobody listens on: its supervisor is gone (and the app it
    /// left running, if any).
    Stale {
        name: String,
        socket: PathBuf,
        orphan: Option<i32>,
    },
}

/// Every supervisor's status, by name, and the stale sockets.
fn all_status() -> Vec<Found> {
    let mut out = Vec::new();
    for dir in runtime_dir::search_dirs() {
        out.extend(status_in(&dir));
    }
    out
}

/// The live ones only (for --json: an array of status objects).
fn live(all: Vec<Found>) -> Vec<Value> {
    all.into_iter()
        .filter_map(|f| match f {
            Found::Live(v) => Some(v),
            Found::Stale { .. } => None,
        })
        .collect()
}

fn status_in(dir: &Path) -> Vec<Found> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_socket()).unwrap_or(false))
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".sock"))
                .map(String::from)
        })
        .collect();
    names.sort();
    for n in names {
        let p = runtime_dir::socket_path(dir, &n);
        match call(&p, &json!({"cmd": "status"}), TIMEOUT) {
            Ok((v, _)) if v.get("ok").and_then(Value::as_bool) == Some(true) => {
                out.push(Found::Live(v))
            }
            Err(e) if matches!(e.downcast_ref(), Some(ConnectError::Stale(_))) => {
                let orphan = orphan::find(&p).first().map(|o| o.pid);
                out.push(Found::Stale {
                    name: n,
                    socket: p,
                    orphan,
                })
            }
            _ => {}
        }
    }
    out
}

fn print_stale(name: &str, socket: &Path, orphan: Option<i32>) {
    match orphan {
        None => println!(
            "{name}: not running (stale socket {}; the next `rekindle run --name {name}` replaces it)",
            socket.display()
        ),
        Some(pid) => println!(
            "{name}: supervisor not running (stale socket {}); its app pid {pid} runs unsupervised",
            socket.display()
        ),
    }
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("-")
}

fn n(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::Number(x)) => x.to_string(),
        _ => "-".into(),
    }
}

fn dur(ms: Option<u64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 10_000 => format!("{:.1}s", ms as f64 / 1000.0),
        Some(ms) if ms < 3_600_000 => format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60),
        Some(ms) => format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

fn bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut i = 0;
    while x >= 1024.0 && i < U.len() - 1 {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", U[i])
    }
}

pub fn print_status(v: &Value) {
    let restarts = v.get("restarts").cloned().unwrap_or(Value::Null);
    println!(
        "{}: {}, app pid {}, generation {}, {} start, up {}",
        s(v, "name"),
        s(v, "state"),
        n(v, "pid"),
        n(v, "generation"),
        s(v, "kind"),
        dur(v.get("uptime_ms").and_then(Value::as_u64))
    );
    let args: Vec<&str> = v
        .get("args")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    println!("  program:   {} {}", s(v, "program"), args.join(" "));
    println!(
        "  restarts:  {} (warm {}, cold {}); failures {}, {} in a row",
        n(&restarts, "total"),
        n(&restarts, "warm"),
        n(&restarts, "cold"),
        n(v, "failures"),
        n(v, "consecutive_failures")
    );
    if let Some(f) = v.get("last_failure").filter(|f| !f.is_null()) {
        println!(
            "  last failure: {} ({}) at {}",
            s(f, "kind"),
            s(f, "reason"),
            s(f, "ts")
        );
    }
    if let Some(d) = v.get("last_decision").filter(|d| !d.is_null()) {
        println!("  last decision: {}: {}", s(d, "mode"), s(d, "reason"));
    }
    let held: Vec<String> = v
        .get("held_fds")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter(|h| s(h, "kind") != "manifest")
                .map(|h| format!("{} {}", s(h, "kind"), s(h, "name")))
                .collect()
        })
        .unwrap_or_default();
    println!(
        "  preserved: {} in {} fd(s){}",
        bytes(
            v.get("preserved_bytes")
                .and_then(Value::as_u64)
                .unwrap_or(0)
        ),
        v.get("held_fds")
            .and_then(Value::as_array)
            .map_or(0, |a| a.len()),
        if held.is_empty() {
            String::new()
        } else {
            format!(" ({})", held.join(", "))
        }
    );
    if let Some(h) = v.get("heartbeat_age_ms").and_then(Value::as_u64) {
        println!("  heartbeat: {h} ms ago");
    }
    println!(
        "  supervisor pid {}, socket {}",
        n(v, "supervisor_pid"),
        s(v, "socket")
    );
}

pub fn status(name: Option<&str>, as_json: bool) -> Result<i32> {
    match name {
        Some(name) => {
            let (v, _) = request(name, &json!({"cmd": "status"}))?;
            let v = ok_or_err(v)?;
            if as_json {
                println!("{v}");
            } else {
                print_status(&v);
            }
        }
        None => {
            let all = all_status();
            if as_json {
                println!("{}", Value::Array(live(all)));
            } else if all.is_empty() {
                let shown: Vec<String> = runtime_dir::search_dirs()
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect();
                println!("no supervisors running (in {})", shown.join(", "));
            } else {
                for f in &all {
                    match f {
                        Found::Live(v) => print_status(v),
                        Found::Stale {
                            name,
                            socket,
                            orphan,
                        } => print_stale(name, socket, *orphan),
                    }
                }
            }
        }
    }
    Ok(0)
}

pub fn ps(as_json: bool) -> Result<i32> {
    let all = all_status();
    if as_json {
        println!("{}", Value::Array(live(all)));
        return Ok(0);
    }
    println!(
        "{:<20} {:>8} {:>8} {:>5} {:<10} {:<5} {:>9} {:>8} {:>11}",
        "NAME", "SUP-PID", "APP-PID", "GEN", "STATE", "KIND", "UPTIME", "RESTARTS", "PRESERVED"
    );
    for f in &all {
        let v = match f {
            Found::Live(v) => v,
            Found::Stale { name, orphan, .. } => {
                // the app a killed supervisor left running, if any
                let app = orphan.map_or("-".to_string(), |p| p.to_string());
                let state = if orphan.is_some() {
                    "orphaned"
                } else {
                    "stale"
                };
                println!(
                    "{:<20} {:>8} {:>8} {:>5} {:<10} {:<5} {:>9} {:>8} {:>11}",
                    name, "-", app, "-", state, "-", "-", "-", "-"
                );
                continue;
            }
        };
        let restarts = v
            .get("restarts")
            .map(|r| n(r, "total"))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<20} {:>8} {:>8} {:>5} {:<10} {:<5} {:>9} {:>8} {:>11}",
            s(v, "name"),
            n(v, "supervisor_pid"),
            n(v, "pid"),
            n(v, "generation"),
            s(v, "state"),
            s(v, "kind"),
            dur(v.get("uptime_ms").and_then(Value::as_u64)),
            restarts,
            bytes(
                v.get("preserved_bytes")
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            ),
        );
    }
    Ok(0)
}

pub fn restart(name: &str, cold: bool) -> Result<i32> {
    let mode = if cold { "cold" } else { "warm" };
    let (v, _) = request(name, &json!({"cmd": "restart", "mode": mode}))?;
    let v = ok_or_err(v)?;
    println!("{name}: {mode} restart requested (pid {})", n(&v, "pid"));
    Ok(0)
}

/// Asks for a stop and waits until the supervisor has exited (its end of the
/// connection closes).
pub fn stop(name: &str) -> Result<i32> {
    let (v, mut stream) = request(name, &json!({"cmd": "stop"}))?;
    ok_or_err(v)?;
    let t0 = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .context("socket timeout")?;
    let mut b = [0u8; 256];
    loop {
        match stream.read(&mut b) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
        if t0.elapsed() > Duration::from_secs(120) {
            bail!("{name}: still stopping after 120 s");
        }
    }
    println!("{name}: stopped");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(dur(Some(1500)), "1.5s");
        assert_eq!(dur(Some(125_000)), "2m05s");
        assert_eq!(dur(None), "-");
    }
}
