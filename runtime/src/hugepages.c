/* hugepages.c - an arena's heap kept in 2 MiB pages.
 *
 * An arena's memfd pages stay in the page cache across restarts, so a 2 MiB
 * range collapsed into one huge page (MADV_COLLAPSE) is mapped again by the
 * next incarnation with a single fault and one TLB entry.  The kernel allows
 * a collapse of shmem even where shmem_enabled is "never" (not "deny").
 *
 * rk_arena_hugepages: one step, in the caller's thread.
 *
 * rk_hugepages_keep: a thread of the runtime that takes those steps, off
 * the app's threads: a collapse may go into direct reclaim and compaction
 * for a huge page, and copies what a range holds (~4 ms for a full one), and
 * an event loop that collapsed for itself answered nobody meanwhile.  Two
 * passes:
 *   - the top pass collapses each range as the heap's top reaches it, while
 *     it is nearly empty (cheap); the allocator wakes the keeper when the
 *     top crosses into a new range (rk_hugepages_top_rose);
 *   - the rescan pass goes over everything below, a range every 100 ms: the
 *     last incarnation's ranges and those a free has split since (a large
 *     free gives its pages back to the kernel).
 * The app's thread that touches a range while it is collapsed waits for the
 * copy (the kernel locks its pages), as it would for any of khugepaged's. */
#include "rk_internal.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#define HUGE_BYTES (2ull << 20)
#define RESCAN_EVERY_MS 100 /* a range a tick, as a cron would */
#define WAIT_MS 1000        /* none to be had: try again after */
#define BUSY_MS 10          /* a page in use: try again after, */
#define BUSY_TRIES 20       /* this many times in a row before waiting */

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
	uint64_t at = h->heap_offset + __atomic_load_n(&h->top, __ATOMIC_RELAXED);
	uint64_t top = RK_ALIGN_UP(at, HUGE_BYTES);
	uint64_t end = __atomic_load_n(&h->committed, __ATOMIC_RELAXED) & ~(HUGE_BYTES - 1);
	if (top < end) /* a range past the file's end cannot be */
		end = top;
	if (*offset == RK_HUGEPAGES_TOP)
		*offset = at & ~(HUGE_BYTES - 1);
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

/* ---- the keeper ---- */

struct keeper {
	_Atomic bool running;
	_Atomic uint32_t wake;      /* futex word: bumped to wake the keeper */
	_Atomic uint64_t wake_at;   /* the allocator wakes it once the top reaches this */
	_Atomic int state;          /* enum rk_hugepages_state */
	_Atomic int error;          /* the errno of a refusal or of the wait */
	_Atomic uint64_t ranges;    /* collapsed by this incarnation */
	_Atomic uint64_t skipped;   /* ranges the kernel would not collapse */
	uint64_t grow, rescan;      /* where the two passes are */
	unsigned busy_tries;        /* EAGAINs in a row */
};

static struct keeper keepers[RK_MAX_ARENAS];

static struct keeper *keeper_of(const struct rk_arena *a)
{
	return a && a >= rk_g.arenas && a < rk_g.arenas + RK_MAX_ARENAS ? &keepers[a->index] : NULL;
}

static void keeper_event(const struct rk_arena *a, const char *state, int err, const char *why)
{
	struct rk_ev e;
	rk_ev_begin(&e, "hugepages");
	rk_ev_str(&e, "arena", a->name);
	rk_ev_str(&e, "state", state);
	rk_ev_i64(&e, "errno", err);
	rk_ev_str(&e, "why", why);
	rk_ev_end(&e);
}

/* Sleeps until woken or ms pass; the top checked after the word is read,
 * so a wake in between is not lost. */
static void keeper_sleep(struct keeper *k, const struct rk_arena *a, long ms)
{
	uint32_t w = atomic_load(&k->wake);
	uint64_t at = a->hdr->heap_offset + __atomic_load_n(&a->hdr->top, __ATOMIC_RELAXED);
	atomic_store(&k->wake_at, (at & ~(HUGE_BYTES - 1)) + HUGE_BYTES);
	if (a->hdr->heap_offset + __atomic_load_n(&a->hdr->top, __ATOMIC_RELAXED) >= atomic_load(&k->wake_at))
		return;
	struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
	(void)syscall(SYS_futex, &k->wake, FUTEX_WAIT_PRIVATE, w, &t, NULL, 0);
}

/* One step of a pass: the ranges collapsed, or -1 when the keeper is to
 * stop (refused); *waiting when the kernel had no huge page to give, *busy
 * when a page was in use (try again in a moment). */
static int keeper_step(struct keeper *k, struct rk_arena *a, uint64_t *offset, bool *waiting, bool *busy)
{
	int r = rk_arena_hugepages(a, offset, 1);
	if (r >= 0) {
		k->busy_tries = 0;
		atomic_fetch_add(&k->ranges, (uint64_t)r);
		if (r > 0 && atomic_exchange(&k->state, RK_HUGEPAGES_ON) != RK_HUGEPAGES_ON) {
			atomic_store(&k->error, 0);
			keeper_event(a, "on", 0, "huge pages to be had again");
		}
		return r;
	}
	if (r == -EAGAIN && ++k->busy_tries <= BUSY_TRIES) {
		/* a page of the range in use right now (the app writing it, as
		 * it does the range at the top): again in a moment */
		*busy = true;
		return 0;
	}
	k->busy_tries = 0;
	if (r == -ENOMEM || r == -EAGAIN || r == -EBUSY) {
		if (atomic_exchange(&k->state, RK_HUGEPAGES_WAITING) != RK_HUGEPAGES_WAITING)
			keeper_event(a, "waiting", -r, "no huge page to be had now: retried each second");
		atomic_store(&k->error, -r);
		*waiting = true;
		return 0;
	}
	if (r == -EINVAL && atomic_load(&k->ranges) > 0) {
		/* it collapsed others: this range only (a free punching it
		 * meanwhile, say); skip it, the rescan comes back to it */
		atomic_fetch_add(&k->skipped, 1);
		*offset = (*offset & ~(HUGE_BYTES - 1)) + HUGE_BYTES;
		return 0;
	}
	atomic_store(&k->error, -r);
	atomic_store(&k->state, RK_HUGEPAGES_REFUSED);
	keeper_event(a, "off",
		     -r, r == -EPERM ? "the arena is in durable snapshots, which keep it in small pages"
				     : "the kernel refused a collapse of shmem: a warm restart maps it in 4 KiB pages");
	return -1;
}

static void *keeper_main(void *arg)
{
	struct rk_arena *a = arg;
	struct keeper *k = keeper_of(a);
	rk_wp_reader_thread(); /* reads the first page of each range */
	uint64_t next_rescan_ns = 0;
	while (!atomic_load(&rk_restarting)) {
		bool waiting = false, busy = false;
		int r = keeper_step(k, a, &k->grow, &waiting, &busy);
		if (r > 0)
			continue; /* the top pass goes on while it finds ranges */
		uint64_t now = rk_now_ns();
		if (r == 0 && !waiting && !busy && now >= next_rescan_ns) {
			next_rescan_ns = now + RESCAN_EVERY_MS * 1000000ull;
			uint64_t at = k->rescan;
			r = keeper_step(k, a, &k->rescan, &waiting, &busy);
			if (r == 0 && !waiting && !busy && k->rescan == at)
				k->rescan = 0; /* at the top: from the start again */
		}
		if (r < 0)
			break;
		keeper_sleep(k, a, waiting ? WAIT_MS : busy ? BUSY_MS : RESCAN_EVERY_MS);
	}
	atomic_store(&k->running, false);
	return NULL;
}

int rk_hugepages_keep(rk_arena *a)
{
	struct keeper *k = keeper_of(a);
	if (!k || !a->hdr)
		return -EINVAL;
	if (atomic_load(&k->running))
		return -EALREADY;
	/* what is below the top now was the last incarnation's: the rescan's */
	k->grow = (a->hdr->heap_offset + a->hdr->top) & ~(HUGE_BYTES - 1);
	k->rescan = 0;
	atomic_store(&k->wake_at, UINT64_MAX);
	atomic_store(&k->ranges, 0);
	atomic_store(&k->skipped, 0);
	atomic_store(&k->error, 0);
	atomic_store(&k->state, RK_HUGEPAGES_ON);
	atomic_store(&k->running, true);
	/* no signal for it: a fault or a restart request is the app's */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	int r = pthread_create(&t, &at, keeper_main, a);
	pthread_attr_destroy(&at);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r != 0) {
		atomic_store(&k->running, false);
		atomic_store(&k->state, RK_HUGEPAGES_NOT_KEPT);
		return -r;
	}
	return 0;
}

/* From the allocator, when the heap's top rose: a load and a compare, and
 * a wake once per 2 MiB. */
void rk_hugepages_top_rose(struct rk_arena *a)
{
	struct keeper *k = &keepers[a->index];
	uint64_t at = a->hdr->heap_offset + a->hdr->top;
	uint64_t wake_at = atomic_load_explicit(&k->wake_at, memory_order_relaxed);
	if (at < wake_at || !atomic_compare_exchange_strong(&k->wake_at, &wake_at, UINT64_MAX))
		return;
	atomic_fetch_add(&k->wake, 1);
	(void)syscall(SYS_futex, &k->wake, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

int rk_hugepages_status(const rk_arena *a, struct rk_hugepages_status *st)
{
	const struct keeper *k = keeper_of(a);
	if (!k || !st)
		return -EINVAL;
	memset(st, 0, sizeof *st);
	st->state = (enum rk_hugepages_state)atomic_load(&k->state);
	st->error = atomic_load(&k->error);
	st->bytes = atomic_load(&k->ranges) * HUGE_BYTES;
	st->skipped_ranges = atomic_load(&k->skipped);
	return 0;
}
