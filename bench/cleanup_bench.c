/* cleanup_bench - how long a warm start takes to serve again, with the
 * README's two recovery templates: mark everything then sweep
 * (RK_CLEANUP_SWEEP, the old template) and the pending cleanup
 * (RK_CLEANUP_PENDING, the new one).
 *
 *   cleanup_bench --objects N [--runs R] [--threads T] [--inflight K]
 *
 * The first incarnation builds a hash table of N entries in an arena (a
 * bucket array of N pointers, chained entries of 48 to 112 bytes, each with
 * its key), every insertion inside an unsafe region, as an app would.  Then,
 * in every incarnation, T threads each allocate K objects that nothing
 * reaches (the requests in flight) and the process restarts (rk_restart,
 * in place).  Warm incarnations alternate the two modes, R of each, so that
 * drift on a noisy machine hits both alike.  Each prints one JSON line:
 *
 *   main_to_init_us     main() entry to rk_init's return
 *   recover_us          rk_init's return to the end of recovery (for sweep:
 *                       the mark walk and rk_finish_recovery; for pending:
 *                       rk_root_get and rk_finish_recovery_mode)
 *   first_request_us    then one lookup of a random key (the first request)
 *   serving_us          main() entry to that lookup's answer: the sum
 *   restart_us          the previous incarnation's rk_restart to our rk_init
 *                       return (the runtime's own measure)
 *   freed, kept         what the cleanup freed, and (sweep) kept
 *
 * The page faults of the first touch of every preserved page after the
 * restart are part of what the mark walk costs: that is what an app pays. */
#include "rekindle.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct entry {
	struct entry *next;
	uint64_t hash;
	uint32_t klen, vlen;
	char data[]; /* key, then value */
};

struct table {
	uint64_t magic;
	uint64_t mask; /* buckets - 1 */
	uint64_t count;
	struct entry **buckets;
};

#define TABLE_MAGIC 0x686374626e656c63ull

/* Progress across incarnations: not part of the measured state. */
RK_PRESERVED static unsigned done_pending, done_sweep;
RK_PRESERVED static uint64_t opt_objects;
RK_PRESERVED static unsigned opt_runs, opt_threads, opt_inflight;

static rk_arena *arena;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

static int key_of(uint64_t i, char *buf)
{
	return snprintf(buf, 32, "key:%llu", (unsigned long long)i);
}

static struct table *build(uint64_t n)
{
	uint64_t nb = 1;
	while (nb < n)
		nb <<= 1;
	rk_unsafe_begin(arena);
	struct table *t = rk_calloc(arena, 1, sizeof *t);
	struct entry **b = t ? rk_calloc(arena, nb, sizeof *b) : NULL;
	if (!b) {
		fprintf(stderr, "cleanup_bench: out of arena memory\n");
		exit(1);
	}
	t->magic = TABLE_MAGIC;
	t->mask = nb - 1;
	t->buckets = b;
	rk_unsafe_end(arena);
	rk_root_set(arena, "table", t);
	for (uint64_t i = 0; i < n; i++) {
		char key[32];
		int klen = key_of(i, key);
		uint32_t vlen = 16 + (uint32_t)(mix(i) % 64);
		rk_unsafe_begin(arena);
		struct entry *e = rk_alloc(arena, sizeof *e + (size_t)klen + vlen);
		if (!e) {
			fprintf(stderr, "cleanup_bench: out of arena memory at %llu\n", (unsigned long long)i);
			exit(1);
		}
		e->hash = mix(i + 1);
		e->klen = (uint32_t)klen;
		e->vlen = vlen;
		memcpy(e->data, key, (size_t)klen);
		memset(e->data + klen, 'v', vlen);
		uint64_t k = e->hash & t->mask;
		e->next = b[k];
		b[k] = e;
		t->count++;
		rk_unsafe_end(arena);
	}
	return t;
}

/* The README's old template: mark everything the roots reach. */
static uint64_t mark_all(struct table *t)
{
	uint64_t n = 0;
	rk_mark(arena, t);
	rk_mark(arena, t->buckets);
	for (uint64_t k = 0; k <= t->mask; k++)
		for (struct entry *e = t->buckets[k]; e; e = e->next) {
			rk_mark(arena, e);
			n++;
		}
	return n;
}

static const struct entry *lookup(const struct table *t, uint64_t i)
{
	char key[32];
	int klen = key_of(i, key);
	for (const struct entry *e = t->buckets[mix(i + 1) & t->mask]; e; e = e->next)
		if (e->klen == (uint32_t)klen && !memcmp(e->data, key, (size_t)klen))
			return e;
	return NULL;
}

/* ---- requests in flight at the restart ---- */

static sem_t started, never;

static void *inflight(void *arg)
{
	(void)arg;
	for (unsigned k = 0; k < opt_inflight; k++)
		(void)rk_alloc(arena, 64 + 32 * (k % 8)); /* pending: never published */
	sem_post(&started);
	sem_wait(&never); /* the restart's exec ends us here */
	return NULL;
}

static void restart_with_requests_in_flight(void)
{
	sem_init(&started, 0, 0);
	sem_init(&never, 0, 0);
	for (unsigned i = 0; i < opt_threads; i++) {
		pthread_t t;
		pthread_create(&t, NULL, inflight, NULL);
	}
	for (unsigned i = 0; i < opt_threads; i++)
		sem_wait(&started);
	fflush(stdout);
	int r = rk_restart("cleanup_bench");
	fprintf(stderr, "cleanup_bench: rk_restart: %s\n", strerror(-r));
	exit(1);
}

static int parse(int argc, char **argv)
{
	opt_runs = 5;
	opt_threads = 4;
	opt_inflight = 16;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--objects"))
			opt_objects = strtoull(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--runs"))
			opt_runs = (unsigned)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--threads"))
			opt_threads = (unsigned)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--inflight"))
			opt_inflight = (unsigned)atoi(argv[i + 1]);
		else
			return -1;
	}
	return opt_objects ? 0 : -1;
}

int main(int argc, char **argv)
{
	uint64_t t_main = now_ns();
	/* restarts in quick succession are the point: no crash-loop window */
	setenv("REKINDLE_CRASHLOOP_MS", "0", 1);
	int r = rk_init(argc, argv, &(struct rk_options){.flags = RK_OPT_QUIET});
	uint64_t t_init = now_ns();
	if (r < 0) {
		fprintf(stderr, "cleanup_bench: rk_init: %s\n", strerror(-r));
		return 1;
	}
	const struct rk_restart_info *info = rk_restart_info();
	if (info->kind == RK_START_FRESH && parse(argc, argv) < 0) {
		fprintf(stderr, "usage: cleanup_bench --objects N [--runs R] [--threads T] [--inflight K]\n");
		return 2;
	}
	if (info->kind == RK_START_COLD) {
		fprintf(stderr, "cleanup_bench: a cold start: %s\n", info->decision);
		return 1;
	}
	/* 160 bytes of arena per object, generously */
	uint64_t arena_bytes = (opt_objects * 160 + (256ull << 20) + (1ull << 30) - 1) & ~((1ull << 30) - 1);
	arena = rk_arena_open("bench", arena_bytes);
	if (!arena) {
		fprintf(stderr, "cleanup_bench: rk_arena_open: %s\n", strerror(errno));
		return 1;
	}
	if (info->kind == RK_START_FRESH) {
		uint64_t t0 = now_ns();
		build(opt_objects);
		fprintf(stderr, "cleanup_bench: built %llu entries in %.0f ms\n", (unsigned long long)opt_objects,
			(double)(now_ns() - t0) / 1e6);
		restart_with_requests_in_flight();
	}
	/* a warm start: sweep and pending alternate */
	bool sweep = done_sweep < done_pending;
	struct rk_cleanup_stats st;
	uint64_t marked = 0;
	struct table *t = rk_root_get(arena, "table");
	if (sweep) {
		marked = mark_all(t);
		r = rk_finish_recovery_mode(RK_CLEANUP_SWEEP, &st);
	} else {
		r = rk_finish_recovery_mode(RK_CLEANUP_PENDING, &st);
	}
	uint64_t t_recovered = now_ns();
	const struct entry *e = lookup(t, mix(info->generation) % t->count);
	uint64_t t_served = now_ns();
	if (r < 0 || !e) {
		fprintf(stderr, "cleanup_bench: recovery failed (%d) or the key is missing\n", r);
		return 1;
	}
	printf("{\"bench\":\"cleanup\",\"objects\":%llu,\"mode\":\"%s\",\"generation\":%u,\"main_to_init_us\":%.1f,"
	       "\"recover_us\":%.1f,\"first_request_us\":%.1f,\"serving_us\":%.1f,\"restart_us\":%.1f,"
	       "\"freed\":%llu,\"kept\":%llu,\"marked\":%llu,\"pending\":%llu,\"cleanup_us\":%.1f}\n",
	       (unsigned long long)opt_objects, sweep ? "sweep" : "pending", info->generation,
	       (double)(t_init - t_main) / 1e3, (double)(t_recovered - t_init) / 1e3,
	       (double)(t_served - t_recovered) / 1e3, (double)(t_served - t_main) / 1e3,
	       (double)info->restart_ns / 1e3, (unsigned long long)st.objects_freed,
	       (unsigned long long)st.objects_kept, (unsigned long long)marked, (unsigned long long)st.pending,
	       (double)st.cleanup_ns / 1e3);
	if (sweep)
		done_sweep++;
	else
		done_pending++;
	if (done_sweep >= opt_runs && done_pending >= opt_runs)
		return 0;
	restart_with_requests_in_flight();
}
