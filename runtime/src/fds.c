/* fds.c - what an fd is, and whether it survives an exec.  The runtime
 * hands fds from one incarnation to the next (arenas, ranges, the manifest,
 * the supervisor's socket and control block) and must never take an app's
 * fd for one of its own: an fd is checked by the file it refers to (device
 * and inode, from fstat), or by its memfd name where no file id is known
 * yet.  All but rk_fd_is_memfd are async-signal-safe: the restart uses
 * them. */
#include "rk_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool rk_fd_is_memfd(int fd, const char *want, bool exact)
{
	char link[64], target[128];
	size_t wn = strlen(want);
	snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, target, sizeof target - 1);
	if (n < (ssize_t)wn)
		return false;
	target[n] = 0;
	/* a memfd's link is "/memfd:NAME (deleted)" */
	return strncmp(target, want, wn) == 0 && (!exact || target[wn] == 0 || target[wn] == ' ');
}

bool rk_fd_is_shmem(int fd)
{
	return fcntl(fd, F_GET_SEALS) >= 0;
}

void rk_fd_file_id(int fd, uint64_t *dev, uint64_t *ino)
{
	struct stat st;
	bool ok = fstat(fd, &st) == 0;
	*dev = ok ? (uint64_t)st.st_dev : 0;
	*ino = ok ? (uint64_t)st.st_ino : 0;
}

bool rk_fd_is_file(int fd, uint64_t dev, uint64_t ino)
{
	uint64_t d, i;
	rk_fd_file_id(fd, &d, &i);
	return i != 0 && d == dev && i == ino;
}

void rk_fd_set_cloexec(int fd, bool on)
{
	int fl = fcntl(fd, F_GETFD);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFD, on ? (fl | FD_CLOEXEC) : (fl & ~FD_CLOEXEC));
}

/* Public: the sockets of socket activation (systemd, `rekindle run
 * --listen`) are fds 3.. when LISTEN_PID names this process; the count was
 * parsed from LISTEN_FDS at rk_init (options.c).  An in-place restart keeps
 * the pid, so they stay ours. */
int rk_listen_fds(void)
{
	const char *lp = getenv("LISTEN_PID");
	char *end;
	if (!lp || *lp < '0' || *lp > '9')
		return 0;
	unsigned long pid = strtoul(lp, &end, 10);
	if (*end || pid != (unsigned long)getpid())
		return 0;
	return (int)rk_cfg.listen_fds;
}
