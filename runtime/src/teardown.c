/* teardown.c - keeping the old address space's teardown, and the new
 * one's first page faults, off the restart path.
 *
 * The old address space is torn down off the restart path: a helper process
 * shares our mm (CLONE_VM), so exec only drops a reference; the helper exits
 * when our exec closes its pipe, and the kernel unmaps the old pages in the
 * helper's context, in parallel with our new main().  The next incarnation
 * reaps it (rk_reap_teardown_holder).  The helper is cloned at rk_init and
 * stands for the whole incarnation (a restart clones one only if that
 * failed).
 *
 * The new incarnation's first pages come from a pool the old one frees just
 * before execve (see "the exec page pool").
 *
 * $REKINDLE_SYNC_TEARDOWN=1 turns the helper off and $REKINDLE_EXEC_POOL_KB
 * sizes the pool (options.c).  What the restart calls here
 * (rk_teardown_holder_for_exec, rk_exec_pool_release,
 * rk_teardown_holder_exec_failed) is async-signal-safe. */
#include "rk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/futex.h>
#include <time.h>
#include <unistd.h>

/* ---- the exec page pool ----
 * The kernel gives the new incarnation's first pages (page tables, the
 * loader's and libc's data, stacks: about 60 up to rk_init's return for
 * bench/restart_bench, so the default 512 KiB is twice that) from this
 * CPU's list of recently freed pages first.  After a bare fork+exec that list
 * holds what the previous child just freed.  After a warm restart the old
 * incarnation's pages are still held (the helper frees them later, on another
 * CPU), so they come from the buddy allocator, and on a VM whose host takes
 * free memory back (virtio-balloon free page reporting) each such page costs
 * a host fault on first touch: 0.3-0.4 ms per restart at 8 GiB preserved,
 * where a long incarnation had emptied that list (docs/results.md).  So each
 * incarnation keeps a small pool of pages that it owns (written by the
 * standing helper, off the restart path) and frees it on the restarting CPU
 * just before execve; freeing costs about 0.1 us per KiB there.  A restart
 * that returns (failed exec) leaves the incarnation without a pool. */

static void *exec_pool;
static size_t exec_pool_len; /* bytes; 0: no pool */

/* Maps the pool (not yet populated: the standing helper writes it). */
static void exec_pool_map(void)
{
	if (exec_pool)
		return;
	exec_pool_len = RK_ALIGN_UP((size_t)rk_cfg.exec_pool_kb << 10, RK_PAGE);
	if (!exec_pool_len)
		return;
	void *p = mmap(NULL, exec_pool_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		struct rk_ev e;
		rk_ev_begin(&e, "warning");
		rk_ev_str(&e, "what", "exec page pool not mapped; restarts may take longer");
		rk_ev_i64(&e, "errno", errno);
		rk_ev_end(&e);
		return;
	}
	(void)madvise(p, exec_pool_len, MADV_NOHUGEPAGE); /* small pages, like the ones exec needs */
	exec_pool = p;
}

static void exec_pool_unmap(void)
{
	if (exec_pool)
		munmap(exec_pool, exec_pool_len);
	exec_pool = NULL;
}

static _Atomic bool exec_pool_ready; /* the helper has written every page */

/* A write per page: a read would only map the shared zero page.  Stops
 * when a restart begins: the pool is then no longer of use. */
static void exec_pool_populate(void)
{
	for (size_t off = 0; off < exec_pool_len; off += RK_PAGE) {
		if (atomic_load_explicit(&rk_restarting, memory_order_relaxed))
			return;
		((volatile char *)exec_pool)[off] = 1;
	}
	atomic_store(&exec_pool_ready, true);
}

/* Async-signal-safe: hands the pool's pages to this CPU's free list.  Not
 * while the helper is still writing them (a restart within a millisecond
 * of rk_init): the zap would race its faults, for pages that are mostly
 * not there yet. */
void rk_exec_pool_release(void)
{
	if (exec_pool && atomic_load(&exec_pool_ready))
		(void)madvise(exec_pool, exec_pool_len, MADV_DONTNEED);
}

/* ---- the teardown helper ---- */

static int holder_pipe[2];
static char holder_stack[16384] __attribute__((aligned(64)));
static _Atomic uint32_t holder_fds_closed; /* futex word, shared through CLONE_VM */
static int holder_app_cpu;                  /* the app's CPU when it cloned the standing helper */
static _Atomic int holder_off_cpu = -1;     /* the CPU the standing helper keeps off */

static void holder_move_off_cpu(pid_t pid, int cpu);

/* The helper has no thread-local storage of its own (CLONE_VM without
 * CLONE_SETTLS): it runs on the TLS of the app thread that cloned it, so it
 * calls no libc function, which could write that thread's errno or resolve
 * a lazily bound symbol with it.  Raw system calls only; -errno on failure.
 * The restart path uses them too (no errno to save there). */
static long raw_syscall3(long nr, long a, long b, long c)
{
#if defined(__x86_64__)
	long ret;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
	return ret;
#elif defined(__aarch64__)
	register long x8 __asm__("x8") = nr;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	__asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory", "cc");
	return x0;
#else
#error "raw_syscall3: add this architecture"
#endif
}

/* arg != NULL: the standing helper, which also writes the exec page pool */
static int holder_main(void *arg)
{
	int rd = holder_pipe[0];
	/* Hold no fd of the app (a listening socket would stay bound), and say
	 * so before the exec: the next incarnation may bind at once.  Above all
	 * not our copy of the pipe's write end, or the exec would not wake us. */
	raw_syscall3(SYS_close, holder_pipe[1], 0, 0);
	if ((rd > 0 && raw_syscall3(SYS_close_range, 0, rd - 1, 0) < 0) ||
	    raw_syscall3(SYS_close_range, rd + 1, ~0u, 0) < 0) {
		for (int fd = 0; fd < 4096; fd++) /* no close_range (before 5.9, seccomp) */
			if (fd != rd)
				raw_syscall3(SYS_close, fd, 0, 0);
	}
	if (arg) {
		/* off the app's path: the restart only checks it still holds */
		holder_move_off_cpu(0, holder_app_cpu);
		atomic_store(&holder_off_cpu, holder_app_cpu);
	}
	atomic_store(&holder_fds_closed, 1);
	raw_syscall3(SYS_futex, (long)&holder_fds_closed, FUTEX_WAKE, 1);
	if (arg && exec_pool)
		exec_pool_populate(); /* we share the app's mm: these become its pages */
	char c;
	while (raw_syscall3(SYS_read, rd, (long)&c, 1) < 0)
		;
	if (arg && !atomic_load(&rk_restarting)) {
		/* The app died without an exec (SIGKILL, say): a supervisor
		 * starts the next incarnation on whichever CPU; the teardown
		 * must not be tied to one of them. */
		unsigned long all[1024 / (8 * sizeof(unsigned long))];
		for (unsigned i = 0; i < sizeof all / sizeof all[0]; i++)
			all[i] = ~0ul;
		raw_syscall3(SYS_sched_setaffinity, 0, sizeof all, (long)all);
	}
	raw_syscall3(SYS_exit_group, 0, 0, 0); /* drops the last reference to the old mm */
	return 0;
}

/* Reaps the previous restart's helper once it is done (no SIGCHLD is sent:
 * its exit signal is 0, so the app's own wait() never sees it). */
void rk_reap_teardown_holder(void)
{
	if (rk_g.holder_pid > 0 && waitpid(rk_g.holder_pid, NULL, WNOHANG | __WALL) != 0)
		rk_g.holder_pid = 0;
	if (rk_g.validator_reap > 0 && waitpid(rk_g.validator_reap, NULL, WNOHANG) != 0)
		rk_g.validator_reap = 0;
}

/* The helper stands for the whole incarnation: cloned at rk_init, it costs
 * the restart path nothing but a look at holder_fds_closed, and a death that
 * runs no handler (SIGKILL, the OOM killer) also only drops a reference to
 * the mm, so a supervisor hears of it without waiting for the teardown.  The
 * write end stays with us (O_CLOEXEC): the helper exits when we exec or die.
 * If it could not be started, the restart clones one itself. */
static int standing_holder_wr = -1;
static pid_t standing_holder_pid;

/* Waits (bounded) until the helper holds none of the app's fds: the next
 * incarnation may bind a listening port at once. */
static void holder_wait_fds_closed(void)
{
	struct timespec limit = {0, 20 * 1000 * 1000};
	while (!atomic_load(&holder_fds_closed) &&
	       (syscall(SYS_futex, &holder_fds_closed, FUTEX_WAIT, 0, &limit, NULL, 0) == 0 || errno != ETIMEDOUT))
		;
}

/* Clones a helper; returns the pipe's write end (its pid in *pid) or -1. */
static int holder_clone(pid_t *pid, bool standing)
{
	if (rk_cfg.sync_teardown || pipe2(holder_pipe, O_CLOEXEC) < 0)
		return -1;
	atomic_store(&holder_fds_closed, 0);
	/* The helper carries the app's name, so `pkill -HUP app` reaches it too;
	 * blocked signals cannot end it early (which would put the teardown
	 * back on the restart path).  It inherits the mask. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pid_t child = clone(holder_main, holder_stack + sizeof holder_stack, CLONE_VM, standing ? &holder_pipe : NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	close(holder_pipe[0]);
	if (child < 0) {
		close(holder_pipe[1]);
		return -1;
	}
	*pid = child;
	return holder_pipe[1];
}

/* The exec wakes the helper by closing its pipe, and a woken task lands on
 * the waker's CPU: its unmapping would then share the core with the new
 * incarnation until the idle core pulls one of them away.  Send it to the
 * other CPUs instead.  (Idle priority measured the same, but an idle task
 * preempted inside the kernel's unmapping, holding the memfd's locks, could
 * stall the next incarnation.)  The standing helper does this to itself
 * (pid 0) for the CPU the app ran on when it was cloned; a restart from
 * another CPU moves it again (20-30 us there).  Async-signal-safe. */
static void holder_move_off_cpu(pid_t pid, int cpu)
{
	unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {0};
	const unsigned bits = 8 * sizeof mask[0];
	/* the caller's own mask is the app's (the helper inherited it) */
	long n = raw_syscall3(SYS_sched_getaffinity, 0, sizeof mask, (long)mask);
	if (pid < 0 || cpu < 0 || (unsigned)cpu >= sizeof mask * 8 || n <= 0)
		return;
	unsigned count = 0;
	for (unsigned i = 0; i < (size_t)n / sizeof mask[0]; i++)
		for (unsigned long w = mask[i]; w; w &= w - 1) /* no libgcc call: see raw_syscall3 */
			count++;
	if (count < 2) {
		/* Pinned to one CPU (taskset, cpuset): the helper cannot leave
		 * it, so it yields it.  The inversion feared above resolves
		 * itself here: a new incarnation that waits on a lock the helper
		 * holds leaves the CPU idle, and the helper runs. */
		struct sched_param sp = {0};
		(void)raw_syscall3(SYS_sched_setscheduler, pid, SCHED_IDLE, (long)&sp);
		return;
	}
	mask[(unsigned)cpu / bits] &= ~(1ul << ((unsigned)cpu % bits));
	(void)raw_syscall3(SYS_sched_setaffinity, pid, n, (long)mask);
}

/* At a restart: returns the write end of the pipe to close at exec, or -1
 * (then the exec tears the old address space down itself, only slower). */
int rk_teardown_holder_for_exec(void)
{
	pid_t pid = 0;
	int wr = standing_holder_wr >= 0 ? standing_holder_wr : holder_clone(&pid, false);
	rk_g.manifest->holder_pid = standing_holder_wr >= 0 ? standing_holder_pid : pid;
	if (wr >= 0) {
		holder_wait_fds_closed();
		int cpu = sched_getcpu();
		if (wr != standing_holder_wr || cpu != atomic_load(&holder_off_cpu)) {
			holder_move_off_cpu(rk_g.manifest->holder_pid, cpu);
			if (wr == standing_holder_wr)
				atomic_store(&holder_off_cpu, cpu); /* if the exec fails, it stays there */
		}
	}
	return wr;
}

void rk_teardown_holder_stand(void)
{
	if (standing_holder_wr >= 0)
		return;
	exec_pool_map();
	holder_app_cpu = sched_getcpu();
	standing_holder_wr = holder_clone(&standing_holder_pid, true);
	if (standing_holder_wr < 0)
		exec_pool_unmap(); /* nobody would fill it */
}

/* The exec failed: a helper cloned for it (not the standing one) exits when
 * its pipe closes, and is reaped later. */
void rk_teardown_holder_exec_failed(int wr)
{
	if (wr >= 0 && wr != standing_holder_wr) {
		close(wr); /* the helper exits; reap it later */
		rk_g.holder_pid = rk_g.manifest->holder_pid;
	}
}
