/* restart.c - the restart itself: the warm/cold decision, and the
 * re-execution of the same binary with the arena fds inherited, for
 * rk_restart, a cross-check's hot switch and the signal handlers
 * (signals.c).  Everything reachable from a signal handler here is
 * async-signal-safe: no allocation, no stdio, no locks.
 *
 * The old address space is torn down off the restart path, by a helper that
 * stands for the whole incarnation, and the new incarnation's first pages
 * come from a pool the old one frees just before execve: both in
 * teardown.c. */
#include "rk_internal.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <ucontext.h>
#include <unistd.h>

extern char **environ;

static char **exec_argv, **exec_envp;
static char manifest_env[48], sup_env[48], ctl_env[48], redo_env[64];
_Atomic int rk_restarting; /* 0, or the tid of the thread restarting */

/* A restart that returns (failed, or given up) lets the next one in. */
static void restarting_done(void)
{
	atomic_store(&rk_restarting, 0);
	(void)syscall(SYS_futex, &rk_restarting, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ---- small signal-safe string building ---- */

static void sb_u64(char *buf, size_t cap, uint64_t v)
{
	char num[24];
	rk_fmt_u64(num, v);
	rk_strlcat(buf, num, cap);
}

static void sb_hex(char *buf, size_t cap, uint64_t v)
{
	static const char hex[] = "0123456789abcdef";
	char s[19] = "0x";
	int n = 2;
	for (int sh = 60; sh >= 0; sh -= 4)
		if ((v >> sh) || sh == 0)
			s[n++] = hex[(v >> sh) & 15];
	s[n] = 0;
	rk_strlcat(buf, s, cap);
}

/* ---- setup (from rk_init; may allocate) ---- */

static char **copy_vector(char *const *v, size_t extra, const char *skip_prefix)
{
	size_t n = 0;
	while (v && v[n])
		n++;
	char **out = calloc(n + extra + 1, sizeof *out);
	if (!out)
		return NULL;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (skip_prefix && strncmp(v[i], skip_prefix, strlen(skip_prefix)) == 0)
			continue;
		if (!(out[k++] = strdup(v[i])))
			return NULL;
	}
	return out;
}

int rk_restart_setup(int argc, char **argv, int manifest_fd)
{
	(void)argc;
	exec_argv = copy_vector(argv, 0, NULL);
	exec_envp = copy_vector(environ, 4, "REKINDLE_MANIFEST_FD=");
	if (!exec_argv || !exec_envp)
		return -ENOMEM;
	char *p = manifest_env;
	rk_strlcpy(p, "REKINDLE_MANIFEST_FD=", sizeof manifest_env);
	rk_fmt_u64(p + strlen(p), (uint64_t)manifest_fd);
	size_t n = 0;
	while (exec_envp[n])
		n++;
	exec_envp[n++] = manifest_env;
	/* rk_init took these out of the app's environment (its children must
	 * not see them); our own next image needs them back. */
	if (rk_sup_active()) {
		rk_strlcpy(sup_env, "REKINDLE_SUPERVISOR_FD=", sizeof sup_env);
		rk_fmt_u64(sup_env + strlen(sup_env), (uint64_t)rk_sup_fd());
		exec_envp[n++] = sup_env;
	}
	if (rk_control_shared()) {
		rk_strlcpy(ctl_env, "REKINDLE_CONTROL_FD=", sizeof ctl_env);
		rk_fmt_u64(ctl_env + strlen(ctl_env), (uint64_t)rk_control_fd());
		exec_envp[n++] = ctl_env;
	}
	if (rk_redo_env()) {
		rk_strlcpy(redo_env, rk_redo_env(), sizeof redo_env);
		exec_envp[n++] = redo_env;
	}
	return 0;
}

/* ---- the decision and the exec ---- */

/* The next incarnation starts with stdio, socket-activation fds and ours
 * only: every other fd of the old one is closed by the exec. */
static void close_transient_fds_at_exec(void)
{
	unsigned first = 3 + rk_cfg.listen_fds;
	if (syscall(SYS_close_range, first, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) == 0)
		return;
	for (unsigned fd = first; fd < 65536; fd++)
		rk_fd_set_cloexec((int)fd, true);
}

static void hand_over_fds(bool warm, bool hot_switch, uint32_t drop, bool on)
{
	if (on)
		close_transient_fds_at_exec();
	rk_fd_set_cloexec(rk_g.manifest_fd, !on);
	/* the spare only if it still is (the app may have closed and reused
	 * that number): a stranger must not leak into the next incarnation */
	if (rk_g.manifest_spare_fd >= 0 &&
	    rk_fd_is_file(rk_g.manifest_spare_fd, rk_g.manifest->spare_dev, rk_g.manifest->spare_ino))
		rk_fd_set_cloexec(rk_g.manifest_spare_fd, !on);
	if (rk_sup_fd() >= 0)
		rk_fd_set_cloexec(rk_sup_fd(), !on);
	if (rk_control_fd() >= 0)
		rk_fd_set_cloexec(rk_control_fd(), !on);
	if (rk_snapshot_fd() >= 0)
		rk_fd_set_cloexec(rk_snapshot_fd(), !on);
	int redo[3];
	if (rk_redo_fds(redo) == 0)
		for (int i = 0; i < 3; i++)
			rk_fd_set_cloexec(redo[i], !on);
	if (!warm)
		return;
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		bool switched = hot_switch && (int)i == rk_g.switch_index;
		if (rk_g.arenas[i].hdr && !(drop & (1u << i)))
			rk_fd_set_cloexec(switched ? rk_g.switch_fd : rk_g.arenas[i].fd, !on);
	}
	for (unsigned i = 0; i < rk_nranges; i++)
		rk_fd_set_cloexec(rk_ranges[i].fd, !on);
}

static bool pc_in_runtime(const void *uc)
{
#if defined(__x86_64__)
	if (!uc || !__start_rk_text)
		return false;
	uintptr_t pc = (uintptr_t)((const ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
	return pc >= (uintptr_t)__start_rk_text && pc < (uintptr_t)__stop_rk_text;
#else
	(void)uc;
	return false;
#endif
}

/* ---- components: which arenas a failure leaves half-changed ---- */

static rk_failure_hook failure_hook;
static void *failure_hook_ctx;
static bool in_failure_hook;
static uint32_t hook_drop_mask;

void rk_set_failure_hook(rk_failure_hook hook, void *ctx)
{
	failure_hook = hook;
	failure_hook_ctx = ctx;
}

int rk_component_drop(rk_arena *arena)
{
	if (!in_failure_hook)
		return -EPERM; /* only a failure decides what to drop */
	if (!arena || !arena->hdr)
		return -EINVAL;
	hook_drop_mask |= 1u << arena->index;
	return 0;
}

static uint32_t independent_arenas(void)
{
	uint32_t m = 0;
	for (unsigned i = 0; i < rk_g.narenas; i++)
		if (rk_g.arenas[i].hdr && (rk_g.arenas[i].flags & RK_ARENA_INDEPENDENT))
			m |= 1u << i;
	return m;
}

/* With the other threads frozen: the open regions and what the app's
 * failure hook says (not for a hot switch, whose failure is not the app's;
 * the replaced arena's regions do not count).  Async-signal-safe. */
static void gather_region_facts(int sig, uint32_t ignore, struct rk_facts *f)
{
	f->unsafe_open = rk_unsafe_open_mask() & ~ignore;
	f->independent = independent_arenas();
	hook_drop_mask = 0; /* not what the hook chose at an earlier, failed restart */
	if (failure_hook && !ignore) {
		in_failure_hook = true;
		f->hook_cold = !failure_hook(sig, failure_hook_ctx);
		in_failure_hook = false;
	}
	f->hook_drop = hook_drop_mask;
	f->regions_known = true;
}

/* The arena whose mapping holds addr (its index), RK_MAX_ARENAS for a
 * preserved range, -1 for neither.  Async-signal-safe. */
static int preserved_owner(uint64_t addr)
{
	for (unsigned k = 0; k < rk_g.narenas; k++) {
		const struct rk_arena *a = &rk_g.arenas[k];
		if (a->hdr && addr - (uint64_t)(uintptr_t)a->hdr < a->hdr_max)
			return (int)k;
	}
	for (unsigned i = 0; i < rk_nranges; i++)
		if (addr - rk_ranges[i].addr < rk_ranges[i].len)
			return RK_MAX_ARENAS;
	return -1;
}

/* An identical fault outside preserved memory (same signal, kind and
 * address) goes cold only the third time in a row: a wild pointer kept in
 * preserved data faults at the same address each time, but so does a bug
 * that one poison request triggers, whose state is fine. */
#define SAME_ADDRESS_REPEATS 3
#define LOW_ADDRESSES (64u << 10) /* NULL plus a field offset: the code's fault, not the data's */

/* A memory fault, with an address (not sent by a process), and not a stray
 * write that the write protection stopped (the data is intact then). */
static bool data_fault(int sig, int code)
{
	return (sig == SIGSEGV || sig == SIGBUS) && code > 0 && !(sig == SIGSEGV && code == SEGV_PKUERR);
}

/* The same fault as the one that ended the previous incarnation: the
 * identical-fault count goes on from there.  Async-signal-safe. */
static bool same_fault_as_before(int sig, const siginfo_t *si)
{
	return si && rk_g.info.kind == RK_START_WARM && rk_g.info.signal == sig &&
	       rk_g.prev_si_code == si->si_code && rk_g.info.fault_addr == (uint64_t)(uintptr_t)si->si_addr;
}

/* A warm start faulting again on the preserved data the previous fault hit:
 * the data is what faults (a corrupt length, a wild pointer stored in it),
 * and another warm restart would keep it and loop, however far apart the
 * faults are.  The same page of preserved memory; any SIGBUS in the same
 * arena (past its file's end: never a legitimate access, and the page
 * moves as the arena grows); or, outside preserved memory, the same
 * address SAME_ADDRESS_REPEATS times in a row.  Returns the arena,
 * RK_MAX_ARENAS for a preserved range or memory outside preservation, or
 * -1.  Async-signal-safe. */
static int repeated_fault_owner(int sig, const siginfo_t *si, uint32_t same_count)
{
	if (!si || !data_fault(sig, si->si_code) || !data_fault(rk_g.info.signal, rk_g.prev_si_code))
		return -1;
	if (rk_g.info.kind != RK_START_WARM || rk_g.info.signal != sig)
		return -1;
	uint64_t addr = (uint64_t)(uintptr_t)si->si_addr;
	int owner = preserved_owner(addr);
	if (owner >= 0 && addr / RK_PAGE == rk_g.info.fault_addr / RK_PAGE)
		return owner;
	if (sig == SIGBUS && owner >= 0 && owner < RK_MAX_ARENAS && preserved_owner(rk_g.info.fault_addr) == owner)
		return owner;
	if (owner < 0 && addr >= LOW_ADDRESSES && same_count >= SAME_ADDRESS_REPEATS)
		return RK_MAX_ARENAS;
	return -1;
}

static void describe_repeated_fault(int sig, const siginfo_t *si, int owner, char *decision, size_t cap)
{
	rk_strlcpy(decision, "same fault again after a warm restart: ", cap);
	rk_strlcat(decision, rk_signame(sig), cap);
	rk_strlcat(decision, " at ", cap);
	sb_hex(decision, cap, (uint64_t)(uintptr_t)si->si_addr);
	if (owner < RK_MAX_ARENAS) {
		rk_strlcat(decision, " in arena ", cap);
		rk_strlcat(decision, rk_g.arenas[owner].name, cap);
	} else if (preserved_owner((uint64_t)(uintptr_t)si->si_addr) >= 0) {
		rk_strlcat(decision, " in a preserved range", cap);
	} else {
		rk_strlcat(decision, ", the same address 3 times in a row", cap);
	}
}

/* The verdict in words, for events, the manifest and the next incarnation's
 * rk_restart_info (hot_switch_why: the cross-check's words).
 * Async-signal-safe. */
static void word_decision(const struct rk_verdict *v, const struct rk_facts *f, const char *hot_switch_why, int sig,
			  const siginfo_t *si, const void *uc, uint64_t age_ms, char *out, size_t cap)
{
	out[0] = 0;
	switch (v->code) {
	case RK_REASON_COLD_REQUESTED:
		rk_strlcpy(out, "cold restart requested", cap);
		break;
	case RK_REASON_FAULT_IN_RUNTIME:
		rk_strlcpy(out, "fault inside the rekindle runtime at pc ", cap);
#if defined(__x86_64__)
		sb_hex(out, cap, (uint64_t)((const ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP]);
#else
		(void)uc;
#endif
		break;
	case RK_REASON_CONTROL_BLOCK_CORRUPT: {
		const char *d = rk_control_damage();
		rk_strlcpy(out, d ? d : "control block corrupt", cap);
		break;
	}
	case RK_REASON_CRASH_LOOP:
		rk_strlcpy(out, "second failure ", cap);
		sb_u64(out, cap, age_ms);
		rk_strlcat(out, " ms after a warm restart (window ", cap);
		sb_u64(out, cap, rk_cfg.crashloop_ms);
		rk_strlcat(out, " ms)", cap);
		break;
	case RK_REASON_REPEATED_FAULT:
		describe_repeated_fault(sig, si, f->repeat_owner, out, cap);
		break;
	case RK_REASON_MANIFEST_BUSY:
		rk_strlcpy(out, "failure while the arena list was being updated", cap);
		break;
	case RK_REASON_WARM_DISABLED:
		rk_strlcpy(out, "warm restarts disabled by the app", cap);
		break;
	case RK_REASON_HOOK_COLD:
		rk_strlcpy(out, "the app's failure hook chose a cold restart", cap);
		break;
	case RK_REASON_UNSAFE_REGION_OPEN:
		rk_unsafe_describe((unsigned)v->arena, out, cap);
		break;
	case RK_REASON_INDEPENDENT_DROPPED:
		if (f->unsafe_open)
			rk_unsafe_describe((unsigned)v->arena, out, cap);
		else if (f->repeat_owner >= 0 && (v->drop & (1u << f->repeat_owner)))
			describe_repeated_fault(sig, si, f->repeat_owner, out, cap);
		if (out[0])
			rk_strlcat(out, ": independent, dropped alone; the rest warm", cap);
		else
			rk_strlcpy(out, "the app's failure hook dropped a component; the rest warm", cap);
		break;
	case RK_REASON_CROSSCHECK_MISMATCH:
		rk_strlcpy(out, hot_switch_why ? hot_switch_why : "cross-check mismatch", cap);
		break;
	default:
		rk_strlcpy(out, "all checks passed", cap);
		break;
	}
}

/* Marks the dropped arenas in the manifest (their fds stay close-on-exec);
 * undone if the exec fails.  Async-signal-safe. */
static void manifest_mark_dropped(uint32_t drop, bool on)
{
	struct rk_manifest *m = rk_g.manifest;
	for (unsigned k = 0; k < rk_g.narenas && drop; k++) {
		if (!(drop & (1u << k)) || !rk_g.arenas[k].hdr)
			continue;
		for (unsigned i = 0; i < m->narenas; i++) {
			if (strcmp(m->arenas[i].name, rk_g.arenas[k].name) != 0)
				continue;
			if (on)
				m->arenas[i].flags |= RK_MARENA_DROPPED;
			else
				m->arenas[i].flags &= ~RK_MARENA_DROPPED;
		}
	}
}

/* A hot switch: the manifest entry of the checked arena points at the
 * validated arena instead (and back, if the exec fails). */
static void manifest_switch_arena(bool on)
{
	struct rk_manifest *m = rk_g.manifest;
	const struct rk_arena *a = &rk_g.arenas[rk_g.switch_index];
	for (unsigned i = 0; i < m->narenas; i++) {
		if (strcmp(m->arenas[i].name, a->name) != 0)
			continue;
		m->arenas[i].fd = on ? rk_g.switch_fd : a->fd;
		m->arenas[i].dev = on ? rk_g.switch_dev : a->dev;
		m->arenas[i].ino = on ? rk_g.switch_ino : a->ino;
		m->arenas[i].base = on ? rk_g.switch_base : a->hdr->base;
		m->arenas[i].max = on ? rk_g.switch_max : a->hdr->max_bytes;
	}
}

/* A restart the supervisor makes instead: die, with the fault's own signal
 * if there is one, leaving the evidence (the open region) in the control
 * block for it.  mode "snapshot": a cold restart it makes from the newest
 * snapshot instead (rk_reason_restorable); mode "respawn": a warm restart
 * while a lazy restore is still filling the arenas, which a new address
 * space would map without their pages. */
static void leave_to_supervisor(const char *mode, const char *reason, const char *decision, enum rk_reason code,
				int sig, uint64_t age_ms) __attribute__((noreturn));
static void leave_to_supervisor(const char *mode, const char *reason, const char *decision, enum rk_reason code,
				int sig, uint64_t age_ms)
{
	bool snap = strcmp(mode, "snapshot") == 0;
	struct rk_ev e;
	rk_ev_begin(&e, "restart");
	rk_ev_str(&e, "mode", mode);
	rk_ev_str(&e, "reason", reason);
	rk_ev_str(&e, "decision", decision);
	rk_ev_str(&e, "code", rk_reason_name(code));
	rk_ev_str(&e, "action", snap ? "exit: the supervisor restarts from the newest snapshot instead of cold"
				     : "exit: the supervisor finishes the lazy restore and restarts warm");
	if (sig)
		rk_ev_str(&e, "signal", rk_signame(sig));
	rk_ev_u64(&e, "generation", rk_g.info.generation);
	rk_ev_u64(&e, "uptime_ms", age_ms);
	rk_ev_end(&e);
	int die = sig ? sig : SIGKILL;
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	sigaction(die, &dfl, NULL);
	sigset_t one;
	sigemptyset(&one);
	sigaddset(&one, die);
	pthread_sigmask(SIG_UNBLOCK, &one, NULL);
	(void)syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), die);
	kill(getpid(), SIGKILL); /* a signal that did not kill (ignored SIGABRT?) */
	_exit(128 + die);
}

/* hot_switch: a cross-check found the preserved state wrong;
 * not a failure of the app, so no crash-loop count, and whatever was open in
 * the replaced arena does not matter (it is discarded). */
int rk_do_restart(bool want_warm, bool hot_switch, const char *reason, int sig, const siginfo_t *si,
		  const void *uc)
{
	struct rk_manifest *m = rk_g.manifest;
	if (!m)
		return -EINVAL;
	if (getpid() != rk_g.pid) {
		/* A forked child that did not exec: the manifest, the arenas, the
		 * control block and the supervisor link are its parent's. */
		struct rk_ev e;
		rk_ev_begin(&e, "error");
		rk_ev_str(&e, "what", "no restart in a forked child: the preserved state is its parent's");
		rk_ev_str(&e, "reason", reason);
		rk_ev_end(&e);
		return -ECHILD;
	}
	int self = (int)syscall(SYS_gettid), owner = 0;
	while (!atomic_compare_exchange_strong(&rk_restarting, &owner, self)) {
		if (owner == self) {
			/* A fault or a restart request inside our own restart (the
			 * app's failure hook, or the supervisor's signal landing
			 * here): refuse; a fault then dies of its signal. */
			struct rk_ev e;
			rk_ev_begin(&e, "error");
			rk_ev_str(&e, "what", "restart inside this thread's own restart: refused");
			rk_ev_str(&e, "reason", reason);
			rk_ev_end(&e);
			return -EDEADLK;
		}
		/* Another thread is restarting: its exec ends us.  If that
		 * fails, it clears the flag and wakes us, and we try ourselves
		 * (a fault of ours then dies of its signal if we fail too). */
		while ((owner = atomic_load(&rk_restarting)) != 0)
			(void)syscall(SYS_futex, &rk_restarting, FUTEX_WAIT, owner, NULL, NULL, 0);
	}
	uint64_t t0 = rk_now_ns();
	uint64_t age_ms = (t0 - rk_g.start_ns) / 1000000;
	bool fast = age_ms < rk_cfg.crashloop_ms && !hot_switch;
	uint32_t fast_failures = fast ? m->fast_failures + 1 : (hot_switch ? m->fast_failures : 0);
	char decision[160] = "";
	uint32_t ignore = hot_switch ? 1u << rk_g.switch_index : 0;

	if (fast_failures >= rk_cfg.max_fast_failures) {
		struct rk_ev e;
		rk_ev_begin(&e, "giveup");
		rk_ev_str(&e, "reason", reason);
		rk_ev_u64(&e, "consecutive_fast_failures", fast_failures);
		rk_ev_u64(&e, "window_ms", rk_cfg.crashloop_ms);
		rk_ev_end(&e);
		restarting_done();
		return -ELOOP;
	}
	uint32_t same_count = same_fault_as_before(sig, si) ? rk_g.same_fault_count + 1 : 1;
	struct rk_facts f = {
		.cold_requested = !want_warm,
		.hot_switch = hot_switch,
		.fault_in_runtime = pc_in_runtime(uc),
		.control_damaged = rk_control_damage() != NULL,
		.crash_loop = rk_g.info.kind == RK_START_WARM && fast,
		.repeat_owner = repeated_fault_owner(sig, si, same_count),
		.manifest_busy = rk_g.manifest_busy != 0,
		.warm_disabled = rk_ctl && (atomic_load(&rk_ctl->flags) & RK_CTL_WARM_DISABLED),
		.independent = independent_arenas(),
	};
	struct rk_verdict v = rk_decide(&f);
	if (v.warm) {
		/* Let other threads finish what they are changing, then look. */
		(void)rk_unsafe_freeze(50ull * 1000 * 1000);
		(void)rk_allocator_freeze(50ull * 1000 * 1000);
		/* A thread may have counted itself into an allocator critical
		 * section just before the allocator froze; it leaves at once. */
		(void)rk_unsafe_freeze(50ull * 1000 * 1000);
		gather_region_facts(sig, ignore, &f);
		v = rk_decide(&f);
	}
	word_decision(&v, &f, hot_switch ? reason : NULL, sig, si, uc, age_ms, decision, sizeof decision);
	bool warm = v.warm;
	/* a crash loop too: the supervisor sees the loop and takes the newest
	 * snapshot from before it began */
	if (!warm && !hot_switch && rk_snapshot_active() &&
	    (rk_reason_restorable(v.code) || v.code == RK_REASON_CRASH_LOOP))
		leave_to_supervisor("snapshot", reason, decision, v.code, sig, age_ms);
	if (warm && !hot_switch && rk_lazy_pending())
		leave_to_supervisor("respawn", reason, decision, v.code, sig, age_ms);
	uint32_t drop = warm ? v.drop : 0;
	if (!warm)
		rk_control_repair(); /* the decision is made: no evidence is needed now */
	rk_control_set_state(RK_CTL_RESTARTING);
	m->next_mode = warm ? RK_NEXT_WARM : RK_NEXT_COLD;
	m->signal = sig;
	m->si_code = si ? si->si_code : 0;
	m->fault_addr = si ? (uint64_t)(uintptr_t)si->si_addr : 0;
	m->t_restart_ns = t0;
	m->generation = rk_g.info.generation;
	m->last_kind = rk_g.info.kind;
	m->fast_failures = fast_failures;
	rk_strlcpy(m->reason, hot_switch ? "cross-check mismatch" : reason, sizeof m->reason);
	rk_strlcpy(m->decision, decision, sizeof m->decision);
	m->decision_code = (uint32_t)v.code;
	m->same_fault_count = sig ? same_count : 0;
	/* statics may point into the replaced arena: not after a hot switch */
	if (warm && !hot_switch)
		rk_statics_save(m);
	else
		m->statics_saved = 0;
	m->flags = hot_switch && warm ? RK_MANIFEST_VALIDATED : 0;
	pid_t validator = atomic_exchange(&rk_g.validator_pid, 0);
	if (validator > 0)
		kill(validator, SIGKILL); /* its result would come too late */
	m->validator_pid = validator;

	struct rk_ev e;
	rk_ev_begin(&e, "restart");
	rk_ev_str(&e, "mode", warm ? "warm" : "cold");
	rk_ev_str(&e, "reason", reason);
	rk_ev_str(&e, "decision", decision);
	rk_ev_str(&e, "code", rk_reason_name(v.code));
	if (sig) {
		rk_ev_str(&e, "signal", rk_signame(sig));
		rk_ev_hex(&e, "addr", m->fault_addr);
		if (si) {
			/* what kind of fault, and whose memory: a SEGV_PKUERR in an
			 * arena is a stray write the write protection caught */
			rk_ev_str(&e, "si_code", rk_si_code_name(sig, si->si_code));
			int owner = si->si_code > 0 ? preserved_owner(m->fault_addr) : -1;
			if (owner >= 0)
				rk_ev_str(&e, "in", owner < RK_MAX_ARENAS ? rk_g.arenas[owner].name : "preserved range");
		}
	}
	rk_ev_u64(&e, "generation", rk_g.info.generation);
	rk_ev_u64(&e, "uptime_ms", age_ms);
	if (warm && drop) {
		char names[160] = "";
		for (unsigned k = 0; k < rk_g.narenas; k++)
			if (drop & (1u << k)) {
				rk_strlcat(names, names[0] ? "," : "", sizeof names);
				rk_strlcat(names, rk_g.arenas[k].name, sizeof names);
			}
		rk_ev_str(&e, "dropped", names);
	}
	rk_ev_end(&e);

	rk_sup_restarting(warm, sig, t0, m->fault_addr, reason, decision, v.code);
	rk_reap_teardown_holder();
	int holder_wr = rk_teardown_holder_for_exec();
	manifest_mark_dropped(drop, true);
	if (hot_switch && warm)
		manifest_switch_arena(true);
	m->checksum = rk_manifest_checksum(m);
	hand_over_fds(warm, hot_switch, drop, true);
	rk_exec_pool_release(); /* last: nothing may take these pages back before the exec */
	/* the very binary that is running, even if a newer one has replaced it
	 * on disk (the arenas' layout is this one's); rk_init puts the process
	 * name back, which this exec would make "exe" */
	execve("/proc/self/exe", exec_argv, exec_envp);
	int err = errno;
	hand_over_fds(warm, hot_switch, drop, false);
	manifest_mark_dropped(drop, false);
	if (hot_switch && warm)
		manifest_switch_arena(false);
	m->checksum = rk_manifest_checksum(m);
	rk_allocator_thaw();
	rk_unsafe_thaw();
	rk_control_set_state(rk_g.recovery ? RK_CTL_RECOVERING : RK_CTL_RUNNING);
	rk_teardown_holder_exec_failed(holder_wr);
	rk_ev_begin(&e, "error");
	rk_ev_str(&e, "what", "restart failed: execve");
	rk_ev_i64(&e, "errno", err);
	rk_ev_end(&e);
	rk_sup_restart_failed(err);
	restarting_done();
	return -err;
}

int rk_restart(const char *reason)
{
	return rk_do_restart(true, false, reason ? reason : "app request", 0, NULL, NULL);
}

int rk_restart_hot_switch(const char *why)
{
	int r = rk_do_restart(true, true, why, 0, NULL, NULL);
	rk_g.switch_fd = -1;
	return r;
}

int rk_restart_cold(const char *reason)
{
	return rk_do_restart(false, false, reason ? reason : "app request", 0, NULL, NULL);
}
