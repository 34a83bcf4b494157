/* ev_internal.h - the error-virtualization run-time library's shared state
 * (docs/errvirt.md).  One thread owns error virtualization: the first that
 * passes a gate.  Its state is one mmap'd block; only the pieces that the
 * instrumented code touches on every store are thread-local. */
#ifndef EV_INTERNAL_H
#define EV_INTERNAL_H

#include "rekindle_ev.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#define EV_TLS __attribute__((tls_model("initial-exec"))) __thread

/* ev_checkpoint.S writes these offsets: keep them in step. */
struct ev_regs {
	uint64_t rbx, rbp, r12, r13, r14, r15, rsp, rip;
};

struct ev_undo {
	uintptr_t addr; /* EV_BULK set: a byte range in the bulk area */
	uint64_t val;   /* the old word, or bulk offset << 32 | length */
};
#define EV_BULK (1ull << 63)

enum ev_defer_kind { EV_DEF_FREE = 1, EV_DEF_CLOSE, EV_DEF_MUNMAP, EV_DEF_RK_FREE, EV_DEF_CLOSEDIR, EV_DEF_DLCLOSE };

struct ev_op {
	uint32_t kind; /* enum ev_defer_kind, or the model index of a note */
	uint64_t ret, a0, a1;
};

#define EV_UNDO_CAP (64u * 1024u)
#define EV_BULK_CAP (4u * 1024u * 1024u)
#define EV_DEFER_CAP 1024u
#define EV_NOTE_CAP 256u
#define EV_FRESH_CAP 16u
#define EV_FRESH_PREFILL 4096u
/* a frame larger than this is not copied: the window closes instead */
#define EV_FRAME_MAX (256u * 1024u)

struct ev_state {
	int owner_tid;
	bool window_open;
	bool recovered_window; /* the window right after an injected error */
	bool in_recovery;
	uint32_t gate_fn;      /* model index of the gate that began the window */
	const char *closed_reason;
	int32_t closed_by_fn; /* model index, or -1 */
	uintptr_t closed_by_pc;
	uintptr_t closed_callee; /* the unknown callee that closed it, or 0 */
	uintptr_t probe; /* the word __rk_ev_log_word is reading, or 0 */
	uint64_t epoch;
	uint64_t gates, closes, recoveries, fallbacks, injections;
	uint64_t closed_irrecoverable, closed_unknown;
	/* REKINDLE_EV_MASK_SOCKET_WRITES=1: a checked write to a peer's stream
	 * socket is a gate (ev_tx.c); the output gates passed, and the errors
	 * injected at them (each a reset after bytes the peer already has) */
	bool mask_outputs;
	uint64_t output_gates, output_injections;
	/* what the undo log took (REKINDLE_EV_REPORT): words one by one, byte
	 * ranges (library calls, wide stores), and frame copies */
	uint64_t logged_words, logged_ranges, logged_range_bytes, frame_copies, frame_bytes;
	uint64_t fresh_blocks, fresh_skips; /* blocks seen, stores not logged */
	uint64_t stack_skips; /* stack stores not logged: dead, or in a frame copy */
	uint64_t holes_uncopied; /* holes popped in a window, too large to copy */
	/* the call sites that closed windows most (REKINDLE_EV_REPORT) */
	struct ev_closer {
		uintptr_t pc;
		uint64_t n;
	} closers[16];
	uint64_t last_recovery_gate, recoveries_in_row;
	uint32_t nundo, ndefer, nnote;
	uint64_t bulk_used;
	uint64_t fault_ns; /* CLOCK_MONOTONIC at the recovered fault's signal */
	struct ev_undo *undo;
	unsigned char *bulk;
	struct ev_op defer[EV_DEFER_CAP];
	struct ev_op note[EV_NOTE_CAP];
	/* the blocks this transaction allocated (ev_fresh.c) */
	struct ev_block {
		uintptr_t lo, hi;
	} fresh[EV_FRESH_CAP];
	uint32_t nfresh;
};

enum ev_role { EV_ROLE_UNKNOWN = 0, EV_ROLE_OWNER, EV_ROLE_FOREIGN };

extern struct ev_state *ev;
extern EV_TLS struct ev_regs rk_ev_regs;
extern EV_TLS uint64_t __rk_ev_key;
extern EV_TLS uint64_t __rk_ev_filter[RK_EV_FILTER_SLOTS];
extern EV_TLS uintptr_t __rk_ev_stack_top;
extern EV_TLS int ev_role;

/* The entry points the pass calls (include/rekindle_ev.h lists the rest). */
uint64_t __rk_ev_checkpoint(uint32_t fn);
void __rk_ev_tx_end(uint32_t fn);
void __rk_ev_tx_end_output(uint32_t fn, uint64_t fd);
void __rk_ev_log_word(uint64_t *w);
void __rk_ev_log_word_pm(uint64_t *w); /* ev_log_word.S: preserve_most */
void rk_ev_log_word_at(uint64_t *w, uintptr_t pc);
void __rk_ev_log_range(void *p, uint64_t n);
void __rk_ev_frame_exit(uintptr_t fp);
void __rk_ev_log_call(uint32_t fn, uint64_t a0, uint64_t a1, uint64_t a2);
void __rk_ev_note(uint32_t fn, uint64_t ret, uint64_t a0, uint64_t a1);
void __rk_ev_window_close(uint32_t fn);
void __rk_ev_unknown_call(void *callee);
void __rk_ev_compensate(uint32_t fn, uint64_t ret, uint64_t a0, uint64_t a1);
void __rk_ev_free(void *p);
int __rk_ev_close(int fd);
int __rk_ev_closedir(void *dir);
int __rk_ev_munmap(void *p, size_t n);
int __rk_ev_dlclose(void *handle);
void __rk_ev_rk_free(void *arena, void *p);
void *__rk_ev_realloc(void *p, size_t n);
void __rk_ev_hole_push(void *p, uint64_t n);
void __rk_ev_hole_pop(void *p);
void __rk_ev_fresh(uint32_t fn, uint64_t ret, uint64_t a0, uint64_t a1, uint64_t a2);
void __rk_ev_logged(uint64_t *words, uint64_t *range_bytes);
uint64_t __rk_ev_stack_skips(void);

/* ev_log.c */
void ev_log_reset(struct ev_state *s);
void ev_log_new_epoch(struct ev_state *s);
bool ev_log_bytes(struct ev_state *s, const void *p, uint64_t n);
bool ev_log_frame(struct ev_state *s);
void ev_log_rollback(struct ev_state *s);
void ev_holes_drop_below(uintptr_t addr);
void ev_stack_init(void);

/* ev_fresh.c */
void ev_fresh_reset(struct ev_state *s);
void ev_fresh_call(struct ev_state *s, uint32_t fn, uint64_t ret, uint64_t a0, uint64_t a1, uint64_t a2);

/* [p, p+n) lies in one block of the running transaction (on every logged
 * word's slow path: inline) */
static inline bool ev_fresh_covers(const struct ev_state *s, uintptr_t p, uint64_t n)
{
	for (uint32_t i = s->nfresh; i-- > 0;)
		if (p >= s->fresh[i].lo && p < s->fresh[i].hi && n <= s->fresh[i].hi - p)
			return true;
	return false;
}

/* ev_tx.c */
void ev_close_window(struct ev_state *s, const char *reason, int32_t fn, uintptr_t pc);
void ev_commit(struct ev_state *s);
bool ev_deferring(void);
uint64_t rk_ev_tx_begin(uint32_t fn);
uint64_t ev_now_ns(void);

/* ev_model.c */
void ev_compensate_one(uint8_t comp, uint64_t ret, uint64_t a0, uint64_t a1);
const char *ev_comp_name(uint8_t comp);

/* ev_event.c: one JSON line on stderr, async-signal-safe */
struct ev_line {
	char buf[512];
	unsigned n;
};
void ev_line_begin(struct ev_line *l, const char *kind, const char *reason);
void ev_line_str(struct ev_line *l, const char *key, const char *val);
void ev_line_u64(struct ev_line *l, const char *key, uint64_t v);
void ev_line_hex(struct ev_line *l, const char *key, uint64_t v);
void ev_line_end(struct ev_line *l);

/* ev_probe.c: the campaign's gate trace and error probe.  The trace file's
 * layout; tools/errvirt/ev_gates.py reads it (tests/test_errvirt.py runs
 * both ends). */
#define EV_GATE_TRACE_MAGIC "RKEVGAT1"
#define EV_GATE_TRACE_SLOTS 4096u /* a power of two */
struct ev_gate_trace_header {
	char magic[8];
	uint64_t slots;
};
struct ev_gate_slot {
	uint64_t pc; /* 0: empty */
	uint64_t fn; /* the gate's model index */
	uint64_t count;
};
void ev_probe_init(void);
/* every gate passed: count it; true = make this pass fail (the probe) */
bool ev_probe_gate(struct ev_state *s, uintptr_t pc, uint32_t fn);

/* ev_report.c */
void ev_count_closer(struct ev_state *s, uintptr_t pc);

/* ev_fault.c: librekindle's fatal-signal handler calls this first (a weak
 * reference): 1 = recovered, resume; 0 = not ours, go on with the restart. */
int rk_ev_fault_hook(int sig, siginfo_t *si, void *uc);
int ev_gettid(void);

#endif
