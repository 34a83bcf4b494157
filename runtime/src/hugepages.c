/* hugepages.c - an arena's heap kept in 2 MiB pages.
 *
 * An arena's memfd pages stay in the page cache across restarts, so a 2 MiB
 * range collapsed into one huge page (MADV_COLLAPSE) is mapped again by the
 * next incarnation with a single fault and one TLB entry.  The kernel allows
 * a collapse of shmem even where shmem_enabled is "never" (not "deny").
 *
 * rk_arena_hugepages: the collapse of ranges from an offset to the heap's top.
 *
 * rk_hugepages_step: the policy around it, for an app's event loop, one
 * range a call (a range already full is a ~4 ms copy, and requests wait
 * meanwhile).  Two passes:
 *   - the top pass (every loop iteration) collapses each range as the heap's
 *     top reaches it, while it is nearly empty (cheap);
 *   - the rescan pass (a range a tick, from a cron) goes over everything
 *     below: the last incarnation's ranges and those a free has split since
 *     (a large free gives its pages back to the kernel).
 * No huge page to be had (ENOMEM, EAGAIN, EBUSY): both wait 1 s.  Refused
 * (EPERM: the arena is in durable snapshots, which keep it in small pages;
 * EINVAL: the kernel cannot): off for good.  Each change of state is a
 * "hugepages" event.
 *
 * (A thread of the runtime doing the same off the event loop was tried and
 * measured: on a busy 2-core machine it ran too late to collapse ranges
 * before the app wrote them, so the app faulted each page in and the
 * collapse copied it: 4x the app's faults, and slower SETs;
 * docs/results.md.) */
#include "rk_internal.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#define HUGE_BYTES (2ull << 20)
#define WAIT_NS (1000ull * 1000 * 1000) /* none to be had: try again after */

/* Ranges are taken from *offset up to the one holding the heap's top: a
 * caller that follows the top collapses each while the allocator has
 * written little of it (a collapse copies the pages present, ~4 ms for a
 * full 2 MiB, and zero-fills the rest).  A range with no page at all is
 * refused by the kernel (EINVAL, as for no support), hence the read of its
 * first page, which allocates it.  A range huge already costs a few us. */
int rk_arena_hugepages(rk_arena *a, uint64_t *offset, unsigned max_ranges)
{
	if (!a || !a->hdr || !offset)
		return -EINVAL;
	/* the snapshot agent keeps tracked arenas in small pages (see
	 * arena_split_huge in snapshot_agent.c) */
	if (rk_snapshot_active() && !(a->flags & RK_ARENA_NO_SNAPSHOT))
		return -EPERM;
	const struct rk_arena_hdr *h = a->hdr;
	uint64_t top = RK_ALIGN_UP(h->heap_offset + h->top, HUGE_BYTES);
	uint64_t end = h->committed & ~(HUGE_BYTES - 1); /* a range past the file's end cannot be */
	if (top < end)
		end = top;
	if (*offset == RK_HUGEPAGES_TOP)
		*offset = (h->heap_offset + h->top) & ~(HUGE_BYTES - 1);
	uint64_t from = *offset & ~(HUGE_BYTES - 1);
	if (from >= end || max_ranges == 0)
		return 0;
	if ((end - from) / HUGE_BYTES > max_ranges)
		end = from + (uint64_t)max_ranges * HUGE_BYTES;
	char *base = (char *)h;
	for (uint64_t off = from; off < end; off += HUGE_BYTES)
		if (madvise(base + off, RK_PAGE, MADV_POPULATE_READ) < 0)
			return -errno;
	if (madvise(base + from, end - from, MADV_COLLAPSE) < 0)
		return -errno; /* *offset stays: the next call tries these again */
	*offset = end;
	return (int)((end - from) / HUGE_BYTES);
}

/* ---- the policy ---- */

struct arena_policy {
	bool started;
	enum rk_hugepages_state state;
	int error;          /* the errno of a refusal or of the wait */
	uint64_t ranges;    /* collapsed by this incarnation */
	uint64_t retry_ns;  /* waiting: no call before then */
	uint64_t grow, rescan; /* where the two passes are */
};

static struct arena_policy policies[RK_MAX_ARENAS];

static struct arena_policy *policy_of(const struct rk_arena *a)
{
	return a && a >= rk_g.arenas && a < rk_g.arenas + RK_MAX_ARENAS && a->hdr ? &policies[a->index] : NULL;
}

static void policy_event(const struct rk_arena *a, const char *state, int err, const char *why)
{
	struct rk_ev e;
	rk_ev_begin(&e, "hugepages");
	rk_ev_str(&e, "arena", a->name);
	rk_ev_str(&e, "state", state);
	rk_ev_i64(&e, "errno", err);
	rk_ev_str(&e, "why", why);
	rk_ev_end(&e);
}

/* One call of rk_arena_hugepages for a pass; a failure is acted on. */
static int policy_collapse(struct arena_policy *p, struct rk_arena *a, uint64_t *offset)
{
	int r = rk_arena_hugepages(a, offset, 1);
	if (r >= 0) {
		p->ranges += (uint64_t)r;
		if (p->state == RK_HUGEPAGES_WAITING) {
			p->state = RK_HUGEPAGES_ON;
			p->error = 0;
			policy_event(a, "on", 0, "huge pages to be had again");
		}
		return r;
	}
	if (r == -ENOMEM || r == -EAGAIN || r == -EBUSY) {
		if (p->state != RK_HUGEPAGES_WAITING)
			policy_event(a, "waiting", -r, "no huge page to be had now: tried again each second");
		p->state = RK_HUGEPAGES_WAITING;
		p->error = -r;
		p->retry_ns = rk_now_ns() + WAIT_NS;
		return 0;
	}
	p->state = RK_HUGEPAGES_REFUSED;
	p->error = -r;
	policy_event(a, "off", -r,
		     r == -EPERM ? "the arena is in durable snapshots, which keep it in small pages"
				 : "the kernel refused a collapse of shmem: a warm restart maps it in 4 KiB pages");
	return 0;
}

int rk_hugepages_step(rk_arena *a, enum rk_hugepages_pass pass)
{
	struct arena_policy *p = policy_of(a);
	if (!p || (pass != RK_HUGEPAGES_GROW && pass != RK_HUGEPAGES_RESCAN))
		return -EINVAL;
	if (!p->started) {
		/* what is below the top now was the last incarnation's: the
		 * rescan's (a fresh arena is nearly empty: from its start) */
		p->started = true;
		p->state = RK_HUGEPAGES_ON;
		p->grow = a->inherited ? RK_HUGEPAGES_TOP : 0;
	}
	if (p->state == RK_HUGEPAGES_REFUSED || (p->retry_ns && rk_now_ns() < p->retry_ns))
		return 0;
	p->retry_ns = 0;
	if (pass == RK_HUGEPAGES_GROW)
		return policy_collapse(p, a, &p->grow);
	uint64_t at = p->rescan;
	int r = policy_collapse(p, a, &p->rescan);
	if (r == 0 && p->rescan == at && p->state == RK_HUGEPAGES_ON)
		p->rescan = 0; /* at the top: from the start again */
	return r;
}

int rk_hugepages_status(const rk_arena *a, struct rk_hugepages_status *st)
{
	const struct arena_policy *p = policy_of(a);
	if (!p || !st)
		return -EINVAL;
	memset(st, 0, sizeof *st);
	st->state = p->started ? p->state : RK_HUGEPAGES_NOT_KEPT;
	st->error = p->error;
	st->bytes = p->ranges * HUGE_BYTES;
	return 0;
}
