/* alloc_bench - the arena allocator against glibc malloc, same workload.
 *
 *   alloc_bench --backend rk|glibc [--workload mix|xfer] [--threads N]
 *               [--ops N] [--window N] [--seed S]
 *
 * mix:  every thread keeps a window of live objects (--window slots, filled
 *       before the clock starts) and --ops times replaces a random slot:
 *       free the old object, allocate a new one, write its first bytes.
 *       One op = one free + one alloc (a pair) in the same thread.
 * xfer: threads form producer/consumer pairs (--threads must be even).  The
 *       producer allocates --ops objects, writes them and hands them over in
 *       batches through a ring; the consumer checks and frees them, so every
 *       free is of an object another thread allocated.  One op = one object:
 *       an alloc in the producer plus its free in the consumer.
 *
 * Sizes: 80% 16..256 B, 15% 257 B..4 KiB, 4.9% 4..32 KiB, 0.1% 64..256 KiB
 * (uniform inside each band).  Every object gets a tag in its first bytes,
 * checked when it is freed, so a block handed out twice is counted as an
 * error.
 *
 * Output: one JSON line.  ns_per_op = wall time of the timed phase / ops per
 * thread (mix) or per pair (xfer); cpu_ns_per_op = process CPU time (user +
 * sys) of the timed phase / all ops. */
#include "rekindle.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define MAX_THREADS 64
#define TOUCH_BYTES 64   /* bytes written in each new object */
#define XFER_BATCH 64    /* pointers per hand-over */
#define XFER_RING 64     /* batches in flight per pair */
#define ARENA_BYTES (4ull << 30)

enum backend { BACKEND_RK, BACKEND_GLIBC };
enum workload { WORKLOAD_MIX, WORKLOAD_XFER };

struct config {
	enum backend backend;
	enum workload workload;
	unsigned threads;
	unsigned long ops;
	unsigned window;
	unsigned long seed;
};

static struct config cfg = {BACKEND_RK, WORKLOAD_MIX, 1, 2000000, 1000, 1};
static rk_arena *arena;
static pthread_barrier_t start_line;
static atomic_ulong errors;

/* ---- the two backends ---------------------------------------------------- */

static inline void *bench_alloc(size_t n)
{
	return cfg.backend == BACKEND_RK ? rk_alloc(arena, n) : malloc(n);
}

static inline void bench_free(void *p)
{
	if (cfg.backend == BACKEND_RK)
		rk_free(arena, p);
	else
		free(p);
}

/* ---- workload helpers ---------------------------------------------------- */

static inline uint64_t rng_next(uint64_t *s)
{
	/* xorshift64*: cheap next to the allocator, same cost on both backends */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

static inline size_t pick_size(uint64_t *s)
{
	uint64_t r = rng_next(s);
	unsigned band = (unsigned)(r % 1000);
	uint64_t u = r >> 20;
	if (band < 800)
		return 16 + u % 241;
	if (band < 950)
		return 257 + u % (4096 - 257 + 1);
	if (band < 999)
		return 4097 + u % (32768 - 4097 + 1);
	return 65536 + u % (196608 + 1);
}

/* Writes a tag derived from the object's identity into its first bytes. */
static inline void *make_object(uint64_t tag, size_t n)
{
	unsigned char *p = bench_alloc(n);
	if (!p) {
		fprintf(stderr, "alloc of %zu failed: %s\n", n, strerror(errno));
		exit(1);
	}
	size_t k = n < TOUCH_BYTES ? n : TOUCH_BYTES;
	memset(p, (int)(tag & 0xff), k);
	memcpy(p, &tag, sizeof tag); /* every size is >= 16 */
	return p;
}

static inline void drop_object(void *p, uint64_t tag)
{
	uint64_t seen;
	memcpy(&seen, p, sizeof seen);
	if (seen != tag)
		atomic_fetch_add_explicit(&errors, 1, memory_order_relaxed);
	bench_free(p);
}

static void spin_wait(unsigned *spins)
{
	/* 2 cores and up to 4 threads: yield soon so the partner can run */
	if (++*spins < 64)
		__builtin_ia32_pause();
	else
		sched_yield();
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_ns(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
	       ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
}

/* ---- mix: a window of live objects per thread ------------------------------ */

struct slot {
	void *p;
	uint64_t tag;
};

static void *mix_thread(void *arg)
{
	unsigned id = (unsigned)(uintptr_t)arg;
	uint64_t rng = (cfg.seed + 1) * 0x9e3779b97f4a7c15ull ^ (id + 1ull) * 0xbf58476d1ce4e5b9ull;
	struct slot *w = calloc(cfg.window, sizeof *w);
	if (!w)
		exit(1);
	uint64_t tag = (uint64_t)id << 48;
	for (unsigned i = 0; i < cfg.window; i++) {
		w[i].tag = ++tag;
		w[i].p = make_object(w[i].tag, pick_size(&rng));
	}
	pthread_barrier_wait(&start_line);
	for (unsigned long op = 0; op < cfg.ops; op++) {
		struct slot *s = &w[rng_next(&rng) % cfg.window];
		drop_object(s->p, s->tag);
		s->tag = ++tag;
		s->p = make_object(s->tag, pick_size(&rng));
	}
	pthread_barrier_wait(&start_line); /* clock stops before the cleanup */
	for (unsigned i = 0; i < cfg.window; i++)
		drop_object(w[i].p, w[i].tag);
	free(w);
	return NULL;
}

/* ---- xfer: producer/consumer pairs ------------------------------------------ */

struct batch {
	void *p[XFER_BATCH];
	uint64_t first_tag;
	unsigned n;
};

struct ring {
	_Alignas(64) atomic_ulong head; /* batches published by the producer */
	_Alignas(64) atomic_ulong tail; /* batches consumed */
	_Alignas(64) struct batch slots[XFER_RING];
};

static struct ring *rings;

static void *producer_thread(void *arg)
{
	unsigned id = (unsigned)(uintptr_t)arg;
	struct ring *r = &rings[id / 2];
	uint64_t rng = (cfg.seed + 1) * 0x9e3779b97f4a7c15ull ^ (id + 1ull) * 0xbf58476d1ce4e5b9ull;
	uint64_t tag = (uint64_t)id << 48;
	pthread_barrier_wait(&start_line);
	for (unsigned long done = 0; done < cfg.ops;) {
		unsigned long head = atomic_load_explicit(&r->head, memory_order_relaxed);
		unsigned spins = 0;
		while (head - atomic_load_explicit(&r->tail, memory_order_acquire) >= XFER_RING)
			spin_wait(&spins);
		struct batch *b = &r->slots[head % XFER_RING];
		b->n = cfg.ops - done < XFER_BATCH ? (unsigned)(cfg.ops - done) : XFER_BATCH;
		b->first_tag = tag + 1;
		for (unsigned i = 0; i < b->n; i++)
			b->p[i] = make_object(++tag, pick_size(&rng));
		atomic_store_explicit(&r->head, head + 1, memory_order_release);
		done += b->n;
	}
	pthread_barrier_wait(&start_line);
	return NULL;
}

static void *consumer_thread(void *arg)
{
	unsigned id = (unsigned)(uintptr_t)arg;
	struct ring *r = &rings[id / 2];
	pthread_barrier_wait(&start_line);
	for (unsigned long done = 0; done < cfg.ops;) {
		unsigned long tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
		unsigned spins = 0;
		while (atomic_load_explicit(&r->head, memory_order_acquire) == tail)
			spin_wait(&spins);
		struct batch *b = &r->slots[tail % XFER_RING];
		for (unsigned i = 0; i < b->n; i++)
			drop_object(b->p[i], b->first_tag + i);
		done += b->n;
		atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
	}
	pthread_barrier_wait(&start_line);
	return NULL;
}

/* ---- driver ---------------------------------------------------------------- */

static int usage(void)
{
	fprintf(stderr, "usage: alloc_bench --backend rk|glibc [--workload mix|xfer] [--threads N]\n"
			"                   [--ops N] [--window N] [--seed S]\n");
	return 2;
}

static int parse_args(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v)
			return -1;
		i++;
		if (!strcmp(a, "--backend") && (!strcmp(v, "rk") || !strcmp(v, "glibc")))
			cfg.backend = !strcmp(v, "rk") ? BACKEND_RK : BACKEND_GLIBC;
		else if (!strcmp(a, "--workload") && (!strcmp(v, "mix") || !strcmp(v, "xfer")))
			cfg.workload = !strcmp(v, "mix") ? WORKLOAD_MIX : WORKLOAD_XFER;
		else if (!strcmp(a, "--threads"))
			cfg.threads = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(a, "--ops"))
			cfg.ops = strtoul(v, NULL, 0);
		else if (!strcmp(a, "--window"))
			cfg.window = (unsigned)strtoul(v, NULL, 0);
		else if (!strcmp(a, "--seed"))
			cfg.seed = strtoul(v, NULL, 0);
		else
			return -1;
	}
	if (cfg.threads == 0 || cfg.threads > MAX_THREADS || cfg.ops == 0 || cfg.window == 0)
		return -1;
	if (cfg.workload == WORKLOAD_XFER && cfg.threads % 2)
		return -1;
	return 0;
}

static int setup_rk(int argc, char **argv)
{
	int r = rk_init(argc, argv, &(struct rk_options){.flags = RK_OPT_QUIET | RK_OPT_NO_SIGNAL_HANDLERS});
	if (r < 0) {
		fprintf(stderr, "rk_init: %s\n", strerror(-r));
		return -1;
	}
	arena = rk_arena_open("alloc_bench", ARENA_BYTES);
	if (!arena) {
		perror("rk_arena_open");
		return -1;
	}
	return 0;
}

static void *thread_main(unsigned id)
{
	if (cfg.workload == WORKLOAD_MIX)
		return mix_thread((void *)(uintptr_t)id);
	return id % 2 ? consumer_thread((void *)(uintptr_t)id) : producer_thread((void *)(uintptr_t)id);
}

static void *thread_entry(void *arg)
{
	return thread_main((unsigned)(uintptr_t)arg);
}

int main(int argc, char **argv)
{
	if (parse_args(argc, argv) < 0)
		return usage();
	if (cfg.backend == BACKEND_RK && setup_rk(argc, argv) < 0)
		return 1;
	if (cfg.workload == WORKLOAD_XFER && !(rings = aligned_alloc(64, sizeof *rings * (cfg.threads / 2))))
		return 1;
	if (rings)
		memset(rings, 0, sizeof *rings * (cfg.threads / 2));
	pthread_t tid[MAX_THREADS];
	pthread_barrier_init(&start_line, NULL, cfg.threads + 1);
	for (unsigned i = 0; i < cfg.threads; i++)
		if (pthread_create(&tid[i], NULL, thread_entry, (void *)(uintptr_t)i) != 0)
			return 1;
	pthread_barrier_wait(&start_line); /* every window is full */
	uint64_t t0 = now_ns(), c0 = cpu_ns();
	pthread_barrier_wait(&start_line); /* every thread is done */
	uint64_t wall = now_ns() - t0, cpu = cpu_ns() - c0;
	for (unsigned i = 0; i < cfg.threads; i++)
		pthread_join(tid[i], NULL);

	bool mix = cfg.workload == WORKLOAD_MIX;
	unsigned long streams = mix ? cfg.threads : cfg.threads / 2; /* ops run in parallel */
	printf("{\"bench\":\"alloc\",\"backend\":\"%s\",\"workload\":\"%s\",\"threads\":%u,\"ops\":%lu,"
	       "\"window\":%u,\"seed\":%lu,\"op\":\"%s\",\"wall_ms\":%.2f,\"ns_per_op\":%.2f,"
	       "\"cpu_ns_per_op\":%.2f,\"errors\":%lu}\n",
	       cfg.backend == BACKEND_RK ? "rk" : "glibc", mix ? "mix" : "xfer", cfg.threads, cfg.ops,
	       mix ? cfg.window : 0, cfg.seed, mix ? "free+alloc in one thread" : "alloc in producer, free in consumer",
	       wall / 1e6, (double)wall / (double)cfg.ops, (double)cpu / (double)(cfg.ops * streams),
	       atomic_load(&errors));
	return atomic_load(&errors) ? 1 : 0;
}
