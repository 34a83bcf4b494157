/* test_large_runs - the page-run allocator behind large objects: freed runs
 * merge with free neighbours whatever the order of the frees, a run at the
 * heap top lowers the top, and a big free run is split for smaller ones. */
#include "testlib.h"

#define NRUNS 24

static rk_arena *arena;

static size_t run_pages(unsigned i)
{
	return 9 + (i * 7) % 23; /* 36 KiB .. 124 KiB: all above RK_SMALL_MAX */
}

static void scattered_frees_coalesce(void)
{
	uint8_t *obj[NRUNS];
	size_t total = 0;
	uint64_t heap0 = heap_bytes(arena);
	for (unsigned i = 0; i < NRUNS; i++) {
		obj[i] = rk_alloc(arena, run_pages(i) * RK_PAGE);
		total += run_pages(i) * RK_PAGE;
	}
	uint8_t *fence = rk_alloc(arena, 64 << 10); /* keeps the runs off the heap top */
	pat_fill(fence, 0, 64 << 10, 99);
	/* precondition: a fresh heap hands the runs out back to back */
	unsigned gaps = 0;
	for (unsigned i = 0; i + 1 < NRUNS; i++)
		gaps += obj[i + 1] != obj[i] + run_pages(i) * RK_PAGE;
	CHECK_EQ(gaps, 0);
	CHECK_PTR_EQ(fence, obj[NRUNS - 1] + run_pages(NRUNS - 1) * RK_PAGE);
	uint64_t top = heap_bytes(arena);
	CHECK_EQ(top, heap0 + total + (64 << 10));

	size_t order[NRUNS];
	for (unsigned i = 0; i < NRUNS; i++)
		order[i] = i;
	struct rng r = {0xc0a1e5ce};
	rng_shuffle(&r, order, NRUNS);
	for (unsigned i = 0; i < NRUNS; i++)
		rk_free(arena, obj[order[i]]);
	CHECK_EQ(heap_bytes(arena), top);

	/* one request for the sum fits exactly where they were */
	uint8_t *big = rk_alloc(arena, total);
	CHECK_PTR_EQ(big, obj[0]);
	CHECK_EQ(heap_bytes(arena), top);
	CHECK_EQ(rk_usable_size(arena, big), total);
	if (big)
		pat_fill(big, 0, total, 98);
	CHECK_PATTERN(fence, 64 << 10, 99);

	/* freeing the fence last merges all into the top, which falls back */
	rk_free(arena, big);
	CHECK_EQ(heap_bytes(arena), top);
	rk_free(arena, fence);
	CHECK_EQ(heap_bytes(arena), heap0);
	CHECK_EQ(allocated_bytes(arena), 0);
}

/* Frees every other run, then the rest: each free must merge on both sides. */
static void alternate_frees_coalesce(void)
{
	uint8_t *obj[NRUNS];
	size_t total = 0;
	for (unsigned i = 0; i < NRUNS; i++) {
		obj[i] = rk_alloc(arena, 10 * RK_PAGE);
		total += 10 * RK_PAGE;
	}
	uint8_t *fence = rk_alloc(arena, 10 * RK_PAGE);
	uint64_t top = heap_bytes(arena);
	for (unsigned i = 0; i < NRUNS; i += 2)
		rk_free(arena, obj[i]);
	/* the holes are separate: twice the size does not fit in them */
	uint8_t *twice = rk_alloc(arena, 20 * RK_PAGE);
	CHECK_PTR_EQ(twice, fence + 10 * RK_PAGE);
	CHECK_EQ(heap_bytes(arena), top + 20 * RK_PAGE);
	rk_free(arena, twice); /* at the top: the top falls back */
	CHECK_EQ(heap_bytes(arena), top);
	for (unsigned i = 1; i < NRUNS; i += 2)
		rk_free(arena, obj[i]);
	uint8_t *big = rk_alloc(arena, total);
	CHECK_PTR_EQ(big, obj[0]);
	CHECK_EQ(heap_bytes(arena), top);
	rk_free(arena, big);
	rk_free(arena, fence);
	CHECK_EQ(heap_bytes(arena), 0);
}

/* A big free run serves smaller requests from its start, then its rest. */
static void free_run_is_split(void)
{
	uint8_t *run = rk_alloc(arena, 1 << 20);
	uint8_t *fence = rk_alloc(arena, 40 << 10);
	uint64_t top = heap_bytes(arena);
	rk_free(arena, run);
	uint8_t *a = rk_alloc(arena, 256 << 10), *b = rk_alloc(arena, 512 << 10), *c = rk_alloc(arena, 256 << 10);
	CHECK_PTR_EQ(a, run);
	CHECK_PTR_EQ(b, run + (256 << 10));
	CHECK_PTR_EQ(c, run + (768 << 10));
	CHECK_EQ(heap_bytes(arena), top);
	/* pieces are independent objects */
	pat_fill(a, 0, 256 << 10, 1);
	pat_fill(b, 0, 512 << 10, 2);
	pat_fill(c, 0, 256 << 10, 3);
	rk_free(arena, b);
	CHECK_PATTERN(a, 256 << 10, 1);
	CHECK_PATTERN(c, 256 << 10, 3);
	CHECK_EQ(rk_usable_size(arena, b), 0);
	rk_free(arena, a);
	rk_free(arena, c);
	rk_free(arena, fence);
	CHECK_EQ(heap_bytes(arena), 0);
	CHECK_EQ(allocated_bytes(arena), 0);
	char why[192];
	CHECK_EQ_INT(validate(arena, why, sizeof why), 0);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_large_runs");
	/* only page runs in this arena: nothing else moves the heap top */
	arena = test_arena("runs", 256u << 20);
	RUN(scattered_frees_coalesce);
	RUN(alternate_frees_coalesce);
	RUN(free_run_is_split);
	return check_done();
}
