/* rk_internal.h - what the runtime's files share.  One section per .c file,
 * headed by its name, declares what that file defines for the others
 * (layouts, variables, functions; the public API is rekindle.h).  The
 * sections go from the bottom layer up, so that each one's declarations use
 * only what is declared above them:
 *
 *   helpers            log.c fds.c options.c
 *   arenas             arena.c alloc.c sweep.c pkeys.c
 *   preserved state    ranges.c manifest.c statics.c control.c supervisor_link.c
 *   an incarnation     init.c recovery.c prefault.c crosscheck.c stages.c
 *   the restart        restart.c teardown.c signals.c
 */
#ifndef RK_INTERNAL_H
#define RK_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define RK_INTERNAL
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "rekindle.h"

#define RK_PAGE 4096ull
#define RK_ALIGN_UP(x, a) (((x) + (a)-1) & ~((uint64_t)(a)-1))
#define RK_LIKELY(x) __builtin_expect(!!(x), 1)
#define RK_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define RK_HIDDEN __attribute__((visibility("hidden")))

/* The runtime's own code, from the linker (objcopy renames the runtime's
 * .text to rk_text): a fault there makes a restart cold (restart.c). */
extern char __start_rk_text[] __attribute__((weak)) RK_HIDDEN;
extern char __stop_rk_text[] __attribute__((weak)) RK_HIDDEN;

/* ---- log.c: async-signal-safe JSON event lines ---- */
struct rk_ev {
	char buf[1024];
	size_t len;
};
void rk_ev_begin(struct rk_ev *e, const char *event) RK_HIDDEN;
void rk_ev_str(struct rk_ev *e, const char *key, const char *val) RK_HIDDEN;
void rk_ev_u64(struct rk_ev *e, const char *key, uint64_t v) RK_HIDDEN;
void rk_ev_i64(struct rk_ev *e, const char *key, int64_t v) RK_HIDDEN;
void rk_ev_hex(struct rk_ev *e, const char *key, uint64_t v) RK_HIDDEN;
void rk_ev_end(struct rk_ev *e) RK_HIDDEN; /* writes the line to stderr */
size_t rk_strlcpy(char *dst, const char *src, size_t cap) RK_HIDDEN;
size_t rk_strlcat(char *dst, const char *src, size_t cap) RK_HIDDEN;
size_t rk_fmt_u64(char *dst, uint64_t v) RK_HIDDEN;
const char *rk_signame(int sig) RK_HIDDEN;
#ifndef SEGV_PKUERR
#define SEGV_PKUERR 4 /* a protection-key fault; older libc headers lack it */
#endif
/* si_code by name ("SEGV_PKUERR", "SI_USER", ...). Async-signal-safe. */
const char *rk_si_code_name(int sig, int code) RK_HIDDEN;

/* ---- fds.c: what an fd is, and whether it survives an exec ---- */
/* True if fd is a memfd whose /proc/self/fd link starts with want ("/memfd:
 * rekindle:..."); with exact, the name must end there too. */
bool rk_fd_is_memfd(int fd, const char *want, bool exact) RK_HIDDEN;
/* True if fd is a memfd or another shmem file (F_GET_SEALS accepts it). */
bool rk_fd_is_shmem(int fd) RK_HIDDEN;
/* st_dev and st_ino of fd's file (0 if fstat fails); async-signal-safe. */
void rk_fd_file_id(int fd, uint64_t *dev, uint64_t *ino) RK_HIDDEN;
/* True if fd refers to exactly that file. */
bool rk_fd_is_file(int fd, uint64_t dev, uint64_t ino) RK_HIDDEN; /* async-signal-safe too */
/* Sets or clears FD_CLOEXEC (a failed F_GETFD: left alone); async-signal-safe. */
void rk_fd_set_cloexec(int fd, bool on) RK_HIDDEN;

/* ---- options.c: every setting, parsed once at the start of rk_init ---- */
struct rk_config {
	unsigned flags;             /* rk_options.flags: RK_OPT_* */
	uint64_t arena_base;        /* start of the address range reserved for arenas */
	unsigned crashloop_ms;      /* a failure this soon after a warm restart goes cold; 0: no window */
	unsigned max_fast_failures; /* consecutive quick failures before giving up */
	int restart_signal;         /* the supervisor's request for a restart; 0: none */
	bool sync_teardown;         /* no teardown helper (for measurements) */
	unsigned exec_pool_kb;      /* the exec page pool; 0: none */
	unsigned listen_fds;        /* fds 3.. of socket activation, kept open by a restart */
	uint64_t stages_tear_at;    /* stages.c's fault injection; 0: off */
	unsigned hang_timeout_ms;   /* the supervisor's --hang-timeout; 0: none */
};
extern struct rk_config rk_cfg RK_HIDDEN;
/* Fills rk_cfg from opts (may be NULL) and the environment; each malformed
 * or out-of-range variable gets one warning event, and its default. */
void rk_options_parse(const struct rk_options *opts) RK_HIDDEN;

/* ---- arena.c: arenas, their layout and the address range they live in ----
 * [header | page map (8 B per page of max_bytes) | heap ...]
 * All allocator metadata lives in the arena, as absolute pointers (the arena
 * is always mapped at the same address).  Every metadata change happens under
 * a lock word held in the arena, except the per-thread cache lists, whose
 * single-store pushes and pops keep them consistent at every instruction; a
 * lock found held when an arena is inherited means a thread died inside the
 * allocator, and the arena is refused.
 */
#define RK_ARENA_MAGIC 0x414e4552414b5231ull /* "1RKARENA" little endian */
#define RK_ARENA_VERSION 1u
#define RK_NCLASSES 40
#define RK_SMALL_MAX 32768u
#define RK_MAX_ROOTS 64
#define RK_MAX_TCACHES 128
#define RK_TCACHE_MAX 64      /* blocks cached per class per thread */
#define RK_TCACHE_BATCH 32    /* blocks moved per refill / flush */
#define RK_TCACHE_MAX_BYTES (256u * 1024u) /* per class per thread */
#define RK_SLAB_MIN_PAGES 16  /* 64 KiB */
#define RK_RUN_BINS 64

typedef _Atomic uint32_t rk_lock;

/* A free slab block.  stamp = the arena's free_key XOR the address of the
 * block's tag byte: what tells a free block from an allocated one at a warm
 * start (an allocation clears it), and where an allocation finds the tag
 * without the page map. */
struct rk_free_block {
	struct rk_free_block *next;
	uint64_t stamp;
};

struct rk_tcache_bin {
	struct rk_free_block *head;
	uint32_t count;
	uint32_t limit;
};

/* Pending allocations (docs/design.md, "Cleanup"): each cache logs the
 * objects its thread allocates, and the thread's next commit (the end of any
 * unsafe region, rk_commit, rk_root_set) empties the log in one store.  Each
 * object carries the tag of the cache that last allocated it (slab: a byte
 * per object after the slab header; page run: bits of its page-map entry),
 * and each free slab block a stamp (struct rk_free_block).  A logged object
 * is still pending when it is not stamped free and its tag is still its
 * cache's.  A warm start frees the pending objects of the dead threads:
 * O(in flight), not O(arena). */
#define RK_PENDING_LOG 128 /* entries per cache; a full log drops its older half */
#define RK_TC_ORPHAN 0xffffffffu /* owner of a dead thread's cache whose pending objects wait for rk_finish_recovery */

struct rk_tcache {
	_Atomic uint32_t owner; /* tid of the owning thread, 0 = free slot, RK_TC_ORPHAN */
	uint32_t nlog;          /* entries in log[]; 0 = nothing pending */
	int64_t alloc_delta;    /* bytes allocated minus freed through this cache */
	uint64_t overflow;      /* entries a full log dropped since the last commit */
	struct rk_tcache_bin bins[RK_NCLASSES];
	uint64_t log[RK_PENDING_LOG]; /* objects allocated since the last commit (some since freed or kept) */
} __attribute__((aligned(64)));

struct rk_class_state {
	rk_lock lock;
	uint32_t pad_;
	struct rk_free_block *head; /* central free list */
	uint64_t count;
	uint64_t slabs;
} __attribute__((aligned(64)));

struct rk_root {
	char name[RK_NAME_MAX + 1];
	uint64_t ptr;
};

/* A free run of pages: links live in its first page. */
struct rk_free_run {
	struct rk_free_run *next, *prev;
};

struct rk_arena_hdr {
	/* immutable after creation, covered by hdr_checksum */
	uint64_t magic;
	uint32_t version;
	uint32_t page_size;
	uint64_t layout;        /* hash of class table and structure sizes */
	uint64_t base;
	uint64_t max_bytes;
	uint64_t map_offset;    /* page map, from base */
	uint64_t heap_offset;   /* first heap byte, from base */
	uint64_t created_ns;
	char name[RK_NAME_MAX + 1];
	uint64_t hdr_checksum;
	uint64_t free_key;      /* random, set at creation: see struct rk_free_block */

	/* roots, covered by roots_checksum (updated under root_lock) */
	rk_lock root_lock;
	uint32_t pad0_;
	uint64_t roots_checksum;
	struct rk_root roots[RK_MAX_ROOTS];

	/* page-run allocator, under heap_lock */
	rk_lock heap_lock __attribute__((aligned(64)));
	uint32_t marks_dirty;   /* marks were set and not yet cleared (survives a death mid-recovery) */
	uint64_t top;           /* heap bytes carved so far (from heap_offset) */
	uint64_t committed;     /* memfd size */
	_Atomic uint64_t allocated_bytes;
	struct rk_free_run *run_bins[RK_RUN_BINS];

	struct rk_class_state classes[RK_NCLASSES];
	struct rk_tcache tcaches[RK_MAX_TCACHES];
};

/* Page map entry: what the page at this index holds. */
enum rk_page_kind { RK_PG_NONE = 0, RK_PG_SLAB = 1, RK_PG_LARGE = 2, RK_PG_CONT = 3, RK_PG_FREE = 4 };
#define RK_PG_KIND(e) ((uint32_t)((e) & 0xf))
#define RK_PG_CLASS(e) ((uint32_t)(((e) >> 4) & 0xff))
#define RK_PG_MARK 0x1000ull
/* A page run's allocation tag (the first page's entry): see struct rk_tcache. */
#define RK_PG_TAG_SHIFT 16
#define RK_PG_TAG_MASK (0xffull << RK_PG_TAG_SHIFT)
#define RK_PG_TAG(e) ((uint32_t)(((e) >> RK_PG_TAG_SHIFT) & 0xff))
#define RK_PG_N(e) ((uint64_t)((e) >> 32)) /* run pages, or back offset for CONT */
#define RK_PG_MAKE(kind, cls, n) ((uint64_t)(kind) | ((uint64_t)(cls) << 4) | ((uint64_t)(n) << 32))

/* Slab header, at the start of every slab run. */
#define RK_SLAB_MAGIC 0x42414c53u
#define RK_SLAB_BITMAP_WORDS 64 /* up to 4096 objects */
struct rk_slab {
	uint32_t magic;
	uint32_t cls;
	uint32_t nobjs;
	uint32_t npages;
	uint64_t first;      /* address of object 0 */
	_Atomic uint64_t mark[RK_SLAB_BITMAP_WORDS];
	uint64_t scratch[RK_SLAB_BITMAP_WORDS]; /* free bits, used by the sweep */
	_Atomic uint8_t tag[]; /* per object: the allocating cache's index + 1, 0 = none (free, kept, committed untracked) */
};

/* Process-private handle. */
struct rk_arena {
	struct rk_arena_hdr *hdr;
	uint64_t *map;
	int fd;
	unsigned index;
	bool inherited;   /* mapped from the previous incarnation */
	bool reopened;    /* rk_arena_open called on it in this incarnation */
	bool sweep_pending; /* recovery: objects allocated now are born marked */
	bool marks_set;     /* a mark was set this recovery: they must be cleared */
	uint64_t free_key;         /* hdr->free_key */
	uint64_t pending_found;    /* warm start: the dead threads' pending objects */
	uint64_t pending_overflow; /* and the entries their full logs had dropped */
	unsigned flags;     /* RK_ARENA_* the app opened it with */
	int pkey;           /* protection key (RK_ARENA_WRITE_PROTECT), 0 = none */
	uint64_t hdr_max;   /* mapped length, kept apart from the header it maps */
	uint64_t dev, ino;  /* fd's file, taken when the runtime got the fd */
	char name[RK_NAME_MAX + 1];
};

uint64_t rk_arena_heap_offset(uint64_t max) RK_HIDDEN;
int rk_arena_format(struct rk_arena *a, const char *name, uint64_t base, uint64_t max) RK_HIDDEN;
int rk_arena_validate(struct rk_arena *a, uint64_t base, uint64_t max, char *why, size_t whylen) RK_HIDDEN;
void rk_arena_recover(struct rk_arena *a) RK_HIDDEN;
int rk_arena_grow(struct rk_arena *a, uint64_t need_top) RK_HIDDEN;
uint64_t rk_arena_hdr_checksum(const struct rk_arena_hdr *h) RK_HIDDEN;
uint64_t rk_arena_roots_checksum(const struct rk_arena_hdr *h) RK_HIDDEN;
uint64_t rk_fnv1a(const void *p, size_t n, uint64_t h) RK_HIDDEN;
uint64_t rk_hash_words(const void *p, size_t n) RK_HIDDEN; /* the manifest's checksum */
/* The address range of arenas (PROT_NONE where no arena is mapped). */
void *rk_arena_reserve_range(uint64_t base, uint64_t len) RK_HIDDEN;
/* Reserves address space for an arena of max bytes; returns its base or 0. */
uint64_t rk_arena_reserve_slot(uint64_t max) RK_HIDDEN;
void rk_arena_unreserve(uint64_t base, uint64_t max) RK_HIDDEN; /* back to PROT_NONE */
/* A formatted arena on fd at base, registered in this process only (the
 * cross-check validator's scratch arena). */
struct rk_arena *rk_arena_create_at(const char *name, int fd, uint64_t base, uint64_t max) RK_HIDDEN;
void rk_arena_drop(struct rk_arena *a) RK_HIDDEN; /* unmapped, closed, logged */

/* ---- alloc.c: the allocator inside arenas ---- */
extern uint32_t rk_class_size[RK_NCLASSES] RK_HIDDEN;
/* Bit k: this thread may have pending allocations in arena index k. */
extern __thread uint32_t rk_tls_pending __attribute__((tls_model("initial-exec"))) RK_HIDDEN;
/* Commits this thread's pending allocations, every arena (rk_commit). */
void rk_pending_commit(void) RK_HIDDEN;
/* The stamp of a free slab block whose tag byte is at tag. */
static inline uint64_t rk_free_stamp(const struct rk_arena *a, const void *tag)
{
	return a->free_key ^ (uint64_t)(uintptr_t)tag;
}
/* A warm start, before the dead caches are folded back: keeps in each dead
 * cache's log only the objects still pending (deduplicated), and returns how
 * many there are; adds to *overflow the entries their full logs dropped. */
uint64_t rk_pending_collect(struct rk_arena *a, uint64_t *overflow) RK_HIDDEN;
/* A growable array of addresses (malloc'd). */
struct rk_ptrvec {
	uint64_t *v;
	size_t n, cap;
};
bool rk_ptrvec_push(struct rk_ptrvec *v, uint64_t x) RK_HIDDEN; /* false: out of memory, not added */
/* rk_finish_recovery: frees the objects the orphaned logs hold (with
 * free_them), or only forgets them (committed: they leak), and gives the
 * caches back.  Returns how many objects there were, and adds their bytes
 * to *bytes. */
uint64_t rk_pending_settle(struct rk_arena *a, bool free_them, uint64_t *bytes) RK_HIDDEN;
/* The same objects, appended to list, and nothing changed. */
uint64_t rk_pending_list(struct rk_arena *a, struct rk_ptrvec *list, uint64_t *bytes) RK_HIDDEN;
/* Whether rk_mark marked the object p (false for anything else). */
bool rk_object_marked(struct rk_arena *a, const void *p) RK_HIDDEN;
uint64_t rk_layout_hash(void) RK_HIDDEN;
/* Allocator locks live in the arena; holding one counts as an open unsafe
 * region of that arena (a death there leaves its metadata half-changed). */
void rk_lock_acquire(struct rk_arena *a, rk_lock *l) RK_HIDDEN;
void rk_lock_release(struct rk_arena *a, rk_lock *l) RK_HIDDEN;
/* Stops new allocator critical sections and waits up to timeout for running
 * ones to end; returns the locks still held by other threads. */
unsigned rk_allocator_freeze(uint64_t timeout_ns) RK_HIDDEN;
void rk_allocator_thaw(void) RK_HIDDEN; /* the restart failed: carry on */
void rk_tcache_flush_all(struct rk_arena *a, struct rk_tcache *tc) RK_HIDDEN;
struct rk_tcache *rk_tcache_current(struct rk_arena *a) RK_HIDDEN;
void rk_tcache_forget_thread(void) RK_HIDDEN;
void rk_tcache_release(struct rk_arena *a) RK_HIDDEN; /* flush this thread's cache, give it up */
void rk_run_free(struct rk_arena *a, uint64_t page, uint64_t npages) RK_HIDDEN;
uint32_t rk_gettid(void) RK_HIDDEN;

/* ---- sweep.c: the cleanup after a warm restart ---- */
/* pending (sorted, n entries, may be NULL): the objects the pending path
 * would free; *not_pending counts the objects the sweep frees that are not
 * among them (the check mode's disagreement). */
int rk_arena_sweep(struct rk_arena *a, struct rk_sweep_stats *st, const uint64_t *pending, size_t n,
		   uint64_t *not_pending) RK_HIDDEN;
int rk_arena_clear_marks(struct rk_arena *a) RK_HIDDEN;

/* ---- pkeys.c: write protection of arenas (memory protection keys) -------
 * An arena opened RK_ARENA_WRITE_PROTECT gets a key whose write access is off
 * in every thread outside its unsafe regions; the runtime's own writes (the
 * allocator, roots, marks, the sweep, progress records) open it for their
 * duration. */
int rk_wp_protect(struct rk_arena *a) RK_HIDDEN; /* sets a->pkey; -ENOTSUP without pkeys */
void rk_wp_signal_entry(void) RK_HIDDEN; /* our handlers: the kernel reset PKRU */
void rk_wp_reader_thread(void) RK_HIDDEN; /* a runtime thread that only reads arenas */
#if defined(__x86_64__)
static inline uint32_t rk_pkru_read(void)
{
	uint32_t eax, edx, ecx = 0;
	__asm__ volatile(".byte 0x0f,0x01,0xee" : "=a"(eax), "=d"(edx) : "c"(ecx)); /* rdpkru */
	return eax;
}
static inline void rk_pkru_write(uint32_t v)
{
	__asm__ volatile(".byte 0x0f,0x01,0xef" : : "a"(v), "c"(0), "d"(0) : "memory"); /* wrpkru */
}
#else
static inline uint32_t rk_pkru_read(void) { return 0; }
static inline void rk_pkru_write(uint32_t v) { (void)v; }
#endif
#define RK_PKRU_WD(key) (2u << (2 * (key))) /* write-disable bit of a key */
#define RK_PKRU_AD(key) (1u << (2 * (key))) /* access-disable bit */
/* What rk_wp_write_begin returns when it changed nothing.  No real PKRU can
 * be all ones: that denies key 0, so the thread could not have read `a`. */
#define RK_WP_UNCHANGED UINT32_MAX
/* Opens the arena for writing in this thread; returns what to pass to
 * rk_wp_write_end.  The key is read once, and end looks only at what begin
 * returned: another thread may protect the arena in between (it sets
 * a->pkey), and end must not then install a PKRU begin never saved.
 * Inside an unsafe region of the arena the key is open already: no WRPKRU
 * then, neither here nor in end (each costs 13-20 ns on AMD Zen 3, more
 * than the allocation it brackets). */
static inline uint32_t rk_wp_write_begin(const struct rk_arena *a)
{
	int key = a->pkey;
	if (RK_LIKELY(key <= 0))
		return RK_WP_UNCHANGED;
	uint32_t bits = RK_PKRU_WD(key) | RK_PKRU_AD(key), old = rk_pkru_read();
	if (!(old & bits))
		return RK_WP_UNCHANGED;
	rk_pkru_write(old & ~bits);
	return old;
}
static inline void rk_wp_write_end(uint32_t old)
{
	if (RK_UNLIKELY(old != RK_WP_UNCHANGED))
		rk_pkru_write(old);
}

/* ---- ranges.c: memory the app preserves itself (rk_preserve_range) ---- */
struct rk_range { int fd; uint64_t addr, len, dev, ino; };
extern struct rk_range rk_ranges[RK_MAX_RANGES] RK_HIDDEN;
extern unsigned rk_nranges RK_HIDDEN;

/* ---- manifest.c: the manifest, a memfd handed to the next incarnation ----
 * Written by the dying incarnation (signal-safe: plain stores into a shared
 * mapping), read and validated by the next one's rk_init.  Its fd number is
 * passed in $REKINDLE_MANIFEST_FD. */
#define RK_MANIFEST_MAGIC 0x54534e4d4b52ull /* "RKMNST" */
#define RK_MANIFEST_VERSION 7u
#define RK_MAX_STATICS 32
#define RK_MANIFEST_FIXED 65536u /* statics data follows */

enum rk_next_mode { RK_NEXT_NONE = 0, RK_NEXT_WARM = 1, RK_NEXT_COLD = 2 };
#define RK_MANIFEST_VALIDATED 0x1u /* a cross-check hot switch: the state is the validated one */

/* rk_manifest_arena.flags: the app's RK_ARENA_* flags, and: */
#define RK_MARENA_DROPPED 0x80000000u /* half-changed at the failure: not handed on */
#define RK_MARENA_NOT_IN_SNAPSHOT 0x40000000u /* with DROPPED: opted out of the snapshot restored */
/* dev/ino: which file fd must be in the next incarnation (fstat, not a
 * readlink in /proc, which costs 20 us on a restart's first use) */
struct rk_manifest_arena { char name[RK_NAME_MAX + 1]; int32_t fd; uint32_t flags; uint64_t base, max, dev, ino; };
struct rk_manifest_range { int32_t fd; uint32_t pad_; uint64_t addr, len, dev, ino; };
struct rk_manifest_static {
	uint64_t addr;        /* section start in the old incarnation */
	uint64_t size;
	uint64_t image_lo, image_hi; /* old module's load image */
	uint64_t image_offset; /* section start - module load bias (same in every incarnation) */
	uint64_t data_off;    /* saved bytes, from the manifest start */
	char module[128];
};

struct rk_manifest {
	uint64_t magic;
	uint32_t version;
	uint32_t generation;   /* of the incarnation that wrote it last */
	uint32_t next_mode;    /* enum rk_next_mode */
	uint32_t fast_failures;
	uint32_t last_kind;    /* start kind of the writer */
	int32_t signal, si_code;
	uint32_t flags;        /* RK_MANIFEST_* */
	uint64_t fault_addr;
	uint64_t t_restart_ns; /* CLOCK_MONOTONIC at rk_restart entry */
	uint64_t reserve_base, reserve_len, next_arena_addr;
	char reason[128];
	char decision[160];
	int32_t holder_pid;    /* teardown helper of the last restart, to reap */
	int32_t validator_pid; /* cross-check validator killed by the restart, to reap */
	uint32_t narenas, nranges, nstatics, statics_saved;
	char comm[16];         /* the process name at rk_init, put back after the exec */
	/* The previous incarnation's manifest memfd, handed on with this one:
	 * the next incarnation writes its manifest there instead of creating
	 * a memfd on its restart path.  Never the one a supervisor holds. */
	int32_t spare_fd;
	uint32_t decision_code; /* enum rk_reason of `decision` */
	uint32_t same_fault_count; /* identical faults in a row, across warm restarts */
	uint32_t pad3_;
	uint64_t spare_dev, spare_ino;
	struct rk_manifest_arena arenas[RK_MAX_ARENAS];
	struct rk_manifest_range ranges[RK_MAX_RANGES];
	struct rk_manifest_static statics[RK_MAX_STATICS];
	uint64_t checksum;     /* rk_manifest_checksum() */
};
/* The fixed part and the entries in use: the full tables (7.5 KiB, most of
 * it RK_PRESERVED descriptors) would be read cold three times per restart.
 * Readers never look past the counts, which must be checked first. */
static inline uint64_t rk_manifest_checksum(const struct rk_manifest *m)
{
	const uint64_t k = 0x9e3779b97f4a7c15ull;
	uint64_t h = rk_hash_words(m, offsetof(struct rk_manifest, arenas));
	h = h * k ^ rk_hash_words(m->arenas, m->narenas * sizeof m->arenas[0]);
	h = h * k ^ rk_hash_words(m->ranges, m->nranges * sizeof m->ranges[0]);
	return h * k ^ rk_hash_words(m->statics, m->nstatics * sizeof m->statics[0]);
}
/* This incarnation's manifest (rk_g.manifest), from rk_g and old (the
 * previous incarnation's, or NULL); 0 or -errno. */
int rk_manifest_create(const struct rk_manifest *old) RK_HIDDEN;
void rk_manifest_sync(void) RK_HIDDEN; /* after the arena or range list changed */
/* The previous incarnation's manifest, mapped privately (*size bytes, for
 * munmap): NULL if there is none, MAP_FAILED if it is refused (why says
 * why).  rk_manifest_inherit looks in $REKINDLE_MANIFEST_FD (an in-place
 * restart) and keeps that fd open in *kept_fd, the spare for our successor;
 * rk_manifest_inherit_supervised asks the supervisor (a respawn), and for a
 * fresh or cold start fills in rk_g.info and returns NULL. */
const struct rk_manifest *rk_manifest_inherit(uint64_t *size, int *kept_fd, char *why, size_t wl) RK_HIDDEN;
const struct rk_manifest *rk_manifest_inherit_supervised(uint64_t *size, char *why, size_t wl) RK_HIDDEN;
/* Hands inherited_fd (the previous manifest's memfd, -1 if none) on as the
 * spare, or closes it if a supervisor does not yet hold our manifest. */
void rk_manifest_offer_spare(int inherited_fd, bool supervisor_has_ours) RK_HIDDEN;

/* ---- statics.c: RK_PRESERVED variables, saved into the manifest ---- */
size_t rk_statics_total(void) RK_HIDDEN;  /* bytes of saved data needed */
void rk_statics_describe(struct rk_manifest *m) RK_HIDDEN;
void rk_statics_save(struct rk_manifest *m) RK_HIDDEN; /* async-signal-safe */
unsigned rk_statics_restore(const struct rk_manifest *old, uint64_t old_size) RK_HIDDEN;

/* ---- control.c: the control block (docs/supervisor-protocol.md) ----------
 * Heartbeat, state, unsafe-region counters and restart requests, in memory
 * the supervisor maps too, so it can read them after the process is gone.
 * Without a supervisor the block is private memory with the same layout. */
#define RK_CONTROL_MAGIC 0x314c5254434b5200ull /* "\0RKCTRL1" */
#define RK_CONTROL_VERSION 1u
#define RK_CONTROL_SIZE 65536u
#define RK_CONTROL_SLOTS 256u
#define RK_CONTROL_NAME 48u

enum rk_ctl_state { RK_CTL_NONE, RK_CTL_RUNNING, RK_CTL_RECOVERING, RK_CTL_READY, RK_CTL_RESTARTING };
#define RK_CTL_WARM_DISABLED 0x1u
enum rk_request_mode { RK_REQ_NONE = 0, RK_REQ_WARM = 1, RK_REQ_COLD = 2 };

struct rk_ctl_slot {
	_Atomic uint32_t tid; /* owner thread, 0 = free */
	_Atomic uint16_t depth[RK_MAX_ARENAS]; /* open unsafe regions per arena index */
	uint8_t reserved[28];
} __attribute__((aligned(64)));

struct rk_control {
	uint64_t magic;
	uint32_t version, size;
	_Atomic uint32_t pid, generation, state, flags;
	_Atomic uint64_t heartbeat_count, heartbeat_ns, preserved_bytes;
	_Atomic uint32_t request_mode;
	_Atomic uint32_t lazy_pages; /* set by the supervisor while a lazy restore is filling the arenas */
	char request_reason[128];
	uint32_t nslots, slot_size, narenas;
	_Atomic uint32_t independent_mask; /* arena indexes opened RK_ARENA_INDEPENDENT */
	/* FNV-1a 64 of narenas, independent_mask and the names in use (never 0
	 * once written; 0 with an empty table): a stray write there would make
	 * the supervisor drop the wrong arenas or keep a half-changed one */
	_Atomic uint64_t arena_table_sum;
	uint8_t reserved1[40];
	struct rk_ctl_slot slots[RK_CONTROL_SLOTS];
	char arena_names[RK_MAX_ARENAS][RK_CONTROL_NAME];
};

extern struct rk_control *rk_ctl RK_HIDDEN;
/* Maps the supervisor's block ($REKINDLE_CONTROL_FD) or a private one. */
int rk_control_open(void) RK_HIDDEN;
bool rk_control_shared(void) RK_HIDDEN;
int rk_control_fd(void) RK_HIDDEN;
/* Async-signal-safe: NULL if the block's header is what rk_init found, else
 * what is wrong with it (a wild write clobbered the evidence of open
 * unsafe regions, so no warm restart may rely on it). */
const char *rk_control_damage(void) RK_HIDDEN;
/* After a cold decision made because of that damage: the evidence is no
 * longer needed, so the shared block gets its header back and the next
 * incarnation stays supervised.  Async-signal-safe. */
void rk_control_repair(void) RK_HIDDEN;
/* A new incarnation: resets the per-incarnation fields. */
void rk_control_begin(unsigned generation, enum rk_ctl_state state) RK_HIDDEN;
void rk_control_set_state(enum rk_ctl_state state) RK_HIDDEN;
void rk_control_name_arenas(void) RK_HIDDEN; /* and the independent mask */
/* Async-signal-safe.  Stops new unsafe regions and waits up to timeout for
 * other threads' open ones to close (nested entries go through meanwhile);
 * from its return on, every entry waits until the thaw.  True if none of
 * the other threads' regions is open at the return. */
bool rk_unsafe_freeze(uint64_t timeout_ns) RK_HIDDEN;
void rk_unsafe_thaw(void) RK_HIDDEN; /* the restart failed: wakes the waiting threads */
/* A thread a freeze stops waits while *flag is set; the thaw clears it and
 * wakes every waiter (futex, async-signal-safe; the allocator's too). */
void rk_freeze_wait(_Atomic int *flag) RK_HIDDEN;
void rk_freeze_release(_Atomic int *flag) RK_HIDDEN;
/* Async-signal-safe.  The arena indexes with an open unsafe region (or a
 * held allocator lock) in any thread. */
uint32_t rk_unsafe_open_mask(void) RK_HIDDEN;
/* "unsafe region open in arena NAME (tid N)": the words the supervisor uses too. */
void rk_unsafe_describe(unsigned k, char *why, size_t cap) RK_HIDDEN;
/* An allocator critical section of arena index k begins / ends in this
 * thread: counted like an unsafe region, without the freeze check. */
void rk_unsafe_note_enter(unsigned k) RK_HIDDEN;
void rk_unsafe_note_leave(unsigned k) RK_HIDDEN;
/* This thread's open unsafe regions and allocator sections, all arenas. */
unsigned rk_unsafe_my_depth(void) RK_HIDDEN;

void rk_unsafe_forget_thread(void) RK_HIDDEN; /* in a forked child */
/* Takes the pending restart request, if any (async-signal-safe). */
enum rk_request_mode rk_control_take_request(char *reason, size_t cap) RK_HIDDEN;

/* ---- supervisor_link.c: messages to and from `rekindle run` ---- */
/* INHERIT flags: the fds are new memfds the supervisor filled from a durable
 * snapshot (`rekindle restore`); reason holds the snapshot's id, and the
 * manifest's saved statics are the snapshot's. */
#define RK_INHERIT_RESTORED 0x1u
#define RK_INHERIT_LAZY 0x2u /* with RESTORED: the arenas' pages come in on demand (lazy.c) */
#define RK_ATTACH_CAP_LAZY 0x1u /* ATTACH caps: this runtime answers INHERIT_LAZY with LAZY */
struct rk_inherit {
	uint32_t mode; /* 0 fresh, 1 warm, 2 cold */
	uint32_t generation;
	int32_t signal;
	uint32_t dropped; /* with mode 1: arenas of the manifest not handed on (half-changed) */
	uint64_t t_detect_ns;
	char reason[128];
	char decision[160];
	uint32_t decision_code; /* enum rk_reason */
	uint32_t flags;         /* RK_INHERIT_* */
	int fds[1 + 2 * RK_MAX_ARENAS]; /* with mode 1: manifest first */
	unsigned nfds;
};
bool rk_sup_active(void) RK_HIDDEN;
int rk_sup_fd(void) RK_HIDDEN;
int rk_sup_open(void) RK_HIDDEN;
/* ATTACH, then waits for INHERIT. */
int rk_sup_attach(struct rk_inherit *inh, char *why, size_t wl) RK_HIDDEN;
void rk_sup_hello(void) RK_HIDDEN;
/* 0 if the supervisor now holds our fds, or there is none; -errno if the
 * message was not sent. */
int rk_sup_send_fds(void) RK_HIDDEN;
void rk_sup_restart_failed(int err) RK_HIDDEN; /* the exec after RESTARTING failed */
void rk_sup_ready(void) RK_HIDDEN;
void rk_sup_forget(void) RK_HIDDEN; /* a validator child: never speak for the app */
/* Async-signal-safe, non-blocking. */
void rk_sup_restarting(bool warm, int sig, uint64_t t_ns, uint64_t fault_addr, const char *reason,
		       const char *decision, enum rk_reason code) RK_HIDDEN;

/* LAZY: the arenas registered for a lazy restore (lazy.c). */
struct rk_lazy_region {
	char name[48];
	uint64_t addr, len;
};
/* Sends LAZY (the userfaultfd, or fd -1 with err: the supervisor reads
 * every page itself) and waits for the supervisor's answer. */
int rk_sup_lazy(int uffd, const struct rk_lazy_region *regions, unsigned n, int err, char *why, size_t wl) RK_HIDDEN;

/* ---- lazy.c: the app's side of a lazy restore ---- */
/* After the arenas are mapped and before anything reads them. */
int rk_lazy_begin(char *why, size_t wl) RK_HIDDEN;
/* The supervisor is still filling the arenas: no in-place warm restart. */
bool rk_lazy_pending(void) RK_HIDDEN;

/* ---- init.c: rk_init and the process-wide state ---- */
struct rk_state {
	bool initialized;
	bool recovery;        /* warm start, recovery not finished */
	bool lazy_restore;    /* the supervisor restores the arenas lazily (RK_INHERIT_LAZY) */
	pid_t pid;            /* the process rk_init ran in (a forked child does not restart) */
	uint64_t reserve_base, reserve_len, next_arena_addr;
	struct rk_arena arenas[RK_MAX_ARENAS];
	unsigned narenas;
	struct rk_restart_info info;
	struct rk_manifest *manifest; /* shared with the next incarnation */
	int manifest_fd;
	int manifest_spare_fd;        /* see rk_manifest.spare_fd; -1 if none */
	uint64_t manifest_size;
	volatile int manifest_busy; /* arena list being rewritten: restart goes cold */
	uint64_t start_ns;
	uint64_t t_restart_ns;      /* the previous incarnation's rk_restart entry */
	pid_t holder_pid;           /* teardown helper still to reap */
	bool validated;             /* started from a cross-check's validated state */
	bool validator;             /* this process is a cross-check validator */
	_Atomic bool no_punch;      /* a cross-check runs: keep freed pages in the memfd */
	_Atomic pid_t validator_pid; /* running validator, killed by a restart */
	pid_t validator_reap;       /* previous incarnation's validator, to reap */
	/* a cross-check hot switch: this arena index is replaced at the exec */
	int switch_index, switch_fd;
	uint64_t switch_base, switch_max, switch_dev, switch_ino;
	int prev_si_code;          /* si_code of the fault that ended the previous incarnation */
	uint32_t same_fault_count; /* how many identical faults in a row ended the incarnations before */
};
/* In a forked validator: write nothing the serving process or the
 * supervisor can see (manifest, control block, supervisor socket). */
void rk_validator_detach(void) RK_HIDDEN;
extern struct rk_state rk_g RK_HIDDEN;

uint64_t rk_now_ns(void) RK_HIDDEN;

/* ---- recovery.c: a warm start, from rk_init to rk_finish_recovery ---- */
/* Maps and checks what the manifest m (msize bytes) hands on, restores the
 * statics; 0, or -errno with everything undone (why says why) but the
 * inherited fds, which rk_recovery_close_inherited closes. */
int rk_recovery_attach(const struct rk_manifest *m, uint64_t msize, char *why, size_t wl) RK_HIDDEN;
void rk_recovery_close_inherited(const struct rk_manifest *m) RK_HIDDEN;

/* ---- prefault.c: exports only the public rk_prefault ---- */

/* ---- hugepages.c: exports only the public rk_arena_hugepages, rk_hugepages_* ---- */

/* ---- crosscheck.c: exports only the public rk_crosscheck_* ---- */

/* ---- stages.c: exports only the public API of rekindle_stages.h ---- */

/* ---- decide.c: warm or cold, as a pure function of the facts ----
 * The order of the checks is shared with the supervisor's decider
 * (supervisor/src/decide.rs): both run tests/contract/decisions.tsv.  The
 * facts above `regions_known` are cheap; the restart looks at open regions
 * (a freeze of the other threads) only when those alone say warm. */
struct rk_facts {
	bool cold_requested;
	bool hot_switch;        /* a cross-check mismatch: warm onto the validated state */
	bool fault_in_runtime;
	bool control_damaged;
	bool crash_loop;        /* a failure within the window after a warm start */
	int repeat_owner;       /* a repeated fault: its arena, RK_MAX_ARENAS for a range, -1 none */
	bool manifest_busy;
	bool warm_disabled;
	bool regions_known;     /* the fields below are valid (the freeze ran) */
	bool hook_cold;         /* the app's failure hook chose cold */
	uint32_t unsafe_open;   /* arenas with an open unsafe region */
	uint32_t independent;   /* arenas opened RK_ARENA_INDEPENDENT */
	uint32_t hook_drop;     /* arenas the failure hook dropped */
};
struct rk_verdict {
	bool warm;
	enum rk_reason code;
	uint32_t drop;          /* with warm: arenas not handed on */
	int arena;              /* the arena the reason is about, -1 if none */
};
/* Async-signal-safe. */
struct rk_verdict rk_decide(const struct rk_facts *f) RK_HIDDEN;

/* ---- restart.c: the decision, warm or cold, and the exec ---- */
/* Copies argv and the environment for the exec (may allocate: rk_init). */
int rk_restart_setup(int argc, char **argv, int manifest_fd) RK_HIDDEN;
/* The restart (async-signal-safe): decides warm or cold, records it in the
 * manifest and execs; returns -errno only if it did not happen (refused,
 * given up, or the exec failed).  sig, si, uc: the signal that caused it,
 * or 0 and NULL. */
int rk_do_restart(bool want_warm, bool hot_switch, const char *reason, int sig, const siginfo_t *si,
		  const void *uc) RK_HIDDEN;
/* The warm restart of a cross-check mismatch, onto the validated arena
 * (rk_g.switch_*).  Returns only on failure. */
int rk_restart_hot_switch(const char *why) RK_HIDDEN;
/* 0, or the tid of the thread restarting; only restart.c writes it. */
extern _Atomic int rk_restarting RK_HIDDEN;

/* ---- teardown.c: the old address space's teardown, off the restart path ---- */
void rk_teardown_holder_stand(void) RK_HIDDEN; /* at rk_init: one helper for the whole incarnation */
void rk_reap_teardown_holder(void) RK_HIDDEN;  /* the last restart's helper, and a killed validator */
/* At a restart (async-signal-safe): the write end of the helper's pipe,
 * which the exec closes, or -1 (then the exec tears down, only slower);
 * after a failed exec, rk_teardown_holder_exec_failed with it. */
int rk_teardown_holder_for_exec(void) RK_HIDDEN;
void rk_teardown_holder_exec_failed(int wr) RK_HIDDEN;
void rk_exec_pool_release(void) RK_HIDDEN; /* just before execve; async-signal-safe */

/* ---- signals.c: the fatal-signal and restart-signal handlers ---- */
int rk_signals_install(void) RK_HIDDEN;
/* tools/errvirt's run-time, when the program links it (a weak reference):
 * 1 = the fault became a library error and the program resumes. */
int rk_ev_fault_hook(int sig, siginfo_t *si, void *uc) __attribute__((weak));

/* ---- snapshot_agent.c: the app's side of durable snapshots -------------
 * With `rekindle run --snapshot-dir`, a thread of the runtime tracks which
 * preserved pages are written (userfaultfd async write-protect, Linux 6.7+)
 * and, on the supervisor's request, reports them (PAGEMAP_SCAN, which
 * write-protects them again in the same call) and takes the consistent cut:
 * no unsafe region or allocator section open while the supervisor copies
 * the pages written since the last report.  It talks on its own socket pair
 * ($REKINDLE_SNAPSHOT_FD, the framing of supervisor_link.c) and fills a
 * shared buffer (a memfd it hands over) whose layout is below; the
 * supervisor's side is supervisor/src/snapshot/agent_link.rs, and
 * supervisor/tests/layout.rs checks both against each other. */
#define RK_SNAP_BUF_MAGIC 0x3146554250414e53ull /* "SNAPBUF1" */
/* 4: SCAN's flags (PROBE); an agent of 3 would take a probe for a cut */
#define RK_SNAP_BUF_VERSION 4u
#define RK_SNAP_MAX_REGIONS (RK_MAX_ARENAS + RK_MAX_RANGES)
#define RK_SNAP_VEC_CAP 65536u   /* runs of written pages per report */
#define RK_SNAP_PUNCH_CAP 65536u /* holes punched between two cuts */

enum rk_snap_region_kind { RK_SNAP_ARENA = 1, RK_SNAP_RANGE = 2 };
#define RK_SNAP_REGION_NEW 0x1u /* registered by this report: its pages were never reported */
/* With NEW, on the first report of a restored incarnation: registered when
 * rk_init mapped it, before anything wrote to it, so the written pages this
 * report lists (and the holes punched since) are every change since the
 * snapshot it was restored from. */
#define RK_SNAP_REGION_TRACKED_FROM_MAP 0x2u

struct rk_snap_region {
	uint32_t kind;  /* enum rk_snap_region_kind (the FDS kind of its memfd) */
	uint32_t flags; /* RK_SNAP_REGION_* */
	char name[48];  /* the FDS name of its memfd */
	uint64_t addr, len; /* where it is mapped: page p is the memfd's page p */
	uint32_t first, count; /* its runs in the vector of this report */
	/* its memfd's inode: the supervisor copies from the fd it holds only
	 * if it is this one (after a cold restart in place the new arena has
	 * the old one's name until the new fds are handed over) */
	uint64_t ino;
};

/* A hole the allocator punched in an arena (the pages read as zeros now,
 * but the punch writes no page table entry a scan could see). */
struct rk_snap_punch {
	uint64_t addr;
	uint64_t pages;
};

struct rk_snap_buf {
	uint64_t magic;
	uint32_t version, size;
	uint64_t regions_off, vec_off, punch_off, manifest_off;
	uint32_t vec_cap, punch_cap, manifest_cap, reserved;
	/* the report's contents */
	uint32_t nregions, nvec, manifest_len, npunch;
	/* written by the allocator's punches between cuts */
	_Atomic uint32_t punch_head;
	_Atomic uint32_t punch_overflow;
	/* This process's cuts, counted from 1 by the agent: the number of the
	 * next cut (rk_epoch(), the agent's to write) and of the newest whose
	 * snapshot is durable (rk_durable_epoch(), the supervisor's). */
	_Atomic uint64_t open_epoch;
	_Atomic uint64_t durable_epoch;
};

/* The status of a report (DIRTY, RELEASED); the supervisor's reason codes
 * for a snapshot that did not happen name them. */
enum rk_snap_status {
	RK_SNAP_OK = 0,
	RK_SNAP_REGION_OPEN = 1,    /* an unsafe region or allocator section stayed open */
	RK_SNAP_RESTARTING = 2,     /* a restart of the app is under way */
	RK_SNAP_LAYOUT_CHANGING = 3, /* the arena list was being rewritten */
	RK_SNAP_SCAN_FAILED = 4,    /* PAGEMAP_SCAN or UFFDIO_REGISTER failed (errno in detail) */
	RK_SNAP_STOP_TIMEOUT = 5,   /* the supervisor did not release the cut in time: thawed anyway */
	RK_SNAP_BAD_REQUEST = 6,
	RK_SNAP_UNAVAILABLE = 7,    /* no dirty tracking in this process (errno in detail) */
};

/* Messages on the snapshot socket pair: the framing of supervisor_link.c
 * (16-byte header, "RKSM", version 2), these types and payloads. */
enum rk_snap_msg {
	RK_SNAP_HELLO = 20,
	RK_SNAP_DIRTY = 21,
	RK_SNAP_RELEASED = 22,
	RK_SNAP_SCAN = 120,
	RK_SNAP_CONTINUE = 121,
	RK_SNAP_RELEASE = 122,
};

/* HELLO's fds: the shared buffer, the durable eventfd (the supervisor
 * writes it after each commit), the request eventfd (rk_checkpoint). */
#define RK_SNAP_HELLO_FDS 3
struct rk_snap_hello {
	uint32_t pid, generation, status;
	int32_t err;
	uint64_t buf_size;
};
/* SCAN's flags.  CUT: freeze the app first and hold it until RELEASE.
 * PROBE (without CUT): also say whether nothing changed since the last cut
 * (DIRTY's `unchanged`): no page written, no hole punched, no region new,
 * the manifest and the statics as that cut had them.  The app's state is
 * then the cut's as of the scan's start, and DIRTY's `epoch` is the number
 * rk_epoch() had just before it: every region ended by then is durable
 * with that cut, and the supervisor may skip the snapshot. */
#define RK_SNAP_SCAN_CUT 1u
#define RK_SNAP_SCAN_PROBE 2u
struct rk_snap_scan {
	uint64_t seq;
	uint32_t flags, timeout_ms;
};
struct rk_snap_dirty {
	uint64_t seq;
	uint32_t status;
	int32_t err;
	uint32_t more, frozen;
	uint64_t t_freeze_ns, t_scan_ns;
	uint32_t punch_overflow, unchanged;
	/* with frozen: this cut's number (rk_epoch before it); with unchanged:
	 * rk_epoch before the probe's scan */
	uint64_t epoch;
};
struct rk_snap_seq {
	uint64_t seq;
};
struct rk_snap_released {
	uint64_t seq;
	uint32_t status, reserved;
	uint64_t stop_ns;
};
_Static_assert(sizeof(struct rk_snap_hello) == 24, "snapshot protocol layout");
_Static_assert(sizeof(struct rk_snap_scan) == 16, "snapshot protocol layout");
_Static_assert(sizeof(struct rk_snap_dirty) == 56, "snapshot protocol layout");
_Static_assert(sizeof(struct rk_snap_released) == 24, "snapshot protocol layout");
_Static_assert(sizeof(struct rk_snap_region) == 88, "snapshot buffer layout");

/* The snapshot socket, -1 if none: handed on at an in-place restart. */
int rk_snapshot_fd(void) RK_HIDDEN;
/* The agent runs: the supervisor takes snapshots of this process. */
bool rk_snapshot_active(void) RK_HIDDEN;
/* A cold decision for one of these reasons is left to the supervisor when
 * the app takes snapshots: the process dies instead of exec'ing itself cold,
 * and the supervisor, which reads the same evidence in the control block,
 * starts the next incarnation from the newest snapshot instead of from
 * nothing (the cut was taken with no unsafe region open, so it is
 * consistent, and the change cut short is not in it).  Other cold reasons
 * are the app's or the operator's choice, or evidence the supervisor does
 * not see.  The supervisor's Reason::restorable is the same set
 * (supervisor/tests/layout.rs). */
static inline bool rk_reason_restorable(enum rk_reason r)
{
	return r == RK_REASON_UNSAFE_REGION_OPEN || r == RK_REASON_CONTROL_BLOCK_CORRUPT;
}
/* Starts the agent if $REKINDLE_SNAPSHOT_FD is set (end of rk_init). */
void rk_snapshot_agent_start(void) RK_HIDDEN;
/* A restore (eager): rk_init has just mapped a restored arena (its memfd
 * fd, inode ino) at [addr, addr + len) and nothing has touched it; if the
 * agent will run, its tracking of that mapping begins now
 * (RK_SNAP_REGION_TRACKED_FROM_MAP).  Failing, nothing changes: the first
 * snapshot reads every page, as without it. */
void rk_snapshot_track_from_map(uint64_t addr, uint64_t len, int fd, uint64_t ino) RK_HIDDEN;
/* The allocator punched [addr, addr + pages * RK_PAGE) out of an arena. */
void rk_snapshot_note_punch(uint64_t addr, uint64_t pages) RK_HIDDEN;

/* ---- redo.c: the app's redo log (`rk_redo_*`, docs/snapshots.md) --------
 * With `rekindle run --snapshot-dir`, the supervisor hands the app a ring in
 * a memfd it holds across incarnations ($REKINDLE_REDO_FDS: the ring, the
 * kick eventfd the app writes to ask for a flush, the done eventfd the
 * supervisor writes when its positions advance).  The app appends records
 * of its own changes (a u32 length, then the bytes) inside the unsafe
 * region of each change; a record is *committed* when the appending
 * thread's outermost region ends.  The supervisor writes committed bytes to
 * DIR/redo, syncs them and advances `durable`; at a cut (no region open) it
 * reads `committed`, so a snapshot holds exactly the changes of the records
 * before its position, and a restore replays the ones after it.  Positions
 * count bytes of one stream that only grows.  The supervisor's side is
 * supervisor/src/redo/ring.rs; supervisor/tests/layout.rs checks both. */
#define RK_REDO_MAGIC 0x31474f4c4f444552ull /* "REDOLOG1" */
#define RK_REDO_VERSION 1u
#define RK_REDO_HEADER 4096u /* the header page; the ring's bytes follow */
#define RK_REDO_REC_HEAD 4u  /* a record: u32 length, then the bytes */

struct rk_redo_ring {
	uint64_t magic;
	uint32_t version, header_size;
	uint64_t ring_bytes; /* after the header; a power of two */
	uint64_t reserved0[5];
	/* the app's line (offset 64) */
	_Atomic uint64_t committed; /* the records before it are whole, their regions closed */
	_Atomic uint64_t want;      /* the position the app asked to be made durable */
	_Atomic uint64_t app_gaps;  /* how often the app closed the line (rk_redo_gap) */
	/* a restore's replay is not finished: the state is not yet the line's */
	_Atomic uint64_t replay_pending;
	/* this incarnation began at this position of this line (0: closed): a
	 * crash loop's restore replays what came before it, not what it wrote */
	_Atomic uint64_t started_at;
	_Atomic uint64_t started_line;
	uint64_t reserved1[2];
	/* the supervisor's line (offset 128) */
	_Atomic uint64_t line;       /* the open line; 0: closed, appends refused */
	_Atomic uint64_t line_gaps;  /* app_gaps when it opened the line: if they differ, closed */
	_Atomic uint64_t line_start; /* where the open line begins */
	_Atomic uint64_t drained;    /* the bytes before it are in the log's files: their ring space is free */
	_Atomic uint64_t durable;    /* the records before it are durable */
	_Atomic int32_t writer_errno; /* the writer stopped (an errno): appends fail */
	uint32_t reserved2;
	uint64_t reserved3[2];
};
_Static_assert(offsetof(struct rk_redo_ring, committed) == 64, "redo ring layout");
_Static_assert(offsetof(struct rk_redo_ring, line) == 128, "redo ring layout");
_Static_assert(sizeof(struct rk_redo_ring) == 192, "redo ring layout");

/* The records this thread appended wait for its outermost region's end. */
extern __thread bool rk_tls_redo_pending __attribute__((tls_model("initial-exec"))) RK_HIDDEN;
/* From rk_unsafe_end while the thread's last open region is still counted:
 * its records are committed (a death after this replays them whole). */
void rk_redo_commit_thread(void) RK_HIDDEN;
/* rk_init, after the control block: maps the ring if the supervisor gave one. */
void rk_redo_attach(void) RK_HIDDEN;
/* rk_init, after rk_control_begin: a start that is not warm closes the
 * line the ring holds; and if a restore's replay is due, a death before
 * rk_redo_replay finishes must not keep this state (it counts as an open
 * region of every restored arena). */
void rk_redo_hold_until_replayed(void) RK_HIDDEN;
/* An arena created while that replay is due counts as open too: the records
 * may build it (a snapshot taken before the app had created it). */
void rk_redo_arena_created(unsigned index) RK_HIDDEN;
/* The ring's fds and $REKINDLE_REDO_FDS for the next image (restart.c). */
int rk_redo_fds(int fds[3]) RK_HIDDEN;
const char *rk_redo_env(void) RK_HIDDEN;

#endif
