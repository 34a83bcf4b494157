/* An arena made by the runtime itself, for supervisor/tests/inspect.rs: opens
 * the arena "real", allocates and frees a known set of objects, sets two
 * roots, prints one line "PID FD ALLOCATED BASE" (the arena memfd's fd
 * number, and what rk_arena_stats says), then waits for its stdin to close. */
#include "rekindle.h"
#include "rk_internal.h"

#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (rk_init(argc, argv, NULL) < 0)
		return 3;
	rk_arena *a = rk_arena_open("real", 64ull << 20);
	if (!a)
		return 3;
	void *small[100], *mid[10], *big[3];
	for (int i = 0; i < 100; i++)
		small[i] = rk_alloc(a, 24); /* class 32 */
	for (int i = 0; i < 10; i++)
		mid[i] = rk_alloc(a, 1000); /* class 1024 */
	for (int i = 0; i < 3; i++)
		big[i] = rk_alloc(a, 100000); /* 25 pages */
	for (int i = 0; i < 100; i += 2)
		rk_free(a, small[i]); /* to this thread's cache, and beyond */
	rk_free(a, big[1]);
	if (rk_root_set(a, "first", small[1]) < 0 || rk_root_set(a, "big", big[0]) < 0)
		return 3;
	(void)mid;
	struct rk_arena_stats st;
	if (rk_arena_stats(a, &st) < 0)
		return 3;
	printf("%d %d %llu %llu\n", getpid(), a->fd, (unsigned long long)st.allocated_bytes,
	       (unsigned long long)st.base);
	fflush(stdout);
	char c;
	while (read(0, &c, 1) > 0)
		;
	return 0;
}
