/* decide.c - the warm/cold decision as a pure function of what a failure
 * left behind, so its order of checks can be tested against the table the
 * supervisor's decider runs too (tests/contract/decisions.tsv).  The first
 * check that fails names the reason; an independent arena that is
 * half-changed (or faulting again) is dropped alone and the rest stays warm.
 * restart.c gathers the facts and words the reason. */
#include "rk_internal.h"

static struct rk_verdict cold(enum rk_reason code, int arena)
{
	return (struct rk_verdict){.warm = false, .code = code, .drop = 0, .arena = arena};
}

static int lowest(uint32_t mask)
{
	return mask ? __builtin_ctz(mask) : -1;
}

struct rk_verdict rk_decide(const struct rk_facts *f)
{
	if (f->cold_requested)
		return cold(RK_REASON_COLD_REQUESTED, -1);
	if (f->control_damaged) /* no evidence of the other arenas' regions, even for a hot switch */
		return cold(RK_REASON_CONTROL_BLOCK_CORRUPT, -1);
	if (!f->hot_switch) {
		if (f->fault_in_runtime)
			return cold(RK_REASON_FAULT_IN_RUNTIME, -1);
		if (f->crash_loop)
			return cold(RK_REASON_CRASH_LOOP, -1);
		if (f->repeat_owner >= RK_MAX_ARENAS ||
		    (f->repeat_owner >= 0 && !(f->independent & (1u << f->repeat_owner))))
			return cold(RK_REASON_REPEATED_FAULT, f->repeat_owner < RK_MAX_ARENAS ? f->repeat_owner : -1);
		if (f->manifest_busy)
			return cold(RK_REASON_MANIFEST_BUSY, -1);
		if (f->warm_disabled)
			return cold(RK_REASON_WARM_DISABLED, -1);
	}
	struct rk_verdict v = {.warm = true,
			       .code = f->hot_switch ? RK_REASON_CROSSCHECK_MISMATCH : RK_REASON_ALL_CHECKS_PASSED,
			       .arena = -1};
	if (!f->regions_known)
		return v;
	if (f->hook_cold)
		return cold(RK_REASON_HOOK_COLD, -1);
	uint32_t dependent = f->unsafe_open & ~f->independent;
	if (dependent)
		return cold(RK_REASON_UNSAFE_REGION_OPEN, lowest(dependent));
	uint32_t repeat = f->repeat_owner >= 0 && f->repeat_owner < RK_MAX_ARENAS ? 1u << f->repeat_owner : 0;
	v.drop = f->unsafe_open | f->hook_drop | (f->hot_switch ? 0 : repeat);
	if (v.drop) {
		v.code = RK_REASON_INDEPENDENT_DROPPED;
		v.arena = lowest(f->unsafe_open ? f->unsafe_open : v.drop);
	}
	return v;
}
