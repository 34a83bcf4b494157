//! The control block: a 64 KiB memfd (`memfd:rekindle:control`) that the
//! supervisor creates once, maps MAP_SHARED, and hands to every incarnation
//! as fd 4+L (docs/supervisor-protocol.md, "Control block").
//!
//! The runtime writes with plain or relaxed-atomic stores; the supervisor
//! reads each field with an atomic load, at any time and after a death.  The
//! memfd is sealed against shrinking and growing, so no app can make the
//! supervisor's mapping fault.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

use anyhow::{Context, Result, bail};

pub const MAGIC: u64 = 0x314c_5254_434b_5200; // "\0RKCTRL1"
pub const VERSION: u32 = 1;
pub const SIZE: usize = 65536;
pub const NSLOTS: usize = 256;
pub const SLOT_SIZE: usize = 64;
pub const MAX_ARENAS: usize = 16;
pub const ARENA_NAME_LEN: usize = 48;

pub const OFF_MAGIC: usize = 0;
pub const OFF_VERSION: usize = 8;
pub const OFF_SIZE: usize = 12;
pub const OFF_PID: usize = 16;
pub const OFF_GENERATION: usize = 20;
pub const OFF_STATE: usize = 24;
pub const OFF_FLAGS: usize = 28;
pub const OFF_HEARTBEAT_COUNT: usize = 32;
pub const OFF_HEARTBEAT_NS: usize = 40;
pub const OFF_PRESERVED: usize = 48;
pub const OFF_REQUEST_MODE: usize = 56;
/// Set by the supervisor while a lazy restore fills the arenas.
pub const OFF_LAZY_PAGES: usize = 60;
pub const OFF_REQUEST_REASON: usize = 64;
pub const REQUEST_REASON_LEN: usize = 128;
pub const OFF_NSLOTS: usize = 192;
pub const OFF_SLOT_SIZE: usize = 196;
pub const OFF_NARENAS: usize = 200;
pub const OFF_INDEPENDENT: usize = 204;
/// FNV-1a 64 of narenas, independent_mask and the names in use; 0 = no
/// table written yet (then narenas and the mask must be 0).
pub const OFF_ARENA_TABLE_SUM: usize = 208;
pub const OFF_SLOTS: usize = 256;
pub const OFF_ARENA_NAMES: usize = 16640;

/// In each 64-byte slot (struct rk_ctl_slot): the owner's tid, then one
/// u16 depth of open unsafe regions per arena index.
pub const SLOT_OFF_TID: usize = 0;
pub const SLOT_OFF_DEPTH: usize = 4;
pub const SLOT_DEPTH_SIZE: usize = 2;

pub const FLAG_WARM_DISABLED: u32 = 1;
/// The runtime's shared overflow slot (rk_control: OVERFLOW_TID).
pub const OVERFLOW_TID: u32 = 0xffff_ffff;

/// The block's `state` field, as the runtime writes it (rk_ctl_state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtlState {
    None,
    Running,
    /// Warm, before `rk_finish_recovery`.
    Recovering,
    /// After `rk_ready`.
    Ready,
    /// Inside `rk_restart`, before the exec: no heartbeat is due.
    Restarting,
    /// Anything else: the app wrote garbage there.
    Unknown(u32),
}

impl CtlState {
    pub fn from_raw(s: u32) -> Self {
        match s {
            0 => CtlState::None,
            1 => CtlState::Running,
            2 => CtlState::Recovering,
            3 => CtlState::Ready,
            4 => CtlState::Restarting,
            n => CtlState::Unknown(n),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            CtlState::None => "none",
            CtlState::Running => "running",
            CtlState::Recovering => "recovering",
            CtlState::Ready => "ready",
            CtlState::Restarting => "restarting",
            CtlState::Unknown(_) => "unknown",
        }
    }
}

/// The `request_mode` the supervisor writes to ask for a restart (0 is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestMode {
    Warm = 1,
    Cold = 2,
}

/// What is wrong with a control block's header: the block is the evidence
/// of open unsafe regions, so a damaged one cannot vouch for a warm restart.
/// The words match the runtime's `rk_control_damage()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    BadMagic,
    BadLayout,
    BadArenaCount,
    BadArenaTable,
}

impl Damage {
    pub const ALL: [Damage; 4] = [
        Damage::BadMagic,
        Damage::BadLayout,
        Damage::BadArenaCount,
        Damage::BadArenaTable,
    ];

    /// The damage the runtime's words name (its decision text).
    pub fn from_words(s: &str) -> Option<Damage> {
        Damage::ALL.iter().copied().find(|d| d.describe() == s)
    }

    /// Stable code, for events, status and metrics labels.
    pub fn code(self) -> &'static str {
        match self {
            Damage::BadMagic => "bad_magic",
            Damage::BadLayout => "bad_layout",
            Damage::BadArenaCount => "bad_arena_count",
            Damage::BadArenaTable => "bad_arena_table",
        }
    }
    pub fn describe(self) -> &'static str {
        match self {
            Damage::BadMagic => "control block corrupt: bad magic",
            Damage::BadLayout => "control block corrupt: bad version or layout",
            Damage::BadArenaCount => "control block corrupt: bad arena count",
            Damage::BadArenaTable => "control block corrupt: arena table checksum",
        }
    }
}

/// An open unsafe region found in the slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRegion {
    pub arena_index: usize,
    pub arena: String,
    pub tid: u32,
    pub depth: u16,
}

/// Read-only view over a control block's bytes (the pure part, unit-tested
/// on a plain buffer).  Every offset is checked against the length.
pub trait Fields {
    fn bytes_len(&self) -> usize;
    fn load_u16(&self, off: usize) -> u16;
    fn load_u32(&self, off: usize) -> u32;
    fn load_u64(&self, off: usize) -> u64;
    fn load_byte(&self, off: usize) -> u8;

    fn cstr_at(&self, off: usize, cap: usize) -> Option<String> {
        let mut v = Vec::with_capacity(cap);
        for i in 0..cap {
            let c = self.load_byte(off + i);
            if c == 0 {
                return Some(String::from_utf8_lossy(&v).into_owned());
            }
            v.push(c);
        }
        None
    }

    fn arena_name(&self, k: usize) -> String {
        let n = self.load_u32(OFF_NARENAS) as usize;
        if k >= n.min(MAX_ARENAS) {
            return "?".into();
        }
        match self.cstr_at(OFF_ARENA_NAMES + k * ARENA_NAME_LEN, ARENA_NAME_LEN) {
            Some(s) if !s.is_empty() => s,
            _ => "?".into(),
        }
    }

    /// "Unsafe at death": the first slot with a nonzero depth.
    fn open_region(&self) -> Option<OpenRegion> {
        self.open_regions().into_iter().next()
    }

    /// Every arena with an open region (or a held allocator lock) at death:
    /// the first slot found for each, in arena-index order.
    fn open_regions(&self) -> Vec<OpenRegion> {
        let mut found: Vec<OpenRegion> = Vec::new();
        for i in 0..NSLOTS {
            let base = OFF_SLOTS + i * SLOT_SIZE;
            // any depth counts, whoever owns the slot (the runtime's
            // rk_unsafe_open_mask): a thread that exited inside a region, or
            // a stray 0 over the tid, must not hide an open region
            let tid = self.load_u32(base + SLOT_OFF_TID);
            for k in 0..MAX_ARENAS {
                let depth = self.load_u16(base + SLOT_OFF_DEPTH + SLOT_DEPTH_SIZE * k);
                if depth != 0 && !found.iter().any(|r| r.arena_index == k) {
                    found.push(OpenRegion {
                        arena_index: k,
                        arena: self.arena_name(k),
                        tid: if tid == OVERFLOW_TID { 0 } else { tid },
                        depth,
                    });
                }
            }
        }
        found.sort_by_key(|r| r.arena_index);
        found
    }

    /// The header as the supervisor wrote it, or what is wrong with it.
    fn damage(&self) -> Option<Damage> {
        if self.load_u64(OFF_MAGIC) != MAGIC {
            return Some(Damage::BadMagic);
        }
        if self.load_u32(OFF_VERSION) != VERSION
            || self.load_u32(OFF_SIZE) as usize != SIZE
            || self.load_u32(OFF_NSLOTS) as usize != NSLOTS
            || self.load_u32(OFF_SLOT_SIZE) as usize != SLOT_SIZE
        {
            return Some(Damage::BadLayout);
        }
        if self.load_u32(OFF_NARENAS) as usize > MAX_ARENAS {
            return Some(Damage::BadArenaCount);
        }
        let sum = self.load_u64(OFF_ARENA_TABLE_SUM);
        let bad = if sum == 0 {
            self.load_u32(OFF_NARENAS) != 0 || self.load_u32(OFF_INDEPENDENT) != 0
        } else {
            sum != self.arena_table_sum()
        };
        if bad {
            return Some(Damage::BadArenaTable);
        }
        None
    }

    /// What the runtime stores at OFF_ARENA_TABLE_SUM (control.c's
    /// arena_table_sum): which arenas are independent decides what a death
    /// drops, so a stray write there must be seen.
    fn arena_table_sum(&self) -> u64 {
        let n = self.load_u32(OFF_NARENAS);
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |b: u8| h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        for b in n
            .to_le_bytes()
            .into_iter()
            .chain(self.load_u32(OFF_INDEPENDENT).to_le_bytes())
        {
            mix(b);
        }
        for k in 0..(n as usize).min(MAX_ARENAS) {
            for i in 0..ARENA_NAME_LEN {
                mix(self.load_byte(OFF_ARENA_NAMES + k * ARENA_NAME_LEN + i));
            }
        }
        if h == 0 { 1 } else { h }
    }

    /// Arena indexes the app opened RK_ARENA_INDEPENDENT.
    fn independent_mask(&self) -> u32 {
        self.load_u32(OFF_INDEPENDENT)
    }

    /// The control-block index of the arena called `name`, if listed.
    fn arena_index(&self, name: &str) -> Option<usize> {
        let n = (self.load_u32(OFF_NARENAS) as usize).min(MAX_ARENAS);
        (0..n).find(|&k| self.arena_name(k) == name)
    }
}

impl OpenRegion {
    /// Same words as the runtime's rk_unsafe_open().
    pub fn describe(&self) -> String {
        format!(
            "unsafe region open in arena {} (tid {})",
            self.arena, self.tid
        )
    }
}

/// Plain buffer implementation, for tests and the fuzz seeds.
impl Fields for [u8] {
    fn bytes_len(&self) -> usize {
        self.len()
    }
    fn load_byte(&self, off: usize) -> u8 {
        self.get(off).copied().unwrap_or(0)
    }
    fn load_u16(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.load_byte(off), self.load_byte(off + 1)])
    }
    fn load_u32(&self, off: usize) -> u32 {
        let mut a = [0u8; 4];
        for (i, b) in a.iter_mut().enumerate() {
            *b = self.load_byte(off + i);
        }
        u32::from_le_bytes(a)
    }
    fn load_u64(&self, off: usize) -> u64 {
        let mut a = [0u8; 8];
        for (i, b) in a.iter_mut().enumerate() {
            *b = self.load_byte(off + i);
        }
        u64::from_le_bytes(a)
    }
}

/// The supervisor's shared mapping of the block.
pub struct ControlBlock {
    fd: OwnedFd,
    ptr: *mut u8,
}

impl ControlBlock {
    pub fn create() -> Result<Self> {
        // SAFETY: memfd_create with a static NUL-terminated name.
        let raw = unsafe {
            libc::memfd_create(
                c"rekindle:control".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error())
                .context("memfd_create for the control block");
        }
        // SAFETY: raw is a fresh descriptor that we own from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscalls on our own fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), SIZE as libc::off_t) } < 0 {
            return Err(std::io::Error::last_os_error()).context("ftruncate of the control block");
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(std::io::Error::last_os_error()).context("sealing the control block");
        }
        // SAFETY: a fresh shared mapping of SIZE bytes of a memfd that is SIZE
        // bytes long and sealed against shrinking.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mmap of the control block");
        }
        let cb = ControlBlock { fd, ptr: p.cast() };
        cb.store_u64(OFF_MAGIC, MAGIC);
        cb.store_u32(OFF_VERSION, VERSION);
        cb.store_u32(OFF_SIZE, SIZE as u32);
        cb.store_u32(OFF_NSLOTS, NSLOTS as u32);
        cb.store_u32(OFF_SLOT_SIZE, SLOT_SIZE as u32);
        if cb.load_u64(OFF_MAGIC) != MAGIC {
            bail!("control block did not keep its magic");
        }
        Ok(cb)
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= SIZE);
        // SAFETY: in bounds, aligned, and the mapping lives as long as self.
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }
    fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= SIZE);
        // SAFETY: as above.
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    pub fn store_u32(&self, off: usize, v: u32) {
        self.atomic_u32(off).store(v, Ordering::SeqCst)
    }
    pub fn store_u64(&self, off: usize, v: u64) {
        self.atomic_u64(off).store(v, Ordering::SeqCst)
    }

    pub fn pid(&self) -> u32 {
        self.load_u32(OFF_PID)
    }
    pub fn generation(&self) -> u32 {
        self.load_u32(OFF_GENERATION)
    }
    pub fn state(&self) -> CtlState {
        CtlState::from_raw(self.load_u32(OFF_STATE))
    }
    pub fn flags(&self) -> u32 {
        self.load_u32(OFF_FLAGS)
    }
    pub fn warm_disabled(&self) -> bool {
        self.flags() & FLAG_WARM_DISABLED != 0
    }
    pub fn heartbeat_ns(&self) -> u64 {
        self.load_u64(OFF_HEARTBEAT_NS)
    }
    pub fn heartbeat_count(&self) -> u64 {
        self.load_u64(OFF_HEARTBEAT_COUNT)
    }
    pub fn preserved_bytes(&self) -> u64 {
        self.load_u64(OFF_PRESERVED)
    }
    pub fn request_mode(&self) -> u32 {
        self.load_u32(OFF_REQUEST_MODE)
    }

    /// Asks for a restart: the reason first, then the mode, which the
    /// runtime reads as the signal that the reason is complete.
    pub fn request(&self, mode: RequestMode, reason: &str) {
        let bytes = reason.as_bytes();
        let n = bytes.len().min(REQUEST_REASON_LEN - 1);
        for i in 0..REQUEST_REASON_LEN {
            let c = bytes.get(i).copied().filter(|_| i < n).unwrap_or(0);
            // SAFETY: within the mapping (64 + 128 <= SIZE); single bytes.
            unsafe { std::ptr::write_volatile(self.ptr.add(OFF_REQUEST_REASON + i), c) };
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        self.store_u32(OFF_REQUEST_MODE, mode as u32);
    }

    /// Before a new process starts: clear what belonged to the dead one (the
    /// runtime clears these too in rk_init, but an app without the runtime
    /// never would, and a stale heartbeat would look like a hang).  Called
    /// only after the decision was made from them.
    pub fn reset_for_spawn(&self) {
        for off in [
            OFF_PID,
            OFF_GENERATION,
            OFF_STATE,
            OFF_FLAGS,
            OFF_REQUEST_MODE,
            OFF_NARENAS,
            OFF_INDEPENDENT,
        ] {
            self.store_u32(off, 0);
        }
        for off in [
            OFF_HEARTBEAT_COUNT,
            OFF_HEARTBEAT_NS,
            OFF_PRESERVED,
            OFF_ARENA_TABLE_SUM,
        ] {
            self.store_u64(off, 0);
        }
        for i in 0..NSLOTS {
            let base = OFF_SLOTS + i * SLOT_SIZE;
            for w in 0..(SLOT_SIZE / 8) {
                self.store_u64(base + 8 * w, 0);
            }
        }
    }
}

impl Fields for ControlBlock {
    fn bytes_len(&self) -> usize {
        SIZE
    }
    fn load_byte(&self, off: usize) -> u8 {
        if off >= SIZE {
            return 0;
        }
        // SAFETY: in bounds of the live mapping; the app may write concurrently,
        // which a volatile byte read tolerates.
        unsafe { std::ptr::read_volatile(self.ptr.add(off)) }
    }
    fn load_u16(&self, off: usize) -> u16 {
        if !off.is_multiple_of(2) || off + 2 > SIZE {
            return 0;
        }
        // SAFETY: in bounds and aligned.
        unsafe { &*(self.ptr.add(off) as *const AtomicU16) }.load(Ordering::SeqCst)
    }
    fn load_u32(&self, off: usize) -> u32 {
        self.atomic_u32(off).load(Ordering::SeqCst)
    }
    fn load_u64(&self, off: usize) -> u64 {
        self.atomic_u64(off).load(Ordering::SeqCst)
    }
}

impl Drop for ControlBlock {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping of SIZE bytes.
        unsafe { libc::munmap(self.ptr.cast(), SIZE) };
    }
}

/// Reads a NUL-terminated name (for tests that build blocks by hand).
pub fn cstr_field(b: &[u8]) -> Option<&str> {
    CStr::from_bytes_until_nul(b)
        .ok()
        .and_then(|c| c.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block() -> Vec<u8> {
        let mut b = vec![0u8; SIZE];
        b[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&MAGIC.to_le_bytes());
        b[OFF_VERSION..OFF_VERSION + 4].copy_from_slice(&VERSION.to_le_bytes());
        b[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&(SIZE as u32).to_le_bytes());
        b[OFF_NSLOTS..OFF_NSLOTS + 4].copy_from_slice(&(NSLOTS as u32).to_le_bytes());
        b[OFF_SLOT_SIZE..OFF_SLOT_SIZE + 4].copy_from_slice(&(SLOT_SIZE as u32).to_le_bytes());
        b[OFF_NARENAS..OFF_NARENAS + 4].copy_from_slice(&2u32.to_le_bytes());
        b[OFF_ARENA_NAMES..OFF_ARENA_NAMES + 5].copy_from_slice(b"table");
        let n1 = OFF_ARENA_NAMES + ARENA_NAME_LEN;
        b[n1..n1 + 5].copy_from_slice(b"index");
        // the runtime's overflow slot is always claimed
        let last = OFF_SLOTS + 255 * SLOT_SIZE;
        b[last..last + 4].copy_from_slice(&OVERFLOW_TID.to_le_bytes());
        seal(&mut b);
        b
    }

    /// Writes the arena table checksum, as the runtime does.
    fn seal(b: &mut [u8]) {
        let sum = b.arena_table_sum();
        b[OFF_ARENA_TABLE_SUM..OFF_ARENA_TABLE_SUM + 8].copy_from_slice(&sum.to_le_bytes());
    }

    #[test]
    fn no_region_open() {
        let mut b = block();
        // a claimed slot with all depths back to zero
        b[OFF_SLOTS..OFF_SLOTS + 4].copy_from_slice(&1234u32.to_le_bytes());
        assert_eq!(b.as_slice().open_region(), None);
    }

    #[test]
    fn region_open_names_arena_and_tid() {
        let mut b = block();
        let s = OFF_SLOTS + 3 * SLOT_SIZE;
        b[s..s + 4].copy_from_slice(&4321u32.to_le_bytes());
        b[s + 4 + 2..s + 4 + 4].copy_from_slice(&1u16.to_le_bytes()); // arena 1
        let r = b.as_slice().open_region().unwrap_or_else(|| panic!("none"));
        assert_eq!(r.arena, "index");
        assert_eq!(r.tid, 4321);
        assert_eq!(r.describe(), "unsafe region open in arena index (tid 4321)");
    }

    #[test]
    fn depth_in_a_free_slot_counts() {
        // a thread that exited inside a region, or a stray 0 over the tid
        let mut b = block();
        let s = OFF_SLOTS + 5 * SLOT_SIZE;
        b[s + 4..s + 6].copy_from_slice(&3u16.to_le_bytes());
        let r = b.as_slice().open_region().unwrap_or_else(|| panic!("none"));
        assert_eq!((r.arena.as_str(), r.tid), ("table", 0));
    }

    #[test]
    fn unnamed_or_out_of_range_arena_is_question_mark() {
        let mut b = block();
        let s = OFF_SLOTS;
        b[s..s + 4].copy_from_slice(&9u32.to_le_bytes());
        b[s + 4 + 2 * 7..s + 4 + 2 * 8].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(
            b.as_slice().open_region().map(|r| r.arena),
            Some("?".into())
        );
        // a name without a NUL
        let mut b = block();
        for c in &mut b[OFF_ARENA_NAMES..OFF_ARENA_NAMES + ARENA_NAME_LEN] {
            *c = b'x';
        }
        assert_eq!(b.as_slice().arena_name(0), "?");
    }

    #[test]
    fn damaged_header_is_named() {
        assert_eq!(block().as_slice().damage(), None);
        let mut b = block();
        b[OFF_MAGIC] ^= 0x5a;
        assert_eq!(b.as_slice().damage(), Some(Damage::BadMagic));
        let mut b = block();
        b[OFF_SLOT_SIZE] = 32;
        assert_eq!(b.as_slice().damage(), Some(Damage::BadLayout));
        let mut b = block();
        b[OFF_VERSION] = 2;
        assert_eq!(b.as_slice().damage(), Some(Damage::BadLayout));
        let mut b = block();
        b[OFF_NARENAS..OFF_NARENAS + 4].copy_from_slice(&17u32.to_le_bytes());
        assert_eq!(b.as_slice().damage(), Some(Damage::BadArenaCount));
        // the arena table: a stray write in the mask or a name, or a table
        // without its checksum
        let mut b = block();
        b[OFF_INDEPENDENT] = 0xff;
        assert_eq!(b.as_slice().damage(), Some(Damage::BadArenaTable));
        let mut b = block();
        b[OFF_ARENA_NAMES + 1] ^= 1;
        assert_eq!(b.as_slice().damage(), Some(Damage::BadArenaTable));
        let mut b = block();
        b[OFF_ARENA_TABLE_SUM..OFF_ARENA_TABLE_SUM + 8].fill(0);
        assert_eq!(b.as_slice().damage(), Some(Damage::BadArenaTable));
        let mut b = block();
        b[OFF_NARENAS..OFF_NARENAS + 4].fill(0);
        b[OFF_ARENA_TABLE_SUM..OFF_ARENA_TABLE_SUM + 8].fill(0);
        assert_eq!(
            b.as_slice().damage(),
            None,
            "an empty table needs no checksum"
        );
        assert_eq!(vec![0u8; SIZE].as_slice().damage(), Some(Damage::BadMagic));
    }

    #[test]
    fn shared_block_round_trip() {
        let cb = ControlBlock::create().unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(cb.load_u64(OFF_MAGIC), MAGIC);
        assert_eq!(cb.load_u32(OFF_NSLOTS), 256);
        assert_eq!(cb.damage(), None);
        assert_eq!(cb.state(), CtlState::None);
        cb.store_u32(OFF_STATE, 4);
        assert_eq!(cb.state(), CtlState::Restarting);
        cb.store_u32(OFF_STATE, 77);
        assert_eq!(cb.state(), CtlState::Unknown(77));
        assert_eq!(CtlState::from_raw(2).as_str(), "recovering");
        cb.request(RequestMode::Warm, "leak: RssAnon 1 > max 0");
        assert_eq!(cb.request_mode(), 1);
        cb.request(RequestMode::Cold, "leak: RssAnon 1 > max 0");
        assert_eq!(cb.request_mode(), 2);
        assert_eq!(
            cb.cstr_at(OFF_REQUEST_REASON, REQUEST_REASON_LEN)
                .as_deref(),
            Some("leak: RssAnon 1 > max 0")
        );
        cb.store_u64(OFF_HEARTBEAT_NS, 5);
        cb.reset_for_spawn();
        assert_eq!(cb.heartbeat_ns(), 0);
        assert_eq!(cb.request_mode(), 0);
        assert_eq!(cb.load_u64(OFF_MAGIC), MAGIC);
        // sealed: cannot be shrunk under the supervisor's mapping
        // SAFETY: plain syscall on our fd.
        let r = unsafe { libc::ftruncate(cb.fd().as_raw_fd(), 0) };
        assert!(r < 0);
        assert_eq!(cstr_field(b"abc\0def"), Some("abc"));
    }
}
