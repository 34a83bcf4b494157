/* test_exhaustion - a full arena says ENOMEM, on the small-object path and
 * on the page-run path, and works again once objects are freed; requests
 * that can never fit (calloc overflow, huge sizes) are refused outright. */
#include "testlib.h"

#define ARENA_MAX (4u << 20)

/* rk_alloc that expects refusal with ENOMEM. */
#define CHECK_ENOMEM(expr)                                                                                  \
	do {                                                                                                \
		errno = 0;                                                                                  \
		void *p_ = (expr);                                                                          \
		int e_ = errno;                                                                             \
		CHECK_MSG(p_ == NULL && e_ == ENOMEM, "%s = %p, errno %d (%s): expected NULL, ENOMEM", #expr, \
			  p_, e_, strerror(e_));                                                            \
	} while (0)

/* Heap bytes the arena can ever hand out. */
static uint64_t heap_capacity(const rk_arena *a)
{
	return a->hdr->max_bytes - a->hdr->heap_offset;
}

static void small_path_exhaustion(void)
{
	rk_arena *a = test_arena("exh-small", ARENA_MAX);
	enum { SIZE = 1000, MAXN = ARENA_MAX / SIZE };
	static uint8_t *obj[MAXN];
	unsigned n = 0;
	errno = 0;
	while (n < MAXN && (obj[n] = rk_alloc(a, SIZE)) != NULL) {
		pat_fill(obj[n], 0, SIZE, n);
		n++;
	}
	CHECK_MSG(n < MAXN && errno == ENOMEM, "after %u objects: errno %d", n, errno);
	/* the arena was really full: slabs cover nearly all of the heap */
	uint64_t cap = heap_capacity(a), top = heap_bytes(a);
	CHECK_MSG(cap - top < RK_SLAB_MIN_PAGES * RK_PAGE, "heap %" PRIu64 " of %" PRIu64 " used", top, cap);
	CHECK_MSG((uint64_t)n * SIZE > cap * 85 / 100, "only %u objects of %u bytes in %" PRIu64 " bytes", n, SIZE, cap);
	CHECK_ENOMEM(rk_alloc(a, SIZE));        /* still full */
	CHECK_ENOMEM(rk_alloc(a, 64));          /* another class needs a new slab */
	CHECK_ENOMEM(rk_calloc(a, 1, 100));
	CHECK_ENOMEM(rk_alloc(a, 64 << 10));    /* no page run either */

	/* Freeing makes room for exactly as many again. */
	for (unsigned i = 10; i < 50; i++)
		rk_free(a, obj[i]);
	unsigned again = 0;
	for (unsigned i = 10; i < 50; i++)
		again += (obj[i] = rk_alloc(a, SIZE)) != NULL;
	CHECK_EQ(again, 40);
	CHECK_ENOMEM(rk_alloc(a, SIZE));
	CHECK_EQ(heap_bytes(a), top);
	unsigned bad = 0;
	for (unsigned i = 0; i < n; i++)
		bad += (i < 10 || i >= 50) && pat_find_bad(obj[i], SIZE, i) >= 0;
	CHECK_EQ(bad, 0);
	for (unsigned i = 0; i < n; i++)
		rk_free(a, obj[i]);
	CHECK_EQ(allocated_bytes(a), 0);
}

static void large_path_exhaustion(void)
{
	rk_arena *a = test_arena("exh-large", ARENA_MAX);
	const size_t SIZE = 128 << 10;
	uint8_t *obj[64];
	unsigned n = 0;
	errno = 0;
	while (n < 64 && (obj[n] = rk_alloc(a, SIZE)) != NULL) {
		pat_fill(obj[n], 0, SIZE, n);
		n++;
	}
	CHECK_EQ_INT(errno, ENOMEM);
	CHECK_EQ(n, heap_capacity(a) / SIZE); /* every run that fits was handed out */
	CHECK_ENOMEM(rk_alloc(a, SIZE));
	CHECK_ENOMEM(rk_alloc(a, 16));        /* no room for a slab */

	/* A freed run is reused, but is too small for twice the size... */
	uint8_t *hole = obj[5];
	rk_free(a, obj[5]);
	CHECK_ENOMEM(rk_alloc(a, 2 * SIZE));
	obj[5] = rk_alloc(a, SIZE);
	CHECK_PTR_EQ(obj[5], hole);
	pat_fill(obj[5], 0, SIZE, 5);
	/* ...until its neighbour is freed too. */
	uint8_t *pair = obj[10];
	rk_free(a, obj[10]);
	rk_free(a, obj[11]);
	obj[10] = rk_alloc(a, 2 * SIZE);
	CHECK_PTR_EQ(obj[10], pair);
	obj[11] = NULL;
	if (obj[10])
		pat_fill(obj[10], 0, SIZE, 10);
	/* the small path gets room once the last run goes */
	rk_free(a, obj[n - 1]);
	obj[n - 1] = NULL;
	uint8_t *s = rk_alloc(a, 16);
	CHECK(s != NULL);
	rk_free(a, s);

	unsigned bad = 0;
	for (unsigned i = 0; i < n; i++)
		bad += obj[i] && pat_find_bad(obj[i], SIZE, i) >= 0;
	CHECK_EQ(bad, 0);
	uint8_t *first = obj[0];
	for (unsigned i = 0; i < n; i++)
		rk_free(a, obj[i]);
	CHECK_EQ(allocated_bytes(a), 0);
	/* the runs below the slab (which stays, for reuse) merged into one */
	uint8_t *all = rk_alloc(a, (n - 1) * SIZE);
	CHECK_PTR_EQ(all, first);
	rk_free(a, all);
}

static void impossible_requests_refused(void)
{
	rk_arena *a = test_arena("exh-huge", ARENA_MAX);
	const size_t max = a->hdr->max_bytes;
	CHECK_ENOMEM(rk_alloc(a, SIZE_MAX));
	CHECK_ENOMEM(rk_alloc(a, SIZE_MAX - RK_PAGE + 2)); /* rounds up past zero */
	CHECK_ENOMEM(rk_alloc(a, (size_t)1 << 62));
	CHECK_ENOMEM(rk_alloc(a, max + 1));
	CHECK_ENOMEM(rk_alloc(a, max));                 /* the header takes part of it */
	CHECK_ENOMEM(rk_alloc(a, heap_capacity(a) + 1));
	/* calloc: nmemb * size overflows */
	CHECK_ENOMEM(rk_calloc(a, SIZE_MAX / 2 + 2, 2));
	CHECK_ENOMEM(rk_calloc(a, (size_t)1 << 32, (size_t)1 << 32));
	CHECK_ENOMEM(rk_calloc(a, SIZE_MAX, SIZE_MAX));
	CHECK_ENOMEM(rk_calloc(a, 3, SIZE_MAX / 3 + 1));
	CHECK_ENOMEM(rk_calloc(a, (size_t)1 << 20, 8)); /* no overflow, just too big */
	/* the largest request that fits succeeds */
	uint8_t *all = rk_alloc(a, heap_capacity(a));
	CHECK(all != NULL);
	rk_free(a, all);
	CHECK_EQ(heap_bytes(a), 0);

	uint8_t *p = rk_alloc(a, 100);
	pat_fill(p, 0, 100, 7);
	CHECK_ENOMEM(rk_realloc(a, p, SIZE_MAX));
	CHECK_ENOMEM(rk_realloc(a, p, max));
	CHECK_PATTERN(p, 100, 7); /* a refused realloc leaves the object */
	/* none of this took memory */
	CHECK_EQ(allocated_bytes(a), rk_usable_size(a, p));
	rk_free(a, p);
	CHECK_EQ(allocated_bytes(a), 0);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_exhaustion");
	RUN(small_path_exhaustion);
	RUN(large_path_exhaustion);
	RUN(impossible_requests_refused);
	return check_done();
}
