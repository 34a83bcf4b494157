//! The Rust example's warm restart, as real processes: counter_server is
//! started, given values over TCP, crashed (a real SIGSEGV, then a panic
//! that aborts), and the next incarnation must answer with the same values
//! and report a warm start. Then the same under the real supervisor
//! (`rekindle run`, if built), with a SIGKILL: a warm respawn.
//!
//! Every wait is bounded; every process is killed when its guard drops.
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(15);

/// target/<profile>/examples/counter_server, next to this test's deps/.
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps");
    let bin = dir.join("examples").join("counter_server");
    assert!(
        bin.is_file(),
        "{} missing: `cargo test` builds the examples first",
        bin.display()
    );
    bin
}

/// A directory of this test's own (under cargo's tmp dir for tests).
fn scratch_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create the test's scratch directory");
    d
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("its address").port()
}

/// Kills (SIGTERM, then SIGKILL) and reaps its process when dropped.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits up to `grace` before SIGKILL.
    fn stop(&mut self, grace: Duration) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        signal(self.child.id(), "TERM");
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// Starts `cmd` with stdout and stderr into `log`.
fn spawn(mut cmd: Command, log: PathBuf) -> Proc {
    let out = std::fs::File::create(&log).expect("create the log");
    let err = out.try_clone().expect("dup the log");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start the process");
    Proc { child, log }
}

/// One command, one reply line; `None` if the server is not there (yet) or
/// closed without a reply.
fn try_command(port: u16, line: &str) -> Option<String> {
    let addr = ("127.0.0.1", port);
    let s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    (&s).write_all(format!("{line}\n").as_bytes()).ok()?;
    let mut reply = String::new();
    BufReader::new(&s).read_line(&mut reply).ok()?;
    let reply = reply.trim().to_owned();
    (!reply.is_empty()).then_some(reply)
}

/// Sends a command, retrying while the server (re)starts.
fn command(p: &Proc, port: u16, line: &str) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(r) = try_command(port, line) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "no reply to {line:?} within {TIMEOUT:?}; log:\n{}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a command that ends the incarnation (no reply expected).
fn fire(port: u16, line: &str) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to fire a command");
    s.write_all(format!("{line}\n").as_bytes())
        .expect("send the command");
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut rest = String::new();
    let _ = BufReader::new(&s).read_line(&mut rest); // returns at the process's end
}

/// `info` as key=value pairs.
fn info(p: &Proc, port: u16) -> std::collections::HashMap<String, String> {
    command(p, port, "info")
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Waits until the incarnation of `generation` answers; returns its info.
fn wait_generation(
    p: &Proc,
    port: u16,
    generation: u32,
) -> std::collections::HashMap<String, String> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let i = info(p, port);
        if i.get("generation").map(String::as_str) == Some(&generation.to_string()) {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "generation {generation} never answered (last info {i:?}); log:\n{}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn set_values(p: &Proc, port: u16) {
    assert_eq!(command(p, port, "set alpha 41"), "OK");
    assert_eq!(command(p, port, "incr alpha"), "42");
    assert_eq!(command(p, port, "set beta -7"), "OK");
    assert_eq!(command(p, port, "incr gamma 1000"), "1000");
    assert_eq!(command(p, port, "set doomed 1"), "OK");
    assert_eq!(command(p, port, "del doomed"), "1");
}

fn assert_values(p: &Proc, port: u16) {
    assert_eq!(command(p, port, "get alpha"), "42", "log:\n{}", p.log());
    assert_eq!(command(p, port, "get beta"), "-7");
    assert_eq!(command(p, port, "get gamma"), "1000");
    assert_eq!(command(p, port, "get doomed"), "0");
    assert_eq!(command(p, port, "keys"), "3");
}

#[test]
fn crash_and_panic_restart_warm_in_place_with_the_table_intact() {
    let dir = scratch_dir("in-place");
    let port = free_port();
    let mut cmd = Command::new(example_binary());
    cmd.args(["--port", &port.to_string(), "--arena-mb", "16"])
        // the test crashes on purpose, quickly: no crash-loop window
        .env("REKINDLE_CRASHLOOP_MS", "0");
    let p = spawn(cmd, dir.join("server.log"));

    let first = wait_generation(&p, port, 0);
    assert_eq!(first["start"], "fresh");
    let pid = first["pid"].clone();
    set_values(&p, port);

    // a real SIGSEGV: the runtime re-execs the same process, warm
    fire(port, "crash");
    let second = wait_generation(&p, port, 1);
    assert_eq!(second["start"], "warm", "log:\n{}", p.log());
    assert_eq!(second["pid"], pid, "an in-place restart keeps the pid");
    assert_values(&p, port);
    let log = p.log();
    assert!(
        log.contains("signal 11") || log.contains("SIGSEGV"),
        "log:\n{log}"
    );

    // a panic aborts (panic = "abort"): SIGABRT, warm again
    fire(port, "panic");
    let third = wait_generation(&p, port, 2);
    assert_eq!(third["start"], "warm", "log:\n{}", p.log());
    assert_values(&p, port);
    assert_eq!(command(&p, port, "incr alpha"), "43");
    // requests of every incarnation were counted in the preserved table
    let requests: u64 = info(&p, port)["requests"].parse().expect("a number");
    assert!(requests > 15, "requests={requests}");
}

/// `../../build/bin/rekindle`, or `$REKINDLE_BUILD/bin/rekindle`.
fn supervisor_binary() -> Option<PathBuf> {
    let build = std::env::var_os("REKINDLE_BUILD")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build"));
    let bin = build.join("bin").join("rekindle");
    bin.is_file().then_some(bin)
}

#[test]
fn sigkill_under_the_supervisor_respawns_warm() {
    let Some(rekindle) = supervisor_binary() else {
        eprintln!("skipped: build/bin/rekindle is not built (make supervisor)");
        return;
    };
    let dir = scratch_dir("supervised");
    let port = free_port();
    let events = dir.join("events.jsonl");
    let mut cmd = Command::new(rekindle);
    cmd.arg("run")
        .args(["--name", "rust-counter"])
        .arg("--events")
        .arg(&events)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--")
        .arg(example_binary())
        .args(["--arena-mb", "16"])
        .env("REKINDLE_RUNTIME_DIR", dir.join("run"))
        .env_remove("NOTIFY_SOCKET");
    let mut p = spawn(cmd, dir.join("supervisor.log"));

    let first = wait_generation(&p, port, 0);
    assert_eq!(first["start"], "fresh");
    assert_eq!(first["supervised"], "true", "log:\n{}", p.log());
    set_values(&p, port);

    // no handler runs: the supervisor held the arena and respawns warm
    signal(first["pid"].parse().expect("a pid"), "KILL");
    let second = wait_generation(&p, port, 1);
    assert_eq!(second["start"], "warm", "log:\n{}", p.log());
    assert_ne!(second["pid"], first["pid"], "a respawn is a new process");
    assert_values(&p, port);

    let ev = std::fs::read_to_string(&events).unwrap_or_default();
    assert!(
        ev.lines()
            .any(|l| l.contains("\"decision\"") && l.contains("\"warm\"")),
        "no warm decision among the events:\n{ev}"
    );
    p.stop(Duration::from_secs(10));
}
