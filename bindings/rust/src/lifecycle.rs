//! The process's life: [`init`], how this incarnation started ([`Start`]),
//! recovery after a warm start ([`Recovery`]), restarts on request, and the
//! supervisor's signals (heartbeat, ready, the veto on warm restarts).
use std::ffi::{CString, OsString};
use std::marker::PhantomData;
use std::os::unix::ffi::OsStringExt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::arena::{self, Arena};
use crate::error::{Error, Result, check};
use crate::ffi;
use crate::preserved::{Preservable, Preserved};

/// 0: not initialised, 1: rk_init running, 2: initialised.
static STATE: AtomicU8 = AtomicU8::new(0);

/// True once [`init`] has succeeded in this process.
pub fn is_initialized() -> bool {
    STATE.load(Ordering::Acquire) == 2
}

/// How this incarnation started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StartKind {
    /// First start: there was no previous incarnation.
    Fresh,
    /// Restarted with the preserved state: arenas hold what the previous
    /// incarnation left, and [`Start::recovery`] is `Some`.
    Warm,
    /// Restarted, but the preserved state was dropped (unsafe to reuse, or
    /// asked for): arenas start empty and the app runs its own recovery.
    Cold,
}

/// Options for [`init`]; `Options::new().init()` is [`init`].
#[derive(Debug, Clone, Default)]
pub struct Options {
    raw: ffi::rk_options,
}

impl Options {
    /// The defaults: signal handlers on, no prefault, events on stderr.
    pub fn new() -> Options {
        Options::default()
    }

    /// Do not catch SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT: faults then
    /// kill the process (a supervisor can still respawn it).
    pub fn no_signal_handlers(mut self) -> Options {
        self.raw.flags |= ffi::RK_OPT_NO_SIGNAL_HANDLERS;
        self
    }

    /// After a warm start, fault the preserved pages in from a background
    /// thread (see [`prefault`]).
    pub fn prefault(mut self) -> Options {
        self.raw.flags |= ffi::RK_OPT_PREFAULT;
        self
    }

    /// No JSON event lines on stderr.
    pub fn quiet(mut self) -> Options {
        self.raw.flags |= ffi::RK_OPT_QUIET;
        self
    }

    /// Start of the address range reserved for arenas (default
    /// `0x200000000000`, or `$REKINDLE_ARENA_BASE`).
    pub fn arena_base(mut self, base: u64) -> Options {
        self.raw.arena_base = base;
        self
    }

    /// A second failure this soon after a warm restart goes cold (default
    /// 1 s, or `$REKINDLE_CRASHLOOP_MS`). Zero keeps the default; values
    /// above `u32::MAX` ms are clamped.
    pub fn crashloop_window(mut self, window: Duration) -> Options {
        self.raw.crashloop_window_ms = u32::try_from(window.as_millis()).unwrap_or(u32::MAX);
        self
    }

    /// Give up (die of the signal) after this many consecutive incarnations
    /// each failing within the crash-loop window (default 5; zero keeps it).
    pub fn max_fast_failures(mut self, n: u32) -> Options {
        self.raw.max_fast_failures = n;
        self
    }

    /// Initialises the runtime with these options; see [`init`].
    pub fn init(&self) -> Result<Start> {
        if STATE
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(Error::AlreadyInitialized);
        }
        let r = init_inner(&self.raw);
        STATE.store(if r.is_ok() { 2 } else { 0 }, Ordering::Release);
        r
    }
}

/// The number of threads of this process, from `/proc/self/task`.
fn thread_count() -> Result<usize> {
    let dir = std::fs::read_dir("/proc/self/task").map_err(|source| Error::Os {
        op: "read /proc/self/task",
        source,
    })?;
    Ok(dir.count())
}

fn init_inner(opts: &ffi::rk_options) -> Result<Start> {
    // rk_init edits the environment (unsetenv): sound only while no other
    // thread can read it.
    let threads = thread_count()?;
    if threads != 1 {
        return Err(Error::ThreadsRunning(threads));
    }
    let args: Vec<CString> = std::env::args_os().map(os_to_cstring).collect();
    let mut argv: Vec<*mut core::ffi::c_char> =
        args.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(core::ptr::null_mut());
    let argc = i32::try_from(args.len()).map_err(|_| Error::SizeOverflow)?;
    // SAFETY: argv is a NULL-terminated array of NUL-terminated strings that
    // outlive the call (rk_init copies them); opts is a valid rk_options; no
    // other thread runs (checked above).
    let r = unsafe { ffi::rk_init(argc, argv.as_mut_ptr(), opts) };
    if r == -libc_errno::EALREADY {
        return Err(Error::AlreadyInitialized);
    }
    check("rk_init", r)?;
    // SAFETY: valid after a successful rk_init, for the life of the process.
    let info = unsafe { &*ffi::rk_restart_info() };
    // SAFETY: plain query.
    let recovering = unsafe { ffi::rk_is_recovery() };
    Ok(Start::from_info(info, recovering))
}

/// errno values the binding compares with (Linux).
pub(crate) mod libc_errno {
    pub const ENOMEM: i32 = 12;
    pub const EINVAL: i32 = 22;
    pub const ENOSPC: i32 = 28;
    pub const EALREADY: i32 = 114;
}

/// An argument as a C string; an argument cannot hold a NUL, but should one
/// appear it is cut there rather than failing the start.
fn os_to_cstring(s: OsString) -> CString {
    let mut bytes = s.into_vec();
    if let Some(n) = bytes.iter().position(|&b| b == 0) {
        bytes.truncate(n);
    }
    CString::new(bytes).unwrap_or_default()
}

/// A message for the runtime (a restart reason), cut at the first NUL.
pub(crate) fn message_cstring(s: &str) -> CString {
    os_to_cstring(OsString::from(s))
}

fn c_chars_to_string(chars: &[core::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Initialises the runtime: call it first thing in `main`, before any
/// thread starts (it refuses with [`Error::ThreadsRunning`] otherwise).
///
/// It records argv and the environment for restarts, installs the handlers
/// of fatal signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: a fault then
/// restarts the process from `main`), and in a restarted incarnation maps
/// the inherited arenas again. Once per process: a second call returns
/// [`Error::AlreadyInitialized`].
///
/// Rust panics are not signals: build with `panic = "abort"`, or call
/// [`abort_on_panic`], so that a panic raises SIGABRT, which the runtime
/// catches like a fault. Otherwise a panic ends only its thread, or, out of
/// `main`, the process with exit code 101 (under `rekindle run` that is a
/// failure too, and the app is respawned).
pub fn init() -> Result<Start> {
    Options::new().init()
}

/// Makes every panic abort the process (SIGABRT) after the panic message
/// is printed, whatever the build's `panic` setting: the runtime then
/// restarts the process as from any fault. A panic inside a
/// [`Region`](crate::Region) aborts with the region open, so that restart
/// is cold.
///
/// `panic = "abort"` in the binary's profile does the same, but cargo
/// ignores it in some builds (tests, and examples built by `cargo test`);
/// call this after [`init`] to be sure. It replaces the panic hook (and
/// calls the previous one first).
pub fn abort_on_panic() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        std::process::abort();
    }));
}

/// How this incarnation started, from [`init`].
#[derive(Debug)]
pub struct Start {
    /// Fresh, warm or cold.
    pub kind: StartKind,
    /// 0 for the first incarnation, then one more at each restart.
    pub generation: u32,
    /// The signal that ended the previous incarnation, if one did.
    pub signal: Option<i32>,
    /// The faulting address of that signal (`si_addr`), 0 if none.
    pub fault_addr: u64,
    /// Why the previous incarnation ended (empty on a fresh start).
    pub reason: String,
    /// Why this start is warm or cold.
    pub decision: String,
    /// The same as a stable number (`enum rk_reason` in rekindle.h: 1 all
    /// checks passed, 11 an unsafe region was open, ...; 0 on a fresh start).
    pub decision_code: u32,
    /// From the previous incarnation's restart to this `init`'s return.
    pub restart_time: Duration,
    /// Bytes in use in the arenas this incarnation inherited.
    pub preserved_bytes: u64,
    /// `RK_PRESERVED` sections restored (C statics; none from Rust).
    pub statics_restored: u32,
    /// Half-changed independent arenas that were not reused.
    pub arenas_dropped: u32,
    /// A warm start restored from a durable snapshot: the snapshot's id.
    pub snapshot: Option<String>,
    /// `Some` on a warm start: mark what the app still reaches, then
    /// [`Recovery::finish`] or [`Recovery::sweep`]. Take it with
    /// `start.recovery.take()`.
    pub recovery: Option<Recovery>,
}

impl Start {
    fn from_info(info: &ffi::rk_restart_info, recovering: bool) -> Start {
        let kind = match info.kind {
            ffi::RK_START_FRESH => StartKind::Fresh,
            ffi::RK_START_WARM => StartKind::Warm,
            _ => StartKind::Cold,
        };
        Start {
            kind,
            generation: info.generation,
            signal: (info.signal != 0).then_some(info.signal),
            fault_addr: info.fault_addr,
            reason: c_chars_to_string(&info.reason),
            decision: c_chars_to_string(&info.decision),
            decision_code: info.decision_code,
            restart_time: Duration::from_nanos(info.restart_ns),
            preserved_bytes: info.preserved_bytes,
            statics_restored: info.statics_restored,
            arenas_dropped: info.arenas_dropped,
            snapshot: Some(c_chars_to_string(&info.snapshot)).filter(|s| !s.is_empty()),
            recovery: recovering.then_some(Recovery {
                _not_send: PhantomData,
            }),
        }
    }

    /// True for a warm start.
    pub fn is_warm(&self) -> bool {
        self.kind == StartKind::Warm
    }
}

/// What [`Recovery::sweep`] freed and kept, over all arenas.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepStats {
    /// Objects nothing marked: freed.
    pub objects_freed: u64,
    /// Their bytes.
    pub bytes_freed: u64,
    /// Objects marked (or allocated during recovery): kept.
    pub objects_kept: u64,
    /// Their bytes.
    pub bytes_kept: u64,
}

/// The recovery of a warm start: between [`init`] and [`Recovery::finish`]
/// (or [`Recovery::sweep`]), the app marks the objects it still reaches so
/// that a sweep can free the rest (the objects of the requests that were in
/// flight at the failure).
///
/// Finish it before other threads allocate in the arenas. Arenas the new
/// incarnation has not opened again by then are dropped. Dropping a
/// `Recovery` without finishing leaves recovery open: the runtime keeps
/// reporting "recovering" and unopened arenas stay allocated.
#[must_use = "a warm start's recovery must be finished (Recovery::finish or Recovery::sweep)"]
#[derive(Debug)]
pub struct Recovery {
    _not_send: PhantomData<*const ()>,
}

impl Recovery {
    /// Marks the object `p` points to as reachable, for [`sweep`](Self::sweep).
    /// Objects allocated during recovery are born marked. Returns whether
    /// it was newly marked. Children are not followed: mark each object
    /// (and each [`PVec`](crate::PVec) buffer, with
    /// [`PVec::mark`](crate::PVec::mark)) the app still reaches.
    pub fn mark<T: Preservable>(&self, arena: Arena, p: Preserved<T>) -> Result<bool> {
        self.mark_addr(arena, p.addr())
    }

    pub(crate) fn mark_addr(&self, arena: Arena, addr: usize) -> Result<bool> {
        // SAFETY: rk_mark only looks the address up in the arena's page map;
        // any value is accepted (-EINVAL if it is no object).
        let r = unsafe { ffi::rk_mark(arena.as_raw(), addr as *const core::ffi::c_void) };
        check("rk_mark", r).map(|n| n == 1)
    }

    /// Ends recovery without a sweep: objects left over from requests in
    /// flight at the failure stay allocated (leaked). O(1) when nothing was
    /// marked, whatever the arenas' size. Calling it again after it
    /// succeeded does nothing.
    pub fn finish(&mut self) -> Result<()> {
        // SAFETY: stats may be NULL.
        check("rk_finish_recovery", unsafe {
            ffi::rk_finish_recovery(false, core::ptr::null_mut())
        })
        .map(|_| ())
    }

    /// Ends recovery with a sweep: every arena object not marked since
    /// [`init`] is freed. The objects of every root set through
    /// [`Arena::set_root`] (and the binding's own root records) are marked
    /// first, so no root is left dangling; everything else the app reaches
    /// must have been marked with [`mark`](Self::mark).
    ///
    /// # Safety
    ///
    /// After the sweep, every [`Preserved`] handle and [`PVec`](crate::PVec)
    /// the app still uses, whether held in a variable or stored in a
    /// preserved object, must point to an object that was marked, set as a
    /// root, or allocated since [`init`]. A handle to a swept object dangles
    /// like a pointer after `free`, and reading through it is undefined
    /// behaviour.
    pub unsafe fn sweep(&mut self) -> Result<SweepStats> {
        arena::mark_typed_roots(self)?;
        let mut st = ffi::rk_sweep_stats::default();
        // SAFETY: st is a valid out-parameter.
        check("rk_finish_recovery", unsafe {
            ffi::rk_finish_recovery(true, &mut st)
        })?;
        Ok(SweepStats {
            objects_freed: st.objects_freed,
            bytes_freed: st.bytes_freed,
            objects_kept: st.objects_kept,
            bytes_kept: st.bytes_kept,
        })
    }
}

/// True on a warm start whose recovery is not finished yet.
pub fn is_recovery() -> bool {
    // SAFETY: plain query, valid before init too.
    unsafe { ffi::rk_is_recovery() }
}

/// Restarts now, warm if every check passes, cold otherwise; the new
/// incarnation starts again from `main` with the same arguments. Returns
/// only if the restart failed, with why.
///
/// A restart asked for while this thread (or another) has an
/// [`Region`](crate::Region) open goes cold: the state may be half-changed.
pub fn restart(reason: &str) -> Error {
    if !is_initialized() {
        return Error::NotInitialized("rekindle::restart");
    }
    let r = message_cstring(reason);
    // SAFETY: r is NUL-terminated; rk_restart returns only on failure.
    let rc = unsafe { ffi::rk_restart(r.as_ptr()) };
    Error::from_neg_errno("rk_restart", rc)
}

/// Restarts now and drops all preserved state (the new incarnation starts
/// cold). Returns only if the restart failed, with why.
pub fn restart_cold(reason: &str) -> Error {
    if !is_initialized() {
        return Error::NotInitialized("rekindle::restart_cold");
    }
    let r = message_cstring(reason);
    // SAFETY: as in restart.
    let rc = unsafe { ffi::rk_restart_cold(r.as_ptr()) };
    Error::from_neg_errno("rk_restart_cold", rc)
}

/// Faults every preserved page in now, or with `background` in a detached
/// thread, so that the first requests after a warm restart do not pay for
/// minor faults.
pub fn prefault(background: bool) -> Result<()> {
    if !is_initialized() {
        return Err(Error::NotInitialized("rekindle::prefault"));
    }
    // SAFETY: valid after init.
    check("rk_prefault", unsafe { ffi::rk_prefault(background) }).map(|_| ())
}

/// True when running under `rekindle run`: the supervisor holds the arenas'
/// fds, so even a SIGKILL loses no preserved state.
pub fn is_supervised() -> bool {
    // SAFETY: plain query.
    unsafe { ffi::rk_is_supervised() }
}

/// Call from the main loop at a safe point, with no preserved structure
/// half-changed (no [`Region`](crate::Region) open in this thread). Under
/// `rekindle run --hang-timeout`, heartbeats that stop mark a hang, and a
/// restart the supervisor asks for is taken here. Cheap; a no-op before
/// [`init`].
pub fn heartbeat() {
    // SAFETY: checks its own state; a no-op before init.
    unsafe { ffi::rk_heartbeat() }
}

/// How long the app may block (in `epoll_wait`, `poll`, a channel receive)
/// between two [`heartbeat`]s before the supervisor takes it for hung: a
/// third of `--hang-timeout`, or `None` when there is no hang timeout
/// (block as long as you like). Use it as an idle server's wait timeout.
pub fn heartbeat_interval() -> Option<std::time::Duration> {
    // SAFETY: reads the runtime's parsed settings; -1 before init.
    let ms = unsafe { ffi::rk_heartbeat_interval_ms() };
    u64::try_from(ms).ok().map(std::time::Duration::from_millis)
}

/// Durable snapshots (`rekindle run --snapshot-dir`): the number of this
/// process's next snapshot cut. A write made in a [`Region`](crate::Region)
/// that has ended is in that cut or an earlier one: hold a reply that
/// depends on it until [`durable_epoch`] reaches this value. 0 without
/// snapshots.
pub fn epoch() -> u64 {
    // SAFETY: an atomic load, 0 when snapshots are off.
    unsafe { ffi::rk_epoch() }
}

/// The newest cut whose snapshot is on disk (synced). 0 without snapshots.
pub fn durable_epoch() -> u64 {
    // SAFETY: as above.
    unsafe { ffi::rk_durable_epoch() }
}

/// An eventfd that becomes readable when [`durable_epoch`] advances (read
/// 8 bytes to clear it); `None` without snapshots.
pub fn durable_fd() -> Option<std::os::fd::BorrowedFd<'static>> {
    // SAFETY: the runtime owns the eventfd for the life of the process.
    let fd = unsafe { ffi::rk_durable_fd() };
    // SAFETY: a valid fd that stays open (never closed by the runtime).
    (fd >= 0).then(|| unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
}

/// Asks for a snapshot as soon as possible and returns at once; requests
/// made while one is being taken share the next (group commit). An
/// [`Error::Os`] with `ENOTSUP` without snapshots: nothing would be durable.
pub fn checkpoint() -> Result<()> {
    // SAFETY: writes to the runtime's eventfd, or returns -ENOTSUP.
    check("rk_checkpoint", unsafe { ffi::rk_checkpoint() }).map(|_| ())
}

/// Tells the supervisor that the app serves again (after recovery); it
/// times restarts up to this point.
pub fn ready() -> Result<()> {
    if !is_initialized() {
        return Err(Error::NotInitialized("rekindle::ready"));
    }
    // SAFETY: valid after init.
    check("rk_ready", unsafe { ffi::rk_ready() }).map(|_| ())
}

/// With `false`, vetoes warm restarts: any failure restarts cold, until
/// `set_warm_allowed(true)` or the end of this incarnation (for example
/// during a migration of the app's own data).
pub fn set_warm_allowed(allowed: bool) {
    // SAFETY: a no-op before init.
    unsafe { ffi::rk_set_warm_allowed(allowed) }
}

/// A C string for a name the runtime takes (arena or root): at most
/// [`ffi::RK_NAME_MAX`] bytes, no NUL.
pub(crate) fn name_cstring(name: &str) -> Result<CString> {
    let bad = |why| Error::InvalidName {
        name: name.to_owned(),
        why,
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > ffi::RK_NAME_MAX {
        return Err(bad("longer than 47 bytes"));
    }
    CString::new(name).map_err(|_| bad("holds a NUL byte"))
}
