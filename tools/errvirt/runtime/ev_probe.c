/* ev_probe.c - two tools of the fault campaign's FIRestarter sample
 * (docs/errvirt.md, "Non-critical transactions"), both off unless their
 * variable is set:
 *
 * REKINDLE_EV_GATE_TRACE=PATH counts the gates passed, per call site, in a
 * file mapped MAP_SHARED (readable while the process runs, intact after a
 * crash): the transactions a workload executes.  Layout (read by
 * tools/errvirt/ev_gates.py): struct ev_gate_trace_header, then
 * EV_GATE_TRACE_SLOTS of struct ev_gate_slot, a hash table keyed by the
 * gate's pc (the instruction after the checkpoint's call).
 *
 * REKINDLE_EV_PROBE_GATE=0xPC:N makes the gate at PC fail on its N-th pass
 * as a recovery would make it fail (compensation, the model's error), with
 * no fault: what the program's error handler then does tells a critical
 * path (it exits, or retries the same call) from a non-critical one.  The
 * gate passed next is reported ("probe_next"): same = 1, a retry, when it
 * is the same call site with the same stack pointer (the same frame calls
 * it again; a wrapper such as nginx's ngx_memalign called next from
 * another caller is not a retry). */
#define _GNU_SOURCE
#include "ev_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static struct ev_gate_slot *gate_slots;
static uintptr_t probe_pc, probe_rsp;
static uint64_t probe_at, probe_seen;
static bool probe_fired, probe_reported;

static void probe_refused(const char *why, const char *var)
{
	struct ev_line l;
	ev_line_begin(&l, "disabled", why);
	ev_line_str(&l, "variable", var);
	ev_line_u64(&l, "errno", (uint64_t)errno);
	ev_line_end(&l);
}

static int gate_trace_open(const char *path)
{
	size_t sz = sizeof(struct ev_gate_trace_header) + EV_GATE_TRACE_SLOTS * sizeof(struct ev_gate_slot);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)sz) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	void *m = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd);
	if (m == MAP_FAILED)
		return -e;
	struct ev_gate_trace_header *h = m;
	h->slots = EV_GATE_TRACE_SLOTS;
	gate_slots = (struct ev_gate_slot *)(h + 1);
	/* the magic last: a reader never takes a half-made file for a trace */
	memcpy(h->magic, EV_GATE_TRACE_MAGIC, sizeof h->magic);
	return 0;
}

/* "0x55555560a1b3:12" */
static bool probe_parse(const char *v)
{
	char *end;
	errno = 0;
	unsigned long long pc = strtoull(v, &end, 16);
	if (errno || end == v || *end != ':' || pc == 0)
		return false;
	const char *n = end + 1;
	unsigned long long at = strtoull(n, &end, 10);
	if (errno || end == n || *end || at == 0)
		return false;
	probe_pc = (uintptr_t)pc;
	probe_at = at;
	return true;
}

void ev_probe_init(void)
{
	const char *trace = getenv("REKINDLE_EV_GATE_TRACE");
	if (trace && *trace) {
		int r = gate_trace_open(trace);
		if (r < 0) {
			errno = -r;
			probe_refused("ev_gate_trace_open_failed", "REKINDLE_EV_GATE_TRACE");
		}
	}
	const char *probe = getenv("REKINDLE_EV_PROBE_GATE");
	if (probe && *probe && !probe_parse(probe)) {
		errno = EINVAL;
		probe_refused("ev_bad_probe_gate", "REKINDLE_EV_PROBE_GATE");
	}
}

static void gate_trace_hit(uintptr_t pc, uint32_t fn)
{
	size_t mask = EV_GATE_TRACE_SLOTS - 1, i = (size_t)((pc >> 2) * 0x9e3779b97f4a7c15ull) & mask;
	for (size_t n = 0; n < EV_GATE_TRACE_SLOTS; n++, i = (i + 1) & mask) {
		struct ev_gate_slot *g = &gate_slots[i];
		if (g->pc == pc) {
			g->count++;
			return;
		}
		if (g->pc == 0) {
			g->fn = fn;
			g->count = 1;
			g->pc = pc; /* last: a reader sees a slot whole or empty */
			return;
		}
	}
	/* full: the gates past EV_GATE_TRACE_SLOTS sites go uncounted */
}

bool ev_probe_gate(struct ev_state *s, uintptr_t pc, uint32_t fn)
{
	if (gate_slots)
		gate_trace_hit(pc, fn);
	if (!probe_pc)
		return false;
	struct ev_line l;
	if (probe_fired && !probe_reported) {
		probe_reported = true;
		ev_line_begin(&l, "probe_next", "ev_probe");
		ev_line_str(&l, "gate", rk_ev_model[fn < EV_FN_COUNT ? fn : 0].name);
		ev_line_hex(&l, "gate_pc", pc);
		ev_line_hex(&l, "rsp", rk_ev_regs.rsp);
		ev_line_hex(&l, "probe_rsp", probe_rsp);
		ev_line_u64(&l, "same", pc == probe_pc && rk_ev_regs.rsp == probe_rsp);
		ev_line_end(&l);
	}
	if (pc != probe_pc || probe_fired || ++probe_seen < probe_at)
		return false;
	probe_fired = true;
	probe_rsp = rk_ev_regs.rsp;
	/* as ev_fault.c leaves a recovery: the window after it is marked */
	s->fault_ns = ev_now_ns();
	s->recovered_window = true;
	__rk_ev_key = 0; /* until __rk_ev_compensate opens the log again */
	ev_line_begin(&l, "probe", "ev_probe");
	ev_line_str(&l, "gate", rk_ev_model[fn < EV_FN_COUNT ? fn : 0].name);
	ev_line_hex(&l, "gate_pc", pc);
	ev_line_u64(&l, "pass", probe_seen);
	ev_line_end(&l);
	return true;
}
