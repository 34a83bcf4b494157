//! Safe Rust binding of `librekindle`: keep a service's long-lived state in
//! *preserved arenas*, and come back from a crash in about a millisecond
//! with that state intact (a *warm restart*).
//!
//! ```no_run
//! use rekindle::{Arena, PVec, StartKind};
//!
//! #[repr(C)]
//! struct Counter { hits: u64 }
//! // SAFETY: plain data, repr(C).
//! unsafe impl rekindle::Preservable for Counter {}
//!
//! fn main() -> Result<(), rekindle::Error> {
//!     let mut start = rekindle::init()?;                  // first thing in main
//!     let arena = Arena::open("app", 1 << 30)?;           // reserves, grows on demand
//!     let counter = match (start.kind, arena.root::<Counter>("counter")?) {
//!         (StartKind::Warm, Some(c)) => c,                 // the previous incarnation's
//!         _ => {
//!             let c = arena.alloc(Counter { hits: 0 })?;   // the app's own recovery
//!             arena.set_root("counter", c)?;
//!             c
//!         }
//!     };
//!     if let Some(mut rec) = start.recovery.take() {
//!         rec.mark(arena, counter)?;
//!         // SAFETY: `counter` is the only object the app uses, and it is marked.
//!         unsafe { rec.sweep()? };                        // frees what was in flight
//!     }
//!     arena.modify(|g| g.get_mut(counter).hits += 1);     // every change in a region
//!     println!("hits: {}", arena.view().get(counter).hits);
//!     Ok(())
//! }
//! ```
//!
//! The pieces:
//!
//! - [`init`] (once, first thing) says how this incarnation started:
//!   [`Start`] with [`StartKind::Fresh`], [`Warm`](StartKind::Warm) or
//!   [`Cold`](StartKind::Cold), and a [`Recovery`] on a warm start.
//! - [`Arena`] is a `Copy` handle to an arena; [`Arena::alloc`] moves a
//!   value of a [`Preservable`] type into it and returns a [`Preserved`]
//!   handle (8 bytes, `Copy`, valid in the next incarnation too).
//! - Objects are read through a [`View`] and changed only through a
//!   [`Region`], the guard of an unsafe region (`rk_unsafe_begin/end`): a
//!   failure while one is open makes the restart cold, because the state
//!   may be half-changed. Views and regions of an arena exclude each other
//!   (a reader-writer lock), so `&T` and `&mut T` never alias.
//! - Roots name objects so the next incarnation finds them;
//!   [`Arena::root`] refuses a root stored with another type.
//! - [`PVec`] is a growable array in an arena.
//! - [`restart`], [`restart_cold`], [`heartbeat`], [`ready`],
//!   [`set_warm_allowed`], [`is_supervised`], [`prefault`] wrap the rest of
//!   the runtime's lifecycle.
//!
//! Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) restart the process.
//! A Rust panic is not a fault: build with `panic = "abort"` (or call
//! [`abort_on_panic`]), so that a panic aborts (SIGABRT) and restarts like
//! one. Under `rekindle run` any
//! death restarts the app, SIGKILL included, with the arenas kept.
//!
//! What is not wrapped: the stage API (`rekindle_stages.h`), cross-check
//! validation, failure hooks, `RK_PRESERVED` statics and
//! `rk_preserve_range`; [`ffi`] declares the C functions the binding uses.
#![deny(missing_docs)]

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
compile_error!("librekindle runs on 64-bit Linux only");

mod arena;
mod error;
pub mod ffi;
mod lifecycle;
mod preserved;
mod vec;

pub use arena::{Arena, ArenaFlags, ArenaStats, Region, View};
pub use error::{Error, Result};
pub use lifecycle::{
    Options, Recovery, Start, StartKind, SweepStats, abort_on_panic, checkpoint, durable_epoch,
    durable_fd, epoch, heartbeat, heartbeat_interval, init, is_initialized, is_recovery,
    is_supervised, prefault, ready, restart, restart_cold, set_warm_allowed,
};
pub use preserved::{Preservable, Preserved};
pub use vec::PVec;
