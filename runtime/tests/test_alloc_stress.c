/* test_alloc_stress - randomised alloc/free/realloc from several threads,
 * with objects freed by other threads than the one that allocated them.
 *
 * Every object carries a pattern of its own (testlib.h) that is checked
 * before each free and realloc; realloc must keep the prefix.  At the end
 * the live objects must not overlap, the arena's accounting must match them,
 * the arena must pass its own restart checks, and freeing everything must
 * bring allocated_bytes back to where it started. */
#include "testlib.h"

#include <pthread.h>

#define NTHREADS 4
#define OPS_PER_THREAD 250000
#define NSLOTS 2048
#define MAILBOX_CAP 512
#define DRAIN_EVERY 32

struct obj {
	uint8_t *p;
	size_t size;
	uint64_t id;
};

/* Objects handed to a thread for it to free. */
struct mailbox {
	pthread_mutex_t lock;
	unsigned n;
	struct obj items[MAILBOX_CAP];
};

struct worker {
	pthread_t thread;
	unsigned index;
	struct rng rng;
	uint64_t next_id;
	uint64_t errors;
	uint64_t allocs, frees, reallocs, handed, received;
	struct obj slots[NSLOTS];
};

static rk_arena *arena;
static struct worker workers[NTHREADS];
static struct mailbox mailboxes[NTHREADS];

/* Reports a failure from a worker and counts it against that worker. */
#define EXPECT(w, cond, ...) ((cond) ? true : ((w)->errors++, check_report(false, __FILE__, __LINE__, __VA_ARGS__)))

/* Mostly small sizes, some up to the largest size class, a few page runs. */
static size_t pick_size(struct rng *r)
{
	uint64_t k = rng_next(r) % 1000;
	if (k < 850)
		return rng_range(r, 16, 512);
	if (k < 997)
		return rng_log_range(r, 513, RK_SMALL_MAX);
	return rng_log_range(r, 64 << 10, 4 << 20);
}

/* What every pointer rk_alloc or rk_realloc hands out must satisfy. */
static void check_fresh(struct worker *w, const uint8_t *p, size_t n)
{
	EXPECT(w, ((uintptr_t)p & 15) == 0, "%p not 16-byte aligned", (const void *)p);
	EXPECT(w, rk_arena_contains(arena, p), "%p outside the arena", (const void *)p);
	size_t u = rk_usable_size(arena, p);
	EXPECT(w, u >= n, "rk_usable_size(%p) = %zu < requested %zu", (const void *)p, u, n);
}

static void check_content(struct worker *w, const struct obj *o, size_t len)
{
	long bad = pat_find_bad(o->p, len, o->id);
	EXPECT(w, bad < 0, "object %" PRIu64 " (%zu B at %p): byte %ld overwritten", o->id, o->size,
	       (void *)o->p, bad);
}

static void obj_alloc(struct worker *w, struct obj *o)
{
	size_t n = pick_size(&w->rng);
	uint8_t *p = rk_alloc(arena, n);
	if (!EXPECT(w, p != NULL, "rk_alloc(%zu) failed: %s", n, strerror(errno)))
		return;
	check_fresh(w, p, n);
	*o = (struct obj){.p = p, .size = n, .id = w->next_id++};
	pat_fill(p, 0, n, o->id);
	w->allocs++;
}

static bool mailbox_put(struct mailbox *m, const struct obj *o)
{
	bool ok = false;
	pthread_mutex_lock(&m->lock);
	if (m->n < MAILBOX_CAP) {
		m->items[m->n++] = *o;
		ok = true;
	}
	pthread_mutex_unlock(&m->lock);
	return ok;
}

/* Checks and frees everything other threads handed to this mailbox. */
static uint64_t mailbox_drain(struct worker *w, struct mailbox *m)
{
	static _Thread_local struct obj batch[MAILBOX_CAP];
	pthread_mutex_lock(&m->lock);
	unsigned n = m->n;
	memcpy(batch, m->items, n * sizeof batch[0]);
	m->n = 0;
	pthread_mutex_unlock(&m->lock);
	for (unsigned i = 0; i < n; i++) {
		check_content(w, &batch[i], batch[i].size);
		rk_free(arena, batch[i].p);
	}
	return n;
}

/* Frees the object here, or (one time in eight) hands it to the next
 * thread so that it is freed by a thread that did not allocate it. */
static void obj_release(struct worker *w, struct obj *o)
{
	check_content(w, o, o->size);
	if (rng_next(&w->rng) % 8 == 0 && mailbox_put(&mailboxes[(w->index + 1) % NTHREADS], o)) {
		w->handed++;
	} else {
		rk_free(arena, o->p);
		w->frees++;
	}
	*o = (struct obj){0};
}

static void obj_resize(struct worker *w, struct obj *o)
{
	size_t n = pick_size(&w->rng);
	check_content(w, o, o->size);
	uint8_t *q = rk_realloc(arena, o->p, n);
	if (!EXPECT(w, q != NULL, "rk_realloc(%zu -> %zu) failed: %s", o->size, n, strerror(errno)))
		return;
	check_fresh(w, q, n);
	size_t keep = n < o->size ? n : o->size;
	o->p = q;
	check_content(w, o, keep); /* the prefix moved with the object */
	pat_fill(q, keep, n, o->id);
	o->size = n;
	w->reallocs++;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	for (unsigned op = 0; op < OPS_PER_THREAD; op++) {
		struct obj *o = &w->slots[rng_next(&w->rng) % NSLOTS];
		uint64_t k = rng_next(&w->rng) % 100;
		if (!o->p)
			obj_alloc(w, o);
		else if (k < 50)
			obj_release(w, o);
		else if (k < 90)
			obj_resize(w, o);
		else
			check_content(w, o, o->size);
		if (op % DRAIN_EVERY == 0)
			w->received += mailbox_drain(w, &mailboxes[w->index]);
	}
	return NULL;
}

static int by_address(const void *x, const void *y)
{
	const struct obj *a = x, *b = y;
	return a->p < b->p ? -1 : a->p > b->p;
}

/* Gathers the live objects of all workers, sorted by address. */
static size_t collect_live(struct obj *out)
{
	size_t n = 0;
	for (unsigned t = 0; t < NTHREADS; t++)
		for (unsigned i = 0; i < NSLOTS; i++)
			if (workers[t].slots[i].p)
				out[n++] = workers[t].slots[i];
	qsort(out, n, sizeof *out, by_address);
	return n;
}

/* No two live objects may share a byte, counting all their usable bytes. */
static void check_no_overlap(const struct obj *live, size_t n)
{
	uint64_t overlaps = 0;
	for (size_t i = 0; i + 1 < n; i++) {
		size_t u = rk_usable_size(arena, live[i].p);
		if (live[i].p + u > live[i + 1].p && overlaps++ < 5)
			CHECK_MSG(false, "object %" PRIu64 " [%p, +%zu) overlaps object %" PRIu64 " at %p", live[i].id,
				  (void *)live[i].p, u, live[i + 1].id, (void *)live[i + 1].p);
	}
	CHECK_EQ(overlaps, 0);
}

static void stress_threads(void)
{
	arena = test_arena("stress", 1ull << 30);
	uint64_t baseline = allocated_bytes(arena);
	for (unsigned t = 0; t < NTHREADS; t++) {
		pthread_mutex_init(&mailboxes[t].lock, NULL);
		workers[t].index = t;
		workers[t].rng.s = 0x5eed0000ull + t;
		workers[t].next_id = ((uint64_t)t + 1) << 40;
	}
	for (unsigned t = 0; t < NTHREADS; t++)
		CHECK_EQ_INT(pthread_create(&workers[t].thread, NULL, worker_main, &workers[t]), 0);
	for (unsigned t = 0; t < NTHREADS; t++)
		pthread_join(workers[t].thread, NULL);

	/* The main thread frees what is still in the mailboxes: cross-thread too. */
	struct worker *mainw = &(struct worker){.index = NTHREADS};
	uint64_t handed = 0, received = 0, ops = 0, errors = 0;
	for (unsigned t = 0; t < NTHREADS; t++)
		received += mailbox_drain(mainw, &mailboxes[t]);
	for (unsigned t = 0; t < NTHREADS; t++) {
		struct worker *w = &workers[t];
		handed += w->handed;
		received += w->received;
		ops += w->allocs + w->frees + w->reallocs + w->handed;
		errors += w->errors;
		CHECK_MSG(w->allocs > 10000 && w->reallocs > 10000, "thread %u: %" PRIu64 " allocs, %" PRIu64 " reallocs",
			  t, w->allocs, w->reallocs);
	}
	CHECK_EQ(errors + mainw->errors, 0);
	CHECK_MSG(handed > 1000, "only %" PRIu64 " objects freed by another thread", handed);
	CHECK_EQ(received, handed);

	static struct obj live[NTHREADS * NSLOTS];
	size_t n = collect_live(live);
	uint64_t live_bytes = 0;
	for (size_t i = 0; i < n; i++) {
		check_content(mainw, &live[i], live[i].size);
		live_bytes += rk_usable_size(arena, live[i].p);
	}
	CHECK_EQ(mainw->errors, 0);
	check_no_overlap(live, n);
	/* Exited threads folded their caches' counts back into the arena. */
	CHECK_EQ(allocated_bytes(arena), baseline + live_bytes);
	char why[192];
	CHECK_EQ_INT(validate(arena, why, sizeof why), 0);

	for (size_t i = 0; i < n; i++)
		rk_free(arena, live[i].p);
	CHECK_EQ(allocated_bytes(arena), baseline);
	CHECK_EQ_INT(validate(arena, why, sizeof why), 0);
	printf("stress: %" PRIu64 " operations, %" PRIu64 " cross-thread frees, %zu objects live at the end\n", ops,
	       handed, n);
}

/* ---- a plain producer/consumer pair ---------------------------------------- */

#define HANDOFF_N 6000

static uint8_t *handoff[HANDOFF_N];
static size_t handoff_size[HANDOFF_N];

/* Mixed small sizes; with_large adds a page run every hundredth object. */
static size_t handoff_pick(unsigned i, bool with_large)
{
	return with_large && i % 100 == 99 ? (size_t)(64 << 10) + 4096 * (i % 7) : 16 + (i * 37) % 3000;
}

static void *producer(void *unused)
{
	(void)unused;
	for (unsigned i = 0; i < HANDOFF_N; i++) {
		handoff_size[i] = handoff_pick(i, true);
		handoff[i] = rk_alloc(arena, handoff_size[i]);
		if (handoff[i])
			pat_fill(handoff[i], 0, handoff_size[i], i);
	}
	return NULL;
}

static void *consumer(void *unused)
{
	(void)unused;
	for (unsigned i = 0; i < HANDOFF_N; i++)
		rk_free(arena, handoff[i]);
	return NULL;
}

static void cross_thread_handoff(void)
{
	arena = test_arena("handoff", 256u << 20);
	uint64_t baseline = allocated_bytes(arena);
	pthread_t t;

	/* Allocated by a thread that has exited, freed here. */
	pthread_create(&t, NULL, producer, NULL);
	pthread_join(t, NULL);
	CHECK_EQ(owned_caches(arena), 0); /* the exiting thread gave its cache back */
	unsigned bad = 0;
	for (unsigned i = 0; i < HANDOFF_N; i++)
		bad += !handoff[i] || pat_find_bad(handoff[i], handoff_size[i], i) >= 0;
	CHECK_EQ(bad, 0);
	for (unsigned i = 0; i < HANDOFF_N; i++)
		rk_free(arena, handoff[i]);
	CHECK_EQ(allocated_bytes(arena), baseline);

	/* Allocated here, freed by a thread that then exits. */
	for (unsigned i = 0; i < HANDOFF_N; i++)
		handoff[i] = rk_alloc(arena, handoff_pick(i, false));
	uint64_t top = heap_bytes(arena);
	pthread_create(&t, NULL, consumer, NULL);
	pthread_join(t, NULL);
	CHECK_EQ(owned_caches(arena), 1); /* only this thread's */
	CHECK_EQ(allocated_bytes(arena), baseline);
	/* What the consumer freed went back to the shared lists: allocating the
	 * same again needs no new heap. */
	for (unsigned i = 0; i < HANDOFF_N; i++)
		handoff[i] = rk_alloc(arena, handoff_pick(i, false));
	CHECK_EQ(heap_bytes(arena), top);
	for (unsigned i = 0; i < HANDOFF_N; i++)
		rk_free(arena, handoff[i]);
	CHECK_EQ(allocated_bytes(arena), baseline);
	char why[192];
	CHECK_EQ_INT(validate(arena, why, sizeof why), 0);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_alloc_stress");
	RUN(stress_threads);
	RUN(cross_thread_handoff);
	return check_done();
}
