/* ev_log.c - the undo log: the old value of each 8-byte word the
 * transaction writes (logged once per transaction: the filter remembers
 * which words this epoch has seen), byte ranges a library call or a dying
 * stack frame will overwrite, and the rollback that puts them back in
 * reverse order.  The instrumented code checks the filter inline and calls
 * __rk_ev_log_word only on a miss. */
#define _GNU_SOURCE
#include "ev_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

EV_TLS uint64_t __rk_ev_key;
EV_TLS uint64_t __rk_ev_filter[RK_EV_FILTER_SLOTS];
EV_TLS uintptr_t __rk_ev_stack_top = UINTPTR_MAX;

/* To measure its share (docs/errvirt.md, "Cost"): REKINDLE_EV_NO_STACK_COVER=1
 * logs stack words the frame copies or a rollback already take care of.
 * Read before main, as nginx replaces its environment. */
static bool ev_stack_off;
__attribute__((constructor)) static void ev_stack_read_env(void)
{
	const char *v = getenv("REKINDLE_EV_NO_STACK_COVER");
	ev_stack_off = v && strcmp(v, "1") == 0;
}

/* Holes: large allocas of live frames, newest (lowest) last.  The frame
 * copies leave them out; their stores are logged one by one instead.
 * Dropping a hole is always safe (its bytes are then copied too). */
#define EV_HOLES 64u
static EV_TLS struct ev_hole {
	uintptr_t lo, hi;
} ev_holes[EV_HOLES];
static EV_TLS uint32_t ev_nholes;

/* Holes below addr belong to frames that are gone (a rollback, a longjmp). */
void ev_holes_drop_below(uintptr_t addr)
{
	while (ev_nholes && ev_holes[ev_nholes - 1].lo < addr)
		ev_nholes--;
}

void __rk_ev_hole_push(void *p, uint64_t n)
{
	ev_holes_drop_below((uintptr_t)p);
	if (ev_nholes < EV_HOLES)
		ev_holes[ev_nholes++] = (struct ev_hole){(uintptr_t)p, (uintptr_t)p + n};
}

/* A frame that was alive at the gate returns while the window is open: the
 * frame copies left its hole out, and the frames called next may lay their
 * own allocas over those bytes, whose stores are never logged.  A rollback
 * resumes a frame that expects the hole as it was, so its bytes are logged
 * now (the words changed since the gate are logged already, older: the log
 * is undone newest first).  Up to EV_HOLE_POP_COPY bytes: lighttpd's
 * connection_handle_read_state keeps 16 KiB of header offsets in its frame
 * and returns several times a request; copying them cost more than the rest
 * of the log together.  A larger hole is counted (holes_uncopied in the
 * report) and stays the gap docs/errvirt.md describes. */
#define EV_HOLE_POP_COPY 4096u
void __rk_ev_hole_pop(void *p)
{
	if (!ev_nholes || ev_holes[ev_nholes - 1].lo != (uintptr_t)p)
		return;
	const struct ev_hole *h = &ev_holes[--ev_nholes];
	if (__rk_ev_key == 0 || !ev || h->lo < rk_ev_regs.rsp)
		return;
	if (h->hi - h->lo > EV_HOLE_POP_COPY) {
		ev->holes_uncopied++;
		return;
	}
	ev->frame_bytes += h->hi - h->lo;
	(void)ev_log_bytes(ev, (const void *)h->lo, h->hi - h->lo);
}

/* The owner thread's stack, and the parts of it that the frame copies of
 * the running transaction left out (holes then registered).  Together with
 * the gate's stack pointer and __rk_ev_stack_top they say which stack words
 * need no entry of their own (ev_stack_covers). */
static EV_TLS uintptr_t ev_stack_lo, ev_stack_hi;
static EV_TLS struct ev_hole ev_uncopied[EV_HOLES];
static EV_TLS uint32_t ev_nuncopied;
static EV_TLS bool ev_uncopied_lost; /* more than EV_HOLES: no copy counts */

/* Once, when this thread becomes the owner.  Without its bounds, every
 * stack word is logged (no skip). */
void ev_stack_init(void)
{
	pthread_attr_t a;
	void *lo;
	size_t n;
	if (pthread_getattr_np(pthread_self(), &a) != 0)
		return;
	if (pthread_attr_getstack(&a, &lo, &n) == 0 && (uintptr_t)lo + n > (uintptr_t)lo) {
		ev_stack_lo = (uintptr_t)lo;
		ev_stack_hi = (uintptr_t)lo + n;
	}
	pthread_attr_destroy(&a);
}

static void ev_uncopied_add(uintptr_t lo, uintptr_t hi)
{
	if (ev_nuncopied == EV_HOLES)
		ev_uncopied_lost = true;
	else
		ev_uncopied[ev_nuncopied++] = (struct ev_hole){lo, hi};
}

/* [p, p+n) of the owner's stack needs no entry of its own when a rollback
 * either abandons it or puts it back whole:
 *  - dead: below the gate's stack pointer.  A rollback resumes the gate's
 *    frame with that stack pointer; what lies below belongs to frames
 *    pushed after the gate, gone with them.
 *  - copied: between the gate's stack pointer and __rk_ev_stack_top, the
 *    range this transaction's frame copies took whole (at the checkpoint,
 *    and at each return into an ancestor frame), except the holes they
 *    left out, which stay logged word by word.
 * The range only grows during a transaction, so a word once covered stays
 * covered until the next gate (its filter slot may say "logged"). */
static bool ev_stack_covers(uintptr_t p, uint64_t n)
{
	uintptr_t sp = rk_ev_regs.rsp, top = __rk_ev_stack_top;
	if (p < ev_stack_lo || p >= ev_stack_hi || n > ev_stack_hi - p || sp < ev_stack_lo || sp >= ev_stack_hi)
		return false;
	if (p + n <= sp)
		return true;
	if (p < sp || ev_uncopied_lost || top > ev_stack_hi || p + n > top)
		return false;
	for (uint32_t i = 0; i < ev_nuncopied; i++)
		if (p < ev_uncopied[i].hi && ev_uncopied[i].lo < p + n)
			return false;
	return true;
}

/* One piece of a frame copy (counted for REKINDLE_EV_REPORT). */
static bool ev_log_frame_bytes(struct ev_state *s, uintptr_t lo, uintptr_t hi)
{
	s->frame_bytes += hi - lo;
	return ev_log_bytes(s, (const void *)lo, hi - lo);
}

/* [lo, hi) of the stack, without the holes in it. */
static bool ev_log_stack(struct ev_state *s, uintptr_t lo, uintptr_t hi)
{
	uintptr_t at = lo;
	for (uint32_t i = ev_nholes; i-- > 0 && at < hi;) {
		const struct ev_hole *h = &ev_holes[i];
		if (h->hi <= at || h->lo >= hi)
			continue;
		if (h->lo > at && !ev_log_frame_bytes(s, at, h->lo))
			return false;
		ev_uncopied_add(h->lo > at ? h->lo : at, h->hi < hi ? h->hi : hi);
		at = h->hi;
	}
	return at >= hi || ev_log_frame_bytes(s, at, hi);
}

void ev_log_reset(struct ev_state *s)
{
	s->nundo = 0;
	s->bulk_used = 0;
}

/* A new epoch makes every filter slot stale at once; the slots are wiped
 * only when the 16-bit epoch wraps. */
void ev_log_new_epoch(struct ev_state *s)
{
	if (++s->epoch >= (1u << 16)) {
		memset(__rk_ev_filter, 0, sizeof __rk_ev_filter);
		s->epoch = 1;
	}
	__rk_ev_key = s->epoch << RK_EV_EPOCH_SHIFT;
	ev_nuncopied = 0;
	ev_uncopied_lost = false;
	ev_fresh_reset(s);
}

bool ev_log_bytes(struct ev_state *s, const void *p, uint64_t n)
{
	if (n == 0)
		return true;
	if (s->nundo == EV_UNDO_CAP || n > EV_BULK_CAP - s->bulk_used) {
		ev_close_window(s, "ev_log_full", -1, 0);
		return false;
	}
	memcpy(s->bulk + s->bulk_used, p, n);
	s->undo[s->nundo++] = (struct ev_undo){(uintptr_t)p | EV_BULK, s->bulk_used << 32 | n};
	s->bulk_used += n;
	return true;
}

/* The checkpoint frame, from the stack pointer at the gate to its return
 * address: spills, locals and saved registers the resumed code reads back.
 * Its stores to its own allocas are then not logged one by one. */
bool ev_log_frame(struct ev_state *s)
{
	uintptr_t lo = rk_ev_regs.rsp, hi = rk_ev_regs.rbp + 16;
	if (rk_ev_regs.rbp < lo || hi - lo > EV_FRAME_MAX) {
		ev_close_window(s, "ev_frame_unknown", (int32_t)s->gate_fn, rk_ev_regs.rip);
		return false;
	}
	ev_holes_drop_below(lo);
	s->frame_copies++;
	if (!ev_log_stack(s, lo, hi))
		return false;
	__rk_ev_stack_top = hi;
	return true;
}

/* pc: the store site (for the window-closed event) */
void rk_ev_log_word_at(uint64_t *w, uintptr_t pc)
{
	if (__rk_ev_key == 0)
		return; /* no open window on this thread */
	struct ev_state *s = ev;
	uint64_t *slot = &__rk_ev_filter[((uintptr_t)w >> 3) & (RK_EV_FILTER_SLOTS - 1)];
	if (ev_fresh_covers(s, (uintptr_t)w, sizeof *w)) {
		/* in a block a rollback frees: the filter skips it from now on */
		*slot = (uintptr_t)w | __rk_ev_key;
		s->fresh_skips++;
		return;
	}
	if (!ev_stack_off && ev_stack_covers((uintptr_t)w, sizeof *w)) {
		*slot = (uintptr_t)w | __rk_ev_key;
		s->stack_skips++;
		return;
	}
	if (s->nundo == EV_UNDO_CAP) {
		ev_close_window(s, "ev_log_full", -1, pc);
		return;
	}
	/* The program's store is about to fault if this read does: the
	 * handler then knows the fault for the program's, not ours. */
	s->probe = (uintptr_t)w | 1; /* w is aligned: bit 0 says "probing" */
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	uint64_t old = *w;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	s->probe = 0;
	*slot = (uintptr_t)w | __rk_ev_key;
	s->undo[s->nundo++] = (struct ev_undo){(uintptr_t)w, old};
	s->logged_words++;
}

/* The slow path with the C convention (REKINDLE_EV_NO_PRESERVE_MOST, and
 * the no-filter build); the pass's usual one is __rk_ev_log_word_pm. */
void __rk_ev_log_word(uint64_t *w)
{
	rk_ev_log_word_at(w, (uintptr_t)__builtin_return_address(0));
}

void __rk_ev_log_range(void *p, uint64_t n)
{
	if (__rk_ev_key == 0)
		return;
	struct ev_state *s = ev;
	if (ev_fresh_covers(s, (uintptr_t)p, n)) {
		s->fresh_skips++;
		return;
	}
	if (!ev_stack_off && ev_stack_covers((uintptr_t)p, n)) {
		s->stack_skips++;
		return;
	}
	s->logged_ranges++;
	s->logged_range_bytes += n;
	(void)ev_log_bytes(s, p, n);
}

/* A function returns while its caller's frame is part of what a rollback
 * resumes: copy the caller's frame before the caller runs again and before
 * later calls reuse the space.  fp is the returning function's frame
 * pointer; the caller's is saved at *fp (every instrumented function keeps
 * a frame pointer). */
void __rk_ev_frame_exit(uintptr_t fp)
{
	if (__rk_ev_key == 0) {
		__rk_ev_stack_top = UINTPTR_MAX;
		return;
	}
	struct ev_state *s = ev;
	uintptr_t top = __rk_ev_stack_top, parent = *(const uintptr_t *)fp + 16;
	if (parent <= fp + 16 || parent - top > EV_FRAME_MAX) {
		ev_close_window(s, "ev_frame_chain", -1, (uintptr_t)__builtin_return_address(0));
		return;
	}
	s->frame_copies++;
	if (ev_log_stack(s, top, parent))
		__rk_ev_stack_top = parent;
}

/* Newest first, so each location ends with its oldest logged value. */
void ev_log_rollback(struct ev_state *s)
{
	for (uint32_t i = s->nundo; i-- > 0;) {
		const struct ev_undo *u = &s->undo[i];
		if (u->addr & EV_BULK)
			memcpy((void *)(u->addr & ~EV_BULK), s->bulk + (u->val >> 32), u->val & 0xffffffffu);
		else
			*(uint64_t *)u->addr = u->val;
	}
	ev_log_reset(s);
}
