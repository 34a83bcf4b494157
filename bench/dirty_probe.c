/* dirty_probe - how long a consistent cut of a memfd-backed arena takes with
 * userfaultfd async write-protect and PAGEMAP_SCAN (scan the written pages
 * and write-protect them again in one call), the dirty tracking that durable
 * snapshots will use (no soft-dirty on this kernel).  Groundwork for the
 * snapshot design: it measures, per interval, the scan alone and the scan
 * plus copying the dirty pages out (the two ways to keep later writes out
 * of a snapshot).  One JSON line per configuration on stdout.
 *
 *   dirty_probe [--mb N] [--dirty-permille P] [--rounds R] [--threads T]
 *
 * --dirty-permille 0 measures the walk alone: what PAGEMAP_SCAN costs when
 * nothing was written, the floor of any cut that must look at every page
 * table entry.  --threads T splits each scan into T parts scanned at once
 * by T threads (whether the walk parallelizes); the copy stays on one.
 *
 * The uapi constants come from runtime/src/uffd_uapi.h: Debian 12's kernel
 * headers (6.1) predate PAGEMAP_SCAN and UFFD_FEATURE_WP_ASYNC (Linux 6.7). */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/src/uffd_uapi.h" /* the 6.7 uapi Debian 12's headers lack */

#define PAGE 4096ull

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void die(const char *what)
{
	fprintf(stderr, "dirty_probe: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* A userfaultfd with async write-protect over [p, p+len): writes are never
 * blocked, the kernel only records them for PAGEMAP_SCAN. */
static int wp_async_register(char *p, size_t len)
{
	int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
	if (uffd < 0) {
		uffd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
		if (uffd >= 0) {
			int fd = ioctl(uffd, USERFAULTFD_IOC_NEW, O_CLOEXEC);
			close(uffd);
			uffd = fd;
		}
	}
	if (uffd < 0)
		die("userfaultfd");
	struct uffdio_api api = {.api = UFFD_API,
				 .features = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED |
					     UFFD_FEATURE_WP_HUGETLBFS_SHMEM};
	if (ioctl(uffd, UFFDIO_API, &api) < 0)
		die("UFFDIO_API (async write-protect needs Linux 6.7)");
	struct uffdio_register reg = {.range = {(uint64_t)(uintptr_t)p, len}, .mode = UFFDIO_REGISTER_MODE_WP};
	if (ioctl(uffd, UFFDIO_REGISTER, &reg) < 0)
		die("UFFDIO_REGISTER");
	struct uffdio_writeprotect wp = {.range = {(uint64_t)(uintptr_t)p, len}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
	if (ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) < 0)
		die("UFFDIO_WRITEPROTECT");
	return uffd;
}

/* Scans for written pages and protects them again, in one call; returns
 * the number of regions in vec (each a run of written pages). */
static long scan_and_reprotect(int pagemap, char *p, size_t len, struct page_region *vec, size_t vec_len)
{
	struct pm_scan_arg arg = {.size = sizeof arg,
				  .flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
				  .start = (uint64_t)(uintptr_t)p,
				  .end = (uint64_t)(uintptr_t)p + len,
				  .vec = (uint64_t)(uintptr_t)vec,
				  .vec_len = vec_len,
				  .category_mask = PAGE_IS_WRITTEN,
				  .return_mask = PAGE_IS_WRITTEN};
	long n = ioctl(pagemap, PAGEMAP_SCAN, &arg);
	if (n < 0)
		die("PAGEMAP_SCAN");
	return n;
}

/* The parts of a parallel scan: thread i scans part i between two
 * barriers; the main thread is part 0 and times the whole. */
struct scan_part {
	int pagemap;
	char *p;
	size_t len;
	struct page_region *vec;
	size_t vec_len;
	long n;
};
static pthread_barrier_t scan_start, scan_done;
static uint64_t scan_rounds;

static void *scan_worker(void *arg)
{
	struct scan_part *part = arg;
	for (uint64_t r = 0; r < scan_rounds; r++) {
		pthread_barrier_wait(&scan_start);
		part->n = scan_and_reprotect(part->pagemap, part->p, part->len, part->vec, part->vec_len);
		pthread_barrier_wait(&scan_done);
	}
	return NULL;
}

/* Splits [p, p + len) into `threads` page-aligned parts, each with its
 * share of vec; starts the workers for parts 1.. */
static struct scan_part *scan_parts(int pagemap, char *p, struct page_region *vec, size_t npages,
				    unsigned threads)
{
	struct scan_part *parts = calloc(threads, sizeof *parts);
	if (!parts)
		die("calloc");
	size_t per = (npages + threads - 1) / threads;
	for (unsigned i = 0; i < threads; i++) {
		size_t first = per * i, last = first + per > npages ? npages : first + per;
		parts[i] = (struct scan_part){pagemap, p + first * PAGE, (last - first) * PAGE, vec + first,
					      last - first, 0};
	}
	if (pthread_barrier_init(&scan_start, NULL, threads) || pthread_barrier_init(&scan_done, NULL, threads))
		die("pthread_barrier_init");
	for (unsigned i = 1; i < threads; i++) {
		pthread_t t;
		if (pthread_create(&t, NULL, scan_worker, &parts[i]))
			die("pthread_create");
		pthread_detach(t);
	}
	return parts;
}

int main(int argc, char **argv)
{
	uint64_t mb = 2048, permille = 10, rounds = 50, threads = 1;
	for (int i = 1; i + 1 < argc; i += 2) {
		uint64_t v = strtoull(argv[i + 1], NULL, 10);
		if (!strcmp(argv[i], "--mb"))
			mb = v;
		else if (!strcmp(argv[i], "--dirty-permille"))
			permille = v;
		else if (!strcmp(argv[i], "--rounds"))
			rounds = v;
		else if (!strcmp(argv[i], "--threads") && v >= 1 && v <= 64)
			threads = v;
		else {
			fprintf(stderr, "usage: dirty_probe [--mb N] [--dirty-permille P] [--rounds R] [--threads T]\n");
			return 2;
		}
	}
	size_t len = mb << 20, npages = len / PAGE;
	int fd = memfd_create("probe-arena", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)len) < 0)
		die("memfd");
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		die("mmap");
	for (size_t off = 0; off < len; off += PAGE)
		p[off] = 1; /* resident, like a warm arena */
	int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (pagemap < 0)
		die("/proc/self/pagemap");
	double t0 = now_us();
	(void)wp_async_register(p, len);
	double t_register = now_us() - t0;
	size_t ndirty = npages * permille / 1000;
	struct page_region *vec = calloc(npages, sizeof *vec);
	char *copy = malloc(ndirty ? ndirty * PAGE : PAGE);
	double *scan = calloc(rounds, sizeof *scan), *stop = calloc(rounds, sizeof *stop);
	if (!vec || !copy || !scan || !stop)
		die("calloc");
	(void)scan_and_reprotect(pagemap, p, len, vec, npages); /* a clean start */
	scan_rounds = rounds;
	struct scan_part *parts = scan_parts(pagemap, p, vec, npages, (unsigned)threads);
	unsigned seed = 12345;
	uint64_t found_total = 0;
	for (uint64_t r = 0; r < rounds; r++) {
		for (size_t k = 0; k < ndirty; k++) {
			seed = seed * 1103515245 + 12345;
			p[((size_t)seed % npages) * PAGE + 64] = (char)r;
		}
		double a = now_us();
		pthread_barrier_wait(&scan_start);
		parts[0].n = scan_and_reprotect(pagemap, parts[0].p, parts[0].len, parts[0].vec, parts[0].vec_len);
		pthread_barrier_wait(&scan_done);
		double b = now_us();
		size_t copied = 0;
		for (unsigned t = 0; t < threads; t++) {
			for (long i = 0; i < parts[t].n; i++) {
				const struct page_region *g = &parts[t].vec[i];
				size_t bytes = g->end - g->start;
				if (copied + bytes > ndirty * PAGE)
					bytes = ndirty * PAGE - copied;
				memcpy(copy + copied, (void *)(uintptr_t)g->start, bytes);
				copied += bytes;
				found_total += (g->end - g->start) / PAGE;
			}
		}
		double c = now_us();
		scan[r] = b - a;
		stop[r] = c - a;
	}
	qsort(scan, rounds, sizeof *scan, cmp_double);
	qsort(stop, rounds, sizeof *stop, cmp_double);
	printf("{\"mb\":%llu,\"threads\":%llu,\"dirty_permille\":%llu,\"dirty_pages\":%zu,\"found_pages_per_round\":%.0f,"
	       "\"register_us\":%.1f,\"scan_us_median\":%.1f,\"scan_us_p99\":%.1f,"
	       "\"scan_copy_us_median\":%.1f,\"scan_copy_us_p99\":%.1f,\"rounds\":%llu}\n",
	       (unsigned long long)mb, (unsigned long long)threads, (unsigned long long)permille, ndirty, (double)found_total / (double)rounds,
	       t_register, scan[rounds / 2], scan[rounds * 99 / 100], stop[rounds / 2], stop[rounds * 99 / 100],
	       (unsigned long long)rounds);
	return 0;
}
