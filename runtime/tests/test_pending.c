/* test_pending - the O(in-flight) cleanup: pending allocations, their
 * commit, and their freeing at a warm start, without a real restart.
 *
 * A warm start runs rk_arena_recover on each inherited arena (which finds
 * the dead threads' pending objects and folds their caches back) and leaves
 * the arena inherited, sweep pending and recovery on; these tests build that
 * state by hand.  The "dead" threads are threads of this process that stop
 * for good: blocked on a semaphore at a chosen point, or frozen by a signal
 * at whatever instruction they were at (the randomized case), as a SIGKILL
 * would leave them.  The main thread never allocates in a test's arena
 * before the "restart", since rk_arena_recover takes every cache in the
 * arena for a dead thread's.
 *
 * After each cleanup, rk_arena_census lists what is allocated: it must be
 * exactly what the test's structure reaches, every object with its content
 * intact. */
#include "testlib.h"

#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

/* ---- helpers ---------------------------------------------------------------- */

/* What a warm rk_init leaves (rk_recovery_attach), for one arena. */
static void as_if_warm_start(rk_arena *a)
{
	rk_arena_recover(a);
	a->inherited = true;
	a->reopened = true;
	a->sweep_pending = true;
	rk_g.recovery = true;
}

struct ptrset {
	uint64_t *v;
	size_t n, cap;
};

static void ptrset_add(struct ptrset *s, const void *p)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 1024;
		s->v = realloc(s->v, s->cap * sizeof *s->v);
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
	ptrset_add(ctx, obj);
}

/* CHECKs that the arena's allocated objects are exactly want (which is
 * sorted here); says which differ. */
static void check_allocated_exactly(rk_arena *a, struct ptrset *want, const char *when)
{
	struct ptrset got = {0};
	struct rk_census c;
	int r = rk_arena_census(a, census_add, &got, &c);
	CHECK_MSG(r == 0, "%s: census failed: %d", when, r);
	qsort(got.v, got.n, sizeof *got.v, cmp_u64);
	qsort(want->v, want->n, sizeof *want->v, cmp_u64);
	size_t i = 0, j = 0, leaked = 0, lost = 0;
	while (i < got.n || j < want->n) {
		if (j == want->n || (i < got.n && got.v[i] < want->v[j])) {
			if (leaked++ < 5)
				printf("  %s: allocated but not reachable: 0x%" PRIx64 "\n", when, got.v[i]);
			i++;
		} else if (i == got.n || want->v[j] < got.v[i]) {
			if (lost++ < 5)
				printf("  %s: reachable but not allocated: 0x%" PRIx64 "\n", when, want->v[j]);
			j++;
		} else {
			i++, j++;
		}
	}
	CHECK_MSG(leaked == 0, "%s: %zu objects leaked", when, leaked);
	CHECK_MSG(lost == 0, "%s: %zu reachable objects were freed", when, lost);
	CHECK_EQ(c.objects, got.n);
	free(got.v);
}

static void check_sound(rk_arena *a)
{
	char why[192];
	int r = validate(a, why, sizeof why);
	CHECK_MSG(r == 0, "arena %s refused: %d \"%s\"", a->name, r, why);
}

static struct rk_cleanup_stats finish(enum rk_cleanup mode)
{
	struct rk_cleanup_stats st;
	int r = rk_finish_recovery_mode(mode, &st);
	CHECK_EQ_INT(r, 0);
	CHECK(!rk_is_recovery());
	return st;
}

/* Runs fn(arg) in a thread that then blocks for good (a dead thread). */
struct dead {
	pthread_t t;
	sem_t done, never;
	void (*fn)(void *);
	void *arg;
};

static void *dead_main(void *p)
{
	struct dead *d = p;
	d->fn(d->arg);
	sem_post(&d->done);
	sem_wait(&d->never);
	return NULL;
}

static void run_and_die(void (*fn)(void *), void *arg)
{
	struct dead *d = calloc(1, sizeof *d);
	d->fn = fn;
	d->arg = arg;
	sem_init(&d->done, 0, 0);
	sem_init(&d->never, 0, 0);
	pthread_create(&d->t, NULL, dead_main, d);
	sem_wait(&d->done);
	pthread_detach(d->t);
}

/* Runs fn(arg) in a thread that exits normally. */
static void run_and_exit(void *(*fn)(void *), void *arg)
{
	pthread_t t;
	pthread_create(&t, NULL, fn, arg);
	pthread_join(t, NULL);
}

/* ---- the basic contract --------------------------------------------------------- */

struct basic {
	rk_arena *a;
	void **slot; /* preserved: the root */
	void *pending[8];
	void *freed_temp;
	void *progress_buf; /* the runtime's own publication (rk_progress_buffer) */
};

static void basic_worker(void *p)
{
	struct basic *b = p;
	rk_arena *a = b->a;
	b->slot = rk_calloc(a, 4, sizeof(void *));
	rk_root_set(a, "slots", b->slot); /* commits the slot array */
	/* published in a region: committed at its end */
	void *x = rk_alloc(a, 100);
	rk_unsafe_begin(a);
	b->slot[0] = x;
	rk_unsafe_end(a);
	/* allocated outside, published by a later region of the same thread */
	void *y = rk_alloc(a, 5000);
	void *big = rk_alloc(a, 100000); /* a page run */
	rk_unsafe_begin(a);
	b->slot[1] = y;
	b->slot[2] = big;
	rk_unsafe_end(a);
	/* the stages' save areas are published outside any region */
	rk_progress *pr = rk_progress_open(a, "job", 1);
	b->progress_buf = rk_progress_buffer(pr, "state", 256);
	/* in flight at the "crash": allocated since the last commit */
	for (int i = 0; i < 6; i++)
		b->pending[i] = rk_alloc(a, i == 5 ? 70000 : 16 << i);
	/* a temporary freed again: not in flight */
	b->freed_temp = rk_alloc(a, 64);
	rk_free(a, b->freed_temp);
}

static void basic_commit_rules(void)
{
	struct basic b = {.a = test_arena("basic", 64u << 20)};
	run_and_die(basic_worker, &b);
	as_if_warm_start(b.a);
	CHECK_EQ(b.a->pending_found, 6);
	CHECK_EQ(orphaned_caches(b.a), 1);
	struct rk_cleanup_stats st = finish(RK_CLEANUP_PENDING);
	CHECK_EQ(st.pending, 6);
	CHECK_EQ(st.objects_freed, 6);
	CHECK_EQ(st.bytes_freed, 16 + 32 + 64 + 128 + 256 + 69632 + 4096);
	CHECK_EQ(orphaned_caches(b.a), 0);
	struct ptrset want = {0};
	ptrset_add(&want, b.slot);
	for (int i = 0; i < 3; i++)
		ptrset_add(&want, b.slot[i]);
	/* the progress record and its buffer */
	struct rk_census c;
	CHECK_EQ_INT(rk_arena_census(b.a, NULL, NULL, &c), 0);
	CHECK_EQ(c.objects, 6);
	ptrset_add(&want, b.progress_buf);
	ptrset_add(&want, rk_root_get(b.a, "rk.progress.job"));
	check_allocated_exactly(b.a, &want, "basic");
	check_sound(b.a);
	free(want.v);
}

/* ---- the windows a killed thread can leave ---------------------------------- */

/* A thread killed between logging a block and popping it (allocation), or
 * between pushing it and stamping it (free): the block is free and at the
 * head of its bin, though logged with its tag. */
struct window {
	rk_arena *a;
	void *kept;
	void *window_block; /* free, at the head of its bin, unstamped */
	bool free_side;
};

static void window_worker(void *p)
{
	struct window *w = p;
	rk_arena *a = w->a;
	w->kept = rk_alloc(a, 48);
	rk_root_set(a, "kept", w->kept);
	void *x = rk_alloc(a, 48);
	w->window_block = x;
	struct rk_tcache *tc = rk_tcache_current(a);
	unsigned cls = 2; /* 48 bytes */
	CHECK_EQ(rk_class_size[cls], 48);
	if (w->free_side) {
		/* rk_free, stopped after its commit (the push), before the stamp */
		rk_free(a, x);
		((struct rk_free_block *)x)->stamp = 0;
		CHECK_PTR_EQ(tc->bins[cls].head, x);
		tc->log[tc->nlog++] = (uint64_t)(uintptr_t)x; /* as if not forgotten either */
	} else {
		/* rk_alloc, stopped before its commit (the pop): tagged, logged,
		 * unstamped, still the head of the bin */
		rk_free(a, x);
		struct rk_free_block *b = tc->bins[cls].head;
		CHECK_PTR_EQ(b, x);
		uintptr_t t = (uintptr_t)(b->stamp ^ a->free_key);
		*(uint8_t *)t = (uint8_t)(tc - a->hdr->tcaches + 1);
		tc->log[tc->nlog++] = (uint64_t)(uintptr_t)b;
		b->stamp = 0;
	}
}

static void killed_mid_alloc_or_free(void)
{
	for (int side = 0; side < 2; side++) {
		struct window w = {.a = test_arena(side ? "window-free" : "window-alloc", 16u << 20), .free_side = side};
		run_and_die(window_worker, &w);
		as_if_warm_start(w.a);
		CHECK_EQ(w.a->pending_found, 0); /* the logged block is free: dropped */
		check_sound(w.a);
		struct rk_cleanup_stats st = finish(RK_CLEANUP_PENDING);
		CHECK_EQ(st.objects_freed, 0);
		struct ptrset want = {0};
		ptrset_add(&want, w.kept);
		check_allocated_exactly(w.a, &want, side ? "killed mid-free" : "killed mid-alloc");
		free(want.v);
		/* the block is free once, not twice: two allocations get two
		 * blocks; and it is stamped again (the next allocation of it finds
		 * its tag through the stamp) */
		struct rk_free_block *head = w.a->hdr->classes[2].head;
		CHECK_PTR_EQ(head, w.window_block);
		if (head) {
			uint64_t pg = ((uintptr_t)head - (uintptr_t)w.a->hdr) / RK_PAGE;
			if (RK_PG_KIND(w.a->map[pg]) == RK_PG_CONT)
				pg -= RK_PG_N(w.a->map[pg]);
			struct rk_slab *s = (void *)((char *)w.a->hdr + pg * RK_PAGE);
			uint64_t idx = ((uintptr_t)head - s->first) / 48;
			CHECK_EQ(head->stamp, rk_free_stamp(w.a, &s->tag[idx]));
		}
		void *p = rk_alloc(w.a, 48), *q = rk_alloc(w.a, 48);
		CHECK(p != q);
		rk_free(w.a, p);
		rk_free(w.a, q);
		rk_tcache_release(w.a);
		check_sound(w.a);
	}
}

/* ---- handing objects across threads ------------------------------------------ */

static void *slot_alloc(void *arg);

/* Thread A allocates p and dies without committing; B freed p meanwhile and
 * C (here B again, whose cache now holds the block) allocated it and
 * published it: A's stale log entry must not free B's live object. */
struct handoff {
	rk_arena *a;
	void **slot;
	void *p;
	sem_t p_ready, p_taken;
};

static void handoff_a(void *arg)
{
	struct handoff *h = arg;
	h->p = rk_alloc(h->a, 200);
	sem_post(&h->p_ready);
	sem_wait(&h->p_taken);
}

static void *handoff_b(void *arg)
{
	struct handoff *h = arg;
	rk_arena *a = h->a;
	sem_wait(&h->p_ready);
	void *p = h->p;
	rk_free(a, p); /* B frees A's pending object */
	sem_post(&h->p_taken);
	void *q = rk_alloc(a, 200); /* LIFO: the same block */
	CHECK_PTR_EQ(q, p);
	memset(q, 0x5a, 200);
	rk_unsafe_begin(a);
	h->slot[0] = q;
	rk_unsafe_end(a);
	return NULL;
}

static void *slot_alloc(void *arg)
{
	struct handoff *h = arg;
	h->slot = rk_calloc(h->a, 4, sizeof(void *));
	rk_root_set(h->a, "slots", h->slot);
	return NULL;
}

static void free_and_reuse_by_another_thread(void)
{
	struct handoff h = {.a = test_arena("handoff", 16u << 20)};
	sem_init(&h.p_ready, 0, 0);
	sem_init(&h.p_taken, 0, 0);
	/* the slot array comes from a thread that exits (it commits) */
	run_and_exit(slot_alloc, &h);
	pthread_t b;
	pthread_create(&b, NULL, handoff_b, &h);
	run_and_die(handoff_a, &h); /* returns once B freed p */
	pthread_join(b, NULL);      /* B exits: its cache is given back, its objects committed */
	as_if_warm_start(h.a);
	CHECK_EQ(h.a->pending_found, 0);
	finish(RK_CLEANUP_PENDING);
	struct ptrset want = {0};
	ptrset_add(&want, h.slot);
	ptrset_add(&want, h.slot[0]);
	check_allocated_exactly(h.a, &want, "reused by another thread");
	unsigned char *q = h.slot[0];
	CHECK(q[0] == 0x5a && q[199] == 0x5a);
	free(want.v);
}


/* Thread A allocates and hands over; B publishes.  With rk_keep in B's
 * region (or rk_commit in A before the handover) the object survives A's
 * death; without either, the rule is broken and PENDING frees it (the check
 * mode reports exactly that). */
enum publish_how { WITH_KEEP, WITH_COMMIT, BROKEN };

struct xpub {
	rk_arena *a;
	void **slot;
	enum publish_how how;
	void *p;
	sem_t ready, published;
};

static void xpub_a(void *arg)
{
	struct xpub *x = arg;
	x->p = rk_alloc(x->a, 300);
	pat_fill(x->p, 0, 300, 77);
	if (x->how == WITH_COMMIT)
		rk_commit();
	sem_post(&x->ready);
	sem_wait(&x->published);
}

static void *xpub_b(void *arg)
{
	struct xpub *x = arg;
	x->slot = rk_calloc(x->a, 4, sizeof(void *));
	rk_root_set(x->a, "slots", x->slot);
	sem_wait(&x->ready);
	rk_unsafe_begin(x->a);
	x->slot[0] = x->p;
	if (x->how == WITH_KEEP)
		CHECK_EQ_INT(rk_keep(x->a, x->p), 0);
	rk_unsafe_end(x->a);
	return NULL;
}

static void cross_thread_publication(void)
{
	static const char *names[] = {"xpub-keep", "xpub-commit", "xpub-broken"};
	for (int how = WITH_KEEP; how <= BROKEN; how++) {
		struct xpub x = {.a = test_arena(names[how], 16u << 20), .how = how};
		sem_init(&x.ready, 0, 0);
		sem_init(&x.published, 0, 0);
		pthread_t b;
		pthread_create(&b, NULL, xpub_b, &x);
		/* A hands p over, waits until B published it, then dies */
		struct dead *d = calloc(1, sizeof *d);
		d->fn = xpub_a;
		d->arg = &x;
		sem_init(&d->done, 0, 0);
		sem_init(&d->never, 0, 0);
		pthread_create(&d->t, NULL, dead_main, d);
		pthread_join(b, NULL);
		sem_post(&x.published);
		sem_wait(&d->done);
		pthread_detach(d->t);

		as_if_warm_start(x.a);
		if (how == BROKEN) {
			/* the app marks what it reaches; the check reports the object
			 * the pending path would have freed, and keeps it */
			rk_mark(x.a, x.slot);
			rk_mark(x.a, x.slot[0]);
			struct rk_cleanup_stats st = finish(RK_CLEANUP_CHECK);
			CHECK_EQ(st.pending, 1);
			CHECK_EQ(st.pending_reached, 1);
			CHECK_EQ(st.swept_not_pending, 0);
			CHECK_EQ(st.objects_freed, 0);
		} else {
			CHECK_EQ(x.a->pending_found, 0);
			struct rk_cleanup_stats st = finish(RK_CLEANUP_PENDING);
			CHECK_EQ(st.objects_freed, 0);
		}
		struct ptrset want = {0};
		ptrset_add(&want, x.slot);
		ptrset_add(&want, x.slot[0]);
		check_allocated_exactly(x.a, &want, names[how]);
		CHECK_PATTERN(x.slot[0], 300, 77);
		free(want.v);
	}
}

/* ---- what the pending path cannot see, and the check mode ------------------- */

struct unseen {
	rk_arena *a;
	void **slot;
	void *unlinked; /* unlinked in a region, not yet freed at the "crash" */
};

static void unseen_worker(void *arg)
{
	struct unseen *u = arg;
	rk_arena *a = u->a;
	u->slot = rk_calloc(a, 4, sizeof(void *));
	rk_root_set(a, "slots", u->slot);
	rk_unsafe_begin(a);
	u->slot[0] = rk_alloc(a, 64);
	u->slot[1] = rk_alloc(a, 64);
	rk_unsafe_end(a);
	rk_unsafe_begin(a);
	u->unlinked = u->slot[1];
	u->slot[1] = NULL;
	rk_unsafe_end(a);
	/* the free after the region never happens: the thread dies here */
}

static void check_mode_reports_what_pending_misses(void)
{
	struct unseen u = {.a = test_arena("unseen", 16u << 20)};
	run_and_die(unseen_worker, &u);
	as_if_warm_start(u.a);
	rk_mark(u.a, u.slot);
	rk_mark(u.a, u.slot[0]);
	struct rk_cleanup_stats st = finish(RK_CLEANUP_CHECK);
	CHECK_EQ(st.pending, 0);
	CHECK_EQ(st.swept_not_pending, 1);
	CHECK_EQ(st.objects_freed, 1);
	CHECK_EQ(st.objects_kept, 2);
	struct ptrset want = {0};
	ptrset_add(&want, u.slot);
	ptrset_add(&want, u.slot[0]);
	check_allocated_exactly(u.a, &want, "check mode");
	free(want.v);
	check_sound(u.a);
}

/* More than 64 objects pending in one thread: the full log drops its older
 * half, those leak (counted); the last ones are freed. */
struct many {
	rk_arena *a;
	void *objs[300];
};

static void many_worker(void *arg)
{
	struct many *m = arg;
	for (int i = 0; i < 300; i++)
		m->objs[i] = rk_alloc(m->a, 32);
}

static void overflow_leaks_the_oldest_and_says_so(void)
{
	struct many m = {.a = test_arena("many", 16u << 20)};
	run_and_die(many_worker, &m);
	as_if_warm_start(m.a);
	struct rk_cleanup_stats st = finish(RK_CLEANUP_PENDING);
	/* appends 129, 193, 257 found a full log: 3 x 64 dropped; 300 - 192 stay */
	CHECK_EQ(st.pending_overflow, 192);
	CHECK_EQ(st.objects_freed, 300 - 192);
	struct ptrset want = {0};
	for (int i = 0; i < 192; i++)
		ptrset_add(&want, m.objs[i]);
	check_allocated_exactly(m.a, &want, "overflow");
	free(want.v);
}

/* A thread that exits commits what it allocated; NONE leaves the pending
 * objects; SWEEP frees them with everything unmarked. */
static void *exiting_worker(void *arg)
{
	struct many *m = arg;
	for (int i = 0; i < 10; i++)
		m->objs[i] = rk_alloc(m->a, 32);
	return NULL;
}

static void exit_none_and_sweep(void)
{
	struct many m = {.a = test_arena("exit", 16u << 20)};
	run_and_exit(exiting_worker, &m);
	as_if_warm_start(m.a);
	CHECK_EQ(m.a->pending_found, 0);
	finish(RK_CLEANUP_PENDING);
	struct ptrset want = {0};
	for (int i = 0; i < 10; i++)
		ptrset_add(&want, m.objs[i]);
	check_allocated_exactly(m.a, &want, "thread exit commits");
	free(want.v);

	struct many n = {.a = test_arena("none", 16u << 20)};
	run_and_die(many_worker, &n);
	as_if_warm_start(n.a);
	struct rk_cleanup_stats st = finish(RK_CLEANUP_NONE);
	CHECK_EQ(st.pending, 300 - 192);
	CHECK_EQ(st.objects_freed, 0);
	CHECK_EQ(orphaned_caches(n.a), 0);
	struct rk_census c;
	CHECK_EQ_INT(rk_arena_census(n.a, NULL, NULL, &c), 0);
	CHECK_EQ(c.objects, 300);

	struct many s = {.a = test_arena("sweep-all", 16u << 20)};
	run_and_die(many_worker, &s);
	as_if_warm_start(s.a);
	for (int i = 0; i < 300; i += 2)
		rk_mark(s.a, s.objs[i]);
	st = finish(RK_CLEANUP_SWEEP);
	CHECK_EQ(st.objects_freed, 150);
	CHECK_EQ(st.pending, 300 - 192);
	CHECK_EQ_INT(rk_arena_census(s.a, NULL, NULL, &c), 0);
	CHECK_EQ(c.objects, 150);
	CHECK_EQ_INT(rk_finish_recovery_mode((enum rk_cleanup)7, &st), -EINVAL);
}

/* ---- randomized: threads frozen at random instructions ------------------------ */

#define RND_THREADS 4
#define RND_SLOTS 64
#define RND_RING 8
#define RND_ROUNDS 4 /* arenas: 16 per process, 12 used before */

struct robj {
	uint64_t id;
	uint64_t size;
	/* then the pattern of id */
};

struct rtable {
	uint64_t magic;
	struct robj *slot[RND_SLOTS];
};

struct rround {
	rk_arena *a;
	struct rtable *t;
	uint64_t seed;
	_Atomic int slot_lock[RND_SLOTS];
	/* producer -> consumer FIFO of objects (transient memory, as an app's
	 * queue): it holds the producer's last few allocations at most */
	_Atomic int fifo_lock;
	struct robj *fifo[RND_RING];
	unsigned fifo_head, fifo_n;
	_Atomic uint64_t next_id;
	_Atomic unsigned running;
	_Atomic bool dead; /* its workers never go on again */
	pthread_t th[RND_THREADS];
};

static __thread struct rround *tls_round;

static size_t robj_size(struct rng *r)
{
	uint64_t k = rng_range(r, 0, 99);
	if (k < 2)
		return (size_t)rng_range(r, 33000, 90000); /* a page run */
	return (size_t)rng_log_range(r, 24, 4000);
}

static struct robj *robj_new(struct rround *rr, struct rng *r)
{
	size_t size = robj_size(r);
	struct robj *o = rk_alloc(rr->a, size);
	if (!o)
		return NULL;
	uint64_t id = atomic_fetch_add(&rr->next_id, 1);
	pat_fill(o, 16, size, id);
	o->size = size;
	o->id = id;
	return o;
}

static bool robj_intact(const struct robj *o)
{
	if (o->size < 24 || o->size > 90000)
		return false;
	const uint8_t *b = (const uint8_t *)o;
	for (size_t i = 16; i < o->size; i++)
		if (b[i] != pat_tag(o->id))
			return false;
	return true;
}

static void slot_lock(struct rround *rr, unsigned i)
{
	int z = 0;
	while (!atomic_compare_exchange_weak(&rr->slot_lock[i], &z, 1))
		z = 0;
}

static void slot_unlock(struct rround *rr, unsigned i)
{
	atomic_store(&rr->slot_lock[i], 0);
}

/* Replaces slot i with o (NULL: deletes), inside a region; the old object
 * is freed inside it too.  With from_fifo, o is taken from the FIFO inside
 * the region (and kept: another thread allocated it), or freed there if
 * drop: a handed-over object is always in the FIFO or inside a region. */
static void publish(struct rround *rr, unsigned i, struct robj *o, bool from_fifo, bool drop)
{
	slot_lock(rr, i);
	rk_unsafe_begin(rr->a);
	if (from_fifo) {
		while (atomic_exchange(&rr->fifo_lock, 1))
			;
		if (rr->fifo_n) {
			o = rr->fifo[rr->fifo_head];
			rr->fifo_head = (rr->fifo_head + 1) % RND_RING;
			rr->fifo_n--;
		}
		atomic_store(&rr->fifo_lock, 0);
		if (o)
			rk_keep(rr->a, o);
		if (o && drop) {
			rk_free(rr->a, o);
			o = NULL;
			rk_unsafe_end(rr->a);
			slot_unlock(rr, i);
			return;
		}
	}
	if (!from_fifo || o) {
		struct robj *old = rr->t->slot[i];
		rr->t->slot[i] = o;
		if (old)
			rk_free(rr->a, old);
	}
	rk_unsafe_end(rr->a);
	slot_unlock(rr, i);
}

static void *rnd_worker(void *arg)
{
	struct rround *rr = arg;
	tls_round = rr;
	unsigned me = atomic_fetch_add(&rr->running, 1);
	struct rng r = {rr->seed * 7919 + me};
	bool producer = me == RND_THREADS - 1; /* never commits: hands objects over */
	for (;;) {
		if (producer) {
			struct robj *o = robj_new(rr, &r);
			if (!o)
				continue;
			while (atomic_exchange(&rr->fifo_lock, 1))
				;
			bool pushed = rr->fifo_n < RND_RING;
			if (pushed)
				rr->fifo[(rr->fifo_head + rr->fifo_n++) % RND_RING] = o;
			atomic_store(&rr->fifo_lock, 0);
			if (!pushed)
				rk_free(rr->a, o); /* full: a temporary after all */
			continue;
		}
		unsigned op = (unsigned)rng_range(&r, 0, 99), i = (unsigned)rng_range(&r, 0, RND_SLOTS - 1);
		if (op < 35) { /* allocate outside, publish in a later region */
			struct robj *o = robj_new(rr, &r);
			struct robj *tmp = rng_range(&r, 0, 1) ? robj_new(rr, &r) : NULL;
			if (tmp)
				rk_free(rr->a, tmp);
			if (o)
				publish(rr, i, o, false, false);
		} else if (op < 55) { /* allocate inside the region */
			slot_lock(rr, i);
			rk_unsafe_begin(rr->a);
			struct robj *o = robj_new(rr, &r), *old = rr->t->slot[i];
			if (o) {
				rr->t->slot[i] = o;
				if (old)
					rk_free(rr->a, old);
			}
			rk_unsafe_end(rr->a);
			slot_unlock(rr, i);
		} else if (op < 65) { /* delete */
			publish(rr, i, NULL, false, false);
		} else if (op < 85) { /* take a handed-over object: publish it (keep) or drop it */
			publish(rr, i, NULL, true, rng_range(&r, 0, 2) == 0);
		} else { /* temporaries, pending for a while, then freed */
			struct robj *tmp[6];
			unsigned n = (unsigned)rng_range(&r, 1, 6);
			for (unsigned k = 0; k < n; k++)
				tmp[k] = robj_new(rr, &r);
			for (unsigned k = 0; k < n; k++)
				if (tmp[k])
					rk_free(rr->a, tmp[k]);
		}
	}
	return NULL;
}

static void *make_table(void *arg)
{
	struct rround *rr = arg;
	rr->t = rk_calloc(rr->a, 1, sizeof *rr->t);
	rr->t->magic = 0x7461626c65;
	rk_root_set(rr->a, "table", rr->t);
	return NULL;
}

/* SIGUSR1 stops a worker where it is; a thaw lets it go on from there.  A
 * round keeps freezing until no worker is inside a region or the allocator
 * (a failure then would not reuse the arena: nothing to check); the workers
 * then stay frozen for good, as dead threads. */
static _Atomic unsigned frozen_count, thaws;

static void freeze_here(int sig)
{
	(void)sig;
	unsigned t = atomic_load(&thaws);
	atomic_fetch_add(&frozen_count, 1);
	while (atomic_load(&thaws) == t || atomic_load(&tls_round->dead)) {
		struct timespec d = {0, 100000};
		nanosleep(&d, NULL);
	}
	atomic_fetch_sub(&frozen_count, 1);
}

static void randomized_round(unsigned round)
{
	char name[32];
	snprintf(name, sizeof name, "rnd%u", round);
	struct rround *rr = calloc(1, sizeof *rr);
	rr->a = test_arena(name, 256u << 20);
	rr->seed = 1000 + round;
	struct rng r = {rr->seed};
	/* the table comes from a thread that exits (committed, its cache given back) */
	run_and_exit(make_table, rr);
	for (unsigned k = 0; k < RND_THREADS; k++)
		pthread_create(&rr->th[k], NULL, rnd_worker, rr);
	while (atomic_load(&rr->running) < RND_THREADS) /* each knows its round */
		sched_yield();
	rk_arena *a = rr->a;
	char why[192];
	unsigned tries = 0;
	for (;;) {
		struct timespec d = {0, (long)rng_range(&r, 1, 20) * 1000000L};
		nanosleep(&d, NULL);
		unsigned f0 = atomic_load(&frozen_count);
		for (unsigned k = 0; k < RND_THREADS; k++)
			pthread_kill(rr->th[k], SIGUSR1);
		while (atomic_load(&frozen_count) < f0 + RND_THREADS)
			sched_yield();
		tries++;
		if (rk_component_is_safe(a) && validate(a, why, sizeof why) == 0) {
			atomic_store(&rr->dead, true);
			break;
		}
		atomic_fetch_add(&thaws, 1); /* inside a region or the allocator: go on */
		while (atomic_load(&frozen_count) > f0)
			sched_yield();
	}
	as_if_warm_start(a);
	uint64_t found = a->pending_found;
	struct rk_cleanup_stats st = finish(RK_CLEANUP_PENDING);
	CHECK_EQ(st.objects_freed, found);
	struct ptrset want = {0};
	ptrset_add(&want, rr->t);
	unsigned bad = 0, live = 0;
	for (unsigned i = 0; i < RND_SLOTS; i++) {
		struct robj *o = rr->t->slot[i];
		if (!o)
			continue;
		live++;
		ptrset_add(&want, o);
		bad += !robj_intact(o);
	}
	CHECK_MSG(bad == 0, "round %u: %u reachable objects damaged", round, bad);
	check_allocated_exactly(a, &want, name);
	check_sound(a);
	printf("  round %u: frozen %u times, %u reachable, %" PRIu64 " in flight freed\n", round, tries, live,
	       st.objects_freed);
	free(want.v);
}

static void randomized_freezes(void)
{
	struct sigaction sa = {.sa_handler = freeze_here};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	for (unsigned round = 0; round < RND_ROUNDS; round++)
		randomized_round(round);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_pending");
	RUN(basic_commit_rules);
	RUN(killed_mid_alloc_or_free);
	RUN(free_and_reuse_by_another_thread);
	RUN(cross_thread_publication);
	RUN(check_mode_reports_what_pending_misses);
	RUN(overflow_leaks_the_oldest_and_says_so);
	RUN(exit_none_and_sweep);
	RUN(randomized_freezes);
	return check_done();
}
