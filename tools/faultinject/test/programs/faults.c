/* The program tests/test_faultinject.py builds with the pass: each fi_*
 * function holds the site of one fault type, and main prints what each
 * computed, one "name=value" line each, so a test sees exactly what an
 * armed fault changed.  Inputs come from argv so nothing folds away.
 *   faults N          one pass over every function with input N
 *   faults N loop K   also count is_big(0..K-1) (for AFTER and MODE)
 *   faults N kill     then SIGKILL itself (the trace must survive) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))

static int counter = 1;

/* comparison-inversion: icmp sgt */
NOINLINE int fi_is_big(int x)
{
	return x > 10;
}

/* missing-assignment and wrong-result-stored: the store to counter */
NOINLINE void fi_set_counter(int v)
{
	counter = v;
}

/* wrong-operand: add x, 7 */
NOINLINE int fi_offset(int x)
{
	return x + 7;
}

/* missing-if: the if without else around the call */
NOINLINE int fi_clamp(int x)
{
	if (x > 100) {
		puts("clamped");
		x = 100;
	}
	return x;
}

NOINLINE void fi_total(const int *a, int n, long *out)
{
	long s = 0;
	for (int i = 0; i < n; i++)
		s += a[i];
	*out = s;
}

/* uninitialized-variable: the memset of buf, its first write */
NOINLINE long fi_sum_prefix(int n)
{
	int buf[64];
	long s;
	memset(buf, 0, sizeof buf);
	for (int i = 0; i < n && i < 64; i++)
		buf[i] = i;
	fi_total(buf, 64, &s);
	return s;
}

/* leaves its stack dirty where fi_sum_prefix's buf will be */
NOINLINE void fi_dirty_stack(void)
{
	volatile int junk[256];
	for (int i = 0; i < 256; i++)
		junk[i] = 0x5555;
}

NOINLINE void fi_note(void)
{
	puts("noted");
}

/* missing-call: the call to fi_note */
NOINLINE void fi_maybe_note(int x)
{
	if (x >= 0)
		fi_note();
}

/* never called: its sites must not appear in a trace */
NOINLINE int fi_never(int x)
{
	return x * 5 + 3;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: faults N [loop K | kill]\n");
		return 2;
	}
	int n = atoi(argv[1]);
	printf("is_big=%d\n", fi_is_big(n));
	fi_set_counter(n);
	printf("counter=%d\n", counter);
	printf("offset=%d\n", fi_offset(n));
	printf("clamp=%d\n", fi_clamp(n * 10));
	fi_dirty_stack();
	printf("sum=%ld\n", fi_sum_prefix(n));
	fi_maybe_note(n);
	if (argc > 3 && strcmp(argv[2], "loop") == 0) {
		int k = atoi(argv[3]), big = 0;
		for (int i = 0; i < k; i++)
			big += fi_is_big(i);
		printf("big=%d\n", big);
	}
	if (argc > 2 && strcmp(argv[2], "kill") == 0) {
		fflush(stdout);
		raise(SIGKILL);
	}
	if (argc > 99)
		printf("%d\n", fi_never(n));
	return 0;
}
