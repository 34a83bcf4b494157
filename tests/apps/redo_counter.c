/* redo_counter - the redo log's API from C (rk_redo_*), for
 * tests/test_redo_api.py.  Its state is one counter in the arena "counter";
 * each increment is logged as a record (the amount, 8 bytes) in the
 * increment's unsafe region and acknowledged on stdout once durable:
 *   {"app":"acked","n":N,"at":POSITION}
 *
 *   redo_counter --incs K            K increments of 1
 *   redo_counter --incs K --early    first a snapshot with no arena (asked
 *                                    for and waited for), then the arena:
 *                                    the records must build it from empty
 *   redo_counter --incs K --early --arena-after FILE   the same, but the
 *                                    arena only once FILE exists (after
 *                                    printing {"app":"early"})
 *   redo_counter --ticks K           K times, 50 ms apart: add 1 to a preserved
 *                                    static (RK_PRESERVED: no arena page is
 *                                    written) and print {"app":"tick","n":N}
 *   redo_counter --check             print {"app":"check","n":N,"replayed":R,
 *                                    "ticks":T}
 *   redo_counter --die-in-replay-once FILE   if FILE does not exist: create
 *                                    it, then fault (SIGSEGV) inside the first
 *                                    record's apply: the replay unfinished,
 *                                    the runtime's handler decides
 *
 *   redo_counter --incs K --crash-when-warm-after J FILE   in an incarnation
 *                                    restarted warm in place (not from a
 *                                    snapshot), fault after J increments if
 *                                    FILE does not exist (creating it): a
 *                                    crash loop, once
 *
 * Every start first replays what a restore hands it (rk_redo_replay) and
 * prints {"app":"replayed","records":R,"n":N}. */
#include "rekindle.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static rk_arena *arena;
static uint64_t *counter;
static const char *die_once; /* the file that says it died already */
static long crash_after = -1;
static const char *crash_once;
static const char *arena_after; /* with --early: open the arena once it exists */
RK_PRESERVED static uint64_t ticks; /* --ticks: state outside every arena */

static void fault_once(const char *file)
{
	FILE *f = fopen(file, "w");
	if (f)
		fclose(f);
	volatile uintptr_t bad = 8;
	*(volatile int *)bad = 1; /* a crash the runtime handles */
}

static void wait_readable(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	(void)poll(&p, 1, 100);
	uint64_t n;
	(void)!read(fd, &n, sizeof n);
}

static void open_counter(void)
{
	arena = rk_arena_open("counter", 1 << 20);
	if (!arena) {
		fprintf(stderr, "redo_counter: rk_arena_open: %s\n", strerror(errno));
		exit(1);
	}
	counter = rk_root_get(arena, "counter");
	if (!counter) {
		rk_unsafe_begin(arena);
		counter = rk_alloc(arena, sizeof *counter);
		if (!counter) {
			fprintf(stderr, "redo_counter: rk_alloc failed\n");
			exit(1);
		}
		*counter = 0;
		rk_root_set(arena, "counter", counter);
		rk_unsafe_end(arena);
	}
}

static int apply(const void *rec, size_t len, void *ctx)
{
	(void)ctx;
	uint64_t by;
	if (len != sizeof by)
		return -EPROTO;
	if (die_once && access(die_once, F_OK) != 0)
		fault_once(die_once);
	memcpy(&by, rec, sizeof by);
	if (!counter)
		open_counter();
	rk_unsafe_begin(arena);
	*counter += by;
	rk_unsafe_end(arena);
	return 0;
}

int main(int argc, char **argv)
{
	long incs = 0, nticks = 0;
	int early = 0, check = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--incs") && i + 1 < argc)
			incs = strtol(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--early"))
			early = 1;
		else if (!strcmp(argv[i], "--ticks") && i + 1 < argc)
			nticks = strtol(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--arena-after") && i + 1 < argc)
			arena_after = argv[++i];
		else if (!strcmp(argv[i], "--die-in-replay-once") && i + 1 < argc)
			die_once = argv[++i];
		else if (!strcmp(argv[i], "--crash-when-warm-after") && i + 2 < argc) {
			crash_after = strtol(argv[++i], NULL, 10);
			crash_once = argv[++i];
		}
		else {
			fprintf(stderr, "redo_counter: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	int r = rk_init(argc, argv, NULL);
	if (r < 0) {
		fprintf(stderr, "redo_counter: rk_init: %s\n", strerror(-r));
		return 1;
	}
	if (early && rk_checkpoint() == 0) {
		/* the snapshot of no arena at all */
		for (int i = 0; i < 200 && rk_durable_epoch() < 1; i++)
			wait_readable(rk_durable_fd());
		printf("{\"app\":\"early\",\"durable_epoch\":%" PRIu64 "}\n", rk_durable_epoch());
		fflush(stdout);
		for (int i = 0; arena_after && access(arena_after, F_OK) != 0 && i < 3000; i++)
			(void)poll(NULL, 0, 10);
	}
	if (!early || rk_restart_info()->snapshot[0])
		open_counter(); /* a restore's arena, or a fresh one */
	int64_t replayed = rk_redo_replay(apply, NULL);
	if (replayed < 0) {
		fprintf(stderr, "redo_counter: rk_redo_replay: %s\n", strerror((int)-replayed));
		return 1;
	}
	if (!counter)
		open_counter();
	printf("{\"app\":\"replayed\",\"records\":%" PRId64 ",\"n\":%" PRIu64 "}\n", replayed, *counter);
	fflush(stdout);
	rk_ready();
	if (check) {
		printf("{\"app\":\"check\",\"n\":%" PRIu64 ",\"replayed\":%" PRId64 ",\"ticks\":%" PRIu64 "}\n",
		       *counter, replayed, ticks);
		fflush(stdout);
	}
	for (long i = 0; i < nticks; i++) {
		ticks++;
		printf("{\"app\":\"tick\",\"n\":%" PRIu64 "}\n", ticks);
		fflush(stdout);
		(void)poll(NULL, 0, 50);
	}
	const struct rk_restart_info *ri = rk_restart_info();
	bool warm_in_place = ri->kind == RK_START_WARM && !ri->snapshot[0];
	for (long i = 0; i < incs; i++) {
		if (warm_in_place && i == crash_after && access(crash_once, F_OK) != 0)
			fault_once(crash_once);
		uint64_t by = 1;
		int64_t at;
		for (;;) {
			rk_unsafe_begin(arena);
			at = rk_redo_append(&by, sizeof by);
			if (at >= 0 || at == -EAGAIN)
				*counter += by; /* -EAGAIN: durable by a snapshot instead */
			rk_unsafe_end(arena);
			if (at >= 0 || at == -EAGAIN)
				break;
			fprintf(stderr, "redo_counter: rk_redo_append: %s\n", strerror((int)-at));
			return 1;
		}
		if (at >= 0) {
			rk_redo_flush();
			while (rk_redo_durable() < (uint64_t)at)
				wait_readable(rk_redo_fd());
		} else {
			uint64_t e = rk_epoch();
			rk_checkpoint();
			while (rk_durable_epoch() < e)
				wait_readable(rk_durable_fd());
		}
		printf("{\"app\":\"acked\",\"n\":%" PRIu64 ",\"at\":%" PRId64 "}\n", *counter, at);
		fflush(stdout);
	}
	for (;;)
		pause(); /* until killed */
}
