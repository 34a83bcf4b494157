/* The worst case for the injector's unarmed cost: a loop whose whole work
 * is calls to a tiny function, so the function gate (a load and a branch
 * at each entry) is a large share of every call.  Prints CPU ns per call
 * (thread CPU time: this machine is shared, and waiting is not cost).
 *   bench_micro CALLS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v;
	h *= 0x100000001b3ull;
	if (h > 0x7fffffffffffffffull)
		h ^= h >> 29;
	return h;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: bench_micro CALLS\n");
		return 2;
	}
	long n = atol(argv[1]);
	struct timespec a, b;
	uint64_t h = 0xcbf29ce484222325ull;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
	for (long i = 0; i < n; i++)
		h = mix(h, (uint64_t)i);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
	double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
	printf("{\"ns_per_call\": %.3f, \"h\": %llu}\n", ns / (double)n, (unsigned long long)h);
	return 0;
}
