/* test_alloc_api - the allocator's single-thread contract: size classes and
 * alignment, calloc, realloc semantics, and pointers that are not objects
 * (which rk_free and rk_realloc must refuse without harm). */
#include "testlib.h"

static rk_arena *arena;

/* The smallest class that holds n bytes, from the runtime's own table. */
static size_t class_for(size_t n)
{
	for (unsigned c = 0; c < RK_NCLASSES; c++)
		if (rk_class_size[c] >= n)
			return rk_class_size[c];
	return 0;
}

static void size_classes_and_alignment(void)
{
	unsigned bad_align = 0, bad_usable = 0, bad_count = 0;
	uint64_t before = allocated_bytes(arena);
	for (size_t n = 0; n <= RK_SMALL_MAX; n += (n < 1024 ? 1 : 61)) {
		uint8_t *p = rk_alloc(arena, n);
		if (!p) {
			CHECK_MSG(false, "rk_alloc(%zu) failed: %s", n, strerror(errno));
			return;
		}
		bad_align += ((uintptr_t)p & 15) != 0;
		/* exactly the smallest class that fits: no class is skipped */
		size_t want = class_for(n ? n : 1), u = rk_usable_size(arena, p);
		if (u != want && bad_usable++ < 3)
			CHECK_MSG(false, "rk_usable_size after rk_alloc(%zu) = %zu, class %zu", n, u, want);
		/* rk_alloc_size says the same without the block */
		if (rk_alloc_size(n) != u && bad_usable++ < 3)
			CHECK_MSG(false, "rk_alloc_size(%zu) = %zu, rk_usable_size %zu", n, rk_alloc_size(n), u);
		/* allocated_bytes counts the class size, in and out */
		bad_count += allocated_bytes(arena) != before + u;
		rk_free(arena, p);
		bad_count += allocated_bytes(arena) != before;
	}
	CHECK_EQ(bad_align, 0);
	CHECK_EQ(bad_usable, 0);
	CHECK_EQ(bad_count, 0);

	/* Large objects are whole pages, page aligned. */
	const size_t large[] = {RK_SMALL_MAX + 1, 40000, 65536, 65537, 1 << 20, (3 << 20) + 5};
	for (unsigned i = 0; i < sizeof large / sizeof large[0]; i++) {
		uint8_t *p = rk_alloc(arena, large[i]);
		CHECK_MSG(p && ((uintptr_t)p & (RK_PAGE - 1)) == 0, "rk_alloc(%zu) = %p", large[i], (void *)p);
		CHECK_EQ(rk_usable_size(arena, p), RK_ALIGN_UP(large[i], RK_PAGE));
		CHECK_EQ(rk_alloc_size(large[i]), rk_usable_size(arena, p));
		CHECK_EQ(allocated_bytes(arena), before + RK_ALIGN_UP(large[i], RK_PAGE));
		rk_free(arena, p);
		CHECK_EQ(allocated_bytes(arena), before);
	}
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

static void calloc_zeroes_recycled_memory(void)
{
	const size_t sizes[] = {24, 1000, 20000, 300000};
	for (unsigned i = 0; i < 4; i++) {
		uint8_t *p = rk_alloc(arena, sizes[i]);
		memset(p, 0xa5, sizes[i]);
		rk_free(arena, p);
		uint8_t *q = rk_calloc(arena, 1, sizes[i]); /* likely the same block again */
		CHECK_MSG(q && all_zero(q, sizes[i]), "rk_calloc(1, %zu) not zeroed", sizes[i]);
		rk_free(arena, q);
	}
	uint8_t *q = rk_calloc(arena, 300, 7);
	CHECK(q && all_zero(q, 2100) && rk_usable_size(arena, q) >= 2100);
	rk_free(arena, q);
}

/* realloc from `from` to `to` bytes must keep min(from, to) bytes. */
static void realloc_keeps(size_t from, size_t to, uint64_t id)
{
	uint8_t *p = rk_alloc(arena, from);
	pat_fill(p, 0, from, id);
	uint8_t *q = rk_realloc(arena, p, to);
	if (!CHECK_MSG(q != NULL, "rk_realloc(%zu -> %zu) failed", from, to))
		return;
	CHECK_MSG(rk_usable_size(arena, q) >= to, "rk_realloc(%zu -> %zu): usable %zu", from, to,
		  rk_usable_size(arena, q));
	CHECK_PATTERN(q, from < to ? from : to, id);
	rk_free(arena, q);
}

static void realloc_semantics(void)
{
	uint64_t before = allocated_bytes(arena);
	const size_t grow[][2] = {{16, 17}, {100, 5000}, {4000, RK_SMALL_MAX}, {30000, 70000}, {70000, 3 << 20}};
	for (unsigned i = 0; i < 5; i++) {
		realloc_keeps(grow[i][0], grow[i][1], 100 + i); /* grow */
		realloc_keeps(grow[i][1], grow[i][0], 200 + i); /* shrink */
	}
	realloc_keeps(1 << 20, 24, 300); /* a page run down to a small class */
	realloc_keeps(1000, 999, 301);   /* within the class */
	CHECK_EQ(allocated_bytes(arena), before);

	/* realloc(NULL, n) allocates. */
	uint8_t *p = rk_realloc(arena, NULL, 300);
	CHECK(p != NULL && rk_usable_size(arena, p) >= 300);
	CHECK_EQ(allocated_bytes(arena), before + rk_usable_size(arena, p));

	/* realloc(p, 0) frees and returns NULL. */
	CHECK_PTR_EQ(rk_realloc(arena, p, 0), NULL);
	CHECK_EQ(allocated_bytes(arena), before);
	uint8_t *big = rk_alloc(arena, 200000);
	CHECK_PTR_EQ(rk_realloc(arena, big, 0), NULL);
	CHECK_EQ(rk_usable_size(arena, big), 0); /* the page run is free */
	CHECK_EQ(allocated_bytes(arena), before);

	/* A failed realloc leaves the object alone. */
	p = rk_alloc(arena, 500);
	pat_fill(p, 0, 500, 400);
	errno = 0;
	CHECK_PTR_EQ(rk_realloc(arena, p, (size_t)1 << 50), NULL);
	CHECK_EQ_INT(errno, ENOMEM);
	CHECK_PATTERN(p, 500, 400);
	CHECK(rk_usable_size(arena, p) >= 500);
	rk_free(arena, p);
	CHECK_EQ(allocated_bytes(arena), before);
}

/* ---- invalid pointers --------------------------------------------------- */

/* A short churn whose invariants show the allocator is still sound. */
static void churn_and_check(uint64_t seed)
{
	enum { N = 400 };
	static uint8_t *obj[N];
	static size_t size[N];
	struct rng r = {seed};
	uint64_t before = allocated_bytes(arena);
	for (unsigned i = 0; i < N; i++) {
		size[i] = i % 40 == 0 ? rng_range(&r, 40000, 300000) : rng_range(&r, 1, 2000);
		obj[i] = rk_alloc(arena, size[i]);
		pat_fill(obj[i], 0, size[i], seed + i);
	}
	unsigned bad = 0, overlap = 0;
	for (unsigned i = 0; i < N; i++) {
		bad += pat_find_bad(obj[i], size[i], seed + i) >= 0;
		for (unsigned j = 0; j < i; j++) /* usable ranges pairwise disjoint */
			overlap += obj[i] < obj[j] + size[j] && obj[j] < obj[i] + size[i];
	}
	CHECK_EQ(bad, 0);
	CHECK_EQ(overlap, 0);
	for (unsigned i = 0; i < N; i++)
		rk_free(arena, obj[i]);
	CHECK_EQ(allocated_bytes(arena), before);
	char why[192];
	int r2 = validate(arena, why, sizeof why);
	CHECK_MSG(r2 == 0, "rk_arena_validate: %d %s", r2, why);
}

static void invalid_pointers_are_ignored(void)
{
	rk_arena *other = test_arena("api-other", 64u << 20);
	const size_t large_n = 9 * RK_PAGE + 100; /* above RK_SMALL_MAX: a page run */
	uint8_t *large = rk_alloc(arena, large_n);
	uint8_t *small = rk_alloc(arena, 64);
	uint8_t *foreign = rk_alloc(other, 100000);
	pat_fill(large, 0, large_n, 500);
	pat_fill(small, 0, 64, 501);
	pat_fill(foreign, 0, 100000, 502);
	uint64_t before = allocated_bytes(arena), before_other = allocated_bytes(other), top = heap_bytes(arena);
	int on_stack = 0;
	void *from_malloc = malloc(64);

	uint8_t *heap_end = (uint8_t *)arena->hdr + arena->hdr->heap_offset + arena->hdr->top;
	void *bad[] = {
		&on_stack,             /* a stack address */
		from_malloc,           /* the process heap */
		(uint8_t *)arena->hdr, /* the arena header */
		heap_end,              /* past the heap */
		foreign,               /* another arena's object */
		large + 16,            /* inside a page run */
		large + RK_PAGE,       /* a later page of the run */
	};
	const unsigned run_interiors = 2; /* the last ones */
	for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		rk_free(arena, bad[i]);
		CHECK_MSG(allocated_bytes(arena) == before, "rk_free(bad[%u] = %p) changed allocated_bytes", i, bad[i]);
		/* rk_realloc still takes run interiors: test_known_bugs, bug 2 */
		if (i >= sizeof bad / sizeof bad[0] - run_interiors)
			continue;
		errno = 0;
		CHECK_MSG(rk_realloc(arena, bad[i], 10) == NULL && errno == EINVAL,
			  "rk_realloc(bad[%u] = %p) accepted (errno %d)", i, bad[i], errno);
	}
	CHECK_EQ(heap_bytes(arena), top);
	CHECK_EQ(rk_usable_size(arena, large), 10 * RK_PAGE); /* still allocated */
	CHECK_PATTERN(large, large_n, 500);
	CHECK_PATTERN(small, 64, 501);
	CHECK_PATTERN(foreign, 100000, 502);
	CHECK_EQ(allocated_bytes(other), before_other);
	CHECK_EQ(rk_usable_size(other, foreign), 100000 + (RK_PAGE - 100000 % RK_PAGE));
	free(from_malloc);
	rk_free(NULL, small); /* no arena: nothing happens */
	rk_free(arena, NULL); /* like free(NULL) */
	CHECK_EQ(rk_usable_size(arena, NULL), 0);
	CHECK_EQ(rk_usable_size(NULL, small), 0);
	CHECK_EQ(rk_usable_size(arena, &on_stack), 0);
	errno = 0;
	CHECK_PTR_EQ(rk_alloc(NULL, 10), NULL);
	CHECK_EQ_INT(errno, EINVAL);
	struct rk_arena_stats st;
	CHECK_EQ_INT(rk_arena_stats(NULL, &st), -EINVAL);
	CHECK_EQ_INT(rk_arena_stats(arena, NULL), -EINVAL);

	/* Freeing a page run twice: the second time is refused. */
	uint8_t *run = rk_alloc(arena, 10 * RK_PAGE);
	uint8_t *fence = rk_alloc(arena, 10 * RK_PAGE); /* keeps run off the heap top */
	rk_free(arena, run);
	uint64_t after_one = allocated_bytes(arena);
	rk_free(arena, run);
	CHECK_EQ(allocated_bytes(arena), after_one);
	uint8_t *x = rk_alloc(arena, 10 * RK_PAGE), *y = rk_alloc(arena, 10 * RK_PAGE);
	CHECK(x != y && x && y);

	rk_free(arena, x);
	rk_free(arena, y);
	rk_free(arena, fence);
	rk_free(arena, large);
	rk_free(arena, small);
	rk_free(other, foreign);
	churn_and_check(0xabc);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_alloc_api");
	arena = test_arena("api", 256u << 20);
	RUN(size_classes_and_alignment);
	RUN(calloc_zeroes_recycled_memory);
	RUN(realloc_semantics);
	RUN(invalid_pointers_are_ignored);
	return check_done();
}
