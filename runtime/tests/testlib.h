/* testlib.h - helpers the unit tests share besides assertions (header only):
 * start-up, a seeded random generator, per-object content patterns and
 * arena statistics. */
#ifndef RK_TEST_LIB_H
#define RK_TEST_LIB_H

#include "check.h"
#include "rk_internal.h"

#include <errno.h>
#include <stdlib.h>

/* rk_init first, as every program must.  No signal handlers: a crash in a
 * test must fail the test, not restart it into a warm incarnation. */
static inline void test_init(int argc, char **argv, const char *name)
{
	check_begin(name);
	struct rk_options opts = {.flags = RK_OPT_NO_SIGNAL_HANDLERS};
	int r = rk_init(argc, argv, &opts);
	if (r != 0) {
		printf("%s: rk_init failed: %d\n", name, r);
		exit(1);
	}
}

static inline rk_arena *test_arena(const char *name, size_t max)
{
	rk_arena *a = rk_arena_open(name, max);
	if (!a) {
		printf("%s: rk_arena_open(%s) failed: %s\n", check_name_, name, strerror(errno));
		exit(1);
	}
	return a;
}

static inline uint64_t allocated_bytes(const rk_arena *a)
{
	struct rk_arena_stats st;
	return rk_arena_stats(a, &st) == 0 ? st.allocated_bytes : UINT64_MAX;
}

static inline uint64_t heap_bytes(const rk_arena *a)
{
	struct rk_arena_stats st;
	return rk_arena_stats(a, &st) == 0 ? st.heap_bytes : UINT64_MAX;
}

/* Thread-cache slots of the arena that some thread owns (not the orphaned
 * caches of dead threads, which only keep their logs until recovery ends). */
static inline unsigned owned_caches(const rk_arena *a)
{
	unsigned n = 0;
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++) {
		uint32_t o = atomic_load(&a->hdr->tcaches[i].owner);
		n += o != 0 && o != RK_TC_ORPHAN;
	}
	return n;
}

/* Orphaned caches: dead threads' logs waiting for rk_finish_recovery. */
static inline unsigned orphaned_caches(const rk_arena *a)
{
	unsigned n = 0;
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++)
		n += atomic_load(&a->hdr->tcaches[i].owner) == RK_TC_ORPHAN;
	return n;
}

/* rk_arena_validate on a live arena, with the arguments a restart would use. */

static inline int validate(rk_arena *a, char *why, size_t len)
{
	why[0] = 0;
	return rk_arena_validate(a, a->hdr->base, a->hdr->max_bytes, why, len);
}

/* ---- random numbers: splitmix64, fixed seeds make failures repeatable ---- */
struct rng {
	uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static inline uint64_t rng_range(struct rng *r, uint64_t lo, uint64_t hi)
{
	return lo + rng_next(r) % (hi - lo + 1);
}

/* Roughly log-uniform in [lo, hi]: as many small sizes as big ones. */
static inline uint64_t rng_log_range(struct rng *r, uint64_t lo, uint64_t hi)
{
	unsigned lg_lo = 63u - (unsigned)__builtin_clzll(lo), lg_hi = 63u - (unsigned)__builtin_clzll(hi);
	unsigned lg = (unsigned)rng_range(r, lg_lo, lg_hi);
	uint64_t a = 1ull << lg, b = (2ull << lg) - 1;
	a = a < lo ? lo : a;
	b = b > hi ? hi : b;
	return rng_range(r, a, b);
}

static inline void rng_shuffle(struct rng *r, size_t *v, size_t n)
{
	for (size_t i = n; i > 1; i--) {
		size_t j = (size_t)(rng_next(r) % i), t = v[i - 1];
		v[i - 1] = v[j];
		v[j] = t;
	}
}

/* ---- content patterns ---------------------------------------------------
 * Object `id` holds its 8-byte id first, then a fill byte derived from the
 * id (never 0, so memory that was handed back and zeroed does not match). */
static inline uint8_t pat_tag(uint64_t id)
{
	return (uint8_t)(((id * 0x9e3779b97f4a7c15ull) >> 56) | 1);
}

static inline uint8_t pat_byte(uint64_t id, size_t i)
{
	return i < 8 ? (uint8_t)(id >> (8 * i)) : pat_tag(id);
}

/* Writes the pattern of object id into bytes [from, to) of p. */
static inline void pat_fill(void *p, size_t from, size_t to, uint64_t id)
{
	uint8_t *b = p;
	for (; from < to && from < 8; from++)
		b[from] = pat_byte(id, from);
	if (from < to)
		memset(b + from, pat_tag(id), to - from);
}

/* Returns the offset of the first byte of [0, len) that is not object id's
 * pattern, or -1 if all match. */
static inline long pat_find_bad(const void *p, size_t len, uint64_t id)
{
	const uint8_t *b = p;
	size_t i = 0;
	for (; i < len && i < 8; i++)
		if (b[i] != pat_byte(id, i))
			return (long)i;
	uint64_t word = 0x0101010101010101ull * pat_tag(id);
	for (; i + 8 <= len; i += 8) {
		uint64_t w;
		memcpy(&w, b + i, 8);
		if (w != word)
			break;
	}
	for (; i < len; i++)
		if (b[i] != pat_tag(id))
			return (long)i;
	return -1;
}

/* CHECKs that p holds object id's pattern over len bytes. */
#define CHECK_PATTERN(p, len, id)                                                                       \
	do {                                                                                            \
		const uint8_t *p_ = (const uint8_t *)(p);                                               \
		uint64_t id_ = (id);                                                                    \
		long bad_ = pat_find_bad(p_, (len), id_);                                               \
		CHECK_MSG(bad_ < 0, "object %" PRIu64 " at %p: byte %ld is 0x%02x, expected 0x%02x", id_, \
			  (const void *)p_, bad_, bad_ < 0 ? 0 : p_[bad_],                              \
			  bad_ < 0 ? 0 : pat_byte(id_, (size_t)bad_));                                   \
	} while (0)

#endif
