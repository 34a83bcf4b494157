/* control.c - the control block: heartbeat, state, restart requests and
 * unsafe-region counters, in memory the supervisor can read even after the
 * process is gone (docs/supervisor-protocol.md has the layout).  Without a
 * supervisor the same block is private memory, so the fault handler's
 * checks are the same either way.
 *
 * Unsafe regions: each thread owns one 64-byte slot and is its only writer,
 * so rk_unsafe_begin is a load and a store on a line no other thread writes
 * (a locked add where membarrier is missing), and rk_unsafe_end a plain
 * store.  It pairs with the restart's freeze (flag, membarrier, then look at
 * the counters), Dekker-style, so no region can open unseen while a restart
 * decides.  A thread the freeze stops waits on a futex, so a restart whose
 * exec fails can let it go on. */
#include "rk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <time.h>
#include <unistd.h>

_Static_assert(offsetof(struct rk_control, request_reason) == 64, "protocol layout");
_Static_assert(offsetof(struct rk_control, nslots) == 192, "protocol layout");
_Static_assert(offsetof(struct rk_control, slots) == 256, "protocol layout");
_Static_assert(offsetof(struct rk_control, independent_mask) == 204, "protocol layout");
_Static_assert(offsetof(struct rk_control, arena_table_sum) == 208, "protocol layout");
_Static_assert(offsetof(struct rk_control, arena_names) == 16640, "protocol layout");
_Static_assert(sizeof(struct rk_ctl_slot) == 64, "protocol layout");
_Static_assert(sizeof(struct rk_control) <= RK_CONTROL_SIZE, "protocol layout");

struct rk_control *rk_ctl;
static int ctl_fd = -1;
/* The freeze of unsafe regions, a futex word.  While the restart waits for
 * open regions to close (DRAIN), a thread that already has one open may
 * enter nested ones, so it can reach its outermost end; once the wait is
 * over (CLOSED) every entry waits, so nothing opens after the restart has
 * looked. */
enum { FREEZE_NONE, FREEZE_DRAIN, FREEZE_CLOSED };
static _Atomic int unsafe_freezing;
static bool asym_barrier; /* membarrier private expedited is registered */
static bool block_fresh;  /* our own block, mapped by this incarnation: all zero but what rk_init wrote */
/* Initial-exec: in the shared library a thread-local costs a __tls_get_addr
 * call otherwise, three per rk_unsafe_begin (the static library gets
 * local-exec from the linker anyway).  unsafe_bench against the .so: a pair
 * 15.0 -> 7.8 ns, a protected pair 59 -> 45 ns (AMD EPYC, best runs). */
#define TLS __attribute__((tls_model("initial-exec"))) static __thread
TLS struct rk_ctl_slot *tls_slot;
/* This thread's count in the shared overflow slot, whose depths mix threads */
TLS unsigned tls_overflow_depth;
static pthread_key_t slot_key;
static bool slot_key_made;
static pthread_once_t slot_key_once = PTHREAD_ONCE_INIT;
/* the last slot is shared by threads that found no free one */
#define OVERFLOW_SLOT (RK_CONTROL_SLOTS - 1)
#define OVERFLOW_TID 0xffffffffu

static void warn(const char *what, const char *detail)
{
	struct rk_ev e;
	rk_ev_begin(&e, "warning");
	rk_ev_str(&e, "what", what);
	if (detail)
		rk_ev_str(&e, "detail", detail);
	rk_ev_end(&e);
}

static struct rk_control *map_shared_block(const char *v)
{
	char *end;
	long fd = strtol(v, &end, 10);
	struct stat st;
	if (*end || fd < 3 || fd > INT_MAX) {
		warn("ignoring malformed REKINDLE_CONTROL_FD", v);
		return NULL;
	}
	/* a shmem file of the right size, then magic, version and layout below
	 * (no readlink in /proc: a new process's first costs 20 us) */
	if (!rk_fd_is_shmem((int)fd) || fstat((int)fd, &st) < 0 ||
	    st.st_size < (off_t)RK_CONTROL_SIZE) {
		warn("REKINDLE_CONTROL_FD is not a rekindle control block; running unsupervised", v);
		return NULL;
	}
	struct rk_control *c = mmap(NULL, RK_CONTROL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
	if (c == MAP_FAILED) {
		warn("cannot map the control block; running unsupervised", strerror(errno));
		return NULL;
	}
	if (c->magic != RK_CONTROL_MAGIC || c->version != RK_CONTROL_VERSION || c->size != RK_CONTROL_SIZE ||
	    c->nslots != RK_CONTROL_SLOTS || c->slot_size != sizeof(struct rk_ctl_slot)) {
		munmap(c, RK_CONTROL_SIZE);
		warn("control block has a foreign magic, version or layout; running unsupervised", v);
		return NULL;
	}
	/* ours to keep across in-place restarts, not for the app's children */
	(void)fcntl((int)fd, F_SETFD, FD_CLOEXEC);
	ctl_fd = (int)fd;
	return c;
}

int rk_control_open(void)
{
	(void)pthread_atfork(NULL, NULL, rk_unsafe_forget_thread);
	asym_barrier = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
	const char *v = getenv("REKINDLE_CONTROL_FD");
	rk_ctl = v ? map_shared_block(v) : NULL;
	unsetenv("REKINDLE_CONTROL_FD"); /* restart.c re-adds it from its copy */
	if (rk_ctl)
		return 0;
	struct rk_control *c = mmap(NULL, RK_CONTROL_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (c == MAP_FAILED)
		return -errno;
	c->magic = RK_CONTROL_MAGIC;
	c->version = RK_CONTROL_VERSION;
	c->size = RK_CONTROL_SIZE;
	c->nslots = RK_CONTROL_SLOTS;
	c->slot_size = sizeof(struct rk_ctl_slot);
	rk_ctl = c;
	block_fresh = true;
	return 0;
}

/* FNV-1a 64 of narenas, independent_mask and the names in use; 0 is kept
 * for "no table written" (the supervisor's fresh block).  The supervisor
 * computes the same (control_block.rs). */
static uint64_t arena_table_sum(const struct rk_control *c)
{
	uint32_t n = c->narenas, mask = atomic_load(&c->independent_mask);
	uint64_t h = 0xcbf29ce484222325ull;
	const uint32_t words[2] = {n, mask};
	const unsigned char *p = (const unsigned char *)words;
	for (size_t i = 0; i < sizeof words; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	for (unsigned k = 0; k < n && k < RK_MAX_ARENAS; k++)
		for (unsigned i = 0; i < RK_CONTROL_NAME; i++)
			h = (h ^ (unsigned char)c->arena_names[k][i]) * 0x100000001b3ull;
	return h ? h : 1;
}

const char *rk_control_damage(void)
{
	const struct rk_control *c = rk_ctl;
	if (!c)
		return NULL;
	if (c->magic != RK_CONTROL_MAGIC)
		return "control block corrupt: bad magic";
	if (c->version != RK_CONTROL_VERSION || c->size != RK_CONTROL_SIZE || c->nslots != RK_CONTROL_SLOTS ||
	    c->slot_size != sizeof(struct rk_ctl_slot))
		return "control block corrupt: bad version or layout";
	if (c->narenas > RK_MAX_ARENAS)
		return "control block corrupt: bad arena count";
	uint64_t sum = atomic_load(&c->arena_table_sum);
	if (sum ? sum != arena_table_sum(c) : c->narenas || c->independent_mask)
		return "control block corrupt: arena table checksum";
	return NULL;
}

void rk_control_repair(void)
{
	struct rk_control *c = rk_ctl;
	if (!c || !rk_control_shared() || !rk_control_damage())
		return;
	c->magic = RK_CONTROL_MAGIC;
	c->version = RK_CONTROL_VERSION;
	c->size = RK_CONTROL_SIZE;
	c->nslots = RK_CONTROL_SLOTS;
	c->slot_size = sizeof(struct rk_ctl_slot);
	c->narenas = 0;
	atomic_store(&c->independent_mask, 0);
	atomic_store(&c->arena_table_sum, 0);
}

bool rk_control_shared(void)
{
	return ctl_fd >= 0;
}

int rk_control_fd(void)
{
	return ctl_fd;
}

/* Only slots in use are written, and a fresh block's other slots are not
 * even read: a touch of each of its 16 pages would cost 16 page faults
 * (30-80 us on a restart's cold caches).  Reads of a shared block's pages
 * cost one fault-around. */
static void slot_reset_if_used(struct rk_ctl_slot *s)
{
	bool used = atomic_load(&s->tid) != 0;
	for (unsigned k = 0; k < RK_MAX_ARENAS && !used; k++)
		used = atomic_load(&s->depth[k]) != 0;
	if (!used)
		return;
	atomic_store(&s->tid, 0);
	for (unsigned k = 0; k < RK_MAX_ARENAS; k++)
		atomic_store(&s->depth[k], 0);
}

void rk_control_begin(unsigned generation, enum rk_ctl_state state)
{
	struct rk_control *c = rk_ctl;
	if (block_fresh && tls_slot) /* the only slot rk_init can have claimed */
		slot_reset_if_used(tls_slot);
	for (unsigned i = 0; i < RK_CONTROL_SLOTS && !block_fresh; i++)
		slot_reset_if_used(&c->slots[i]);
	block_fresh = false;
	atomic_store(&c->slots[OVERFLOW_SLOT].tid, OVERFLOW_TID);
	/* rk_init may have claimed a slot already (the allocator's critical
	 * sections count too, and a warm start runs some): claim again, or
	 * this thread's regions would go to a slot that reads as free.  The
	 * slot is another thread's to claim now: our exit must not free it. */
	tls_slot = NULL;
	if (slot_key_made)
		(void)pthread_setspecific(slot_key, NULL); /* cannot fail: the key exists, no allocation for NULL */
	atomic_store(&c->heartbeat_ns, 0);
	atomic_store(&c->heartbeat_count, 0);
	atomic_store(&c->request_mode, RK_REQ_NONE);
	atomic_store(&c->flags, 0);
	atomic_store(&c->generation, generation);
	atomic_store(&c->pid, (uint32_t)getpid());
	atomic_store(&c->state, state);
}

void rk_control_set_state(enum rk_ctl_state state)
{
	if (rk_ctl)
		atomic_store(&rk_ctl->state, state);
}

void rk_control_name_arenas(void)
{
	struct rk_control *c = rk_ctl;
	if (!c)
		return;
	uint32_t independent = 0;
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		rk_strlcpy(c->arena_names[i], rk_g.arenas[i].hdr ? rk_g.arenas[i].name : "", RK_CONTROL_NAME);
		if (rk_g.arenas[i].hdr && (rk_g.arenas[i].flags & RK_ARENA_INDEPENDENT))
			independent |= 1u << i;
	}
	c->narenas = rk_g.narenas;
	atomic_store(&c->independent_mask, independent);
	atomic_store(&c->arena_table_sum, arena_table_sum(c));
}

/* ---- public: heartbeat, readiness, policy -------------------------------- */

int rk_heartbeat_interval_ms(void)
{
	if (!rk_cfg.hang_timeout_ms)
		return -1;
	/* a third: two beats fit in the timeout even if one wait runs late */
	unsigned ms = rk_cfg.hang_timeout_ms / 3;
	return ms ? (int)(ms > INT_MAX ? INT_MAX : ms) : 1;
}

void rk_heartbeat(void)
{
	struct rk_control *c = rk_ctl;
	if (!c)
		return;
	atomic_store_explicit(&c->heartbeat_ns, rk_now_ns(), memory_order_relaxed);
	atomic_fetch_add_explicit(&c->heartbeat_count, 1, memory_order_relaxed);
	if (RK_LIKELY(atomic_load_explicit(&c->request_mode, memory_order_relaxed) == RK_REQ_NONE))
		return;
	/* A restart the supervisor asked for, taken here at the app's safe point. */
	char reason[128];
	enum rk_request_mode m = rk_control_take_request(reason, sizeof reason);
	if (m == RK_REQ_COLD)
		(void)rk_restart_cold(reason);
	else if (m == RK_REQ_WARM)
		(void)rk_restart(reason);
}

int rk_ready(void)
{
	if (!rk_g.initialized)
		return -EPERM;
	rk_control_set_state(RK_CTL_READY);
	rk_sup_ready();
	return 0;
}

void rk_set_warm_allowed(bool allowed)
{
	if (!rk_ctl)
		return;
	if (allowed)
		atomic_fetch_and(&rk_ctl->flags, ~RK_CTL_WARM_DISABLED);
	else
		atomic_fetch_or(&rk_ctl->flags, RK_CTL_WARM_DISABLED);
}

bool rk_is_supervised(void)
{
	return rk_sup_active();
}

enum rk_request_mode rk_control_take_request(char *reason, size_t cap)
{
	struct rk_control *c = rk_ctl;
	if (!c)
		return RK_REQ_NONE;
	uint32_t m = atomic_exchange(&c->request_mode, RK_REQ_NONE);
	if (m != RK_REQ_WARM && m != RK_REQ_COLD)
		return RK_REQ_NONE;
	/* the supervisor wrote the reason before the mode; copy it NUL-bounded */
	size_t n = 0;
	while (n + 1 < cap && n < sizeof c->request_reason - 1 && c->request_reason[n]) {
		reason[n] = c->request_reason[n];
		n++;
	}
	reason[n] = 0;
	if (n == 0)
		rk_strlcpy(reason, "supervisor request", cap);
	return (enum rk_request_mode)m;
}

/* ---- unsafe regions --------------------------------------------------------- */

/* At thread exit.  Only while the slot is still ours: rk_init's reset may
 * have handed it to another thread since. */
static void slot_release(void *slot)
{
	struct rk_ctl_slot *s = slot;
	uint32_t me = rk_gettid();
	if (s && s != &rk_ctl->slots[OVERFLOW_SLOT])
		(void)atomic_compare_exchange_strong_explicit(&s->tid, &me, 0, memory_order_release,
							      memory_order_relaxed);
}

static void slot_key_create(void)
{
	slot_key_made = pthread_key_create(&slot_key, slot_release) == 0;
}

static struct rk_ctl_slot *slot_claim(void)
{
	uint32_t me = rk_gettid();
	for (unsigned i = 0; i < OVERFLOW_SLOT; i++) {
		uint32_t expect = 0;
		struct rk_ctl_slot *s = &rk_ctl->slots[i];
		if (atomic_load_explicit(&s->tid, memory_order_relaxed) == 0 &&
		    atomic_compare_exchange_strong(&s->tid, &expect, me)) {
			/* a thread that exited inside a region left its count */
			for (unsigned k = 0; k < RK_MAX_ARENAS; k++)
				if (atomic_load_explicit(&s->depth[k], memory_order_relaxed))
					atomic_store(&s->depth[k], 0);
			pthread_once(&slot_key_once, slot_key_create);
			/* Without the key (or its value) the slot stays ours after
			 * we exit: one slot fewer, nothing worse. */
			if (slot_key_made)
				(void)pthread_setspecific(slot_key, s);
			return s;
		}
	}
	return &rk_ctl->slots[OVERFLOW_SLOT];
}

static inline struct rk_ctl_slot *my_slot(void)
{
	struct rk_ctl_slot *s = tls_slot;
	if (RK_UNLIKELY(!s))
		s = tls_slot = slot_claim();
	return s;
}

/* Write protection follows this thread's outermost region of the arena. */
TLS uint16_t wp_depth[RK_MAX_ARENAS];

static void wp_region_enter(const rk_arena *a)
{
	wp_depth[a->index]++;
	/* Open it even when nested: a signal handler that interrupted a region
	 * runs with the kernel's init PKRU, which denies the key. */
	uint32_t bits = RK_PKRU_WD(a->pkey) | RK_PKRU_AD(a->pkey), v = rk_pkru_read();
	if (v & bits)
		rk_pkru_write(v & ~bits);
}

static void wp_region_leave(const rk_arena *a)
{
	if (wp_depth[a->index] && --wp_depth[a->index] == 0)
		rk_pkru_write((rk_pkru_read() & ~RK_PKRU_AD(a->pkey)) | RK_PKRU_WD(a->pkey));
}

/* Without membarrier, and always in the shared overflow slot. */
static void depth_up_locked(struct rk_ctl_slot *s, unsigned k)
{
	atomic_fetch_add(&s->depth[k], 1);
	if (s == &rk_ctl->slots[OVERFLOW_SLOT])
		tls_overflow_depth++;
}

/* Counts this thread into a region of arena k.  With membarrier the freeze
 * pays for the barrier: here a plain load and store on our own line, and the
 * freezer's MEMBARRIER_CMD_PRIVATE_EXPEDITED makes every running thread
 * either show its store or see the freeze flag (an asymmetric Dekker).
 * Without it, a locked add is the full barrier.  The shared overflow slot
 * always needs the locked add. */
static inline void depth_up(struct rk_ctl_slot *s, unsigned k)
{
	_Atomic uint16_t *d = &s->depth[k];
	if (RK_LIKELY(asym_barrier && s != &rk_ctl->slots[OVERFLOW_SLOT])) {
		atomic_store_explicit(d, (uint16_t)(atomic_load_explicit(d, memory_order_relaxed) + 1),
				      memory_order_relaxed);
		atomic_signal_fence(memory_order_seq_cst); /* the compiler keeps store, then look */
	} else {
		depth_up_locked(s, k);
	}
}

static void depth_down(struct rk_ctl_slot *s, unsigned k)
{
	_Atomic uint16_t *d = &s->depth[k];
	uint16_t v = atomic_load_explicit(d, memory_order_relaxed);
	if (RK_UNLIKELY(v == 0))
		return; /* unbalanced end: ignore rather than wrap */
	if (RK_UNLIKELY(s == &rk_ctl->slots[OVERFLOW_SLOT])) {
		atomic_fetch_sub(d, 1);
		if (tls_overflow_depth)
			tls_overflow_depth--;
	} else {
		atomic_store_explicit(d, (uint16_t)(v - 1), memory_order_release);
	}
}

/* This thread's open regions and allocator sections, all arenas. */
static unsigned my_depth(const struct rk_ctl_slot *s)
{
	if (s == &rk_ctl->slots[OVERFLOW_SLOT])
		return tls_overflow_depth;
	unsigned n = 0;
	for (unsigned k = 0; k < RK_MAX_ARENAS; k++)
		n += atomic_load_explicit(&s->depth[k], memory_order_relaxed);
	return n;
}

/* rk_unsafe_begin found a freeze, with this region already counted.  A
 * nested entry goes through while the restart waits for regions to close:
 * parked there, the outer region would stay open for the whole wait and
 * spoil the restart.  Otherwise step back and wait; a restart whose exec
 * failed wakes us, and the entry starts again. */
static __attribute__((noinline, cold)) void begin_in_freeze(struct rk_ctl_slot *s, unsigned k)
{
	for (;;) {
		int phase = atomic_load(&unsafe_freezing);
		if (phase == FREEZE_NONE || (phase == FREEZE_DRAIN && my_depth(s) > 1))
			return;
		depth_down(s, k);
		rk_freeze_wait(&unsafe_freezing);
		depth_up(s, k); /* then look again */
	}
}

void rk_unsafe_begin(rk_arena *arena)
{
	if (RK_UNLIKELY(!arena || !rk_ctl))
		return;
	struct rk_ctl_slot *s = my_slot();
	depth_up(s, arena->index); /* then look */
	if (RK_UNLIKELY(atomic_load_explicit(&unsafe_freezing, memory_order_relaxed)))
		begin_in_freeze(s, arena->index);
	if (RK_UNLIKELY(arena->pkey > 0))
		wp_region_enter(arena);
}

void rk_unsafe_end(rk_arena *arena)
{
	if (RK_UNLIKELY(!arena || !rk_ctl))
		return;
	/* Commit this thread's pending allocations while the region is still
	 * counted open: a death between the two then finds the region open
	 * (the arena is not reused), never a published object still pending. */
	if (rk_tls_pending)
		rk_pending_commit();
	/* Likewise its redo records, at its outermost end: a cut (no region
	 * open) then never finds a change whose record is not committed. */
	if (RK_UNLIKELY(rk_tls_redo_pending) && tls_slot && my_depth(tls_slot) == 1)
		rk_redo_commit_thread();
	atomic_signal_fence(memory_order_seq_cst);
	if (RK_UNLIKELY(arena->pkey > 0))
		wp_region_leave(arena); /* also in a child forked inside the region (no slot yet) */
	if (RK_LIKELY(tls_slot != NULL))
		depth_down(tls_slot, arena->index);
}

unsigned rk_unsafe_my_depth(void)
{
	return rk_ctl && tls_slot ? my_depth(tls_slot) : 0;
}

void rk_unsafe_note_enter(unsigned k)
{
	if (RK_LIKELY(rk_ctl != NULL))
		depth_up(my_slot(), k); /* the lock's CAS that follows is a full barrier */
}

void rk_unsafe_note_leave(unsigned k)
{
	if (RK_LIKELY(rk_ctl != NULL && tls_slot != NULL))
		depth_down(tls_slot, k);
}

/* A forked child has its own tid; it must not write its parent's slot, nor
 * free it at its exit (under a supervisor the block is shared). */
void rk_unsafe_forget_thread(void)
{
	tls_slot = NULL;
	tls_overflow_depth = 0;
	if (slot_key_made)
		(void)pthread_setspecific(slot_key, NULL);
}

static bool slot_open_other(const struct rk_ctl_slot *s, uint32_t me)
{
	uint32_t tid = atomic_load(&s->tid);
	if (tid == 0 || tid == me)
		return false;
	for (unsigned k = 0; k < RK_MAX_ARENAS; k++)
		if (atomic_load(&s->depth[k]))
			return true;
	return false;
}

/* Every running thread: its depth store is visible, or it sees the flag. */
static void freeze_barrier(void)
{
	if (asym_barrier)
		(void)syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
}

static bool others_open(void)
{
	uint32_t me = rk_gettid();
	for (unsigned i = 0; i < RK_CONTROL_SLOTS; i++)
		if (slot_open_other(&rk_ctl->slots[i], me))
			return true;
	return false;
}

bool rk_unsafe_freeze(uint64_t timeout_ns)
{
	if (!rk_ctl)
		return true;
	int none = FREEZE_NONE; /* a second freeze of the same restart stays closed */
	(void)atomic_compare_exchange_strong(&unsafe_freezing, &none, FREEZE_DRAIN);
	freeze_barrier(); /* then look at the counters */
	uint64_t t0 = rk_now_ns();
	bool busy;
	while ((busy = others_open()) && rk_now_ns() - t0 < timeout_ns)
		sched_yield();
	atomic_store(&unsafe_freezing, FREEZE_CLOSED);
	/* A thread still inside a region could open a nested one after the
	 * restart looks: it now sees CLOSED, or its count shows.  With none
	 * open, none can open (the next entry would be outermost). */
	if (busy)
		freeze_barrier();
	return !busy;
}

void rk_unsafe_thaw(void)
{
	rk_freeze_release(&unsafe_freezing);
}

/* ---- waiting out a restart's freeze ------------------------------------
 * A thread the freeze stops sleeps on the freeze flag: the restart's exec
 * ends it, or a restart whose exec failed clears the flag and wakes it.  A
 * futex: async-signal-safe and no allocation (the thread may be stopped in
 * a signal handler). */
void rk_freeze_wait(_Atomic int *flag)
{
	int saved = errno, v;
	while ((v = atomic_load(flag)) != 0) {
		if (syscall(SYS_futex, flag, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0) == 0 || errno == EAGAIN ||
		    errno == EINTR)
			continue;
		/* no futex (a seccomp filter?): poll rather than sleep for good */
		struct timespec ms = {0, 1000 * 1000};
		(void)nanosleep(&ms, NULL);
	}
	errno = saved;
}

void rk_freeze_release(_Atomic int *flag)
{
	int saved = errno;
	atomic_store(flag, 0);
	/* Only fails without futexes, and then the sleepers poll. */
	(void)syscall(SYS_futex, flag, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
	errno = saved;
}

bool rk_component_is_safe(const rk_arena *arena)
{
	if (!arena || !rk_ctl)
		return true;
	for (unsigned i = 0; i < RK_CONTROL_SLOTS; i++) {
		const struct rk_ctl_slot *s = &rk_ctl->slots[i];
		if (atomic_load(&s->tid) && atomic_load(&s->depth[arena->index]))
			return false;
	}
	return true;
}

uint32_t rk_unsafe_open_mask(void)
{
	uint32_t mask = 0;
	if (!rk_ctl)
		return 0;
	for (unsigned i = 0; i < RK_CONTROL_SLOTS; i++) {
		/* any depth counts, whoever owns the slot: a thread that
		 * exited inside a region left its arena half-changed, and a
		 * stray write of 0 over the tid must not hide an open region */
		const struct rk_ctl_slot *s = &rk_ctl->slots[i];
		for (unsigned k = 0; k < RK_MAX_ARENAS; k++)
			if (atomic_load(&s->depth[k]))
				mask |= 1u << k;
	}
	return mask;
}

void rk_unsafe_describe(unsigned k, char *why, size_t cap)
{
	uint32_t tid = 0;
	for (unsigned i = 0; rk_ctl && i < RK_CONTROL_SLOTS && !tid; i++) {
		const struct rk_ctl_slot *s = &rk_ctl->slots[i];
		if (k < RK_MAX_ARENAS && atomic_load(&s->depth[k]))
			tid = atomic_load(&s->tid);
	}
	char num[24];
	rk_fmt_u64(num, tid == OVERFLOW_TID ? 0 : tid);
	rk_strlcpy(why, "unsafe region open in arena ", cap);
	rk_strlcat(why, k < rk_g.narenas ? rk_g.arenas[k].name : "?", cap);
	rk_strlcat(why, " (tid ", cap);
	rk_strlcat(why, num, cap);
	rk_strlcat(why, ")", cap);
}
