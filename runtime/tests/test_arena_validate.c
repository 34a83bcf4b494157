/* test_arena_validate - the checks a restarted process runs on an inherited
 * arena (rk_arena_validate) refuse every kind of damage with a reason that
 * names it: header fields, checksums, roots, layout, a lock left held by a
 * thread that died, and corrupt thread-cache lists.  Each case damages a
 * live arena, checks the refusal, repairs the damage and checks that the
 * arena is accepted again, so later cases start from a sound arena. */
#include "testlib.h"

#include <stddef.h>

static rk_arena *arena;
static char why[256];

/* A few objects, a root, and blocks in this thread's cache. */
static void populate(void)
{
	void *keep[64];
	for (unsigned i = 0; i < 64; i++)
		keep[i] = rk_alloc(arena, 16 + 48 * i);
	for (unsigned i = 0; i < 64; i += 2)
		rk_free(arena, keep[i]);
	rk_root_set(arena, "table", keep[1]);
	void *large = rk_alloc(arena, 200000);
	rk_root_set(arena, "big", large);
}

static void expect_accepted(int line)
{
	int r = validate(arena, why, sizeof why);
	check_report(r == 0, __FILE__, line, "arena refused: %d \"%s\"", r, why);
}

/* Validates expecting refusal rc with a reason containing `reason`. */
static void expect_refused(int line, const char *what, int rc, const char *reason)
{
	int r = validate(arena, why, sizeof why);
	check_report(r == rc, __FILE__, line, "%s: rk_arena_validate = %d, expected %d (\"%s\")", what, r, rc, why);
	check_report(strstr(why, reason) != NULL, __FILE__, line, "%s: reason \"%s\" lacks \"%s\"", what, why, reason);
	check_report(strstr(why, "arena hdrtest") != NULL, __FILE__, line, "%s: reason \"%s\" does not name the arena",
		     what, why);
}

/* Flips bits of one header byte, validates, and puts the byte back. */
static void flip_header_byte(int line, const char *what, size_t offset, int rc, const char *reason)
{
	uint8_t *b = (uint8_t *)arena->hdr + offset;
	*b ^= 0x5a;
	expect_refused(line, what, rc, reason);
	*b ^= 0x5a;
	expect_accepted(line);
}

#define FLIP(field, rc, reason) \
	flip_header_byte(__LINE__, #field, offsetof(struct rk_arena_hdr, field), rc, reason)

static void sound_arena_accepted(void)
{
	expect_accepted(__LINE__);
	CHECK_EQ(strlen(why), 0);
}

static void header_damage_refused(void)
{
	FLIP(magic, -EINVAL, "bad magic");
	FLIP(version, -EINVAL, "version or layout");
	FLIP(page_size, -EINVAL, "version or layout");
	FLIP(layout, -EINVAL, "version or layout");
	/* fields only the header checksum covers */
	FLIP(base, -EINVAL, "header checksum");
	FLIP(max_bytes, -EINVAL, "header checksum");
	FLIP(map_offset, -EINVAL, "header checksum");
	FLIP(heap_offset, -EINVAL, "header checksum");
	FLIP(created_ns, -EINVAL, "header checksum");
	FLIP(name[3], -EINVAL, "header checksum");
	FLIP(hdr_checksum, -EINVAL, "header checksum");
	/* the heap must fit the memfd */
	FLIP(committed, -EINVAL, "heap bounds");
	uint64_t top = arena->hdr->top;
	arena->hdr->top = arena->hdr->committed; /* past the memfd's end */
	expect_refused(__LINE__, "top", -EINVAL, "heap bounds");
	arena->hdr->top = top;
	expect_accepted(__LINE__);
}

static void roots_damage_refused(void)
{
	CHECK(rk_root_get(arena, "table") != NULL);
	FLIP(roots[0].name[1], -EINVAL, "roots checksum");
	FLIP(roots[1].ptr, -EINVAL, "roots checksum");
	FLIP(roots[40].name[0], -EINVAL, "roots checksum"); /* an empty slot counts too */
	FLIP(roots_checksum, -EINVAL, "roots checksum");
}

static void manifest_mismatch_refused(void)
{
	const struct rk_arena_hdr *h = arena->hdr;
	int r = rk_arena_validate(arena, h->base + (1ull << 30), h->max_bytes, why, sizeof why);
	CHECK_EQ_INT(r, -EINVAL);
	CHECK_STR_HAS(why, "does not match the manifest");
	r = rk_arena_validate(arena, h->base, h->max_bytes * 2, why, sizeof why);
	CHECK_EQ_INT(r, -EINVAL);
	CHECK_STR_HAS(why, "does not match the manifest");
	/* the process-side name is the manifest's */
	arena->name[0] = 'H';
	r = validate(arena, why, sizeof why);
	CHECK_EQ_INT(r, -EINVAL);
	CHECK_STR_HAS(why, "does not match the manifest");
	arena->name[0] = 'h';
	/* no memfd to look at */
	int fd = arena->fd;
	arena->fd = -1;
	CHECK_EQ_INT(validate(arena, why, sizeof why), -EIO);
	CHECK_STR_HAS(why, "cannot stat");
	arena->fd = fd;
	expect_accepted(__LINE__);
}

/* A lock word holding a tid: a thread died inside the allocator. */
static void held_lock(int line, const char *what, rk_lock *lock)
{
	const uint32_t dead_tid = 4242421;
	atomic_store(lock, dead_tid);
	expect_refused(line, what, -EBUSY, "died inside the allocator holding a lock");
	check_report(strstr(why, "4242421") != NULL, __FILE__, line, "%s: reason \"%s\" lacks the tid", what, why);
	atomic_store(lock, 0);
	expect_accepted(line);
}

static void held_locks_refused(void)
{
	struct rk_arena_hdr *h = arena->hdr;
	held_lock(__LINE__, "heap_lock", &h->heap_lock);
	held_lock(__LINE__, "root_lock", &h->root_lock);
	held_lock(__LINE__, "classes[0].lock", &h->classes[0].lock);
	held_lock(__LINE__, "classes[23].lock", &h->classes[23].lock);
	held_lock(__LINE__, "classes[39].lock", &h->classes[RK_NCLASSES - 1].lock);
}

/* This thread's cache and a class whose bin holds at least two blocks. */
static struct rk_tcache_bin *busy_bin(unsigned *cls)
{
	struct rk_tcache *tc = rk_tcache_current(arena);
	for (unsigned c = 0; tc && c < RK_NCLASSES; c++)
		if (tc->bins[c].head && tc->bins[c].head->next) {
			*cls = c;
			return &tc->bins[c];
		}
	return NULL;
}

static void corrupt_head(int line, const char *what, struct rk_tcache_bin *bin, void *bad)
{
	struct rk_free_block *head = bin->head;
	bin->head = bad;
	expect_refused(line, what, -EINVAL, "thread cache list is corrupt");
	bin->head = head;
	expect_accepted(line);
}

static void corrupt_thread_cache_refused(void)
{
	unsigned cls = 0;
	struct rk_tcache_bin *bin = busy_bin(&cls);
	if (!CHECK(bin != NULL))
		return;
	int on_stack;
	uint8_t *other_class = rk_alloc(arena, rk_class_size[cls] + 1);
	uint8_t *large = rk_root_get(arena, "big");
	char *heap_end = (char *)arena->hdr + arena->hdr->heap_offset + arena->hdr->top;
	corrupt_head(__LINE__, "stack address", bin, &on_stack);
	corrupt_head(__LINE__, "object of another class", bin, other_class);
	corrupt_head(__LINE__, "page run", bin, large);
	corrupt_head(__LINE__, "misaligned", bin, (char *)bin->head + 8);
	corrupt_head(__LINE__, "past the heap", bin, heap_end);
	corrupt_head(__LINE__, "arena header", bin, arena->hdr);

	/* a cycle: the list never ends */
	struct rk_free_block *last = bin->head;
	while (last->next)
		last = last->next;
	last->next = bin->head;
	expect_refused(__LINE__, "cycle", -EINVAL, "thread cache list is corrupt");
	last->next = NULL;
	expect_accepted(__LINE__);

	/* a bad link further down, not at the head */
	struct rk_free_block *second = bin->head->next;
	bin->head->next = (struct rk_free_block *)&on_stack;
	expect_refused(__LINE__, "second link", -EINVAL, "thread cache list is corrupt");
	bin->head->next = second;
	expect_accepted(__LINE__);
	rk_free(arena, other_class);
}

/* A cache left by a thread of the dead incarnation is checked too. */
static void dead_threads_cache_checked(void)
{
	struct rk_tcache *mine = rk_tcache_current(arena), *dead = NULL;
	for (unsigned i = 0; i < RK_MAX_TCACHES && !dead; i++)
		if (&arena->hdr->tcaches[i] != mine && atomic_load(&arena->hdr->tcaches[i].owner) == 0)
			dead = &arena->hdr->tcaches[i];
	if (!CHECK(dead != NULL))
		return;
	uint64_t junk = 0;
	atomic_store(&dead->owner, 777777);
	dead->bins[5].head = (struct rk_free_block *)&junk;
	expect_refused(__LINE__, "dead thread's cache", -EINVAL, "thread cache list is corrupt");
	dead->bins[5].head = NULL;
	expect_accepted(__LINE__); /* an owned but sound cache is fine */
	atomic_store(&dead->owner, 0);
	expect_accepted(__LINE__);
}

/* After all the repairs the arena still works and still validates. */
static void arena_still_usable(void)
{
	uint64_t before = allocated_bytes(arena);
	uint8_t *p[100];
	for (unsigned i = 0; i < 100; i++) {
		p[i] = rk_alloc(arena, 8 + 97 * i);
		pat_fill(p[i], 0, 8 + 97 * i, i);
	}
	unsigned bad = 0;
	for (unsigned i = 0; i < 100; i++) {
		bad += pat_find_bad(p[i], 8 + 97 * i, i) >= 0;
		rk_free(arena, p[i]);
	}
	CHECK_EQ(bad, 0);
	CHECK_EQ(allocated_bytes(arena), before);
	CHECK(rk_root_get(arena, "table") != NULL);
	expect_accepted(__LINE__);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_arena_validate");
	arena = test_arena("hdrtest", 64u << 20);
	populate();
	RUN(sound_arena_accepted);
	RUN(header_damage_refused);
	RUN(roots_damage_refused);
	RUN(manifest_mismatch_refused);
	RUN(held_locks_refused);
	RUN(corrupt_thread_cache_refused);
	RUN(dead_threads_cache_checked);
	RUN(arena_still_usable);
	return check_done();
}
