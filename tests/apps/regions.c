/* regions - worker threads in unsafe regions and in the allocator while the
 * app restarts itself, for tests/test_freeze.py.  One JSON line per
 * incarnation on stdout ({"app":"state",...}).
 *
 *   regions exec-fail  two workers hammer the arena (one in unsafe regions
 *                      that allocate, one in the allocator alone); the app
 *                      takes the execute permission off its own binary (run
 *                      it from a copy), asks for a restart, whose execve
 *                      fails (EACCES), checks that both workers go on and
 *                      that it can still allocate, puts the permission back
 *                      and restarts again.
 *   regions nested     a worker sleeps 3 ms inside a region of arena "a",
 *                      then opens nested regions of "b" and "a"; the app
 *                      restarts while the worker sleeps.
 *
 * Workers count each region's start and end in the arenas; the restarted
 * incarnation (warm or cold) checks that no region was left half-done and
 * exits 0. */
#include "rekindle.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NWORKERS 2

struct counters {
	uint64_t begun[NWORKERS], ended[NWORKERS];
	uint64_t nested; /* the nested region of "a" */
};

struct nested_b {
	uint64_t n; /* the nested region of "b" */
};

static rk_arena *arena_a, *arena_b;
static struct counters *ctr;
static struct nested_b *nb;
static _Atomic uint64_t progress[NWORKERS];
static atomic_bool inside; /* nested mode: the worker is in its outer region */

static void sleep_ms(long ms)
{
	struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
	while (nanosleep(&t, &t) < 0 && errno == EINTR)
		;
}

static uint64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Regions that allocate, as an app changes its preserved structures. */
static void *region_worker(void *arg)
{
	(void)arg;
	for (uint64_t i = 0;; i++) {
		rk_unsafe_begin(arena_a);
		ctr->begun[0]++;
		void *p = rk_alloc(arena_a, 16 + (i * 61) % 4000);
		rk_free(arena_a, p);
		ctr->ended[0]++;
		rk_unsafe_end(arena_a);
		atomic_fetch_add(&progress[0], 1);
	}
	return NULL;
}

/* The allocator alone; objects up to 40 KB take the heap lock. */
static void *alloc_worker(void *arg)
{
	(void)arg;
	void *keep[64] = {0};
	for (uint64_t i = 0;; i++) {
		unsigned s = (unsigned)(i * 7919 % 64);
		rk_free(arena_a, keep[s]);
		keep[s] = rk_alloc(arena_a, 16 + (i * 31) % 40000);
		atomic_fetch_add(&progress[1], 1);
	}
	return NULL;
}

static void *nested_worker(void *arg)
{
	(void)arg;
	for (;;) {
		rk_unsafe_begin(arena_a);
		ctr->begun[0]++;
		atomic_store(&inside, true);
		sleep_ms(3); /* the restart's freeze starts here */
		rk_unsafe_begin(arena_b);
		nb->n++;
		rk_unsafe_begin(arena_a);
		ctr->nested++;
		rk_unsafe_end(arena_a);
		rk_unsafe_end(arena_b);
		ctr->ended[0]++;
		atomic_store(&inside, false);
		rk_unsafe_end(arena_a);
		atomic_fetch_add(&progress[0], 1);
	}
	return NULL;
}

/* Waits up to 5 s until each of the first n workers has gone `by` steps
 * past `from`; says which did. */
static bool wait_progress(unsigned n, const uint64_t *from, uint64_t by, bool *went)
{
	uint64_t t0 = now_ms();
	bool all;
	do {
		all = true;
		for (unsigned i = 0; i < n; i++)
			all &= went[i] = atomic_load(&progress[i]) >= from[i] + by;
		if (!all)
			sleep_ms(1);
	} while (!all && now_ms() - t0 < 5000);
	return all;
}

static void start(void *(*fn)(void *))
{
	pthread_t t;
	if (pthread_create(&t, NULL, fn, NULL) != 0) {
		fprintf(stderr, "regions: pthread_create failed\n");
		exit(3);
	}
}

static _Noreturn void restart_or_die(const char *why)
{
	fflush(stdout);
	int r = rk_restart(why);
	fprintf(stderr, "regions: rk_restart returned %d\n", r);
	exit(4);
}

static _Noreturn void exec_fail(void)
{
	static const uint64_t zero[NWORKERS];
	bool went[NWORKERS];
	start(region_worker);
	start(alloc_worker);
	if (!wait_progress(NWORKERS, zero, 1000, went)) {
		fprintf(stderr, "regions: workers did not start\n");
		exit(3);
	}
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0) {
		perror("regions: readlink /proc/self/exe");
		exit(3);
	}
	exe[n] = 0;
	if (chmod(exe, 0644) < 0) {
		perror("regions: chmod -x");
		exit(3);
	}
	int r = rk_restart("regions: execve fails"); /* both workers park in the freeze */
	int chmod_back = chmod(exe, 0755);
	uint64_t snap[NWORKERS];
	for (unsigned i = 0; i < NWORKERS; i++)
		snap[i] = atomic_load(&progress[i]);
	bool all = wait_progress(NWORKERS, snap, 1000, went);
	void *p = rk_alloc(arena_a, 100);
	bool alloc_ok = p != NULL;
	rk_free(arena_a, p);
	printf("{\"app\":\"state\",\"generation\":0,\"restart_rc\":%d,\"chmod_back\":%d,"
	       "\"region_worker_went_on\":%s,\"alloc_worker_went_on\":%s,\"alloc_ok\":%s}\n",
	       r, chmod_back, went[0] ? "true" : "false", went[1] ? "true" : "false", alloc_ok ? "true" : "false");
	if (!all || chmod_back < 0) {
		fflush(stdout);
		_exit(5); /* a parked worker would never end */
	}
	restart_or_die("regions: execve works again");
}

static _Noreturn void nested(void)
{
	start(nested_worker);
	static const uint64_t zero[NWORKERS];
	bool went[NWORKERS];
	if (!wait_progress(1, zero, 3, went)) {
		fprintf(stderr, "regions: worker did not start\n");
		exit(3);
	}
	while (!atomic_load(&inside))
		sched_yield();
	restart_or_die("regions: nested");
}

static void *root_or_new(rk_arena *a, const char *name, size_t size)
{
	void *p = rk_root_get(a, name);
	if (p)
		return p;
	p = rk_calloc(a, 1, size);
	if (!p || rk_root_set(a, name, p) < 0) {
		fprintf(stderr, "regions: no %s\n", name);
		exit(3);
	}
	return p;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	if (strcmp(mode, "exec-fail") && strcmp(mode, "nested")) {
		fprintf(stderr, "usage: regions exec-fail|nested\n");
		return 2;
	}
	int r = rk_init(argc, argv, NULL);
	if (r < 0) {
		fprintf(stderr, "regions: rk_init: %s\n", strerror(-r));
		return 3;
	}
	arena_a = rk_arena_open("a", 64ull << 20);
	arena_b = rk_arena_open("b", 8ull << 20);
	if (!arena_a || !arena_b) {
		fprintf(stderr, "regions: rk_arena_open: %s\n", strerror(errno));
		return 3;
	}
	ctr = root_or_new(arena_a, "counters", sizeof *ctr);
	nb = root_or_new(arena_b, "nested", sizeof *nb);
	const struct rk_restart_info *info = rk_restart_info();
	if (info->generation == 0) {
		if (!strcmp(mode, "exec-fail"))
			exec_fail();
		nested();
	}
	bool balanced = true;
	if (rk_is_recovery()) {
		struct rk_sweep_stats sw;
		balanced = rk_mark(arena_a, ctr) >= 0 && rk_mark(arena_b, nb) >= 0 && rk_finish_recovery(true, &sw) == 0;
	}
	for (unsigned i = 0; i < NWORKERS; i++)
		balanced &= ctr->begun[i] == ctr->ended[i];
	static const char *kinds[] = {"fresh", "warm", "cold"};
	printf("{\"app\":\"state\",\"generation\":%u,\"kind\":\"%s\",\"decision\":\"%s\",\"balanced\":%s,"
	       "\"regions\":%llu,\"nested_a\":%llu,\"nested_b\":%llu}\n",
	       info->generation, kinds[info->kind], info->decision, balanced ? "true" : "false",
	       (unsigned long long)ctr->ended[0], (unsigned long long)ctr->nested, (unsigned long long)nb->n);
	return 0;
}
