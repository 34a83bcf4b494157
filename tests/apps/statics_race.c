/* statics_race - a probe (an interval snapshot's first round, which may
 * find nothing changed) must not take a state changed during its scan for
 * the last cut's, for tests/test_snapshot_unchanged.py.
 *
 *   statics_race           a preserved static s1 (0) and the arena "race":
 *                          256 MiB written, its first word the marker (0);
 *                          once that is durable, thread A sets s1 = 1 in a
 *                          region and waits until its epoch is durable,
 *                          then prints {"app":"acked"}.  Thread B waits
 *                          for the agent to bump rk_epoch() past A's (a
 *                          probe or a cut beginning), then, in one region,
 *                          sets s1 = 0 and the marker to 42: a page the
 *                          scan has most likely passed already
 *   statics_race --check   print {"app":"check","s1":S,"marker":M,"restored":"ID"}
 *
 * After A's acknowledgement the state must be A's, (1, 0), or A's and B's,
 * (0, 42): (0, 0) is the last cut's, with A's write lost (a probe that
 * compared the statics after its scan saw s1 put back to 0 and said
 * nothing had changed). */
#include "rekindle.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BLOCK_BYTES (256ul << 20)

RK_PRESERVED static uint64_t s1;

static rk_arena *arena;
static volatile uint64_t *block; /* block[0] is the marker */
static _Atomic uint64_t a_epoch;

static void wait_durable(uint64_t e)
{
	while (rk_durable_epoch() < e) {
		struct pollfd p = {.fd = rk_durable_fd(), .events = POLLIN};
		(void)poll(&p, 1, 100);
		uint64_t n;
		if (p.revents & POLLIN)
			(void)!read(p.fd, &n, sizeof n);
	}
}

static void *thread_b(void *arg)
{
	(void)arg;
	uint64_t e;
	while ((e = atomic_load(&a_epoch)) == 0 || rk_epoch() <= e)
		; /* spin: react within microseconds of the bump */
	struct timespec t = {0, 30 * 1000};
	nanosleep(&t, NULL);
	rk_unsafe_begin(arena);
	s1 = 0;
	block[0] = 42;
	rk_unsafe_end(arena);
	return NULL;
}

int main(int argc, char **argv)
{
	bool check = argc > 1 && !strcmp(argv[1], "--check");
	int r = rk_init(argc, argv, NULL);
	if (r < 0) {
		fprintf(stderr, "statics_race: rk_init: %s\n", strerror(-r));
		return 1;
	}
	arena = rk_arena_open("race", BLOCK_BYTES + (16ul << 20));
	if (!arena) {
		fprintf(stderr, "statics_race: rk_arena_open: %s\n", strerror(errno));
		return 1;
	}
	block = rk_root_get(arena, "block");
	if (!block) {
		rk_unsafe_begin(arena);
		block = rk_alloc(arena, BLOCK_BYTES);
		if (!block) {
			fprintf(stderr, "statics_race: rk_alloc failed\n");
			return 1;
		}
		memset((void *)block, 1, BLOCK_BYTES); /* every page present */
		block[0] = 0;
		rk_root_set(arena, "block", (void *)block);
		rk_unsafe_end(arena);
	}
	rk_ready();
	if (check) {
		printf("{\"app\":\"check\",\"s1\":%" PRIu64 ",\"marker\":%" PRIu64 ",\"restored\":\"%s\"}\n", s1,
		       block[0], rk_restart_info()->snapshot);
		fflush(stdout);
		for (;;)
			pause();
	}
	uint64_t e0 = rk_epoch();
	if (rk_checkpoint() < 0) {
		fprintf(stderr, "statics_race: no snapshots\n");
		return 3;
	}
	wait_durable(e0);
	printf("{\"app\":\"base\",\"durable_epoch\":%" PRIu64 "}\n", rk_durable_epoch());
	fflush(stdout);
	pthread_t b;
	if (pthread_create(&b, NULL, thread_b, NULL) != 0)
		return 1;
	(void)poll(NULL, 0, 50); /* a few probes that find nothing first */
	rk_unsafe_begin(arena);
	s1 = 1;
	rk_unsafe_end(arena);
	uint64_t e = rk_epoch(); /* after the region: A's write is in cut e or earlier */
	atomic_store(&a_epoch, e);
	wait_durable(e);
	printf("{\"app\":\"acked\",\"epoch\":%" PRIu64 "}\n", e);
	fflush(stdout);
	for (;;)
		pause();
}
