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
 * the child checks that PKRU did not change.
 *
 * With PKU, the bracket writes PKRU only when the key is closed: inside an
 * unsafe region (key open) begin returns RK_WP_UNCHANGED and end does
 * nothing; outside, begin opens the key and end closes it again.  PKRU is
 * the thread's own register, so these set it by hand for key 1 (allocated
 * or not, WRPKRU takes any value). */
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

static void bracket_writes_only_a_closed_key(void)
{
	if (!have_ospke()) {
		printf("test_wp_bracket: no PKU here: bracket_writes_only_a_closed_key not run\n");
		return;
	}
	struct rk_arena a = {.pkey = 1};
	const uint32_t bits = RK_PKRU_WD(1) | RK_PKRU_AD(1), saved = rk_pkru_read();
	/* the key open, as inside a region of the arena */
	uint32_t open = saved & ~bits;
	rk_pkru_write(open);
	uint32_t wp = rk_wp_write_begin(&a);
	uint32_t during = rk_pkru_read();
	rk_wp_write_end(wp);
	uint32_t after = rk_pkru_read();
	CHECK_MSG(wp == RK_WP_UNCHANGED && during == open && after == open,
		  "key open: begin returned %#x (want RK_WP_UNCHANGED), PKRU %#x during, %#x after (want %#x)", wp,
		  during, after, open);
	/* the key write-disabled, as outside regions */
	uint32_t closed = (saved & ~bits) | RK_PKRU_WD(1);
	rk_pkru_write(closed);
	wp = rk_wp_write_begin(&a);
	during = rk_pkru_read();
	rk_wp_write_end(wp);
	after = rk_pkru_read();
	CHECK_MSG(wp == closed && during == open && after == closed,
		  "key closed: begin returned %#x (want %#x), PKRU %#x during (want %#x), %#x after", wp, closed,
		  during, open, after);
	rk_pkru_write(saved);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_wp_bracket");
	RUN(begin_unprotected_changes_nothing);
	RUN(end_ignores_key_set_after_begin);
	RUN(bracket_writes_only_a_closed_key);
	return check_done();
}
