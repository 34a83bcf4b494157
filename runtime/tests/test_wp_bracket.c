/* test_wp_bracket - the runtime's write bracket (rk_wp_write_begin/end in
 * rk_internal.h) when another thread protects the arena in the middle.
 *
 * begin on an arena without a key changes nothing.  If another thread then
 * protects the arena (rk_arena_open_flags(..., RK_ARENA_WRITE_PROTECT) sets
 * a->pkey), end used to look at a->pkey again, see a key and write begin's
 * "nothing saved" value 0 into PKRU: write access to every key for this
 * thread.  end must act only on what begin returned.
 *
 * The interleaving is played in order in one thread: begin, set the key as
 * the other thread would, end.  end runs in a child: on a CPU without PKU
 * a stray WRPKRU is an invalid opcode (the child dies of SIGILL); with PKU
 * the child checks that PKRU did not change. */
#include "testlib.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static bool have_ospke(void)
{
#if defined(__x86_64__)
	unsigned a, b, c, d;
	return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 4)); /* OSPKE: rdpkru usable */
#else
	return false;
#endif
}

static void begin_unprotected_changes_nothing(void)
{
	struct rk_arena a = {.pkey = 0};
	uint32_t wp = rk_wp_write_begin(&a);
	CHECK_MSG(wp == RK_WP_UNCHANGED, "begin on an arena without a key returned %#x, not RK_WP_UNCHANGED", wp);
	rk_wp_write_end(wp); /* nothing to undo: no PKRU instruction at all */
}

/* Exit status of the child: 0 = PKRU untouched, 1 = PKRU changed. */
static int end_after_concurrent_protect(void)
{
	struct rk_arena a = {.pkey = 0};
	bool pku = have_ospke();
	uint32_t before = pku ? rk_pkru_read() : 0;
	uint32_t wp = rk_wp_write_begin(&a);
	a.pkey = 1; /* another thread protects the arena here */
	rk_wp_write_end(wp);
	return pku && rk_pkru_read() != before ? 1 : 0;
}

static void end_ignores_key_set_after_begin(void)
{
	fflush(stdout);
	pid_t pid = fork();
	if (!CHECK(pid >= 0))
		return;
	if (pid == 0)
		_exit(end_after_concurrent_protect());
	int st;
	if (!CHECK(waitpid(pid, &st, 0) == pid))
		return;
	CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		  "end after a concurrent protect: child %s %d (SIGILL: it wrote PKRU on a CPU without PKU; "
		  "exit 1: PKRU changed)",
		  WIFEXITED(st) ? "exited" : "killed by signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_wp_bracket");
	RUN(begin_unprotected_changes_nothing);
	RUN(end_ignores_key_set_after_begin);
	return check_done();
}
