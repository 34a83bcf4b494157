/* alloc.c - the allocator inside arenas.
 *
 * Small objects (<= 32 KiB) come from slabs of one size class each, through
 * a per-thread cache that lives in the arena (so it survives a restart and
 * is folded back by the next incarnation).  Cache pushes and pops commit with
 * one store of the list head, so a thread killed at any instruction leaves
 * the list consistent; moves between a cache and the central lists happen
 * inside the class's critical section.  Central free lists and the page-run
 * allocator change only under lock words in the arena; a lock found held
 * after a death marks the arena unsafe.  Large objects are page runs, found
 * through the arena's page map.
 *
 * Each cache also logs what its thread allocates since its last commit (the
 * pending allocations, struct rk_tcache): an allocation tags the object with
 * its cache and logs it, a free stamps the block, a commit empties the log.
 * A warm start frees the dead threads' pending objects (rk_pending_collect,
 * rk_pending_settle), without walking the arena.
 */
#include "rk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

uint32_t rk_class_size[RK_NCLASSES];
static uint8_t class_of_16[RK_SMALL_MAX / 16 + 1];
static uint16_t class_slab_pages[RK_NCLASSES];
static uint16_t class_tc_limit[RK_NCLASSES];
static uint16_t class_refill[RK_NCLASSES]; /* blocks a cache refill takes */
/* Slab geometry: the objects of a slab of class c span class_span[c] bytes
 * after its header of class_hdr[c] bytes (the fixed part, then a tag byte
 * per object); class_recip[c] = ceil(2^40 / size) turns an offset in that
 * span (< 2^19) into an object index exactly, with no division. */
static uint32_t class_span[RK_NCLASSES];
static uint32_t class_hdr[RK_NCLASSES];
static uint64_t class_recip[RK_NCLASSES];

#define TLS __attribute__((tls_model("initial-exec"))) static __thread
TLS uint32_t tls_tid;
TLS struct rk_tcache *tls_tc[RK_MAX_ARENAS];
TLS bool tls_key_set;
__thread uint32_t rk_tls_pending __attribute__((tls_model("initial-exec")));

static pthread_key_t tc_key;
static pthread_once_t tc_key_once = PTHREAD_ONCE_INIT;

/* A slab header with a tag byte for each of nobjs objects. */
static uint64_t slab_header_bytes(uint64_t nobjs)
{
	return RK_ALIGN_UP(sizeof(struct rk_slab) + nobjs, 16);
}

__attribute__((constructor)) static void classes_init(void)
{
	unsigned n = 0;
	for (uint32_t s = 16; s <= 128; s += 16)
		rk_class_size[n++] = s;
	for (uint32_t b = 128; b < RK_SMALL_MAX; b *= 2)
		for (uint32_t k = 1; k <= 4; k++)
			rk_class_size[n++] = b + k * b / 4;
	unsigned c = 0;
	for (unsigned i = 0; i <= RK_SMALL_MAX / 16; i++) {
		while (rk_class_size[c] < i * 16)
			c++;
		class_of_16[i] = (uint8_t)c;
	}
	for (c = 0; c < RK_NCLASSES; c++) {
		uint64_t want = RK_ALIGN_UP(slab_header_bytes(8) + 8ull * rk_class_size[c], RK_PAGE) / RK_PAGE;
		if (want < RK_SLAB_MIN_PAGES)
			want = RK_SLAB_MIN_PAGES;
		class_slab_pages[c] = (uint16_t)want;
		uint64_t nobjs = (want * RK_PAGE - sizeof(struct rk_slab)) / (rk_class_size[c] + 1ull);
		if (nobjs > RK_SLAB_BITMAP_WORDS * 64)
			nobjs = RK_SLAB_BITMAP_WORDS * 64;
		while (slab_header_bytes(nobjs) + nobjs * rk_class_size[c] > want * RK_PAGE)
			nobjs--;
		class_hdr[c] = (uint32_t)slab_header_bytes(nobjs);
		class_span[c] = (uint32_t)(nobjs * rk_class_size[c]);
		class_recip[c] = ((1ull << 40) + rk_class_size[c] - 1) / rk_class_size[c];
		uint32_t lim = RK_TCACHE_MAX_BYTES / rk_class_size[c];
		class_tc_limit[c] = (uint16_t)(lim > RK_TCACHE_MAX ? RK_TCACHE_MAX : (lim < 2 ? 2 : lim));
		/* half the cache: a refill must not overflow it at the next free */
		class_refill[c] = (uint16_t)(class_tc_limit[c] / 2 < RK_TCACHE_BATCH ? class_tc_limit[c] / 2 : RK_TCACHE_BATCH);
	}
}

uint64_t rk_layout_hash(void)
{
	uint64_t h = rk_fnv1a(rk_class_size, sizeof rk_class_size, 0);
	h = rk_fnv1a(class_hdr, sizeof class_hdr, h);
	h = rk_fnv1a(class_span, sizeof class_span, h);
	uint64_t sizes[] = {sizeof(struct rk_arena_hdr), sizeof(struct rk_slab), sizeof(struct rk_tcache),
			    RK_PAGE, RK_SMALL_MAX, RK_TCACHE_MAX, RK_PENDING_LOG};
	return rk_fnv1a(sizes, sizeof sizes, h);
}

uint32_t rk_gettid(void)
{
	if (RK_UNLIKELY(tls_tid == 0))
		tls_tid = (uint32_t)syscall(SYS_gettid);
	return tls_tid;
}

/* A forked child has a new tid and must not use the parent's caches. */
static void after_fork_child(void)
{
	tls_tid = 0;
	memset(tls_tc, 0, sizeof tls_tc);
	rk_tls_pending = 0;
}

/* Set while a restart is under way: no thread may start a new critical
 * section, so that the restarting thread can wait for the running ones to
 * end and hand over arenas with no lock held.  A futex word: the stopped
 * threads sleep on it until the exec, or until a failed restart thaws. */
static _Atomic int freezing;

/* Locks this thread holds: a thread that already holds one (a class lock,
 * on its way to the heap lock) must finish its critical section rather than
 * park with the first lock held, which would look like a death inside the
 * allocator to the next incarnation. */
TLS unsigned tls_locks_held;

/* A spin-wait hint to the CPU: pause on x86, yield on arm64; elsewhere only
 * a compiler barrier (the loop below yields to the scheduler soon anyway). */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield" ::: "memory");
#else
	__asm__ volatile("" ::: "memory");
#endif
}

/* One try: true with the lock held; false if the thread stepped back for a
 * restart's freeze, holding nothing and no longer counted. */
static inline bool lock_try_or_step_back(struct rk_arena *a, rk_lock *l, uint32_t me)
{
	rk_unsafe_note_enter(a->index); /* before the lock: held implies counted */
	for (unsigned spins = 0;; spins++) {
		uint32_t expect = 0;
		if (atomic_load_explicit(l, memory_order_relaxed) == 0 &&
		    atomic_compare_exchange_weak_explicit(l, &expect, me, memory_order_seq_cst,
							  memory_order_relaxed)) {
			/* Dekker-style with rk_allocator_freeze: lock, then look. */
			if (RK_UNLIKELY(atomic_load(&freezing)) && tls_locks_held == 0) {
				atomic_store(l, 0);
				rk_unsafe_note_leave(a->index);
				return false;
			}
			tls_locks_held++;
			return true;
		}
		if (RK_UNLIKELY(atomic_load_explicit(&freezing, memory_order_relaxed)) && tls_locks_held == 0) {
			rk_unsafe_note_leave(a->index);
			return false;
		}
		if (spins < 100)
			cpu_relax();
		else
			sched_yield();
	}
}

void rk_lock_acquire(struct rk_arena *a, rk_lock *l)
{
	uint32_t me = rk_gettid();
	/* The restart's exec ends a thread waiting here; if the exec fails,
	 * the thaw wakes it and it starts over. */
	while (RK_UNLIKELY(!lock_try_or_step_back(a, l, me)))
		rk_freeze_wait(&freezing);
}

static unsigned locks_held_by_others(uint32_t me)
{
	unsigned n = 0;
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		struct rk_arena_hdr *h = rk_g.arenas[i].hdr;
		if (!h)
			continue;
		uint32_t o = atomic_load(&h->heap_lock);
		n += o && o != me;
		o = atomic_load(&h->root_lock);
		n += o && o != me;
		for (unsigned c = 0; c < RK_NCLASSES; c++) {
			o = atomic_load(&h->classes[c].lock);
			n += o && o != me;
		}
	}
	return n;
}

void rk_allocator_thaw(void)
{
	rk_freeze_release(&freezing);
}

unsigned rk_allocator_freeze(uint64_t timeout_ns)
{
	uint32_t me = rk_gettid();
	atomic_store(&freezing, 1); /* then look at the locks */
	uint64_t t0 = rk_now_ns();
	unsigned held;
	while ((held = locks_held_by_others(me)) != 0 && rk_now_ns() - t0 < timeout_ns)
		sched_yield();
	return held;
}

void rk_lock_release(struct rk_arena *a, rk_lock *l)
{
	tls_locks_held--;
	atomic_store_explicit(l, 0, memory_order_release);
	rk_unsafe_note_leave(a->index);
}

static inline uint64_t *map_entry(struct rk_arena *a, uint64_t page)
{
	return &a->map[page];
}

static inline void *page_addr(struct rk_arena *a, uint64_t page)
{
	return (char *)a->hdr + page * RK_PAGE;
}

/* ---- page runs (heap_lock held) ------------------------------------------ */

static unsigned run_bin(uint64_t npages)
{
	if (npages <= 32)
		return (unsigned)npages - 1;
	unsigned lg = 63u - (unsigned)__builtin_clzll(npages); /* >= 5 */
	unsigned b = 32 + (lg - 5);
	return b < RK_RUN_BINS ? b : RK_RUN_BINS - 1;
}

static void run_list_insert(struct rk_arena *a, uint64_t page, uint64_t npages)
{
	struct rk_arena_hdr *h = a->hdr;
	struct rk_free_run *r = page_addr(a, page);
	unsigned b = run_bin(npages);
	r->prev = NULL;
	r->next = h->run_bins[b];
	if (r->next)
		r->next->prev = r;
	h->run_bins[b] = r;
	*map_entry(a, page) = RK_PG_MAKE(RK_PG_FREE, 0, npages);
	*map_entry(a, page + npages - 1) = RK_PG_MAKE(RK_PG_FREE, 0, npages);
}

static void run_list_remove(struct rk_arena *a, uint64_t page, uint64_t npages)
{
	struct rk_free_run *r = page_addr(a, page);
	if (r->prev)
		r->prev->next = r->next;
	else
		a->hdr->run_bins[run_bin(npages)] = r->next;
	if (r->next)
		r->next->prev = r->prev;
}

static uint64_t heap_first_page(struct rk_arena *a)
{
	return a->hdr->heap_offset / RK_PAGE;
}

static uint64_t heap_top_page(struct rk_arena *a)
{
	return (a->hdr->heap_offset + a->hdr->top) / RK_PAGE;
}

static void run_punch(struct rk_arena *a, uint64_t page, uint64_t npages)
{
	/* A cross-check's validator reads the memfd's pages as they were at
	 * the restart: a hole would read as zeros there. */
	if (atomic_load_explicit(&rk_g.no_punch, memory_order_relaxed))
		return;
	/* Give the memory back; a failure only costs memory, so it is not fatal. */
	if (fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(page * RK_PAGE),
		      (off_t)(npages * RK_PAGE)) == 0)
		rk_snapshot_note_punch(a->hdr->base + page * RK_PAGE, npages); /* no scan sees a hole */
}

/* ---- memory above the heap top (heap_lock held) ----------------------------
 * When the top falls, the pages above it go back to the kernel, except the
 * first TOP_SLACK_PAGES: a top that moves up and down by less than that
 * (large objects allocated and freed at the end of the heap) then costs no
 * fallocate, no TLB shootdown on the other cores and no page faults.
 * top_reach[] is a process-private hint that only decides how much memory
 * goes back: the highest page the top reached since the last punch, above
 * which the memfd holds no memory.  0 means unknown (a new incarnation: the
 * previous one may have left memory anywhere below the memfd size). */
#define TOP_SLACK_PAGES 256 /* 1 MiB, as for free runs */
static uint64_t top_reach[RK_MAX_ARENAS];

static void top_rose(struct rk_arena *a)
{
	uint64_t *reach = &top_reach[a->index];
	if (*reach && heap_top_page(a) > *reach)
		*reach = heap_top_page(a);
}

/* The top just fell to its current page from old_top. */
static void top_fell(struct rk_arena *a, uint64_t old_top)
{
	uint64_t *reach = &top_reach[a->index];
	uint64_t keep = heap_top_page(a) + TOP_SLACK_PAGES;
	uint64_t end = *reach ? *reach : a->hdr->committed / RK_PAGE;
	if (old_top > end)
		end = old_top;
	if (end > keep)
		run_punch(a, keep, end - keep);
	*reach = keep < end ? keep : end;
}

/* Returns the first page of a run of npages, or 0 with errno = ENOMEM. */
static uint64_t run_alloc_locked(struct rk_arena *a, uint64_t npages)
{
	struct rk_arena_hdr *h = a->hdr;
	for (unsigned b = run_bin(npages); b < RK_RUN_BINS; b++) {
		for (struct rk_free_run *r = h->run_bins[b]; r; r = r->next) {
			uint64_t page = (uint64_t)((char *)r - (char *)h) / RK_PAGE;
			uint64_t have = RK_PG_N(*map_entry(a, page));
			if (have < npages)
				continue;
			run_list_remove(a, page, have);
			if (have > npages)
				run_list_insert(a, page + npages, have - npages);
			return page;
		}
	}
	uint64_t need = h->top + npages * RK_PAGE;
	if (need < h->top || h->heap_offset + need > h->max_bytes) {
		errno = ENOMEM;
		return 0;
	}
	if (h->heap_offset + need > h->committed && rk_arena_grow(a, need) < 0) {
		errno = ENOMEM;
		return 0;
	}
	uint64_t page = heap_top_page(a);
	h->top = need;
	top_rose(a);
	return page;
}

void rk_run_free(struct rk_arena *a, uint64_t page, uint64_t npages)
{
	uint64_t next = page + npages;
	if (next < heap_top_page(a) && RK_PG_KIND(*map_entry(a, next)) == RK_PG_FREE) {
		uint64_t n2 = RK_PG_N(*map_entry(a, next));
		run_list_remove(a, next, n2);
		npages += n2;
	}
	if (page > heap_first_page(a) && RK_PG_KIND(*map_entry(a, page - 1)) == RK_PG_FREE) {
		uint64_t pn = RK_PG_N(*map_entry(a, page - 1));
		uint64_t start = page - pn;
		if (pn && start >= heap_first_page(a) && *map_entry(a, start) == RK_PG_MAKE(RK_PG_FREE, 0, pn)) {
			run_list_remove(a, start, pn);
			/* now inside a free run: a second free of it must find nothing */
			*map_entry(a, page) = 0;
			page = start;
			npages += pn;
		}
	}
	if (page + npages == heap_top_page(a)) {
		/* The run ends the heap: lower the top instead of keeping a free run. */
		a->hdr->top = page * RK_PAGE - a->hdr->heap_offset;
		*map_entry(a, page) = 0;
		top_fell(a, page + npages);
		return;
	}
	run_list_insert(a, page, npages);
	if (npages >= 256) /* 1 MiB: return all but the page holding the links */
		run_punch(a, page + 1, npages - 1);
}

static void run_set_used(struct rk_arena *a, uint64_t page, uint64_t npages, uint64_t first)
{
	*map_entry(a, page) = first;
	for (uint64_t i = 1; i < npages; i++)
		*map_entry(a, page + i) = RK_PG_MAKE(RK_PG_CONT, 0, i);
}

/* ---- object lookup -------------------------------------------------------- */

/* The lookups of every rk_free: inlined there whatever the other call sites
 * make the compiler think (a call each costs rk_free a third more). */
#define HOT static inline __attribute__((always_inline))

/* Finds the run holding p: returns its first page and entry, or -1. */
HOT int64_t run_of(struct rk_arena *a, const void *p, uint64_t *entry)
{
	uint64_t off = (uint64_t)((const char *)p - (const char *)a->hdr);
	struct rk_arena_hdr *h = a->hdr;
	if ((uintptr_t)p < (uintptr_t)h || off < h->heap_offset || off >= h->heap_offset + h->top)
		return -1;
	uint64_t page = off / RK_PAGE;
	uint64_t e = *map_entry(a, page);
	if (RK_PG_KIND(e) == RK_PG_CONT) {
		if (RK_PG_N(e) > page - heap_first_page(a))
			return -1;
		page -= RK_PG_N(e);
		e = *map_entry(a, page);
	}
	uint32_t k = RK_PG_KIND(e);
	if (k != RK_PG_SLAB && k != RK_PG_LARGE)
		return -1;
	*entry = e;
	return (int64_t)page;
}

/* True if p starts an object of the slab at page (of class cls). */
HOT bool slab_object_start(struct rk_arena *a, uint64_t page, unsigned cls, const void *p)
{
	/* a pointer into the slab header wraps around and fails the span test */
	uint64_t off = (uint64_t)((const char *)p - (const char *)page_addr(a, page)) - class_hdr[cls];
	if (off >= class_span[cls])
		return false;
	uint64_t idx = (off * class_recip[cls]) >> 40;
	return idx * rk_class_size[cls] == off;
}

/* True if p is what rk_alloc returned for the run at page: the start of a
 * slab object, or the first byte of a large run. */
HOT bool object_start(struct rk_arena *a, int64_t page, uint64_t e, const void *p)
{
	if (RK_PG_KIND(e) == RK_PG_SLAB)
		return slab_object_start(a, (uint64_t)page, RK_PG_CLASS(e), p);
	return p == page_addr(a, (uint64_t)page);
}

static int mark_in_run(struct rk_arena *a, int64_t page, uint64_t e, const void *p)
{
	if (RK_PG_KIND(e) == RK_PG_LARGE) {
		uint64_t old = __atomic_fetch_or(map_entry(a, (uint64_t)page), RK_PG_MARK, __ATOMIC_RELAXED);
		return (old & RK_PG_MARK) ? 0 : 1;
	}
	struct rk_slab *s = page_addr(a, (uint64_t)page);
	if ((uintptr_t)p < s->first)
		return -EINVAL;
	uint64_t idx = ((uintptr_t)p - s->first) / rk_class_size[s->cls];
	if (idx >= s->nobjs)
		return -EINVAL;
	uint64_t bit = 1ull << (idx & 63);
	uint64_t old = atomic_fetch_or_explicit(&s->mark[idx / 64], bit, memory_order_relaxed);
	return (old & bit) ? 0 : 1;
}

/* Marks must be cleared before the next recovery; the flag in the header
 * survives a death in the middle of this one. */
static void note_marks_set(struct rk_arena *a)
{
	a->marks_set = true;
	a->hdr->marks_dirty = 1;
}

int rk_mark(rk_arena *a, const void *p)
{
	uint64_t e;
	if (!a || !p)
		return -EINVAL;
	if (!a->sweep_pending)
		return -EPERM; /* marks only mean something during recovery */
	int64_t page = run_of(a, p, &e);
	if (page < 0)
		return -EINVAL;
	uint32_t wp = rk_wp_write_begin(a);
	int r = mark_in_run(a, page, e, p);
	if (r == 1 && !a->marks_set)
		note_marks_set(a);
	rk_wp_write_end(wp);
	return r;
}

static void born_marked(struct rk_arena *a, void *p)
{
	uint64_t e;
	int64_t page = run_of(a, p, &e);
	if (page >= 0 && mark_in_run(a, page, e, p) == 1 && !a->marks_set)
		note_marks_set(a);
}

/* ---- pending allocations (struct rk_tcache says what they are) ------------
 * The order of the stores keeps the log right at every instruction, for a
 * thread killed anywhere outside the allocator's critical sections:
 *   alloc: tag the block, log it, clear its stamp, then pop it from the bin
 *          (the commit);
 *   free:  push the block on the bin (the commit), then stamp it.
 * A thread killed between the steps leaves a free block that is the head of
 * one of its bins, tagged and unstamped; the warm start drops the log
 * entries of such blocks (rk_pending_collect).  Every other logged object
 * that is unstamped and still carries its cache's tag is allocated, by that
 * cache since its last commit: pending. */

static inline unsigned tc_tag(const struct rk_arena *a, const struct rk_tcache *tc)
{
	return (unsigned)(tc - a->hdr->tcaches) + 1;
}

/* The tag byte of the object p of the slab at page, of class cls. */
static inline _Atomic uint8_t *slab_tag(struct rk_arena *a, uint64_t page, unsigned cls, const void *p)
{
	struct rk_slab *s = page_addr(a, page);
	uint64_t off = (uint64_t)((const char *)p - (const char *)s) - class_hdr[cls];
	return &s->tag[(off * class_recip[cls]) >> 40];
}

/* True if p is an object the cache with tag me allocated since its last
 * commit and nobody freed or kept since (*page, *e: its run). */
static bool still_pending(struct rk_arena *a, const void *p, unsigned me, int64_t *page, uint64_t *e)
{
	*page = run_of(a, p, e);
	if (*page < 0 || !object_start(a, *page, *e, p))
		return false;
	if (RK_PG_KIND(*e) == RK_PG_LARGE)
		return RK_PG_TAG(*e) == me; /* a freed run loses its entry */
	_Atomic uint8_t *t = slab_tag(a, (uint64_t)*page, RK_PG_CLASS(*e), p);
	return atomic_load_explicit(t, memory_order_relaxed) == me &&
	       ((const struct rk_free_block *)p)->stamp != rk_free_stamp(a, t);
}

static void object_set_tag(struct rk_arena *a, int64_t page, uint64_t e, const void *p, unsigned tag)
{
	if (RK_PG_KIND(e) == RK_PG_LARGE) {
		uint64_t *m = map_entry(a, (uint64_t)page);
		/* atomic: rk_mark may set the mark bit of the same entry */
		__atomic_fetch_and(m, ~RK_PG_TAG_MASK, __ATOMIC_RELAXED);
		if (tag)
			__atomic_fetch_or(m, (uint64_t)tag << RK_PG_TAG_SHIFT, __ATOMIC_RELAXED);
	} else {
		atomic_store_explicit(slab_tag(a, (uint64_t)page, RK_PG_CLASS(e), p), (uint8_t)tag,
				      memory_order_relaxed);
	}
}

/* Deduplicates v[0..n) in place, keeping the first of each value and the
 * order (a small open-addressing set on the stack). */
static uint32_t dedupe_in_order(uint64_t *v, uint32_t n)
{
	uint64_t set[2 * RK_PENDING_LOG];
	memset(set, 0, sizeof set);
	uint32_t j = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t x = v[i];
		unsigned h = (unsigned)(((x >> 4) * 0x9e3779b97f4a7c15ull) >> 56) % (2 * RK_PENDING_LOG);
		bool dup = false;
		while (set[h]) {
			if (set[h] == x) {
				dup = true;
				break;
			}
			h = (h + 1) % (2 * RK_PENDING_LOG);
		}
		if (dup)
			continue;
		set[h] = x;
		v[j++] = x; /* j <= i: an entry moves down only, so no entry is ever lost */
	}
	return j;
}

/* The log is full: its older half goes (those objects are committed early:
 * if still allocated at a failure, they leak; counted in overflow).  No
 * object is looked at, so a thread that never commits pays one move of an
 * entry per allocation.  Entries move down only, then the count drops: a
 * thread killed in the middle leaves every kept entry at least once. */
static __attribute__((noinline)) uint32_t log_make_room(struct rk_tcache *tc)
{
	const uint32_t keep = RK_PENDING_LOG / 2;
	for (uint32_t i = 0; i < keep; i++)
		tc->log[i] = tc->log[RK_PENDING_LOG - keep + i];
	tc->overflow += RK_PENDING_LOG - keep;
	atomic_signal_fence(memory_order_release);
	tc->nlog = keep;
	return keep;
}

static inline void log_append(struct rk_arena *a, struct rk_tcache *tc, const void *p)
{
	uint32_t n = tc->nlog;
	if (RK_UNLIKELY(n >= RK_PENDING_LOG))
		n = log_make_room(tc);
	tc->log[n] = (uint64_t)(uintptr_t)p;
	atomic_signal_fence(memory_order_release); /* the entry, then the count */
	tc->nlog = n + 1;
	rk_tls_pending |= 1u << a->index;
}

/* A free by the thread that allocated p last: if p is the newest entry, it
 * leaves the log (a temporary allocated and freed between two commits then
 * costs no room). */
static inline void log_forget_newest(struct rk_tcache *tc, const void *p)
{
	uint32_t n = tc->nlog;
	if (n && n <= RK_PENDING_LOG && tc->log[n - 1] == (uint64_t)(uintptr_t)p)
		tc->nlog = n - 1;
}

/* An allocation from the bin (b, its head): tag, log, unstamp; then the
 * caller pops it (the commit).  The stamp says where the tag byte is. */
static inline void note_alloc(struct rk_arena *a, struct rk_tcache *tc, struct rk_free_block *b)
{
	uintptr_t t = (uintptr_t)(b->stamp ^ a->free_key);
	if (RK_UNLIKELY(t - (uintptr_t)a->hdr >= a->hdr_max))
		return; /* not a stamped block (a corrupt list): untracked */
	atomic_store_explicit((_Atomic uint8_t *)t, (uint8_t)tc_tag(a, tc), memory_order_relaxed);
	log_append(a, tc, b);
	b->stamp = 0;
}

static void log_commit(struct rk_arena *a, struct rk_tcache *tc)
{
	uint32_t wp = rk_wp_write_begin(a);
	tc->nlog = 0;
	tc->overflow = 0;
	rk_wp_write_end(wp);
}

void rk_pending_commit(void)
{
	uint32_t m = rk_tls_pending;
	while (m) {
		unsigned i = (unsigned)__builtin_ctz(m);
		m &= m - 1;
		struct rk_tcache *tc = tls_tc[i];
		if (tc && rk_g.arenas[i].hdr)
			log_commit(&rk_g.arenas[i], tc);
	}
	rk_tls_pending = 0;
}

void rk_commit(void)
{
	rk_pending_commit();
}

int rk_keep(rk_arena *a, const void *p)
{
	uint64_t e;
	if (!a || !a->hdr || !p)
		return -EINVAL;
	int64_t page = run_of(a, p, &e);
	if (page < 0 || !object_start(a, page, e, p))
		return -EINVAL;
	uint32_t wp = rk_wp_write_begin(a);
	object_set_tag(a, page, e, p, 0);
	rk_wp_write_end(wp);
	return 0;
}

/* ---- slabs and central lists (class lock held) ---------------------------- */

static struct rk_free_block *slab_new(struct rk_arena *a, unsigned cls, struct rk_free_block **tail,
				      uint64_t *n)
{
	uint64_t npages = class_slab_pages[cls];
	rk_lock_acquire(a, &a->hdr->heap_lock);
	uint64_t page = run_alloc_locked(a, npages);
	if (page)
		run_set_used(a, page, npages, RK_PG_MAKE(RK_PG_SLAB, cls, npages));
	rk_lock_release(a, &a->hdr->heap_lock);
	if (!page)
		return NULL;
	struct rk_slab *s = page_addr(a, page);
	uint32_t size = rk_class_size[cls];
	uint64_t first = (uint64_t)(uintptr_t)s + class_hdr[cls];
	uint64_t nobjs = class_span[cls] / size;
	memset(s, 0, class_hdr[cls]); /* the tags too: no object is allocated */
	s->magic = RK_SLAB_MAGIC;
	s->cls = cls;
	s->nobjs = (uint32_t)nobjs;
	s->npages = (uint32_t)npages;
	s->first = first;
	for (uint64_t i = 0; i < nobjs; i++) {
		struct rk_free_block *b = (struct rk_free_block *)(uintptr_t)(first + i * size);
		b->next = i + 1 < nobjs ? (struct rk_free_block *)(uintptr_t)(first + (i + 1) * size) : NULL;
		b->stamp = rk_free_stamp(a, &s->tag[i]);
	}
	*tail = (struct rk_free_block *)(uintptr_t)(first + (nobjs - 1) * size);
	*n = nobjs;
	a->hdr->classes[cls].slabs++;
	return (struct rk_free_block *)(uintptr_t)first;
}

/* Takes up to want blocks from the class (class lock held): returns a
 * NULL-terminated chain, or NULL if no slab could be made. */
static struct rk_free_block *central_take_locked(struct rk_arena *a, unsigned cls, uint32_t want, uint32_t *got)
{
	struct rk_class_state *c = &a->hdr->classes[cls];
	if (!c->head) {
		struct rk_free_block *tail;
		uint64_t n;
		struct rk_free_block *chain = slab_new(a, cls, &tail, &n);
		if (!chain) {
			*got = 0;
			return NULL;
		}
		c->head = chain;
		c->count += n;
	}
	struct rk_free_block *first = c->head, *last = first;
	uint32_t k = 1;
	while (k < want && last->next) {
		last = last->next;
		k++;
	}
	c->head = last->next;
	c->count -= k;
	last->next = NULL;
	*got = k;
	return first;
}

/* One block for a thread without a cache. */
static struct rk_free_block *central_take_one(struct rk_arena *a, unsigned cls)
{
	struct rk_class_state *c = &a->hdr->classes[cls];
	uint32_t got;
	rk_lock_acquire(a, &c->lock);
	struct rk_free_block *b = central_take_locked(a, cls, 1, &got);
	if (b) { /* untracked: no log holds it, so no tag either */
		uintptr_t t = (uintptr_t)(b->stamp ^ a->free_key);
		if (t - (uintptr_t)a->hdr < a->hdr_max)
			atomic_store_explicit((_Atomic uint8_t *)t, 0, memory_order_relaxed);
		b->stamp = 0;
	}
	rk_lock_release(a, &c->lock);
	return b;
}

/* Fills the (empty) bin with up to want blocks.  The bin takes the chain
 * inside the class's critical section: a thread killed anywhere leaves the
 * blocks on one list or the other, or the lock held (the arena is then
 * refused), never on neither. */
static bool central_refill(struct rk_arena *a, unsigned cls, struct rk_tcache_bin *bin, uint32_t want)
{
	struct rk_class_state *c = &a->hdr->classes[cls];
	uint32_t got;
	rk_lock_acquire(a, &c->lock);
	struct rk_free_block *chain = central_take_locked(a, cls, want, &got);
	if (chain) {
		bin->count = got;
		bin->head = chain;
	}
	rk_lock_release(a, &c->lock);
	return chain != NULL;
}

/* A free from no cache: the block goes back and is stamped in one critical
 * section.  tag: its tag byte. */
static void central_put_one(struct rk_arena *a, unsigned cls, struct rk_free_block *b, _Atomic uint8_t *tag)
{
	struct rk_class_state *c = &a->hdr->classes[cls];
	rk_lock_acquire(a, &c->lock);
	b->next = c->head;
	b->stamp = rk_free_stamp(a, tag);
	c->head = b;
	c->count++;
	rk_lock_release(a, &c->lock);
}

/* ---- thread caches --------------------------------------------------------- */

static void tcache_thread_exit(void *unused)
{
	(void)unused;
	for (unsigned i = 0; i < RK_MAX_ARENAS; i++) {
		struct rk_tcache *tc = tls_tc[i];
		if (!tc)
			continue;
		struct rk_arena *a = &rk_g.arenas[i];
		tls_tc[i] = NULL;
		if (!a->hdr)
			continue;
		uint32_t wp = rk_wp_write_begin(a);
		tc->nlog = 0; /* what the thread leaves behind is committed */
		tc->overflow = 0;
		rk_tcache_flush_all(a, tc);
		atomic_store_explicit(&tc->owner, 0, memory_order_release);
		rk_wp_write_end(wp);
	}
	rk_tls_pending = 0;
}

static void tc_key_create(void)
{
	(void)pthread_key_create(&tc_key, tcache_thread_exit);
	(void)pthread_atfork(NULL, NULL, after_fork_child);
}

void rk_tcache_release(struct rk_arena *a)
{
	struct rk_tcache *tc = tls_tc[a->index];
	if (!tc)
		return;
	uint32_t wp = rk_wp_write_begin(a);
	tc->nlog = 0; /* committed */
	tc->overflow = 0;
	rk_tcache_flush_all(a, tc);
	atomic_store_explicit(&tc->owner, 0, memory_order_release);
	rk_wp_write_end(wp);
	tls_tc[a->index] = NULL;
	rk_tls_pending &= ~(1u << a->index);
}

void rk_tcache_forget_thread(void)
{
	memset(tls_tc, 0, sizeof tls_tc);
	rk_tls_pending = 0;
}

/* Moves the first k blocks of the bin to the central list, inside the
 * class's critical section (as central_refill). */
static void bin_flush(struct rk_arena *a, unsigned cls, struct rk_tcache_bin *b, uint32_t k)
{
	struct rk_class_state *c = &a->hdr->classes[cls];
	struct rk_free_block *first = b->head, *last = first;
	for (uint32_t i = 1; i < k; i++)
		last = last->next;
	rk_lock_acquire(a, &c->lock);
	b->head = last->next;
	b->count -= k;
	last->next = c->head;
	c->head = first;
	c->count += k;
	rk_lock_release(a, &c->lock);
}

void rk_tcache_flush_all(struct rk_arena *a, struct rk_tcache *tc)
{
	for (unsigned c = 0; c < RK_NCLASSES; c++) {
		struct rk_tcache_bin *b = &tc->bins[c];
		uint32_t k = 0;
		for (struct rk_free_block *p = b->head; p; p = p->next)
			k++;
		if (k)
			bin_flush(a, c, b, k);
		b->head = NULL;
		b->count = 0;
	}
	atomic_fetch_add_explicit(&a->hdr->allocated_bytes, (uint64_t)tc->alloc_delta, memory_order_relaxed);
	tc->alloc_delta = 0;
}

struct rk_tcache *rk_tcache_current(struct rk_arena *a)
{
	struct rk_tcache *tc = tls_tc[a->index];
	if (tc)
		return tc;
	uint32_t me = rk_gettid();
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++) {
		struct rk_tcache *t = &a->hdr->tcaches[i];
		uint32_t expect = 0;
		if (atomic_load_explicit(&t->owner, memory_order_relaxed) != 0 ||
		    !atomic_compare_exchange_strong(&t->owner, &expect, me))
			continue;
		memset(t->bins, 0, sizeof t->bins);
		t->alloc_delta = 0;
		t->nlog = 0;
		t->overflow = 0;
		tls_tc[a->index] = t;
		if (!tls_key_set) {
			pthread_once(&tc_key_once, tc_key_create);
			(void)pthread_setspecific(tc_key, (void *)1);
			tls_key_set = true;
		}
		return t;
	}
	return NULL; /* all slots taken: this thread uses the central lists */
}

/* ---- public allocation API ------------------------------------------------ */

static void *small_alloc_slow(struct rk_arena *a, unsigned cls)
{
	struct rk_tcache *tc = rk_tcache_current(a);
	if (!tc) {
		struct rk_free_block *b = central_take_one(a, cls);
		if (!b) {
			errno = ENOMEM;
			return NULL;
		}
		atomic_fetch_add_explicit(&a->hdr->allocated_bytes, rk_class_size[cls], memory_order_relaxed);
		return b;
	}
	struct rk_tcache_bin *bin = &tc->bins[cls];
	if (!bin->head && !central_refill(a, cls, bin, class_refill[cls])) {
		errno = ENOMEM;
		return NULL;
	}
	struct rk_free_block *b = bin->head;
	note_alloc(a, tc, b);
	bin->head = b->next; /* commit */
	bin->count--;
	tc->alloc_delta += rk_class_size[cls];
	return b;
}

static void *large_alloc(struct rk_arena *a, size_t n)
{
	uint64_t npages = RK_ALIGN_UP((uint64_t)n, RK_PAGE) / RK_PAGE;
	if (n > a->hdr->max_bytes || npages == 0) {
		errno = ENOMEM;
		return NULL;
	}
	struct rk_tcache *tc = rk_tcache_current(a); /* its log; NULL: untracked */
	rk_lock_acquire(a, &a->hdr->heap_lock);
	uint64_t page = run_alloc_locked(a, npages);
	if (page) {
		/* tagged and logged inside the critical section: a death there
		 * refuses the arena, so no order of the stores matters */
		uint64_t tag = tc ? tc_tag(a, tc) : 0;
		run_set_used(a, page, npages, RK_PG_MAKE(RK_PG_LARGE, 0, npages) | tag << RK_PG_TAG_SHIFT);
		if (tc)
			log_append(a, tc, page_addr(a, page));
	}
	rk_lock_release(a, &a->hdr->heap_lock);
	if (!page)
		return NULL;
	atomic_fetch_add_explicit(&a->hdr->allocated_bytes, npages * RK_PAGE, memory_order_relaxed);
	return page_addr(a, page);
}

static inline void *alloc_body(rk_arena *a, size_t n)
{
	void *p;
	if (RK_LIKELY(n <= RK_SMALL_MAX)) {
		unsigned cls = class_of_16[(n + 15) >> 4];
		struct rk_tcache *tc = tls_tc[a->index];
		struct rk_free_block *b;
		if (RK_LIKELY(tc && (b = tc->bins[cls].head) != NULL)) {
			note_alloc(a, tc, b);
			tc->bins[cls].head = b->next; /* commit */
			/* The next allocation of the class reads the new head's
			 * link and stamp: fetch its line now (a block that came
			 * from a slab or the central list is cold). */
			__builtin_prefetch(b->next, 1);
			tc->bins[cls].count--;
			tc->alloc_delta += rk_class_size[cls];
			p = b;
		} else {
			p = small_alloc_slow(a, cls);
		}
	} else {
		p = large_alloc(a, n);
	}
	if (RK_UNLIKELY(a->sweep_pending) && p)
		born_marked(a, p);
	return p;
}

void *rk_alloc(rk_arena *a, size_t n)
{
	if (RK_UNLIKELY(!a || !a->hdr)) {
		errno = EINVAL;
		return NULL;
	}
	uint32_t wp = rk_wp_write_begin(a);
	void *p = alloc_body(a, n);
	rk_wp_write_end(wp);
	return p;
}

void *rk_calloc(rk_arena *a, size_t nmemb, size_t size)
{
	size_t n;
	if (__builtin_mul_overflow(nmemb, size, &n)) {
		errno = ENOMEM;
		return NULL;
	}
	void *p = rk_alloc(a, n);
	if (p) {
		uint32_t wp = rk_wp_write_begin(a);
		memset(p, 0, n);
		rk_wp_write_end(wp);
	}
	return p;
}

static void bad_pointer(struct rk_arena *a, const char *op, const void *p)
{
	struct rk_ev e;
	rk_ev_begin(&e, "error");
	rk_ev_str(&e, "what", "invalid pointer, ignored");
	rk_ev_str(&e, "op", op);
	rk_ev_str(&e, "arena", a->name);
	rk_ev_hex(&e, "ptr", (uint64_t)(uintptr_t)p);
	rk_ev_end(&e);
}

static inline void free_body(rk_arena *a, void *p)
{
	uint64_t e;
	int64_t page = run_of(a, p, &e);
	if (RK_UNLIKELY(page < 0 || !object_start(a, page, e, p))) {
		bad_pointer(a, "rk_free", p);
		return;
	}
	if (RK_LIKELY(RK_PG_KIND(e) == RK_PG_SLAB)) {
		unsigned cls = RK_PG_CLASS(e);
		struct rk_free_block *b = p;
		struct rk_tcache *tc = tls_tc[a->index];
		_Atomic uint8_t *tag = slab_tag(a, (uint64_t)page, cls, p);
		if (RK_UNLIKELY(!tc) && !(tc = rk_tcache_current(a))) {
			central_put_one(a, cls, b, tag);
			atomic_fetch_sub_explicit(&a->hdr->allocated_bytes, rk_class_size[cls], memory_order_relaxed);
			return;
		}
		struct rk_tcache_bin *bin = &tc->bins[cls];
		if (RK_UNLIKELY(bin->count >= class_tc_limit[cls]))
			bin_flush(a, cls, bin, bin->count / 2 ? bin->count / 2 : 1);
		b->next = bin->head;
		atomic_signal_fence(memory_order_release); /* link before publish */
		bin->head = b;                             /* commit */
		atomic_signal_fence(memory_order_release); /* then the stamp: see "pending allocations" */
		b->stamp = rk_free_stamp(a, tag);
		/* The block is the bin's next allocation, which writes its tag
		 * byte in the slab header: fetch that line now, so a reused block
		 * does not cost a miss then (the caller's object was hot, its
		 * slab header rarely is). */
		__builtin_prefetch(tag, 1);
		bin->count++;
		tc->alloc_delta -= rk_class_size[cls];
		log_forget_newest(tc, p);
		return;
	}
	uint64_t npages = RK_PG_N(e);
	struct rk_tcache *tc = tls_tc[a->index];
	rk_lock_acquire(a, &a->hdr->heap_lock);
	rk_run_free(a, (uint64_t)page, npages); /* its tag goes with its page-map entry */
	if (tc)
		log_forget_newest(tc, p);
	rk_lock_release(a, &a->hdr->heap_lock);
	atomic_fetch_sub_explicit(&a->hdr->allocated_bytes, npages * RK_PAGE, memory_order_relaxed);
}

void rk_free(rk_arena *a, void *p)
{
	if (!p || !a || !a->hdr)
		return;
	uint32_t wp = rk_wp_write_begin(a);
	free_body(a, p);
	rk_wp_write_end(wp);
}

size_t rk_usable_size(rk_arena *a, const void *p)
{
	uint64_t e;
	if (!a || !p)
		return 0;
	int64_t page = run_of(a, p, &e);
	if (page < 0 || !object_start(a, page, e, p))
		return 0; /* not a pointer rk_alloc returned */
	if (RK_PG_KIND(e) == RK_PG_SLAB)
		return rk_class_size[RK_PG_CLASS(e)];
	return RK_PG_N(e) * RK_PAGE;
}

size_t rk_alloc_size(size_t n)
{
	if (n <= RK_SMALL_MAX)
		return rk_class_size[class_of_16[(n + 15) >> 4]];
	if (n > SIZE_MAX - RK_PAGE)
		return 0; /* rk_alloc fails */
	return RK_ALIGN_UP((uint64_t)n, RK_PAGE);
}

void *rk_realloc(rk_arena *a, void *p, size_t n)
{
	if (!p)
		return rk_alloc(a, n);
	if (n == 0) {
		rk_free(a, p);
		return NULL;
	}
	size_t have = rk_usable_size(a, p);
	if (have == 0) {
		bad_pointer(a, "rk_realloc", p);
		errno = EINVAL;
		return NULL;
	}
	/* Keep the block when it fits and is not more than twice too big. */
	if (n <= have && (have <= 16 || n > have / 2))
		return p;
	void *q = rk_alloc(a, n);
	if (!q)
		return NULL;
	uint32_t wp = rk_wp_write_begin(a);
	memcpy(q, p, n < have ? n : have);
	rk_wp_write_end(wp);
	rk_free(a, p);
	return q;
}

int rk_arena_stats(const rk_arena *a, struct rk_arena_stats *out)
{
	if (!a || !a->hdr || !out)
		return -EINVAL;
	const struct rk_arena_hdr *h = a->hdr;
	int64_t alloc = (int64_t)atomic_load_explicit(&h->allocated_bytes, memory_order_relaxed);
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++)
		if (atomic_load_explicit(&h->tcaches[i].owner, memory_order_relaxed))
			alloc += h->tcaches[i].alloc_delta;
	out->base = h->base;
	out->max_bytes = h->max_bytes;
	out->mapped_bytes = h->committed;
	out->heap_bytes = h->top;
	out->allocated_bytes = alloc > 0 ? (uint64_t)alloc : 0;
	return 0;
}

/* ---- the pending objects of a dead incarnation ----------------------------- */

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

/* The heads of the dead caches' bins: the only free blocks a log can hold
 * with its cache's tag still on them.  rk_init is single-threaded. */
static uint64_t dead_heads[RK_MAX_TCACHES * RK_NCLASSES];

uint64_t rk_pending_collect(struct rk_arena *a, uint64_t *overflow)
{
	struct rk_arena_hdr *h = a->hdr;
	size_t nh = 0;
	uint64_t found = 0;
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++)
		if (atomic_load(&h->tcaches[i].owner))
			for (unsigned c = 0; c < RK_NCLASSES; c++)
				if (h->tcaches[i].bins[c].head)
					dead_heads[nh++] = (uint64_t)(uintptr_t)h->tcaches[i].bins[c].head;
	qsort(dead_heads, nh, sizeof dead_heads[0], cmp_u64);
	/* A head may be unstamped (its thread died in one of the windows): it
	 * is free, so stamp it before it goes to the central list, where the
	 * next allocation reads its stamp for the address of its tag. */
	for (size_t k = 0; k < nh; k++) {
		void *b = (void *)(uintptr_t)dead_heads[k];
		uint64_t e;
		int64_t page = run_of(a, b, &e);
		if (page >= 0 && RK_PG_KIND(e) == RK_PG_SLAB && object_start(a, page, e, b))
			((struct rk_free_block *)b)->stamp =
				rk_free_stamp(a, slab_tag(a, (uint64_t)page, RK_PG_CLASS(e), b));
	}
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++) {
		struct rk_tcache *tc = &h->tcaches[i];
		if (!atomic_load(&tc->owner))
			continue;
		unsigned me = tc_tag(a, tc);
		uint32_t n = tc->nlog < RK_PENDING_LOG ? tc->nlog : RK_PENDING_LOG, j = 0;
		for (uint32_t k = 0; k < n; k++) {
			uint64_t p = tc->log[k], e;
			int64_t page;
			if (!still_pending(a, (const void *)(uintptr_t)p, me, &page, &e))
				continue; /* freed or kept since, or not an object */
			if (bsearch(&p, dead_heads, nh, sizeof dead_heads[0], cmp_u64)) {
				/* its thread died between tagging and taking it, or
				 * between giving it back and stamping it: it is free */
				object_set_tag(a, page, e, (const void *)(uintptr_t)p, 0);
				continue;
			}
			tc->log[j++] = p;
		}
		j = dedupe_in_order(tc->log, j);
		tc->nlog = j;
		found += j;
		*overflow += tc->overflow;
	}
	return found;
}

/* Frees a pending object of a dead thread, from no cache: the block and its
 * tag change in one critical section. */
static uint64_t free_orphan(struct rk_arena *a, int64_t page, uint64_t e, void *p)
{
	if (RK_PG_KIND(e) == RK_PG_SLAB) {
		unsigned cls = RK_PG_CLASS(e);
		central_put_one(a, cls, p, slab_tag(a, (uint64_t)page, cls, p));
		return rk_class_size[cls];
	}
	uint64_t npages = RK_PG_N(e);
	rk_lock_acquire(a, &a->hdr->heap_lock);
	rk_run_free(a, (uint64_t)page, npages);
	rk_lock_release(a, &a->hdr->heap_lock);
	return npages * RK_PAGE;
}

static uint64_t pending_walk(struct rk_arena *a, bool free_them, bool release, struct rk_ptrvec *list,
			     uint64_t *bytes)
{
	struct rk_arena_hdr *h = a->hdr;
	uint64_t count = 0, freed = 0;
	for (unsigned i = 0; i < RK_MAX_TCACHES; i++) {
		struct rk_tcache *tc = &h->tcaches[i];
		if (atomic_load(&tc->owner) != RK_TC_ORPHAN)
			continue;
		unsigned me = tc_tag(a, tc);
		uint32_t n = tc->nlog < RK_PENDING_LOG ? tc->nlog : RK_PENDING_LOG;
		for (uint32_t k = 0; k < n; k++) {
			void *p = (void *)(uintptr_t)tc->log[k];
			uint64_t e;
			int64_t page;
			if (!still_pending(a, p, me, &page, &e))
				continue; /* the app freed or kept it during recovery */
			count++;
			uint64_t size = RK_PG_KIND(e) == RK_PG_LARGE ? RK_PG_N(e) * RK_PAGE : rk_class_size[RK_PG_CLASS(e)];
			*bytes += size;
			if (list)
				rk_ptrvec_push(list, (uint64_t)(uintptr_t)p);
			if (free_them)
				freed += free_orphan(a, page, e, p);
		}
		if (!release)
			continue;
		tc->nlog = 0;
		tc->overflow = 0;
		atomic_store(&tc->owner, 0);
	}
	if (freed)
		atomic_fetch_sub_explicit(&h->allocated_bytes, freed, memory_order_relaxed);
	return count;
}

uint64_t rk_pending_settle(struct rk_arena *a, bool free_them, uint64_t *bytes)
{
	return pending_walk(a, free_them, true, NULL, bytes);
}

uint64_t rk_pending_list(struct rk_arena *a, struct rk_ptrvec *list, uint64_t *bytes)
{
	return pending_walk(a, false, false, list, bytes);
}

bool rk_object_marked(struct rk_arena *a, const void *p)
{
	uint64_t e;
	int64_t page = run_of(a, p, &e);
	if (page < 0 || !object_start(a, page, e, p))
		return false;
	if (RK_PG_KIND(e) == RK_PG_LARGE)
		return (e & RK_PG_MARK) != 0;
	struct rk_slab *s = page_addr(a, (uint64_t)page);
	uint64_t idx = ((uintptr_t)p - s->first) / rk_class_size[s->cls];
	return (atomic_load_explicit(&s->mark[idx / 64], memory_order_relaxed) >> (idx % 64)) & 1;
}

bool rk_ptrvec_push(struct rk_ptrvec *v, uint64_t x)
{
	if (v->n == v->cap) {
		size_t ncap = v->cap ? 2 * v->cap : 256;
		uint64_t *nv = realloc(v->v, ncap * sizeof *nv);
		if (!nv)
			return false;
		v->v = nv;
		v->cap = ncap;
	}
	v->v[v->n++] = x;
	return true;
}
