//! [`PVec`], a growable array whose buffer lives in an arena.
use core::fmt;
use core::marker::PhantomData;
use core::mem::{align_of, needs_drop, size_of};
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;

use crate::arena::{self, Arena};
use crate::error::{Error, Result};
use crate::ffi;
use crate::lifecycle::Recovery;
use crate::preserved::Preservable;

/// A growable array of `T` whose buffer is an arena object (grown with
/// `rk_realloc`): a `Vec` that survives a warm restart when the `PVec`
/// itself is stored in the arena (in an object or as a root).
///
/// It derefs to `[T]`: read it through a [`View`](crate::View) (`&PVec`),
/// change it through a [`Region`](crate::Region) (`&mut PVec`). Operations
/// that allocate take the [`Arena`] the buffer lives in, which must be the
/// arena the `PVec` itself is stored in.
///
/// A `PVec` owns its buffer: it is neither `Copy` nor `Clone`, and has no
/// destructor (the arena runs none). A `PVec` that is dropped, or
/// overwritten, without [`release`](Self::release) leaks its buffer until
/// the next sweep. On a warm start, [`mark`](Self::mark) marks the buffer
/// (not what the elements point to).
#[repr(C)]
pub struct PVec<T> {
    ptr: u64,
    len: u64,
    cap: u64,
    _t: PhantomData<T>,
}

// SAFETY: the buffer address is an arena address (valid in the next
// incarnation); the elements are Preservable; repr(C) layout.
unsafe impl<T: Preservable> Preservable for PVec<T> {}

impl<T> Default for PVec<T> {
    fn default() -> Self {
        PVec::new()
    }
}

impl<T: Preservable + fmt::Debug> fmt::Debug for PVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T> PVec<T> {
    /// An empty vector; allocates nothing.
    pub const fn new() -> PVec<T> {
        PVec {
            ptr: 0,
            len: 0,
            cap: 0,
            _t: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of elements the buffer holds without growing.
    pub fn capacity(&self) -> usize {
        self.cap as usize
    }
}

impl<T: Preservable> PVec<T> {
    const CHECKS: () = {
        assert!(size_of::<T>() > 0, "PVec of a zero-sized type");
        assert!(
            align_of::<T>() <= 16,
            "PVec elements are aligned to 16 bytes at most"
        );
        assert!(!needs_drop::<T>(), "preserved types must not need dropping");
    };

    /// Panics unless the buffer lies in a live arena, the one the vector is
    /// stored in (if it is stored in one): a vector moved between arenas
    /// must not outlive a dropped one (see [`Preservable`] rule 2).
    fn check_home(&self) {
        let bytes = self.capacity().saturating_mul(size_of::<T>());
        let buf = arena::slot_of(self.ptr as usize, bytes);
        let here = arena::slot_of(self as *const Self as usize, size_of::<Self>());
        assert!(
            buf.is_some() && (here.is_none() || here == buf),
            "PVec buffer {:#x} is not in the arena the PVec is stored in",
            self.ptr
        );
    }

    /// The elements, as a slice.
    ///
    /// # Panics
    ///
    /// If the buffer is not in the arena the vector is stored in.
    pub fn as_slice(&self) -> &[T] {
        if self.ptr == 0 {
            return &[];
        }
        self.check_home();
        // SAFETY: ptr is this vector's live buffer of cap >= len elements, the
        // first len initialised; the borrow of self covers the buffer.
        unsafe { core::slice::from_raw_parts(self.ptr as usize as *const T, self.len as usize) }
    }

    /// The elements, as a mutable slice.
    ///
    /// # Panics
    ///
    /// As [`as_slice`](Self::as_slice).
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        if self.ptr == 0 {
            return &mut [];
        }
        self.check_home();
        // SAFETY: as in as_slice; &mut self makes the borrow exclusive.
        unsafe { core::slice::from_raw_parts_mut(self.ptr as usize as *mut T, self.len as usize) }
    }

    /// Makes room for at least `additional` more elements, growing the
    /// buffer in `arena`.
    pub fn reserve(&mut self, arena: Arena, additional: usize) -> Result<()> {
        let () = Self::CHECKS;
        let need = self
            .len()
            .checked_add(additional)
            .ok_or(Error::SizeOverflow)?;
        if need <= self.capacity() {
            return Ok(());
        }
        let new_cap = need.max(self.capacity().saturating_mul(2)).max(4);
        self.grow(arena, new_cap)
    }

    fn grow(&mut self, arena: Arena, new_cap: usize) -> Result<()> {
        let bytes = new_cap
            .checked_mul(size_of::<T>())
            .ok_or(Error::SizeOverflow)?;
        let here = arena::slot_of(self as *const Self as usize, size_of::<Self>());
        if here.is_some_and(|slot| slot != arena.slot()) {
            return Err(Error::ForeignHandle(
                "the PVec (stored in another arena)",
                arena.name(),
            ));
        }
        self.check_buffer(arena)?;
        let old = self.ptr as usize;
        // SAFETY: old is NULL or this vector's own buffer in `arena`. The
        // region makes a failure between the realloc (which frees the old
        // buffer) and the update of ptr restart cold.
        unsafe {
            ffi::rk_unsafe_begin(arena.as_raw());
            let p = ffi::rk_realloc(arena.as_raw(), old as *mut core::ffi::c_void, bytes);
            let r = match NonNull::new(p) {
                None => Err(arena.alloc_error(bytes)),
                Some(p) if !(p.as_ptr() as usize).is_multiple_of(align_of::<T>()) => {
                    Err(Error::ForeignHandle("a misaligned buffer", arena.name()))
                }
                Some(p) => {
                    self.ptr = p.as_ptr() as u64;
                    self.cap = new_cap as u64;
                    Ok(())
                }
            };
            ffi::rk_unsafe_end(arena.as_raw());
            r
        }
    }

    /// Err unless the buffer (if any) lies in `arena`.
    fn check_buffer(&self, arena: Arena) -> Result<()> {
        let bytes = self.capacity().saturating_mul(size_of::<T>());
        if self.ptr != 0 && !arena.contains_range(self.ptr as usize, bytes) {
            return Err(Error::ForeignHandle("the PVec's buffer", arena.name()));
        }
        Ok(())
    }

    /// Appends `value`, growing the buffer in `arena` if it is full.
    ///
    /// # Panics
    ///
    /// As [`as_slice`](Self::as_slice).
    pub fn push(&mut self, arena: Arena, value: T) -> Result<()> {
        self.check_buffer(arena)?;
        if self.ptr != 0 {
            self.check_home();
        }
        if self.len == self.cap {
            self.reserve(arena, 1)?;
        }
        // SAFETY: len < cap: the slot is inside the buffer and unused. The
        // region covers the write for write-protected arenas.
        unsafe {
            ffi::rk_unsafe_begin(arena.as_raw());
            (self.ptr as usize as *mut T).add(self.len()).write(value);
            self.len += 1;
            ffi::rk_unsafe_end(arena.as_raw());
        }
        Ok(())
    }

    /// Removes and returns the last element.
    ///
    /// # Panics
    ///
    /// As [`as_slice`](Self::as_slice).
    pub fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.check_home();
        self.len -= 1;
        // SAFETY: the slot at the old len - 1 was initialised and is now
        // outside the vector.
        Some(unsafe { (self.ptr as usize as *const T).add(self.len()).read() })
    }

    /// Removes the element at `index` and returns it; the last element
    /// takes its place.
    ///
    /// # Panics
    ///
    /// If `index >= len`.
    pub fn swap_remove(&mut self, index: usize) -> T {
        let len = self.len();
        assert!(
            index < len,
            "swap_remove index {index} out of bounds (len {len})"
        );
        self.as_mut_slice().swap(index, len - 1);
        match self.pop() {
            Some(v) => v,
            None => unreachable!("len was checked above"),
        }
    }

    /// Shortens the vector to `len` elements (nothing if it is shorter).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len() {
            self.len = len as u64;
        }
    }

    /// Removes every element; keeps the buffer.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Frees the buffer (in `arena`) and leaves the vector empty.
    pub fn release(&mut self, arena: Arena) -> Result<()> {
        if self.ptr == 0 {
            return Ok(());
        }
        self.check_buffer(arena)?;
        let old = self.ptr as usize;
        // SAFETY: the buffer is this vector's own rk_alloc block in `arena`,
        // and nothing else refers to it (PVec owns it; borrows of the
        // elements end with &mut self).
        unsafe {
            ffi::rk_unsafe_begin(arena.as_raw());
            self.ptr = 0;
            self.len = 0;
            self.cap = 0;
            ffi::rk_free(arena.as_raw(), old as *mut core::ffi::c_void);
            ffi::rk_unsafe_end(arena.as_raw());
        }
        Ok(())
    }

    /// On a warm start: marks the buffer as reachable (the `PVec` itself is
    /// marked with the object that holds it). Elements that hold handles
    /// must be marked by the caller.
    pub fn mark(&self, rec: &Recovery, arena: Arena) -> Result<()> {
        if self.ptr != 0 {
            rec.mark_addr(arena, self.ptr as usize)?;
        }
        Ok(())
    }
}

impl<T: Preservable> Deref for PVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Preservable> DerefMut for PVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.as_mut_slice()
    }
}
