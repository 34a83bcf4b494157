/* dirty_probe - how long a consistent cut of a memfd-backed arena takes with
 * userfaultfd async write-protect and PAGEMAP_SCAN (scan the written pages
 * and write-protect them again in one call), the dirty tracking that durable
 * snapshots will use (no soft-dirty on this kernel).  Groundwork for the
 * snapshot design: it measures, per interval, the scan alone and the scan
 * plus copying the dirty pages out (the two ways to keep later writes out
 * of a snapshot).  One JSON line per configuration on stdout.
 *
 *   dirty_probe [--mb N] [--dirty-permille P] [--rounds R]
 *
 * The uapi constants come from runtime/src/uffd_uapi.h: Debian 12's kernel
 * headers (6.1) predate PAGEMAP_SCAN and UFFD_FEATURE_WP_ASYNC (Linux 6.7). */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
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

int main(int argc, char **argv)
{
	uint64_t mb = 2048, permille = 10, rounds = 50;
	for (int i = 1; i + 1 < argc; i += 2) {
		uint64_t v = strtoull(argv[i + 1], NULL, 10);
		if (!strcmp(argv[i], "--mb"))
			mb = v;
		else if (!strcmp(argv[i], "--dirty-permille"))
			permille = v;
		else if (!strcmp(argv[i], "--rounds"))
			rounds = v;
		else {
			fprintf(stderr, "usage: dirty_probe [--mb N] [--dirty-permille P] [--rounds R]\n");
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
	unsigned seed = 12345;
	uint64_t found_total = 0;
	for (uint64_t r = 0; r < rounds; r++) {
		for (size_t k = 0; k < ndirty; k++) {
			seed = seed * 1103515245 + 12345;
			p[((size_t)seed % npages) * PAGE + 64] = (char)r;
		}
		double a = now_us();
		long n = scan_and_reprotect(pagemap, p, len, vec, npages);
		double b = now_us();
		size_t copied = 0;
		for (long i = 0; i < n; i++) {
			size_t bytes = vec[i].end - vec[i].start;
			if (copied + bytes > ndirty * PAGE)
				bytes = ndirty * PAGE - copied;
			memcpy(copy + copied, (void *)(uintptr_t)vec[i].start, bytes);
			copied += bytes;
			found_total += (vec[i].end - vec[i].start) / PAGE;
		}
		double c = now_us();
		scan[r] = b - a;
		stop[r] = c - a;
	}
	qsort(scan, rounds, sizeof *scan, cmp_double);
	qsort(stop, rounds, sizeof *stop, cmp_double);
	printf("{\"mb\":%llu,\"dirty_permille\":%llu,\"dirty_pages\":%zu,\"found_pages_per_round\":%.0f,"
	       "\"register_us\":%.1f,\"scan_us_median\":%.1f,\"scan_us_p99\":%.1f,"
	       "\"scan_copy_us_median\":%.1f,\"scan_copy_us_p99\":%.1f,\"rounds\":%llu}\n",
	       (unsigned long long)mb, (unsigned long long)permille, ndirty, (double)found_total / (double)rounds,
	       t_register, scan[rounds / 2], scan[rounds * 99 / 100], stop[rounds / 2], stop[rounds * 99 / 100],
	       (unsigned long long)rounds);
	return 0;
}
