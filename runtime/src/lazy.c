/* lazy.c - the app's side of a lazy restore (docs/snapshots.md, "Lazy
 * restore").
 *
 * When the supervisor restores a snapshot lazily, the arenas' memfds it
 * hands over are empty: their pages come in on demand.  Before anything
 * touches an arena, the runtime registers every arena mapping with a
 * userfaultfd in MISSING mode and hands that fd to the supervisor (LAZY),
 * which reads each faulting page from the store and installs it
 * (UFFDIO_COPY) while it fills in the rest in the background.  The app's
 * threads run no code for it: a first touch of a page waits in the kernel
 * for the supervisor.  Kernel accesses (read(2) into an arena) fault the
 * same way, so the userfaultfd is not user-mode-only, and forks are
 * followed (UFFD_FEATURE_EVENT_FORK): a child's first touch of a shared
 * page must wait for the real page too, never map a zero one.
 *
 * The runtime keeps its copy of the fd for the rest of the incarnation:
 * should the supervisor die mid-restore, a first touch then waits rather
 * than maps a zero page (closing the last copy would unregister the
 * ranges).  Once every page is in, the supervisor unregisters the ranges
 * itself (UFFDIO_UNREGISTER works on the fd's address space from any
 * process) and clears lazy_pages in the control block; an in-place warm
 * restart waits for that (rk_lazy_pending): a new address space would map
 * the memfds without the registration. */
#include "rk_internal.h"
#include "uffd_uapi.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int lazy_uffd = -1;


static int register_missing(int fd, uint64_t addr, uint64_t len)
{
	struct uffdio_register reg = {.range = {addr, len}, .mode = UFFDIO_REGISTER_MODE_MISSING};
	return ioctl(fd, UFFDIO_REGISTER, &reg) < 0 ? -errno : 0;
}

int rk_lazy_begin(char *why, size_t wl)
{
	struct rk_lazy_region regs[RK_MAX_ARENAS];
	unsigned n = 0;
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		const struct rk_arena *a = &rk_g.arenas[i];
		if (!a->hdr)
			continue;
		memset(&regs[n], 0, sizeof regs[n]);
		rk_strlcpy(regs[n].name, a->name, sizeof regs[n].name);
		regs[n].addr = (uint64_t)(uintptr_t)a->hdr;
		regs[n].len = a->hdr_max;
		n++;
	}
	/* kernel faults too (not user-mode-only): the syscall needs the
	 * privilege (vm.unprivileged_userfaultfd=0), /dev/userfaultfd its mode */
	int fd = rk_uffd_open(0, UFFD_FEATURE_EVENT_FORK);
	int err = fd < 0 ? -fd : 0;
	for (unsigned i = 0; i < n && !err; i++)
		err = -register_missing(fd, regs[i].addr, regs[i].len);
	if (err && fd >= 0) {
		close(fd); /* closing unregisters what was registered */
		fd = -1;
	}
	int r = rk_sup_lazy(fd, regs, n, err, why, wl);
	if (r < 0) {
		if (fd >= 0)
			close(fd);
		return r;
	}
	struct rk_ev e;
	rk_ev_begin(&e, "lazy_restore");
	rk_ev_u64(&e, "arenas", n);
	if (err) {
		rk_ev_str(&e, "mode", "eager");
		rk_ev_str(&e, "why", "no userfaultfd for kernel faults (privilege or kernel): the supervisor read every page first");
		rk_ev_i64(&e, "errno", err);
	} else {
		rk_ev_str(&e, "mode", "lazy");
	}
	rk_ev_end(&e);
	lazy_uffd = fd;
	return 0;
}

bool rk_lazy_pending(void)
{
	return rk_ctl && atomic_load_explicit(&rk_ctl->lazy_pages, memory_order_acquire) != 0;
}
