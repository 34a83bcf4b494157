/* crosscheck.c - cross-check validation after a warm restart.
 *
 * The serving incarnation keeps using the preserved arena (S_i) while a
 * forked validator runs the app's default recovery into a scratch arena
 * (S_r) and compares.  The validator must see S_i as it was at the start,
 * without a copy of the whole arena on the serving path:
 *
 *   1. the arena's used range is registered with userfaultfd and
 *      write-protected (shmem pte markers: no page is touched);
 *   2. fork; the validator maps the arena's memfd MAP_PRIVATE at the same
 *      address, so every page it has not copied reads the page cache;
 *   3. the first write of the serving process to a page faults to our
 *      thread, which writes the page's still unchanged contents into the
 *      validator's private mapping (process_vm_writev: the validator gets
 *      its own copy), then lifts the protection of that page and wakes
 *      the writer.
 *
 * So each page written during validation costs one fault and one 4 KiB
 * copy, once; pages not written cost nothing.  While a check runs, freed
 * pages are not punched out of the memfd (the validator still reads them).
 * A mismatch ends in a hot switch: a warm restart in which the checked
 * arena is replaced by the scratch arena holding S_r. */
#include "rk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

struct cc_result {
	int32_t verdict; /* enum rk_crosscheck_state: MATCH, MISMATCH or FAILED */
	uint32_t pad_;
	uint64_t recover_ns, compare_ns;
	char why[160];
};

static struct {
	_Atomic int state;
	struct rk_crosscheck def;
	struct rk_arena *arena;
	int uffd, result_fd;
	pid_t child;
	uint64_t wp_start, wp_len;
	uint8_t *copied; /* a bit per page of the protected range */
	uint64_t t_start, pages_copied, copy_ns;
	int scratch_fd;
	uint64_t scratch_base, scratch_max;
} cc = {.uffd = -1, .result_fd = -1, .scratch_fd = -1};

enum rk_crosscheck_state rk_crosscheck_state(void)
{
	return (enum rk_crosscheck_state)atomic_load(&cc.state);
}

static void cc_event(const char *result, const char *why)
{
	struct rk_ev e;
	rk_ev_begin(&e, "crosscheck");
	rk_ev_str(&e, "result", result);
	rk_ev_str(&e, "arena", cc.arena ? cc.arena->name : "?");
	if (why && *why)
		rk_ev_str(&e, "why", why);
	rk_ev_end(&e);
}

/* ---- userfaultfd write protection ------------------------------------------ */

static int uffd_open(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0 && errno == EPERM) {
		/* unprivileged: user-mode faults only; a syscall writing into the
		 * arena during validation would fail with EFAULT */
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
		if (fd >= 0) {
			struct rk_ev e;
			rk_ev_begin(&e, "warning");
			rk_ev_str(&e, "what", "cross-check: userfaultfd limited to user-mode faults (no CAP_SYS_PTRACE); "
					      "syscalls that write into the arena fail while a check runs");
			rk_ev_end(&e);
		}
	}
	if (fd < 0)
		return -errno;
	struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_WP_HUGETLBFS_SHMEM};
	if (ioctl(fd, UFFDIO_API, &api) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

static int uffd_protect(uint64_t start, uint64_t len, bool on)
{
	struct uffdio_writeprotect wp = {.range = {.start = start, .len = len},
					 .mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0};
	return ioctl(cc.uffd, UFFDIO_WRITEPROTECT, &wp) < 0 ? -errno : 0;
}

static int uffd_arm(void)
{
	struct uffdio_register reg = {.range = {.start = cc.wp_start, .len = cc.wp_len},
				      .mode = UFFDIO_REGISTER_MODE_WP};
	if (ioctl(cc.uffd, UFFDIO_REGISTER, &reg) < 0)
		return -errno;
	return uffd_protect(cc.wp_start, cc.wp_len, true);
}

static void uffd_disarm(void)
{
	if (cc.uffd < 0)
		return;
	(void)uffd_protect(cc.wp_start, cc.wp_len, false); /* wakes every blocked writer */
	struct uffdio_range r = {.start = cc.wp_start, .len = cc.wp_len};
	(void)ioctl(cc.uffd, UFFDIO_UNREGISTER, &r);
	close(cc.uffd);
	cc.uffd = -1;
}

/* The first write to a page: give the validator the old contents first. */
static void page_preserve_then_release(uint64_t addr)
{
	uint64_t page = addr & ~(RK_PAGE - 1);
	uint64_t i = (page - cc.wp_start) / RK_PAGE;
	if (page >= cc.wp_start && page < cc.wp_start + cc.wp_len && !(cc.copied[i / 8] & (1u << (i % 8)))) {
		cc.copied[i / 8] |= (uint8_t)(1u << (i % 8));
		uint64_t t0 = rk_now_ns();
		struct iovec local = {(void *)(uintptr_t)page, RK_PAGE}, remote = local;
		/* fails only if the validator is gone: then nobody reads it */
		(void)process_vm_writev(cc.child, &local, 1, &remote, 1, 0);
		cc.copy_ns += rk_now_ns() - t0;
		cc.pages_copied++;
	}
	(void)uffd_protect(page, RK_PAGE, false);
}

static void serve_faults(void)
{
	struct uffd_msg msgs[32];
	ssize_t n = read(cc.uffd, msgs, sizeof msgs);
	for (ssize_t k = 0; n > 0 && k < n / (ssize_t)sizeof msgs[0]; k++)
		if (msgs[k].event == UFFD_EVENT_PAGEFAULT)
			page_preserve_then_release(msgs[k].arg.pagefault.address);
}

/* ---- the validator (a forked child) ------------------------------------------ */

static _Noreturn void validator_exit(int wr, struct cc_result *res)
{
	ssize_t w = write(wr, res, sizeof *res);
	_exit(w == (ssize_t)sizeof *res ? 0 : 1);
}

static _Noreturn void validator_run(int wr, int ready_wr)
{
	struct cc_result res = {.verdict = RK_CC_FAILED};
	rk_validator_detach();
	(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
	struct rk_arena *a = cc.arena;
	void *view = mmap(a->hdr, a->hdr_max, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, a->fd, 0);
	char ok = view == MAP_FAILED ? 'F' : 'R';
	if (write(ready_wr, &ok, 1) != 1 || view == MAP_FAILED) {
		snprintf(res.why, sizeof res.why, "validator: cannot map a private view of the arena: %s",
			 strerror(errno));
		validator_exit(wr, &res);
	}
	close(ready_wr);
	struct rk_arena *scratch = rk_arena_create_at(a->name, cc.scratch_fd, cc.scratch_base, cc.scratch_max);
	if (!scratch) {
		snprintf(res.why, sizeof res.why, "validator: cannot create the scratch arena: %s", strerror(errno));
		validator_exit(wr, &res);
	}
	uint64_t t0 = rk_now_ns();
	void *recovered = cc.def.recover(scratch, cc.def.ctx);
	res.recover_ns = rk_now_ns() - t0;
	if (!recovered) {
		snprintf(res.why, sizeof res.why, "the default recovery failed (returned NULL)");
		validator_exit(wr, &res);
	}
	if (rk_root_set(scratch, cc.def.root, recovered) < 0) {
		snprintf(res.why, sizeof res.why, "the default recovery's root is not in the scratch arena");
		validator_exit(wr, &res);
	}
	rk_tcache_release(scratch); /* S_r may become the arena: leave it tidy */
	const void *preserved = rk_root_get(a, cc.def.root);
	t0 = rk_now_ns();
	if (!preserved) {
		res.verdict = RK_CC_MISMATCH;
		snprintf(res.why, sizeof res.why, "the preserved arena has no root %.60s", cc.def.root);
	} else if (cc.def.compare(preserved, recovered, res.why, sizeof res.why, cc.def.ctx)) {
		res.verdict = RK_CC_MATCH;
		res.why[0] = 0;
	} else {
		res.verdict = RK_CC_MISMATCH;
		if (!res.why[0])
			rk_strlcpy(res.why, "the app's comparator found a difference", sizeof res.why);
	}
	res.compare_ns = rk_now_ns() - t0;
	validator_exit(wr, &res);
}

/* ---- the serving side --------------------------------------------------------- */

static void release_resources(bool keep_scratch)
{
	uffd_disarm();
	if (cc.result_fd >= 0)
		close(cc.result_fd);
	cc.result_fd = -1;
	pid_t child = atomic_exchange(&rk_g.validator_pid, 0);
	if (child > 0)
		while (waitpid(child, NULL, 0) < 0 && errno == EINTR) /* it has written its result, or is dead */
			;
	free(cc.copied);
	cc.copied = NULL;
	atomic_store(&rk_g.no_punch, false);
	if (!keep_scratch) {
		if (cc.scratch_fd >= 0)
			close(cc.scratch_fd);
		cc.scratch_fd = -1;
		if (cc.scratch_base)
			rk_arena_unreserve(cc.scratch_base, cc.scratch_max);
		cc.scratch_base = 0;
	}
}

static void finish(const struct cc_result *res, bool have_result)
{
	struct rk_ev e;
	rk_ev_begin(&e, "crosscheck");
	const char *names[] = {"none", "running", "match", "mismatch", "failed"};
	int v = have_result && res->verdict >= RK_CC_MATCH && res->verdict <= RK_CC_FAILED ? res->verdict
											  : RK_CC_FAILED;
	rk_ev_str(&e, "result", names[v]);
	rk_ev_str(&e, "arena", cc.arena->name);
	rk_ev_str(&e, "why", have_result ? res->why : "the validator died without a verdict");
	rk_ev_u64(&e, "validation_ms", (rk_now_ns() - cc.t_start) / 1000000);
	if (have_result) {
		rk_ev_u64(&e, "recover_ms", res->recover_ns / 1000000);
		rk_ev_u64(&e, "compare_ms", res->compare_ns / 1000000);
	}
	rk_ev_u64(&e, "pages_copied", cc.pages_copied);
	rk_ev_u64(&e, "copy_us_per_page", cc.pages_copied ? cc.copy_ns / cc.pages_copied / 1000 : 0);
	rk_ev_end(&e);
	release_resources(v == RK_CC_MISMATCH);
	atomic_store(&cc.state, v);
	if (v != RK_CC_MISMATCH)
		return;
	char why[160];
	snprintf(why, sizeof why, "cross-check mismatch (%.100s): hot switch to the validated state", res->why);
	rk_g.switch_index = (int)cc.arena->index;
	rk_g.switch_fd = cc.scratch_fd;
	rk_fd_file_id(cc.scratch_fd, &rk_g.switch_dev, &rk_g.switch_ino);
	rk_g.switch_base = cc.scratch_base;
	rk_g.switch_max = cc.scratch_max;
	int r = rk_restart_hot_switch(why); /* returns only on failure */
	release_resources(false); /* the validated copy is of no use now */
	atomic_store(&cc.state, RK_CC_FAILED);
	char msg[64];
	snprintf(msg, sizeof msg, "hot switch failed: %s", strerror(-r));
	cc_event("failed", msg);
}

static void *cc_thread(void *unused)
{
	(void)unused;
	struct pollfd p[2] = {{.fd = cc.uffd, .events = POLLIN}, {.fd = cc.result_fd, .events = POLLIN}};
	for (;;) {
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[0].revents & POLLIN)
			serve_faults();
		if (p[1].revents & (POLLIN | POLLHUP | POLLERR))
			break;
	}
	struct cc_result res;
	ssize_t n = read(cc.result_fd, &res, sizeof res);
	res.why[sizeof res.why - 1] = 0;
	finish(&res, n == (ssize_t)sizeof res);
	return NULL;
}

static int check_args(rk_arena *arena, const struct rk_crosscheck *c)
{
	if (!rk_g.initialized || !arena || !arena->hdr || !c || !c->root || !c->recover || !c->compare)
		return -EINVAL;
	if (atomic_load(&cc.state) == RK_CC_RUNNING || atomic_load(&cc.state) == RK_CC_MISMATCH)
		return -EBUSY;
	return 0;
}

/* Scratch arena address and memfd, made here so the hot switch can hand
 * them on after the validator is gone. */
static int scratch_prepare(const struct rk_crosscheck *c)
{
	uint64_t max = c->scratch_bytes ? c->scratch_bytes : cc.arena->hdr->max_bytes;
	cc.scratch_max = RK_ALIGN_UP(max, 2u << 20);
	cc.scratch_base = rk_arena_reserve_slot(cc.scratch_max);
	if (!cc.scratch_base)
		return -ENOSPC;
	rk_manifest_sync(); /* the next incarnation allocates after it */
	char name[64];
	snprintf(name, sizeof name, "rekindle:%s", cc.arena->name);
	cc.scratch_fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	return cc.scratch_fd < 0 ? -errno : 0;
}

static int start_validator(void)
{
	int res_pipe[2], ready_pipe[2];
	if (pipe2(res_pipe, O_CLOEXEC) < 0)
		return -errno;
	if (pipe2(ready_pipe, O_CLOEXEC) < 0) {
		int e = -errno;
		close(res_pipe[0]);
		close(res_pipe[1]);
		return e;
	}
	pid_t pid = fork();
	if (pid == 0) {
		close(res_pipe[0]);
		close(ready_pipe[0]);
		validator_run(res_pipe[1], ready_pipe[1]);
	}
	int e = pid < 0 ? -errno : 0;
	close(res_pipe[1]);
	close(ready_pipe[1]);
	char ok = 0;
	struct pollfd p = {.fd = ready_pipe[0], .events = POLLIN};
	if (e == 0 && (poll(&p, 1, 10000) != 1 || read(ready_pipe[0], &ok, 1) != 1 || ok != 'R'))
		e = -ECHILD;
	close(ready_pipe[0]);
	cc.result_fd = res_pipe[0];
	if (pid > 0) {
		cc.child = pid;
		atomic_store(&rk_g.validator_pid, pid);
	}
	return e;
}

int rk_crosscheck_start(rk_arena *arena, const struct rk_crosscheck *c)
{
	int r = check_args(arena, c);
	if (r < 0)
		return r;
	cc.arena = arena;
	if (rk_g.info.kind != RK_START_WARM || !arena->inherited) {
		cc_event("skipped", "not a warm start: the state comes from the app's own recovery");
		return 0;
	}
	if (rk_g.validated) {
		cc_event("skipped", "the state is the one a cross-check validated (hot switch)");
		return 0;
	}
	cc.def = *c;
	cc.t_start = rk_now_ns();
	cc.pages_copied = cc.copy_ns = 0;
	cc.wp_start = arena->hdr->base;
	cc.wp_len = RK_ALIGN_UP(arena->hdr->heap_offset + arena->hdr->top, RK_PAGE);
	cc.copied = calloc(cc.wp_len / RK_PAGE / 8 + 1, 1);
	if (!cc.copied)
		return -ENOMEM;
	atomic_store(&rk_g.no_punch, true);
	r = scratch_prepare(c);
	if (r == 0)
		r = (cc.uffd = uffd_open()) < 0 ? cc.uffd : uffd_arm();
	if (r == 0)
		r = start_validator();
	pthread_t t;
	if (r == 0) {
		atomic_store(&cc.state, RK_CC_RUNNING);
		r = -pthread_create(&t, NULL, cc_thread, NULL);
	}
	if (r < 0) {
		pid_t child = atomic_load(&rk_g.validator_pid);
		if (child > 0)
			kill(child, SIGKILL);
		release_resources(false);
		atomic_store(&cc.state, RK_CC_FAILED);
		char msg[96];
		snprintf(msg, sizeof msg, "cannot start the cross-check: %s", strerror(-r));
		cc_event("failed", msg);
		return r;
	}
	pthread_detach(t);
	struct rk_ev e;
	rk_ev_begin(&e, "crosscheck");
	rk_ev_str(&e, "result", "started");
	rk_ev_str(&e, "arena", arena->name);
	rk_ev_u64(&e, "validator_pid", (uint64_t)cc.child);
	rk_ev_u64(&e, "protected_bytes", cc.wp_len);
	rk_ev_u64(&e, "setup_us", (rk_now_ns() - cc.t_start) / 1000);
	rk_ev_end(&e);
	return 0;
}
