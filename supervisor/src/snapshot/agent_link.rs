//! The messages on the snapshot socket pair and the shared buffer of the
//! app's snapshot agent (runtime/src/snapshot_agent.c; docs/snapshots.md).
//!
//! Same framing as the main socket pair (`proto`: 16-byte header, magic
//! "RKSM", version 2), its own message types.  Pure parsing and encoding:
//! whatever the bytes, `parse` returns an error rather than panicking.  The
//! sizes, offsets and status numbers here are compared with the C side by
//! `supervisor/tests/layout.rs`.

use thiserror::Error;

use crate::proto::{HDR_LEN, MAGIC, VERSION};

pub const T_SNAP_HELLO: u16 = 20;
pub const T_SNAP_DIRTY: u16 = 21;
pub const T_SNAP_RELEASED: u16 = 22;
pub const T_SNAP_SCAN: u16 = 120;
pub const T_SNAP_CONTINUE: u16 = 121;
pub const T_SNAP_RELEASE: u16 = 122;

pub const SNAP_HELLO_LEN: usize = 24;
pub const SNAP_SCAN_LEN: usize = 16;
/// SCAN's flags (rk_internal.h): freeze and hold the app (the cut); say
/// whether nothing changed since the last cut (`Dirty::unchanged`).
pub const SCAN_CUT: u32 = 0x1;
pub const SCAN_PROBE: u32 = 0x2;
/// HELLO's fds: the buffer, the durable eventfd, the request eventfd.
pub const HELLO_FDS: usize = 3;
pub const SNAP_DIRTY_LEN: usize = 56;
pub const SNAP_SEQ_LEN: usize = 8;
pub const SNAP_RELEASED_LEN: usize = 24;

/// `struct rk_snap_buf`.
pub const BUF_MAGIC: u64 = 0x3146_5542_5041_4e53; // "SNAPBUF1"
/// 4: SCAN's flags (a version-3 agent would take a probe for a cut).
pub const BUF_VERSION: u32 = 4;
pub const BUF_HDR_LEN: usize = 104;
pub const OFF_BUF_OPEN_EPOCH: usize = 88;
pub const OFF_BUF_DURABLE_EPOCH: usize = 96;
pub const OFF_BUF_REGIONS_OFF: usize = 16;
pub const OFF_BUF_VEC_OFF: usize = 24;
pub const OFF_BUF_PUNCH_OFF: usize = 32;
pub const OFF_BUF_MANIFEST_OFF: usize = 40;
pub const OFF_BUF_VEC_CAP: usize = 48;
pub const OFF_BUF_PUNCH_CAP: usize = 52;
pub const OFF_BUF_NREGIONS: usize = 64;
pub const OFF_BUF_NVEC: usize = 68;
pub const OFF_BUF_MANIFEST_LEN: usize = 72;
pub const OFF_BUF_NPUNCH: usize = 76;
/// `struct rk_snap_region`.
pub const REGION_LEN: usize = 88;
/// Its memfd's inode.
pub const REGION_OFF_INO: usize = 80;
pub const REGION_NEW: u32 = 0x1;
/// With NEW on a restored incarnation's first report: tracked since rk_init
/// mapped it, so the report lists every change since the restored snapshot.
pub const REGION_TRACKED_FROM_MAP: u32 = 0x2;
/// The kernel's `struct page_region` and `struct rk_snap_punch`.
pub const RUN_LEN: usize = 24;
pub const PUNCH_LEN: usize = 16;
pub const MAX_REGIONS: usize = 32;

/// `enum rk_snap_status`: why a report or a cut did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapStatus {
    Ok,
    RegionOpen,
    Restarting,
    LayoutChanging,
    ScanFailed,
    StopTimeout,
    BadRequest,
    Unavailable,
}

impl SnapStatus {
    pub const ALL: [SnapStatus; 8] = [
        SnapStatus::Ok,
        SnapStatus::RegionOpen,
        SnapStatus::Restarting,
        SnapStatus::LayoutChanging,
        SnapStatus::ScanFailed,
        SnapStatus::StopTimeout,
        SnapStatus::BadRequest,
        SnapStatus::Unavailable,
    ];
    pub fn code(self) -> u32 {
        self as u32
    }
    pub fn from_code(c: u32) -> Option<SnapStatus> {
        Self::ALL.get(c as usize).copied()
    }
    /// The stable reason code of events and errors.
    pub fn name(self) -> &'static str {
        match self {
            SnapStatus::Ok => "ok",
            SnapStatus::RegionOpen => "region_open",
            SnapStatus::Restarting => "restart_under_way",
            SnapStatus::LayoutChanging => "layout_changing",
            SnapStatus::ScanFailed => "scan_failed",
            SnapStatus::StopTimeout => "stop_timeout",
            SnapStatus::BadRequest => "bad_request",
            SnapStatus::Unavailable => "snapshot_unavailable",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub pid: u32,
    pub generation: u32,
    pub status: SnapStatus,
    pub err: i32,
    pub buf_size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirty {
    pub seq: u64,
    pub status: SnapStatus,
    pub err: i32,
    pub more: bool,
    pub frozen: bool,
    pub t_freeze_ns: u64,
    pub t_scan_ns: u64,
    pub punch_overflow: bool,
    /// A probe's last batch: nothing changed since the last cut, as of the
    /// scan's start (rk_internal.h, RK_SNAP_SCAN_PROBE).
    pub unchanged: bool,
    /// With `frozen`: this cut's number in the app (`rk_epoch()` before it);
    /// with `unchanged`: `rk_epoch()` before the probe's scan.
    pub epoch: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub seq: u64,
    pub status: SnapStatus,
    pub stop_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentMsg {
    Hello(Hello),
    Dirty(Dirty),
    Released(Released),
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum AgentMsgError {
    #[error("message of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("bad magic {0:#x}")]
    Magic(u32),
    #[error("protocol version {0}, expected {VERSION}")]
    Version(u16),
    #[error("declared length {declared} but {actual} bytes follow the header")]
    Length { declared: u32, actual: usize },
    #[error("unknown message type {0}")]
    Type(u16),
    #[error("message type {ty} needs {want} bytes, got {got}")]
    Size { ty: u16, want: usize, got: usize },
    #[error("unknown status {0}")]
    Status(u32),
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn i32_at(b: &[u8], o: usize) -> i32 {
    u32_at(b, o) as i32
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

fn status(c: u32) -> Result<SnapStatus, AgentMsgError> {
    SnapStatus::from_code(c).ok_or(AgentMsgError::Status(c))
}

pub fn parse(b: &[u8]) -> Result<AgentMsg, AgentMsgError> {
    if b.len() < HDR_LEN {
        return Err(AgentMsgError::Short(b.len()));
    }
    if u32_at(b, 0) != MAGIC {
        return Err(AgentMsgError::Magic(u32_at(b, 0)));
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != VERSION {
        return Err(AgentMsgError::Version(version));
    }
    let ty = u16::from_le_bytes([b[6], b[7]]);
    let declared = u32_at(b, 8);
    let p = &b[HDR_LEN..];
    if declared as usize != p.len() {
        return Err(AgentMsgError::Length {
            declared,
            actual: p.len(),
        });
    }
    let want = match ty {
        T_SNAP_HELLO => SNAP_HELLO_LEN,
        T_SNAP_DIRTY => SNAP_DIRTY_LEN,
        T_SNAP_RELEASED => SNAP_RELEASED_LEN,
        _ => return Err(AgentMsgError::Type(ty)),
    };
    if p.len() != want {
        return Err(AgentMsgError::Size {
            ty,
            want,
            got: p.len(),
        });
    }
    Ok(match ty {
        T_SNAP_HELLO => AgentMsg::Hello(Hello {
            pid: u32_at(p, 0),
            generation: u32_at(p, 4),
            status: status(u32_at(p, 8))?,
            err: i32_at(p, 12),
            buf_size: u64_at(p, 16),
        }),
        T_SNAP_DIRTY => AgentMsg::Dirty(Dirty {
            seq: u64_at(p, 0),
            status: status(u32_at(p, 8))?,
            err: i32_at(p, 12),
            more: u32_at(p, 16) != 0,
            frozen: u32_at(p, 20) != 0,
            t_freeze_ns: u64_at(p, 24),
            t_scan_ns: u64_at(p, 32),
            punch_overflow: u32_at(p, 40) != 0,
            unchanged: u32_at(p, 44) != 0,
            epoch: u64_at(p, 48),
        }),
        _ => AgentMsg::Released(Released {
            seq: u64_at(p, 0),
            status: status(u32_at(p, 8))?,
            stop_ns: u64_at(p, 16),
        }),
    })
}

fn frame(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HDR_LEN + payload.len());
    v.extend_from_slice(&MAGIC.to_le_bytes());
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

pub fn encode_scan(seq: u64, flags: u32, timeout_ms: u32) -> Vec<u8> {
    let mut p = Vec::with_capacity(SNAP_SCAN_LEN);
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&flags.to_le_bytes());
    p.extend_from_slice(&timeout_ms.to_le_bytes());
    frame(T_SNAP_SCAN, &p)
}

pub fn encode_continue(seq: u64) -> Vec<u8> {
    frame(T_SNAP_CONTINUE, &seq.to_le_bytes())
}

pub fn encode_release(seq: u64) -> Vec<u8> {
    frame(T_SNAP_RELEASE, &seq.to_le_bytes())
}

/// For tests: what the agent sends.
pub fn encode_agent(m: &AgentMsg) -> Vec<u8> {
    let mut p = Vec::new();
    match m {
        AgentMsg::Hello(h) => {
            for v in [h.pid, h.generation, h.status.code(), h.err as u32] {
                p.extend_from_slice(&v.to_le_bytes());
            }
            p.extend_from_slice(&h.buf_size.to_le_bytes());
            frame(T_SNAP_HELLO, &p)
        }
        AgentMsg::Dirty(d) => {
            p.extend_from_slice(&d.seq.to_le_bytes());
            for v in [
                d.status.code(),
                d.err as u32,
                d.more as u32,
                d.frozen as u32,
            ] {
                p.extend_from_slice(&v.to_le_bytes());
            }
            p.extend_from_slice(&d.t_freeze_ns.to_le_bytes());
            p.extend_from_slice(&d.t_scan_ns.to_le_bytes());
            p.extend_from_slice(&(d.punch_overflow as u32).to_le_bytes());
            p.extend_from_slice(&(d.unchanged as u32).to_le_bytes());
            p.extend_from_slice(&d.epoch.to_le_bytes());
            frame(T_SNAP_DIRTY, &p)
        }
        AgentMsg::Released(r) => {
            p.extend_from_slice(&r.seq.to_le_bytes());
            p.extend_from_slice(&r.status.code().to_le_bytes());
            p.extend_from_slice(&0u32.to_le_bytes());
            p.extend_from_slice(&r.stop_ns.to_le_bytes());
            frame(T_SNAP_RELEASED, &p)
        }
    }
}

/// One region of a report (`struct rk_snap_region`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub kind: RegionKind,
    pub new: bool,
    /// REGION_TRACKED_FROM_MAP.
    pub tracked_from_map: bool,
    pub name: String,
    pub addr: u64,
    pub len: u64,
    pub first: u32,
    pub count: u32,
    /// Its memfd's inode (0: not said).
    pub ino: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegionKind {
    Arena,
    Range,
}

/// A run of written pages, by address: [start, end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub start: u64,
    pub end: u64,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BufError {
    #[error("the snapshot buffer is {0} bytes, too small for its header")]
    Short(usize),
    #[error("the snapshot buffer has a bad magic or version")]
    Magic,
    #[error("the snapshot buffer's {what} lies outside its {size} bytes")]
    Bounds { what: &'static str, size: usize },
    #[error("region {0} of the report is malformed: {1}")]
    Region(usize, &'static str),
}

/// A checked view of the shared buffer's current report.
pub struct Report<'a> {
    b: &'a [u8],
    regions_off: usize,
    vec_off: usize,
    punch_off: usize,
    manifest_off: usize,
    pub nregions: usize,
    pub nvec: usize,
    pub npunch: usize,
    pub manifest_len: usize,
}

fn span(off: u64, n: u64, unit: u64, size: usize, what: &'static str) -> Result<usize, BufError> {
    let end = n
        .checked_mul(unit)
        .and_then(|l| l.checked_add(off))
        .ok_or(BufError::Bounds { what, size })?;
    if end > size as u64 {
        return Err(BufError::Bounds { what, size });
    }
    Ok(off as usize)
}

impl<'a> Report<'a> {
    pub fn new(b: &'a [u8]) -> Result<Report<'a>, BufError> {
        if b.len() < BUF_HDR_LEN {
            return Err(BufError::Short(b.len()));
        }
        if u64_at(b, 0) != BUF_MAGIC || u32_at(b, 8) != BUF_VERSION {
            return Err(BufError::Magic);
        }
        let size = b.len();
        let (vec_cap, punch_cap) = (u32_at(b, OFF_BUF_VEC_CAP), u32_at(b, OFF_BUF_PUNCH_CAP));
        let nregions = u32_at(b, OFF_BUF_NREGIONS) as u64;
        let nvec = u32_at(b, OFF_BUF_NVEC) as u64;
        let npunch = u32_at(b, OFF_BUF_NPUNCH) as u64;
        let manifest_len = u32_at(b, OFF_BUF_MANIFEST_LEN) as u64;
        if nregions > MAX_REGIONS as u64 {
            return Err(BufError::Bounds {
                what: "region table",
                size,
            });
        }
        if nvec > vec_cap as u64 || npunch > punch_cap as u64 {
            return Err(BufError::Bounds {
                what: "vector",
                size,
            });
        }
        Ok(Report {
            b,
            regions_off: span(
                u64_at(b, OFF_BUF_REGIONS_OFF),
                nregions,
                REGION_LEN as u64,
                size,
                "region table",
            )?,
            vec_off: span(
                u64_at(b, OFF_BUF_VEC_OFF),
                nvec,
                RUN_LEN as u64,
                size,
                "vector",
            )?,
            punch_off: span(
                u64_at(b, OFF_BUF_PUNCH_OFF),
                npunch,
                PUNCH_LEN as u64,
                size,
                "punch log",
            )?,
            manifest_off: span(
                u64_at(b, OFF_BUF_MANIFEST_OFF),
                manifest_len,
                1,
                size,
                "manifest",
            )?,
            nregions: nregions as usize,
            nvec: nvec as usize,
            npunch: npunch as usize,
            manifest_len: manifest_len as usize,
        })
    }

    pub fn regions(&self) -> Result<Vec<Region>, BufError> {
        (0..self.nregions)
            .map(|i| {
                let r = &self.b[self.regions_off + i * REGION_LEN..][..REGION_LEN];
                let kind = match u32_at(r, 0) {
                    1 => RegionKind::Arena,
                    2 => RegionKind::Range,
                    _ => return Err(BufError::Region(i, "unknown kind")),
                };
                let name_bytes = &r[8..56];
                let nul = name_bytes
                    .iter()
                    .position(|&c| c == 0)
                    .ok_or(BufError::Region(i, "name without a NUL"))?;
                let name = std::str::from_utf8(&name_bytes[..nul])
                    .map_err(|_| BufError::Region(i, "name not UTF-8"))?
                    .to_string();
                let (addr, len) = (u64_at(r, 56), u64_at(r, 64));
                let (first, count) = (u32_at(r, 72), u32_at(r, 76));
                if !addr.is_multiple_of(4096)
                    || !len.is_multiple_of(4096)
                    || addr.checked_add(len).is_none()
                {
                    return Err(BufError::Region(i, "not page-aligned"));
                }
                if first as usize + count as usize > self.nvec {
                    return Err(BufError::Region(i, "runs outside the vector"));
                }
                Ok(Region {
                    kind,
                    new: u32_at(r, 4) & REGION_NEW != 0,
                    tracked_from_map: u32_at(r, 4) & (REGION_NEW | REGION_TRACKED_FROM_MAP)
                        == REGION_NEW | REGION_TRACKED_FROM_MAP,
                    name,
                    addr,
                    len,
                    first,
                    count,
                    ino: u64_at(r, REGION_OFF_INO),
                })
            })
            .collect()
    }

    /// The runs of region r, each checked to lie inside it.
    pub fn runs(&self, r: &Region) -> Result<Vec<Run>, BufError> {
        (r.first as usize..(r.first + r.count) as usize)
            .map(|i| {
                let o = self.vec_off + i * RUN_LEN;
                let run = Run {
                    start: u64_at(self.b, o),
                    end: u64_at(self.b, o + 8),
                };
                if run.start < r.addr
                    || run.end > r.addr + r.len
                    || run.start >= run.end
                    || !run.start.is_multiple_of(4096)
                    || !run.end.is_multiple_of(4096)
                {
                    return Err(BufError::Region(i, "run outside its region"));
                }
                Ok(run)
            })
            .collect()
    }

    /// Holes the allocator punched since the last cut: (address, pages).
    pub fn punches(&self) -> Vec<(u64, u64)> {
        (0..self.npunch)
            .map(|i| {
                let o = self.punch_off + i * PUNCH_LEN;
                (u64_at(self.b, o), u64_at(self.b, o + 8))
            })
            .collect()
    }

    pub fn manifest(&self) -> &'a [u8] {
        &self.b[self.manifest_off..self.manifest_off + self.manifest_len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_messages_round_trip() {
        for m in [
            AgentMsg::Hello(Hello {
                pid: 7,
                generation: 3,
                status: SnapStatus::Ok,
                err: 0,
                buf_size: 1 << 20,
            }),
            AgentMsg::Dirty(Dirty {
                seq: 9,
                status: SnapStatus::RegionOpen,
                err: -1,
                more: true,
                frozen: false,
                t_freeze_ns: 5,
                t_scan_ns: 6,
                punch_overflow: true,
                unchanged: true,
                epoch: 3,
            }),
            AgentMsg::Released(Released {
                seq: 9,
                status: SnapStatus::StopTimeout,
                stop_ns: 77,
            }),
        ] {
            assert_eq!(parse(&encode_agent(&m)), Ok(m));
        }
    }

    #[test]
    fn malformed_messages_are_refused() {
        let good = encode_agent(&AgentMsg::Released(Released {
            seq: 1,
            status: SnapStatus::Ok,
            stop_ns: 2,
        }));
        assert!(matches!(parse(&good[..10]), Err(AgentMsgError::Short(10))));
        let mut bad = good.clone();
        bad[0] ^= 1;
        assert!(matches!(parse(&bad), Err(AgentMsgError::Magic(_))));
        let mut bad = good.clone();
        bad[HDR_LEN + 8] = 99; // status
        assert_eq!(parse(&bad), Err(AgentMsgError::Status(99)));
        let mut bad = good.clone();
        bad.push(0);
        assert!(matches!(parse(&bad), Err(AgentMsgError::Length { .. })));
        let mut bad = good;
        bad[6] = 77;
        assert!(matches!(parse(&bad), Err(AgentMsgError::Type(77))));
        // every prefix of every message parses to an error, never a panic
        let m = encode_agent(&AgentMsg::Dirty(Dirty {
            seq: 1,
            status: SnapStatus::Ok,
            err: 0,
            more: false,
            frozen: true,
            t_freeze_ns: 0,
            t_scan_ns: 0,
            punch_overflow: false,
            unchanged: false,
            epoch: 0,
        }));
        for n in 0..m.len() {
            assert!(parse(&m[..n]).is_err());
        }
    }

    fn buf_with(
        nregions: u32,
        regions: &[(u32, &str, u64, u64, u32, u32)],
        runs: &[(u64, u64)],
    ) -> Vec<u8> {
        let mut b = vec![0u8; 4096 * 4];
        b[0..8].copy_from_slice(&BUF_MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&BUF_VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&4096u64.to_le_bytes()); // regions
        b[24..32].copy_from_slice(&8192u64.to_le_bytes()); // vec
        b[32..40].copy_from_slice(&12288u64.to_le_bytes()); // punch
        b[40..48].copy_from_slice(&16000u64.to_le_bytes()); // manifest
        b[48..52].copy_from_slice(&100u32.to_le_bytes());
        b[52..56].copy_from_slice(&100u32.to_le_bytes());
        b[OFF_BUF_NREGIONS..OFF_BUF_NREGIONS + 4].copy_from_slice(&nregions.to_le_bytes());
        b[OFF_BUF_NVEC..OFF_BUF_NVEC + 4].copy_from_slice(&(runs.len() as u32).to_le_bytes());
        for (i, (kind, name, addr, len, first, count)) in regions.iter().enumerate() {
            let o = 4096 + i * REGION_LEN;
            b[o..o + 4].copy_from_slice(&kind.to_le_bytes());
            b[o + 8..o + 8 + name.len()].copy_from_slice(name.as_bytes());
            b[o + 56..o + 64].copy_from_slice(&addr.to_le_bytes());
            b[o + 64..o + 72].copy_from_slice(&len.to_le_bytes());
            b[o + 72..o + 76].copy_from_slice(&first.to_le_bytes());
            b[o + 76..o + 80].copy_from_slice(&count.to_le_bytes());
        }
        for (i, (s, e)) in runs.iter().enumerate() {
            let o = 8192 + i * RUN_LEN;
            b[o..o + 8].copy_from_slice(&s.to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&e.to_le_bytes());
        }
        b
    }

    #[test]
    fn a_report_is_read_and_checked() {
        let b = buf_with(
            1,
            &[(1, "kv", 0x10000, 0x10000, 0, 1)],
            &[(0x11000, 0x13000)],
        );
        let r = Report::new(&b).unwrap_or_else(|e| panic!("{e}"));
        let regions = r.regions().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(regions[0].name, "kv");
        assert_eq!(regions[0].kind, RegionKind::Arena);
        let runs = r.runs(&regions[0]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            runs,
            vec![Run {
                start: 0x11000,
                end: 0x13000
            }]
        );
        // a run outside its region, a region table too long, a bad kind
        let b = buf_with(
            1,
            &[(1, "kv", 0x10000, 0x1000, 0, 1)],
            &[(0x11000, 0x13000)],
        );
        let r = Report::new(&b).unwrap_or_else(|e| panic!("{e}"));
        let regions = r.regions().unwrap_or_else(|e| panic!("{e}"));
        assert!(r.runs(&regions[0]).is_err());
        let b = buf_with(99, &[], &[]);
        assert!(Report::new(&b).is_err());
        let b = buf_with(1, &[(9, "kv", 0x10000, 0x1000, 0, 0)], &[]);
        assert!(
            Report::new(&b)
                .unwrap_or_else(|e| panic!("{e}"))
                .regions()
                .is_err()
        );
    }
}
