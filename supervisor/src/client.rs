//! `rekindle status|ps|restart|stop|inspect`: talk to running supervisors
//! through their control sockets in the runtime directory.

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

/// A size class or object size: "512 B", "8 KiB", "1280 B".
fn size_word(b: u64) -> String {
    if b >= 1024 && b.is_multiple_of(1024) {
        if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
            format!("{} MiB", b >> 20)
        } else {
            format!("{} KiB", b >> 10)
        }
    } else {
        format!("{b} B")
    }
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn arr<'a>(v: &'a Value, k: &str) -> &'a [Value] {
    v.get(k)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The size classes holding the most bytes, then how many more.
const TOP_CLASSES: usize = 6;

/// `rekindle inspect`'s table: one line per arena, then each arena's
/// classes, large objects, roots, locks, open regions and problems.
pub fn format_inspect(v: &Value) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let arenas = arr(v, "arenas");
    let _ = writeln!(
        o,
        "{}: app pid {}, generation {} ({} start), {}; {} arena(s) read in {:.1} ms",
        s(v, "name"),
        n(v, "pid"),
        n(v, "generation"),
        s(v, "kind"),
        s(v, "state"),
        arenas.len(),
        u(v, "elapsed_us") as f64 / 1000.0
    );
    if arenas.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "\n{:<16} {:>14} {:>10} {:>10} {:>10} {:>10} {:>8}  CHECK",
        "ARENA", "BASE", "MAX", "MAPPED", "HEAP", "ALLOCATED", "OBJECTS"
    );
    for a in arenas {
        let check = if !a.get("header_ok").and_then(Value::as_bool).unwrap_or(false) {
            "bad header"
        } else if !a.get("layout_ok").and_then(Value::as_bool).unwrap_or(false) {
            "other layout"
        } else if a.get("exact").and_then(Value::as_bool) == Some(true) {
            "ok"
        } else {
            "problems"
        };
        let _ = writeln!(
            o,
            "{:<16} {:>#14x} {:>10} {:>10} {:>10} {:>10} {:>8}  {}",
            s(a, "name"),
            u(a, "base"),
            bytes(u(a, "max_bytes")),
            bytes(u(a, "mapped")),
            bytes(u(a, "heap_bytes")),
            bytes(u(a, "allocated_bytes")),
            u(a, "objects"),
            check
        );
    }
    for a in arenas {
        let _ = writeln!(o, "\n{}", s(a, "name"));
        let mut classes: Vec<&Value> = arr(a, "classes")
            .iter()
            .filter(|c| u(c, "objects") > 0)
            .collect();
        let idle = arr(a, "classes").len() - classes.len();
        classes.sort_by_key(|c| std::cmp::Reverse((u(c, "bytes"), u(c, "objects"))));
        let shown: Vec<String> = classes
            .iter()
            .take(TOP_CLASSES)
            .map(|c| {
                format!(
                    "{} x{} ({})",
                    size_word(u(c, "size")),
                    u(c, "objects"),
                    bytes(u(c, "bytes"))
                )
            })
            .collect();
        let more = classes.len().saturating_sub(TOP_CLASSES);
        let _ = writeln!(
            o,
            "  classes:  {}{}{}",
            if shown.is_empty() {
                "none".to_string()
            } else {
                shown.join(", ")
            },
            if more > 0 {
                format!(", and {more} more")
            } else {
                String::new()
            },
            if idle > 0 {
                format!("; {idle} with free slots only")
            } else {
                String::new()
            }
        );
        let large = a.get("large").cloned().unwrap_or(Value::Null);
        if u(&large, "objects") > 0 {
            let _ = writeln!(
                o,
                "  large:    {} object(s), {} (largest {})",
                u(&large, "objects"),
                bytes(u(&large, "bytes")),
                bytes(u(&large, "largest"))
            );
        }
        let free = a.get("free_runs").cloned().unwrap_or(Value::Null);
        if u(&free, "count") > 0 {
            let _ = writeln!(
                o,
                "  free:     {} page run(s), {}",
                u(&free, "count"),
                bytes(u(&free, "bytes"))
            );
        }
        for r in arr(a, "roots") {
            let at = match r.get("target").filter(|t| !t.is_null()) {
                Some(t) => format!("{} {} object", size_word(u(t, "size")), s(t, "kind")),
                None if r.get("in_arena").and_then(Value::as_bool) != Some(true) => {
                    "OUTSIDE the arena".into()
                }
                None if r.get("in_heap").and_then(Value::as_bool) != Some(true) => {
                    "in the arena, outside its heap".into()
                }
                None => "inside the heap, not at an object's start".into(),
            };
            let _ = writeln!(
                o,
                "  root:     {} = {:#x} ({at})",
                s(r, "name"),
                u(r, "address")
            );
        }
        for l in arr(a, "locks_held") {
            let _ = writeln!(o, "  lock held: {} by tid {}", s(l, "lock"), u(l, "tid"));
        }
        for r in arr(a, "open_regions") {
            let _ = writeln!(
                o,
                "  open unsafe region: tid {} (depth {})",
                u(r, "tid"),
                u(r, "depth")
            );
        }
        for p in arr(a, "problems") {
            let _ = writeln!(o, "  problem:  {}", p.as_str().unwrap_or("?"));
        }
    }
    let regions = arr(v, "open_regions");
    if regions.is_empty() {
        let _ = writeln!(o, "\nopen unsafe regions: none");
    }
    // a region of an arena the supervisor does not hold (not sent yet, or
    // a name the control block lost)
    for r in regions
        .iter()
        .filter(|r| !arenas.iter().any(|a| s(a, "name") == s(r, "arena")))
    {
        let _ = writeln!(
            o,
            "\nopen unsafe region in arena {} (not held): tid {} (depth {})",
            s(r, "arena"),
            u(r, "tid"),
            u(r, "depth")
        );
    }
    if let Some(d) = v
        .get("control_block")
        .and_then(|c| c.get("damage"))
        .and_then(Value::as_str)
    {
        let _ = writeln!(o, "control block: {d} (open regions cannot be told)");
    }
    o
}

/// Why there is nothing to inspect, in words.
fn no_arenas(name: &str, v: &Value) -> String {
    let pid = n(v, "pid");
    if v.get("linked").and_then(Value::as_bool) == Some(true) {
        format!(
            "{name}: the supervisor holds no arena of the app (pid {pid}): it has opened none, \
             or a cold restart dropped them and it has not opened them again"
        )
    } else {
        format!(
            "{name}: the app (pid {pid}) has never spoken to the supervisor: it does not use \
             librekindle (or is still starting), so there is no arena to inspect"
        )
    }
}

pub fn inspect(name: &str, as_json: bool) -> Result<i32> {
    let (v, _) = request(name, &json!({"cmd": "inspect"}))?;
    if v.get("ok").and_then(Value::as_bool) != Some(true)
        && v.get("error")
            .and_then(Value::as_str)
            .is_some_and(|e| e.starts_with("unknown cmd"))
    {
        bail!(
            "the supervisor {name:?} does not know `inspect`: it runs an older rekindle \
             (restart it with this one)"
        );
    }
    let v = ok_or_err(v)?;
    if as_json {
        println!("{v}");
    } else if !arr(&v, "arenas").is_empty() {
        print!("{}", format_inspect(&v));
    }
    if arr(&v, "arenas").is_empty() {
        eprintln!("rekindle: {}", no_arenas(name, &v));
        return Ok(1);
    }
    Ok(0)
}

/// `rekindle rollback NAME [SNAPSHOT] [--json]`.
pub fn rollback(name: &str, snapshot: &str, as_json: bool) -> Result<i32> {
    let p = socket_for(name)?;
    let req = json!({"cmd": "rollback", "snapshot": snapshot});
    // reading and checking the snapshot happens before the reply
    let (v, _) = call(&p, &req, CHECKPOINT_TIMEOUT).map_err(|e| explain(name, e))?;
    let ok = v.get("ok").and_then(Value::as_bool) == Some(true);
    if as_json {
        println!("{v}");
    } else if ok {
        println!(
            "{name}: rolling back to snapshot {} (pid {} killed; the next one starts from it)",
            v.get("id").and_then(Value::as_str).unwrap_or("?"),
            n(&v, "pid")
        );
    } else {
        let code = v.get("code").and_then(Value::as_str).unwrap_or("refused");
        let err = v
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("the supervisor refused");
        eprintln!("rekindle: {name}: no rollback: {err} ({code})");
    }
    Ok(if ok { 0 } else { 1 })
}

/// How long `rekindle checkpoint --wait` waits for a snapshot to be durable
/// (a first, full snapshot of a large app reads and compresses all of it).
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(600);

/// `rekindle checkpoint NAME [--tag T]... [--wait] [--json]`.
pub fn checkpoint(name: &str, tags: &[String], wait: bool, as_json: bool) -> Result<i32> {
    let p = socket_for(name)?;
    let req = json!({"cmd": "checkpoint", "tags": tags, "wait": wait});
    let timeout = if wait { CHECKPOINT_TIMEOUT } else { TIMEOUT };
    let (v, _) = call(&p, &req, timeout).map_err(|e| explain(name, e))?;
    if as_json {
        println!("{v}");
        return Ok(if v.get("ok").and_then(Value::as_bool) == Some(true) {
            0
        } else {
            1
        });
    }
    if v.get("ok").and_then(Value::as_bool) != Some(true) {
        let code = v.get("code").and_then(Value::as_str).unwrap_or("refused");
        let err = v
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("the supervisor refused");
        eprintln!("rekindle: {name}: no snapshot: {err} ({code})");
        return Ok(1);
    }
    if !wait {
        println!("{name}: snapshot requested");
        return Ok(0);
    }
    println!(
        "{name}: snapshot {} ({}, {} pages, stop {} us, {} new bytes) is durable",
        v.get("id").and_then(Value::as_str).unwrap_or("?"),
        if v.get("full").and_then(Value::as_bool) == Some(true) {
            "full"
        } else {
            "delta"
        },
        u(&v, "pages"),
        u(&v, "stop_us"),
        u(&v, "new_bytes"),
    );
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
        assert_eq!(size_word(16), "16 B");
        assert_eq!(size_word(1280), "1280 B");
        assert_eq!(size_word(8192), "8 KiB");
        assert_eq!(size_word(2 << 20), "2 MiB");
    }

    #[test]
    fn inspect_table() {
        let v = json!({
            "ok": true, "name": "svc", "state": "running", "pid": 42, "generation": 3,
            "kind": "warm", "linked": true, "elapsed_us": 412,
            "arenas": [{
                "name": "table", "base": 0x7f00_0000_0000u64, "max_bytes": 69206016,
                "mapped": 4390912, "heap_bytes": 65536, "allocated_bytes": 8192,
                "objects": 3, "header_ok": true, "layout_ok": true, "exact": false,
                "classes": [
                    {"size": 16, "objects": 1, "bytes": 16},
                    {"size": 128, "objects": 0, "bytes": 0},
                    {"size": 8192, "objects": 1, "bytes": 8192}
                ],
                "large": {"objects": 1, "bytes": 1048576, "largest": 1048576},
                "free_runs": {"count": 0, "bytes": 0},
                "roots": [
                    {"name": "table", "address": 0x7f00_0021_0420u64, "in_arena": true,
                     "in_heap": true, "target": {"kind": "slab", "size": 8192}},
                    {"name": "wild", "address": 16, "in_arena": false, "in_heap": false,
                     "target": null}
                ],
                "locks_held": [{"lock": "heap", "tid": 77}],
                "open_regions": [{"tid": 77, "depth": 1}],
                "problems": ["root \"wild\" = 0x10 points outside the arena"]
            }],
            "open_regions": [{"arena": "table", "tid": 77, "depth": 1},
                             {"arena": "?", "tid": 0, "depth": 3}],
            "control_block": {"ok": true, "damage": null}
        });
        let t = format_inspect(&v);
        assert!(
            t.starts_with(
                "svc: app pid 42, generation 3 (warm start), running; 1 arena(s) read in 0.4 ms"
            ),
            "{t}"
        );
        assert!(
            t.contains("\ntable            0x7f0000000000   66.0 MiB"),
            "{t}"
        );
        assert!(t.contains("problems"), "{t}");
        assert!(
            t.contains("classes:  8 KiB x1 (8.0 KiB), 16 B x1 (16 B); 1 with free slots only\n"),
            "{t}"
        );
        assert!(t.contains("large:    1 object(s), 1.0 MiB"), "{t}");
        assert!(
            t.contains("root:     table = 0x7f0000210420 (8 KiB slab object)"),
            "{t}"
        );
        assert!(
            t.contains("root:     wild = 0x10 (OUTSIDE the arena)"),
            "{t}"
        );
        assert!(t.contains("lock held: heap by tid 77"), "{t}");
        assert!(t.contains("open unsafe region: tid 77 (depth 1)"), "{t}");
        assert!(t.contains("problem:  root"), "{t}");
        assert!(!t.contains("open unsafe regions: none"), "{t}");
        assert!(
            t.contains("open unsafe region in arena ? (not held): tid 0 (depth 3)"),
            "{t}"
        );
        assert_eq!(t.matches("open unsafe region").count(), 2, "{t}");
        assert!(!t.contains("free:"), "{t}");
        let mut empty = v.clone();
        empty["arenas"] = json!([]);
        empty["linked"] = json!(false);
        assert!(no_arenas("svc", &empty).contains("does not use librekindle"));
        empty["linked"] = json!(true);
        assert!(no_arenas("svc", &empty).contains("holds no arena"));
    }
}
