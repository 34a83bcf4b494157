//! The control socket NAME.sock (Unix SOCK_STREAM, mode 0600 in a 0700
//! directory): one JSON request per line, at most 64 KiB, one JSON reply
//! line each.  Peers must be our uid or root (SO_PEERCRED).
//!
//!   {"cmd":"status"}
//!   {"cmd":"restart","mode":"warm"|"cold"}     (mode defaults to warm)
//!   {"cmd":"stop"}
//!   {"cmd":"inspect"}                          (the held arenas, read: inspect.rs)
//!   {"cmd":"checkpoint","tags":[..],"wait":b}  (a snapshot; with wait, replied when durable)
//!   {"cmd":"rollback","snapshot":"ID|TAG"}     (restart warm onto a snapshot)
//!
//! Replies are {"ok":true,...} or {"ok":false,"error":"..."}.  Malformed
//! JSON, an empty line, a duplicate key, an unknown command or an overlong
//! line get an error reply and the connection stays open.
//!
//! Over 600 lines: both ends of the socket (the table rules and request
//! parser, pure and first; the server; the client's call) stay together so
//! that the line format has one home; a fifth of it is tests.
//!
//! Floods.  Any process of our uid can open connections as fast as it likes
//! and keep them open, saying nothing or half a line.  The table holds 64;
//! what must never happen is that a client which connects, sends one
//! complete request line and waits for the reply loses its place to the
//! flood before it is answered.  The policy:
//!
//! - What every connection has sent is read before newcomers are accepted
//!   (each round of `Server::accept`), and a candidate for eviction is read
//!   once more just before: a request that is there is answered, not thrown
//!   away with its connection.
//! - At most ACCEPT_BATCH (16) newcomers are accepted per round, and the
//!   requests found are served between rounds (the supervisor serves the
//!   ids `accept` returns).  A newcomer whose request is not there yet goes
//!   only after the connections older than it, so it outlives the next
//!   three rounds at least (some 60 newcomers) and is read at each.
//! - A newcomer to a full table evicts, in this order: a connection that has
//!   sent an incomplete line (the one stuck mid-line the longest: slowloris
//!   and half-line floods go first); else the one idle the longest (its last
//!   complete request, or its accept, the longest ago); only when every
//!   connection has a request read and not yet answered (a flood of complete
//!   requests) the oldest of those.  A connection waiting for a stop to
//!   finish is never evicted; only when all 64 are such is a newcomer
//!   refused.
//! - A connection that sends no complete line for 5 s is closed anyway.
//! - An evicted connection is told so (`"code": "evicted"`): none of its
//!   requests was carried out.  `call` (the CLI) then sends its request
//!   again on a new connection, as it does when its write finds the
//!   connection already closed, until its timeout.
//!
//! There is deliberately no minimum age that protects a newcomer from
//! eviction: it would cap admissions at 64 per that age, and under a flood
//! every other newcomer, a genuine one included, would then be refused at
//! the door (or left in the listen backlog, where it cannot even connect).
//! Eviction in accept order gives each silent connection the longest life
//! the flood allows.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use thiserror::Error;

use crate::decide::Mode;

pub const MAX_LINE: usize = 64 * 1024;
/// Connections served at once; a newcomer beyond them evicts one (see
/// `admit`).
pub const MAX_CLIENTS: usize = 64;
/// Newcomers accepted per call of `Server::accept` (one poll round).
pub const ACCEPT_BATCH: usize = 16;
/// A connection that sends no complete request line for this long is
/// closed (one that waits for a stop to finish excepted).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// A refused peer (uid) is told so and closed after this at most.
const REFUSED_LINGER: Duration = Duration::from_secs(5);
const MAX_OUT: usize = 1 << 20;

// ---- the connection table's rules (pure) -------------------------------------

/// What the table rules need to know of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    /// Accepted at, or the time of its last complete request line.
    pub last_request: Instant,
    /// It asked for a stop and waits for the supervisor's exit.
    pub held: bool,
    /// Refused (peer uid): told so, never served, not counted.
    pub refused: bool,
    /// Accepted at.
    pub since: Instant,
    /// It has complete requests read and not yet answered.
    pub pending: bool,
    /// It has sent an incomplete line, begun at this time.
    pub partial_since: Option<Instant>,
}

/// Why the table closes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// No complete request line within IDLE_TIMEOUT.
    Idle,
    /// A refused peer's time is up.
    Refused,
}

impl Expiry {
    pub fn message(self) -> String {
        match self {
            Expiry::Idle => format!(
                "closed: no complete request line within {} s",
                IDLE_TIMEOUT.as_secs()
            ),
            Expiry::Refused => "closed".into(),
        }
    }
}

/// Whether a connection is to be closed now.
pub fn expiry(a: &Activity, now: Instant) -> Option<Expiry> {
    if a.refused {
        return (now.saturating_duration_since(a.since) > REFUSED_LINGER)
            .then_some(Expiry::Refused);
    }
    if a.held {
        return None;
    }
    (now.saturating_duration_since(a.last_request) > IDLE_TIMEOUT).then_some(Expiry::Idle)
}

/// What a newcomer (an accepted, not refused connection) meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// There is room.
    Room,
    /// The table is full: the connection at this index makes room.
    Evict(usize),
    /// Every slot waits for a stop: refuse the newcomer.
    Full,
}

/// Which connection goes first when one must: lowest first.  One stuck
/// mid-line the longest, then one idle the longest, and one with a request
/// waiting for its answer only when all have one (then the oldest).
fn eviction_rank(a: &Activity) -> (u8, Instant) {
    match (a.pending, a.partial_since) {
        (false, Some(t)) => (0, t),
        (false, None) => (1, a.last_request),
        (true, _) => (2, a.since),
    }
}

/// The admission rule over the current connections (indexes are theirs).
/// A held connection (waiting for a stop) is never evicted.
pub fn admit(clients: &[Activity], max: usize) -> Admission {
    let counted = clients.iter().filter(|a| !a.refused).count();
    if counted < max {
        return Admission::Room;
    }
    clients
        .iter()
        .enumerate()
        .filter(|(_, a)| !a.refused && !a.held)
        .min_by_key(|(_, a)| eviction_rank(a))
        .map_or(Admission::Full, |(i, _)| Admission::Evict(i))
}

/// What an evicted connection is told.
pub fn eviction_message(a: &Activity) -> &'static str {
    match eviction_rank(a).0 {
        0 => {
            "closed: too many control connections, and this one sent an incomplete line the longest"
        }
        1 => "closed: too many control connections, and this one was idle the longest",
        _ => "closed: too many control connections, all busy; its requests were not carried out",
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Status,
    Restart(Mode),
    Stop,
    Inspect,
    /// A snapshot now; with `wait` the reply comes when it is durable.
    Checkpoint {
        tags: Vec<String>,
        wait: bool,
    },
    /// Restart the app warm onto a snapshot ("" = the newest).
    Rollback {
        snapshot: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    #[error("request is not valid JSON: {0}")]
    Json(String),
    #[error("request must be a JSON object")]
    NotObject,
    #[error("request has no string \"cmd\"")]
    NoCmd,
    #[error("unknown cmd {0:?} (status, restart, stop, inspect, checkpoint, rollback)")]
    UnknownCmd(String),
    #[error("mode must be \"warm\" or \"cold\"")]
    BadMode,
    #[error(
        "checkpoint takes \"tags\" (strings) and \"wait\" (a boolean); rollback a \"snapshot\" (a string)"
    )]
    BadTags,
    #[error("request longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("empty request: send one JSON object per line, e.g. {{\"cmd\":\"status\"}}")]
    Empty,
    #[error("duplicate key {0:?} in the request")]
    DuplicateKey(String),
}

/// A JSON value whose objects, at any depth, hold each key once: serde_json
/// keeps the last of duplicate keys, and {"cmd":"status","cmd":"stop"}
/// would be a stop.  The first duplicate key found is recorded in `dup`.
struct NoDuplicates<'a> {
    dup: &'a std::cell::RefCell<Option<String>>,
}

impl<'de> serde::de::DeserializeSeed<'de> for NoDuplicates<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for NoDuplicates<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = seq.next_element_seed(NoDuplicates { dup: self.dup })? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        use serde::de::Error;
        let mut m = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if m.contains_key(&k) {
                let shown: String = k.chars().take(64).collect();
                *self.dup.borrow_mut() = Some(shown.clone());
                return Err(A::Error::custom(format!("duplicate key {shown:?}")));
            }
            let v = map.next_value_seed(NoDuplicates { dup: self.dup })?;
            m.insert(k, v);
        }
        Ok(Value::Object(m))
    }
}

/// Parses one JSON value, refusing duplicate keys.
fn parse_strict(line: &[u8]) -> Result<Value, RequestError> {
    use serde::de::DeserializeSeed;
    let dup = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(line);
    let r = NoDuplicates { dup: &dup }
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v));
    match (r, dup.into_inner()) {
        (_, Some(k)) => Err(RequestError::DuplicateKey(k)),
        (Ok(v), None) => Ok(v),
        (Err(e), None) => Err(RequestError::Json(e.to_string())),
    }
}

/// Parses one request line (without its newline).
pub fn parse_request(line: &[u8]) -> Result<Request, RequestError> {
    if line.len() > MAX_LINE {
        return Err(RequestError::TooLong);
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err(RequestError::Empty);
    }
    let v = parse_strict(line)?;
    let o = v.as_object().ok_or(RequestError::NotObject)?;
    let cmd = o
        .get("cmd")
        .and_then(Value::as_str)
        .ok_or(RequestError::NoCmd)?;
    match cmd {
        "status" => Ok(Request::Status),
        "stop" => Ok(Request::Stop),
        "inspect" => Ok(Request::Inspect),
        "checkpoint" => {
            let tags = match o.get("tags") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|t| t.as_str().map(str::to_string).ok_or(RequestError::BadTags))
                    .collect::<Result<Vec<_>, _>>()?,
                Some(_) => return Err(RequestError::BadTags),
            };
            let wait = match o.get("wait") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(RequestError::BadTags),
            };
            Ok(Request::Checkpoint { tags, wait })
        }
        "rollback" => match o.get("snapshot") {
            None | Some(Value::Null) => Ok(Request::Rollback {
                snapshot: String::new(),
            }),
            Some(Value::String(s)) => Ok(Request::Rollback {
                snapshot: s.clone(),
            }),
            Some(_) => Err(RequestError::BadTags),
        },
        "restart" => match o.get("mode") {
            None | Some(Value::Null) => Ok(Request::Restart(Mode::Warm)),
            Some(Value::String(s)) if s == "warm" => Ok(Request::Restart(Mode::Warm)),
            Some(Value::String(s)) if s == "cold" => Ok(Request::Restart(Mode::Cold)),
            Some(_) => Err(RequestError::BadMode),
        },
        other => {
            let shown: String = other.chars().take(64).collect();
            Err(RequestError::UnknownCmd(shown))
        }
    }
}

pub fn error_reply(msg: &str) -> Value {
    json!({"ok": false, "error": msg})
}

/// The reply of a connection evicted to make room: none of its requests
/// was carried out, so a client may send them again (`call` does).
pub fn evicted_reply(msg: &str) -> Value {
    json!({"ok": false, "code": "evicted", "error": msg})
}

/// Splits complete lines off a client's input buffer.  An overlong line is
/// reported once as TooLong and skipped up to its newline.
#[derive(Default)]
pub struct LineReader {
    buf: Vec<u8>,
    discarding: bool,
}

impl LineReader {
    /// Whether it holds the beginning of a line (or skips an overlong one).
    pub fn partial(&self) -> bool {
        !self.buf.is_empty() || self.discarding
    }

    pub fn push(&mut self, data: &[u8], out: &mut Vec<Result<Request, RequestError>>) {
        for chunk in data.split_inclusive(|&c| c == b'\n') {
            let complete = chunk.last() == Some(&b'\n');
            let body = if complete {
                &chunk[..chunk.len() - 1]
            } else {
                chunk
            };
            if self.discarding {
                if complete {
                    self.discarding = false;
                }
                continue;
            }
            if self.buf.len() + body.len() > MAX_LINE {
                self.buf.clear();
                out.push(Err(RequestError::TooLong));
                self.discarding = !complete;
                continue;
            }
            self.buf.extend_from_slice(body);
            if complete {
                let line = std::mem::take(&mut self.buf);
                out.push(parse_request(trim_ascii(&line))); // an empty line too
            }
        }
    }
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let s = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let e = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(s, |e| e + 1);
    &b[s..e.max(s)]
}

pub struct Client {
    pub id: u64,
    stream: UnixStream,
    reader: LineReader,
    out: Vec<u8>,
    pub closing: bool,
    pub hold_open: bool,
    /// Refused (uid, too many clients): told so once; its input is read and
    /// dropped, never acted on, and it is closed after that or after 5 s.
    refused: bool,
    since: Instant,
    /// Accepted, or its last complete request line (the idle timeout).
    last_request: Instant,
    /// Requests read and not yet handed out by `read`.
    pending: Vec<Result<Request, RequestError>>,
    /// When the incomplete line it has sent began.
    partial_since: Option<Instant>,
}

pub struct Server {
    listener: UnixListener,
    path: PathBuf,
    ino: u64,
    pub clients: Vec<Client>,
    next_id: u64,
}

/// Peer uid of a connected Unix socket.
pub fn peer_uid(fd: BorrowedFd<'_>) -> io::Result<u32> {
    // SAFETY: zeroed ucred is valid; getsockopt writes at most its size.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: as above.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

impl Server {
    /// Binds NAME.sock: refuses if a live supervisor answers there, removes a
    /// stale socket file.
    pub fn bind(path: &Path) -> Result<Self> {
        if let Ok(md) = std::fs::symlink_metadata(path) {
            if !md.file_type().is_socket() {
                bail!("{} exists and is not a socket", path.display());
            }
            if listening(path) {
                bail!("a supervisor is already running at {}", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale {}", path.display()))?;
        }
        // SAFETY: umask is process-wide and we are single-threaded here.
        let old = unsafe { libc::umask(0o177) };
        let l = UnixListener::bind(path);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let listener = l.with_context(|| format!("binding {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let ino = std::fs::symlink_metadata(path)
            .map(|m| m.ino())
            .unwrap_or(0);
        Ok(Server {
            listener,
            path: path.to_path_buf(),
            ino,
            clients: Vec::new(),
            next_id: 1,
        })
    }

    pub fn listener_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// One round of accepts: reads what the connections have sent, then
    /// accepts up to ACCEPT_BATCH newcomers, evicting one for each when the
    /// table is full (see the policy at the top).  Returns the ids of the
    /// connections with requests to serve now (`Client::read` hands them
    /// out); newcomers that have sent nothing yet are served when readable.
    pub fn accept(&mut self) -> Vec<u64> {
        for c in &mut self.clients {
            c.fill();
        }
        self.sweep(); // the gone and the expired make room first
        for _ in 0..ACCEPT_BATCH {
            let s = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break, // WouldBlock, or out of fds: next round
            };
            let _ = s.set_nonblocking(true);
            // SAFETY: geteuid cannot fail.
            let me = unsafe { libc::geteuid() };
            let id = self.next_id;
            self.next_id += 1;
            let now = Instant::now();
            let mut c = Client {
                id,
                stream: s,
                reader: LineReader::default(),
                out: Vec::new(),
                closing: false,
                hold_open: false,
                refused: false,
                since: now,
                last_request: now,
                pending: Vec::new(),
                partial_since: None,
            };
            match peer_uid(c.stream.as_fd()) {
                Ok(uid) if uid == me || uid == 0 => {}
                Ok(uid) => {
                    c.queue(&error_reply(&format!("permission denied: peer uid {uid}")));
                    c.refused = true;
                }
                Err(e) => {
                    c.queue(&error_reply(&format!("cannot check peer credentials: {e}")));
                    c.refused = true;
                }
            }
            if !c.refused && !self.make_room() {
                c.queue(&error_reply("too many control connections"));
                c.refused = true;
            }
            c.flush();
            if c.refused && self.clients.len() >= 2 * MAX_CLIENTS {
                continue; // flooded: dropped at once
            }
            c.fill(); // its request may be there already
            self.clients.push(c);
        }
        self.clients
            .iter()
            .filter(|c| !c.pending.is_empty())
            .map(|c| c.id)
            .collect()
    }

    /// Evicts one connection if the table is full; false if it is full of
    /// connections waiting for a stop.  The one chosen is read first, and
    /// spared if a request of its own turns up.
    fn make_room(&mut self) -> bool {
        loop {
            let table: Vec<Activity> = self.clients.iter().map(Client::activity).collect();
            let i = match admit(&table, MAX_CLIENTS) {
                Admission::Room => return true,
                Admission::Full => return false,
                Admission::Evict(i) => i,
            };
            let Some(c) = self.clients.get_mut(i) else {
                return false; // cannot happen: admit indexes the table
            };
            if c.pending.is_empty() {
                c.fill();
                if !c.pending.is_empty() {
                    continue; // a request of its own turned up: not this one
                }
            }
            let mut old = self.clients.remove(i);
            old.queue(&evicted_reply(eviction_message(&old.activity())));
            old.flush();
            return true;
        }
    }

    pub fn client_mut(&mut self, id: u64) -> Option<&mut Client> {
        self.clients.iter_mut().find(|c| c.id == id)
    }

    /// Drops clients that are done, idle too long, or refused long enough.
    pub fn sweep(&mut self) {
        let now = Instant::now();
        self.clients.retain_mut(|c| {
            if let Some(why) = expiry(&c.activity(), now) {
                if why == Expiry::Idle {
                    c.queue(&error_reply(&why.message()));
                    c.flush();
                }
                return false;
            }
            !(c.closing && c.out.is_empty() && !c.hold_open && c.pending.is_empty())
        });
    }

    /// Removes the socket file, if it is still ours.
    pub fn remove_file(&self) {
        if std::fs::symlink_metadata(&self.path).map(|m| m.ino()).ok() == Some(self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A supervisor that fails to start, or ends, leaves no socket file behind.
impl Drop for Server {
    fn drop(&mut self) {
        self.remove_file();
    }
}

impl Client {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
    fn activity(&self) -> Activity {
        Activity {
            last_request: self.last_request,
            held: self.hold_open,
            refused: self.refused,
            since: self.since,
            pending: !self.pending.is_empty(),
            partial_since: self.partial_since,
        }
    }
    pub fn wants_write(&self) -> bool {
        !self.out.is_empty()
    }
    pub fn queue(&mut self, v: &Value) {
        if self.out.len() > MAX_OUT {
            self.closing = true; // a peer that never reads
            return;
        }
        let mut s = v.to_string();
        s.push('\n');
        self.out.extend_from_slice(s.as_bytes());
    }
    pub fn flush(&mut self) {
        while !self.out.is_empty() {
            match self.stream.write(&self.out) {
                Ok(0) => {
                    self.out.clear();
                    self.closing = true;
                }
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.out.clear();
                    self.closing = true;
                    self.hold_open = false;
                }
            }
        }
    }
    /// Reads what is there without blocking: complete requests are kept
    /// for `read`, an incomplete line is remembered.
    fn fill(&mut self) {
        let mut buf = [0u8; 16384];
        if self.refused {
            // a refused peer's input is dropped unread, and then it goes
            loop {
                match self.stream.read(&mut buf) {
                    Ok(n) if n > 0 => self.closing = true, // dropped unread
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    _ => {
                        self.closing = true; // EOF or error
                        break;
                    }
                }
            }
            self.hold_open = false;
            return;
        }
        let before = self.pending.len();
        while self.pending.len() <= 64 && !self.closing {
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    self.closing = true;
                    self.hold_open = false;
                }
                Ok(n) => self.reader.push(&buf[..n], &mut self.pending),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.closing = true;
                    self.hold_open = false;
                }
            }
        }
        let now = Instant::now();
        let completed = self.pending.len() > before;
        if completed {
            self.last_request = now;
        }
        // an incomplete line keeps the time it began; one after a complete
        // line begins now
        self.partial_since = match (self.reader.partial(), completed) {
            (false, _) => None,
            (true, true) => Some(now),
            (true, false) => Some(self.partial_since.unwrap_or(now)),
        };
    }

    /// Reads what is there; returns the complete requests (those read
    /// earlier, by `Server::accept`, first).  At most 65 or so at a time:
    /// the rest wait for the next round.
    pub fn read(&mut self) -> Vec<Result<Request, RequestError>> {
        self.fill();
        std::mem::take(&mut self.pending)
    }
}

// ---- the client side: rekindle status / ps / restart / stop -----------------

/// Why NAME.sock could not be connected to.
#[derive(Debug, Error)]
pub enum ConnectError {
    /// No socket file there.
    #[error("{0}: no such socket")]
    Absent(PathBuf),
    /// The file or its directory belongs to someone else.
    #[error("{0}: permission denied")]
    Denied(PathBuf),
    /// A socket file nobody listens on: its supervisor is gone.
    #[error("{0}: stale socket (connection refused)")]
    Stale(PathBuf),
    /// A live supervisor whose backlog stayed full.
    #[error("{0}: the supervisor does not accept connections (backlog full)")]
    Busy(PathBuf),
    #[error("{0}: {1}")]
    Other(PathBuf, io::Error),
}

impl ConnectError {
    fn from_io(path: &Path, e: io::Error) -> Self {
        let p = path.to_path_buf();
        match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => ConnectError::Absent(p),
            Some(libc::EACCES) | Some(libc::EPERM) => ConnectError::Denied(p),
            Some(libc::ECONNREFUSED) => ConnectError::Stale(p),
            Some(libc::EAGAIN) => ConnectError::Busy(p),
            _ => ConnectError::Other(p, e),
        }
    }
}

/// One non-blocking connect to a Unix stream socket; the stream is left
/// non-blocking.
fn connect_once(path: &Path) -> Result<UnixStream, ConnectError> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    let addr = UnixAddr::new(path)
        .map_err(|e| ConnectError::Other(path.to_path_buf(), io::Error::from(e)))?;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| ConnectError::Other(path.to_path_buf(), io::Error::from(e)))?;
    loop {
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => return Ok(UnixStream::from(fd)),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(ConnectError::from_io(path, io::Error::from(e))),
        }
    }
}

/// Whether a supervisor listens at `path` (a full backlog counts as one).
pub fn listening(path: &Path) -> bool {
    matches!(connect_once(path), Ok(_) | Err(ConnectError::Busy(_)))
}

/// Connects to NAME.sock without ever blocking for long: a full backlog is
/// retried until `timeout`.  The stream is returned blocking.
pub fn connect(path: &Path, timeout: std::time::Duration) -> Result<UnixStream, ConnectError> {
    let t0 = std::time::Instant::now();
    loop {
        match connect_once(path) {
            Ok(s) => {
                s.set_nonblocking(false)
                    .map_err(|e| ConnectError::Other(path.to_path_buf(), e))?;
                return Ok(s);
            }
            Err(ConnectError::Busy(_)) if t0.elapsed() < timeout => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sends one request to NAME.sock and reads one reply line.  A connect
/// failure is a `ConnectError` inside the anyhow error.  Under a flood of
/// connections the supervisor may evict this one before it reads the
/// request (the write fails, or the reply says `evicted`): nothing was
/// carried out, so the request is sent again on a new connection, until
/// `timeout`.
pub fn call(path: &Path, req: &Value, timeout: std::time::Duration) -> Result<(Value, UnixStream)> {
    let t0 = std::time::Instant::now();
    loop {
        let evicted = match call_once(path, req, timeout)? {
            Called::Reply(v, _) if v.get("code").and_then(Value::as_str) == Some("evicted") => {
                format!("{}", v["error"])
            }
            Called::Reply(v, s) => return Ok((v, s)),
            Called::Dropped(e) => {
                format!("the connection was closed before the request was read ({e})")
            }
        };
        if t0.elapsed() >= timeout {
            bail!("the supervisor's control socket is flooded: {evicted}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

enum Called {
    Reply(Value, UnixStream),
    /// The request could not be written: the supervisor had closed the
    /// connection (evicted before it read anything).
    Dropped(io::Error),
}

fn call_once(path: &Path, req: &Value, timeout: std::time::Duration) -> Result<Called> {
    let mut s = connect(path, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut line = req.to_string();
    line.push('\n');
    if let Err(e) = s.write_all(line.as_bytes()) {
        return match e.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => Ok(Called::Dropped(e)),
            _ => Err(e.into()),
        };
    }
    let mut reply = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        let n = s.read(&mut b).context("reading the reply")?;
        if n == 0 {
            bail!("the supervisor closed the connection without a reply");
        }
        reply.extend_from_slice(&b[..n]);
        if let Some(pos) = reply.iter().position(|&c| c == b'\n') {
            reply.truncate(pos);
            break;
        }
        if reply.len() > 16 * MAX_LINE {
            bail!("reply too long");
        }
    }
    let v: Value = serde_json::from_slice(&reply).context("the reply is not JSON")?;
    Ok(Called::Reply(v, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_requests() {
        assert_eq!(parse_request(br#"{"cmd":"status"}"#), Ok(Request::Status));
        assert_eq!(parse_request(br#"{"cmd":"stop"}"#), Ok(Request::Stop));
        assert_eq!(parse_request(br#"{"cmd":"inspect"}"#), Ok(Request::Inspect));
        assert_eq!(
            parse_request(br#"{"cmd":"restart"}"#),
            Ok(Request::Restart(Mode::Warm))
        );
        assert_eq!(
            parse_request(br#"{"cmd":"restart","mode":"cold"}"#),
            Ok(Request::Restart(Mode::Cold))
        );
        assert_eq!(
            parse_request(br#" {"cmd":"restart","mode":"warm","x":1} "#),
            Ok(Request::Restart(Mode::Warm))
        );
    }

    #[test]
    fn invalid_requests() {
        assert!(matches!(
            parse_request(b"not json"),
            Err(RequestError::Json(_))
        ));
        assert!(matches!(
            parse_request(b"\x00\xff\xfe garbage"),
            Err(RequestError::Json(_))
        ));
        assert_eq!(parse_request(b"[1,2,3]"), Err(RequestError::NotObject));
        assert_eq!(parse_request(b"{}"), Err(RequestError::NoCmd));
        assert_eq!(parse_request(br#"{"cmd":5}"#), Err(RequestError::NoCmd));
        assert_eq!(
            parse_request(br#"{"cmd":"format-disk"}"#),
            Err(RequestError::UnknownCmd("format-disk".into()))
        );
        assert_eq!(
            parse_request(br#"{"cmd":"restart","mode":"lukewarm"}"#),
            Err(RequestError::BadMode)
        );
        assert_eq!(
            parse_request(br#"{"cmd":"restart","mode":1}"#),
            Err(RequestError::BadMode)
        );
        assert_eq!(
            parse_request(&vec![b' '; MAX_LINE + 1]),
            Err(RequestError::TooLong)
        );
        assert_eq!(parse_request(b""), Err(RequestError::Empty));
        assert_eq!(parse_request(b" \t\r"), Err(RequestError::Empty));
    }

    fn act(t0: Instant, last_ms: u64, held: bool, refused: bool) -> Activity {
        Activity {
            last_request: t0 + Duration::from_millis(last_ms),
            held,
            refused,
            since: t0,
            pending: false,
            partial_since: None,
        }
    }

    #[test]
    fn idle_connections_expire_but_a_waiting_stop_does_not() {
        let t0 = Instant::now();
        let later = |ms| t0 + Duration::from_millis(ms);
        let idle = act(t0, 0, false, false);
        assert_eq!(expiry(&idle, later(4_000)), None);
        assert_eq!(expiry(&idle, later(5_001)), Some(Expiry::Idle));
        // a request at 3 s starts the clock again
        assert_eq!(expiry(&act(t0, 3_000, false, false), later(7_000)), None);
        // a stop that waits for the supervisor's exit is never idle
        assert_eq!(expiry(&act(t0, 0, true, false), later(3_600_000)), None);
        assert_eq!(
            expiry(&act(t0, 0, false, true), later(5_001)),
            Some(Expiry::Refused)
        );
    }

    #[test]
    fn a_full_table_evicts_the_connection_idle_the_longest() {
        let t0 = Instant::now();
        let mut table: Vec<Activity> = (0..4)
            .map(|i| act(t0, 100 * (4 - i), false, false))
            .collect();
        assert_eq!(admit(&table, 5), Admission::Room);
        // full: index 3 sent its last request the longest ago
        assert_eq!(admit(&table, 4), Admission::Evict(3));
        assert_eq!(
            eviction_message(&table[3]),
            "closed: too many control connections, and this one was idle the longest"
        );
        // a held stop is never evicted; refused peers do not count
        table[3].held = true;
        assert_eq!(admit(&table, 4), Admission::Evict(2));
        table.push(act(t0, 0, false, true));
        assert_eq!(admit(&table, 4), Admission::Evict(2));
        for a in &mut table {
            a.held = !a.refused;
        }
        assert_eq!(admit(&table, 4), Admission::Full);
    }

    #[test]
    fn a_connection_stuck_mid_line_goes_before_an_idle_one() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // 0: idle since 0 (the oldest); 1, 2: half a line since 300, 200 ms
        let mut table: Vec<Activity> = (0..3).map(|_| act(t0, 0, false, false)).collect();
        table[1].partial_since = Some(at(300));
        table[2].partial_since = Some(at(200));
        assert_eq!(admit(&table, 3), Admission::Evict(2));
        assert!(eviction_message(&table[2]).contains("incomplete line"));
        table[2].partial_since = None;
        assert_eq!(admit(&table, 3), Admission::Evict(1));
        // a newcomer that has said nothing yet (accepted last) goes last
        table[1].partial_since = None;
        table[1].last_request = at(5);
        table[2].last_request = at(9);
        assert_eq!(admit(&table, 3), Admission::Evict(0));
    }

    #[test]
    fn a_request_waiting_for_its_answer_is_evicted_only_when_all_wait() {
        let t0 = Instant::now();
        let mut table: Vec<Activity> = (0..3).map(|i| act(t0, i, false, false)).collect();
        table[0].pending = true; // idle the longest, but its request is there
        table[1].partial_since = Some(t0);
        table[1].pending = true; // a line completed behind a partial one
        assert_eq!(admit(&table, 3), Admission::Evict(2));
        // a flood of complete requests: the oldest connection goes
        table[2].pending = true;
        table[0].since = t0 + Duration::from_millis(50);
        table[2].since = t0 + Duration::from_millis(20);
        table[1].since = t0 + Duration::from_millis(10);
        assert_eq!(admit(&table, 3), Admission::Evict(1));
        assert!(eviction_message(&table[1]).contains("not carried out"));
        // a held one never, whatever it has
        table[1].held = true;
        assert_eq!(admit(&table, 3), Admission::Evict(2));
    }

    #[test]
    fn line_reader_tells_a_line_begun() {
        let mut r = LineReader::default();
        let mut out = Vec::new();
        assert!(!r.partial());
        r.push(b"{\"cmd\":", &mut out);
        assert!(r.partial() && out.is_empty());
        r.push(b"\"status\"}\n", &mut out);
        assert!(!r.partial() && out.len() == 1);
        r.push(&vec![b'x'; MAX_LINE + 1], &mut out);
        assert!(r.partial(), "skipping an overlong line is still mid-line");
        r.push(b"\n", &mut out);
        assert!(!r.partial());
    }

    #[test]
    fn a_call_evicted_before_its_request_was_read_is_sent_again() {
        let dir = std::env::temp_dir().join(format!("rk-ctl-test-{}-evicted", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test dir");
        let path = dir.join("t.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        // the first connection is told it was evicted, the second answered
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for reply in [
                evicted_reply("closed: too many control connections"),
                json!({"ok": true, "name": "x"}),
            ] {
                let (mut s, _) = listener.accept().expect("accept");
                let mut line = Vec::new();
                let mut b = [0u8; 1];
                while s.read(&mut b).expect("read") == 1 && b[0] != b'\n' {
                    line.push(b[0]);
                }
                seen.push(String::from_utf8(line).expect("utf8"));
                s.write_all(format!("{reply}\n").as_bytes()).expect("reply");
            }
            seen
        });
        let (v, _) = call(&path, &json!({"cmd": "status"}), Duration::from_secs(5)).expect("call");
        assert_eq!(v, json!({"ok": true, "name": "x"}));
        let seen = server.join().expect("server");
        assert_eq!(seen, vec![r#"{"cmd":"status"}"#; 2]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A Server on a fresh socket in its own directory (not through
    /// `Server::bind`, whose umask would reach the tests running beside).
    fn test_server(tag: &str) -> (Server, PathBuf) {
        let dir = std::env::temp_dir().join(format!("rk-ctl-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test dir");
        let path = dir.join("t.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let srv = Server {
            listener,
            path,
            ino: 0,
            clients: Vec::new(),
            next_id: 1,
        };
        (srv, dir)
    }

    fn connect_raw(path: &Path, line: &[u8]) -> UnixStream {
        let mut s = UnixStream::connect(path).expect("connect");
        s.write_all(line).expect("write");
        s
    }

    /// Accepts in rounds, as the supervisor's poll loop does, until the
    /// backlog is empty; returns the ids found with requests to serve.
    fn accept_all(srv: &mut Server) -> Vec<u64> {
        let mut ids = Vec::new();
        for _ in 0..1000 {
            let next = srv.next_id;
            ids.extend(srv.accept());
            if srv.next_id == next {
                break; // nothing left to accept
            }
        }
        ids
    }

    fn reply_of(s: &mut UnixStream) -> String {
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut b = [0u8; 4096];
        let n = s.read(&mut b).unwrap_or(0);
        String::from_utf8_lossy(&b[..n]).into_owned()
    }

    #[test]
    fn a_request_sent_on_connect_survives_a_flood_of_silent_connections() {
        let (mut srv, dir) = test_server("silent");
        let path = srv.path().to_path_buf();
        let mut hold = Vec::new();
        for _ in 0..MAX_CLIENTS {
            hold.push(connect_raw(&path, b""));
        }
        assert!(accept_all(&mut srv).is_empty());
        assert_eq!(srv.clients.len(), MAX_CLIENTS);
        // the request and 200 newcomers behind it wait in the backlog
        let mut asker = connect_raw(&path, b"{\"cmd\":\"status\"}\n");
        for _ in 0..200 {
            hold.push(connect_raw(&path, b""));
        }
        let first = srv.accept();
        assert_eq!(
            first.len(),
            1,
            "its request was read in the round it came in"
        );
        let id = first[0];
        accept_all(&mut srv);
        let c = srv
            .client_mut(id)
            .expect("not evicted while its request waits");
        assert_eq!(c.read(), vec![Ok(Request::Status)]);
        c.queue(&json!({"ok": true}));
        c.flush();
        assert_eq!(reply_of(&mut asker), "{\"ok\":true}\n");
        // the first silent ones were told why they went
        assert!(reply_of(&mut hold[0]).contains("idle the longest"));
        drop(srv);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_silent_newcomer_outlives_a_round_and_is_read_before_eviction() {
        let (mut srv, dir) = test_server("late");
        let path = srv.path().to_path_buf();
        let mut hold = Vec::new();
        for _ in 0..MAX_CLIENTS {
            hold.push(connect_raw(&path, b""));
        }
        accept_all(&mut srv);
        // accepted before it writes, with a full batch behind it
        let mut late = connect_raw(&path, b"");
        for _ in 0..3 * MAX_CLIENTS {
            hold.push(connect_raw(&path, b""));
        }
        let late_id = srv.next_id;
        assert!(srv.accept().is_empty());
        assert_eq!(
            srv.next_id,
            late_id + ACCEPT_BATCH as u64,
            "a batch at a time"
        );
        late.write_all(b"{\"cmd\":\"stop\"}\n").expect("write");
        // the very next round reads it: served, not evicted
        let found = srv.accept();
        assert_eq!(found, vec![late_id]);
        accept_all(&mut srv);
        assert!(srv.client_mut(late_id).is_some());
        drop(srv);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn half_lines_are_evicted_before_a_silent_newcomer() {
        let (mut srv, dir) = test_server("partial");
        let path = srv.path().to_path_buf();
        let mut hold = Vec::new();
        for _ in 0..MAX_CLIENTS - 1 {
            hold.push(connect_raw(&path, b"{\"cmd\":"));
        }
        accept_all(&mut srv);
        let quiet_id = srv.next_id;
        let _quiet = connect_raw(&path, b"");
        accept_all(&mut srv);
        for _ in 0..500 {
            hold.push(connect_raw(&path, b"{\"cmd\":"));
        }
        accept_all(&mut srv);
        assert_eq!(srv.clients.len(), MAX_CLIENTS);
        assert!(srv.client_mut(quiet_id).is_some(), "a half line goes first");
        assert!(reply_of(&mut hold[0]).contains("incomplete line"));
        drop(srv);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        assert_eq!(
            parse_request(br#"{"cmd":"status","cmd":"stop"}"#),
            Err(RequestError::DuplicateKey("cmd".into()))
        );
        assert_eq!(
            parse_request(br#"{"cmd":"restart","mode":"warm","mode":"cold"}"#),
            Err(RequestError::DuplicateKey("mode".into()))
        );
        assert_eq!(
            parse_request(br#"{"cmd":"status","x":[{"a":1,"a":2}]}"#),
            Err(RequestError::DuplicateKey("a".into()))
        );
        // the same key in different objects is fine
        assert_eq!(
            parse_request(br#"{"cmd":"status","x":{"cmd":1},"y":[{"cmd":2}]}"#),
            Ok(Request::Status)
        );
        assert!(matches!(
            parse_request(br#"{"cmd":"status"} trailing"#),
            Err(RequestError::Json(_))
        ));
    }

    #[test]
    fn line_reader_splits_and_skips_overlong_lines() {
        let mut r = LineReader::default();
        let mut out = Vec::new();
        r.push(b"{\"cmd\":\"sta", &mut out);
        assert!(out.is_empty());
        r.push(b"tus\"}\n\n{\"cmd\":\"stop\"}\n", &mut out);
        assert_eq!(
            out,
            vec![
                Ok(Request::Status),
                Err(RequestError::Empty), // an empty line is answered too
                Ok(Request::Stop)
            ]
        );

        out.clear();
        let big = vec![b'x'; 70000];
        r.push(&big[..40000], &mut out);
        r.push(&big[40000..], &mut out);
        r.push(b"yyy\n{\"cmd\":\"status\"}\n", &mut out);
        assert_eq!(out, vec![Err(RequestError::TooLong), Ok(Request::Status)]);

        // an overlong line in one piece, newline included
        out.clear();
        let mut big = vec![b'x'; 70000];
        big.push(b'\n');
        r.push(&big, &mut out);
        r.push(b"{\"cmd\":\"stop\"}\n", &mut out);
        assert_eq!(out, vec![Err(RequestError::TooLong), Ok(Request::Stop)]);
    }
}
