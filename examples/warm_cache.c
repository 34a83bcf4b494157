/* warm_cache - the smallest useful Rekindle program: a hash-table cache whose
 * entries live in an arena.  It builds the cache (its "cold recovery"),
 * serves lookups for a while, then crashes on a NULL pointer.  The runtime
 * restarts it from main(); the new incarnation finds the table where it was,
 * checks it, and serves again at once.
 *
 *   warm_cache [--entries N] [--value-bytes B] [--crashes K]
 *
 * The Rekindle-specific lines are marked "rk:". */
#include "rekindle.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct entry {
	struct entry *next;
	uint64_t key;
	uint32_t len;
	char value[];
};

struct table {
	uint64_t nbuckets, count;
	struct entry *buckets[];
};

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

/* Stands in for loading from disk or a database: a little work per value. */
static void make_value(uint64_t key, char *out, uint32_t len)
{
	uint64_t h = key;
	for (uint32_t i = 0; i < len; i++) {
		h = mix(h + i);
		out[i] = (char)('a' + h % 26);
	}
}

static struct table *build(rk_arena *a, uint64_t n, uint32_t vlen)
{
	uint64_t nb = 1;
	while (nb < n)
		nb <<= 1;
	struct table *t = rk_calloc(a, 1, sizeof *t + nb * sizeof t->buckets[0]); /* rk: */
	if (!t)
		return NULL;
	t->nbuckets = nb;
	for (uint64_t k = 0; k < n; k++) {
		struct entry *e = rk_alloc(a, sizeof *e + vlen); /* rk: */
		if (!e)
			return NULL;
		e->key = k;
		e->len = vlen;
		make_value(k, e->value, vlen);
		uint64_t b = mix(k) & (nb - 1);
		e->next = t->buckets[b];
		t->buckets[b] = e;
		t->count++;
	}
	return t;
}

static const struct entry *lookup(const struct table *t, uint64_t key)
{
	for (const struct entry *e = t->buckets[mix(key) & (t->nbuckets - 1)]; e; e = e->next)
		if (e->key == key)
			return e;
	return NULL;
}

/* Marks the table and every entry (rk: cleanup), checking values on the way. */
static uint64_t mark_and_check(rk_arena *a, struct table *t)
{
	uint64_t ok = 0;
	char buf[4096];
	rk_mark(a, t);
	for (uint64_t b = 0; b < t->nbuckets; b++)
		for (struct entry *e = t->buckets[b]; e; e = e->next) {
			rk_mark(a, e);
			make_value(e->key, buf, e->len < sizeof buf ? e->len : sizeof buf);
			ok += memcmp(buf, e->value, e->len < sizeof buf ? e->len : sizeof buf) == 0;
		}
	return ok;
}

int main(int argc, char **argv)
{
	uint64_t entries = 1000000, crashes = 1;
	uint32_t vlen = 100;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--entries") && i + 1 < argc)
			entries = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--value-bytes") && i + 1 < argc)
			vlen = (uint32_t)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--crashes") && i + 1 < argc)
			crashes = strtoull(argv[++i], NULL, 0);
		else {
			fprintf(stderr, "usage: warm_cache [--entries N] [--value-bytes B] [--crashes K]\n");
			return 2;
		}
	}
	if (vlen == 0 || vlen > 4096) {
		fprintf(stderr, "warm_cache: --value-bytes must be 1..4096\n");
		return 2;
	}
	setenv("REKINDLE_CRASHLOOP_MS", "0", 0); /* the demo crashes on purpose, quickly */
	int r = rk_init(argc, argv, NULL); /* rk: */
	if (r < 0) {
		fprintf(stderr, "warm_cache: rk_init: %s\n", strerror(-r));
		return 1;
	}
	const struct rk_restart_info *info = rk_restart_info(); /* rk: */
	size_t arena_bytes = (size_t)entries * (vlen + 64) * 2 + (64u << 20);
	rk_arena *a = rk_arena_open("cache", arena_bytes); /* rk: */
	if (!a) {
		fprintf(stderr, "warm_cache: rk_arena_open: %s\n", strerror(errno));
		return 1;
	}
	double t0 = now_ms();
	struct table *t;
	if (rk_is_recovery()) { /* rk: warm restart */
		t = rk_root_get(a, "table");
		uint64_t ok = t ? mark_and_check(a, t) : 0;
		struct rk_sweep_stats sw;
		rk_finish_recovery(true, &sw);
		printf("incarnation %u (warm, after %s): restart took %.2f ms; %llu of %llu entries intact, "
		       "checked in %.0f ms; %llu bytes of in-flight garbage swept\n",
		       info->generation, info->reason, info->restart_ns / 1e6, (unsigned long long)ok,
		       (unsigned long long)(t ? t->count : 0), now_ms() - t0, (unsigned long long)sw.bytes_freed);
	} else {
		t = build(a, entries, vlen);
		if (!t) {
			fprintf(stderr, "warm_cache: out of arena memory: %s\n", strerror(errno));
			return 1;
		}
		rk_root_set(a, "table", t); /* rk: */
		printf("incarnation %u (%s): built %llu entries of %u bytes in %.0f ms (the cold path)\n",
		       info->generation, info->kind == RK_START_FRESH ? "fresh start" : "cold restart",
		       (unsigned long long)t->count, vlen, now_ms() - t0);
	}
	/* serve a burst of lookups */
	uint64_t hits = 0;
	double s0 = now_ms();
	for (uint64_t i = 0; i < 1000000; i++)
		hits += lookup(t, mix(i) % (entries ? entries : 1)) != NULL;
	printf("  served 1000000 lookups in %.0f ms, %llu hits\n", now_ms() - s0, (unsigned long long)hits);
	/* a request in flight allocates, then the bug strikes */
	rk_alloc(a, 4096);
	fflush(stdout);
	if (info->generation < crashes) {
		printf("  crashing now (NULL pointer write)...\n");
		fflush(stdout);
		volatile int *volatile bad = NULL;
		*bad = 42;
	}
	return 0;
}
