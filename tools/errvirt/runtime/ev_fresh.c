/* ev_fresh.c - the blocks the running transaction allocated: the gate's
 * own block (malloc, calloc, realloc, posix_memalign, mmap, strdup) and
 * those of allocating calls embedded in it (a ck_malloc whose failure
 * aborts, so it is no gate).  A rollback frees every one of them (the
 * gate's compensation, the embedded calls' notes), so their contents do not
 * matter after it, and the undo log skips stores into them.  The pass can
 * prove this only inside one function for results it sees (docs/errvirt.md,
 * "What is logged"); nginx's pools come from posix_memalign, in another
 * file and through an out-pointer, so only the run-time sees them.
 * The set empties at every transaction boundary (a new epoch). */
#define _GNU_SOURCE
#include "ev_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* To measure each saving's share (docs/errvirt.md, "Cost"): without it,
 * the same binary logs more, nothing else changes.  Read before main, as
 * nginx replaces its environment. */
static bool ev_fresh_off, ev_prefill_off;
__attribute__((constructor)) static void ev_fresh_read_env(void)
{
	const char *v = getenv("REKINDLE_EV_NO_FRESH_BLOCKS");
	ev_fresh_off = v && strcmp(v, "1") == 0;
	v = getenv("REKINDLE_EV_NO_PREFILL");
	ev_prefill_off = v && strcmp(v, "1") == 0;
}

void ev_fresh_reset(struct ev_state *s)
{
	s->nfresh = 0;
}

/* The block's first words go into the undo filter as if logged: the
 * program's stores into them then pass the inline check and never call
 * the run-time.  A slot taken from another word only makes that word be
 * logged again if it is written again (correct: a rollback applies the
 * log newest first).  Only the first EV_FRESH_PREFILL bytes: a large
 * buffer's few written words are cheaper to skip one by one. */
typedef uint64_t ev_v2 __attribute__((vector_size(16)));
static void ev_fresh_prefill(uintptr_t p, uint64_t n)
{
	uintptr_t lo = (p + 7) & ~(uintptr_t)7, hi = (p + (n < EV_FRESH_PREFILL ? n : EV_FRESH_PREFILL)) & ~(uintptr_t)7;
	if (hi <= lo)
		return;
	/* consecutive words, consecutive slots: runs up to the table's end */
	uint64_t tag = lo | __rk_ev_key, left = (hi - lo) >> 3;
	uint32_t at = (uint32_t)(lo >> 3) & (RK_EV_FILTER_SLOTS - 1);
	while (left) {
		uint64_t run = RK_EV_FILTER_SLOTS - at < left ? RK_EV_FILTER_SLOTS - at : left;
		uint64_t *d = &__rk_ev_filter[at], i = 0;
		/* two slots a store (SSE2, always there on x86-64); no carry
		 * into the epoch: addresses are below 2^47 */
		ev_v2 v = {tag, tag + 8}, step = {16, 16};
		for (; i + 2 <= run; i += 2, v += step)
			memcpy(&d[i], &v, sizeof v);
		if (i < run)
			d[i] = v[0];
		tag += 8 * run;
		left -= run;
		at = 0;
	}
}

/* A full set only means more logging: a block left out is logged. */
static void ev_fresh_add(struct ev_state *s, uintptr_t p, uint64_t n)
{
	if (ev_fresh_off || !p || n == 0 || p + n < p || s->nfresh == EV_FRESH_CAP)
		return;
	s->fresh[s->nfresh++] = (struct ev_block){p, p + n};
	s->fresh_blocks++;
	if (!ev_prefill_off)
		ev_fresh_prefill(p, n);
}

/* The block an allocating call returned, from its model index, result and
 * arguments; nothing for any other call or a failed one. */
void ev_fresh_call(struct ev_state *s, uint32_t fn, uint64_t ret, uint64_t a0, uint64_t a1, uint64_t a2)
{
	switch (fn) {
	case EV_FN_malloc:
		ev_fresh_add(s, ret, a0);
		break;
	case EV_FN_calloc:
		if (a1 == 0 || a0 <= UINT64_MAX / a1)
			ev_fresh_add(s, ret, a0 * a1);
		break;
	case EV_FN_realloc:
		/* grown in place, the block is the program's old one */
		if (ret != a0)
			ev_fresh_add(s, ret, a1);
		break;
	case EV_FN_strdup:
	case EV_FN_strndup:
		if (ret)
			ev_fresh_add(s, ret, strlen((const char *)ret) + 1);
		break;
	case EV_FN_posix_memalign:
		if (ret == 0 && a0)
			ev_fresh_add(s, *(const uintptr_t *)a0, a2);
		break;
	case EV_FN_mmap:
	case EV_FN_mmap64:
		if (ret != (uint64_t)(uintptr_t)MAP_FAILED)
			ev_fresh_add(s, ret, a1);
		break;
	}
}

/* Right after an allocating gate's checkpoint returned the first time (the
 * transaction has begun): its block is fresh until the next gate. */
void __rk_ev_fresh(uint32_t fn, uint64_t ret, uint64_t a0, uint64_t a1, uint64_t a2)
{
	if (__rk_ev_key != 0)
		ev_fresh_call(ev, fn, ret, a0, a1, a2);
}
