//! The C API of `librekindle`, declared by hand from `runtime/include/rekindle.h`.
//!
//! This module is the one place where the binding restates the C contract.
//! The structs below mirror the header's; `build.rs` compiles
//! `csrc/layout.c` against the real header, and the unit test at the bottom
//! compares every size and field offset with C's, so a change on either side
//! fails `cargo test` instead of corrupting memory.
//!
//! Everything here is `unsafe` to call and follows the header's conventions:
//! functions returning `c_int` return 0 (or a count) on success and `-errno`
//! on failure; functions returning a pointer return NULL with `errno` set.
//! The stage API (`rekindle_stages.h`), cross-check validation and the
//! failure hook are not declared: the safe layer does not use them.
#![allow(non_camel_case_types, missing_docs)]

use core::ffi::{c_char, c_int, c_uint, c_void};

/// `RK_NAME_MAX`: longest arena or root name, without the NUL.
pub const RK_NAME_MAX: usize = 47;
/// `RK_MAX_ARENAS`: arenas per process.
pub const RK_MAX_ARENAS: usize = 16;

/// `enum rk_start_kind` values (the C enum is an `int`-sized field).
pub const RK_START_FRESH: c_uint = 0;
pub const RK_START_WARM: c_uint = 1;
pub const RK_START_COLD: c_uint = 2;

/// `rk_options.flags`
pub const RK_OPT_NO_SIGNAL_HANDLERS: c_uint = 0x1;
pub const RK_OPT_PREFAULT: c_uint = 0x2;
pub const RK_OPT_QUIET: c_uint = 0x4;

/// `rk_arena_open_flags` flags
pub const RK_ARENA_INDEPENDENT: c_uint = 0x1;
pub const RK_ARENA_WRITE_PROTECT: c_uint = 0x2;

/// Opaque `rk_arena`.
#[repr(C)]
pub struct rk_arena {
    _opaque: [u8; 0],
}

/// `struct rk_options`
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct rk_options {
    pub flags: c_uint,
    pub arena_base: u64,
    pub crashloop_window_ms: c_uint,
    pub max_fast_failures: c_uint,
}

/// `struct rk_restart_info` (`kind` is `enum rk_start_kind`, an unsigned
/// int-sized value; read it as an integer, never as a Rust enum).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rk_restart_info {
    pub kind: c_uint,
    pub generation: c_uint,
    pub signal: c_int,
    pub fault_addr: u64,
    pub reason: [c_char; 128],
    pub decision: [c_char; 160],
    pub restart_ns: u64,
    pub preserved_bytes: u64,
    pub statics_restored: c_uint,
    pub arenas_dropped: c_uint,
    /// `enum rk_reason`
    pub decision_code: c_uint,
    /// A restore from a durable snapshot: its id; empty otherwise.
    pub snapshot: [c_char; 64],
}

/// `struct rk_sweep_stats`
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct rk_sweep_stats {
    pub objects_freed: u64,
    pub bytes_freed: u64,
    pub objects_kept: u64,
    pub bytes_kept: u64,
}

/// `struct rk_arena_stats`
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct rk_arena_stats {
    pub base: u64,
    pub max_bytes: u64,
    pub mapped_bytes: u64,
    pub heap_bytes: u64,
    pub allocated_bytes: u64,
}

unsafe extern "C" {
    // lifecycle
    pub fn rk_init(argc: c_int, argv: *mut *mut c_char, opts: *const rk_options) -> c_int;
    pub fn rk_is_recovery() -> bool;
    pub fn rk_restart_info() -> *const rk_restart_info;
    pub fn rk_finish_recovery(cleanup: bool, stats: *mut rk_sweep_stats) -> c_int;
    pub fn rk_restart(reason: *const c_char) -> c_int;
    pub fn rk_restart_cold(reason: *const c_char) -> c_int;
    pub fn rk_prefault(background: bool) -> c_int;

    // supervision and correctness
    pub fn rk_is_supervised() -> bool;
    pub fn rk_heartbeat();
    pub fn rk_heartbeat_interval_ms() -> c_int;
    pub fn rk_epoch() -> u64;
    pub fn rk_durable_epoch() -> u64;
    pub fn rk_durable_fd() -> c_int;
    pub fn rk_checkpoint() -> c_int;
    pub fn rk_ready() -> c_int;
    pub fn rk_unsafe_begin(arena: *mut rk_arena);
    pub fn rk_unsafe_end(arena: *mut rk_arena);
    pub fn rk_component_is_safe(arena: *const rk_arena) -> bool;
    pub fn rk_set_warm_allowed(allowed: bool);

    // arenas
    pub fn rk_arena_open(name: *const c_char, max_bytes: usize) -> *mut rk_arena;
    pub fn rk_arena_open_flags(
        name: *const c_char,
        max_bytes: usize,
        flags: c_uint,
    ) -> *mut rk_arena;
    pub fn rk_arena_preserved(arena: *const rk_arena) -> bool;
    pub fn rk_arena_write_protected(arena: *const rk_arena) -> bool;
    pub fn rk_arena_stats(arena: *const rk_arena, out: *mut rk_arena_stats) -> c_int;
    pub fn rk_arena_contains(arena: *const rk_arena, ptr: *const c_void) -> bool;

    pub fn rk_alloc(arena: *mut rk_arena, size: usize) -> *mut c_void;
    pub fn rk_calloc(arena: *mut rk_arena, nmemb: usize, size: usize) -> *mut c_void;
    pub fn rk_realloc(arena: *mut rk_arena, ptr: *mut c_void, size: usize) -> *mut c_void;
    pub fn rk_free(arena: *mut rk_arena, ptr: *mut c_void);
    pub fn rk_usable_size(arena: *mut rk_arena, ptr: *const c_void) -> usize;

    pub fn rk_root_set(arena: *mut rk_arena, name: *const c_char, ptr: *mut c_void) -> c_int;
    pub fn rk_root_get(arena: *mut rk_arena, name: *const c_char) -> *mut c_void;
    pub fn rk_mark(arena: *mut rk_arena, ptr: *const c_void) -> c_int;

    pub fn rk_preserve_range(addr: *mut c_void, len: usize) -> c_int;
}

// The C side of the layout check (csrc/layout.c, compiled by build.rs).
#[cfg(test)]
unsafe extern "C" {
    fn rkrs_layout_count() -> usize;
    fn rkrs_layout_name(i: usize) -> *const c_char;
    fn rkrs_layout_value(i: usize) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};
    use std::collections::BTreeMap;
    use std::ffi::CStr;

    /// Every size and offset the Rust mirrors rely on, under the same names
    /// as in csrc/layout.c.
    fn rust_layout() -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        m.insert("RK_NAME_MAX", RK_NAME_MAX);
        m.insert("RK_MAX_ARENAS", RK_MAX_ARENAS);
        m.insert("RK_START_FRESH", RK_START_FRESH as usize);
        m.insert("RK_START_WARM", RK_START_WARM as usize);
        m.insert("RK_START_COLD", RK_START_COLD as usize);
        m.insert(
            "RK_OPT_NO_SIGNAL_HANDLERS",
            RK_OPT_NO_SIGNAL_HANDLERS as usize,
        );
        m.insert("RK_OPT_PREFAULT", RK_OPT_PREFAULT as usize);
        m.insert("RK_OPT_QUIET", RK_OPT_QUIET as usize);
        m.insert("RK_ARENA_INDEPENDENT", RK_ARENA_INDEPENDENT as usize);
        m.insert("RK_ARENA_WRITE_PROTECT", RK_ARENA_WRITE_PROTECT as usize);
        m.insert("sizeof(enum rk_start_kind)", size_of::<c_uint>());

        m.insert("sizeof(struct rk_options)", size_of::<rk_options>());
        m.insert("offsetof(rk_options, flags)", offset_of!(rk_options, flags));
        m.insert(
            "offsetof(rk_options, arena_base)",
            offset_of!(rk_options, arena_base),
        );
        m.insert(
            "offsetof(rk_options, crashloop_window_ms)",
            offset_of!(rk_options, crashloop_window_ms),
        );
        m.insert(
            "offsetof(rk_options, max_fast_failures)",
            offset_of!(rk_options, max_fast_failures),
        );

        m.insert(
            "sizeof(struct rk_restart_info)",
            size_of::<rk_restart_info>(),
        );
        m.insert(
            "offsetof(rk_restart_info, kind)",
            offset_of!(rk_restart_info, kind),
        );
        m.insert(
            "offsetof(rk_restart_info, generation)",
            offset_of!(rk_restart_info, generation),
        );
        m.insert(
            "offsetof(rk_restart_info, signal)",
            offset_of!(rk_restart_info, signal),
        );
        m.insert(
            "offsetof(rk_restart_info, fault_addr)",
            offset_of!(rk_restart_info, fault_addr),
        );
        m.insert(
            "offsetof(rk_restart_info, reason)",
            offset_of!(rk_restart_info, reason),
        );
        m.insert(
            "offsetof(rk_restart_info, decision)",
            offset_of!(rk_restart_info, decision),
        );
        m.insert(
            "offsetof(rk_restart_info, restart_ns)",
            offset_of!(rk_restart_info, restart_ns),
        );
        m.insert(
            "offsetof(rk_restart_info, preserved_bytes)",
            offset_of!(rk_restart_info, preserved_bytes),
        );
        m.insert(
            "offsetof(rk_restart_info, statics_restored)",
            offset_of!(rk_restart_info, statics_restored),
        );
        m.insert(
            "offsetof(rk_restart_info, arenas_dropped)",
            offset_of!(rk_restart_info, arenas_dropped),
        );
        m.insert(
            "offsetof(rk_restart_info, decision_code)",
            offset_of!(rk_restart_info, decision_code),
        );

        m.insert("sizeof(struct rk_sweep_stats)", size_of::<rk_sweep_stats>());
        m.insert(
            "offsetof(rk_sweep_stats, objects_freed)",
            offset_of!(rk_sweep_stats, objects_freed),
        );
        m.insert(
            "offsetof(rk_sweep_stats, bytes_freed)",
            offset_of!(rk_sweep_stats, bytes_freed),
        );
        m.insert(
            "offsetof(rk_sweep_stats, objects_kept)",
            offset_of!(rk_sweep_stats, objects_kept),
        );
        m.insert(
            "offsetof(rk_sweep_stats, bytes_kept)",
            offset_of!(rk_sweep_stats, bytes_kept),
        );

        m.insert("sizeof(struct rk_arena_stats)", size_of::<rk_arena_stats>());
        m.insert(
            "offsetof(rk_arena_stats, base)",
            offset_of!(rk_arena_stats, base),
        );
        m.insert(
            "offsetof(rk_arena_stats, max_bytes)",
            offset_of!(rk_arena_stats, max_bytes),
        );
        m.insert(
            "offsetof(rk_arena_stats, mapped_bytes)",
            offset_of!(rk_arena_stats, mapped_bytes),
        );
        m.insert(
            "offsetof(rk_arena_stats, heap_bytes)",
            offset_of!(rk_arena_stats, heap_bytes),
        );
        m.insert(
            "offsetof(rk_arena_stats, allocated_bytes)",
            offset_of!(rk_arena_stats, allocated_bytes),
        );
        m
    }

    fn c_layout() -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        // SAFETY: the layout table is static data in csrc/layout.c; names are
        // NUL-terminated literals and i stays below the count it reports.
        unsafe {
            for i in 0..rkrs_layout_count() {
                let name = CStr::from_ptr(rkrs_layout_name(i))
                    .to_string_lossy()
                    .into_owned();
                m.insert(name, rkrs_layout_value(i));
            }
        }
        m
    }

    #[test]
    fn struct_layouts_match_the_c_header() {
        let rust = rust_layout();
        let c = c_layout();
        let rust_names: Vec<&str> = rust.keys().copied().collect();
        let c_names: Vec<&str> = c.keys().map(String::as_str).collect();
        assert_eq!(
            rust_names, c_names,
            "layout.c and ffi.rs check different things"
        );
        for (name, value) in &rust {
            assert_eq!(
                Some(value),
                c.get(*name),
                "{name}: Rust {value}, C {:?}",
                c.get(*name)
            );
        }
    }
}
