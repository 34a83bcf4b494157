/* snapshot_load - the app `make bench-snapshots` snapshots: an arena of MB
 * MiB filled with non-zero pages, then every PERIOD ms it writes one word
 * into PERMILLE per mille of its pages, chosen at random, inside an unsafe
 * region (as any app changes preserved state), for SECONDS seconds.  It
 * prints one JSON line when it is filled ({"load":"filled"}) and one at the
 * end with how many intervals it wrote.  Run it under
 *   rekindle run --snapshot-dir DIR --snapshot-interval PERIOD ... --
 *       snapshot_load --mb MB --permille P --period-ms PERIOD --seconds S
 * and read the snapshot events (bench/snapshot_bench.py does). */
#include "rekindle.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAGE 4096u
#define CHUNK (1u << 20)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t rng(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static long opt(int argc, char **argv, const char *name, long dflt)
{
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], name))
			return strtol(argv[i + 1], NULL, 10);
	return dflt;
}

int main(int argc, char **argv)
{
	long mb = opt(argc, argv, "--mb", 256), permille = opt(argc, argv, "--permille", 10);
	long period_ms = opt(argc, argv, "--period-ms", 100), seconds = opt(argc, argv, "--seconds", 10);
	if (mb <= 0 || permille < 0 || permille > 1000 || period_ms <= 0 || seconds <= 0) {
		fprintf(stderr, "usage: snapshot_load --mb MB --permille P --period-ms MS --seconds S\n");
		return 2;
	}
	int r = rk_init(argc, argv, NULL);
	if (r < 0) {
		fprintf(stderr, "snapshot_load: rk_init: %s\n", strerror(-r));
		return 1;
	}
	rk_arena *a = rk_arena_open("load", (size_t)mb * CHUNK + (64u << 20));
	if (!a) {
		fprintf(stderr, "snapshot_load: rk_arena_open: %s\n", strerror(errno));
		return 1;
	}
	size_t nchunks = (size_t)mb;
	char **chunks = calloc(nchunks, sizeof *chunks);
	if (!chunks)
		return 1;
	for (size_t i = 0; i < nchunks; i++) {
		rk_unsafe_begin(a); /* one region per MiB: a cut can come between */
		chunks[i] = rk_alloc(a, CHUNK);
		if (!chunks[i]) {
			fprintf(stderr, "snapshot_load: rk_alloc: out of arena\n");
			return 1;
		}
		for (size_t p = 0; p < CHUNK; p += PAGE) /* distinct, non-zero pages */
			memcpy(chunks[i] + p, &(uint64_t){(i << 20 | p) + 1}, 8);
		rk_unsafe_end(a);
	}
	rk_ready();
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	printf("{\"load\":\"filled\",\"mb\":%ld,\"t_ns\":%llu}\n", mb,
	       (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
	fflush(stdout);

	uint64_t seed = 0x9e3779b97f4a7c15ull, pages = nchunks * (CHUNK / PAGE);
	uint64_t per = pages * (uint64_t)permille / 1000, intervals = 0;
	double end = now_s() + (double)seconds, next = now_s();
	while (now_s() < end) {
		rk_unsafe_begin(a);
		for (uint64_t k = 0; k < per; k++) {
			uint64_t pg = rng(&seed) % pages;
			uint64_t *w = (uint64_t *)(chunks[pg / (CHUNK / PAGE)] + (pg % (CHUNK / PAGE)) * PAGE + 8);
			*w += 1;
		}
		rk_unsafe_end(a);
		rk_heartbeat();
		intervals++;
		next += (double)period_ms / 1000.0;
		double wait = next - now_s();
		if (wait > 0)
			nanosleep(&(struct timespec){(time_t)wait, (long)((wait - (time_t)wait) * 1e9)}, NULL);
	}
	printf("{\"load\":\"done\",\"intervals\":%llu,\"pages_per_interval\":%llu}\n",
	       (unsigned long long)intervals, (unsigned long long)per);
	return 0;
}
