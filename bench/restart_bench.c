/* restart_bench - how long a warm restart takes, against a bare fork+exec.
 *
 *   restart_bench warm --size-mb N [--restarts K] [--prefault]
 *       Fills N MiB of an arena (written, so every page is resident and
 *       mapped), then restarts K times.  Each incarnation prints the time from
 *       rk_restart() to the return of its rk_init(), then touches every
 *       preserved page (the cost the restart itself leaves out), and, with
 *       --prefault, times rk_prefault(false) before touching instead.
 *   restart_bench bare [--restarts K] [--read-mb N]
 *       fork+exec of this same binary with no state, K times: the time from
 *       before fork() to the child's main().  With --read-mb, each fork
 *       follows the same read pass over N MiB as a warm restart does (one
 *       byte per page of memory written once; not inherited by the child):
 *       a bare restart in the cache state a warm one starts from.
 *
 * One JSON line per measurement on stdout. */
#include "rekindle.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u
#define CHUNK (64u << 20) /* objects of 64 MiB fill the arena */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int usage(void)
{
	fprintf(stderr, "usage: restart_bench warm --size-mb N [--restarts K] [--prefault]\n"
			"       restart_bench bare [--restarts K] [--read-mb N]\n");
	return 2;
}

/* The list of chunks lives in the arena too, rooted as "chunks". */
struct chunks {
	uint64_t n;
	unsigned char *p[];
};

static struct chunks *fill(rk_arena *a, uint64_t mb)
{
	uint64_t n = (mb * (1ull << 20) + CHUNK - 1) / CHUNK;
	struct chunks *c = rk_calloc(a, 1, sizeof *c + n * sizeof c->p[0]);
	if (!c)
		return NULL;
	c->n = n;
	uint64_t left = mb << 20;
	for (uint64_t i = 0; i < n; i++, left -= CHUNK < left ? CHUNK : left) {
		size_t sz = CHUNK < left ? CHUNK : left;
		c->p[i] = rk_alloc(a, sz);
		if (!c->p[i])
			return NULL;
		memset(c->p[i], (int)(i + 1), sz);
	}
	return c;
}

/* Reads one byte per page; returns a checksum so the reads stay. */
static uint64_t touch_read(const struct chunks *c, uint64_t mb)
{
	uint64_t sum = 0, left = mb << 20;
	for (uint64_t i = 0; i < c->n; i++, left -= CHUNK < left ? CHUNK : left) {
		size_t sz = CHUNK < left ? CHUNK : left;
		for (size_t off = 0; off < sz; off += PAGE)
			sum += ((volatile unsigned char *)c->p[i])[off];
	}
	return sum;
}

static int run_warm(int argc, char **argv, uint64_t mb, unsigned restarts, int prefault)
{
	/* Back-to-back restarts are the point here, not a crash loop.  Set in
	 * the environment once, by the first incarnation: a setenv before each
	 * rk_init would add the first malloc's cost to every measured restart,
	 * which the bare child, measured at main's entry, does not pay. */
	if (!getenv("REKINDLE_CRASHLOOP_MS"))
		setenv("REKINDLE_CRASHLOOP_MS", "0", 1);
	int r = rk_init(argc, argv, &(struct rk_options){.flags = RK_OPT_QUIET});
	if (r < 0) {
		fprintf(stderr, "rk_init: %s\n", strerror(-r));
		return 1;
	}
	const struct rk_restart_info *in = rk_restart_info();
	rk_arena *a = rk_arena_open("bench", (mb << 20) + (mb << 20) / 8 + (64u << 20));
	if (!a) {
		perror("rk_arena_open");
		return 1;
	}
	struct chunks *c;
	if (in->kind == RK_START_FRESH) {
		c = fill(a, mb);
		if (!c || rk_root_set(a, "chunks", c) < 0) {
			fprintf(stderr, "fill failed: %s\n", strerror(errno));
			return 1;
		}
	} else if (in->kind == RK_START_WARM) {
		c = rk_root_get(a, "chunks");
		uint64_t prefault_ns = 0;
		if (prefault) {
			uint64_t t = now_ns();
			rk_prefault(false);
			prefault_ns = now_ns() - t;
		}
		uint64_t t = now_ns();
		uint64_t sum = touch_read(c, mb);
		uint64_t touch_ns = now_ns() - t;
		uint64_t expect = 0, left = mb << 20;
		for (uint64_t i = 0; i < c->n; i++, left -= CHUNK < left ? CHUNK : left)
			expect += ((CHUNK < left ? CHUNK : left) / PAGE) * ((i + 1) & 0xff);
		printf("{\"bench\":\"warm\",\"size_mb\":%llu,\"generation\":%u,\"restart_us\":%.1f,"
		       "\"touch_ms\":%.2f,\"prefault_ms\":%.2f,\"preserved_bytes\":%llu,\"contents_ok\":%s}\n",
		       (unsigned long long)mb, in->generation, in->restart_ns / 1e3, touch_ns / 1e6,
		       prefault_ns / 1e6, (unsigned long long)in->preserved_bytes, sum == expect ? "true" : "false");
		fflush(stdout);
		if (sum != expect)
			return 1;
	} else {
		fprintf(stderr, "unexpected cold start: %s\n", in->decision);
		return 1;
	}
	if (in->generation < restarts) {
		rk_finish_recovery(false, NULL);
		r = rk_restart("bench");
		fprintf(stderr, "rk_restart: %s\n", strerror(-r));
		return 1;
	}
	return 0;
}

/* N MiB written once, kept out of forked children (MADV_DONTFORK) so that
 * the fork copies no page tables for it. */
static unsigned char *read_region(uint64_t mb)
{
	size_t len = (size_t)mb << 20;
	unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED || madvise(p, len, MADV_DONTFORK) < 0) {
		perror("restart_bench: read region");
		return NULL;
	}
	for (size_t off = 0; off < len; off += PAGE)
		p[off] = (unsigned char)(off >> 12);
	return p;
}

static int run_bare(const char *self, unsigned restarts, uint64_t read_mb)
{
	unsigned char *region = read_mb ? read_region(read_mb) : NULL;
	if (read_mb && !region)
		return 1;
	for (unsigned i = 0; i < restarts; i++) {
		if (region) {
			volatile uint64_t sum = 0;
			for (uint64_t off = 0; off < (read_mb << 20); off += PAGE)
				sum += region[off];
		}
		char t0[32];
		int fds[2];
		if (pipe(fds) < 0)
			return 1;
		snprintf(t0, sizeof t0, "%llu", (unsigned long long)now_ns());
		pid_t pid = fork();
		if (pid == 0) {
			dup2(fds[1], 1);
			execl(self, self, "bare-child", t0, (char *)NULL);
			_exit(127);
		}
		close(fds[1]);
		char buf[64] = "";
		ssize_t n = read(fds[0], buf, sizeof buf - 1);
		close(fds[0]);
		waitpid(pid, NULL, 0);
		if (n <= 0)
			return 1;
		printf("{\"bench\":\"bare\",\"run\":%u,\"read_mb\":%llu,\"restart_us\":%.1f}\n", i,
		       (unsigned long long)read_mb, strtoull(buf, NULL, 10) / 1e3);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "bare-child")) {
		/* first thing in main: report how long fork+exec took */
		printf("%llu\n", (unsigned long long)(now_ns() - strtoull(argv[2], NULL, 10)));
		return 0;
	}
	if (argc < 2)
		return usage();
	uint64_t mb = 0;
	unsigned restarts = 10;
	int prefault = 0;
	uint64_t read_mb = 0;
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--size-mb") && i + 1 < argc)
			mb = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--restarts") && i + 1 < argc)
			restarts = (unsigned)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--read-mb") && i + 1 < argc)
			read_mb = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--prefault"))
			prefault = 1;
		else
			return usage();
	}
	if (!strcmp(argv[1], "bare"))
		return run_bare("/proc/self/exe", restarts, read_mb);
	if (!strcmp(argv[1], "warm") && mb > 0)
		return run_warm(argc, argv, mb, restarts, prefault);
	return usage();
}
