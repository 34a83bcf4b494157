//! [`Preservable`], the promise that a type is still valid in the next
//! incarnation, and [`Preserved`], a typed handle to an object in an arena.
use core::fmt;
use core::hash::{Hash, Hasher};
use core::marker::PhantomData;
use core::ptr::NonNull;

/// A type whose values stay valid in the next incarnation of the process,
/// so they may live in an arena.
///
/// The next incarnation reads the same bytes at the same address, in a new
/// process running the same program. Only what is still meaningful there
/// may be stored.
///
/// # Safety
///
/// Implement it only for a type that:
///
/// 1. holds no pointer or reference to memory that is not preserved: no
///    `Box`, `Vec`, `String`, `&T`, `Rc`/`Arc`, raw pointers to the heap,
///    the stack or statics, function pointers or trait objects (the binary
///    may load at another address), file descriptors or thread ids. Plain
///    data (integers, floats, `bool`, `char`, fixed arrays) and the
///    binding's handles ([`Preserved`], [`PVec`](crate::PVec)) are fine;
/// 2. points with those handles only into the arena it is stored in (an
///    arena can be dropped on its own at a failure, and its handles with it);
/// 3. has no interior mutability (`Cell`, `RefCell`, atomics, `UnsafeCell`):
///    every change of preserved state must go through a
///    [`Region`](crate::Region), which readers are excluded from;
/// 4. has a stable layout: `#[repr(C)]` (or `#[repr(transparent)]`) with
///    fields that are themselves `Preservable`, so that a rebuilt binary
///    (a supervisor respawn runs the program's file, which may be newer)
///    reads it the same way; change the type's name when its layout
///    changes, so that a root of the old type is refused.
///
/// Types with drop glue are refused at compile time by
/// [`Arena::alloc`](crate::Arena::alloc): the arena never runs destructors.
/// `Send + Sync` follow from 1 and 3 for plain data.
pub unsafe trait Preservable: Sized + Send + Sync + 'static {}

macro_rules! preservable {
    ($($t:ty),*) => { $(
        // SAFETY: plain data, any value stays valid in another process.
        unsafe impl Preservable for $t {}
    )* };
}
preservable!(
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    bool,
    char,
    ()
);

// SAFETY: an array of preservable values is preservable (same layout rules).
unsafe impl<T: Preservable, const N: usize> Preservable for [T; N] {}
// SAFETY: a handle is an absolute address inside an arena, which the next
// incarnation maps at the same address.
unsafe impl<T: Preservable> Preservable for Preserved<T> {}
// SAFETY: Option<Preserved<T>> is a nullable pointer (guaranteed niche of a
// repr(transparent) NonNull wrapper).
unsafe impl<T: Preservable> Preservable for Option<Preserved<T>> {}
// SAFETY: zero-sized.
unsafe impl<T: Preservable> Preservable for PhantomData<T> {}

/// A typed handle to a `T` in an arena: an absolute address (8 bytes,
/// `Copy`), valid in the next incarnation too, so it can be stored in
/// other preserved objects and in roots.
///
/// A handle comes from [`Arena::alloc`](crate::Arena::alloc) or from a root
/// ([`Arena::root`](crate::Arena::root), type-checked). Its object is read
/// through a [`View`](crate::View) and changed through a
/// [`Region`](crate::Region) of its arena, which keep readers and writers
/// apart. A handle stays valid until its object is freed
/// ([`Region::free`](crate::Region::free), unsafe) or swept
/// ([`Recovery::sweep`](crate::Recovery::sweep), unsafe).
#[repr(transparent)]
pub struct Preserved<T> {
    ptr: NonNull<T>,
}

// SAFETY: a handle is only an address; access to the object goes through
// View/Region, which synchronise and require T: Preservable (Send + Sync).
unsafe impl<T> Send for Preserved<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Preserved<T> {}

impl<T> Clone for Preserved<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Preserved<T> {}

impl<T> PartialEq for Preserved<T> {
    fn eq(&self, other: &Self) -> bool {
        self.ptr == other.ptr
    }
}
impl<T> Eq for Preserved<T> {}
impl<T> Hash for Preserved<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.ptr.hash(state)
    }
}
impl<T> fmt::Debug for Preserved<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Preserved<{}>({:#x})",
            core::any::type_name::<T>(),
            self.addr()
        )
    }
}

impl<T> Preserved<T> {
    /// The object's address.
    pub fn addr(self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The object's address as a raw pointer, for C code. Writing through
    /// it outside a region, or while a [`View`](crate::View) of the arena
    /// exists, breaks the binding's guarantees.
    pub fn as_ptr(self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// A handle from a raw pointer (`None` for NULL), e.g. one C code stored.
    ///
    /// # Safety
    ///
    /// `ptr` must point to a live, initialised, suitably aligned `T` that
    /// was allocated in an arena (by `rk_alloc` or this binding) and that
    /// no other handle of another type overlaps.
    pub unsafe fn from_raw(ptr: *mut T) -> Option<Preserved<T>> {
        NonNull::new(ptr).map(|ptr| Preserved { ptr })
    }

    pub(crate) fn from_nonnull(ptr: NonNull<T>) -> Preserved<T> {
        Preserved { ptr }
    }
}
