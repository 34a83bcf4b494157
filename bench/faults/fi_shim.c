/* fi_shim.c: the campaign's switches, linked (uninstrumented) into the
 * fault-injection builds of rkv and the Redis port (bench/faults/build.sh),
 * with -Wl,--wrap=rk_init,--wrap=rk_unsafe_begin,--wrap=rk_unsafe_end.
 * Nothing changes unless one of these is set:
 *
 *   REKINDLE_FI_ONCE=PATH     arm REKINDLE_FAULT in the first incarnation
 *                             only: the first start creates PATH; every later
 *                             start (a warm or cold restart, in place or by
 *                             the supervisor) finds it and drops the fault
 *                             variables before the injector reads them.  The
 *                             restarted server runs the fixed code, as after a
 *                             transient fault.
 *   REKINDLE_FI_NO_REGIONS=1  the app's unsafe regions do nothing (a region's
 *                             end still commits the thread's pending
 *                             allocations, as rk_unsafe_end does): the
 *                             configuration "without unsafe regions".  The
 *                             allocator's own critical sections still count.
 *   REKINDLE_FI_VANILLA=1     rk_set_warm_allowed(false) right after rk_init:
 *                             every restart is cold (the app's own recovery
 *                             from its snapshot/RDB): the vanilla restart the
 *                             campaign compares a corruption with. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include <rekindle.h>

int __real_rk_init(int argc, char **argv, const struct rk_options *opts);
void __real_rk_unsafe_begin(rk_arena *arena);
void __real_rk_unsafe_end(rk_arena *arena);

static bool no_regions;

static bool env_on(const char *name)
{
	const char *v = getenv(name);
	return v && *v && *v != '0';
}

/* Before the injector's modules register (priority 101) and read the
 * environment: 100 is reserved for "the implementation", which is what
 * this file is for the instrumented program. */
__attribute__((constructor(100))) static void fi_shim_init(void)
{
	const char *once = getenv("REKINDLE_FI_ONCE");
	if (once && *once) {
		int fd = open(once, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd >= 0) {
			close(fd); /* the first incarnation: stays armed */
		} else if (errno == EEXIST) {
			unsetenv("REKINDLE_FAULT");
			unsetenv("REKINDLE_FAULT_AFTER");
			unsetenv("REKINDLE_FAULT_MODE");
			unsetenv("REKINDLE_FAULT_ARM_SIGNAL"); /* SIGUSR2 keeps its default */
		}
	}
	no_regions = env_on("REKINDLE_FI_NO_REGIONS");
}

int __wrap_rk_init(int argc, char **argv, const struct rk_options *opts)
{
	int r = __real_rk_init(argc, argv, opts);
	if (env_on("REKINDLE_FI_VANILLA"))
		rk_set_warm_allowed(false);
	return r;
}

void __wrap_rk_unsafe_begin(rk_arena *arena)
{
	if (!no_regions)
		__real_rk_unsafe_begin(arena);
}

void __wrap_rk_unsafe_end(rk_arena *arena)
{
	if (no_regions)
		rk_commit();
	else
		__real_rk_unsafe_end(arena);
}
