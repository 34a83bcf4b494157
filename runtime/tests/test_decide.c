/* test_decide - the runtime's warm/cold decider (decide.c).
 *
 * 1. Every case of tests/contract/decisions.tsv, the table the supervisor's
 *    decider (supervisor/src/decide.rs) runs too: same mode, same reason
 *    code, same arenas dropped.
 * 2. The facts only the runtime has: a fault inside the runtime, the arena
 *    list being rewritten, the failure hook, a repeated fault, a hot switch,
 *    and the first, cheap pass made before the regions are known. */
#include "check.h"
#include "rk_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_NAMES 8

struct names {
	char v[MAX_NAMES][32];
	unsigned n;
};

/* Splits a comma list ("-" is empty); a trailing '*' is kept in the name. */
static void split(const char *s, struct names *out)
{
	out->n = 0;
	if (!strcmp(s, "-"))
		return;
	char buf[256];
	snprintf(buf, sizeof buf, "%s", s);
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && out->n < MAX_NAMES;
	     t = strtok_r(NULL, ",", &save))
		snprintf(out->v[out->n++], sizeof out->v[0], "%s", t);
}

static int arena_index(const struct names *arenas, const char *name)
{
	for (unsigned i = 0; i < arenas->n; i++)
		if (!strncmp(arenas->v[i], name, strcspn(arenas->v[i], "*")) &&
		    strlen(name) == strcspn(arenas->v[i], "*"))
			return (int)i;
	return -1;
}

static uint32_t mask_of(const struct names *arenas, const char *list)
{
	struct names l;
	uint32_t m = 0;
	split(list, &l);
	for (unsigned i = 0; i < l.n; i++) {
		int k = arena_index(arenas, l.v[i]);
		CHECK_MSG(k >= 0, "unknown arena %s in %s", l.v[i], list);
		if (k >= 0)
			m |= 1u << k;
	}
	return m;
}

static const char *table_path(void)
{
	static const char *const tries[] = {"tests/contract/decisions.tsv", "../tests/contract/decisions.tsv",
					    "../../tests/contract/decisions.tsv"};
	for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++)
		if (access(tries[i], R_OK) == 0)
			return tries[i];
	return tries[0];
}

static void shared_table(void)
{
	const char *path = table_path();
	FILE *f = fopen(path, "r");
	CHECK_MSG(f != NULL, "cannot open %s (run from the repository root)", path);
	if (!f)
		return;
	char line[1024];
	unsigned cases = 0;
	while (fgets(line, sizeof line, f)) {
		line[strcspn(line, "\r\n")] = 0;
		if (!line[0] || line[0] == '#')
			continue;
		char *col[11], *save = NULL;
		unsigned n = 0;
		for (char *t = strtok_r(line, "\t", &save); t && n < 11; t = strtok_r(NULL, "\t", &save))
			col[n++] = t;
		CHECK_MSG(n == 11, "%s: a case with %u columns", path, n);
		if (n != 11)
			continue;
		struct names arenas;
		split(col[1], &arenas);
		uint32_t independent = 0;
		for (unsigned i = 0; i < arenas.n; i++)
			if (strchr(arenas.v[i], '*'))
				independent |= 1u << i;
		bool warm_start = strcmp(col[4], "-") != 0;
		unsigned long uptime = warm_start ? strtoul(col[4], NULL, 10) : 0, window = strtoul(col[5], NULL, 10);
		struct rk_facts facts = {
			.cold_requested = !strcmp(col[2], "yes"),
			.control_damaged = !strcmp(col[3], "yes"),
			.crash_loop = warm_start && window > 0 && uptime < window,
			.repeat_owner = -1,
			.warm_disabled = !strcmp(col[6], "yes"),
			.regions_known = true,
			.unsafe_open = mask_of(&arenas, col[7]),
			.independent = independent,
		};
		struct rk_verdict v = rk_decide(&facts);
		CHECK_MSG(v.warm == !strcmp(col[8], "warm"), "%s: mode %s, want %s", col[0], v.warm ? "warm" : "cold",
			  col[8]);
		CHECK_MSG(!strcmp(rk_reason_name(v.code), col[9]), "%s: code %s, want %s", col[0],
			  rk_reason_name(v.code), col[9]);
		uint32_t want_drop = mask_of(&arenas, col[10]);
		CHECK_MSG((v.warm ? v.drop : 0) == want_drop, "%s: dropped mask %#x, want %#x", col[0], v.drop,
			  want_drop);
		cases++;
	}
	fclose(f);
	CHECK_MSG(cases >= 10, "only %u cases in %s", cases, path);
}

static struct rk_facts plain(void)
{
	return (struct rk_facts){.repeat_owner = -1, .regions_known = true};
}

static void runtime_only_facts(void)
{
	struct rk_facts f = plain();
	f.fault_in_runtime = true;
	CHECK_EQ_INT(rk_decide(&f).code, RK_REASON_FAULT_IN_RUNTIME);
	f.control_damaged = true;
	CHECK_EQ_INT(rk_decide(&f).code, RK_REASON_CONTROL_BLOCK_CORRUPT);

	f = plain();
	f.manifest_busy = true;
	f.crash_loop = true;
	CHECK_EQ_INT(rk_decide(&f).code, RK_REASON_CRASH_LOOP);
	f.crash_loop = false;
	CHECK_EQ_INT(rk_decide(&f).code, RK_REASON_MANIFEST_BUSY);

	f = plain();
	f.hook_cold = true;
	f.unsafe_open = 1;
	CHECK_EQ_INT(rk_decide(&f).code, RK_REASON_HOOK_COLD);

	f = plain();
	f.hook_drop = 2;
	f.independent = 2;
	struct rk_verdict v = rk_decide(&f);
	CHECK(v.warm && v.drop == 2 && v.code == RK_REASON_INDEPENDENT_DROPPED);

	/* a repeated fault: a dependent arena or a range goes cold, an
	 * independent arena is dropped alone (once the regions are known) */
	f = plain();
	f.repeat_owner = 0;
	v = rk_decide(&f);
	CHECK(!v.warm && v.code == RK_REASON_REPEATED_FAULT && v.arena == 0);
	f.repeat_owner = RK_MAX_ARENAS;
	v = rk_decide(&f);
	CHECK(!v.warm && v.code == RK_REASON_REPEATED_FAULT && v.arena == -1);
	f.repeat_owner = 1;
	f.independent = 2;
	v = rk_decide(&f);
	CHECK(v.warm && v.code == RK_REASON_INDEPENDENT_DROPPED && v.drop == 2 && v.arena == 1);

	/* a hot switch is not the app's failure: cheap checks do not apply,
	 * and its reason is the mismatch */
	f = plain();
	f.hot_switch = true;
	f.crash_loop = true;
	f.warm_disabled = true;
	v = rk_decide(&f);
	CHECK(v.warm && v.code == RK_REASON_CROSSCHECK_MISMATCH);
	f.control_damaged = true; /* the other arenas' regions are unknown */
	CHECK_EQ_INT(rk_decide(&f).code, RK_REASON_CONTROL_BLOCK_CORRUPT);
	f.cold_requested = true;
	CHECK_EQ_INT(rk_decide(&f).code, RK_REASON_COLD_REQUESTED);

	/* before the freeze: warm so far, whatever the regions hold */
	f = plain();
	f.regions_known = false;
	f.unsafe_open = 1;
	f.hook_cold = true;
	v = rk_decide(&f);
	CHECK(v.warm && v.code == RK_REASON_ALL_CHECKS_PASSED && v.drop == 0);
}

static void reason_names_are_stable(void)
{
	CHECK(!strcmp(rk_reason_name(RK_REASON_NONE), "none"));
	CHECK(!strcmp(rk_reason_name(RK_REASON_UNSAFE_REGION_OPEN), "unsafe_region_open"));
	CHECK(!strcmp(rk_reason_name(RK_REASON_FOREIGN_FD), "foreign_fd"));
	CHECK(!strcmp(rk_reason_name((enum rk_reason)RK_REASON_COUNT), "unknown"));
	for (int r = 0; r < RK_REASON_COUNT; r++)
		for (int q = 0; q < r; q++)
			CHECK_MSG(strcmp(rk_reason_name((enum rk_reason)r), rk_reason_name((enum rk_reason)q)),
				  "reasons %d and %d share a name", r, q);
}

int main(void)
{
	check_begin("test_decide");
	shared_table();
	runtime_only_facts();
	reason_names_are_stable();
	return check_done();
}
