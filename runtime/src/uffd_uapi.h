/* uffd_uapi.h - the userfaultfd and PAGEMAP_SCAN definitions of Linux 6.7+
 * that Debian 12's kernel headers (6.1) lack: async write-protect
 * (UFFD_FEATURE_WP_ASYNC) and the pagemap scan that reports written pages
 * and write-protects them again in one call.  Values from the kernel's uapi
 * (include/uapi/linux/userfaultfd.h and fs.h); a newer header wins. */
#ifndef RK_UFFD_UAPI_H
#define RK_UFFD_UAPI_H

#include <linux/userfaultfd.h>
#include <stdint.h>
#include <sys/ioctl.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

#ifndef PAGEMAP_SCAN
struct page_region {
	uint64_t start, end, categories;
};
struct pm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PM_SCAN_WP_MATCHING (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)
#define PAGE_IS_WRITTEN (1 << 1)
#endif
#ifndef PAGE_IS_HUGE
#define PAGE_IS_HUGE (1 << 6)
#endif

#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* A userfaultfd (O_CLOEXEC | O_NONBLOCK | extra, extra: 0 or
 * UFFD_USER_MODE_ONLY) with the API handshake done for `features`; -errno.
 * vm.unprivileged_userfaultfd=0 without CAP_SYS_PTRACE: through the device. */
static inline int rk_uffd_open(int extra, uint64_t features)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | extra);
	if (fd < 0) {
		int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
		if (dev < 0)
			return -errno;
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK | extra);
		int e = errno;
		close(dev);
		if (fd < 0)
			return -e;
	}
	struct uffdio_api api = {.api = UFFD_API, .features = features};
	if (ioctl(fd, UFFDIO_API, &api) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

#endif
