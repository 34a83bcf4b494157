/* arena.c - arenas: the address range they live in, opening them by name
 * (a new arena is a memfd formatted at the next free slot of the range; an
 * inherited one is found by name), their write protection and dropping, and
 * their headers: format, validation of an inherited arena, growth, named
 * roots.  Reattaching an inherited arena at rk_init is in recovery.c. */
#include "rk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t rk_fnv1a(const void *p, size_t n, uint64_t h)
{
	const unsigned char *c = p;
	if (h == 0)
		h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++) {
		h ^= c[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* Eight bytes per step, so about 5x faster than rk_fnv1a: the manifest is
 * checked three times per restart, on its critical path. */
uint64_t rk_hash_words(const void *p, size_t n)
{
	const unsigned char *c = p;
	uint64_t h = 0xcbf29ce484222325ull ^ n;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t w;
		memcpy(&w, c + i, 8);
		h = (h ^ w) * 0x100000001b3ull;
		h ^= h >> 29; /* the multiply only carries upward: fold the top back down */
	}
	for (; i < n; i++)
		h = (h ^ c[i]) * 0x100000001b3ull;
	return h ^ (h >> 32);
}

uint64_t rk_arena_hdr_checksum(const struct rk_arena_hdr *h)
{
	return rk_fnv1a(h, offsetof(struct rk_arena_hdr, hdr_checksum), 0);
}

uint64_t rk_arena_roots_checksum(const struct rk_arena_hdr *h)
{
	return rk_fnv1a(h->roots, sizeof h->roots, 0);
}

static uint64_t map_offset(void)
{
	return RK_ALIGN_UP(sizeof(struct rk_arena_hdr), RK_PAGE);
}

uint64_t rk_arena_heap_offset(uint64_t max)
{
	return RK_ALIGN_UP(map_offset() + (max / RK_PAGE) * 8, 65536);
}

int rk_arena_format(struct rk_arena *a, const char *name, uint64_t base, uint64_t max)
{
	struct rk_arena_hdr *h = a->hdr;
	uint64_t map_off = map_offset();
	uint64_t heap_off = rk_arena_heap_offset(max);
	if (heap_off + 65536 > max)
		return -EINVAL;
	memset(h, 0, sizeof *h);
	h->magic = RK_ARENA_MAGIC;
	h->version = RK_ARENA_VERSION;
	h->page_size = RK_PAGE;
	h->layout = rk_layout_hash();
	h->base = base;
	h->max_bytes = max;
	h->map_offset = map_off;
	h->heap_offset = heap_off;
	h->created_ns = rk_now_ns();
	rk_strlcpy(h->name, name, sizeof h->name);
	h->hdr_checksum = rk_arena_hdr_checksum(h);
	if (getrandom(&h->free_key, sizeof h->free_key, GRND_NONBLOCK) != sizeof h->free_key)
		h->free_key = rk_fnv1a(&h->created_ns, sizeof h->created_ns, base) | 1;
	a->free_key = h->free_key;
	h->roots_checksum = rk_arena_roots_checksum(h);
	h->committed = heap_off;
	a->map = (uint64_t *)((char *)h + map_off);
	return 0;
}

int rk_arena_grow(struct rk_arena *a, uint64_t need_top)
{
	struct rk_arena_hdr *h = a->hdr;
	uint64_t want = h->heap_offset + need_top;
	uint64_t step = h->committed / 4 > (4u << 20) ? h->committed / 4 : (4u << 20);
	uint64_t size = RK_ALIGN_UP(want > h->committed + step ? want : h->committed + step, RK_PAGE);
	if (size > h->max_bytes)
		size = h->max_bytes;
	if (size < want)
		return -ENOMEM;
	if (ftruncate(a->fd, (off_t)size) < 0)
		return -errno;
	h->committed = size;
	return 0;
}

static void why_set(char *why, size_t len, const char *arena, const char *what)
{
	snprintf(why, len, "arena %s: %s", arena, what);
}

/* True if at is the start of an object slot of class cls in a slab (the
 * same test the sweep applies to the central lists). */
static bool is_slab_object(struct rk_arena *a, unsigned cls, uint64_t at)
{
	const struct rk_arena_hdr *h = a->hdr;
	uint64_t first_page = h->heap_offset / RK_PAGE;
	uint64_t page = (at - h->base) / RK_PAGE, e = a->map[page];
	if (RK_PG_KIND(e) == RK_PG_CONT) {
		if (RK_PG_N(e) > page - first_page)
			return false;
		page -= RK_PG_N(e);
		e = a->map[page];
	}
	if (RK_PG_KIND(e) != RK_PG_SLAB || RK_PG_CLASS(e) != cls)
		return false;
	const struct rk_slab *s = (const struct rk_slab *)((const char *)h + page * RK_PAGE);
	if (s->magic != RK_SLAB_MAGIC || s->cls != cls || at < s->first)
		return false;
	uint64_t off = at - s->first;
	return off % rk_class_size[cls] == 0 && off / rk_class_size[cls] < s->nobjs;
}

/* Each tcache chain must hold object starts of its own class, inside the heap. */
static int tcache_chain_valid(struct rk_arena *a, unsigned cls, const struct rk_free_block *p)
{
	const struct rk_arena_hdr *h = a->hdr;
	uint64_t lo = h->base + h->heap_offset, hi = h->base + h->heap_offset + h->top;
	for (unsigned n = 0; p; p = p->next, n++) {
		uint64_t at = (uint64_t)(uintptr_t)p;
		if (n > 4 * RK_TCACHE_MAX || at < lo || at >= hi || (at & 15) || !is_slab_object(a, cls, at))
			return 0;
	}
	return 1;
}

int rk_arena_validate(struct rk_arena *a, uint64_t base, uint64_t max, char *why, size_t wl)
{
	struct rk_arena_hdr *h = a->hdr;
	struct stat st;
	char msg[96];
	if (fstat(a->fd, &st) < 0) {
		why_set(why, wl, a->name, "cannot stat its memfd");
		return -EIO;
	}
	if ((uint64_t)st.st_size < sizeof *h || h->magic != RK_ARENA_MAGIC) {
		why_set(why, wl, a->name, "bad magic (not a rekindle arena)");
		return -EINVAL;
	}
	if (h->version != RK_ARENA_VERSION || h->page_size != RK_PAGE || h->layout != rk_layout_hash()) {
		why_set(why, wl, a->name, "version or layout differs from this runtime");
		return -EINVAL;
	}
	if (h->hdr_checksum != rk_arena_hdr_checksum(h)) {
		why_set(why, wl, a->name, "header checksum mismatch");
		return -EINVAL;
	}
	if (h->base != base || h->max_bytes != max || strncmp(h->name, a->name, sizeof h->name)) {
		why_set(why, wl, a->name, "header does not match the manifest (base, size or name)");
		return -EINVAL;
	}
	if (h->committed != (uint64_t)st.st_size || h->heap_offset + h->top > h->committed) {
		why_set(why, wl, a->name, "heap bounds do not match the memfd size");
		return -EINVAL;
	}
	if (h->roots_checksum != rk_arena_roots_checksum(h)) {
		why_set(why, wl, a->name, "roots checksum mismatch");
		return -EINVAL;
	}
	a->map = (uint64_t *)((char *)h + h->map_offset);
	a->free_key = h->free_key;
	uint32_t owner = atomic_load(&h->heap_lock) | atomic_load(&h->root_lock);
	for (unsigned c = 0; c < RK_NCLASSES && !owner; c++)
		owner = atomic_load(&h->classes[c].lock);
	if (owner) {
		snprintf(msg, sizeof msg, "a thread (tid %u) died inside the allocator holding a lock", owner);
		why_set(why, wl, a->name, msg);
		return -EBUSY;
	}
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++) {
		if (!atomic_load(&h->tcaches[i].owner))
			continue;
		for (unsigned c = 0; c < RK_NCLASSES; c++)
			if (!tcache_chain_valid(a, c, h->tcaches[i].bins[c].head)) {
				why_set(why, wl, a->name, "a thread cache list is corrupt");
				return -EINVAL;
			}
	}
	return 0;
}

/* Finds the dead threads' pending objects, then folds the dead caches
 * into the central lists.  A cache whose log still holds pending objects
 * stays reserved (RK_TC_ORPHAN: no thread of this incarnation takes it, so
 * no new object carries its tag) until rk_finish_recovery settles them. */
void rk_arena_recover(struct rk_arena *a)
{
	struct rk_arena_hdr *h = a->hdr;
	a->pending_overflow = 0;
	a->pending_found = rk_pending_collect(a, &a->pending_overflow);
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++) {
		struct rk_tcache *tc = &h->tcaches[i];
		if (!atomic_load(&tc->owner))
			continue;
		rk_tcache_flush_all(a, tc);
		atomic_store(&tc->owner, tc->nlog ? RK_TC_ORPHAN : 0);
	}
}

/* ---- the address range of arenas ---- */

#define ARENA_SLOT_ALIGN (1ull << 30)

/* Maps [base, base+len) PROT_NONE, there and nowhere else: NULL (errno set)
 * if any of it is taken. */
void *rk_arena_reserve_range(uint64_t base, uint64_t len)
{
	void *p = mmap((void *)(uintptr_t)base, len, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (p != (void *)(uintptr_t)base) { /* kernel without MAP_FIXED_NOREPLACE */
		munmap(p, len);
		errno = EEXIST;
		return NULL;
	}
	return p;
}

/* Puts the reservation back over [base, base+len). */
static void unreserve_to_none(uint64_t base, uint64_t len)
{
	if (mmap((void *)(uintptr_t)base, len, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
		munmap((void *)(uintptr_t)base, len);
}

static uint64_t arena_slot_bytes(uint64_t max)
{
	return RK_ALIGN_UP(max + RK_PAGE, ARENA_SLOT_ALIGN); /* at least one guard page */
}

uint64_t rk_arena_reserve_slot(uint64_t max)
{
	uint64_t base = rk_g.next_arena_addr, slot = arena_slot_bytes(max);
	if (base + slot > rk_g.reserve_base + rk_g.reserve_len)
		return 0;
	rk_g.next_arena_addr = base + slot;
	return base;
}

void rk_arena_unreserve(uint64_t base, uint64_t max)
{
	unreserve_to_none(base, max);
}

/* ---- opening and dropping arenas ---- */

static int arena_name_ok(const char *name)
{
	size_t n = name ? strnlen(name, RK_NAME_MAX + 1) : 0;
	if (n == 0 || n > RK_NAME_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
		      c == '-' || c == '.'))
			return 0;
	}
	return 1;
}

/* Formats a new arena on fd at base and registers it; the caller owns the
 * address slot.  NULL with errno on failure (fd left open). */
static rk_arena *arena_format_at(const char *name, int fd, uint64_t base, uint64_t max, unsigned flags)
{
	struct rk_arena *a = &rk_g.arenas[rk_g.narenas];
	memset(a, 0, sizeof *a);
	a->fd = fd;
	rk_fd_file_id(fd, &a->dev, &a->ino);
	uint64_t heap_off = rk_arena_heap_offset(max);
	int r = -EINVAL;
	if (heap_off + 65536 <= max && ftruncate(fd, (off_t)heap_off) == 0) {
		void *p = mmap((void *)(uintptr_t)base, max, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
		if (p != MAP_FAILED) {
			a->hdr = p;
			r = rk_arena_format(a, name, base, max);
		} else {
			r = -errno;
		}
	} else if (heap_off + 65536 <= max) {
		r = -errno;
	}
	if (r < 0) {
		if (a->hdr)
			unreserve_to_none(base, max);
		memset(a, 0, sizeof *a);
		errno = -r;
		return NULL;
	}
	(void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK); /* a stray ftruncate must not SIGBUS us */
	a->hdr_max = max;
	a->index = rk_g.narenas++;
	a->reopened = true;
	a->flags = flags;
	rk_strlcpy(a->name, name, sizeof a->name);
	return a;
}

struct rk_arena *rk_arena_create_at(const char *name, int fd, uint64_t base, uint64_t max)
{
	if (rk_g.narenas == RK_MAX_ARENAS) {
		errno = ENOSPC;
		return NULL;
	}
	return arena_format_at(name, fd, base, max, 0);
}

static rk_arena *arena_create(const char *name, uint64_t max, unsigned flags)
{
	uint64_t base = rk_g.next_arena_addr, slot = arena_slot_bytes(max);
	if (base + slot > rk_g.reserve_base + rk_g.reserve_len) {
		errno = ENOSPC;
		return NULL;
	}
	char fdname[64];
	snprintf(fdname, sizeof fdname, "rekindle:%s", name);
	int fd = memfd_create(fdname, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return NULL;
	rk_arena *a = arena_format_at(name, fd, base, max, flags);
	if (!a) {
		int e = errno;
		close(fd);
		errno = e;
		return NULL;
	}
	rk_g.next_arena_addr = base + slot;
	rk_manifest_sync();
	return a;
}

/* The protection follows what this incarnation asked for. */
static rk_arena *arena_protect(rk_arena *a)
{
	if ((a->flags & RK_ARENA_WRITE_PROTECT) && a->pkey == 0)
		(void)rk_wp_protect(a); /* without pkeys: warned once, unprotected */
	return a;
}

rk_arena *rk_arena_open_flags(const char *name, size_t max_bytes, unsigned flags)
{
	if (!rk_g.initialized) {
		errno = EPERM; /* rk_init first */
		return NULL;
	}
	if (!arena_name_ok(name) || (flags & ~(RK_ARENA_INDEPENDENT | RK_ARENA_WRITE_PROTECT | RK_ARENA_NO_SNAPSHOT))) {
		errno = EINVAL;
		return NULL;
	}
	uint64_t max = RK_ALIGN_UP((uint64_t)max_bytes, 2u << 20);
	if (max_bytes == 0 || max < max_bytes) {
		errno = EINVAL;
		return NULL;
	}
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		struct rk_arena *a = &rk_g.arenas[i];
		if (!a->hdr || strcmp(a->name, name) != 0)
			continue;
		if (a->inherited && max != a->hdr->max_bytes && !a->reopened) {
			struct rk_ev e;
			rk_ev_begin(&e, "warning");
			rk_ev_str(&e, "what", "arena reopened with another max_bytes; keeping the preserved size");
			rk_ev_str(&e, "arena", name);
			rk_ev_u64(&e, "max_bytes", a->hdr->max_bytes);
			rk_ev_end(&e);
		}
		a->reopened = true;
		if (a->flags != flags) {
			a->flags = flags;
			rk_manifest_sync();
		}
		return arena_protect(a);
	}
	if (rk_g.narenas == RK_MAX_ARENAS) {
		errno = ENOSPC;
		return NULL;
	}
	rk_arena *a = arena_create(name, max, flags);
	if (a)
		rk_redo_arena_created(a->index);
	return a ? arena_protect(a) : NULL;
}

rk_arena *rk_arena_open(const char *name, size_t max_bytes)
{
	return rk_arena_open_flags(name, max_bytes, 0);
}

bool rk_arena_preserved(const rk_arena *a)
{
	return a && a->hdr && a->inherited;
}

bool rk_arena_write_protected(const rk_arena *a)
{
	return a && a->pkey > 0;
}

/* An inherited arena that the new incarnation did not reopen. */
void rk_arena_drop(struct rk_arena *a)
{
	struct rk_ev e;
	rk_ev_begin(&e, "arena_dropped");
	rk_ev_str(&e, "arena", a->name);
	rk_ev_str(&e, "why", "not reopened during recovery");
	rk_ev_end(&e);
	unreserve_to_none((uint64_t)(uintptr_t)a->hdr, a->hdr_max);
	close(a->fd);
	a->hdr = NULL;
	a->map = NULL;
	a->fd = -1;
	rk_manifest_sync();
}

bool rk_arena_contains(const rk_arena *a, const void *p)
{
	return a && a->hdr && (uintptr_t)p >= a->hdr->base && (uintptr_t)p < a->hdr->base + a->hdr->max_bytes;
}

/* ---- roots ---- */

static int root_name_ok(const char *name)
{
	size_t n = name ? strnlen(name, RK_NAME_MAX + 1) : 0;
	return n > 0 && n <= RK_NAME_MAX;
}

int rk_root_set(rk_arena *a, const char *name, void *ptr)
{
	if (!a || !a->hdr || !root_name_ok(name))
		return -EINVAL;
	if (ptr && !rk_arena_contains(a, ptr))
		return -EFAULT; /* a root must point into its arena to survive */
	/* A publication: what this thread allocated is committed first (a death
	 * after the commit and before the root is set only leaks). */
	rk_pending_commit();
	struct rk_arena_hdr *h = a->hdr;
	int ret = -ENOSPC;
	uint32_t wp = rk_wp_write_begin(a);
	rk_lock_acquire(a, &h->root_lock);
	struct rk_root *slot = NULL, *empty = NULL;
	for (unsigned i = 0; i < RK_MAX_ROOTS; i++) {
		if (h->roots[i].name[0] == 0) {
			if (!empty)
				empty = &h->roots[i];
		} else if (strncmp(h->roots[i].name, name, sizeof h->roots[i].name) == 0) {
			slot = &h->roots[i];
			break;
		}
	}
	if (!slot && ptr)
		slot = empty;
	if (slot) {
		if (ptr) {
			rk_strlcpy(slot->name, name, sizeof slot->name);
			slot->ptr = (uint64_t)(uintptr_t)ptr;
		} else {
			memset(slot, 0, sizeof *slot);
		}
		h->roots_checksum = rk_arena_roots_checksum(h);
		ret = 0;
	} else if (!ptr) {
		ret = 0;
	}
	rk_lock_release(a, &h->root_lock);
	rk_wp_write_end(wp);
	return ret;
}

void *rk_root_get(rk_arena *a, const char *name)
{
	if (!a || !a->hdr || !root_name_ok(name))
		return NULL;
	struct rk_arena_hdr *h = a->hdr;
	void *p = NULL;
	uint32_t wp = rk_wp_write_begin(a); /* the lock word is in the arena */
	rk_lock_acquire(a, &h->root_lock);
	for (unsigned i = 0; i < RK_MAX_ROOTS; i++)
		if (h->roots[i].name[0] && strncmp(h->roots[i].name, name, sizeof h->roots[i].name) == 0) {
			p = (void *)(uintptr_t)h->roots[i].ptr;
			break;
		}
	rk_lock_release(a, &h->root_lock);
	rk_wp_write_end(wp);
	return p;
}
