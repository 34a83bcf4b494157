/* test_sweep - mark and sweep, the cleanup of a warm restart, without a
 * real restart.
 *
 * A warm start leaves each inherited arena with sweep_pending set (and
 * rk_g.recovery, for rk_finish_recovery); dead threads' caches are folded
 * back by rk_arena_recover first.  These tests build that state by hand in
 * an arena of this process: objects allocated before sweep_pending stand
 * for the previous incarnation's, and the sweep must free exactly those not
 * marked, keep the marked ones (and those born during recovery) with their
 * content, and account for every byte. */
#include "testlib.h"

#include <pthread.h>
#include <semaphore.h>

struct tobj {
	uint8_t *p;
	size_t size;
	bool live;  /* allocated when the sweep runs */
	bool keep;  /* marked, or born during recovery */
};

static size_t old_size(unsigned i)
{
	static const size_t small[] = {16, 48, 100, 256, 1000, 4000, 20000, RK_SMALL_MAX};
	return i % 50 == 49 ? (size_t)(40 << 10) + (i % 9) * 40000 : small[i % 8];
}

static uint64_t usable(rk_arena *a, const struct tobj *o)
{
	return rk_usable_size(a, o->p);
}

/* Totals the sweep should report for objs. */
static struct rk_sweep_stats expected(rk_arena *a, const struct tobj *objs, unsigned n)
{
	struct rk_sweep_stats e = {0};
	for (unsigned i = 0; i < n; i++) {
		if (!objs[i].live)
			continue;
		if (objs[i].keep) {
			e.objects_kept++;
			e.bytes_kept += usable(a, &objs[i]);
		} else {
			e.objects_freed++;
			e.bytes_freed += usable(a, &objs[i]);
		}
	}
	return e;
}

static void check_stats(const struct rk_sweep_stats *got, const struct rk_sweep_stats *want)
{
	CHECK_EQ(got->objects_freed, want->objects_freed);
	CHECK_EQ(got->bytes_freed, want->bytes_freed);
	CHECK_EQ(got->objects_kept, want->objects_kept);
	CHECK_EQ(got->bytes_kept, want->bytes_kept);
}

static void check_sound(rk_arena *a)
{
	char why[192];
	int r = validate(a, why, sizeof why);
	CHECK_MSG(r == 0, "arena %s refused after the sweep: %d \"%s\"", a->name, r, why);
}

/* ---- the sweep frees exactly what was not marked --------------------------- */

#define NOLD 3000
#define NBORN 300

static void sweep_frees_exactly_the_unmarked(void)
{
	rk_arena *a = test_arena("sweep", 256u << 20);
	static struct tobj objs[NOLD + NBORN];
	for (unsigned i = 0; i < NOLD; i++) {
		objs[i] = (struct tobj){.p = rk_alloc(a, old_size(i)), .size = old_size(i), .live = true};
		pat_fill(objs[i].p, 0, objs[i].size, i);
	}
	/* objects freed before the "crash": on free lists, neither freed nor kept */
	for (unsigned i = 3; i < NOLD; i += 7) {
		rk_free(a, objs[i].p);
		objs[i].live = false;
	}

	CHECK_EQ_INT(rk_mark(a, objs[0].p), -EPERM); /* marks only mean something in recovery */
	a->sweep_pending = true;                      /* as a warm rk_init leaves it */

	unsigned newly = 0, marked = 0, again = 0;
	for (unsigned i = 0; i < NOLD; i++) {
		struct tobj *o = &objs[i];
		if (!o->live || i % 3 == 2)
			continue;
		o->keep = true;
		marked++;
		/* any pointer into the object marks it */
		newly += rk_mark(a, i % 3 == 1 ? o->p + o->size / 2 : o->p) == 1;
		if (i % 5 == 0)
			again += rk_mark(a, o->p + o->size - 1) == 0;
	}
	CHECK_EQ(newly, marked);
	CHECK_MSG(again > 100, "re-marking returned 0 only %u times", again);
	int on_stack;
	CHECK_EQ_INT(rk_mark(a, &on_stack), -EINVAL);
	CHECK_EQ_INT(rk_mark(a, a->hdr), -EINVAL);
	CHECK_EQ_INT(rk_mark(a, NULL), -EINVAL);
	CHECK_EQ_INT(rk_mark(NULL, objs[0].p), -EINVAL);
	CHECK_EQ_INT(rk_mark(a, objs[199].p), -EINVAL); /* a freed page run */
	CHECK(!objs[199].live && objs[199].size > RK_SMALL_MAX);

	/* During recovery the application allocates (born marked) and frees. */
	for (unsigned i = NOLD; i < NOLD + NBORN; i++) {
		objs[i] = (struct tobj){.p = rk_alloc(a, old_size(i)), .size = old_size(i), .live = true, .keep = true};
		pat_fill(objs[i].p, 0, objs[i].size, i);
	}
	for (unsigned i = NOLD; i < NOLD + NBORN; i += 10) {
		rk_free(a, objs[i].p);
		objs[i].live = false;
	}
	for (unsigned i = 5; i < NOLD; i += 11) /* old unmarked and marked ones */
		if (objs[i].live) {
			rk_free(a, objs[i].p);
			objs[i].live = false;
		}

	struct rk_sweep_stats want = expected(a, objs, NOLD + NBORN), got = {0};
	uint64_t before = allocated_bytes(a);
	CHECK_MSG(want.objects_freed > 500 && want.objects_kept > 1000, "freed %" PRIu64 ", kept %" PRIu64,
		  want.objects_freed, want.objects_kept);
	CHECK_EQ_INT(rk_arena_sweep(a, &got, NULL, 0, NULL), 0);
	a->sweep_pending = false; /* as rk_finish_recovery does */
	check_stats(&got, &want);
	CHECK_EQ(allocated_bytes(a), before - want.bytes_freed);

	unsigned bad = 0, still_there = 0;
	for (unsigned i = 0; i < NOLD + NBORN; i++) {
		const struct tobj *o = &objs[i];
		if (o->live && o->keep)
			bad += pat_find_bad(o->p, o->size, i) >= 0;
		else if (o->live && o->size > RK_SMALL_MAX)
			still_there += rk_usable_size(a, o->p) != 0; /* swept runs are free */
	}
	CHECK_EQ(bad, 0);
	CHECK_EQ(still_there, 0);
	CHECK_EQ_INT(rk_mark(a, objs[0].p), -EPERM);
	check_sound(a);

	/* The freed memory is reused: allocating the swept small objects again
	 * needs no new heap. */
	uint64_t top = heap_bytes(a);
	for (unsigned i = 0; i < NOLD; i++) {
		struct tobj *o = &objs[i];
		if (o->live && !o->keep && o->size <= RK_SMALL_MAX) {
			o->p = rk_alloc(a, o->size);
			o->keep = true;
		} else if (o->live && !o->keep) {
			o->live = false;
		}
	}
	CHECK_EQ(heap_bytes(a), top);
	for (unsigned i = 0; i < NOLD + NBORN; i++)
		if (objs[i].live)
			rk_free(a, objs[i].p);
	CHECK_EQ(allocated_bytes(a), 0);
	check_sound(a);
}

/* ---- the sweep waits for other threads' caches ------------------------------ */

static rk_arena *busy_arena;
static sem_t ready, go;

static void *cache_holder(void *unused)
{
	(void)unused;
	uint8_t *p[10];
	for (unsigned i = 0; i < 10; i++) {
		p[i] = rk_alloc(busy_arena, 64);
		pat_fill(p[i], 0, 64, i);
	}
	rk_free(busy_arena, p[9]); /* a block in this thread's cache */
	sem_post(&ready);
	sem_wait(&go);
	unsigned bad = 0;
	for (unsigned i = 0; i < 9; i++) {
		bad += pat_find_bad(p[i], 64, i) >= 0;
		rk_free(busy_arena, p[i]);
	}
	CHECK_EQ(bad, 0);
	return NULL;
}

static void sweep_refused_while_other_caches_live(void)
{
	busy_arena = test_arena("sweep-busy", 16u << 20);
	sem_init(&ready, 0, 0);
	sem_init(&go, 0, 0);
	pthread_t t;
	pthread_create(&t, NULL, cache_holder, NULL);
	sem_wait(&ready);
	busy_arena->sweep_pending = true;
	uint64_t before = allocated_bytes(busy_arena);
	struct rk_sweep_stats st = {0};
	CHECK_EQ_INT(rk_arena_sweep(busy_arena, &st, NULL, 0, NULL), -EBUSY);
	CHECK_EQ(st.objects_freed + st.objects_kept, 0);
	CHECK_EQ(allocated_bytes(busy_arena), before);
	sem_post(&go);
	pthread_join(t, NULL);
	CHECK_EQ_INT(rk_arena_sweep(busy_arena, &st, NULL, 0, NULL), 0);
	busy_arena->sweep_pending = false;
	CHECK_EQ(st.objects_freed + st.objects_kept, 0);
	CHECK_EQ(allocated_bytes(busy_arena), 0);
	check_sound(busy_arena);
}

/* ---- caches of threads that died are folded in first ----------------------- */

#define NDEAD 300

static rk_arena *dead_arena;
static uint8_t *dead_objs[NDEAD];
static sem_t dead_ready, never;

/* Leaves blocks in its cache, then stays blocked, as if killed: its exit
 * would give the cache back, which a dead incarnation's threads never do. */
static void *dying_thread(void *unused)
{
	(void)unused;
	for (unsigned i = 0; i < NDEAD; i++)
		dead_objs[i] = rk_alloc(dead_arena, 64);
	for (unsigned i = 1; i < NDEAD; i += 2)
		rk_free(dead_arena, dead_objs[i]);
	sem_post(&dead_ready);
	sem_wait(&never);
	return NULL;
}

static void dead_threads_caches_are_free(void)
{
	dead_arena = test_arena("sweep-dead", 16u << 20);
	sem_init(&dead_ready, 0, 0);
	sem_init(&never, 0, 0);
	pthread_t t;
	pthread_create(&t, NULL, dying_thread, NULL);
	sem_wait(&dead_ready);
	pthread_detach(t);
	CHECK_EQ(owned_caches(dead_arena), 1);

	rk_arena_recover(dead_arena); /* what a warm rk_init does with each arena */
	CHECK_EQ(owned_caches(dead_arena), 0);
	CHECK_EQ(allocated_bytes(dead_arena), (NDEAD / 2) * 64);
	check_sound(dead_arena);

	dead_arena->sweep_pending = true;
	for (unsigned i = 0; i < NDEAD; i += 4)
		rk_mark(dead_arena, dead_objs[i]);
	struct rk_sweep_stats st = {0};
	CHECK_EQ_INT(rk_arena_sweep(dead_arena, &st, NULL, 0, NULL), 0);
	dead_arena->sweep_pending = false;
	/* the blocks the dead thread had cached count as free, not as freed */
	CHECK_EQ(st.objects_kept, NDEAD / 4);
	CHECK_EQ(st.objects_freed, NDEAD / 2 - NDEAD / 4);
	CHECK_EQ(st.bytes_freed, (NDEAD / 2 - NDEAD / 4) * 64);
	CHECK_EQ(allocated_bytes(dead_arena), (NDEAD / 4) * 64);
	check_sound(dead_arena);
}

/* ---- rk_finish_recovery, the public end of recovery ------------------------- */

static void finish_recovery_sweeps_and_drops(void)
{
	rk_arena *warm = test_arena("sweep-warm", 64u << 20);
	rk_arena *stale = test_arena("sweep-stale", 8u << 20);
	enum { N = 200 };
	static struct tobj objs[N];
	for (unsigned i = 0; i < N; i++) {
		objs[i] = (struct tobj){.p = rk_alloc(warm, old_size(i)), .size = old_size(i), .live = true};
		pat_fill(objs[i].p, 0, objs[i].size, i);
	}
	void *stale_obj = rk_alloc(stale, 100);
	CHECK(rk_arena_contains(stale, stale_obj));

	/* what a warm rk_init (rk_recovery_attach) leaves: arenas inherited,
	 * sweep pending, recovery on; "sweep-stale" was not reopened by the
	 * new incarnation */
	warm->inherited = stale->inherited = true;
	warm->sweep_pending = stale->sweep_pending = true;
	stale->reopened = false;
	rk_g.recovery = true;
	CHECK(rk_is_recovery());

	for (unsigned i = 0; i < N; i++)
		if ((objs[i].keep = i % 2 == 0 || i == N - 1)) /* the last is a page run */
			rk_mark(warm, objs[i].p);
	struct rk_sweep_stats want = expected(warm, objs, N), got;
	uint64_t before = allocated_bytes(warm);
	CHECK_EQ_INT(rk_finish_recovery(true, &got), 0);
	check_stats(&got, &want);
	CHECK(!rk_is_recovery());
	CHECK(!warm->sweep_pending);
	CHECK_EQ(allocated_bytes(warm), before - want.bytes_freed);
	unsigned bad = 0;
	for (unsigned i = 0; i < N; i += 2)
		bad += pat_find_bad(objs[i].p, objs[i].size, i) >= 0;
	CHECK_EQ(bad, 0);
	/* the arena nobody reopened is gone */
	struct rk_arena_stats st;
	CHECK_EQ_INT(rk_arena_stats(stale, &st), -EINVAL);
	CHECK(!rk_arena_contains(stale, stale_obj));
	check_sound(warm);

	/* outside recovery there is nothing to do */
	CHECK_EQ_INT(rk_finish_recovery(true, &got), 0);
	CHECK_EQ(got.objects_freed + got.objects_kept, 0);

	/* without cleanup nothing is freed, and the marks are cleared */
	rk_g.recovery = true;
	warm->sweep_pending = true;
	CHECK_EQ_INT(rk_mark(warm, objs[0].p), 1);
	CHECK_EQ_INT(rk_mark(warm, objs[N - 1].p), 1); /* a page run */
	before = allocated_bytes(warm);
	CHECK_EQ_INT(rk_finish_recovery(false, &got), 0);
	CHECK_EQ(got.objects_freed, 0);
	CHECK_EQ(allocated_bytes(warm), before);
	CHECK(!warm->sweep_pending);
	warm->sweep_pending = true;
	CHECK_EQ_INT(rk_mark(warm, objs[0].p), 1); /* newly marked again */
	CHECK_EQ_INT(rk_mark(warm, objs[N - 1].p), 1);
	warm->sweep_pending = false;
	check_sound(warm);
}

/* ---- sweep after sweep --------------------------------------------------------
 * Rounds of random allocations and frees (small and page runs, so that free
 * runs of one page sit next to runs the sweep releases), then a sweep that
 * keeps four objects in five.  After each, what the arena counts allocated
 * must be exactly what was kept: the release pass once walked past a run
 * it had just merged with a one-page free run, and left the runs after it
 * marked for release, their blocks on no list. */

#define NREP 20000

static void repeated_sweeps_lose_nothing(void)
{
	rk_arena *a = test_arena("sweep-repeat", 512u << 20);
	static void *objs[NREP];
	struct rng r = {5};
	for (int round = 0; round < 5; round++) {
		for (int i = 0; i < NREP; i++) {
			if (objs[i] && rng_range(&r, 0, 3) == 0) {
				rk_free(a, objs[i]);
				objs[i] = NULL;
			} else if (!objs[i]) {
				objs[i] = rk_alloc(a, rng_log_range(&r, 16, 40000));
			}
		}
		a->sweep_pending = true;
		uint64_t kept = 0;
		for (int i = 0; i < NREP; i++) {
			if (!objs[i])
				continue;
			if (i % 5 == round % 5) {
				objs[i] = NULL; /* unmarked: swept */
			} else {
				rk_mark(a, objs[i]);
				kept++;
			}
		}
		struct rk_sweep_stats st = {0};
		CHECK_EQ_INT(rk_arena_sweep(a, &st, NULL, 0, NULL), 0);
		a->sweep_pending = false;
		CHECK_EQ(st.objects_kept, kept);
		struct rk_census c;
		CHECK_EQ_INT(rk_arena_census(a, NULL, NULL, &c), 0);
		CHECK_MSG(c.objects == kept, "round %d: %" PRIu64 " allocated after the sweep, %" PRIu64 " kept", round,
			  c.objects, kept);
		check_sound(a);
	}
	for (int i = 0; i < NREP; i++)
		rk_free(a, objs[i]);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_sweep");
	RUN(sweep_frees_exactly_the_unmarked);
	RUN(sweep_refused_while_other_caches_live);
	RUN(dead_threads_caches_are_free);
	RUN(finish_recovery_sweeps_and_drops);
	RUN(repeated_sweeps_lose_nothing);
	return check_done();
}
