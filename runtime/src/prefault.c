/* prefault.c - the cost of mapping preserved pages again after a restart.
 *
 * rk_prefault: the first access to each preserved page costs a minor fault;
 * this takes those faults ahead of the app (MADV_POPULATE_READ over the used
 * part of each arena), in a thread of its own or in the caller's.  rk_init
 * starts it with RK_OPT_PREFAULT.  (The same faults made 512 times fewer:
 * hugepages.c.) */
#include "rk_internal.h"

#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
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
