/* ranges.c - rk_preserve_range: memory the application manages itself,
 * moved in place onto a memfd so that it survives restarts with no copy. */
#include "rk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct rk_range rk_ranges[RK_MAX_RANGES];
unsigned rk_nranges;


int rk_preserve_range(void *addr, size_t len)
{
	uint64_t a = (uint64_t)(uintptr_t)addr;
	if (!rk_g.initialized)
		return -EPERM;
	if (!addr || len == 0 || (a % RK_PAGE) || (len % RK_PAGE) || a + len < a)
		return -EINVAL;
	for (unsigned i = 0; i < rk_nranges; i++) {
		const struct rk_range *r = &rk_ranges[i];
		if (r->addr == a && r->len == len)
			return 1; /* inherited (warm restart) or already preserved */
		if (a < r->addr + r->len && r->addr < a + len)
			return -EEXIST;
	}
	if (a < rk_g.reserve_base + rk_g.reserve_len && rk_g.reserve_base < a + len)
		return -EEXIST; /* inside the arena reservation */
	if (rk_nranges == RK_MAX_RANGES)
		return -ENOSPC;
	char name[64];
	snprintf(name, sizeof name, "rekindle:range:%llx", (unsigned long long)a);
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	/* a range never changes size: the supervisor's snapshot engine reads a
	 * memfd that cannot shrink through a mapping of its own */
	if (ftruncate(fd, (off_t)len) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	/* Copy the current contents once, then map the memfd over them. */
	size_t done = 0;
	while (done < len) {
		ssize_t w = pwrite(fd, (char *)addr + done, len - done, (off_t)done);
		if (w <= 0) {
			int e = w < 0 ? -errno : -EIO;
			close(fd);
			return e;
		}
		done += (size_t)w;
	}
	if (mmap(addr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
		int e = -errno;
		close(fd);
		return e;
	}
	rk_ranges[rk_nranges].fd = fd;
	rk_fd_file_id(fd, &rk_ranges[rk_nranges].dev, &rk_ranges[rk_nranges].ino);
	rk_ranges[rk_nranges].addr = a;
	rk_ranges[rk_nranges].len = len;
	rk_nranges++;
	rk_manifest_sync();
	return 0;
}
