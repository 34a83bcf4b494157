/* test_hugepages - rk_hugepages_step, the policy that keeps an arena in
 * 2 MiB pages from an app's loop.
 *
 * 1. An arena never stepped says so; bad arguments are refused.
 * 2. The top pass, called after each allocation as a loop would: objects
 *    written between the calls keep every byte, the ranges the heap grew
 *    by are collapsed and mapped with huge pages.  Where the kernel refuses
 *    a collapse of shmem ("deny"), the state is refused, with EINVAL.
 * 3. The rescan: a large free gives its pages back to the kernel, which
 *    splits the huge pages under it; once objects fill the hole again, the
 *    rescan collapses those ranges anew. */
#include "testlib.h"

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

/* The top pass until it has nothing more to do now, as a loop would. */
static void grow_steps(rk_arena *a)
{
	for (int i = 0; i < 1000 && rk_hugepages_step(a, RK_HUGEPAGES_GROW) > 0; i++)
		;
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
	CHECK_EQ_INT(rk_hugepages_step(NULL, RK_HUGEPAGES_GROW), -EINVAL);
	CHECK_EQ_INT(rk_hugepages_step(a, (enum rk_hugepages_pass)7), -EINVAL);
}

static rk_arena *kept;
static uint8_t *obj[NOBJ];

static void top_pass(void)
{
	rk_arena *a = kept = test_arena("kept", 256u << 20);
	for (unsigned i = 0; i < NOBJ; i++) {
		obj[i] = rk_alloc(a, OBJ_BYTES);
		CHECK(obj[i] != NULL);
		if (obj[i])
			pat_fill(obj[i], 0, OBJ_BYTES, i);
		grow_steps(a);
	}
	struct rk_hugepages_status st;
	CHECK_EQ_INT(rk_hugepages_status(a, &st), 0);
	if (shmem_huge_denied()) {
		CHECK_EQ_INT(st.state, RK_HUGEPAGES_REFUSED);
		CHECK_EQ_INT(st.error, EINVAL);
	} else {
		CHECK_EQ_INT(st.state, RK_HUGEPAGES_ON);
		CHECK(st.bytes >= 14u << 20);
		CHECK(pmd_mapped_kb(obj[0]) >= 14u << 10);
	}
	for (unsigned i = 0; i < NOBJ; i++)
		if (obj[i])
			CHECK_PATTERN(obj[i], OBJ_BYTES, i);
	char why[256];
	CHECK_EQ_INT(validate(a, why, sizeof why), 0);
}

static void rescan_pass(void)
{
	if (shmem_huge_denied())
		return;
	rk_arena *a = kept;
	if (!obj[NOBJ - 1])
		return;
	uint64_t before = pmd_mapped_kb(obj[0]);
	/* 8 MiB from the middle: its pages go back to the kernel */
	uint8_t *hole = obj[16];
	for (unsigned i = 16; i < 48; i++)
		rk_free(a, obj[i]);
	CHECK(pmd_mapped_kb(obj[0]) <= before - (4u << 10));
	uint8_t *again = rk_alloc(a, 32 * OBJ_BYTES);
	CHECK_PTR_EQ(again, hole);
	if (again)
		pat_fill(again, 0, 32 * OBJ_BYTES, 99);
	struct rk_hugepages_status st0, st;
	rk_hugepages_status(a, &st0);
	for (int i = 0; i < 64; i++) /* a range a call, then from the start again */
		CHECK(rk_hugepages_step(a, RK_HUGEPAGES_RESCAN) >= 0);
	rk_hugepages_status(a, &st);
	CHECK(st.bytes >= st0.bytes + (6u << 20));
	CHECK(pmd_mapped_kb(obj[0]) >= before - (2u << 10));
	if (again)
		CHECK_PATTERN(again, 32 * OBJ_BYTES, 99);
	for (unsigned i = 0; i < 16; i++)
		CHECK_PATTERN(obj[i], OBJ_BYTES, i);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_hugepages");
	RUN(not_kept);
	RUN(top_pass);
	RUN(rescan_pass);
	return check_done();
}
