//! End-to-end tests of the `rekindle` binary with ordinary programs (no
//! librekindle): exit codes, the crash-loop policy, events, the control
//! socket and its commands.  The system tests with the runtime's test app
//! live in tests/test_supervisor.py at the top of the repository.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_rekindle");

struct Tmp(PathBuf);

impl Tmp {
    fn new(tag: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!("rekindle-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{e}"));
        Tmp(p)
    }
    fn run_dir(&self) -> PathBuf {
        self.0.join("run")
    }
    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.0.join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
    fn of(&self, kind: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["supervisor"] == kind)
            .collect()
    }
    fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("REKINDLE_RUNTIME_DIR", self.run_dir())
            .env_remove("NOTIFY_SOCKET");
        c
    }
    fn run(&self, name: &str, opts: &[&str], prog: &[&str]) -> Child {
        let ev = self.0.join("events.jsonl");
        let mut c = self.cmd();
        c.args(["run", "--name", name, "--events"])
            .arg(&ev)
            .args(opts)
            .arg("--")
            .args(prog)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c.spawn().unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn wait(child: &mut Child, secs: u64) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return s.code().unwrap_or(-1);
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            panic!("rekindle did not exit within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_for(path: &Path) {
    let t0 = Instant::now();
    while !path.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn request(sock: &Path, line: &[u8]) -> Value {
    let mut s = UnixStream::connect(sock).unwrap_or_else(|e| panic!("{e}"));
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap_or_default();
    s.write_all(line).unwrap_or_else(|e| panic!("{e}"));
    let mut r = String::new();
    BufReader::new(s).read_line(&mut r).unwrap_or_default();
    serde_json::from_str(&r).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

#[test]
fn usage_errors_exit_2() {
    let out = Command::new(BIN)
        .arg("run")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PROGRAM"));
    let out = Command::new(BIN)
        .args(["run", "--", "/no/such/program"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(BIN)
        .args(["run", "--max-rss", "lots", "--", "true"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    // the redo log's threshold: a size, and only with a store
    for (args, names) in [
        (
            &["run", "--redo-snapshot-bytes", "64M", "--", "true"][..],
            "--snapshot-dir",
        ),
        (
            &[
                "run",
                "--snapshot-dir",
                "/tmp/x",
                "--redo-snapshot-bytes",
                "lots",
                "--",
                "true",
            ][..],
            "--redo-snapshot-bytes",
        ),
    ] {
        let out = Command::new(BIN)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(names),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn clean_exit_ends_the_supervisor_with_0() {
    let t = Tmp::new("clean");
    let mut c = t.run("clean", &[], &["sh", "-c", "exit 0"]);
    assert_eq!(wait(&mut c, 10), 0);
    let d = t.of("decision");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0]["mode"], "exit");
    assert!(t.of("failure").is_empty());
    assert!(
        !t.run_dir().join("clean.sock").exists(),
        "socket removed at exit"
    );
}

#[test]
fn crash_loop_backs_off_and_gives_up() {
    let t = Tmp::new("loop");
    let mut c = t.run(
        "loop",
        &["--max-restarts", "3", "--backoff-initial", "20ms"],
        &["sh", "-c", "exit 3"],
    );
    assert_eq!(wait(&mut c, 20), 1);
    let spawns = t.of("spawn");
    assert_eq!(spawns.len(), 4);
    let backoffs: Vec<u64> = spawns
        .iter()
        .map(|s| s["backoff_ms"].as_u64().unwrap_or(999))
        .collect();
    assert_eq!(backoffs, vec![0, 0, 20, 40]);
    let gens: Vec<u64> = spawns
        .iter()
        .map(|s| s["generation"].as_u64().unwrap_or(999))
        .collect();
    assert_eq!(gens, vec![0, 1, 2, 3]);
    let f = t.of("failure");
    assert_eq!(f.len(), 4);
    assert!(f.iter().all(|f| f["kind"] == "exit" && f["exit_code"] == 3));
    let cold: Vec<Value> = t
        .of("decision")
        .into_iter()
        .filter(|d| d["mode"] == "cold")
        .collect();
    assert_eq!(cold.len(), 3, "no preserved state: every respawn is cold");
    assert_eq!(t.of("giveup").len(), 1);
    assert_eq!(t.of("restart").len(), 3);
}

#[test]
fn death_by_signal_is_named() {
    let t = Tmp::new("sig");
    let mut c = t.run(
        "sig",
        &["--max-restarts", "0"],
        &["sh", "-c", "kill -SEGV $$"],
    );
    assert_eq!(wait(&mut c, 10), 1);
    let f = t.of("failure");
    assert_eq!(f[0]["kind"], "signal");
    assert_eq!(f[0]["signal"], "SIGSEGV");
}

#[test]
fn control_socket_commands_and_garbage() {
    let t = Tmp::new("ctl");
    let mut c = t.run("ctl", &["--kill-timeout", "200ms"], &["sleep", "30"]);
    let sock = t.run_dir().join("ctl.sock");
    wait_for(&sock);
    let mode = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0)
    };
    assert_eq!(mode(&sock), 0o600);
    assert_eq!(mode(&t.run_dir()), 0o700);

    // a second supervisor of the same name is refused
    let dup = t
        .cmd()
        .args(["run", "--name", "ctl", "--", "true"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(dup.status.code(), Some(1));

    for bad in [
        &b"not json\n"[..],
        b"{\"cmd\":\"format-disk\"}\n",
        b"\x00\xff\xfe garbage\n",
        b"{\"cmd\":\"restart\",\"mode\":\"lukewarm\"}\n",
        b"[1,2,3]\n",
        b"\n",
        b"{\"cmd\":\"status\",\"cmd\":\"stop\"}\n",
    ] {
        let r = request(&sock, bad);
        assert_eq!(r["ok"], false, "{r}");
        assert!(r["error"].as_str().is_some_and(|e| !e.is_empty()));
    }
    let mut long = vec![b'x'; 70000];
    long.push(b'\n');
    assert_eq!(request(&sock, &long)["ok"], false);

    let st = request(&sock, b"{\"cmd\":\"status\"}\n");
    assert_eq!(st["ok"], true);
    assert_eq!(st["name"], "ctl");
    assert_eq!(st["generation"], 0);
    let pid0 = st["pid"].as_i64().unwrap_or(0);
    assert!(pid0 > 0);

    let out = t
        .cmd()
        .args(["status", "ctl", "--json"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(v["pid"].as_i64(), Some(pid0));
    let out = t
        .cmd()
        .args(["ps"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ctl"));

    // an app without the runtime is restarted by SIGTERM and respawned
    let out = t
        .cmd()
        .args(["restart", "ctl", "--cold"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t0 = Instant::now();
    while t.of("spawn").len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t.events());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(t.of("failure")[0]["kind"], "request");

    let out = t
        .cmd()
        .args(["stop", "ctl"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(wait(&mut c, 20), 0);
    assert_eq!(t.of("stop").len(), 1);
    assert!(!sock.exists());
    let out = t
        .cmd()
        .args(["status", "ctl"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn sigterm_stops_with_0_and_sigkills_a_stubborn_app() {
    let t = Tmp::new("term");
    let mut c = t.run(
        "term",
        &["--stop-timeout", "200ms"],
        &["sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"],
    );
    wait_for(&t.run_dir().join("term.sock"));
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    assert_eq!(wait(&mut c, 10), 0);
    let stop = t.of("stop");
    assert_eq!(stop[0]["signal"], "SIGKILL");
    assert_eq!(t.of("kill").len(), 1);
}

#[test]
fn the_app_gets_the_contract_environment_and_fds() {
    let t = Tmp::new("env");
    let out = t.0.join("env.txt");
    let script = format!(
        "{{ env | grep -E '^(REKINDLE_|LISTEN_|NOTIFY_SOCKET)' | sort; \
         echo pid=$$; ls -l /proc/self/fd/ | awk '{{print $9, $11}}' | sort -n | grep -v '^ *$'; }} > {}",
        out.display()
    );
    let mut c = t.run("env", &["--listen", "127.0.0.1:0"], &["sh", "-c", &script]);
    assert_eq!(wait(&mut c, 10), 0);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let pid = text
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .unwrap_or("?");
    for want in [
        "REKINDLE_SUPERVISOR_FD=4".to_string(),
        "REKINDLE_CONTROL_FD=5".into(),
        "REKINDLE_RESTART_SIGNAL=40".into(),
        "REKINDLE_CRASHLOOP_MS=1000".into(),
        "REKINDLE_NAME=env".into(),
        "LISTEN_FDS=1".into(),
        format!("LISTEN_PID={pid}"),
        "LISTEN_FDNAMES=listen0".into(),
        format!("REKINDLE_SOCKET={}", t.run_dir().join("env.sock").display()),
    ] {
        assert!(text.lines().any(|l| l == want), "{want} missing in\n{text}");
    }
    assert!(text.contains("NOTIFY_SOCKET="), "{text}");
    assert!(text.lines().any(|l| l.starts_with("3 socket:")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("4 socket:")), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("5 /memfd:rekindle:control")),
        "{text}"
    );
    // nothing else above 5 but the fd ls itself opened
    let extra: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.split(' ')
                .next()
                .and_then(|n| n.parse::<i32>().ok())
                .is_some_and(|n| n > 5)
        })
        .filter(|l| !l.contains("/proc/"))
        .collect();
    assert!(extra.is_empty(), "leaked fds: {extra:?}");
}

fn rekindle(t: &Tmp, args: &[&str]) -> (Option<i32>, String) {
    let out = t
        .cmd()
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_unknown_option_is_a_usage_error() {
    let t = Tmp::new("bogus");
    let (code, err) = rekindle(&t, &["run", "--bogus", "--", "/bin/true"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown option '--bogus'"), "{err}");
    assert!(!err.contains("PATH"), "{err}");
}

#[test]
fn an_events_file_that_cannot_be_opened_is_named_plainly() {
    let t = Tmp::new("evfile");
    let (code, err) = rekindle(
        &t,
        &["run", "--events", "/nonexistent/x", "--", "/bin/true"],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("cannot open the events file /nonexistent/x: No such file or directory"),
        "{err}"
    );
    assert!(!err.contains("Some("), "{err}");
}

#[test]
fn a_missing_program_is_not_found_and_a_plain_file_not_executable() {
    let t = Tmp::new("prog");
    let (code, err) = rekindle(&t, &["run", "--", "/no/such/program"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("/no/such/program: not found"), "{err}");
    let plain = t.0.join("plain");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap_or_else(|e| panic!("{e}"));
    let plain = plain.to_string_lossy().into_owned();
    let (code, err) = rekindle(&t, &["run", "--", &plain]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("not executable (no execute permission)"),
        "{err}"
    );
    let dir = t.0.to_string_lossy().into_owned();
    let (code, err) = rekindle(&t, &["run", "--", &dir]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not executable (a directory)"), "{err}");
}

#[test]
fn a_stale_socket_is_reported_as_a_supervisor_that_is_not_running() {
    let t = Tmp::new("stale");
    std::fs::create_dir_all(t.run_dir()).unwrap_or_else(|e| panic!("{e}"));
    let sock = t.run_dir().join("gone.sock");
    // a socket file nobody listens on, as a SIGKILLed supervisor leaves it
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap_or_else(|e| panic!("{e}")));
    let (code, err) = rekindle(&t, &["status", "gone"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the supervisor \"gone\" is not running: stale socket at {}",
            sock.display()
        )),
        "{err}"
    );
    assert!(!err.contains("Connection refused"), "{err}");
    let (code, err) = rekindle(&t, &["stop", "gone"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is not running"), "{err}");
    let out = t
        .cmd()
        .args(["ps"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("gone ") && l.contains(" stale ")),
        "{text}"
    );
    let out = t
        .cmd()
        .args(["ps", "--json"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

#[test]
fn a_failed_start_leaves_no_socket_files_behind() {
    let t = Tmp::new("bindfail");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = busy
        .local_addr()
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = format!("127.0.0.1:{port}");
    let unix = t.0.join("app.sock");
    let unix_arg = format!("unix:{}", unix.display());
    for (what, opts) in [
        (
            "--listen",
            vec!["--listen", unix_arg.as_str(), "--listen", &addr],
        ),
        (
            "metrics",
            vec!["--listen", unix_arg.as_str(), "--metrics", &addr],
        ),
    ] {
        let (code, err) = rekindle(
            &t,
            &[
                &["run", "--name", "bindfail"][..],
                &opts,
                &["--", "/bin/true"],
            ]
            .concat(),
        );
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains(what) && err.contains("Address already in use"),
            "{err}"
        );
        let left: Vec<String> = std::fs::read_dir(t.run_dir())
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "{what}: left behind: {left:?}");
        assert!(!unix.exists(), "{what}: {} left behind", unix.display());
    }
}
