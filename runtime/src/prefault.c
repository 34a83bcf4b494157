/* prefault.c - the cost of mapping preserved pages again after a restart.
 *
 * rk_prefault: the first access to each preserved page costs a minor fault;
 * this takes those faults ahead of the app (MADV_POPULATE_READ over the used
 * part of each arena), in a thread of its own or in the caller's.  rk_init
 * starts it with RK_OPT_PREFAULT.
 *
 * rk_arena_hugepages: the same faults, made 512 times fewer.  An arena's
 * memfd pages stay in the page cache across restarts, so a 2 MiB range
 * collapsed into one huge page (MADV_COLLAPSE) is mapped again by the next
 * incarnation with a single fault and one TLB entry.  The kernel allows a
 * collapse of shmem even where shmem_enabled is "never" (not "deny"). */
#include "rk_internal.h"

#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

static void *prefault_all(void *unused)
{
	(void)unused;
	uint64_t t0 = rk_now_ns(), bytes = 0;
	const uint64_t chunk = 64ull << 20;
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		struct rk_arena *a = &rk_g.arenas[i];
		if (!a->hdr)
			continue;
		uint64_t end = a->hdr->heap_offset + a->hdr->top;
		for (uint64_t off = 0; off < end; off += chunk) {
			uint64_t n = end - off < chunk ? end - off : chunk;
			/* read faults on shmem map whole fault-around blocks, and the
			 * shared mapping is writable once mapped */
			if (madvise((char *)a->hdr + off, n, MADV_POPULATE_READ) == 0)
				bytes += n;
		}
	}
	rk_reap_teardown_holder();
	struct rk_ev e;
	rk_ev_begin(&e, "prefaulted");
	rk_ev_u64(&e, "bytes", bytes);
	rk_ev_u64(&e, "duration_us", (rk_now_ns() - t0) / 1000);
	rk_ev_end(&e);
	return NULL;
}

/* Started in rk_init, before the app reopens (and protects) its arenas. */
static void *prefault_thread(void *unused)
{
	rk_wp_reader_thread();
	return prefault_all(unused);
}

int rk_prefault(bool background)
{
	if (!background) {
		prefault_all(NULL);
		return 0;
	}
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	int r = pthread_create(&t, &at, prefault_thread, NULL);
	pthread_attr_destroy(&at);
	return -r;
}

#define HUGE_BYTES (2ull << 20)

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
