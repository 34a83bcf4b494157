/* test_unsafe_regions - the bookkeeping of unsafe regions in the control
 * block (control.c) and the restart's freeze, driven directly.
 *
 * Slots: each thread counts its open regions in a slot of its own; a slot
 * may go back to the pool only when its owner exits, and the next owner
 * starts from zero.
 * 1. A thread that exits inside a region does not hand its count to the
 *    next thread that claims the slot (the arena read as half-changed for
 *    as long as that thread lived).
 * 2. The main thread claims a slot during a warm rk_init (folding the old
 *    incarnation's thread cache runs allocator critical sections, which
 *    count), and rk_init then resets the block.  If the main thread later
 *    exits with pthread_exit, its key destructor must not free the slot a
 *    worker has claimed since: the worker's open region went unseen, and a
 *    restart at that moment would have been warm.  This case needs a real
 *    warm start: the test restarts itself once (rk_restart re-execs it) and
 *    runs it in the second incarnation.
 *
 * The freeze (rk_unsafe_freeze, rk_allocator_freeze, as a restart runs
 * them):
 * 3. Threads it stops in rk_unsafe_begin and in an allocator lock go on
 *    after the thaw of a restart whose exec failed (they used to wait for
 *    an exec that never came).
 * 4. While it waits for open regions to close, a thread inside one enters
 *    nested regions and so reaches its outermost end: the wait ends at
 *    once instead of timing out.
 * 5. Once it has returned (the restart looks at the counters now), a
 *    nested entry waits too, until the thaw. */
#include "testlib.h"

#include <pthread.h>
#include <sched.h>

static rk_arena *arena;

static void *exit_inside_region(void *arg)
{
	(void)arg;
	rk_unsafe_begin(arena); /* and never ends it */
	return NULL;
}

static void *claim_after(void *arg)
{
	(void)arg;
	rk_unsafe_begin(arena); /* claims the slot the first thread left */
	rk_unsafe_end(arena);
	CHECK_MSG(rk_component_is_safe(arena), "a new thread inherited the open region of a thread that exited");
	return NULL;
}

static void exited_threads_count_not_inherited(void)
{
	pthread_t t;
	if (!CHECK(pthread_create(&t, NULL, exit_inside_region, NULL) == 0))
		return;
	pthread_join(t, NULL);
	if (!CHECK(pthread_create(&t, NULL, claim_after, NULL) == 0))
		return;
	pthread_join(t, NULL);
}

/* ---- the freeze ---- */

static rk_arena *arena_b;
static _Atomic uint64_t steps[2];
static atomic_bool stop, freezer_started, looked, nested_done;

static void sleep_ms(long ms)
{
	struct timespec t = {0, ms * 1000000L};
	nanosleep(&t, NULL);
}

/* Waits up to 2 s for steps[i] to pass want[i]. */
static bool steps_reach(unsigned i, uint64_t want)
{
	for (int n = 0; n < 2000 && atomic_load(&steps[i]) < want; n++)
		sleep_ms(1);
	return atomic_load(&steps[i]) >= want;
}

static bool flag_set_within(atomic_bool *f, int ms)
{
	for (int n = 0; n < ms && !atomic_load(f); n++)
		sleep_ms(1);
	return atomic_load(f);
}

static void *region_loop(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		rk_unsafe_begin(arena);
		rk_unsafe_end(arena);
		atomic_fetch_add(&steps[0], 1);
	}
	return NULL;
}

static void *alloc_loop(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		rk_free(arena, rk_alloc(arena, 100000)); /* a page run: the heap lock each time */
		atomic_fetch_add(&steps[1], 1);
	}
	return NULL;
}

static void thaw_releases_stopped_threads(void)
{
	pthread_t t[2];
	atomic_store(&stop, false);
	if (!CHECK(pthread_create(&t[0], NULL, region_loop, NULL) == 0 &&
		   pthread_create(&t[1], NULL, alloc_loop, NULL) == 0))
		return;
	CHECK(steps_reach(0, 100) && steps_reach(1, 100));
	rk_unsafe_freeze(50ull * 1000 * 1000);
	CHECK_EQ(rk_allocator_freeze(50ull * 1000 * 1000), 0);
	rk_unsafe_freeze(50ull * 1000 * 1000);
	CHECK_EQ(rk_unsafe_open_mask(), 0);
	sleep_ms(10);
	uint64_t s0 = atomic_load(&steps[0]), s1 = atomic_load(&steps[1]);
	sleep_ms(20);
	CHECK_MSG(atomic_load(&steps[0]) == s0 && atomic_load(&steps[1]) == s1, "the freeze did not stop both threads");
	rk_allocator_thaw(); /* as a restart whose exec failed */
	rk_unsafe_thaw();
	bool on0 = steps_reach(0, s0 + 100), on1 = steps_reach(1, s1 + 100);
	CHECK_MSG(on0, "a thread stopped in rk_unsafe_begin did not go on after the thaw");
	CHECK_MSG(on1, "a thread stopped in an allocator lock did not go on after the thaw");
	atomic_store(&stop, true);
	if (on0 && on1) { /* else it waits for good: leave it */
		pthread_join(t[0], NULL);
		pthread_join(t[1], NULL);
	}
}

/* Inside a region of arena, enters one of arena_b when told to. */
static void *nested_when_told(void *arg)
{
	atomic_bool *go = arg;
	rk_unsafe_begin(arena);
	atomic_store(&steps[0], 1);
	while (!atomic_load(go))
		sched_yield();
	sleep_ms(10); /* well inside the freeze */
	rk_unsafe_begin(arena_b);
	atomic_store(&nested_done, true);
	rk_unsafe_end(arena_b);
	rk_unsafe_end(arena);
	return NULL;
}

static _Atomic uint64_t freeze_ms;

static void *freezer(void *arg)
{
	(void)arg;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	atomic_store(&freezer_started, true);
	rk_unsafe_freeze(2000ull * 1000 * 1000);
	atomic_store(&freeze_ms, (uint64_t)check_ms_since(&t0));
	return NULL;
}

static void nested_entry_goes_through_while_draining(void)
{
	pthread_t w, f;
	atomic_store(&steps[0], 0);
	atomic_store(&nested_done, false);
	atomic_store(&freezer_started, false);
	if (!CHECK(pthread_create(&w, NULL, nested_when_told, &freezer_started) == 0))
		return;
	while (!atomic_load(&steps[0]))
		sched_yield();
	if (!CHECK(pthread_create(&f, NULL, freezer, NULL) == 0))
		return;
	pthread_join(f, NULL);
	CHECK_MSG(atomic_load(&nested_done), "a nested entry waited in the freeze");
	CHECK_MSG(atomic_load(&freeze_ms) < 1000, "the freeze waited %llu ms for a region that could not close",
		  (unsigned long long)atomic_load(&freeze_ms));
	CHECK_EQ(rk_unsafe_open_mask(), 0);
	rk_unsafe_thaw();
	if (flag_set_within(&nested_done, 2000))
		pthread_join(w, NULL);
}

static void nested_entry_waits_once_the_freeze_returned(void)
{
	pthread_t w;
	atomic_store(&steps[0], 0);
	atomic_store(&nested_done, false);
	atomic_store(&looked, false);
	if (!CHECK(pthread_create(&w, NULL, nested_when_told, &looked) == 0))
		return;
	while (!atomic_load(&steps[0]))
		sched_yield();
	rk_unsafe_freeze(20ull * 1000 * 1000); /* times out: the worker is inside */
	CHECK_EQ(rk_unsafe_open_mask(), 1u << arena->index);
	atomic_store(&looked, true);
	sleep_ms(60);
	CHECK_MSG(!atomic_load(&nested_done), "a region opened after the freeze had returned");
	CHECK(rk_component_is_safe(arena_b));
	rk_unsafe_thaw();
	bool done = flag_set_within(&nested_done, 2000);
	CHECK_MSG(done, "the nested entry did not go on after the thaw");
	if (done)
		pthread_join(w, NULL);
}

/* ---- case 2: the main thread exits after a warm rk_init ---- */

static pthread_t main_thread;
static atomic_bool worker_inside;

static void *worker_outlives_main(void *arg)
{
	(void)arg;
	rk_unsafe_begin(arena); /* the first free slot: the one rk_init reset */
	atomic_store(&worker_inside, true);
	pthread_join(main_thread, NULL); /* its key destructors have run */
	CHECK_MSG(!rk_component_is_safe(arena), "the main thread's exit freed the slot of a worker inside a region");
	CHECK_MSG(rk_unsafe_open_mask() == 1u << arena->index, "open mask 0x%x", rk_unsafe_open_mask());
	rk_unsafe_end(arena);
	CHECK(rk_component_is_safe(arena));
	printf("%s: %-40s %s\n", check_name_, "main_thread_exit_keeps_workers_slot",
	       atomic_load(&check_failed_) ? "FAILED" : "ok");
	exit(check_done());
}

static _Noreturn void main_thread_exit_keeps_workers_slot(void)
{
	check_case_ = "main_thread_exit_keeps_workers_slot";
	main_thread = pthread_self();
	pthread_t w;
	if (pthread_create(&w, NULL, worker_outlives_main, NULL) != 0) {
		CHECK(!"pthread_create");
		exit(check_done());
	}
	while (!atomic_load(&worker_inside))
		sched_yield();
	pthread_exit(NULL); /* the worker finishes the test */
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_unsafe_regions");
	arena = test_arena("regions", 8u << 20);
	arena_b = test_arena("regions-b", 8u << 20);
	if (rk_restart_info()->generation == 0) {
		RUN(exited_threads_count_not_inherited);
		RUN(thaw_releases_stopped_threads);
		RUN(nested_entry_goes_through_while_draining);
		RUN(nested_entry_waits_once_the_freeze_returned);
		if (atomic_load(&check_failed_))
			return check_done();
		/* Leaves blocks in this thread's cache in the arena: the warm
		 * rk_init folds them back under a class lock, which claims this
		 * thread a slot before rk_init resets the block. */
		if (!CHECK(rk_alloc(arena, 64) != NULL))
			return check_done();
		printf("%s: %u passed in the first incarnation; restarting\n", check_name_,
		       atomic_load(&check_passed_));
		fflush(stdout);
		int r = rk_restart("test_unsafe_regions: warm start for case 2");
		CHECK_MSG(0, "rk_restart returned %d", r);
		return check_done();
	}
	CHECK_MSG(rk_restart_info()->kind == RK_START_WARM, "second incarnation started %d, not warm",
		  (int)rk_restart_info()->kind);
	main_thread_exit_keeps_workers_slot();
}
