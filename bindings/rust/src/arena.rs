//! Arenas, reading them ([`View`]), changing them ([`Region`]), and typed
//! roots.
//!
//! Readers and writers of one arena are kept apart by a reader-writer lock
//! per arena, held by [`View`] (shared) and [`Region`] (exclusive, and an
//! unsafe region of the runtime for as long as it lives). So a `&T` from a
//! view and a `&mut T` from a region never exist at once, in any thread.
use core::ffi::c_void;
use core::marker::PhantomData;
use core::mem::{align_of, needs_drop, size_of};
use core::ops::BitOr;
use core::ptr::NonNull;
use std::cell::RefCell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Error, Result, check};
use crate::ffi;
use crate::lifecycle::{self, Recovery, libc_errno};
use crate::preserved::{Preservable, Preserved};

/// Flags for [`Arena::open_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaFlags(u32);

impl ArenaFlags {
    /// No flags: a failure with a region of this arena open restarts cold.
    pub const NONE: ArenaFlags = ArenaFlags(0);
    /// A component of its own: a failure that finds it half-changed drops
    /// only this arena (it comes back empty, [`Arena::preserved`] false)
    /// and the rest stays warm. Its objects must not point into other
    /// arenas nor be pointed to from them ([`Preservable`] rule 2). A
    /// handle into a dropped arena is caught where it is used (a dropped
    /// arena's addresses are never mapped again): views panic.
    pub const INDEPENDENT: ArenaFlags = ArenaFlags(ffi::RK_ARENA_INDEPENDENT);
    /// Writable only inside regions (memory protection keys), so a stray
    /// write faults at once. Open it before starting threads: threads
    /// started earlier cannot even read it outside regions. Without pkeys
    /// it is unprotected ([`Arena::write_protected`] says which).
    pub const WRITE_PROTECT: ArenaFlags = ArenaFlags(ffi::RK_ARENA_WRITE_PROTECT);
}

impl BitOr for ArenaFlags {
    type Output = ArenaFlags;
    fn bitor(self, rhs: ArenaFlags) -> ArenaFlags {
        ArenaFlags(self.0 | rhs.0)
    }
}

/// An arena's sizes, from [`Arena::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaStats {
    /// Its fixed virtual address.
    pub base: u64,
    /// Address space reserved for it.
    pub max_bytes: u64,
    /// Size of its backing memfd (grows on demand).
    pub mapped_bytes: u64,
    /// Bytes of heap carved so far.
    pub heap_bytes: u64,
    /// Bytes handed out and not freed (rounded up to size classes).
    pub allocated_bytes: u64,
}

/// A preserved arena: memory at a fixed address that a warm restart hands
/// to the next incarnation as it was. The handle is `Copy` and `'static`:
/// arenas live as long as the process.
#[derive(Clone, Copy)]
pub struct Arena {
    raw: NonNull<ffi::rk_arena>,
    name: &'static str,
    base: usize,
    end: usize,
    slot: usize,
}

// SAFETY: the runtime's arena objects are process-global and thread-safe;
// access to the objects inside is synchronised by the per-arena lock.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl core::fmt::Debug for Arena {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Arena")
            .field("name", &self.name)
            .field("base", &format_args!("{:#x}", self.base))
            .field("max_bytes", &(self.end - self.base))
            .finish()
    }
}

/// One lock per arena slot: readers (View) and writers (Region).
static LOCKS: [RwLock<()>; ffi::RK_MAX_ARENAS] = [const { RwLock::new(()) }; ffi::RK_MAX_ARENAS];
/// The arenas opened through the binding, by slot.
static OPENED: Mutex<Vec<Arena>> = Mutex::new(Vec::new());
/// Serialises the binding's root records (the type table).
static ROOTS: Mutex<()> = Mutex::new(());

impl Arena {
    /// Opens the arena called `name`, reserving `max_bytes` of address
    /// space (memory is used as it is allocated). After a warm restart this
    /// finds the arena of the previous incarnation, with its contents.
    /// Names are 1 to 47 bytes of `[A-Za-z0-9_.-]`. Opening the same name
    /// again returns the same arena.
    pub fn open(name: &str, max_bytes: usize) -> Result<Arena> {
        Arena::open_with(name, max_bytes, ArenaFlags::NONE)
    }

    /// [`open`](Self::open) with [`ArenaFlags`].
    pub fn open_with(name: &str, max_bytes: usize, flags: ArenaFlags) -> Result<Arena> {
        if !lifecycle::is_initialized() {
            return Err(Error::NotInitialized("Arena::open"));
        }
        if !name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'.')
        {
            return Err(Error::InvalidName {
                name: name.to_owned(),
                why: "arena names are made of A-Z a-z 0-9 _ - .",
            });
        }
        let cname = lifecycle::name_cstring(name)?;
        let mut opened = OPENED.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: cname is NUL-terminated; the runtime validates the rest.
        let raw = unsafe { ffi::rk_arena_open_flags(cname.as_ptr(), max_bytes, flags.0) };
        let Some(raw) = NonNull::new(raw) else {
            return Err(Error::last_os("rk_arena_open"));
        };
        let mut st = ffi::rk_arena_stats::default();
        // SAFETY: raw is a live arena, st a valid out-parameter.
        check("rk_arena_stats", unsafe {
            ffi::rk_arena_stats(raw.as_ptr(), &mut st)
        })?;
        let base = usize::try_from(st.base).map_err(|_| Error::SizeOverflow)?;
        let max = usize::try_from(st.max_bytes).map_err(|_| Error::SizeOverflow)?;
        if let Some(a) = opened.iter().find(|a| a.raw == raw && a.base == base) {
            return Ok(*a);
        }
        let slot = opened.len();
        if slot >= ffi::RK_MAX_ARENAS {
            return Err(Error::from_neg_errno("rk_arena_open", -libc_errno::ENOSPC));
        }
        let a = Arena {
            raw,
            name: Box::leak(name.to_owned().into_boxed_str()),
            base,
            end: base.checked_add(max).ok_or(Error::SizeOverflow)?,
            slot,
        };
        RANGES[slot].0.store(a.base, Ordering::Relaxed);
        RANGES[slot].1.store(a.end, Ordering::Release);
        opened.push(a);
        Ok(a)
    }

    /// The arena's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// True when the contents come from the previous incarnation; false for
    /// a new arena, after a cold start, or when it was dropped at the
    /// failure (it then starts empty).
    pub fn preserved(&self) -> bool {
        // SAFETY: live arena.
        unsafe { ffi::rk_arena_preserved(self.raw.as_ptr()) }
    }

    /// True when the arena really is write-protected (pkeys available).
    pub fn write_protected(&self) -> bool {
        // SAFETY: live arena.
        unsafe { ffi::rk_arena_write_protected(self.raw.as_ptr()) }
    }

    /// The arena's sizes now.
    pub fn stats(&self) -> Result<ArenaStats> {
        let mut st = ffi::rk_arena_stats::default();
        // SAFETY: live arena, valid out-parameter.
        check("rk_arena_stats", unsafe {
            ffi::rk_arena_stats(self.raw.as_ptr(), &mut st)
        })?;
        Ok(ArenaStats {
            base: st.base,
            max_bytes: st.max_bytes,
            mapped_bytes: st.mapped_bytes,
            heap_bytes: st.heap_bytes,
            allocated_bytes: st.allocated_bytes,
        })
    }

    /// True when the handle's object lies inside this arena.
    pub fn contains<T>(&self, p: Preserved<T>) -> bool {
        self.contains_range(p.addr(), size_of::<T>())
    }

    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    pub(crate) fn contains_range(&self, addr: usize, len: usize) -> bool {
        addr >= self.base && addr.checked_add(len).is_some_and(|e| e <= self.end)
    }

    /// The runtime's `rk_arena *`, for C code.
    pub fn as_raw(&self) -> *mut ffi::rk_arena {
        self.raw.as_ptr()
    }

    /// Moves `value` into a new object in the arena and returns its handle.
    /// Needs no region: the object is new, and nothing reaches it until the
    /// app stores the handle (inside a region). During recovery the object
    /// is born marked.
    ///
    /// `T` must not need dropping and must not be aligned to more than 16
    /// bytes (both checked at compile time).
    pub fn alloc<T: Preservable>(&self, value: T) -> Result<Preserved<T>> {
        const {
            assert!(!needs_drop::<T>(), "preserved types must not need dropping");
            assert!(
                align_of::<T>() <= 16,
                "preserved types are aligned to 16 bytes at most"
            );
        }
        let size = size_of::<T>().max(1);
        let p = self.raw_alloc(size)?.cast::<T>();
        if !(p.as_ptr() as usize).is_multiple_of(align_of::<T>()) {
            // SAFETY: p was just allocated in this arena.
            unsafe { ffi::rk_free(self.raw.as_ptr(), p.as_ptr().cast()) };
            return Err(Error::from_neg_errno(
                "rk_alloc (alignment)",
                -libc_errno::EINVAL,
            ));
        }
        // SAFETY: p is a fresh, aligned block of at least size_of::<T>()
        // bytes that nothing else references; the region covers the write
        // for write-protected arenas.
        unsafe {
            ffi::rk_unsafe_begin(self.raw.as_ptr());
            p.as_ptr().write(value);
            ffi::rk_unsafe_end(self.raw.as_ptr());
        }
        Ok(Preserved::from_nonnull(p))
    }

    pub(crate) fn raw_alloc(&self, size: usize) -> Result<NonNull<u8>> {
        // SAFETY: live arena; any size is accepted (NULL on failure).
        let p = unsafe { ffi::rk_alloc(self.raw.as_ptr(), size) };
        NonNull::new(p.cast::<u8>()).ok_or_else(|| self.alloc_error(size))
    }

    pub(crate) fn alloc_error(&self, bytes: usize) -> Error {
        let e = Error::last_os("rk_alloc");
        if e.raw_os_error() == Some(libc_errno::ENOMEM) {
            Error::OutOfMemory {
                arena: self.name,
                bytes,
            }
        } else {
            e
        }
    }

    /// Read access to the arena's objects, shared with other readers; a
    /// [`Region`] (a writer) waits until every view is gone. Views of one
    /// arena nest freely in a thread (they share the thread's read lock).
    ///
    /// # Panics
    ///
    /// If this thread has a [`Region`] of the arena open (read through
    /// [`Region::get`] instead): a view beside it would alias the region's
    /// `&mut` (and the lock would wait for itself).
    pub fn view(&self) -> View {
        let slot = self.slot;
        HELD.with_borrow_mut(|held| {
            let h = &mut held[slot];
            assert!(
                !h.region,
                "arena {:?}: this thread has a Region open; read through Region::get",
                self.name
            );
            if h.views == 0 {
                h.read = Some(LOCKS[slot].read().unwrap_or_else(PoisonError::into_inner));
            }
            h.views += 1;
        });
        View {
            arena: *self,
            _not_send: PhantomData,
        }
    }

    /// Opens an unsafe region: exclusive write access to the arena's
    /// objects, and the runtime's promise-keeping around it. If the process
    /// fails while a region is open (in any thread), the arena may be
    /// half-changed and is not reused: the restart goes cold (or, for an
    /// [`ArenaFlags::INDEPENDENT`] arena, only this arena is dropped). Keep
    /// regions short, and open each change of preserved state in one.
    /// Waits until no other thread holds a view or region of the arena.
    ///
    /// The region ends when the guard is dropped. If a panic unwinds
    /// through it, the change may be half-done: the guard then vetoes warm
    /// restarts for the rest of this incarnation
    /// ([`set_warm_allowed(false)`](crate::set_warm_allowed)) before it
    /// ends the region.
    ///
    /// # Panics
    ///
    /// If this thread already holds a [`View`] or a [`Region`] of the arena
    /// (use that region; drop the views first).
    pub fn unsafe_region(&self) -> Region {
        let slot = self.slot;
        HELD.with_borrow_mut(|held| {
            let h = &mut held[slot];
            assert!(
                !h.region,
                "arena {:?}: this thread already has a Region open; use it",
                self.name
            );
            assert!(
                h.views == 0,
                "arena {:?}: this thread holds a View; drop it before opening a Region",
                self.name
            );
            h.region = true;
        });
        let lock = LOCKS[slot].write().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: live arena; the matching end is in Region's Drop.
        unsafe { ffi::rk_unsafe_begin(self.raw.as_ptr()) };
        Region {
            arena: *self,
            _lock: lock,
        }
    }

    /// Runs `f` with a [`View`].
    pub fn read<R>(&self, f: impl FnOnce(&View) -> R) -> R {
        f(&self.view())
    }

    /// Runs `f` inside an unsafe region ([`unsafe_region`](Self::unsafe_region)).
    pub fn modify<R>(&self, f: impl FnOnce(&mut Region) -> R) -> R {
        f(&mut self.unsafe_region())
    }

    /// Names `p` as the root `name`, the way the next incarnation finds it.
    /// The root records `T` (a tag of its name, size and alignment), and
    /// [`root`](Self::root) refuses to return it as another type. Setting
    /// an existing root replaces it (the old object is not freed).
    ///
    /// Names are 1 to 47 bytes; names starting with `rekindle-rs.` are
    /// the binding's own. At most 63 roots per arena.
    pub fn set_root<T: Preservable>(&self, name: &str, p: Preserved<T>) -> Result<()> {
        let cname = root_name(name)?;
        if !self.contains(p) {
            return Err(Error::ForeignHandle("the root's handle", self.name));
        }
        let _g = ROOTS.lock().unwrap_or_else(PoisonError::into_inner);
        let table = self.type_table(true)?;
        let mut key = [0u8; ENTRY_NAME];
        key[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: table is the binding's live table object in this arena,
        // only touched under ROOTS; the region makes a failure in the
        // middle (record written, root not yet) restart cold.
        unsafe {
            ffi::rk_unsafe_begin(self.raw.as_ptr());
            let t = &mut *table;
            let slot = t
                .entries
                .iter()
                .position(|e| e.name == key)
                .or_else(|| t.entries.iter().position(|e| e.name[0] == 0));
            let r = match slot {
                None => -libc_errno::ENOSPC,
                Some(i) => {
                    t.entries[i] = TypeEntry {
                        name: key,
                        tag: type_tag::<T>(),
                        size: size_of::<T>() as u64,
                    };
                    ffi::rk_root_set(self.raw.as_ptr(), cname.as_ptr(), p.as_ptr().cast())
                }
            };
            ffi::rk_unsafe_end(self.raw.as_ptr());
            check("rk_root_set", r).map(|_| ())
        }
    }

    /// Removes the root `name` (its object is not freed). Removing a root
    /// that does not exist is not an error.
    pub fn remove_root(&self, name: &str) -> Result<()> {
        let cname = root_name(name)?;
        let _g = ROOTS.lock().unwrap_or_else(PoisonError::into_inner);
        let table = self.type_table(false)?;
        // SAFETY: as in set_root.
        unsafe {
            ffi::rk_unsafe_begin(self.raw.as_ptr());
            let r = ffi::rk_root_set(self.raw.as_ptr(), cname.as_ptr(), core::ptr::null_mut());
            if !table.is_null() {
                for e in (*table).entries.iter_mut() {
                    if entry_name(e) == Some(name) {
                        *e = TypeEntry::EMPTY;
                    }
                }
            }
            ffi::rk_unsafe_end(self.raw.as_ptr());
            check("rk_root_set", r).map(|_| ())
        }
    }

    /// The root `name` as a `Preserved<T>`: `Ok(None)` if there is no such
    /// root, [`Error::RootType`] if it was set with another type,
    /// [`Error::UntypedRoot`] if it was set outside the binding.
    ///
    /// The type check compares a tag of `T`'s name, size and alignment with
    /// the one recorded by [`set_root`](Self::set_root). The tag cannot
    /// see a change of field order or meaning: the rest of the type is the
    /// caller's promise (see [`Preservable`], rule 4).
    pub fn root<T: Preservable>(&self, name: &str) -> Result<Option<Preserved<T>>> {
        let cname = root_name(name)?;
        let _g = ROOTS.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: live arena, NUL-terminated name.
        let p = unsafe { ffi::rk_root_get(self.raw.as_ptr(), cname.as_ptr()) };
        if p.is_null() {
            return Ok(None);
        }
        let table = self.type_table(false)?;
        // SAFETY: the table is valid when non-null (checked by type_table).
        let entry = (!table.is_null())
            .then(|| unsafe {
                (*table)
                    .entries
                    .iter()
                    .find(|e| entry_name(e) == Some(name))
                    .copied()
            })
            .flatten();
        let Some(entry) = entry else {
            return Err(Error::UntypedRoot(name.to_owned()));
        };
        if entry.tag != type_tag::<T>() || entry.size != size_of::<T>() as u64 {
            return Err(Error::RootType {
                name: name.to_owned(),
                expected: core::any::type_name::<T>(),
                expected_size: size_of::<T>(),
                found_size: usize::try_from(entry.size).unwrap_or(usize::MAX),
            });
        }
        let addr = p as usize;
        if !addr.is_multiple_of(align_of::<T>()) || !self.contains_range(addr, size_of::<T>()) {
            return Err(Error::ForeignHandle("the root's pointer", self.name));
        }
        // SAFETY: the root was set by set_root::<T> (same tag and size) to an
        // object of this arena, aligned and in range.
        Ok(unsafe { Preserved::from_raw(p.cast::<T>()) })
    }

    /// The binding's type table of this arena, created if `create`; NULL if
    /// there is none (or it is not a valid table). Called under ROOTS.
    fn type_table(&self, create: bool) -> Result<*mut TypeTable> {
        // SAFETY: live arena, NUL-terminated name.
        let p =
            unsafe { ffi::rk_root_get(self.raw.as_ptr(), TYPES_ROOT.as_ptr()) }.cast::<TypeTable>();
        let addr = p as usize;
        if !p.is_null()
            && addr.is_multiple_of(align_of::<TypeTable>())
            && self.contains_range(addr, size_of::<TypeTable>())
            // SAFETY: in range and aligned; only the binding writes there.
            && unsafe { (*p).magic } == TYPES_MAGIC
        {
            return Ok(p);
        }
        if !create {
            return Ok(core::ptr::null_mut());
        }
        let t = self.alloc(TypeTable {
            magic: TYPES_MAGIC,
            entries: [TypeEntry::EMPTY; MAX_TYPED_ROOTS],
        })?;
        // SAFETY: t is in this arena; the name is the binding's own.
        let r = unsafe {
            ffi::rk_unsafe_begin(self.raw.as_ptr());
            let r = ffi::rk_root_set(self.raw.as_ptr(), TYPES_ROOT.as_ptr(), t.as_ptr().cast());
            ffi::rk_unsafe_end(self.raw.as_ptr());
            r
        };
        check("rk_root_set", r)?;
        Ok(t.as_ptr())
    }

    /// Marks the type table and every typed root's object (before a sweep).
    fn mark_roots(&self, rec: &Recovery) -> Result<()> {
        let table = self.type_table(false)?;
        if table.is_null() {
            return Ok(());
        }
        rec.mark_addr(*self, table as usize)?;
        // SAFETY: valid table (type_table checked it).
        let entries = unsafe { (*table).entries };
        for e in entries.iter() {
            let Some(name) = entry_name(e) else { continue };
            let Ok(cname) = root_name(name) else { continue };
            // SAFETY: live arena, NUL-terminated name.
            let p = unsafe { ffi::rk_root_get(self.raw.as_ptr(), cname.as_ptr()) };
            if !p.is_null() {
                // a root C code pointed inside an object: nothing to mark
                let _ = rec.mark_addr(*self, p as usize);
            }
        }
        Ok(())
    }
}

/// The address ranges of the arenas opened through the binding, by slot,
/// readable without a lock: `(base, end)`, `end` 0 for an unused slot.
/// Slots fill in order and are never reused; the runtime never maps an
/// arena again at the range of one it dropped, so an address in no range
/// here is no live object.
static RANGES: [(AtomicUsize, AtomicUsize); ffi::RK_MAX_ARENAS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; ffi::RK_MAX_ARENAS];

/// The slot of the arena that holds `[addr, addr + len)`, if any.
pub(crate) fn slot_of(addr: usize, len: usize) -> Option<usize> {
    let last = addr.checked_add(len)?;
    for (slot, (base, end)) in RANGES.iter().enumerate() {
        let e = end.load(Ordering::Acquire);
        if e == 0 {
            break;
        }
        if addr >= base.load(Ordering::Relaxed) && last <= e {
            return Some(slot);
        }
    }
    None
}

/// Before a sweep: marks every arena's typed roots and type table.
pub(crate) fn mark_typed_roots(rec: &Recovery) -> Result<()> {
    let arenas: Vec<Arena> = OPENED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let _g = ROOTS.lock().unwrap_or_else(PoisonError::into_inner);
    for a in arenas {
        a.mark_roots(rec)?;
    }
    Ok(())
}

/// The root under which the binding keeps an arena's type table.
const TYPES_ROOT: &CStr = c"rekindle-rs.types";
const RESERVED_PREFIX: &str = "rekindle-rs.";
const TYPES_MAGIC: u64 = u64::from_le_bytes(*b"rkrsTYP1");
/// 64 roots per arena in the runtime, one of them the table's.
const MAX_TYPED_ROOTS: usize = 63;
const ENTRY_NAME: usize = ffi::RK_NAME_MAX + 1;

/// The binding's record of which type each root holds (one per arena,
/// itself an arena object under the root `rekindle-rs.types`).
#[repr(C)]
#[derive(Clone, Copy)]
struct TypeTable {
    magic: u64,
    entries: [TypeEntry; MAX_TYPED_ROOTS],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct TypeEntry {
    name: [u8; ENTRY_NAME],
    tag: u64,
    size: u64,
}

impl TypeEntry {
    const EMPTY: TypeEntry = TypeEntry {
        name: [0; ENTRY_NAME],
        tag: 0,
        size: 0,
    };
}

// SAFETY: plain data.
unsafe impl Preservable for TypeTable {}

fn entry_name(e: &TypeEntry) -> Option<&str> {
    let n = e.name.iter().position(|&b| b == 0).unwrap_or(e.name.len());
    if n == 0 {
        return None;
    }
    core::str::from_utf8(&e.name[..n]).ok()
}

fn root_name(name: &str) -> Result<std::ffi::CString> {
    if name.starts_with(RESERVED_PREFIX) {
        return Err(Error::InvalidName {
            name: name.to_owned(),
            why: "names starting with rekindle-rs. are the binding's own",
        });
    }
    lifecycle::name_cstring(name)
}

/// FNV-1a of the type's name, size and alignment: what a root records.
pub(crate) fn type_tag<T>() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(core::any::type_name::<T>().as_bytes());
    eat(&(size_of::<T>() as u64).to_le_bytes());
    eat(&(align_of::<T>() as u64).to_le_bytes());
    h
}

/// What one thread holds of each arena's lock.
struct Held {
    /// Views alive in this thread; the read guard lives while any does.
    views: usize,
    read: Option<RwLockReadGuard<'static, ()>>,
    /// A Region is open in this thread.
    region: bool,
}

thread_local! {
    static HELD: RefCell<[Held; ffi::RK_MAX_ARENAS]> = const {
        RefCell::new(
            [const {
                Held {
                    views: 0,
                    read: None,
                    region: false,
                }
            }; ffi::RK_MAX_ARENAS],
        )
    };
}

/// Shared read access to one arena's objects (see [`Arena::view`]). Not
/// `Send`: the read lock it stands for is its thread's.
pub struct View {
    arena: Arena,
    _not_send: PhantomData<*const ()>,
}

impl Drop for View {
    fn drop(&mut self) {
        let slot = self.arena.slot;
        // the last view of this thread releases the read lock (outside the
        // borrow); a thread being torn down has released it already
        let guard = HELD
            .try_with(|held| {
                let h = &mut held.borrow_mut()[slot];
                h.views = h.views.saturating_sub(1);
                if h.views == 0 { h.read.take() } else { None }
            })
            .ok()
            .flatten();
        drop(guard);
    }
}

impl View {
    /// The arena this view reads.
    pub fn arena(&self) -> Arena {
        self.arena
    }

    /// The object `p` points to.
    ///
    /// # Panics
    ///
    /// If `p` does not point into this view's arena.
    pub fn get<T: Preservable>(&self, p: Preserved<T>) -> &T {
        assert!(
            self.arena.contains(p),
            "{p:?} does not point into arena {:?}",
            self.arena.name
        );
        // SAFETY: p points to a live T in this arena (handle invariant);
        // this thread's read lock, held while any of its views lives,
        // excludes every writer (Region) of the arena.
        unsafe { &*p.as_ptr() }
    }
}

/// An open unsafe region of one arena: exclusive write access to its
/// objects (see [`Arena::unsafe_region`]). Not `Send`: a region belongs to
/// the thread that opened it.
pub struct Region {
    arena: Arena,
    _lock: RwLockWriteGuard<'static, ()>,
}

impl Region {
    /// The arena this region changes.
    pub fn arena(&self) -> Arena {
        self.arena
    }

    fn check<T>(&self, p: Preserved<T>) {
        assert!(
            self.arena.contains(p),
            "{p:?} does not point into arena {:?}",
            self.arena.name
        );
    }

    /// The object `p` points to, to read.
    ///
    /// # Panics
    ///
    /// If `p` does not point into this region's arena.
    pub fn get<T: Preservable>(&self, p: Preserved<T>) -> &T {
        self.check(p);
        // SAFETY: live T (handle invariant); the write lock is ours.
        unsafe { &*p.as_ptr() }
    }

    /// The object `p` points to, to change.
    ///
    /// # Panics
    ///
    /// If `p` does not point into this region's arena.
    pub fn get_mut<T: Preservable>(&mut self, p: Preserved<T>) -> &mut T {
        self.check(p);
        // SAFETY: live T (handle invariant); the write lock excludes every
        // other reader and writer, and &mut self every other borrow.
        unsafe { &mut *p.as_ptr() }
    }

    /// Replaces the object `p` points to with `value`.
    ///
    /// # Panics
    ///
    /// If `p` does not point into this region's arena.
    pub fn set<T: Preservable>(&mut self, p: Preserved<T>, value: T) {
        *self.get_mut(p) = value;
    }

    /// [`Arena::alloc`] in this region's arena.
    pub fn alloc<T: Preservable>(&mut self, value: T) -> Result<Preserved<T>> {
        self.arena.alloc(value)
    }

    /// Frees the object `p` points to.
    ///
    /// # Safety
    ///
    /// No copy of `p` (in a variable, a preserved object or a root) may be
    /// used afterwards: like a pointer after `free`, it dangles (remove a
    /// root that names it first). `p` must come
    /// from [`Arena::alloc`] in this arena (not a root read as a different
    /// object, not freed before).
    ///
    /// # Panics
    ///
    /// If `p` does not point into this region's arena.
    pub unsafe fn free<T: Preservable>(&mut self, p: Preserved<T>) {
        self.check(p);
        // SAFETY: the caller's promise; the object is an rk_alloc block.
        unsafe { ffi::rk_free(self.arena.raw.as_ptr(), p.as_ptr().cast::<c_void>()) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The change this region wrapped may be half done, and the
            // process goes on: it must not be handed on warm.
            lifecycle::set_warm_allowed(false);
            eprintln!(
                "rekindle: a panic unwound through an unsafe region of arena {:?}; \
                 warm restarts are vetoed for the rest of this incarnation",
                self.arena.name
            );
        }
        // SAFETY: matches the rk_unsafe_begin of Arena::unsafe_region, in the
        // same thread (Region is not Send).
        unsafe { ffi::rk_unsafe_end(self.arena.raw.as_ptr()) };
        let slot = self.arena.slot;
        let _ = HELD.try_with(|held| held.borrow_mut()[slot].region = false);
        // the write lock is released after this, with the field
    }
}
