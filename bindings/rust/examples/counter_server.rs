//! counter_server: a small TCP counter server whose table lives in a
//! preserved arena, so it comes back from a crash warm, with every counter.
//!
//! ```text
//! counter_server [--port PORT] [--arena-mb MB]
//! rekindle run --listen 127.0.0.1:7000 -- counter_server
//! ```
//!
//! Under `rekindle run --listen` it serves the socket it inherits as fd 3
//! (`LISTEN_FDS`); otherwise it binds 127.0.0.1:PORT (default 7000) itself.
//! One command per line, one reply line each:
//!
//! | command          | reply                                           |
//! |------------------|-------------------------------------------------|
//! | `get KEY`        | the value (0 for a key never set)               |
//! | `set KEY N`      | `OK`                                            |
//! | `incr KEY [N]`   | the new value                                   |
//! | `del KEY`        | `1` if it existed, else `0`                     |
//! | `keys`           | the number of keys                              |
//! | `info`           | `generation=G start=warm pid=P keys=K requests=R supervised=B` |
//! | `crash`          | none: a NULL pointer write (SIGSEGV)            |
//! | `panic`          | none: a panic, which aborts (SIGABRT)           |
//! | `restart`        | none: a warm restart on request                 |
//!
//! A crash restarts the process in place from `main`; the new incarnation
//! finds the table in the arena, marks it, sweeps what requests left in
//! flight, and serves again. A panic is a SIGABRT that the runtime restarts
//! from like any fault: the crate's profile sets `panic = "abort"`, and
//! `rekindle::abort_on_panic()` makes sure of it (with unwinding, a panic
//! would only end the connection's thread).
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::FromRawFd;
use std::process::ExitCode;
use std::time::Duration;

use rekindle::{Arena, PVec, Preservable, Preserved, StartKind};

const KEY_MAX: usize = 32;

/// One counter. Plain data with a fixed layout: valid in the next
/// incarnation.
#[repr(C)]
#[derive(Clone, Copy)]
struct Counter {
    key: [u8; KEY_MAX],
    key_len: u32,
    _pad: u32,
    value: i64,
}
// SAFETY: repr(C) plain data; no pointers, no interior mutability.
unsafe impl Preservable for Counter {}

impl Counter {
    fn key(&self) -> &[u8] {
        &self.key[..(self.key_len as usize).min(KEY_MAX)]
    }
}

/// The root object: the counters, and how many requests all incarnations
/// have served.
#[repr(C)]
struct Table {
    counters: PVec<Counter>,
    requests: u64,
}
// SAFETY: repr(C); PVec's buffer lives in the same arena as the table.
unsafe impl Preservable for Table {}

struct Server {
    arena: Arena,
    table: Preserved<Table>,
    generation: u32,
    kind: StartKind,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("counter_server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> String {
    "usage: counter_server [--port PORT] [--arena-mb MB]".to_owned()
}

fn run() -> Result<(), String> {
    let mut start = rekindle::init().map_err(|e| format!("rekindle::init: {e}"))?;
    // A panic is a failure to restart from, like a fault: the profile says
    // panic = "abort", and this makes sure of it in builds that ignore the
    // profile (`cargo test` builds examples with unwinding).
    rekindle::abort_on_panic();

    let mut port: u16 = 7000;
    let mut arena_mb: usize = 64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next().ok_or_else(usage)?;
        match a.as_str() {
            "--port" => port = value.parse().map_err(|_| usage())?,
            "--arena-mb" => arena_mb = value.parse().map_err(|_| usage())?,
            _ => return Err(usage()),
        }
    }

    let arena = Arena::open("counters", arena_mb << 20).map_err(|e| e.to_string())?;
    let table = match arena.root::<Table>("table") {
        Ok(Some(t)) => t,
        Ok(None) => new_table(arena)?,
        Err(e) => {
            // A table of another layout (an older build): start afresh; the
            // sweep below frees the old one.
            eprintln!("counter_server: {e}; starting with an empty table");
            new_table(arena)?
        }
    };
    if let Some(mut rec) = start.recovery.take() {
        // Mark everything the app reaches: the table and its buffer.
        arena
            .read(|v| {
                rec.mark(arena, table)?;
                v.get(table).counters.mark(&rec, arena)
            })
            .map_err(|e| format!("mark: {e}"))?;
        // SAFETY: the table and its counters' buffer are the only arena
        // objects this program uses, and both are marked.
        let swept = unsafe { rec.sweep() }.map_err(|e| format!("sweep: {e}"))?;
        eprintln!(
            "counter_server: recovered; swept {} objects left in flight, kept {}",
            swept.objects_freed, swept.objects_kept
        );
    }

    let listener = listener(port)?;
    let server = Server {
        arena,
        table,
        generation: start.generation,
        kind: start.kind,
    };
    let keys = arena.view().get(table).counters.len();
    println!(
        "counter_server: generation {} ({:?}) serving {} keys on {}",
        start.generation,
        start.kind,
        keys,
        listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    );
    if start.kind != StartKind::Fresh {
        println!(
            "counter_server: previous incarnation ended by: {}; {}",
            start.reason, start.decision
        );
    }
    // stdout may be a pipe: make the lines visible now
    let _ = std::io::stdout().flush();
    rekindle::ready().map_err(|e| e.to_string())?;
    serve(listener, server)
}

fn new_table(arena: Arena) -> Result<Preserved<Table>, String> {
    let t = arena
        .alloc(Table {
            counters: PVec::new(),
            requests: 0,
        })
        .map_err(|e| e.to_string())?;
    arena.set_root("table", t).map_err(|e| e.to_string())?;
    Ok(t)
}

/// The socket `rekindle run --listen` hands over as fd 3, else our own.
fn listener(port: u16) -> Result<TcpListener, String> {
    let inherited = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| n >= 1);
    let pid_ok = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_none_or(|p| p == std::process::id());
    if inherited && pid_ok {
        // SAFETY: by the LISTEN_FDS convention fd 3 is a listening socket
        // handed to this process, and nothing else in it owns fd 3.
        let l = unsafe { TcpListener::from_raw_fd(3) };
        if l.local_addr().is_ok() {
            return Ok(l);
        }
        return Err("LISTEN_FDS is set but fd 3 is no TCP socket".to_owned());
    }
    TcpListener::bind(("127.0.0.1", port)).map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))
}

fn serve(listener: TcpListener, server: Server) -> Result<(), String> {
    // Accept without blocking, so the heartbeat ticks (rekindle run
    // --hang-timeout) and a restart the supervisor asks for is taken here.
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let server: &'static Server = Box::leak(Box::new(server));
    loop {
        rekindle::heartbeat();
        match listener.accept() {
            Ok((stream, _)) => {
                std::thread::spawn(move || {
                    let _ = connection(stream, server);
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
}

fn connection(stream: TcpStream, server: &Server) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut out = stream.try_clone()?;
    let mut lines = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let reply = server.handle(line.trim());
        match reply {
            Some(r) => writeln!(out, "{r}")?,
            None => return Ok(()),
        }
    }
}

impl Server {
    /// One command; `None` closes the connection.
    fn handle(&self, line: &str) -> Option<String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((&cmd, args)) = words.split_first() else {
            return Some("ERR empty command".to_owned());
        };
        self.arena.modify(|g| g.get_mut(self.table).requests += 1);
        let reply = match (cmd, args) {
            ("get", [key]) => self.get(key).map(|v| v.to_string()),
            ("set", [key, n]) => parse(n)
                .and_then(|n| self.update(key, |_| n))
                .map(|_| "OK".to_owned()),
            ("incr", [key]) => self
                .update(key, |v| v.wrapping_add(1))
                .map(|v| v.to_string()),
            ("incr", [key, n]) => parse(n)
                .and_then(|n| self.update(key, |v| v.wrapping_add(n)))
                .map(|v| v.to_string()),
            ("del", [key]) => self
                .delete(key)
                .map(|gone| if gone { "1" } else { "0" }.to_owned()),
            ("keys", []) => Ok(self.arena.view().get(self.table).counters.len().to_string()),
            ("info", []) => Ok(self.info()),
            ("crash", []) => crash(),
            ("panic", []) => panic!("a client asked for a panic"),
            ("restart", []) => Err(rekindle::restart("a client asked").to_string()),
            ("quit", []) => return None,
            _ => Err(format!("unknown command {line:?}")),
        };
        Some(reply.unwrap_or_else(|e| format!("ERR {e}")))
    }

    fn get(&self, key: &str) -> Result<i64, String> {
        let key = check_key(key)?;
        let v = self.arena.view();
        let t = v.get(self.table);
        Ok(t.counters
            .iter()
            .find(|c| c.key() == key)
            .map_or(0, |c| c.value))
    }

    /// Sets the key's value to `f(old)` (0 for a new key); returns it.
    fn update(&self, key: &str, f: impl FnOnce(i64) -> i64) -> Result<i64, String> {
        let key = check_key(key)?;
        let arena = self.arena;
        arena.modify(|g| {
            let t = g.get_mut(self.table);
            if let Some(c) = t.counters.iter_mut().find(|c| c.key() == key) {
                c.value = f(c.value);
                return Ok(c.value);
            }
            let mut c = Counter {
                key: [0; KEY_MAX],
                key_len: key.len() as u32,
                _pad: 0,
                value: 0,
            };
            c.key[..key.len()].copy_from_slice(key);
            c.value = f(0);
            t.counters.push(arena, c).map_err(|e| e.to_string())?;
            Ok(c.value)
        })
    }

    fn delete(&self, key: &str) -> Result<bool, String> {
        let key = check_key(key)?;
        Ok(self.arena.modify(|g| {
            let t = g.get_mut(self.table);
            match t.counters.iter().position(|c| c.key() == key) {
                Some(i) => {
                    t.counters.swap_remove(i);
                    true
                }
                None => false,
            }
        }))
    }

    fn info(&self) -> String {
        let v = self.arena.view();
        let t = v.get(self.table);
        let start = match self.kind {
            StartKind::Fresh => "fresh",
            StartKind::Warm => "warm",
            StartKind::Cold => "cold",
        };
        format!(
            "generation={} start={start} pid={} keys={} requests={} supervised={}",
            self.generation,
            std::process::id(),
            t.counters.len(),
            t.requests,
            rekindle::is_supervised()
        )
    }
}

fn check_key(key: &str) -> Result<&[u8], String> {
    if key.is_empty() || key.len() > KEY_MAX {
        return Err(format!("keys are 1 to {KEY_MAX} bytes"));
    }
    Ok(key.as_bytes())
}

fn parse(n: &str) -> Result<i64, String> {
    n.parse().map_err(|_| format!("not an integer: {n:?}"))
}

/// A real fault: a write through a NULL pointer the compiler cannot see.
fn crash() -> Result<String, String> {
    let p = std::hint::black_box(0usize) as *mut u64;
    // SAFETY: none: this write faults on purpose (SIGSEGV), and the runtime
    // restarts the process from main, warm.
    unsafe { std::ptr::write_volatile(p, 42) };
    Err("still alive after a NULL write".to_owned())
}
