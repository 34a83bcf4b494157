/* test_roots - named roots: set, get, replace, remove, the name and pointer
 * checks, the 64-root limit, and the roots checksum a restart verifies. */
#include "testlib.h"

static rk_arena *arena;

/* Slots of the arena's root table in use. */
static unsigned roots_used(void)
{
	unsigned n = 0;
	for (unsigned i = 0; i < RK_MAX_ROOTS; i++)
		n += arena->hdr->roots[i].name[0] != 0;
	return n;
}

/* The roots checksum must follow every change, or a restart goes cold. */
static void check_checksum(int line)
{
	char why[192];
	int r = validate(arena, why, sizeof why);
	check_report(r == 0, __FILE__, line, "arena refused after a root change: %d \"%s\"", r, why);
}

static void set_get_replace_remove(void)
{
	void *p = rk_alloc(arena, 100), *q = rk_alloc(arena, 100000);
	CHECK_PTR_EQ(rk_root_get(arena, "alpha"), NULL);
	CHECK_EQ_INT(rk_root_set(arena, "alpha", p), 0);
	CHECK_PTR_EQ(rk_root_get(arena, "alpha"), p);
	CHECK_EQ(roots_used(), 1);
	check_checksum(__LINE__);

	CHECK_EQ_INT(rk_root_set(arena, "alpha", q), 0); /* replace in place */
	CHECK_PTR_EQ(rk_root_get(arena, "alpha"), q);
	CHECK_EQ(roots_used(), 1);
	check_checksum(__LINE__);

	CHECK_EQ_INT(rk_root_set(arena, "beta", p), 0);
	CHECK_PTR_EQ(rk_root_get(arena, "beta"), p);
	CHECK_PTR_EQ(rk_root_get(arena, "alpha"), q);
	CHECK_PTR_EQ(rk_root_get(arena, "alph"), NULL); /* whole names only */
	CHECK_PTR_EQ(rk_root_get(arena, "alphaa"), NULL);

	CHECK_EQ_INT(rk_root_set(arena, "alpha", NULL), 0); /* remove */
	CHECK_PTR_EQ(rk_root_get(arena, "alpha"), NULL);
	CHECK_PTR_EQ(rk_root_get(arena, "beta"), p);
	CHECK_EQ(roots_used(), 1);
	check_checksum(__LINE__);
	CHECK_EQ_INT(rk_root_set(arena, "alpha", NULL), 0); /* removing twice is fine */
	CHECK_EQ_INT(rk_root_set(arena, "never-set", NULL), 0);

	/* any address inside the arena may be a root, not only object starts */
	CHECK_EQ_INT(rk_root_set(arena, "interior", (char *)q + 12345), 0);
	CHECK_PTR_EQ(rk_root_get(arena, "interior"), (char *)q + 12345);

	CHECK_EQ_INT(rk_root_set(arena, "beta", NULL), 0);
	CHECK_EQ_INT(rk_root_set(arena, "interior", NULL), 0);
	CHECK_EQ(roots_used(), 0);
	check_checksum(__LINE__);
	rk_free(arena, p);
	rk_free(arena, q);
}

static void bad_names_refused(void)
{
	void *p = rk_alloc(arena, 16);
	char longest[RK_NAME_MAX + 1], too_long[RK_NAME_MAX + 2];
	memset(longest, 'n', RK_NAME_MAX);
	longest[RK_NAME_MAX] = 0;
	memset(too_long, 'n', RK_NAME_MAX + 1);
	too_long[RK_NAME_MAX + 1] = 0;

	CHECK_EQ_INT(rk_root_set(arena, "", p), -EINVAL);
	CHECK_EQ_INT(rk_root_set(arena, NULL, p), -EINVAL);
	CHECK_EQ_INT(rk_root_set(arena, too_long, p), -EINVAL);
	CHECK_EQ_INT(rk_root_set(arena, too_long, NULL), -EINVAL);
	CHECK_EQ_INT(rk_root_set(NULL, "x", p), -EINVAL);
	CHECK_EQ(roots_used(), 0);

	CHECK_EQ_INT(rk_root_set(arena, longest, p), 0); /* 47 characters fit */
	CHECK_PTR_EQ(rk_root_get(arena, longest), p);
	/* a longer name must not match on its first 47 characters */
	CHECK_PTR_EQ(rk_root_get(arena, too_long), NULL);
	CHECK_PTR_EQ(rk_root_get(arena, ""), NULL);
	CHECK_PTR_EQ(rk_root_get(arena, NULL), NULL);
	CHECK_PTR_EQ(rk_root_get(NULL, longest), NULL);
	CHECK_EQ_INT(rk_root_set(arena, longest, NULL), 0);
	CHECK_EQ(roots_used(), 0);
	rk_free(arena, p);
}

static void pointers_outside_refused(void)
{
	rk_arena *other = test_arena("roots-other", 8u << 20);
	void *elsewhere = rk_alloc(other, 64), *from_malloc = malloc(16);
	int on_stack;
	struct rk_arena_stats st;
	rk_arena_stats(arena, &st);
	CHECK_EQ_INT(rk_root_set(arena, "r", &on_stack), -EFAULT);
	CHECK_EQ_INT(rk_root_set(arena, "r", from_malloc), -EFAULT);
	CHECK_EQ_INT(rk_root_set(arena, "r", elsewhere), -EFAULT); /* a root lives in its own arena */
	CHECK_EQ_INT(rk_root_set(arena, "r", (char *)(uintptr_t)st.base - 1), -EFAULT);
	CHECK_EQ_INT(rk_root_set(arena, "r", (char *)(uintptr_t)(st.base + st.max_bytes)), -EFAULT);
	CHECK_EQ(roots_used(), 0);
	/* the last byte of the reservation is inside */
	CHECK_EQ_INT(rk_root_set(arena, "r", (char *)(uintptr_t)(st.base + st.max_bytes - 1)), 0);
	/* a refused replacement keeps the old value */
	CHECK_EQ_INT(rk_root_set(arena, "r", &on_stack), -EFAULT);
	CHECK_PTR_EQ(rk_root_get(arena, "r"), (char *)(uintptr_t)(st.base + st.max_bytes - 1));
	CHECK_EQ_INT(rk_root_set(arena, "r", NULL), 0);
	free(from_malloc);
}

static void sixty_four_roots_at_most(void)
{
	enum { N = RK_MAX_ROOTS };
	void *obj[N + 1];
	char name[16];
	for (unsigned i = 0; i <= N; i++)
		obj[i] = rk_alloc(arena, 32);
	unsigned failed = 0;
	for (unsigned i = 0; i < N; i++) {
		snprintf(name, sizeof name, "root%02u", i);
		failed += rk_root_set(arena, name, obj[i]) != 0;
	}
	CHECK_EQ(failed, 0);
	CHECK_EQ(roots_used(), N);
	CHECK_EQ_INT(rk_root_set(arena, "root64", obj[N]), -ENOSPC);
	CHECK_PTR_EQ(rk_root_get(arena, "root64"), NULL);
	CHECK_EQ_INT(rk_root_set(arena, "root64", NULL), 0); /* removing a missing one needs no slot */
	unsigned wrong = 0;
	for (unsigned i = 0; i < N; i++) {
		snprintf(name, sizeof name, "root%02u", i);
		wrong += rk_root_get(arena, name) != obj[i];
	}
	CHECK_EQ(wrong, 0);
	/* replacing needs no new slot, even when full */
	CHECK_EQ_INT(rk_root_set(arena, "root10", obj[N]), 0);
	CHECK_PTR_EQ(rk_root_get(arena, "root10"), obj[N]);
	/* a removal frees a slot for a new name */
	CHECK_EQ_INT(rk_root_set(arena, "root20", NULL), 0);
	CHECK_EQ_INT(rk_root_set(arena, "root64", obj[N]), 0);
	CHECK_PTR_EQ(rk_root_get(arena, "root64"), obj[N]);
	CHECK_PTR_EQ(rk_root_get(arena, "root20"), NULL);
	CHECK_EQ_INT(rk_root_set(arena, "root20", obj[20]), -ENOSPC);
	CHECK_EQ(roots_used(), N);
	check_checksum(__LINE__);
	for (unsigned i = 0; i <= N; i++) {
		snprintf(name, sizeof name, "root%02u", i);
		rk_root_set(arena, name, NULL);
		rk_free(arena, obj[i]);
	}
	CHECK_EQ(roots_used(), 0);
	check_checksum(__LINE__);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_roots");
	arena = test_arena("roots", 16u << 20);
	RUN(set_get_replace_remove);
	RUN(bad_names_refused);
	RUN(pointers_outside_refused);
	RUN(sixty_four_roots_at_most);
	return check_done();
}
