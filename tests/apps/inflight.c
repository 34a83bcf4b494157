/* inflight - threads that allocate, publish inside unsafe regions and hand
 * objects to each other, killed at random points; each warm start checks
 * the O(in-flight) cleanup (tests/test_inflight.py).
 *
 *   inflight [--mode pending|check|sweep] [--seed S] [--threads N]
 *            [--rounds N] [--fault none|mixed|outside|inside|signal]
 *
 * The arena "data" holds a table of SLOTS pointers (root "table"); each
 * object holds its id, its size and a byte pattern of its id.  Workers (all
 * threads but the last) change the table inside regions: replace a slot
 * with an object allocated before the region or inside it (the old object
 * is freed inside the region), delete, churn through temporaries, or
 * publish an object the producer (the last thread, which never commits)
 * handed over through a FIFO in process memory, with rk_keep inside the
 * publishing region (or drop it with rk_free); it is taken from the FIFO
 * inside that region, so a handed-over object is always either in the FIFO
 * (among the producer's last 8 allocations, which its log holds) or inside
 * a region.
 *
 * A warm start, before anything else: every object the table reaches is
 * checked (its pattern), the arena is counted (rk_arena_census), recovery
 * ends with --mode's cleanup (check: the app first marks what the table
 * reaches), and the census after must be exactly the table and what it
 * reaches.  Then a batch of new objects is written and the reachable ones
 * are checked again (a freed one would have been reused).  One line:
 *   {"app":"inflight","kind":"warm","generation":G,"reachable":N,"before":B,
 *    "after":A,"freed":F,"pending":P,"leaked":L,"lost":X,"damaged":D,...}
 * A fresh or cold start prints {"app":"inflight","kind":"fresh"|"cold",...}.
 *
 * Then the workers run.  With --fault (default mixed), the incarnation dies
 * by itself after a random 20-150 ms (seeded by --seed and the generation):
 * outside (a worker allocates a few objects and writes through NULL outside
 * any region: warm), inside (the same inside a region: cold), signal (a
 * SIGSEGV sent to a worker, which it takes wherever it is).  After --rounds
 * starts the app exits 0.  With --fault none it runs until killed (the
 * pytest kills it with SIGKILL under `rekindle run`). */
#include "rekindle.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 256
#define MAX_THREADS 8
#define FIFO 8
#define TABLE_MAGIC 0x656c626174666c69ull

struct obj {
	uint64_t id;
	uint64_t size;
	/* then pattern bytes */
};

struct table {
	uint64_t magic;
	struct obj *slot[SLOTS];
};

static rk_arena *arena;
static struct table *table;
static enum rk_cleanup mode = RK_CLEANUP_PENDING;
static uint64_t seed = 1;
static unsigned nthreads = 4, rounds = 10;
static const char *fault = "mixed";
static volatile int *volatile null_ptr;

/* ---- transient state (process memory) ---- */
static _Atomic int slot_lock[SLOTS];
static _Atomic uint64_t next_id = 1;
static pthread_t threads[MAX_THREADS];
/* the producer's FIFO: handed-over objects, taken oldest first */
static _Atomic int fifo_lock;
static struct obj *fifo[FIFO];
static unsigned fifo_head, fifo_n;
/* a worker sets it to die at its next operation: 1 outside a region, 2 inside */
static _Atomic int die_how;

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rng_range(uint64_t *s, uint64_t lo, uint64_t hi)
{
	return lo + rng_next(s) % (hi - lo + 1);
}

static uint8_t pattern(uint64_t id)
{
	return (uint8_t)(((id * 0x9e3779b97f4a7c15ull) >> 56) | 1);
}

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void spin_lock(_Atomic int *l)
{
	int z = 0;
	for (unsigned n = 0; !atomic_compare_exchange_weak(l, &z, 1); n++) {
		z = 0;
		if (n > 100)
			sched_yield();
	}
}

static void spin_unlock(_Atomic int *l)
{
	atomic_store(l, 0);
}

/* ---- objects ---- */

static size_t pick_size(uint64_t *r)
{
	uint64_t k = rng_range(r, 0, 199);
	if (k == 0)
		return (size_t)rng_range(r, 33000, 200000); /* a page run */
	if (k < 20)
		return (size_t)rng_range(r, 4000, 32000);
	return (size_t)rng_range(r, 16, 600);
}

static struct obj *obj_new(uint64_t *r)
{
	size_t size = pick_size(r);
	struct obj *o = rk_alloc(arena, size);
	if (!o)
		return NULL;
	uint64_t id = atomic_fetch_add(&next_id, 1);
	o->id = id;
	o->size = size;
	if (size > 16)
		memset(o + 1, pattern(id), size - 16);
	return o;
}

static bool obj_intact(const struct obj *o)
{
	if (!rk_arena_contains(arena, o) || o->size < 16 || o->size > 200000 || o->id == 0)
		return false;
	const uint8_t *b = (const uint8_t *)(o + 1);
	uint8_t want = pattern(o->id);
	for (size_t i = 0; i + 16 < o->size; i++)
		if (b[i] != want)
			return false;
	return true;
}

/* ---- the workers ---- */

/* Dies now if asked to: outside a region, or inside one (after changing
 * the table, so the state is half-changed). */
static void maybe_die_outside(uint64_t *r)
{
	if (atomic_load(&die_how) != 1 || atomic_exchange(&die_how, 0) != 1)
		return;
	/* objects in flight at the failure: pending, to be freed */
	for (unsigned i = 0, n = (unsigned)rng_range(r, 1, 5); i < n; i++)
		(void)obj_new(r);
	*null_ptr = 1;
}

static void maybe_die_inside(void)
{
	if (atomic_load(&die_how) == 2 && atomic_exchange(&die_how, 0) == 2)
		*null_ptr = 2;
}

/* Slot i := o (NULL deletes) inside a region; the old object is freed inside
 * it too. */
static void publish(unsigned i, struct obj *o)
{
	spin_lock(&slot_lock[i]);
	rk_unsafe_begin(arena);
	struct obj *old = table->slot[i];
	table->slot[i] = o;
	maybe_die_inside();
	if (old)
		rk_free(arena, old);
	rk_unsafe_end(arena);
	spin_unlock(&slot_lock[i]);
}

static void *producer(void *arg)
{
	uint64_t r = seed * 1000003 + (uint64_t)(uintptr_t)arg;
	for (;;) {
		struct obj *o = obj_new(&r);
		if (!o)
			continue;
		spin_lock(&fifo_lock);
		bool pushed = fifo_n < FIFO;
		if (pushed)
			fifo[(fifo_head + fifo_n++) % FIFO] = o;
		spin_unlock(&fifo_lock);
		if (!pushed) {
			rk_free(arena, o); /* a temporary after all */
			sched_yield();
		}
	}
	return NULL;
}

static struct obj *fifo_take(void)
{
	struct obj *o = NULL;
	spin_lock(&fifo_lock);
	if (fifo_n) {
		o = fifo[fifo_head];
		fifo_head = (fifo_head + 1) % FIFO;
		fifo_n--;
	}
	spin_unlock(&fifo_lock);
	return o;
}

static void *worker(void *arg)
{
	uint64_t r = seed * 7919 + (uint64_t)(uintptr_t)arg * 104729 + rk_restart_info()->generation;
	for (;;) {
		maybe_die_outside(&r);
		unsigned op = (unsigned)rng_range(&r, 0, 99), i = (unsigned)rng_range(&r, 0, SLOTS - 1);
		if (op < 30) { /* allocate outside, publish in a later region */
			struct obj *o = obj_new(&r);
			struct obj *tmp = rng_range(&r, 0, 1) ? obj_new(&r) : NULL;
			if (tmp)
				rk_free(arena, tmp);
			if (o)
				publish(i, o);
		} else if (op < 50) { /* allocate inside the region */
			spin_lock(&slot_lock[i]);
			rk_unsafe_begin(arena);
			struct obj *o = obj_new(&r), *old = table->slot[i];
			if (o) {
				table->slot[i] = o;
				maybe_die_inside();
				if (old)
					rk_free(arena, old);
			}
			rk_unsafe_end(arena);
			spin_unlock(&slot_lock[i]);
		} else if (op < 60) { /* delete */
			publish(i, NULL);
		} else if (op < 85) { /* a handed-over object: publish it or drop it */
			/* Taken inside the region: an object is always in the FIFO
			 * (among the producer's last 8 allocations, so in its log)
			 * or inside the region that publishes or frees it. */
			bool drop = rng_range(&r, 0, 3) == 0;
			spin_lock(&slot_lock[i]);
			rk_unsafe_begin(arena);
			struct obj *o = fifo_take(), *old = table->slot[i];
			if (o && !drop) {
				table->slot[i] = o;
				rk_keep(arena, o);
				maybe_die_inside();
				if (old)
					rk_free(arena, old);
			} else if (o) {
				rk_free(arena, o);
			}
			rk_unsafe_end(arena);
			spin_unlock(&slot_lock[i]);
		} else { /* temporaries */
			struct obj *tmp[8];
			unsigned n = (unsigned)rng_range(&r, 1, 8);
			for (unsigned k = 0; k < n; k++)
				tmp[k] = obj_new(&r);
			for (unsigned k = n; k-- > 0;)
				if (tmp[k])
					rk_free(arena, tmp[k]);
		}
	}
	return NULL;
}

/* ---- the checks of a warm start ---- */

struct vec {
	uint64_t *v;
	size_t n, cap;
};

static void vec_add(struct vec *s, const void *p)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 1024;
		s->v = realloc(s->v, s->cap * sizeof *s->v);
		if (!s->v) {
			fprintf(stderr, "inflight: out of memory\n");
			exit(3);
		}
	}
	s->v[s->n++] = (uint64_t)(uintptr_t)p;
}

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

static void census_add(void *obj, size_t size, void *ctx)
{
	(void)size;
	vec_add(ctx, obj);
}

static uint64_t damaged_count(void)
{
	uint64_t bad = 0;
	for (unsigned i = 0; i < SLOTS; i++)
		if (table->slot[i] && !obj_intact(table->slot[i]))
			bad++;
	return bad;
}

static void warm_start(void)
{
	double t0 = now_ms();
	table = rk_root_get(arena, "table");
	if (!table || table->magic != TABLE_MAGIC) {
		printf("{\"app\":\"inflight\",\"kind\":\"warm\",\"error\":\"no table\"}\n");
		exit(2);
	}
	struct vec reach = {0}, after = {0};
	vec_add(&reach, table);
	for (unsigned i = 0; i < SLOTS; i++)
		if (table->slot[i])
			vec_add(&reach, table->slot[i]);
	uint64_t damaged = damaged_count();
	struct rk_census before, cafter;
	int cr = rk_arena_census(arena, NULL, NULL, &before);
	if (mode == RK_CLEANUP_CHECK || mode == RK_CLEANUP_SWEEP)
		for (size_t k = 0; k < reach.n; k++)
			rk_mark(arena, (void *)(uintptr_t)reach.v[k]);
	struct rk_cleanup_stats st;
	double t1 = now_ms();
	int fr = rk_finish_recovery_mode(mode, &st);
	double t2 = now_ms();
	int ca = rk_arena_census(arena, census_add, &after, &cafter);
	qsort(reach.v, reach.n, sizeof *reach.v, cmp_u64);
	qsort(after.v, after.n, sizeof *after.v, cmp_u64);
	uint64_t leaked = 0, lost = 0, first_leaked = 0, first_lost = 0;
	for (size_t i = 0, j = 0; i < after.n || j < reach.n;) {
		if (j == reach.n || (i < after.n && after.v[i] < reach.v[j])) {
			if (!leaked++)
				first_leaked = after.v[i];
			i++;
		} else if (i == after.n || reach.v[j] < after.v[i]) {
			if (!lost++)
				first_lost = reach.v[j];
			j++;
		} else {
			i++, j++;
		}
	}
	/* new objects over what was freed: a freed reachable object is reused */
	uint64_t r = seed ^ 0x5bd1e995;
	struct obj *fresh[512];
	unsigned nfresh = 0;
	for (; nfresh < 512; nfresh++)
		if (!(fresh[nfresh] = obj_new(&r)))
			break;
	damaged += damaged_count();
	for (unsigned k = 0; k < nfresh; k++)
		rk_free(arena, fresh[k]);
	rk_commit(); /* a clean log (the 512 overflowed it) */
	printf("{\"app\":\"inflight\",\"kind\":\"warm\",\"pid\":%d,\"generation\":%u,\"mode\":\"%s\",\"reachable\":%zu,"
	       "\"before\":%llu,\"after\":%llu,\"freed\":%llu,\"pending\":%llu,\"overflow\":%llu,"
	       "\"pending_reached\":%llu,\"swept_not_pending\":%llu,\"leaked\":%llu,\"lost\":%llu,"
	       "\"first_leaked\":\"0x%llx\",\"first_lost\":\"0x%llx\",\"damaged\":%llu,\"census\":[%d,%d],"
	       "\"finish\":%d,\"check_ms\":%.2f,\"cleanup_ms\":%.3f,\"decision\":\"%s\"}\n",
	       (int)getpid(), rk_restart_info()->generation,
	       mode == RK_CLEANUP_PENDING ? "pending" : mode == RK_CLEANUP_CHECK ? "check" : "sweep", reach.n,
	       (unsigned long long)before.objects, (unsigned long long)cafter.objects,
	       (unsigned long long)st.objects_freed, (unsigned long long)st.pending,
	       (unsigned long long)st.pending_overflow, (unsigned long long)st.pending_reached,
	       (unsigned long long)st.swept_not_pending, (unsigned long long)leaked, (unsigned long long)lost,
	       (unsigned long long)first_leaked, (unsigned long long)first_lost, (unsigned long long)damaged, cr, ca,
	       fr, t1 - t0, t2 - t1, rk_restart_info()->decision);
	free(reach.v);
	free(after.v);
}

static void fresh_start(void)
{
	table = rk_calloc(arena, 1, sizeof *table);
	if (!table) {
		fprintf(stderr, "inflight: cannot allocate the table\n");
		exit(2);
	}
	table->magic = TABLE_MAGIC;
	rk_root_set(arena, "table", table);
	const struct rk_restart_info *in = rk_restart_info();
	printf("{\"app\":\"inflight\",\"kind\":\"%s\",\"pid\":%d,\"generation\":%u,\"decision\":\"%s\"}\n",
	       in->kind == RK_START_COLD ? "cold" : "fresh", (int)getpid(), in->generation, in->decision);
}

static void parse(int argc, char **argv)
{
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];
		if (!strcmp(k, "--mode"))
			mode = !strcmp(v, "check") ? RK_CLEANUP_CHECK : !strcmp(v, "sweep") ? RK_CLEANUP_SWEEP
											      : RK_CLEANUP_PENDING;
		else if (!strcmp(k, "--seed"))
			seed = strtoull(v, NULL, 10);
		else if (!strcmp(k, "--threads"))
			nthreads = (unsigned)atoi(v);
		else if (!strcmp(k, "--rounds"))
			rounds = (unsigned)atoi(v);
		else if (!strcmp(k, "--fault"))
			fault = v;
		else {
			fprintf(stderr, "inflight: unknown option %s\n", k);
			exit(2);
		}
	}
	if (nthreads < 2 || nthreads > MAX_THREADS) {
		fprintf(stderr, "inflight: --threads 2..%d\n", MAX_THREADS);
		exit(2);
	}
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	int r = rk_init(argc, argv, NULL);
	if (r < 0) {
		fprintf(stderr, "inflight: rk_init: %s\n", strerror(-r));
		return 2;
	}
	parse(argc, argv);
	arena = rk_arena_open("data", 1ull << 30);
	if (!arena) {
		fprintf(stderr, "inflight: rk_arena_open: %s\n", strerror(errno));
		return 2;
	}
	if (rk_is_recovery())
		warm_start();
	else
		fresh_start();
	rk_ready();
	unsigned gen = rk_restart_info()->generation;
	if (strcmp(fault, "none") != 0 && gen >= rounds)
		return 0;
	for (unsigned k = 0; k + 1 < nthreads; k++)
		pthread_create(&threads[k], NULL, worker, (void *)(uintptr_t)k);
	pthread_create(&threads[nthreads - 1], NULL, producer, (void *)(uintptr_t)(nthreads - 1));
	if (!strcmp(fault, "none"))
		for (;;)
			pause();
	uint64_t rr = seed * 31 + gen * 1000033;
	struct timespec d = {0, (long)rng_range(&rr, 20, 150) * 1000000L};
	nanosleep(&d, NULL);
	const char *how = fault;
	if (!strcmp(fault, "mixed")) {
		uint64_t k = rng_range(&rr, 0, 99);
		how = k < 45 ? "outside" : k < 80 ? "signal" : "inside";
	}
	fprintf(stderr, "inflight: generation %u dies: %s\n", gen, how);
	if (!strcmp(how, "signal"))
		pthread_kill(threads[rng_range(&rr, 0, nthreads - 1)], SIGSEGV);
	else
		atomic_store(&die_how, !strcmp(how, "inside") ? 2 : 1);
	for (;;)
		pause();
}
