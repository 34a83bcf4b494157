//! The binary messages on the supervisor ⇄ runtime socket pair
//! (docs/supervisor-protocol.md, "Messages on the socket pair").
//!
//! Pure functions only: `parse_app` checks everything a message from the
//! app can get wrong (size, magic, version, type, declared length, the exact
//! payload size of the type, NUL-terminated strings, enumerated values, the
//! number of fds that came with it) and never panics, whatever the bytes.
//! The encoders are used for the supervisor's own messages and, in tests,
//! for round trips.
//!
//! Over 600 lines: every message of the protocol, parser and encoder side
//! by side, in the order of docs/supervisor-protocol.md, plus their tests.

use thiserror::Error;

use crate::reason::Reason;

pub const MAGIC: u32 = 0x4d53_4b52; // "RKSM"
/// 2: decision codes (`enum rk_reason`) in HELLO, RESTARTING and INHERIT.
pub const VERSION: u16 = 2;
pub const HDR_LEN: usize = 16;
/// Largest message, header included.
pub const MSG_MAX: usize = 4096;
/// Most fds one FDS message may carry (manifest + 16 arenas + 16 ranges).
pub const MAX_FDS: usize = 33;
pub const REASON_LEN: usize = 128;
pub const DECISION_LEN: usize = 160;
pub const NAME_LEN: usize = 48;
pub const ERROR_LEN: usize = 256;

pub const T_ATTACH: u16 = 1;
pub const T_HELLO: u16 = 2;
pub const T_FDS: u16 = 3;
pub const T_RESTARTING: u16 = 4;
pub const T_READY: u16 = 5;
pub const T_RESTART_FAILED: u16 = 6;
pub const T_LAZY: u16 = 7;
pub const T_INHERIT: u16 = 101;
pub const T_LAZY_REPLY: u16 = 102;
pub const T_ERROR: u16 = 199;

pub const ATTACH_LEN: usize = 8;
pub const HELLO_LEN: usize = 328;
pub const FDS_HDR_LEN: usize = 8;
pub const FDS_ENTRY_LEN: usize = 56;
pub const RESTARTING_LEN: usize = 320;
pub const READY_LEN: usize = 8;
pub const RESTART_FAILED_LEN: usize = 8;
pub const INHERIT_LEN: usize = 320;
pub const LAZY_HDR_LEN: usize = 8;
pub const LAZY_ENTRY_LEN: usize = 64;
/// Most arenas one LAZY message may name (RK_MAX_ARENAS).
pub const LAZY_MAX_REGIONS: usize = 16;
pub const LAZY_REPLY_LEN: usize = 8;

/// How an incarnation started (HELLO `kind`, INHERIT `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartKind {
    Fresh,
    Warm,
    Cold,
}

impl StartKind {
    pub fn code(self) -> u32 {
        match self {
            StartKind::Fresh => 0,
            StartKind::Warm => 1,
            StartKind::Cold => 2,
        }
    }
    pub fn from_code(c: u32) -> Option<Self> {
        match c {
            0 => Some(StartKind::Fresh),
            1 => Some(StartKind::Warm),
            2 => Some(StartKind::Cold),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            StartKind::Fresh => "fresh",
            StartKind::Warm => "warm",
            StartKind::Cold => "cold",
        }
    }
}

/// What a held fd is (FDS entry `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdKind {
    Manifest,
    Arena,
    Range,
}

impl FdKind {
    pub fn code(self) -> u32 {
        match self {
            FdKind::Manifest => 0,
            FdKind::Arena => 1,
            FdKind::Range => 2,
        }
    }
    pub fn from_code(c: u32) -> Option<Self> {
        match c {
            0 => Some(FdKind::Manifest),
            1 => Some(FdKind::Arena),
            2 => Some(FdKind::Range),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            FdKind::Manifest => "manifest",
            FdKind::Arena => "arena",
            FdKind::Range => "range",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub pid: u32,
    pub generation: u32,
    pub kind: StartKind,
    pub narenas: u32,
    pub restart_ns: u64,
    pub preserved_bytes: u64,
    pub reason: String,
    pub decision: String,
    pub decision_code: Reason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdEntry {
    pub kind: FdKind,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restarting {
    pub warm: bool,
    pub signal: i32,
    pub generation: u32,
    pub t_ns: u64,
    pub fault_addr: u64,
    pub reason: String,
    pub decision: String,
    pub decision_code: Reason,
}

/// A message from the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppMsg {
    Attach {
        pid: u32,
        /// ATTACH_CAP_* (0 from a runtime older than lazy restores).
        caps: u32,
    },
    Hello(Hello),
    Fds(Vec<FdEntry>),
    Restarting(Restarting),
    Ready {
        t_ns: u64,
    },
    /// The in-place exec announced by RESTARTING failed; the app carries on.
    RestartFailed {
        errno: i32,
        generation: u32,
    },
    /// A lazy restore's arenas, mapped and registered with the userfaultfd
    /// that comes with the message; `errno` != 0: no fd came (the app could
    /// not get one), every page must be read in before the reply.
    Lazy {
        errno: i32,
        regions: Vec<LazyRegion>,
    },
}

/// One arena of LAZY: where the app mapped it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LazyRegion {
    pub name: String,
    pub addr: u64,
    pub len: u64,
}

impl AppMsg {
    pub fn type_code(&self) -> u16 {
        match self {
            AppMsg::Attach { .. } => T_ATTACH,
            AppMsg::Hello(_) => T_HELLO,
            AppMsg::Fds(_) => T_FDS,
            AppMsg::Restarting(_) => T_RESTARTING,
            AppMsg::Ready { .. } => T_READY,
            AppMsg::RestartFailed { .. } => T_RESTART_FAILED,
            AppMsg::Lazy { .. } => T_LAZY,
        }
    }
    /// How many fds must travel with this message.
    pub fn nfds(&self) -> usize {
        match self {
            AppMsg::Fds(e) => e.len(),
            AppMsg::Lazy { errno: 0, .. } => 1,
            _ => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inherit {
    pub mode: StartKind,
    pub generation: u32,
    pub signal: i32,
    pub t_detect_ns: u64,
    pub reason: String,
    pub decision: String,
    pub decision_code: Reason,
    /// With Warm: arenas of the manifest deliberately not handed over
    /// (half-changed independent ones).
    pub dropped: u32,
    /// INHERIT_* bits.
    pub flags: u32,
}

/// INHERIT `flags`: the fds are new memfds filled from a durable snapshot
/// (`rekindle restore`); `reason` is the snapshot's id.
pub const INHERIT_RESTORED: u32 = 0x1;
/// With INHERIT_RESTORED: the arenas' memfds are empty, their pages come
/// in on demand; the app answers with LAZY before it touches them.
pub const INHERIT_LAZY: u32 = 0x2;
/// ATTACH `caps`: the runtime answers INHERIT_LAZY with LAZY.
pub const ATTACH_CAP_LAZY: u32 = 0x1;

/// LAZY_REPLY `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LazyStatus {
    /// The supervisor serves the faults and fills in the rest.
    Serving,
    /// Every page is in already (the app sent no fd).
    Filled,
}

impl LazyStatus {
    pub fn code(self) -> u32 {
        match self {
            LazyStatus::Serving => 0,
            LazyStatus::Filled => 1,
        }
    }
}

/// A message from the supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SupMsg {
    Inherit(Inherit),
    LazyReply(LazyStatus),
    Error(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtoError {
    #[error("message of {0} bytes is shorter than the 16-byte header")]
    Short(usize),
    #[error("message longer than {MSG_MAX} bytes")]
    TooLong,
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    #[error("unsupported version {0}")]
    BadVersion(u16),
    #[error("reserved header field is {0}, not 0")]
    Reserved(u32),
    #[error("header says {declared} payload bytes, {actual} arrived")]
    HeaderLength { declared: u32, actual: usize },
    #[error("unknown message type {0}")]
    BadType(u16),
    #[error("message type {0} is not one the runtime sends")]
    WrongDirection(u16),
    #[error("{name} payload is {got} bytes, expected {want}")]
    BadLength {
        name: &'static str,
        want: usize,
        got: usize,
    },
    #[error("string field {0} has no NUL")]
    NoNul(&'static str),
    #[error("field {0} has invalid value {1}")]
    BadValue(&'static str, u64),
    #[error("FDS declares {declared} fds, {got} arrived")]
    FdCount { declared: u32, got: usize },
    #[error("{0} fds arrived with a message that carries none")]
    UnexpectedFds(usize),
}

// ---- little-endian readers over a slice whose length was checked ----------

struct Rd<'a> {
    b: &'a [u8],
    off: usize,
}

impl<'a> Rd<'a> {
    fn new(b: &'a [u8]) -> Self {
        Rd { b, off: 0 }
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        // Callers check lengths first; clamp anyway so a bug cannot panic.
        let end = (self.off + n).min(self.b.len());
        let s = &self.b[self.off.min(end)..end];
        self.off = end;
        s
    }
    fn u16(&mut self) -> u16 {
        let s = self.take(2);
        let mut a = [0u8; 2];
        a[..s.len()].copy_from_slice(s);
        u16::from_le_bytes(a)
    }
    fn u32(&mut self) -> u32 {
        let s = self.take(4);
        let mut a = [0u8; 4];
        a[..s.len()].copy_from_slice(s);
        u32::from_le_bytes(a)
    }
    fn i32(&mut self) -> i32 {
        self.u32() as i32
    }
    fn u64(&mut self) -> u64 {
        let s = self.take(8);
        let mut a = [0u8; 8];
        a[..s.len()].copy_from_slice(s);
        u64::from_le_bytes(a)
    }
    fn cstr(&mut self, cap: usize, field: &'static str) -> Result<String, ProtoError> {
        let s = self.take(cap);
        cstr_from(s, field)
    }
}

/// A fixed-size `char` array: must hold a NUL; the text is what precedes it.
pub fn cstr_from(s: &[u8], field: &'static str) -> Result<String, ProtoError> {
    match s.iter().position(|&c| c == 0) {
        Some(n) => Ok(String::from_utf8_lossy(&s[..n]).into_owned()),
        None => Err(ProtoError::NoNul(field)),
    }
}

/// Writes `s` into a fixed array of `cap` bytes: cut at `cap - 1` bytes (on a
/// character boundary) and at any NUL, zero-padded.
pub fn put_cstr(out: &mut Vec<u8>, s: &str, cap: usize) {
    let mut n = s.len().min(cap.saturating_sub(1));
    while n > 0 && !s.is_char_boundary(n) {
        n -= 1;
    }
    let bytes = &s.as_bytes()[..n];
    let bytes = match bytes.iter().position(|&c| c == 0) {
        Some(z) => &bytes[..z],
        None => bytes,
    };
    out.extend_from_slice(bytes);
    out.resize(out.len() + (cap - bytes.len()), 0);
}

/// The header of a message: checks magic, version, reserved and the declared
/// length against what arrived.  Returns (type, payload).
pub fn parse_header(buf: &[u8]) -> Result<(u16, &[u8]), ProtoError> {
    if buf.len() < HDR_LEN {
        return Err(ProtoError::Short(buf.len()));
    }
    if buf.len() > MSG_MAX {
        return Err(ProtoError::TooLong);
    }
    let mut r = Rd::new(buf);
    let magic = r.u32();
    let version = r.u16();
    let ty = r.u16();
    let len = r.u32();
    let reserved = r.u32();
    if magic != MAGIC {
        return Err(ProtoError::BadMagic(magic));
    }
    if version != VERSION {
        return Err(ProtoError::BadVersion(version));
    }
    if reserved != 0 {
        return Err(ProtoError::Reserved(reserved));
    }
    let payload = &buf[HDR_LEN..];
    if len as usize != payload.len() {
        return Err(ProtoError::HeaderLength {
            declared: len,
            actual: payload.len(),
        });
    }
    Ok((ty, payload))
}

fn want_len(name: &'static str, p: &[u8], want: usize) -> Result<(), ProtoError> {
    if p.len() != want {
        return Err(ProtoError::BadLength {
            name,
            want,
            got: p.len(),
        });
    }
    Ok(())
}

/// Parses one message from the runtime; `nfds` is how many fds came with it
/// (SCM_RIGHTS).  The caller closes them whatever the result, unless the
/// message is a valid `FDS`.
pub fn parse_app(buf: &[u8], nfds: usize) -> Result<AppMsg, ProtoError> {
    let (ty, p) = parse_header(buf)?;
    if ty != T_FDS && ty != T_LAZY && nfds != 0 {
        // checked after the type so an unknown type is reported as such
        match ty {
            T_ATTACH | T_HELLO | T_RESTARTING | T_READY | T_RESTART_FAILED => {
                return Err(ProtoError::UnexpectedFds(nfds));
            }
            T_INHERIT | T_LAZY_REPLY | T_ERROR => return Err(ProtoError::WrongDirection(ty)),
            _ => return Err(ProtoError::BadType(ty)),
        }
    }
    let mut r = Rd::new(p);
    match ty {
        T_ATTACH => {
            want_len("ATTACH", p, ATTACH_LEN)?;
            let pid = r.u32();
            let caps = r.u32();
            Ok(AppMsg::Attach { pid, caps })
        }
        T_HELLO => {
            want_len("HELLO", p, HELLO_LEN)?;
            let pid = r.u32();
            let generation = r.u32();
            let kind_code = r.u32();
            let kind = StartKind::from_code(kind_code)
                .ok_or(ProtoError::BadValue("kind", kind_code as u64))?;
            let narenas = r.u32();
            let restart_ns = r.u64();
            let preserved_bytes = r.u64();
            let reason = r.cstr(REASON_LEN, "reason")?;
            let decision = r.cstr(DECISION_LEN, "decision")?;
            let decision_code = Reason::from_code(r.u32());
            Ok(AppMsg::Hello(Hello {
                pid,
                generation,
                kind,
                narenas,
                restart_ns,
                preserved_bytes,
                reason,
                decision,
                decision_code,
            }))
        }
        T_FDS => {
            if p.len() < FDS_HDR_LEN {
                return Err(ProtoError::BadLength {
                    name: "FDS",
                    want: FDS_HDR_LEN + FDS_ENTRY_LEN,
                    got: p.len(),
                });
            }
            let count = r.u32();
            let _reserved = r.u32();
            if count == 0 || count as usize > MAX_FDS {
                return Err(ProtoError::BadValue("count", count as u64));
            }
            want_len("FDS", p, FDS_HDR_LEN + FDS_ENTRY_LEN * count as usize)?;
            if nfds != count as usize {
                return Err(ProtoError::FdCount {
                    declared: count,
                    got: nfds,
                });
            }
            let mut entries = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let k = r.u32();
                let _reserved = r.u32();
                let kind = FdKind::from_code(k).ok_or(ProtoError::BadValue("fd kind", k as u64))?;
                let name = r.cstr(NAME_LEN, "name")?;
                entries.push(FdEntry { kind, name });
            }
            Ok(AppMsg::Fds(entries))
        }
        T_LAZY => {
            if p.len() < LAZY_HDR_LEN {
                return Err(ProtoError::BadLength {
                    name: "LAZY",
                    want: LAZY_HDR_LEN,
                    got: p.len(),
                });
            }
            let count = r.u32();
            let errno = r.i32();
            if count as usize > LAZY_MAX_REGIONS {
                return Err(ProtoError::BadValue("count", count as u64));
            }
            want_len("LAZY", p, LAZY_HDR_LEN + LAZY_ENTRY_LEN * count as usize)?;
            let want_fds = if errno == 0 { 1 } else { 0 };
            if nfds != want_fds {
                return Err(ProtoError::FdCount {
                    declared: want_fds as u32,
                    got: nfds,
                });
            }
            let mut regions = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let name = r.cstr(NAME_LEN, "name")?;
                let addr = r.u64();
                let len = r.u64();
                if !addr.is_multiple_of(4096)
                    || !len.is_multiple_of(4096)
                    || addr.checked_add(len).is_none()
                {
                    return Err(ProtoError::BadValue("lazy region", addr));
                }
                regions.push(LazyRegion { name, addr, len });
            }
            Ok(AppMsg::Lazy { errno, regions })
        }
        T_RESTARTING => {
            want_len("RESTARTING", p, RESTARTING_LEN)?;
            let mode = r.u32();
            let warm = match mode {
                1 => true,
                2 => false,
                m => return Err(ProtoError::BadValue("mode", m as u64)),
            };
            let signal = r.i32();
            if !(0..=64).contains(&signal) {
                return Err(ProtoError::BadValue("signal", signal as u32 as u64));
            }
            let generation = r.u32();
            let decision_code = Reason::from_code(r.u32());
            let t_ns = r.u64();
            let fault_addr = r.u64();
            let reason = r.cstr(REASON_LEN, "reason")?;
            let decision = r.cstr(DECISION_LEN, "decision")?;
            Ok(AppMsg::Restarting(Restarting {
                warm,
                signal,
                generation,
                t_ns,
                fault_addr,
                reason,
                decision,
                decision_code,
            }))
        }
        T_READY => {
            want_len("READY", p, READY_LEN)?;
            Ok(AppMsg::Ready { t_ns: r.u64() })
        }
        T_RESTART_FAILED => {
            want_len("RESTART_FAILED", p, RESTART_FAILED_LEN)?;
            let errno = r.i32();
            if errno <= 0 {
                return Err(ProtoError::BadValue("errno", errno as u32 as u64));
            }
            Ok(AppMsg::RestartFailed {
                errno,
                generation: r.u32(),
            })
        }
        T_INHERIT | T_ERROR => Err(ProtoError::WrongDirection(ty)),
        other => Err(ProtoError::BadType(other)),
    }
}

fn header(out: &mut Vec<u8>, ty: u16, len: usize) {
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&ty.to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// Encodes a message the runtime would send (tests and fuzz seeds).
pub fn encode_app(m: &AppMsg) -> Vec<u8> {
    let mut p = Vec::with_capacity(512);
    match m {
        AppMsg::Attach { pid, caps } => {
            p.extend_from_slice(&pid.to_le_bytes());
            p.extend_from_slice(&caps.to_le_bytes());
        }
        AppMsg::Hello(h) => {
            for v in [h.pid, h.generation, h.kind.code(), h.narenas] {
                p.extend_from_slice(&v.to_le_bytes());
            }
            p.extend_from_slice(&h.restart_ns.to_le_bytes());
            p.extend_from_slice(&h.preserved_bytes.to_le_bytes());
            put_cstr(&mut p, &h.reason, REASON_LEN);
            put_cstr(&mut p, &h.decision, DECISION_LEN);
            p.extend_from_slice(&h.decision_code.code().to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
        }
        AppMsg::Fds(entries) => {
            p.extend_from_slice(&(entries.len() as u32).to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
            for e in entries {
                p.extend_from_slice(&e.kind.code().to_le_bytes());
                p.extend_from_slice(&0u32.to_le_bytes());
                put_cstr(&mut p, &e.name, NAME_LEN);
            }
        }
        AppMsg::Restarting(r) => {
            p.extend_from_slice(&(if r.warm { 1u32 } else { 2u32 }).to_le_bytes());
            p.extend_from_slice(&r.signal.to_le_bytes());
            p.extend_from_slice(&r.generation.to_le_bytes());
            p.extend_from_slice(&r.decision_code.code().to_le_bytes());
            p.extend_from_slice(&r.t_ns.to_le_bytes());
            p.extend_from_slice(&r.fault_addr.to_le_bytes());
            put_cstr(&mut p, &r.reason, REASON_LEN);
            put_cstr(&mut p, &r.decision, DECISION_LEN);
        }
        AppMsg::Ready { t_ns } => p.extend_from_slice(&t_ns.to_le_bytes()),
        AppMsg::RestartFailed { errno, generation } => {
            p.extend_from_slice(&errno.to_le_bytes());
            p.extend_from_slice(&generation.to_le_bytes());
        }
        AppMsg::Lazy { errno, regions } => {
            p.extend_from_slice(&(regions.len() as u32).to_le_bytes());
            p.extend_from_slice(&errno.to_le_bytes());
            for r in regions {
                put_cstr(&mut p, &r.name, NAME_LEN);
                p.extend_from_slice(&r.addr.to_le_bytes());
                p.extend_from_slice(&r.len.to_le_bytes());
            }
        }
    }
    let mut out = Vec::with_capacity(HDR_LEN + p.len());
    header(&mut out, m.type_code(), p.len());
    out.extend_from_slice(&p);
    out
}

/// Encodes a message from the supervisor.
pub fn encode_sup(m: &SupMsg) -> Vec<u8> {
    let mut p = Vec::with_capacity(INHERIT_LEN);
    let ty = match m {
        SupMsg::Inherit(i) => {
            p.extend_from_slice(&i.mode.code().to_le_bytes());
            p.extend_from_slice(&i.generation.to_le_bytes());
            p.extend_from_slice(&i.signal.to_le_bytes());
            p.extend_from_slice(&i.dropped.to_le_bytes());
            p.extend_from_slice(&i.t_detect_ns.to_le_bytes());
            put_cstr(&mut p, &i.reason, REASON_LEN);
            put_cstr(&mut p, &i.decision, DECISION_LEN);
            p.extend_from_slice(&i.decision_code.code().to_le_bytes());
            p.extend_from_slice(&i.flags.to_le_bytes());
            T_INHERIT
        }
        SupMsg::LazyReply(s) => {
            p.extend_from_slice(&s.code().to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
            T_LAZY_REPLY
        }
        SupMsg::Error(e) => {
            put_cstr(&mut p, e, ERROR_LEN);
            T_ERROR
        }
    };
    let mut out = Vec::with_capacity(HDR_LEN + p.len());
    header(&mut out, ty, p.len());
    out.extend_from_slice(&p);
    out
}

/// Parses a supervisor message (what the runtime does; used by tests).
pub fn parse_sup(buf: &[u8]) -> Result<SupMsg, ProtoError> {
    let (ty, p) = parse_header(buf)?;
    let mut r = Rd::new(p);
    match ty {
        T_INHERIT => {
            want_len("INHERIT", p, INHERIT_LEN)?;
            let m = r.u32();
            let mode = StartKind::from_code(m).ok_or(ProtoError::BadValue("mode", m as u64))?;
            let generation = r.u32();
            let signal = r.i32();
            let dropped = r.u32();
            let t_detect_ns = r.u64();
            let reason = r.cstr(REASON_LEN, "reason")?;
            let decision = r.cstr(DECISION_LEN, "decision")?;
            let decision_code = Reason::from_code(r.u32());
            let flags = r.u32();
            Ok(SupMsg::Inherit(Inherit {
                flags,
                mode,
                generation,
                signal,
                t_detect_ns,
                reason,
                decision,
                decision_code,
                dropped,
            }))
        }
        T_LAZY_REPLY => {
            want_len("LAZY_REPLY", p, LAZY_REPLY_LEN)?;
            match r.u32() {
                0 => Ok(SupMsg::LazyReply(LazyStatus::Serving)),
                1 => Ok(SupMsg::LazyReply(LazyStatus::Filled)),
                s => Err(ProtoError::BadValue("lazy status", s as u64)),
            }
        }
        T_ERROR => {
            want_len("ERROR", p, ERROR_LEN)?;
            Ok(SupMsg::Error(r.cstr(ERROR_LEN, "message")?))
        }
        other => Err(ProtoError::BadType(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lazy_round_trips_and_bad_ones_are_refused() {
        let m = AppMsg::Lazy {
            errno: 0,
            regions: vec![LazyRegion {
                name: "keyspace".into(),
                addr: 0x7f00_0000_0000,
                len: 1 << 30,
            }],
        };
        let b = encode_app(&m);
        assert_eq!(parse_app(&b, 1), Ok(m.clone()));
        assert!(matches!(parse_app(&b, 0), Err(ProtoError::FdCount { .. })));
        let none = AppMsg::Lazy {
            errno: libc::EPERM,
            regions: vec![],
        };
        assert_eq!(parse_app(&encode_app(&none), 0), Ok(none));
        let mut odd = b.clone();
        odd[HDR_LEN + LAZY_HDR_LEN + NAME_LEN] = 1; // an address not on a page
        assert!(parse_app(&odd, 1).is_err());
        for s in [LazyStatus::Serving, LazyStatus::Filled] {
            let r = SupMsg::LazyReply(s);
            assert_eq!(parse_sup(&encode_sup(&r)), Ok(r));
        }
    }

    fn hello() -> Hello {
        Hello {
            pid: 42,
            generation: 3,
            kind: StartKind::Warm,
            narenas: 1,
            restart_ns: 1_500_000,
            preserved_bytes: 8 << 20,
            reason: "signal SIGSEGV".into(),
            decision: "all checks passed".into(),
            decision_code: Reason::AllChecksPassed,
        }
    }

    #[test]
    fn sizes_match_the_contract() {
        assert_eq!(
            encode_app(&AppMsg::Attach { pid: 1, caps: 0 }).len(),
            HDR_LEN + 8
        );
        assert_eq!(encode_app(&AppMsg::Hello(hello())).len(), HDR_LEN + 328);
        assert_eq!(encode_app(&AppMsg::Ready { t_ns: 5 }).len(), HDR_LEN + 8);
        let r = Restarting {
            warm: true,
            signal: 11,
            generation: 0,
            t_ns: 1,
            fault_addr: 0,
            reason: "x".into(),
            decision: "y".into(),
            decision_code: Reason::CrashLoop,
        };
        assert_eq!(encode_app(&AppMsg::Restarting(r)).len(), HDR_LEN + 320);
        let fds = AppMsg::Fds(vec![
            FdEntry {
                kind: FdKind::Manifest,
                name: "manifest".into(),
            },
            FdEntry {
                kind: FdKind::Arena,
                name: "table".into(),
            },
        ]);
        assert_eq!(encode_app(&fds).len(), HDR_LEN + 8 + 2 * 56);
        let inh = SupMsg::Inherit(Inherit {
            mode: StartKind::Cold,
            generation: 1,
            signal: 9,
            t_detect_ns: 7,
            reason: "signal SIGKILL".into(),
            decision: "x".into(),
            decision_code: Reason::UnsafeRegionOpen,
            dropped: 0,
            flags: 0,
        });
        assert_eq!(encode_sup(&inh).len(), HDR_LEN + 320);
        assert_eq!(encode_sup(&SupMsg::Error("e".into())).len(), HDR_LEN + 256);
    }

    #[test]
    fn header_layout_is_little_endian() {
        let b = encode_app(&AppMsg::Attach {
            pid: 0x01020304,
            caps: 1,
        });
        assert_eq!(&b[0..4], b"RKSM");
        assert_eq!(&b[4..6], &[2, 0]);
        assert_eq!(&b[6..8], &[1, 0]);
        assert_eq!(&b[8..12], &[8, 0, 0, 0]);
        assert_eq!(&b[16..20], &[4, 3, 2, 1]);
    }

    #[test]
    fn round_trips() {
        let m = AppMsg::Hello(hello());
        assert_eq!(parse_app(&encode_app(&m), 0), Ok(m));
        let m = AppMsg::Ready { t_ns: 99 };
        assert_eq!(parse_app(&encode_app(&m), 0), Ok(m));
        let m = AppMsg::RestartFailed {
            errno: 13,
            generation: 4,
        };
        assert_eq!(parse_app(&encode_app(&m), 0), Ok(m));
        let bad = encode_app(&AppMsg::RestartFailed {
            errno: 0,
            generation: 4,
        });
        assert_eq!(parse_app(&bad, 0), Err(ProtoError::BadValue("errno", 0)));
        let e = SupMsg::Error("bad".into());
        assert_eq!(parse_sup(&encode_sup(&e)), Ok(e));
    }

    #[test]
    fn rejects_what_the_liar_sends() {
        // the five messages of tests/apps/liar.py
        assert_eq!(parse_app(&[0, 0, 0], 0), Err(ProtoError::Short(3)));
        let rksm: Vec<u8> = b"RKSM".repeat(100);
        assert!(matches!(
            parse_app(&rksm, 0),
            Err(ProtoError::BadVersion(_))
        ));
        let mut h = Vec::new();
        header(&mut h, T_HELLO, 999);
        assert!(matches!(
            parse_app(&h, 0),
            Err(ProtoError::HeaderLength { .. })
        ));
        let mut u = Vec::new();
        header(&mut u, 77, 0);
        assert_eq!(parse_app(&u, 0), Err(ProtoError::BadType(77)));
        let mut w = Vec::new();
        w.extend_from_slice(&0x12345678u32.to_le_bytes());
        w.extend_from_slice(&1u16.to_le_bytes());
        w.extend_from_slice(&1u16.to_le_bytes());
        w.extend_from_slice(&8u32.to_le_bytes());
        w.extend_from_slice(&0u32.to_le_bytes());
        w.extend_from_slice(&[0; 8]);
        assert_eq!(parse_app(&w, 0), Err(ProtoError::BadMagic(0x12345678)));
    }

    #[test]
    fn strings_need_a_nul() {
        let mut b = encode_app(&AppMsg::Hello(hello()));
        let reason = HDR_LEN + 32;
        for c in &mut b[reason..reason + REASON_LEN] {
            *c = b'a';
        }
        assert_eq!(parse_app(&b, 0), Err(ProtoError::NoNul("reason")));
    }

    #[test]
    fn fds_count_must_match() {
        let m = AppMsg::Fds(vec![FdEntry {
            kind: FdKind::Manifest,
            name: "manifest".into(),
        }]);
        let b = encode_app(&m);
        assert_eq!(parse_app(&b, 1), Ok(m));
        assert!(matches!(parse_app(&b, 0), Err(ProtoError::FdCount { .. })));
        assert!(matches!(parse_app(&b, 2), Err(ProtoError::FdCount { .. })));
        // fds with a message that carries none
        let a = encode_app(&AppMsg::Attach { pid: 1, caps: 0 });
        assert_eq!(parse_app(&a, 1), Err(ProtoError::UnexpectedFds(1)));
        // zero entries
        let mut z = Vec::new();
        header(&mut z, T_FDS, 8);
        z.extend_from_slice(&[0; 8]);
        assert!(matches!(
            parse_app(&z, 0),
            Err(ProtoError::BadValue("count", 0))
        ));
    }

    #[test]
    fn enumerations_are_checked() {
        let mut h = hello();
        h.kind = StartKind::Cold;
        let mut b = encode_app(&AppMsg::Hello(h));
        b[HDR_LEN + 8] = 7;
        assert_eq!(parse_app(&b, 0), Err(ProtoError::BadValue("kind", 7)));
        let inh = encode_sup(&SupMsg::Inherit(Inherit {
            mode: StartKind::Warm,
            generation: 1,
            signal: 0,
            t_detect_ns: 0,
            reason: String::new(),
            decision: String::new(),
            decision_code: Reason::IndependentDropped,
            dropped: 1,
            flags: INHERIT_RESTORED,
        }));
        // the supervisor's own types are refused from the app
        assert_eq!(
            parse_app(&inh, 0),
            Err(ProtoError::WrongDirection(T_INHERIT))
        );
    }

    #[test]
    fn long_strings_are_cut_on_a_char_boundary() {
        let mut v = Vec::new();
        let s = "é".repeat(100); // 200 bytes
        put_cstr(&mut v, &s, REASON_LEN);
        assert_eq!(v.len(), REASON_LEN);
        let back = cstr_from(&v, "x").unwrap_or_default();
        assert_eq!(back, "é".repeat(63));
    }
}
