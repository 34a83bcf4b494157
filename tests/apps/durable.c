/* durable - acknowledges a write only once it is durable, with the runtime's
 * durability API (rk_epoch, rk_checkpoint, rk_durable_epoch, rk_durable_fd),
 * for tests/test_snapshots.py.  Its state is an array of counters in the
 * "durable" arena.
 *
 *   durable --writes N [--threads T]   write v[i] = i + 1 for i < N (split
 *                                      among T threads), each acknowledged
 *                                      on stdout once durable:
 *                                      {"app":"acked","i":I,"epoch":E}
 *   durable --check                    print what the arena holds:
 *                                      {"app":"check","set":S,"restored":"ID",...}
 *   durable --check --fork             a forked child counts the slots set
 *                                      first: {"app":"child_check","set":S}
 *                                      (a lazy restore must serve its reads)
 *   durable --writes N --slow-region-ms M   a thread holds an unsafe region
 *                                      of the arena open for M ms, without
 *                                      asking for a snapshot; the writers
 *                                      start once it is open (their first
 *                                      snapshots are refused: region_open)
 *   durable --writes N --huge          first maps the 2 MiB holding the slots
 *                                      with one huge page (MADV_COLLAPSE, as a
 *                                      kernel with shmem_enabled=always does):
 *                                      {"app":"huge","collapsed":B,"errno":E}
 *
 * A second arena, "cache", is opened RK_ARENA_NO_SNAPSHOT: it holds the
 * number of write runs started, which a warm restart keeps and a restore
 * from a snapshot does not.  Each start prints
 *   {"app":"arenas","durable":PRESERVED,"cache":PRESERVED,"runs":N}
 *
 * Without a snapshot store, writing refuses to acknowledge anything (it
 * exits 3): nothing it wrote would survive the machine. */
#include "rekindle.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define SLOTS 100000

struct state {
	uint64_t n;
	uint64_t v[SLOTS];
};

static rk_arena *arena, *cache;
static struct state *st;
static uint64_t *runs; /* in the cache arena */
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

/* Blocks until the snapshot of epoch e is durable. */
static void wait_durable(uint64_t e)
{
	int fd = rk_durable_fd();
	while (rk_durable_epoch() < e) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 1000) > 0) {
			uint64_t c;
			(void)!read(fd, &c, sizeof c);
		}
	}
}

struct job {
	uint64_t from, to;
};

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

/* The 2 MiB range holding the first slot, mapped by one huge page: the
 * arena is grown past it first (a collapse needs the whole range in the
 * file) and the range is written (it needs pages to collapse). */
static void map_slots_huge(void)
{
	const uintptr_t huge = 2u << 20;
	uintptr_t from = (uintptr_t)&st->v[0] & ~(huge - 1);
	rk_unsafe_begin(arena);
	char *ballast = rk_alloc(arena, 2 * huge);
	if (ballast)
		memset(ballast, 1, 2 * huge);
	rk_unsafe_end(arena);
	int r = ballast ? madvise((void *)from, huge, MADV_COLLAPSE) : -1;
	printf("{\"app\":\"huge\",\"collapsed\":%s,\"errno\":%d}\n", r == 0 ? "true" : "false",
	       r == 0 ? 0 : ballast ? errno : ENOMEM);
	fflush(stdout);
}

static atomic_int slow_open;

/* An unsafe region held open for ms milliseconds (a long maintenance task,
 * say), then closed; it never asks for a snapshot. */
static void *slow_region(void *arg)
{
	long ms = (long)(intptr_t)arg;
	rk_unsafe_begin(arena);
	atomic_store(&slow_open, 1);
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
	rk_unsafe_end(arena);
	printf("{\"app\":\"slow_region_closed\",\"ms\":%ld}\n", ms);
	fflush(stdout);
	return NULL;
}

static void *writer(void *arg)
{
	const struct job *j = arg;
	for (uint64_t i = j->from; i < j->to; i++) {
		rk_unsafe_begin(arena);
		st->v[i] = i + 1;
		rk_unsafe_end(arena);
		uint64_t e = rk_epoch(); /* after the region: the write is in e or earlier */
		if (rk_checkpoint() < 0)
			abort();
		wait_durable(e);
		pthread_mutex_lock(&out_lock);
		printf("{\"app\":\"acked\",\"i\":%llu,\"epoch\":%llu}\n", (unsigned long long)i,
		       (unsigned long long)e);
		fflush(stdout);
		pthread_mutex_unlock(&out_lock);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	long writes = -1, threads = 1;
	int check = 0, fork_check = 0, huge = 0;
	long slow_ms = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--writes") && i + 1 < argc)
			writes = strtol(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = strtol(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--fork"))
			fork_check = 1;
		else if (!strcmp(argv[i], "--huge"))
			huge = 1;
		else if (!strcmp(argv[i], "--slow-region-ms") && i + 1 < argc)
			slow_ms = strtol(argv[++i], NULL, 10);
	}
	if ((!check && (writes < 0 || writes > SLOTS)) || threads < 1 || threads > 16 || slow_ms < 0 ||
	    slow_ms > 600000) {
		fprintf(stderr, "usage: durable --writes N [--threads T] [--huge] [--slow-region-ms M] | --check "
				"[--fork]\n");
		return 2;
	}
	int r = rk_init(argc, argv, NULL);
	if (r < 0) {
		fprintf(stderr, "durable: rk_init: %s\n", strerror(-r));
		return 1;
	}
	arena = rk_arena_open("durable", 64u << 20);
	if (!arena)
		return 1;
	st = rk_is_recovery() ? rk_root_get(arena, "state") : NULL;
	if (!st) {
		rk_unsafe_begin(arena);
		st = rk_alloc(arena, sizeof *st);
		memset(st, 0, sizeof *st);
		rk_root_set(arena, "state", st);
		rk_unsafe_end(arena);
	}
	cache = rk_arena_open_flags("cache", 2u << 20, RK_ARENA_NO_SNAPSHOT);
	if (!cache)
		return 1;
	runs = rk_arena_preserved(cache) ? rk_root_get(cache, "runs") : NULL;
	if (!runs) {
		rk_unsafe_begin(cache);
		runs = rk_calloc(cache, 1, sizeof *runs);
		rk_root_set(cache, "runs", runs);
		rk_unsafe_end(cache);
	}
	if (huge && !check)
		map_slots_huge();
	if (!check) {
		rk_unsafe_begin(cache);
		(*runs)++;
		rk_unsafe_end(cache);
	}
	printf("{\"app\":\"arenas\",\"durable\":%s,\"cache\":%s,\"runs\":%llu}\n",
	       rk_arena_preserved(arena) ? "true" : "false", rk_arena_preserved(cache) ? "true" : "false",
	       (unsigned long long)*runs);
	fflush(stdout);
	if (rk_is_recovery())
		rk_finish_recovery_mode(RK_CLEANUP_PENDING, NULL);
	rk_ready();
	if (check && fork_check) {
		fflush(stdout);
		pid_t child = fork();
		if (child == 0) {
			uint64_t n = 0;
			for (uint64_t i = 0; i < SLOTS; i++)
				n += st->v[i] == i + 1;
			printf("{\"app\":\"child_check\",\"set\":%llu}\n", (unsigned long long)n);
			fflush(stdout);
			_exit(0);
		}
		if (child > 0)
			(void)waitpid(child, NULL, 0);
	}
	if (check) {
		uint64_t set = 0, wrong = 0, last = 0;
		for (uint64_t i = 0; i < SLOTS; i++) {
			if (st->v[i] == 0)
				continue;
			set++;
			wrong += st->v[i] != i + 1;
			last = i;
		}
		const struct rk_restart_info *ri = rk_restart_info();
		printf("{\"app\":\"check\",\"set\":%llu,\"wrong\":%llu,\"last\":%llu,\"restored\":\"%s\","
		       "\"kind\":%d,\"ranges\":[",
		       (unsigned long long)set, (unsigned long long)wrong, (unsigned long long)last, ri->snapshot,
		       (int)ri->kind);
		/* the slots set, as [from, to) runs */
		const char *sep = "";
		for (uint64_t i = 0; i < SLOTS;) {
			if (st->v[i] == 0) {
				i++;
				continue;
			}
			uint64_t j = i;
			while (j < SLOTS && st->v[j] != 0)
				j++;
			printf("%s[%llu,%llu]", sep, (unsigned long long)i, (unsigned long long)j);
			sep = ",";
			i = j;
		}
		printf("]}\n");
		fflush(stdout);
		/* stay up until the test stops us: the supervisor restarts an exit */
		for (;;)
			pause();
	}
	pthread_t t[16], slow;
	struct job jobs[16];
	/* the region is open before the checkpoint below asks for a snapshot:
	 * that snapshot's cut is refused however fast it comes */
	if (slow_ms > 0) {
		pthread_create(&slow, NULL, slow_region, (void *)(intptr_t)slow_ms);
		while (!atomic_load(&slow_open))
			sched_yield();
	}
	if (rk_checkpoint() == -ENOTSUP) {
		fprintf(stderr, "durable: no snapshot store: nothing would be durable\n");
		return 3;
	}
	for (long k = 0; k < threads; k++) {
		jobs[k] = (struct job){(uint64_t)(writes * k / threads), (uint64_t)(writes * (k + 1) / threads)};
		pthread_create(&t[k], NULL, writer, &jobs[k]);
	}
	for (long k = 0; k < threads; k++)
		pthread_join(t[k], NULL);
	if (slow_ms > 0)
		pthread_join(slow, NULL);
	printf("{\"app\":\"done\"}\n");
	fflush(stdout);
	for (;;)
		pause();
}
