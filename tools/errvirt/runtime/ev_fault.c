/* ev_fault.c - recovery: a fatal signal inside an open window rolls the
 * transaction back and resumes at its gate, which then fails with the
 * model's error; anything else is declined, with a reason code, to whoever
 * handles the fault next (librekindle's warm restart, or the default
 * action).  Also the start-up: the state block, and a handler of our own
 * for programs without librekindle.  Async-signal-safe where it runs in
 * the handler. */
#define _GNU_SOURCE
#include "ev_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

struct ev_state *ev;

static const int ev_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
static struct sigaction ev_prev[sizeof ev_signals / sizeof ev_signals[0]];

/* our code and librekindle's, by section (the linker's __start_/__stop_) */
extern const char __start_rk_ev_text[] __attribute__((weak));
extern const char __stop_rk_ev_text[] __attribute__((weak));
extern const char __start_rk_text[] __attribute__((weak));
extern const char __stop_rk_text[] __attribute__((weak));
/* where the executable is mapped (the linker's): a fallback line gives it,
 * so its pcs can be named with addr2line (pc - exe_base) */
extern const char __executable_start[] __attribute__((weak));

int ev_gettid(void)
{
	return (int)syscall(SYS_gettid);
}

static bool in_section(uintptr_t pc, const char *start, const char *stop)
{
	return start && stop && pc >= (uintptr_t)start && pc < (uintptr_t)stop;
}

static const char *signame(int sig)
{
	switch (sig) {
	case SIGSEGV:
		return "SIGSEGV";
	case SIGBUS:
		return "SIGBUS";
	case SIGFPE:
		return "SIGFPE";
	case SIGILL:
		return "SIGILL";
	}
	return "other";
}

uint64_t ev_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Why this fault cannot be turned into an error, or NULL if it can. */
static const char *ev_refusal(const struct ev_state *s, uintptr_t pc, uintptr_t fault_word)
{
	if (ev_role != EV_ROLE_OWNER)
		return ev_role == EV_ROLE_FOREIGN ? "ev_not_owner_thread" : "ev_no_transaction";
	if (in_section(pc, __start_rk_ev_text, __stop_rk_ev_text) && !(s->probe && (s->probe & ~(uintptr_t)1) == fault_word))
		return "ev_fault_in_errvirt_runtime";
	if (in_section(pc, __start_rk_text, __stop_rk_text))
		return "ev_fault_in_rekindle_runtime";
	if (s->in_recovery)
		return "ev_fault_in_recovery";
	if (!s->window_open)
		return "ev_window_closed";
	if (s->recovered_window)
		return "ev_second_fault";
	/* the same fault again and again, each time right after its gate */
	if (s->gates - s->last_recovery_gate <= 2 && s->recoveries_in_row >= 8)
		return "ev_recovery_loop";
	return NULL;
}

static int ev_decline(struct ev_state *s, int sig, const char *why, uintptr_t pc, const siginfo_t *si)
{
	s->fallbacks++;
	struct ev_line l;
	ev_line_begin(&l, "fallback", why);
	ev_line_str(&l, "signal", signame(sig));
	ev_line_hex(&l, "fault_pc", pc);
	ev_line_hex(&l, "fault_addr", si ? (uint64_t)(uintptr_t)si->si_addr : 0);
	if (!s->window_open && s->closed_reason) {
		ev_line_str(&l, "closed_by", s->closed_reason);
		if (s->closed_by_fn >= 0 && s->closed_by_fn < EV_FN_COUNT)
			ev_line_str(&l, "closed_by_call", rk_ev_model[s->closed_by_fn].name);
		ev_line_hex(&l, "closed_at_pc", s->closed_by_pc);
		if (s->closed_callee)
			ev_line_hex(&l, "closed_callee", s->closed_callee);
	}
	/* the gate of the last transaction begun (the campaign places the
	 * fault by it): 0 on a thread that never passed one */
	ev_line_hex(&l, "gate_pc", rk_ev_regs.rip);
	ev_line_hex(&l, "exe_base", (uint64_t)(uintptr_t)__executable_start);
	ev_line_end(&l);
	return 0;
}

int rk_ev_fault_hook(int sig, siginfo_t *si, void *ucv)
{
	struct ev_state *s = ev;
	if (!s || sig == SIGABRT)
		return 0;
	ucontext_t *uc = ucv;
	greg_t *g = uc->uc_mcontext.gregs;
	uintptr_t pc = (uintptr_t)g[REG_RIP];
	uintptr_t fault_word = si ? (uintptr_t)si->si_addr & ~(uintptr_t)7 : 0;
	/* sent by kill or raise (si_code <= 0): not a fault of this code */
	const char *why = si && si->si_code <= 0 ? "ev_not_a_fault" : ev_refusal(s, pc, fault_word);
	if (why)
		return ev_decline(s, sig, why, pc, si);
	uint64_t t0 = ev_now_ns();
	s->fault_ns = t0;
	s->in_recovery = true;
	s->probe = 0;
	uint32_t entries = s->nundo;
	uint64_t bytes = s->bulk_used;
	ev_log_rollback(s);
	/* frames from the checkpoint's down may hold holes of frames that are
	 * gone now: forget them all (the checkpoint frame's own are then copied) */
	ev_holes_drop_below(rk_ev_regs.rbp + 16);
	g[REG_RBX] = (greg_t)rk_ev_regs.rbx;
	g[REG_RBP] = (greg_t)rk_ev_regs.rbp;
	g[REG_R12] = (greg_t)rk_ev_regs.r12;
	g[REG_R13] = (greg_t)rk_ev_regs.r13;
	g[REG_R14] = (greg_t)rk_ev_regs.r14;
	g[REG_R15] = (greg_t)rk_ev_regs.r15;
	g[REG_RSP] = (greg_t)rk_ev_regs.rsp;
	g[REG_RIP] = (greg_t)rk_ev_regs.rip;
	g[REG_RAX] = 1; /* the checkpoint returns again, now non-zero */
	s->recovered_window = true;
	s->recoveries_in_row = s->gates - s->last_recovery_gate <= 2 ? s->recoveries_in_row + 1 : 1;
	s->last_recovery_gate = s->gates;
	s->recoveries++;
	__rk_ev_key = 0; /* until __rk_ev_compensate opens the log again */
	struct ev_line l;
	ev_line_begin(&l, "recovered", "ev_recovered");
	ev_line_str(&l, "signal", signame(sig));
	ev_line_str(&l, "gate", rk_ev_model[s->gate_fn < EV_FN_COUNT ? s->gate_fn : 0].name);
	ev_line_hex(&l, "gate_pc", rk_ev_regs.rip);
	ev_line_hex(&l, "fault_pc", pc);
	ev_line_hex(&l, "fault_addr", si ? (uint64_t)(uintptr_t)si->si_addr : 0);
	ev_line_u64(&l, "undo_entries", entries);
	ev_line_u64(&l, "undo_bulk_bytes", bytes);
	ev_line_u64(&l, "rollback_ns", ev_now_ns() - t0);
	ev_line_end(&l);
	return 1;
}

/* Our own handler, for programs without librekindle (rk_init replaces it,
 * and librekindle's handler calls rk_ev_fault_hook first). */
static void ev_on_fault(int sig, siginfo_t *si, void *uc)
{
	int saved = errno;
	if (rk_ev_fault_hook(sig, si, uc)) {
		errno = saved;
		return;
	}
	for (size_t i = 0; i < sizeof ev_signals / sizeof ev_signals[0]; i++) {
		if (ev_signals[i] != sig)
			continue;
		const struct sigaction *p = &ev_prev[i];
		if ((p->sa_flags & SA_SIGINFO) && p->sa_sigaction) {
			p->sa_sigaction(sig, si, uc);
			errno = saved;
			return;
		}
		if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN && p->sa_handler) {
			p->sa_handler(sig);
			errno = saved;
			return;
		}
	}
	/* no one else: die of the signal (the faulting instruction re-runs) */
	struct sigaction dfl;
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	sigaction(sig, &dfl, NULL);
	errno = saved;
}

static void ev_startup_failed(const char *why)
{
	struct ev_line l;
	ev_line_begin(&l, "disabled", why);
	ev_line_u64(&l, "errno", (uint64_t)errno);
	ev_line_end(&l);
}

static int ev_install(void)
{
	const size_t altsz = 64 * 1024;
	stack_t cur;
	if (sigaltstack(NULL, &cur) < 0)
		return -errno;
	if (cur.ss_flags & SS_DISABLE) {
		void *alt = mmap(NULL, altsz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (alt == MAP_FAILED)
			return -errno;
		stack_t ss = {.ss_sp = alt, .ss_size = altsz, .ss_flags = 0};
		if (sigaltstack(&ss, NULL) < 0)
			return -errno;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = ev_on_fault;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof ev_signals / sizeof ev_signals[0]; i++)
		if (sigaction(ev_signals[i], &sa, &ev_prev[i]) < 0)
			return -errno;
	return 0;
}

/* Before any ordinary constructor: a gate may run in one. */
__attribute__((constructor(101))) static void ev_init(void)
{
	const char *off = getenv("REKINDLE_EV");
	if (off && strcmp(off, "off") == 0) {
		errno = 0;
		ev_startup_failed("ev_disabled_by_env");
		return;
	}
	size_t sz = sizeof(struct ev_state) + EV_UNDO_CAP * sizeof(struct ev_undo) + EV_BULK_CAP;
	void *m = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		ev_startup_failed("ev_state_mmap_failed");
		return;
	}
	struct ev_state *s = m;
	s->undo = (struct ev_undo *)(s + 1);
	s->bulk = (unsigned char *)(s->undo + EV_UNDO_CAP);
	s->closed_by_fn = -1;
	const char *mask = getenv("REKINDLE_EV_MASK_SOCKET_WRITES");
	s->mask_outputs = mask && strcmp(mask, "1") == 0;
	if (ev_install() < 0) {
		ev_startup_failed("ev_signal_install_failed");
		return;
	}
	ev = s;
	ev_probe_init();
}
