/* test_regressions - bugs the unit tests found, each kept as a minimal test
 * of the behaviour the runtime now has; each case uses an arena of its own,
 * since the bug would damage it.
 *
 * 1. rk_free must refuse an interior pointer of a small object (it used to
 *    put it on a free list; fixed in alloc.c rk_free).
 * 2. rk_realloc must refuse an interior pointer of a page run
 *    (rk_usable_size answered for any pointer into a run).
 * 3. A page run freed twice must be refused the second time, even after the
 *    first free merged it into the free run before it (the merge left the
 *    run's RK_PG_LARGE map entry, which run_of believed).
 * 4. rk_arena_validate must refuse a thread-cache block that is not an
 *    object start, as the sweep's own list check does (the restart went
 *    warm and rk_finish_recovery then failed with -EIO, or, without
 *    cleanup, rk_alloc handed out memory overlapping an object). */
#include "testlib.h"

#include <stdlib.h>

static void small_interior_free_ignored(void)
{
	rk_arena *a = test_arena("bug-interior-free", 8u << 20);
	uint8_t *p = rk_alloc(a, 64);
	pat_fill(p, 0, 64, 1);
	uint64_t before = allocated_bytes(a);
	rk_free(a, p + 16); /* not an object: must be ignored like a stack address */
	CHECK_EQ(allocated_bytes(a), before);
	uint8_t *q = rk_alloc(a, 64);
	CHECK_MSG(q + 64 <= p || q >= p + 64, "rk_alloc gave %p, inside the live object at %p", (void *)q, (void *)p);
}

static void realloc_interior_pointer_refused(void)
{
	rk_arena *a = test_arena("bug-interior-realloc", 8u << 20);
	uint8_t *run = rk_alloc(a, 100000);
	uint64_t before = allocated_bytes(a);
	errno = 0;
	void *q = rk_realloc(a, run + RK_PAGE, 10);
	CHECK_MSG(q == NULL && errno == EINVAL, "rk_realloc(run + 4096, 10) = %p, errno %d: expected NULL, EINVAL", q,
		  errno);
	CHECK_EQ(allocated_bytes(a), before);
}

static void large_double_free_after_merge_ignored(void)
{
	rk_arena *a = test_arena("bug-double-free", 8u << 20);
	const size_t n = 10 * RK_PAGE;
	uint8_t *first = rk_alloc(a, n), *second = rk_alloc(a, n), *fence = rk_alloc(a, n);
	pat_fill(fence, 0, n, 3);
	rk_free(a, first);
	rk_free(a, second); /* merges into first's free run */
	uint64_t before = allocated_bytes(a);
	rk_free(a, second); /* a double free: must be ignored */
	CHECK_EQ(allocated_bytes(a), before);
	uint8_t *x = rk_alloc(a, 2 * n), *y = rk_alloc(a, n);
	CHECK_MSG(y >= x + 2 * n || y + n <= x, "two live runs overlap: [%p,+%zu) and [%p,+%zu)", (void *)x, 2 * n,
		  (void *)y, n);
}

/* Points this thread's cache bin of class cls at bad; true if refused. */
static bool validate_refuses_head(rk_arena *a, unsigned cls, void *bad, char *why, size_t len)
{
	struct rk_tcache_bin *bin = &rk_tcache_current(a)->bins[cls];
	struct rk_free_block *head = bin->head;
	bin->head = bad;
	int r = validate(a, why, len);
	bin->head = head;
	return r == -EINVAL;
}

static void validate_refuses_non_object_blocks(void)
{
	rk_arena *a = test_arena("bug-validate", 8u << 20);
	uint8_t *p = rk_alloc(a, 64); /* fills this thread's class-64 bin from a new slab */
	unsigned cls = 0;
	while (rk_class_size[cls] != 64)
		cls++;
	char why[192];
	if (!CHECK(rk_tcache_current(a)->bins[cls].head != NULL))
		return;
	/* p + 16 is 16-byte aligned, in a slab of the right class, and its
	 * (zero) first word ends the list: only the object boundary is wrong */
	CHECK_MSG(validate_refuses_head(a, cls, p + 16, why, sizeof why),
		  "a cache block in the middle of an object accepted");
	CHECK_EQ_INT(validate(a, why, sizeof why), 0); /* repaired */
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_regressions");
	RUN(small_interior_free_ignored);
	RUN(realloc_interior_pointer_refused);
	RUN(large_double_free_after_merge_ignored);
	RUN(validate_refuses_non_object_blocks);
	return check_done();
}
