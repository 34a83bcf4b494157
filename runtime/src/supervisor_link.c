/* supervisor_link.c - the runtime's side of `rekindle run`: the messages on
 * the socket pair from $REKINDLE_SUPERVISOR_FD (docs/supervisor-protocol.md).
 * The runtime hands the supervisor its preserved fds (SCM_RIGHTS) so they
 * outlive any death of the process, says when an incarnation is up, ready
 * or restarting in place, and, when the supervisor spawned it after a death,
 * asks what it inherits.  Every send is non-blocking: a stuck or dead
 * supervisor never stops the app (it is logged once and then ignored). */
#include "rk_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MSG_MAGIC 0x4d534b52u /* "RKSM" */
#define MSG_VERSION 2u /* 2: decision codes in HELLO, RESTARTING and INHERIT */
#define MSG_MAX 4096u
#define ATTACH_TIMEOUT_MS 10000

enum msg_type {
	MSG_ATTACH = 1,
	MSG_HELLO = 2,
	MSG_FDS = 3,
	MSG_RESTARTING = 4,
	MSG_READY = 5,
	MSG_RESTART_FAILED = 6,
	MSG_LAZY = 7,
	MSG_INHERIT = 101,
	MSG_LAZY_REPLY = 102,
	MSG_ERROR = 199,
};

struct msg_hdr {
	uint32_t magic;
	uint16_t version, type;
	uint32_t len, reserved;
};

struct msg_attach {
	uint32_t pid;
	uint32_t caps; /* RK_ATTACH_CAP_*: what this runtime can do */
};

struct msg_hello {
	uint32_t pid, generation, kind, narenas;
	uint64_t restart_ns, preserved_bytes;
	char reason[128];
	char decision[160];
	uint32_t decision_code, reserved; /* enum rk_reason */
};

struct msg_fds_entry {
	uint32_t kind, reserved; /* 0 manifest, 1 arena, 2 range */
	char name[48];
};

struct msg_restarting {
	uint32_t mode;
	int32_t signal;
	uint32_t generation, decision_code;
	uint64_t t_ns, fault_addr;
	char reason[128];
	char decision[160];
};

struct msg_inherit {
	uint32_t mode, generation;
	int32_t signal;
	uint32_t dropped; /* arenas of the manifest deliberately not handed over */
	uint64_t t_detect_ns;
	char reason[128];
	char decision[160];
	uint32_t decision_code;
	uint32_t flags; /* RK_INHERIT_* */
};

_Static_assert(sizeof(struct msg_hdr) == 16, "protocol layout");
_Static_assert(sizeof(struct msg_hello) == 328, "protocol layout");
_Static_assert(sizeof(struct msg_fds_entry) == 56, "protocol layout");
_Static_assert(sizeof(struct msg_restarting) == 320, "protocol layout");
_Static_assert(sizeof(struct msg_inherit) == 320, "protocol layout");

#define MAX_FDS (1 + 2 * RK_MAX_ARENAS)

static int sup_fd = -1;
static _Atomic int sup_lost; /* a send failed for good: stop trying */

bool rk_sup_active(void)
{
	return sup_fd >= 0 && !atomic_load(&sup_lost);
}

int rk_sup_fd(void)
{
	return sup_fd;
}

void rk_sup_forget(void)
{
	if (sup_fd >= 0)
		close(sup_fd); /* our copy only: the app's stays open */
	sup_fd = -1;
}

static void log_lost(const char *what, int err)
{
	if (atomic_exchange(&sup_lost, 1))
		return;
	struct rk_ev e;
	rk_ev_begin(&e, "warning");
	rk_ev_str(&e, "what", "lost the supervisor; running on unsupervised");
	rk_ev_str(&e, "during", what);
	rk_ev_i64(&e, "errno", err);
	rk_ev_end(&e);
}

int rk_sup_open(void)
{
	const char *v = getenv("REKINDLE_SUPERVISOR_FD");
	if (!v)
		return 0;
	char *end;
	long fd = strtol(v, &end, 10);
	int type = 0;
	socklen_t tl = sizeof type;
	unsetenv("REKINDLE_SUPERVISOR_FD"); /* restart.c re-adds it from its copy */
	if (*end || fd < 3 || fd > INT_MAX || getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 ||
	    type != SOCK_SEQPACKET) {
		struct rk_ev e;
		rk_ev_begin(&e, "warning");
		rk_ev_str(&e, "what", "REKINDLE_SUPERVISOR_FD is not a seqpacket socket; running unsupervised");
		rk_ev_str(&e, "value", v);
		rk_ev_end(&e);
		return -EINVAL;
	}
	(void)fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* kept across our own restarts only */
	sup_fd = (int)fd;
	return 1;
}

/* One message, optionally with fds; never blocks.  Async-signal-safe. */
static int send_msg(uint16_t type, const void *payload, uint32_t len, const int *fds, unsigned nfds)
{
	if (!rk_sup_active())
		return -ENOTCONN;
	struct msg_hdr h = {.magic = MSG_MAGIC, .version = MSG_VERSION, .type = type, .len = len};
	struct iovec iov[2] = {{&h, sizeof h}, {(void *)payload, len}};
	union {
		char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
	if (nfds) {
		memset(&ctl, 0, sizeof ctl);
		mh.msg_control = ctl.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	ssize_t n;
	do
		n = sendmsg(sup_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		int e = errno;
		if (e != EAGAIN)
			log_lost("send", e);
		return -e;
	}
	return 0;
}

void rk_sup_hello(void)
{
	if (!rk_sup_active())
		return;
	const struct rk_restart_info *in = &rk_g.info;
	struct msg_hello m;
	memset(&m, 0, sizeof m);
	m.pid = (uint32_t)getpid();
	m.generation = in->generation;
	m.kind = in->kind;
	m.narenas = rk_g.narenas;
	m.restart_ns = in->restart_ns;
	m.preserved_bytes = in->preserved_bytes;
	rk_strlcpy(m.reason, in->reason, sizeof m.reason);
	rk_strlcpy(m.decision, in->decision, sizeof m.decision);
	m.decision_code = (uint32_t)in->decision_code;
	(void)send_msg(MSG_HELLO, &m, sizeof m, NULL, 0);
}

int rk_sup_send_fds(void)
{
	if (!rk_sup_active() || !rk_g.manifest)
		return 0;
	struct {
		uint32_t count, reserved;
		struct msg_fds_entry e[MAX_FDS];
	} m;
	int fds[MAX_FDS];
	unsigned n = 0;
	memset(&m, 0, sizeof m);
	m.e[n].kind = 0;
	rk_strlcpy(m.e[n].name, "manifest", sizeof m.e[n].name);
	fds[n++] = rk_g.manifest_fd;
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		if (!rk_g.arenas[i].hdr)
			continue;
		m.e[n].kind = 1;
		rk_strlcpy(m.e[n].name, rk_g.arenas[i].name, sizeof m.e[n].name);
		fds[n++] = rk_g.arenas[i].fd;
	}
	for (unsigned i = 0; i < rk_nranges; i++) {
		m.e[n].kind = 2;
		snprintf(m.e[n].name, sizeof m.e[n].name, "range:%llx", (unsigned long long)rk_ranges[i].addr);
		fds[n++] = rk_ranges[i].fd;
	}
	m.count = n;
	return send_msg(MSG_FDS, &m, (uint32_t)(8 + n * sizeof(struct msg_fds_entry)), fds, n);
}

/* After RESTARTING, the exec failed and we carry on: the supervisor watches
 * us again.  Async-signal-safe. */
void rk_sup_restart_failed(int err)
{
	struct {
		int32_t err;
		uint32_t generation;
	} m = {err > 0 ? err : EIO, rk_g.info.generation};
	(void)send_msg(MSG_RESTART_FAILED, &m, sizeof m, NULL, 0);
}

void rk_sup_ready(void)
{
	uint64_t t = rk_now_ns();
	(void)send_msg(MSG_READY, &t, sizeof t, NULL, 0);
}

void rk_sup_restarting(bool warm, int sig, uint64_t t_ns, uint64_t fault_addr, const char *reason,
		       const char *decision, enum rk_reason code)
{
	struct msg_restarting m;
	memset(&m, 0, sizeof m);
	m.mode = warm ? 1 : 2;
	m.signal = sig;
	m.generation = rk_g.info.generation;
	m.t_ns = t_ns;
	m.fault_addr = fault_addr;
	rk_strlcpy(m.reason, reason, sizeof m.reason);
	rk_strlcpy(m.decision, decision, sizeof m.decision);
	m.decision_code = (uint32_t)code;
	(void)send_msg(MSG_RESTARTING, &m, sizeof m, NULL, 0);
}

/* ---- ATTACH / INHERIT ------------------------------------------------------ */

static bool has_nul(const char *s, size_t cap)
{
	return memchr(s, 0, cap) != NULL;
}

static void close_fds(const int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

/* Receives one message with its fds; returns the payload length or -errno. */
static ssize_t recv_msg(struct msg_hdr *h, void *payload, size_t cap, int *fds, unsigned *nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov[2] = {{h, sizeof *h}, {payload, cap}};
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
	ssize_t n;
	do
		n = recvmsg(sup_fd, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	*nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		unsigned k = (unsigned)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (unsigned i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
			if (*nfds < MAX_FDS)
				fds[(*nfds)++] = fd;
			else
				close(fd);
		}
	}
	if (n == 0)
		return -ECONNRESET;
	if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || (size_t)n < sizeof *h) {
		close_fds(fds, *nfds);
		*nfds = 0;
		return -EPROTO;
	}
	return n - (ssize_t)sizeof *h;
}

int rk_sup_attach(struct rk_inherit *inh, char *why, size_t wl)
{
	memset(inh, 0, sizeof *inh);
	struct msg_attach a = {.pid = (uint32_t)getpid(), .caps = RK_ATTACH_CAP_LAZY};
	int r = send_msg(MSG_ATTACH, &a, sizeof a, NULL, 0);
	if (r < 0) {
		snprintf(why, wl, "cannot ask the supervisor what to inherit: %s", strerror(-r));
		return r;
	}
	struct pollfd p = {.fd = sup_fd, .events = POLLIN};
	do
		r = poll(&p, 1, ATTACH_TIMEOUT_MS);
	while (r < 0 && errno == EINTR);
	if (r <= 0) {
		snprintf(why, wl, "the supervisor did not answer ATTACH within %d ms", ATTACH_TIMEOUT_MS);
		return -ETIMEDOUT;
	}
	struct msg_hdr h;
	union {
		struct msg_inherit in;
		char error[256];
		char raw[MSG_MAX];
	} body;
	ssize_t len = recv_msg(&h, &body, sizeof body, inh->fds, &inh->nfds);
	if (len < 0) {
		snprintf(why, wl, "no INHERIT from the supervisor: %s", strerror((int)-len));
		return (int)len;
	}
	if (h.magic != MSG_MAGIC || h.version != MSG_VERSION || h.len != (uint32_t)len) {
		snprintf(why, wl, "malformed message from the supervisor (magic, version or length)");
		r = -EPROTO;
	} else if (h.type == MSG_ERROR) {
		body.error[sizeof body.error - 1] = 0;
		snprintf(why, wl, "the supervisor refused ATTACH: %.120s", body.error);
		r = -EPROTO;
	} else if (h.type != MSG_INHERIT || len != sizeof body.in || body.in.mode > 2 ||
		   !has_nul(body.in.reason, sizeof body.in.reason) ||
		   !has_nul(body.in.decision, sizeof body.in.decision) || (body.in.mode == 1) != (inh->nfds > 0)) {
		snprintf(why, wl, "unexpected reply to ATTACH (type %u, %zd bytes, %u fds)", h.type, len, inh->nfds);
		r = -EPROTO;
	} else {
		inh->mode = body.in.mode;
		inh->generation = body.in.generation;
		inh->signal = body.in.signal;
		inh->dropped = body.in.dropped;
		inh->t_detect_ns = body.in.t_detect_ns;
		rk_strlcpy(inh->reason, body.in.reason, sizeof inh->reason);
		rk_strlcpy(inh->decision, body.in.decision, sizeof inh->decision);
		inh->decision_code = body.in.decision_code < RK_REASON_COUNT ? body.in.decision_code : RK_REASON_NONE;
		inh->flags = body.in.flags;
		return 0;
	}
	close_fds(inh->fds, inh->nfds);
	inh->nfds = 0;
	return r;
}

struct msg_lazy {
	uint32_t nregions;
	int32_t err; /* 0: the fd came with it; else why not (errno) */
	struct rk_lazy_region regions[RK_MAX_ARENAS];
};

struct msg_lazy_reply {
	uint32_t status; /* 0: serving faults; 1: every page is in already */
	uint32_t reserved;
};

/* Waits up to ATTACH_TIMEOUT_MS for one message of type want and len bytes. */
static int recv_reply(uint16_t want, void *body, size_t len, const char *what, char *why, size_t wl)
{
	struct pollfd p = {.fd = sup_fd, .events = POLLIN};
	int r;
	do
		r = poll(&p, 1, ATTACH_TIMEOUT_MS);
	while (r < 0 && errno == EINTR);
	if (r <= 0) {
		snprintf(why, wl, "the supervisor did not answer %s within %d ms", what, ATTACH_TIMEOUT_MS);
		return -ETIMEDOUT;
	}
	struct msg_hdr h;
	char raw[MSG_MAX];
	int fds[MAX_FDS];
	unsigned nfds = 0;
	ssize_t n = recv_msg(&h, raw, sizeof raw, fds, &nfds);
	close_fds(fds, nfds);
	if (n < 0) {
		snprintf(why, wl, "no answer to %s from the supervisor: %s", what, strerror((int)-n));
		return (int)n;
	}
	if (h.magic != MSG_MAGIC || h.version != MSG_VERSION || h.len != (uint32_t)n || h.type != want ||
	    (size_t)n != len || nfds) {
		snprintf(why, wl, "unexpected answer to %s (type %u, %zd bytes, %u fds)", what, h.type, n, nfds);
		return -EPROTO;
	}
	memcpy(body, raw, len);
	return 0;
}

int rk_sup_lazy(int uffd, const struct rk_lazy_region *regions, unsigned n, int err, char *why, size_t wl)
{
	struct msg_lazy m;
	memset(&m, 0, sizeof m);
	m.nregions = n;
	m.err = err;
	memcpy(m.regions, regions, n * sizeof regions[0]);
	uint32_t len = (uint32_t)(offsetof(struct msg_lazy, regions) + n * sizeof regions[0]);
	int r = send_msg(MSG_LAZY, &m, len, uffd >= 0 ? &uffd : NULL, uffd >= 0 ? 1 : 0);
	if (r < 0) {
		snprintf(why, wl, "cannot hand the lazy restore's userfaultfd to the supervisor: %s", strerror(-r));
		return r;
	}
	struct msg_lazy_reply rep;
	r = recv_reply(MSG_LAZY_REPLY, &rep, sizeof rep, "LAZY", why, wl);
	if (r == 0 && rep.status > 1) {
		snprintf(why, wl, "the supervisor answered LAZY with status %u", rep.status);
		r = -EPROTO;
	}
	return r;
}
