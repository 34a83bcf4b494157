/* sweep.c - cleanup after a warm restart: every object the application did
 * not mark (reach from its roots) is freed; these are the objects of requests
 * that were in flight when the previous incarnation died.  Free lists are
 * rebuilt from scratch, and slabs left wholly free go back to the page heap. */
#include "rk_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SLAB_RELEASE 0x454c4552u /* slab magic while waiting to be released */
#define PG_RELEASE 0x2000ull     /* large run waiting to be released */

static uint64_t heap_first(const struct rk_arena *a)
{
	return a->hdr->heap_offset / RK_PAGE;
}

static uint64_t heap_end(const struct rk_arena *a)
{
	return (a->hdr->heap_offset + a->hdr->top) / RK_PAGE;
}

static struct rk_slab *slab_at(struct rk_arena *a, uint64_t page)
{
	return (struct rk_slab *)((char *)a->hdr + page * RK_PAGE);
}

/* Visits every run of the heap in address order; stops at a malformed entry. */
#define FOR_EACH_RUN(a, page, e, n)                                                                     \
	for (uint64_t page = heap_first(a), e, n;                                                        \
	     page < heap_end(a) && (e = (a)->map[page], n = RK_PG_N(e), n != 0) &&                        \
	     (RK_PG_KIND(e) == RK_PG_SLAB || RK_PG_KIND(e) == RK_PG_LARGE || RK_PG_KIND(e) == RK_PG_FREE); \
	     page += n)

static int heap_walk_ok(struct rk_arena *a)
{
	uint64_t end = heap_first(a);
	FOR_EACH_RUN(a, page, e, n)
	{
		(void)e;
		end = page + n;
	}
	return end == heap_end(a) ? 0 : -EIO;
}

/* Sets the scratch bit of every object on a free list of the class. */
static int note_free(struct rk_arena *a, unsigned cls, const struct rk_free_block *b)
{
	uint64_t lo = a->hdr->base + a->hdr->heap_offset, hi = lo + a->hdr->top;
	for (; b; b = b->next) {
		uint64_t at = (uint64_t)(uintptr_t)b;
		if (at < lo || at >= hi)
			return -EIO;
		uint64_t page = (at - a->hdr->base) / RK_PAGE, e = a->map[page];
		if (RK_PG_KIND(e) == RK_PG_CONT)
			page -= RK_PG_N(e), e = a->map[page];
		if (RK_PG_KIND(e) != RK_PG_SLAB || RK_PG_CLASS(e) != cls)
			return -EIO;
		struct rk_slab *s = slab_at(a, page);
		uint64_t idx = (at - s->first) / rk_class_size[cls];
		if (at < s->first || idx >= s->nobjs || (at - s->first) % rk_class_size[cls])
			return -EIO;
		if (s->scratch[idx / 64] & (1ull << (idx % 64)))
			return -EIO; /* on a list twice: a cycle or a double free */
		s->scratch[idx / 64] |= 1ull << (idx % 64);
	}
	return 0;
}

/* Same order as the allocator (a class lock, then the heap lock). */
static void lock_all(struct rk_arena *a)
{
	for (unsigned c = 0; c < RK_NCLASSES; c++)
		rk_lock_acquire(a, &a->hdr->classes[c].lock);
	rk_lock_acquire(a, &a->hdr->heap_lock);
}

static void unlock_all(struct rk_arena *a)
{
	rk_lock_release(a, &a->hdr->heap_lock);
	for (unsigned c = 0; c < RK_NCLASSES; c++)
		rk_lock_release(a, &a->hdr->classes[c].lock);
}

/* An orphaned cache (a dead thread's, whose pending objects wait for
 * rk_finish_recovery) holds no blocks: only its log. */
static bool cache_live(const struct rk_tcache *t)
{
	uint32_t o = atomic_load(&t->owner);
	return o != 0 && o != RK_TC_ORPHAN;
}

static int only_my_cache(struct rk_arena *a)
{
	struct rk_tcache *mine = rk_tcache_current(a);
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++) {
		struct rk_tcache *t = &a->hdr->tcaches[i];
		if (t != mine && cache_live(t))
			return 0;
	}
	if (mine)
		rk_tcache_flush_all(a, mine);
	return 1;
}

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

/* What the check mode compares: the sorted objects the pending path would
 * free, and a count of the objects the sweep frees that are not among them. */
struct pending_cmp {
	const uint64_t *v;
	size_t n;
	uint64_t *not_pending;
};

static void note_swept(const struct pending_cmp *pc, uint64_t at)
{
	if (pc->not_pending && !bsearch(&at, pc->v, pc->n, sizeof *pc->v, cmp_u64))
		(*pc->not_pending)++;
}

/* Rebuilds the slab's part of the class lists; returns true if it is all free. */
static bool sweep_slab(struct rk_arena *a, struct rk_slab *s, struct rk_free_block **heads, uint64_t *counts,
		       struct rk_sweep_stats *st, uint64_t *freed_bytes, const struct pending_cmp *pc)
{
	uint32_t size = rk_class_size[s->cls];
	struct rk_free_block *chain = NULL;
	uint64_t nfree = 0;
	for (uint32_t i = s->nobjs; i-- > 0;) {
		bool is_free = s->scratch[i / 64] & (1ull << (i % 64));
		bool marked = atomic_load_explicit(&s->mark[i / 64], memory_order_relaxed) & (1ull << (i % 64));
		if (!is_free && marked) {
			st->objects_kept++;
			st->bytes_kept += size;
			continue;
		}
		if (!is_free) {
			st->objects_freed++;
			st->bytes_freed += size;
			*freed_bytes += size;
			note_swept(pc, s->first + (uint64_t)i * size);
		}
		atomic_store_explicit(&s->tag[i], 0, memory_order_relaxed); /* free now */
		struct rk_free_block *b = (struct rk_free_block *)(uintptr_t)(s->first + (uint64_t)i * size);
		b->stamp = rk_free_stamp(a, &s->tag[i]);
		b->next = chain;
		chain = b;
		nfree++;
	}
	memset(s->scratch, 0, sizeof s->scratch);
	for (unsigned w = 0; w < RK_SLAB_BITMAP_WORDS; w++)
		atomic_store_explicit(&s->mark[w], 0, memory_order_relaxed);
	if (nfree == s->nobjs)
		return true;
	if (chain) {
		struct rk_free_block *last = chain;
		while (last->next)
			last = last->next;
		last->next = heads[s->cls];
		heads[s->cls] = chain;
		counts[s->cls] += nfree;
	}
	return false;
}

/* The sweep's second pass: releases the slabs and runs the first marked.
 * Freeing coalesces a run with its free neighbours, which rewrites the
 * page-map entry at the end of the merged run: when the next run is a free
 * run of one page, that is the entry the walk reads next, now with the
 * merged length, which would carry the walk past the following runs (or
 * into the middle of one, where it stops), leaving them marked and their
 * blocks on no list.  So the entry of a free run is read before the run
 * ahead of it is freed. */
static void release_marked(struct rk_arena *a)
{
	uint64_t page = heap_first(a);
	while (page < heap_end(a)) {
		uint64_t e = a->map[page], n = RK_PG_N(e);
		if (n == 0 || (RK_PG_KIND(e) != RK_PG_SLAB && RK_PG_KIND(e) != RK_PG_LARGE && RK_PG_KIND(e) != RK_PG_FREE))
			break; /* heap_walk_ok checked the walk: unreachable */
		uint64_t next = page + n;
		uint64_t ne = next < heap_end(a) ? a->map[next] : 0;
		if (RK_PG_KIND(e) == RK_PG_SLAB && slab_at(a, page)->magic == SLAB_RELEASE) {
			a->hdr->classes[RK_PG_CLASS(e)].slabs--;
			rk_run_free(a, page, n);
		} else if (RK_PG_KIND(e) == RK_PG_LARGE && (e & PG_RELEASE)) {
			rk_run_free(a, page, n);
		}
		/* a free run next: merged into this one or not, skip it by the
		 * length it had (free runs are never adjacent, so the run after
		 * it is not free) */
		page = RK_PG_KIND(ne) == RK_PG_FREE && RK_PG_N(ne) ? next + RK_PG_N(ne) : next;
	}
}

int rk_arena_sweep(struct rk_arena *a, struct rk_sweep_stats *st, const uint64_t *pending, size_t npending,
		   uint64_t *not_pending)
{
	struct pending_cmp pc = {pending, npending, not_pending};
	struct rk_free_block *heads[RK_NCLASSES] = {0};
	uint64_t counts[RK_NCLASSES] = {0}, freed_bytes = 0;
	if (!only_my_cache(a))
		return -EBUSY; /* other threads hold caches: their blocks look allocated */
	lock_all(a);
	int r = heap_walk_ok(a);
	for (unsigned c = 0; c < RK_NCLASSES && r == 0; c++)
		r = note_free(a, c, a->hdr->classes[c].head);
	if (r < 0) {
		/* Leave the scratch bits; the next sweep clears them per slab. */
		unlock_all(a);
		return r;
	}
	FOR_EACH_RUN(a, page, e, n)
	{
		if (RK_PG_KIND(e) == RK_PG_SLAB) {
			struct rk_slab *s = slab_at(a, page);
			if (sweep_slab(a, s, heads, counts, st, &freed_bytes, &pc))
				s->magic = SLAB_RELEASE;
		} else if (RK_PG_KIND(e) == RK_PG_LARGE) {
			if (e & RK_PG_MARK) {
				a->map[page] = e & ~RK_PG_MARK;
				st->objects_kept++;
				st->bytes_kept += n * RK_PAGE;
			} else {
				st->objects_freed++;
				st->bytes_freed += n * RK_PAGE;
				freed_bytes += n * RK_PAGE;
				note_swept(&pc, a->hdr->base + page * RK_PAGE);
				a->map[page] = e | PG_RELEASE;
			}
		}
	}
	for (unsigned c = 0; c < RK_NCLASSES; c++) {
		a->hdr->classes[c].head = heads[c];
		a->hdr->classes[c].count = counts[c];
	}
	release_marked(a);
	atomic_fetch_sub_explicit(&a->hdr->allocated_bytes, freed_bytes, memory_order_relaxed);
	unlock_all(a);
	return 0;
}

int rk_arena_clear_marks(struct rk_arena *a)
{
	lock_all(a);
	int r = heap_walk_ok(a);
	if (r == 0) {
		FOR_EACH_RUN(a, page, e, n)
		{
			if (RK_PG_KIND(e) == RK_PG_SLAB) {
				struct rk_slab *s = slab_at(a, page);
				for (unsigned w = 0; w < RK_SLAB_BITMAP_WORDS; w++)
					atomic_store_explicit(&s->mark[w], 0, memory_order_relaxed);
			} else if (RK_PG_KIND(e) == RK_PG_LARGE) {
				a->map[page] = e & ~RK_PG_MARK;
			}
		}
	}
	unlock_all(a);
	return r;
}

/* Clears the free bits note_free set (all slabs: it may have stopped half-way). */
static void clear_scratch(struct rk_arena *a)
{
	FOR_EACH_RUN(a, page, e, n)
	{
		(void)n;
		if (RK_PG_KIND(e) == RK_PG_SLAB)
			memset(slab_at(a, page)->scratch, 0, sizeof slab_at(a, page)->scratch);
	}
}

int rk_arena_census(rk_arena *a, rk_census_fn each, void *ctx, struct rk_census *out)
{
	if (!a || !a->hdr || !out)
		return -EINVAL;
	memset(out, 0, sizeof *out);
	struct rk_tcache *mine = rk_tcache_current(a);
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++)
		if (&a->hdr->tcaches[i] != mine && cache_live(&a->hdr->tcaches[i]))
			return -EBUSY; /* another thread's cache: its blocks move under our feet */
	uint32_t wp = rk_wp_write_begin(a);
	lock_all(a);
	int r = heap_walk_ok(a);
	for (unsigned c = 0; c < RK_NCLASSES && r == 0; c++)
		r = note_free(a, c, a->hdr->classes[c].head);
	for (unsigned c = 0; c < RK_NCLASSES && r == 0 && mine; c++)
		r = note_free(a, c, mine->bins[c].head);
	if (r == 0) {
		FOR_EACH_RUN(a, page, e, n)
		{
			if (RK_PG_KIND(e) == RK_PG_SLAB) {
				struct rk_slab *s = slab_at(a, page);
				uint32_t size = rk_class_size[s->cls];
				for (uint32_t i = 0; i < s->nobjs; i++) {
					if (s->scratch[i / 64] & (1ull << (i % 64))) {
						out->free_objects++;
						continue;
					}
					out->objects++;
					out->bytes += size;
					if (each)
						each((void *)(uintptr_t)(s->first + (uint64_t)i * size), size, ctx);
				}
			} else if (RK_PG_KIND(e) == RK_PG_LARGE) {
				out->objects++;
				out->bytes += n * RK_PAGE;
				if (each)
					each((char *)a->hdr + page * RK_PAGE, n * RK_PAGE, ctx);
			}
		}
	}
	if (r != -EIO || heap_walk_ok(a) == 0)
		clear_scratch(a);
	unlock_all(a);
	rk_wp_write_end(wp);
	return r;
}
