/* ev_report.c - with REKINDLE_EV_REPORT=1, one line at exit with what the
 * process's transactions did: gates passed, windows closed early and why,
 * and the calls that closed them most (the pc of an irrecoverable call
 * site, or the address of an unknown callee: name them with addr2line or
 * nm).  The share of windows still open at the next gate is the run-time
 * recovery surface. */
#define _GNU_SOURCE
#include "ev_internal.h"

#include <stdlib.h>
#include <string.h>

void ev_count_closer(struct ev_state *s, uintptr_t pc)
{
	size_t n = sizeof s->closers / sizeof s->closers[0], min = 0;
	for (size_t i = 0; i < n; i++) {
		if (s->closers[i].pc == pc || s->closers[i].n == 0) {
			s->closers[i].pc = pc;
			s->closers[i].n++;
			return;
		}
		if (s->closers[i].n < s->closers[min].n)
			min = i;
	}
	s->closers[min] = (struct ev_closer){pc, 1}; /* evict the rarest */
}

/* What the undo log has taken so far: words one by one, and bytes of
 * ranges (tests/unit: a saving must show).  Named __rk_ev_ so that the
 * pass lets a call to it stay inside the transaction. */
void __rk_ev_logged(uint64_t *words, uint64_t *range_bytes)
{
	const struct ev_state *s = ev;
	*words = s ? s->logged_words : 0;
	*range_bytes = s ? s->logged_range_bytes : 0;
}

/* Stack stores the log skipped (dead, or inside a frame copy). */
uint64_t __rk_ev_stack_skips(void)
{
	return ev ? ev->stack_skips : 0;
}

/* Read before main: a server may replace its environment (nginx keeps only
 * the variables its `env` directives name). */
static bool ev_report_on;
__attribute__((constructor)) static void ev_report_read_env(void)
{
	const char *on = getenv("REKINDLE_EV_REPORT");
	ev_report_on = on && strcmp(on, "1") == 0;
}

__attribute__((destructor)) static void ev_report(void)
{
	struct ev_state *s = ev;
	if (!s || !ev_report_on)
		return;
	struct ev_line l;
	ev_line_begin(&l, "report", "ev_report");
	ev_line_u64(&l, "gates", s->gates);
	ev_line_u64(&l, "closed", s->closes);
	ev_line_u64(&l, "closed_irrecoverable", s->closed_irrecoverable);
	ev_line_u64(&l, "closed_unknown", s->closed_unknown);
	ev_line_u64(&l, "output_gates", s->output_gates);
	ev_line_u64(&l, "output_injections", s->output_injections);
	ev_line_u64(&l, "recoveries", s->recoveries);
	ev_line_u64(&l, "fallbacks", s->fallbacks);
	ev_line_u64(&l, "logged_words", s->logged_words);
	ev_line_u64(&l, "logged_ranges", s->logged_ranges);
	ev_line_u64(&l, "logged_range_bytes", s->logged_range_bytes);
	ev_line_u64(&l, "frame_copies", s->frame_copies);
	ev_line_u64(&l, "frame_bytes", s->frame_bytes);
	ev_line_u64(&l, "fresh_blocks", s->fresh_blocks);
	ev_line_u64(&l, "fresh_skips", s->fresh_skips);
	ev_line_u64(&l, "stack_skips", s->stack_skips);
	ev_line_u64(&l, "holes_uncopied", s->holes_uncopied);
	ev_line_end(&l);
	for (size_t i = 0; i < sizeof s->closers / sizeof s->closers[0]; i++) {
		if (!s->closers[i].n)
			continue;
		ev_line_begin(&l, "closer", "ev_report");
		ev_line_hex(&l, "at", s->closers[i].pc);
		ev_line_u64(&l, "n", s->closers[i].n);
		ev_line_end(&l);
	}
}
