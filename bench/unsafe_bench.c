/*
 * unsafe_bench.c - the cost of one rk_unsafe_begin/rk_unsafe_end pair.
 *
 *   unsafe_bench [-n ITERS] [-r RUNS] [-c CASE]
 *
 * Each case runs ITERS iterations RUNS times and prints one JSON line with
 * the median ns per iteration (CLOCK_MONOTONIC around the loop) and the
 * median TSC ticks per iteration.  Cases: an empty loop; a pair on one
 * arena (1 thread); a nested pair (begin, begin, end, end); 2 threads each
 * on its own arena; 2 threads on the same arena (the slots are per thread:
 * no shared line); atomic_fetch_add on a shared counter with 1 and 2 threads
 * (the uncontended and the contended baseline); a pair on an arena
 * opened RK_ARENA_WRITE_PROTECT (its "protected" field says whether pkeys
 * were really available, or the runtime fell back to unprotected); and
 * an allocation and its free alone (alloc_free), then with a pair between
 * them that commits the allocation (alloc_publish).
 *
 * Where pkeys work, the protected cases too: a nested pair, an allocation
 * and its free inside a region and outside any, and the floor of any
 * protected pair: two WRPKRUs alone, opening and closing the arena's key
 * without the runtime (wrpkru_pair), and the same two WRPKRUs placed by
 * hand around a pair on an unprotected arena (pair_then_wrpkru).  An
 * outermost protected pair must change the rights twice, so it cannot cost
 * less than the latter.
 *
 * Every measured loop is bracketed by getppid() in its own thread, as
 * markers for `strace -f` (bench/run_unsafe.py counts the syscalls between
 * them: the fast path must make none).
 */
#include <rekindle.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define MAX_RUNS 64

static long iters = 100000000;
static int runs = 5;
static rk_arena *arena_a, *arena_b, *arena_wp;
static _Atomic uint64_t shared_counter;
/* the pair's memory traffic without the runtime: a locked add, then a
 * release store to the same word (what begin and end do to the depth) */
static _Alignas(64) _Atomic uint16_t private_depth[2][32];
/* PKRU with arena_wp's key open and closed (wrpkru_pair); pkeys only */
static uint32_t pkru_open, pkru_closed;

static inline uint32_t rdpkru(void)
{
	uint32_t eax, edx, ecx = 0;
	__asm__ volatile(".byte 0x0f,0x01,0xee" : "=a"(eax), "=d"(edx) : "c"(ecx));
	return eax;
}

static inline void wrpkru(uint32_t v)
{
	__asm__ volatile(".byte 0x0f,0x01,0xef" : : "a"(v), "c"(0), "d"(0) : "memory");
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0) {
		perror("clock_gettime");
		exit(1);
	}
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

enum kind {
	EMPTY,
	PAIR,
	NESTED,
	ATOMIC,
	LOCKADD_STORE,
	ALLOC_FREE,
	ALLOC_PUBLISH,
	ALLOC_IN_REGION,
	WRPKRU_PAIR,
	PAIR_THEN_WRPKRU
};

struct job {
	enum kind kind;
	rk_arena *arena;
	int cpu;
	pthread_barrier_t *bar;
	double ns, tsc; /* per iteration */
};

static void pin(int cpu)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	if (n <= 0)
		return;
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu % (int)n, &s);
	int r = pthread_setaffinity_np(pthread_self(), sizeof s, &s);
	if (r != 0)
		fprintf(stderr, "unsafe_bench: pthread_setaffinity_np: %s (unpinned)\n", strerror(r));
}

static void *run_job(void *arg)
{
	struct job *j = arg;
	pin(j->cpu);
	rk_arena *a = j->arena;
	if (a) { /* claim this thread's slot outside the measurement */
		rk_unsafe_begin(a);
		rk_unsafe_end(a);
	}
	if (a && (j->kind == ALLOC_FREE || j->kind == ALLOC_PUBLISH || j->kind == ALLOC_IN_REGION)) {
		/* and its thread cache, and the arena's first slab: the first
		 * allocation grows the arena (ftruncate) and claims a cache */
		rk_free(a, rk_alloc(a, 64));
	}
	if (j->bar)
		pthread_barrier_wait(j->bar);
	(void)getppid(); /* marker: measured loop starts */
	uint64_t t0 = now_ns(), c0 = __rdtsc();
	switch (j->kind) {
	case EMPTY:
		for (long i = 0; i < iters; i++)
			__asm__ volatile("" ::: "memory");
		break;
	case PAIR:
		for (long i = 0; i < iters; i++) {
			rk_unsafe_begin(a);
			rk_unsafe_end(a);
		}
		break;
	case NESTED:
		for (long i = 0; i < iters; i++) {
			rk_unsafe_begin(a);
			rk_unsafe_begin(a);
			rk_unsafe_end(a);
			rk_unsafe_end(a);
		}
		break;
	case ATOMIC:
		for (long i = 0; i < iters; i++)
			atomic_fetch_add(&shared_counter, 1);
		break;
	case ALLOC_FREE: /* the allocator alone: the baseline of the next case */
		for (long i = 0; i < iters; i++) {
			void *p = rk_alloc(a, 64);
			__asm__ volatile("" : : "r"(p) : "memory");
			rk_free(a, p);
		}
		break;
	case ALLOC_PUBLISH: /* an allocation, published (and committed) by a region, then freed */
		for (long i = 0; i < iters; i++) {
			void *p = rk_alloc(a, 64);
			rk_unsafe_begin(a);
			__asm__ volatile("" : : "r"(p) : "memory");
			rk_unsafe_end(a);
			rk_free(a, p);
		}
		break;
	case ALLOC_IN_REGION: /* the app's usual shape: allocate and fill inside its region */
		for (long i = 0; i < iters; i++) {
			rk_unsafe_begin(a);
			void *p = rk_alloc(a, 64);
			__asm__ volatile("" : : "r"(p) : "memory");
			rk_free(a, p);
			rk_unsafe_end(a);
		}
		break;
	case WRPKRU_PAIR:
		for (long i = 0; i < iters; i++) {
			wrpkru(pkru_open);
			wrpkru(pkru_closed);
		}
		break;
	case PAIR_THEN_WRPKRU: /* a (unprotected) pair, the rights changed by hand */
		for (long i = 0; i < iters; i++) {
			rk_unsafe_begin(a);
			wrpkru(pkru_open);
			rk_unsafe_end(a);
			wrpkru(pkru_closed);
		}
		break;
	case LOCKADD_STORE: {
		_Atomic uint16_t *d = &private_depth[j->cpu & 1][0];
		for (long i = 0; i < iters; i++) {
			uint16_t v = atomic_fetch_add(d, 1);
			atomic_store_explicit(d, v, memory_order_release);
		}
		break;
	}
	}
	uint64_t c1 = __rdtsc(), t1 = now_ns();
	(void)getppid(); /* marker: measured loop ends */
	j->ns = (double)(t1 - t0) / (double)iters;
	j->tsc = (double)(c1 - c0) / (double)iters;
	return NULL;
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One case: nthreads threads (arena of thread i: arenas[i]), RUNS times. */
static void bench_case(const char *name, enum kind kind, int nthreads, rk_arena *arenas[2], const char *note)
{
	double ns[MAX_RUNS], tsc[MAX_RUNS];
	for (int r = 0; r < runs; r++) {
		struct job jobs[2];
		pthread_t th[2];
		pthread_barrier_t bar;
		if (pthread_barrier_init(&bar, NULL, (unsigned)nthreads) != 0) {
			fprintf(stderr, "unsafe_bench: pthread_barrier_init failed\n");
			exit(1);
		}
		for (int t = 0; t < nthreads; t++) {
			jobs[t] = (struct job){.kind = kind, .arena = arenas ? arenas[t] : NULL, .cpu = t, .bar = &bar};
			int e = pthread_create(&th[t], NULL, run_job, &jobs[t]);
			if (e != 0) {
				fprintf(stderr, "unsafe_bench: pthread_create: %s\n", strerror(e));
				exit(1);
			}
		}
		double worst_ns = 0, worst_tsc = 0; /* a run lasts as long as its slowest thread */
		for (int t = 0; t < nthreads; t++) {
			int e = pthread_join(th[t], NULL);
			if (e != 0) {
				fprintf(stderr, "unsafe_bench: pthread_join: %s\n", strerror(e));
				exit(1);
			}
			if (jobs[t].ns > worst_ns)
				worst_ns = jobs[t].ns, worst_tsc = jobs[t].tsc;
		}
		pthread_barrier_destroy(&bar);
		ns[r] = worst_ns;
		tsc[r] = worst_tsc;
	}
	printf("{\"case\":\"%s\",\"threads\":%d,\"iters\":%ld,\"runs\":%d,\"ns_per_iter\":%.3f,\"tsc_per_iter\":%.2f,"
	       "\"ns_runs\":[",
	       name, nthreads, iters, runs, median(ns, runs), median(tsc, runs));
	for (int r = 0; r < runs; r++) /* sorted by median() */
		printf("%s%.3f", r ? "," : "", ns[r]);
	printf("],\"protected\":%s,\"note\":\"%s\"}\n",
	       kind != EMPTY && kind != ATOMIC && kind != LOCKADD_STORE && arenas && rk_arena_write_protected(arenas[0])
		       ? "true"
		       : "false",
	       note);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	const char *only = NULL;
	int opt;
	while ((opt = getopt(argc, argv, "n:r:c:")) != -1) {
		if (opt == 'n')
			iters = atol(optarg);
		else if (opt == 'r')
			runs = atoi(optarg);
		else if (opt == 'c')
			only = optarg;
		else {
			fprintf(stderr, "usage: %s [-n ITERS] [-r RUNS] [-c CASE]\n", argv[0]);
			return 2;
		}
	}
	if (iters <= 0 || runs <= 0 || runs > MAX_RUNS) {
		fprintf(stderr, "unsafe_bench: bad -n or -r\n");
		return 2;
	}
	struct rk_options o = {.flags = RK_OPT_QUIET};
	int r = rk_init(argc, argv, &o);
	if (r < 0) {
		fprintf(stderr, "unsafe_bench: rk_init: %s\n", strerror(-r));
		return 1;
	}
	arena_a = rk_arena_open("bench_a", 64u << 20);
	arena_b = rk_arena_open("bench_b", 64u << 20);
	arena_wp = rk_arena_open_flags("bench_wp", 64u << 20, RK_ARENA_WRITE_PROTECT);
	if (!arena_a || !arena_b || !arena_wp) {
		perror("unsafe_bench: rk_arena_open");
		return 1;
	}
	/* Protected means the CPU and kernel have pkeys: RDPKRU works.  The
	 * PKRU values with the key open and closed, from a region. */
	bool prot = rk_arena_write_protected(arena_wp), pku_probe = false;
	if (prot) {
		uint32_t before = rdpkru();
		rk_unsafe_begin(arena_wp);
		pkru_open = rdpkru();
		rk_unsafe_end(arena_wp);
		pkru_closed = rdpkru();
		pku_probe = pkru_closed == before && pkru_open != before;
		if (!pku_probe)
			fprintf(stderr, "unsafe_bench: a region did not change PKRU (%#x -> %#x): no wrpkru_pair\n",
				before, pkru_open);
	}
	rk_arena *one[2] = {arena_a, arena_a}, *own[2] = {arena_a, arena_b}, *wp[2] = {arena_wp, arena_wp};
	const char *wpnote = prot ? "pkeys: wrpkru on the outermost begin and end"
				  : "RK_ARENA_WRITE_PROTECT requested, pkeys unavailable: fell back to unprotected";
	struct {
		const char *name;
		enum kind kind;
		int threads;
		rk_arena **arenas;
		const char *note;
		bool pkeys_only; /* not run where the arena fell back to unprotected */
	} cases[] = {
		{"empty_loop", EMPTY, 1, NULL, "loop overhead", false},
		{"pair", PAIR, 1, one, "rk_unsafe_begin + rk_unsafe_end", false},
		{"nested_pair", NESTED, 1, one, "begin, begin, end, end (per iteration)", false},
		{"pair_2t_own_arenas", PAIR, 2, own, "2 threads, each on its own arena", false},
		{"pair_2t_same_arena", PAIR, 2, one, "2 threads on one arena (per-thread slots)", false},
		{"atomic_add_1t", ATOMIC, 1, NULL, "atomic_fetch_add, uncontended", false},
		{"atomic_add_2t_shared", ATOMIC, 2, NULL, "atomic_fetch_add on one shared counter (contended baseline)", false},
		{"lockadd_then_store", LOCKADD_STORE, 1, NULL, "the pair's memory ops alone: locked add + release store, same word", false},
		{"pair_write_protect", PAIR, 1, wp, wpnote, false},
		{"alloc_free", ALLOC_FREE, 1, one, "rk_alloc(64) + rk_free, no region", false},
		{"alloc_publish", ALLOC_PUBLISH, 1, one, "rk_alloc(64), begin, end (commits it), rk_free", false},
		{"wrpkru_pair", WRPKRU_PAIR, 1, wp, "the floor of a protected pair: WRPKRU open + WRPKRU close, no runtime", true},
		{"pair_then_wrpkru", PAIR_THEN_WRPKRU, 1, one, "begin + WRPKRU open + end + WRPKRU close on the plain arena", true},
		{"nested_pair_write_protect", NESTED, 1, wp, "begin, begin, end, end on the protected arena", true},
		{"alloc_in_region", ALLOC_IN_REGION, 1, one, "begin, rk_alloc(64), rk_free, end", false},
		{"alloc_in_region_write_protect", ALLOC_IN_REGION, 1, wp, "the same on the protected arena", true},
		{"alloc_free_write_protect", ALLOC_FREE, 1, wp, "rk_alloc(64) + rk_free on the protected arena, no region", true},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		if (only && strcmp(only, cases[i].name) != 0)
			continue;
		bool by_hand = cases[i].kind == WRPKRU_PAIR || cases[i].kind == PAIR_THEN_WRPKRU;
		if (cases[i].pkeys_only && !(prot && (!by_hand || pku_probe))) {
			if (only)
				fprintf(stderr, "unsafe_bench: %s needs pkeys\n", cases[i].name);
			continue;
		}
		bench_case(cases[i].name, cases[i].kind, cases[i].threads, cases[i].arenas, cases[i].note);
	}
	return 0;
}
