/* signals.c - the runtime's signal handlers.  A fatal signal (SEGV, BUS,
 * FPE, ILL, ABRT) restarts the process, warm if the checks allow, or else it
 * dies of the signal as if unhandled; the supervisor's restart signal
 * ($REKINDLE_RESTART_SIGNAL) acts on the request it left in the control
 * block, at once, from wherever the app was.  Both go through rk_do_restart
 * (restart.c).  Everything here is async-signal-safe.  rk_init installs them
 * unless RK_OPT_NO_SIGNAL_HANDLERS, with an alternate signal stack for the
 * thread that calls it. */
#include "rk_internal.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>

static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

static void on_fatal_signal(int sig, siginfo_t *si, void *uc)
{
	rk_wp_signal_entry();
	/* Error virtualization (tools/errvirt), when linked in, may turn the
	 * fault into an error of the last library call: then no restart. */
	if (sig != SIGABRT && rk_ev_fault_hook && rk_ev_fault_hook(sig, si, uc))
		return;
	char reason[64] = "signal ";
	rk_strlcat(reason, rk_signame(sig), sizeof reason);
	int saved = errno;
	(void)rk_do_restart(true, false, reason, sig, si, uc);
	/* Restart impossible or given up: die of the signal as if unhandled. */
	struct sigaction dfl;
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	sigaction(sig, &dfl, NULL);
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, sig);
	sigprocmask(SIG_UNBLOCK, &s, NULL);
	errno = saved;
	if (si && si->si_code <= 0) /* sent by kill/raise/abort: send it again */
		raise(sig);
	/* a faulting instruction faults again on return, now fatally */
}

/* The supervisor asks for a restart it could not wait for at a heartbeat
 * (the app does not beat, or hangs): act on the request now, from wherever
 * the app was, with the same checks as after a fault. */
static void on_restart_signal(int sig, siginfo_t *si, void *uc)
{
	(void)si;
	(void)uc;
	int saved = errno;
	rk_wp_signal_entry(); /* the kernel puts the interrupted PKRU back at return */
	char reason[128];
	enum rk_request_mode m = rk_control_take_request(reason, sizeof reason);
	if (m == RK_REQ_NONE) {
		rk_strlcpy(reason, "supervisor: restart signal ", sizeof reason);
		rk_strlcat(reason, rk_signame(sig), sizeof reason);
	}
	(void)rk_do_restart(m != RK_REQ_COLD, false, reason, 0, NULL, NULL);
	errno = saved; /* restart impossible: carry on */
}

static int restart_signal_install(void)
{
	if (!rk_cfg.restart_signal)
		return 0;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_restart_signal;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigset_t s;
	sigemptyset(&s);
	sigaddset(&s, rk_cfg.restart_signal);
	sigprocmask(SIG_UNBLOCK, &s, NULL);
	return sigaction(rk_cfg.restart_signal, &sa, NULL) < 0 ? -errno : 0;
}

int rk_signals_install(void)
{
	const size_t altsz = 64 * 1024;
	void *alt = mmap(NULL, altsz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (alt == MAP_FAILED)
		return -errno;
	stack_t ss = {.ss_sp = alt, .ss_size = altsz, .ss_flags = 0};
	if (sigaltstack(&ss, NULL) < 0)
		return -errno;
	/* A restart from a handler execs with that signal still blocked: unblock
	 * them all, or the next fault of this incarnation could not be caught. */
	sigset_t fatal;
	sigemptyset(&fatal);
	for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++)
		sigaddset(&fatal, fatal_signals[i]);
	sigprocmask(SIG_UNBLOCK, &fatal, NULL);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_fatal_signal;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof fatal_signals / sizeof fatal_signals[0]; i++)
		if (sigaction(fatal_signals[i], &sa, NULL) < 0)
			return -errno;
	return restart_signal_install();
}
