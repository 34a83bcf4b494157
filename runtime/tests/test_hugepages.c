/* test_hugepages - rk_hugepages_keep, the runtime's thread that keeps an
 * arena in 2 MiB pages off the app's threads.
 *
 * 1. An arena nobody keeps says so; bad arguments are refused.
 * 2. Kept: objects allocated and written while the thread collapses the
 *    ranges under them keep every byte, the thread collapses what the heap
 *    grew by (the allocator wakes it), and the arena is then mapped with
 *    huge pages; a second keep of the same arena is refused.  Where the
 *    kernel refuses a collapse of shmem ("deny"), the thread says refused,
 *    with EINVAL. */
#include "testlib.h"

#include <pthread.h>
#include <unistd.h>

#define OBJ_BYTES (256u << 10)
#define NOBJ 64 /* 16 MiB: eight ranges */

static bool shmem_huge_denied(void)
{
	char buf[256] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
	if (!f)
		return true; /* no THP at all */
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	return strstr(buf, "[deny]") != NULL;
}

/* kB of the mapping at addr mapped by PMDs (smaps' ShmemPmdMapped). */
static uint64_t pmd_mapped_kb(const void *addr)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	if (!f)
		return 0;
	char line[512];
	bool in = false;
	uint64_t kb = 0;
	while (fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
			continue;
		}
		if (in && sscanf(line, "ShmemPmdMapped: %" SCNu64, &kb) == 1)
			break;
	}
	fclose(f);
	return kb;
}

static struct rk_hugepages_status wait_status(rk_arena *a, uint64_t bytes)
{
	struct rk_hugepages_status st = {0};
	for (int i = 0; i < 500; i++) { /* 5 s */
		rk_hugepages_status(a, &st);
		if (st.state == RK_HUGEPAGES_REFUSED || st.bytes >= bytes)
			break;
		usleep(10000);
	}
	return st;
}

static void not_kept(void)
{
	rk_arena *a = test_arena("plain", 64u << 20);
	struct rk_hugepages_status st = {.state = RK_HUGEPAGES_ON, .bytes = 1};
	CHECK_EQ_INT(rk_hugepages_status(a, &st), 0);
	CHECK_EQ_INT(st.state, RK_HUGEPAGES_NOT_KEPT);
	CHECK_EQ(st.bytes, 0);
	CHECK_EQ_INT(rk_hugepages_status(NULL, &st), -EINVAL);
	CHECK_EQ_INT(rk_hugepages_status(a, NULL), -EINVAL);
	CHECK_EQ_INT(rk_hugepages_keep(NULL), -EINVAL);
}

static void kept_while_written(void)
{
	rk_arena *a = test_arena("kept", 256u << 20);
	CHECK_EQ_INT(rk_hugepages_keep(a), 0);
	CHECK_EQ_INT(rk_hugepages_keep(a), -EALREADY);
	uint8_t *obj[NOBJ];
	for (unsigned i = 0; i < NOBJ; i++) {
		obj[i] = rk_alloc(a, OBJ_BYTES);
		CHECK(obj[i] != NULL);
		if (obj[i]) /* written as the thread collapses the range it is in */
			pat_fill(obj[i], 0, OBJ_BYTES, i);
	}
	struct rk_hugepages_status st = wait_status(a, 12u << 20);
	if (shmem_huge_denied()) {
		CHECK_EQ_INT(st.state, RK_HUGEPAGES_REFUSED);
		CHECK_EQ_INT(st.error, EINVAL);
	} else {
		CHECK_EQ_INT(st.state, RK_HUGEPAGES_ON);
		CHECK(st.bytes >= 12u << 20);
		CHECK(pmd_mapped_kb(obj[0]) >= 8u << 10); /* a range the app touched as it was collapsed may stay mapped small */
	}
	for (unsigned i = 0; i < NOBJ; i++)
		if (obj[i])
			CHECK_PATTERN(obj[i], OBJ_BYTES, i);
	char why[256];
	CHECK_EQ_INT(validate(a, why, sizeof why), 0);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_hugepages");
	RUN(not_kept);
	RUN(kept_while_written);
	return check_done();
}
