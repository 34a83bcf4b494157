/* layout.c - the C side of the Rust binding's layout check.
 *
 * Exports the sizes and field offsets of the structs that src/ffi.rs mirrors,
 * and the constants it restates, as a name -> value table.  The unit test
 * ffi::tests::struct_layouts_match_the_c_header compares it with Rust's
 * size_of/offset_of under the same names: one contract, checked in one place.
 * Compiled by build.rs against runtime/include/rekindle.h. */
#include "rekindle.h"

#include <stddef.h>

#define SZ(T) {"sizeof(" #T ")", sizeof(T)}
#define OFF(T, F) {"offsetof(" #T ", " #F ")", offsetof(struct T, F)}
#define VAL(C) {#C, (size_t)(C)}

static const struct {
	const char *name;
	size_t value;
} layout[] = {
	VAL(RK_NAME_MAX),
	VAL(RK_MAX_ARENAS),
	VAL(RK_START_FRESH),
	VAL(RK_START_WARM),
	VAL(RK_START_COLD),
	VAL(RK_OPT_NO_SIGNAL_HANDLERS),
	VAL(RK_OPT_PREFAULT),
	VAL(RK_OPT_QUIET),
	VAL(RK_ARENA_INDEPENDENT),
	VAL(RK_ARENA_WRITE_PROTECT),
	SZ(enum rk_start_kind),

	SZ(struct rk_options),
	OFF(rk_options, flags),
	OFF(rk_options, arena_base),
	OFF(rk_options, crashloop_window_ms),
	OFF(rk_options, max_fast_failures),

	SZ(struct rk_restart_info),
	OFF(rk_restart_info, kind),
	OFF(rk_restart_info, generation),
	OFF(rk_restart_info, signal),
	OFF(rk_restart_info, fault_addr),
	OFF(rk_restart_info, reason),
	OFF(rk_restart_info, decision),
	OFF(rk_restart_info, restart_ns),
	OFF(rk_restart_info, preserved_bytes),
	OFF(rk_restart_info, statics_restored),
	OFF(rk_restart_info, arenas_dropped),
	OFF(rk_restart_info, decision_code),

	SZ(struct rk_sweep_stats),
	OFF(rk_sweep_stats, objects_freed),
	OFF(rk_sweep_stats, bytes_freed),
	OFF(rk_sweep_stats, objects_kept),
	OFF(rk_sweep_stats, bytes_kept),

	SZ(struct rk_arena_stats),
	OFF(rk_arena_stats, base),
	OFF(rk_arena_stats, max_bytes),
	OFF(rk_arena_stats, mapped_bytes),
	OFF(rk_arena_stats, heap_bytes),
	OFF(rk_arena_stats, allocated_bytes),
};

size_t rkrs_layout_count(void)
{
	return sizeof layout / sizeof layout[0];
}

const char *rkrs_layout_name(size_t i)
{
	return i < rkrs_layout_count() ? layout[i].name : "";
}

size_t rkrs_layout_value(size_t i)
{
	return i < rkrs_layout_count() ? layout[i].value : 0;
}
