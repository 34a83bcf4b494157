/* snapshot_agent.c - the app's side of durable snapshots (rk_internal.h,
 * "snapshot_agent.c"; docs/snapshots.md).
 *
 * One thread, started by rk_init when the supervisor passed
 * $REKINDLE_SNAPSHOT_FD.  It registers every preserved mapping (arenas and
 * preserved ranges) with a userfaultfd in async write-protect mode: the
 * kernel resolves each first write to a protected page by itself, and only
 * remembers it, so the app's threads never wait for us.  On the supervisor's
 * SCAN, PAGEMAP_SCAN lists the pages written since the last report and
 * protects them again in the same call; the runs go into the shared buffer.
 * A SCAN with `cut` first freezes the app at a consistent point (no unsafe
 * region and no allocator section open, exactly what a warm restart waits
 * for), and holds it there until the supervisor has copied the pages of that
 * last report and says RELEASE: those pages hold the state of the cut, and
 * every page reported earlier, unwritten since, holds it too.  The statics
 * (RK_PRESERVED) are saved into a copy of the manifest during the cut.
 *
 * The thread holds no lock the app takes; while it holds a cut, the
 * restart machinery (rk_restarting) is its own, so a fault in the meantime
 * waits for the cut to end (bounded by STOP_MAX_MS) rather than restarting
 * onto a half-copied snapshot. */
#include "rk_internal.h"
#include "uffd_uapi.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MSG_MAGIC 0x4d534b52u /* "RKSM", the framing of supervisor_link.c */
#define MSG_VERSION 2u
#define MSG_MAX 4096u
/* The longest the app stays frozen for one cut whatever the supervisor
 * does: past it the agent thaws and the snapshot is abandoned. */
#define STOP_MAX_MS 10000

/* The messages (enum rk_snap_msg, struct rk_snap_*) are in rk_internal.h. */
struct msg_hdr {
	uint32_t magic;
	uint16_t version, type;
	uint32_t len, reserved;
};


/* A mapping registered with our userfaultfd, and what it was.  from_map:
 * registered when rk_init mapped it (a restore) and not reported yet. */
struct tracked {
	uint64_t addr, len, ino;
	bool from_map;
};

/* How much of a region's mapping to scan: the pages below its memfd's
 * size (a page above it cannot be written: SIGBUS).  A scan costs time for
 * every page of the range, mapped or not (some 4 ns a page here: 16 ms for
 * an arena reserved at 16 GiB), so an arena's reservation is not scanned. */
static uint64_t scan_len[RK_SNAP_MAX_REGIONS];

static uint64_t used_len(int fd, uint64_t len)
{
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0 || st.st_size < 0)
		return len; /* unknown: all of it */
	uint64_t n = RK_ALIGN_UP((uint64_t)st.st_size, RK_PAGE);
	return n < len ? n : len;
}

static struct {
	int sock, uffd, pagemap, buf_fd;
	int durable_efd, request_efd; /* rk_durable_fd(), rk_checkpoint() */
	struct rk_snap_buf *buf;
	size_t buf_size;
	struct tracked tracked[RK_SNAP_MAX_REGIONS];
	unsigned ntracked;
	bool frozen; /* holds rk_restarting and both freezes */
	/* the manifest (statics saved) of the last cut released, for PROBE;
	 * last_cut_len 0: none */
	void *last_cut;
	uint32_t last_cut_len, last_cut_cap;
} ag = {.sock = -1, .uffd = -1, .pagemap = -1, .buf_fd = -1, .durable_efd = -1, .request_efd = -1};

/* Published once the buffer is mapped: the allocator's punches look here. */
static struct rk_snap_buf *_Atomic punch_buf;

/* Tracking from the mapping on (rk_snapshot_track_from_map): the holes
 * punched before the buffer exists, handed to it at the start; too many,
 * and the first report does not claim TRACKED_FROM_MAP. */
#define EARLY_PUNCH_CAP 256u
static struct {
	bool on, failed;
	bool overflow;
	unsigned n;
	struct rk_snap_punch punch[EARLY_PUNCH_CAP];
} early;

static struct rk_snap_region *buf_regions(void)
{
	return (struct rk_snap_region *)((char *)ag.buf + ag.buf->regions_off);
}
static struct page_region *buf_vec(void)
{
	return (struct page_region *)((char *)ag.buf + ag.buf->vec_off);
}
static struct rk_snap_punch *buf_punches(struct rk_snap_buf *b)
{
	return (struct rk_snap_punch *)((char *)b + b->punch_off);
}
static struct rk_manifest *buf_manifest(void)
{
	return (struct rk_manifest *)((char *)ag.buf + ag.buf->manifest_off);
}

/* ---- messages -------------------------------------------------------- */

static int send_msg_fds(uint16_t type, const void *payload, uint32_t len, const int *fds, unsigned nfds);

static int send_msg(uint16_t type, const void *payload, uint32_t len, int fd)
{
	return send_msg_fds(type, payload, len, &fd, fd >= 0 ? 1 : 0);
}

static int send_msg_fds(uint16_t type, const void *payload, uint32_t len, const int *fds, unsigned nfds)
{
	char buf[sizeof(struct msg_hdr) + 64];
	struct msg_hdr h = {.magic = MSG_MAGIC, .version = MSG_VERSION, .type = type, .len = len};
	memcpy(buf, &h, sizeof h);
	memcpy(buf + sizeof h, payload, len);
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof h + len};
	union {
		char space[CMSG_SPACE(RK_SNAP_HELLO_FDS * sizeof(int))];
		struct cmsghdr align;
	} cm;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (nfds > RK_SNAP_HELLO_FDS)
		return -EINVAL;
	if (nfds) {
		memset(&cm, 0, sizeof cm);
		mh.msg_control = cm.space;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
	}
	ssize_t n;
	do
		n = sendmsg(ag.sock, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : 0;
}

/* The next message of type want (or of any type if want is 0) with this
 * seq, waiting up to timeout_ms (-1: forever).  Other messages are stale
 * (an earlier report's CONTINUE or RELEASE) and dropped.  Returns its
 * type, 0 on timeout, -errno when the socket is gone. */
static int recv_msg(void *payload, uint32_t cap, int timeout_ms)
{
	char buf[MSG_MAX];
	for (;;) {
		if (timeout_ms >= 0) {
			struct pollfd p = {.fd = ag.sock, .events = POLLIN};
			int r = poll(&p, 1, timeout_ms);
			if (r == 0)
				return 0;
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				return -errno;
		}
		ssize_t n = recv(ag.sock, buf, sizeof buf, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EPIPE;
		struct msg_hdr h;
		if ((size_t)n < sizeof h)
			continue;
		memcpy(&h, buf, sizeof h);
		if (h.magic != MSG_MAGIC || h.version != MSG_VERSION || h.len != (size_t)n - sizeof h || h.len > cap)
			continue; /* malformed: the supervisor never sends those */
		memcpy(payload, buf + sizeof h, h.len);
		return h.type;
	}
}

/* ---- the cut ------------------------------------------------------------ */

static void restarting_release(void)
{
	atomic_store(&rk_restarting, 0);
	(void)syscall(SYS_futex, &rk_restarting, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void thaw(void)
{
	rk_allocator_thaw();
	rk_unsafe_thaw();
	restarting_release();
	ag.frozen = false;
}

/* Holds the app at a point with no unsafe region and no allocator section
 * open (the order of a warm restart's freeze); RK_SNAP_OK or why not. */
static enum rk_snap_status freeze(uint32_t timeout_ms)
{
	int self = (int)syscall(SYS_gettid), none = 0;
	if (!atomic_compare_exchange_strong(&rk_restarting, &none, self))
		return RK_SNAP_RESTARTING;
	uint64_t t = (uint64_t)timeout_ms * 1000000ull;
	bool drained = rk_unsafe_freeze(t);
	if (drained)
		drained = rk_allocator_freeze(t) == 0;
	if (drained) /* a thread counted into an allocator section just before it froze */
		drained = rk_unsafe_freeze(t);
	ag.frozen = true;
	if (!drained) {
		thaw();
		return RK_SNAP_REGION_OPEN;
	}
	return RK_SNAP_OK;
}

/* ---- what is preserved, and tracking it --------------------------------- */

/* A consistent copy of this incarnation's manifest into the buffer (the
 * app may be rewriting it: copy, then check busy and the checksum). */
static enum rk_snap_status manifest_copy(void)
{
	const struct rk_manifest *m = rk_g.manifest;
	if (!m || rk_g.manifest_size > ag.buf->manifest_cap)
		return RK_SNAP_BAD_REQUEST;
	struct rk_manifest *c = buf_manifest();
	for (int tries = 0; tries < 100; tries++) {
		if (rk_g.manifest_busy) {
			sched_yield();
			continue;
		}
		atomic_thread_fence(memory_order_acquire);
		memcpy(c, m, rk_g.manifest_size);
		atomic_thread_fence(memory_order_acquire);
		if (!rk_g.manifest_busy && c->narenas <= RK_MAX_ARENAS && c->nranges <= RK_MAX_RANGES &&
		    c->nstatics <= RK_MAX_STATICS && c->checksum == rk_manifest_checksum(c)) {
			ag.buf->manifest_len = (uint32_t)rk_g.manifest_size;
			return RK_SNAP_OK;
		}
	}
	return RK_SNAP_LAYOUT_CHANGING;
}

static const struct tracked *find_tracked(uint64_t addr, uint64_t len, uint64_t ino)
{
	for (unsigned i = 0; i < ag.ntracked; i++)
		if (ag.tracked[i].addr == addr && ag.tracked[i].len == len && ag.tracked[i].ino == ino)
			return &ag.tracked[i];
	return NULL;
}

/* A write to a 2 MiB range mapped by one huge page (rk_arena_hugepages
 * collapsed it before tracking began) is reported as 512 written pages, so
 * every snapshot would copy the whole range for one store.  A tracked arena
 * stays in small pages: no new huge mapping (MADV_NOHUGEPAGE: the kernel then
 * maps even a huge page cache folio with 4 KiB entries), and the ranges
 * mapped huge now are unmapped, so the next touch maps them small.  The
 * arena is a shared mapping of its memfd: unmapping loses nothing.  Returns
 * the bytes split, or -errno. */
static int64_t arena_split_huge(uint64_t addr, uint64_t len, uint64_t used)
{
	if (madvise((void *)(uintptr_t)addr, len, MADV_NOHUGEPAGE) < 0)
		return -errno;
	struct page_region huge[32];
	int64_t split = 0;
	for (uint64_t from = addr; from < addr + used;) {
		struct pm_scan_arg arg = {.size = sizeof arg,
					  .start = from,
					  .end = addr + used,
					  .vec = (uint64_t)(uintptr_t)huge,
					  .vec_len = sizeof huge / sizeof huge[0],
					  .category_mask = PAGE_IS_HUGE,
					  .return_mask = PAGE_IS_HUGE};
		int n = ioctl(ag.pagemap, PAGEMAP_SCAN, &arg);
		if (n < 0)
			return -errno;
		for (int i = 0; i < n; i++) {
			if (madvise((void *)(uintptr_t)huge[i].start, huge[i].end - huge[i].start, MADV_DONTNEED) < 0)
				return -errno;
			split += (int64_t)(huge[i].end - huge[i].start);
		}
		if (arg.walk_end <= from)
			break; /* no progress: the kernel walked nothing */
		from = arg.walk_end;
	}
	return split;
}

/* arena_split_huge for a region about to be tracked; an event says what it
 * split.  0 or -errno. */
static int arena_small_pages(const struct rk_snap_region *r, uint64_t used)
{
	int64_t split = arena_split_huge(r->addr, r->len, used);
	if (split <= 0)
		return (int)split;
	struct rk_ev e;
	rk_ev_begin(&e, "hugepages_split");
	rk_ev_str(&e, "arena", r->name);
	rk_ev_u64(&e, "bytes", (uint64_t)split);
	rk_ev_str(&e, "why", "tracked by snapshots: a huge page is reported written whole");
	rk_ev_end(&e);
	return 0;
}

/* Registers [addr, addr + len) for async write-protect and protects what is
 * mapped now (a scan that reports nothing): from here on, writes are seen.
 * Unmapped pages need no marker: a write maps them unprotected, and a scan
 * reports them. */
static int track(uint64_t addr, uint64_t len, uint64_t used)
{
	struct uffdio_register reg = {.range = {addr, len}, .mode = UFFDIO_REGISTER_MODE_WP};
	if (ioctl(ag.uffd, UFFDIO_REGISTER, &reg) < 0)
		return -errno;
	if (used == 0)
		return 0;
	struct pm_scan_arg arg = {.size = sizeof arg,
				  .flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
				  .start = addr,
				  .end = addr + used,
				  .category_mask = PAGE_IS_WRITTEN,
				  .return_mask = PAGE_IS_WRITTEN};
	return ioctl(ag.pagemap, PAGEMAP_SCAN, &arg) < 0 ? -errno : 0;
}

static void region_set(struct rk_snap_region *r, uint32_t kind, const char *name, uint64_t addr, uint64_t len)
{
	memset(r, 0, sizeof *r);
	r->kind = kind;
	rk_strlcpy(r->name, name, sizeof r->name);
	r->addr = addr;
	r->len = len;
}

/* The region table of this report, from the manifest copy; registers the
 * mappings not tracked yet (flag NEW: the supervisor reads them whole). */
static enum rk_snap_status regions_build(int *err)
{
	const struct rk_manifest *m = buf_manifest();
	struct rk_snap_region *r = buf_regions();
	struct tracked now[RK_SNAP_MAX_REGIONS];
	unsigned n = 0;
	for (unsigned i = 0; i < m->narenas; i++) {
		const struct rk_manifest_arena *a = &m->arenas[i];
		if (a->flags & RK_ARENA_NO_SNAPSHOT)
			continue; /* opted out: not registered, not scanned, not in the snapshot */
		region_set(&r[n], RK_SNAP_ARENA, a->name, a->base, a->max);
		r[n].ino = a->ino;
		now[n] = (struct tracked){a->base, a->max, a->ino, false};
		scan_len[n] = used_len(a->fd, a->max);
		n++;
	}
	for (unsigned i = 0; i < m->nranges; i++, n++) {
		const struct rk_manifest_range *g = &m->ranges[i];
		char name[48];
		snprintf(name, sizeof name, "range:%llx", (unsigned long long)g->addr);
		region_set(&r[n], RK_SNAP_RANGE, name, g->addr, g->len);
		r[n].ino = g->ino;
		now[n] = (struct tracked){g->addr, g->len, g->ino, false};
		scan_len[n] = g->len;
	}
	for (unsigned i = 0; i < n; i++) {
		const struct tracked *t = find_tracked(now[i].addr, now[i].len, now[i].ino);
		if (t && t->from_map && !early.overflow) {
			/* its first report: never reported, every change since the
			 * restored snapshot is in it (the flag is not claimed again) */
			r[i].flags |= RK_SNAP_REGION_NEW | RK_SNAP_REGION_TRACKED_FROM_MAP;
			continue;
		}
		if (t)
			continue;
		int e = r[i].kind == RK_SNAP_ARENA ? arena_small_pages(&r[i], scan_len[i]) : 0;
		if (e == 0)
			e = track(now[i].addr, now[i].len, scan_len[i]);
		if (e < 0) {
			*err = -e;
			ag.ntracked = 0; /* what we did register is re-registered next time */
			return RK_SNAP_SCAN_FAILED;
		}
		r[i].flags |= RK_SNAP_REGION_NEW;
	}
	memcpy(ag.tracked, now, n * sizeof now[0]);
	ag.ntracked = n;
	ag.buf->nregions = n;
	return RK_SNAP_OK;
}

/* ---- a report ---------------------------------------------------------- */

static void reply_dirty(uint64_t seq, enum rk_snap_status st, int err, bool more, uint64_t t_freeze,
			uint64_t t_scan, uint32_t overflow, bool unchanged, uint64_t epoch)
{
	struct rk_snap_dirty d = {.seq = seq,
			       .status = st,
			       .err = err,
			       .more = more,
			       .frozen = ag.frozen,
			       .t_freeze_ns = t_freeze,
			       .t_scan_ns = t_scan,
			       .punch_overflow = overflow,
			       .unchanged = unchanged,
			       .epoch = epoch};
	(void)send_msg(RK_SNAP_DIRTY, &d, sizeof d, -1);
}

/* Waits for the supervisor's CONTINUE (more == true) or RELEASE of seq;
 * false on timeout or a lost socket. */
static bool await(uint64_t seq, uint16_t want, int timeout_ms)
{
	uint64_t t0 = rk_now_ns();
	for (;;) {
		uint64_t spent = (rk_now_ns() - t0) / 1000000ull;
		if (spent >= (uint64_t)timeout_ms)
			return false;
		struct rk_snap_seq s;
		int t = recv_msg(&s, sizeof s, timeout_ms - (int)spent);
		if (t <= 0)
			return false;
		if (t == want && s.seq == seq)
			return true;
	}
}

/* Scans every region from region *ri, address *resume on; returns with the vector full
 * (true: more to come) or everything scanned. */
static int scan_regions(unsigned *ri, uint64_t *resume, bool *more)
{
	struct rk_snap_region *r = buf_regions();
	struct page_region *vec = buf_vec();
	uint32_t used = 0;
	for (unsigned i = 0; i < ag.buf->nregions; i++)
		r[i].first = r[i].count = 0;
	*more = false;
	for (; *ri < ag.buf->nregions; (*ri)++) {
		struct rk_snap_region *g = &r[*ri];
		uint64_t from = *resume ? *resume : g->addr, end = g->addr + scan_len[*ri];
		g->first = used;
		g->count = 0;
		if (from >= end) {
			*resume = 0;
			continue;
		}
		struct pm_scan_arg arg = {.size = sizeof arg,
					  .flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
					  .start = from,
					  .end = end,
					  .vec = (uint64_t)(uintptr_t)(vec + used),
					  .vec_len = ag.buf->vec_cap - used,
					  .category_mask = PAGE_IS_WRITTEN,
					  .return_mask = PAGE_IS_WRITTEN};
		long n = ioctl(ag.pagemap, PAGEMAP_SCAN, &arg);
		if (n < 0)
			return -errno;
		g->count = (uint32_t)n;
		used += (uint32_t)n;
		if (arg.walk_end < end) {
			*resume = arg.walk_end; /* the vector is full */
			*more = true;
			ag.buf->nvec = used;
			return 0;
		}
		*resume = 0;
	}
	ag.buf->nvec = used;
	return 0;
}

/* The statics and the holes punched since the last cut, for the cut. */
static uint32_t cut_extras(uint64_t *epoch)
{
	/* from here on, writes are in the next cut (no region is open now) */
	*epoch = atomic_fetch_add(&ag.buf->open_epoch, 1);
	struct rk_manifest *c = buf_manifest();
	rk_statics_save(c); /* into the copy: data_off is relative to it */
	c->checksum = rk_manifest_checksum(c);
	uint32_t head = atomic_load(&ag.buf->punch_head);
	ag.buf->npunch = head < ag.buf->punch_cap ? head : ag.buf->punch_cap;
	return atomic_load(&ag.buf->punch_overflow);
}

/* PROBE, before its scan: with no unsafe region open (held for a moment,
 * never waited for: an open one means a change under way), takes the
 * number regions ended from now on will be past, and compares what pages
 * do not show with the last cut released: the holes punched, the manifest
 * and the statics.  All at one instant, so a value changed and put back
 * later cannot pass for unchanged.  True with *epoch set if they are the
 * cut's; then only the scan that follows can find a change (a page
 * written before this instant is still marked). */
static bool probe_begin(uint64_t *epoch)
{
	if (!ag.last_cut_len || freeze(0) != RK_SNAP_OK)
		return false;
	*epoch = atomic_fetch_add(&ag.buf->open_epoch, 1);
	bool same = !atomic_load(&ag.buf->punch_head) && !atomic_load(&ag.buf->punch_overflow) &&
		    manifest_copy() == RK_SNAP_OK;
	if (same) {
		struct rk_manifest *c = buf_manifest();
		rk_statics_save(c);
		c->checksum = rk_manifest_checksum(c);
		same = ag.buf->manifest_len == ag.last_cut_len && memcmp(c, ag.last_cut, ag.last_cut_len) == 0;
	}
	thaw();
	return same;
}

static bool any_region_new(void)
{
	const struct rk_snap_region *r = buf_regions();
	for (unsigned i = 0; i < ag.buf->nregions; i++)
		if (r[i].flags & RK_SNAP_REGION_NEW)
			return true;
	return false;
}

static void report(const struct rk_snap_scan *q)
{
	uint64_t t0 = rk_now_ns();
	int err = 0;
	bool cut = (q->flags & RK_SNAP_SCAN_CUT) != 0;
	uint64_t probe_epoch = 0;
	bool same = !cut && (q->flags & RK_SNAP_SCAN_PROBE) && probe_begin(&probe_epoch);
	bool wrote = false;
	enum rk_snap_status st = cut ? freeze(q->timeout_ms ? q->timeout_ms : 10) : RK_SNAP_OK;
	uint64_t t_freeze = rk_now_ns() - t0;
	ag.buf->nvec = ag.buf->npunch = 0;
	if (st == RK_SNAP_OK)
		st = manifest_copy();
	if (st == RK_SNAP_OK)
		st = regions_build(&err);
	unsigned ri = 0;
	uint64_t resume = 0;
	bool more = false;
	while (st == RK_SNAP_OK) {
		uint64_t ts = rk_now_ns();
		int e = scan_regions(&ri, &resume, &more);
		if (e < 0) {
			st = RK_SNAP_SCAN_FAILED;
			err = -e;
			break;
		}
		wrote = wrote || ag.buf->nvec > 0;
		if (!more)
			break;
		reply_dirty(q->seq, st, 0, true, t_freeze, rk_now_ns() - ts, 0, false, 0);
		if (!await(q->seq, RK_SNAP_CONTINUE, STOP_MAX_MS)) {
			st = RK_SNAP_STOP_TIMEOUT;
			break;
		}
	}
	if (st != RK_SNAP_OK) {
		if (ag.frozen)
			thaw();
		reply_dirty(q->seq, st, err, false, t_freeze, 0, 0, false, 0);
		return;
	}
	uint64_t epoch = 0;
	uint32_t overflow = cut ? cut_extras(&epoch) : 0;
	bool unchanged = same && !wrote && !any_region_new();
	if (unchanged)
		epoch = probe_epoch;
	reply_dirty(q->seq, st, 0, false, t_freeze, rk_now_ns() - t0 - t_freeze, overflow, unchanged, epoch);
	if (!cut)
		return;
	bool released = await(q->seq, RK_SNAP_RELEASE, STOP_MAX_MS);
	ag.last_cut_len = 0;
	if (released) {
		/* consumed: the next cut reports the holes punched after this one */
		atomic_store(&ag.buf->punch_head, 0);
		atomic_store(&ag.buf->punch_overflow, 0);
		if (ag.last_cut && ag.buf->manifest_len <= ag.last_cut_cap) {
			memcpy(ag.last_cut, buf_manifest(), ag.buf->manifest_len);
			ag.last_cut_len = ag.buf->manifest_len;
		}
	}
	thaw();
	struct rk_snap_released d = {.seq = q->seq,
				  .status = released ? RK_SNAP_OK : RK_SNAP_STOP_TIMEOUT,
				  .stop_ns = rk_now_ns() - t0};
	(void)send_msg(RK_SNAP_RELEASED, &d, sizeof d, -1);
}

static void *agent_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct rk_snap_scan q;
		int t = recv_msg(&q, sizeof q, -1);
		if (t < 0)
			break; /* the supervisor is gone: nothing to report to */
		if (t == RK_SNAP_SCAN)
			report(&q);
		/* anything else is a stale CONTINUE or RELEASE: dropped */
	}
	return NULL;
}

/* ---- start ------------------------------------------------------------ */

/* User faults only: the kernel resolves async write-protect faults itself.
 * EINVAL: a kernel before 6.7. */
static int uffd_open(void)
{
	return rk_uffd_open(UFFD_USER_MODE_ONLY,
			    UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED | UFFD_FEATURE_WP_HUGETLBFS_SHMEM);
}

static int buf_create(void)
{
	size_t manifest_cap = RK_ALIGN_UP(rk_g.manifest_size, RK_PAGE);
	size_t regions_off = RK_PAGE;
	size_t vec_off = regions_off + RK_ALIGN_UP(RK_SNAP_MAX_REGIONS * sizeof(struct rk_snap_region), RK_PAGE);
	size_t punch_off = vec_off + RK_SNAP_VEC_CAP * sizeof(struct page_region);
	size_t manifest_off = punch_off + RK_SNAP_PUNCH_CAP * sizeof(struct rk_snap_punch);
	size_t size = manifest_off + manifest_cap;
	int fd = memfd_create("rekindle:snapbuf", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	void *p = ftruncate(fd, (off_t)size) == 0
			  ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
			  : MAP_FAILED;
	if (p == MAP_FAILED) {
		int e = -errno;
		close(fd);
		return e;
	}
	ag.buf = p;
	ag.buf_fd = fd;
	ag.buf_size = size;
	ag.last_cut = malloc(manifest_cap); /* NULL: no probe finds "unchanged" */
	ag.last_cut_cap = ag.last_cut ? (uint32_t)manifest_cap : 0;
	*ag.buf = (struct rk_snap_buf){.magic = RK_SNAP_BUF_MAGIC,
				       .version = RK_SNAP_BUF_VERSION,
				       .size = (uint32_t)size,
				       .regions_off = regions_off,
				       .vec_off = vec_off,
				       .punch_off = punch_off,
				       .manifest_off = manifest_off,
				       .open_epoch = 1, /* the first cut */
				       .vec_cap = RK_SNAP_VEC_CAP,
				       .punch_cap = RK_SNAP_PUNCH_CAP,
				       .manifest_cap = (uint32_t)manifest_cap};
	return 0;
}

static void hello(uint32_t status, int err)
{
	struct rk_snap_hello h = {.pid = (uint32_t)getpid(),
			       .generation = rk_g.info.generation,
			       .status = status,
			       .err = err,
			       .buf_size = status == RK_SNAP_OK ? ag.buf_size : 0};
	int fds[RK_SNAP_HELLO_FDS] = {ag.buf_fd, ag.durable_efd, ag.request_efd};
	(void)send_msg_fds(RK_SNAP_HELLO, &h, sizeof h, fds, status == RK_SNAP_OK ? RK_SNAP_HELLO_FDS : 0);
}

static void agent_stop_with(uint32_t status, int err, const char *what)
{
	struct rk_ev e;
	rk_ev_begin(&e, "error");
	rk_ev_str(&e, "what", what);
	rk_ev_str(&e, "code", "snapshot_unavailable");
	rk_ev_i64(&e, "errno", err);
	rk_ev_end(&e);
	hello(status, err);
}

static void early_punches_to(struct rk_snap_buf *b);

void rk_snapshot_agent_start(void)
{
	const char *v = getenv("REKINDLE_SNAPSHOT_FD");
	if (!v || rk_g.validator)
		return;
	char *end;
	long fd = strtol(v, &end, 10);
	if (*end || fd < 0 || fd > INT_MAX || fcntl((int)fd, F_GETFD) < 0)
		return; /* not ours to talk on */
	/* kept across in-place restarts, like the supervisor's socket
	 * (hand_over_fds), but not for the app's own children */
	ag.sock = (int)fd;
	rk_fd_set_cloexec(ag.sock, true);
	/* a report the previous incarnation never answered is stale */
	char drop[MSG_MAX];
	while (recv(ag.sock, drop, sizeof drop, MSG_DONTWAIT) > 0)
		;
	int e = buf_create();
	if (e < 0) {
		agent_stop_with(RK_SNAP_UNAVAILABLE, -e, "snapshots: cannot create the shared buffer");
		return;
	}
	ag.durable_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ag.request_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ag.durable_efd < 0 || ag.request_efd < 0) {
		agent_stop_with(RK_SNAP_UNAVAILABLE, errno, "snapshots: cannot create the eventfds");
		return;
	}
	if (ag.pagemap < 0 && (ag.pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC)) < 0) {
		agent_stop_with(RK_SNAP_UNAVAILABLE, errno, "snapshots: cannot open /proc/self/pagemap");
		return;
	}
	if (ag.uffd < 0 && (ag.uffd = uffd_open()) < 0) {
		agent_stop_with(RK_SNAP_UNAVAILABLE, -ag.uffd,
				"snapshots: no userfaultfd with async write-protect (Linux 6.7+)");
		return;
	}
	/* the app's signals are not for this thread */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 256 * 1024);
	int r = pthread_create(&t, &at, agent_main, NULL);
	pthread_attr_destroy(&at);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r != 0) {
		agent_stop_with(RK_SNAP_UNAVAILABLE, r, "snapshots: cannot start the agent thread");
		return;
	}
	(void)pthread_setname_np(t, "rk-snapshot");
	early_punches_to(ag.buf);
	atomic_store(&punch_buf, ag.buf);
	hello(RK_SNAP_OK, 0);
}

/* The holes punched while tracking from the mapping, before the buffer
 * existed, go first in its log (the app's threads do not punch yet: no
 * other thread of ours runs before rk_init returns). */
static void early_punches_to(struct rk_snap_buf *b)
{
	if (!early.on)
		return;
	for (unsigned i = 0; i < early.n && i < b->punch_cap; i++)
		buf_punches(b)[i] = early.punch[i];
	atomic_store(&b->punch_head, early.n);
	early.on = false;
}

/* Tracking from the mapping failed half-way: closing the userfaultfd
 * unregisters what it had; the agent starts over as without it. */
static void early_give_up(void)
{
	close(ag.uffd);
	ag.uffd = -1;
	ag.ntracked = 0;
	early.on = false;
	early.failed = true;
}

void rk_snapshot_track_from_map(uint64_t addr, uint64_t len, int fd, uint64_t ino)
{
	if (early.failed || rk_g.validator || ag.ntracked == RK_SNAP_MAX_REGIONS)
		return;
	if (!early.on) {
		const char *v = getenv("REKINDLE_SNAPSHOT_FD");
		if (!v || !*v)
			return; /* no agent will run */
		if (ag.pagemap < 0)
			ag.pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
		if (ag.pagemap < 0 || (ag.uffd = uffd_open()) < 0) {
			ag.uffd = -1;
			early.failed = true; /* the agent's start says why, as it would have */
			return;
		}
		early.on = true;
	}
	uint64_t used = used_len(fd, len);
	if (arena_split_huge(addr, len, used) < 0 || track(addr, len, used) < 0) {
		early_give_up();
		return;
	}
	ag.tracked[ag.ntracked++] = (struct tracked){addr, len, ino, true};
}

void rk_snapshot_note_punch(uint64_t addr, uint64_t pages)
{
	struct rk_snap_buf *b = atomic_load_explicit(&punch_buf, memory_order_acquire);
	if (!b && early.on) {
		if (early.n < EARLY_PUNCH_CAP)
			early.punch[early.n++] = (struct rk_snap_punch){addr, pages};
		else
			early.overflow = true;
		return;
	}
	if (!b || getpid() != rk_g.pid)
		return;
	uint32_t i = atomic_fetch_add(&b->punch_head, 1);
	if (i < b->punch_cap)
		buf_punches(b)[i] = (struct rk_snap_punch){addr, pages};
	else
		atomic_store(&b->punch_overflow, 1);
}

/* ---- the public durability API (rekindle.h) ----------------------------- */

uint64_t rk_epoch(void)
{
	struct rk_snap_buf *b = atomic_load_explicit(&punch_buf, memory_order_acquire);
	return b ? atomic_load(&b->open_epoch) : 0;
}

uint64_t rk_durable_epoch(void)
{
	struct rk_snap_buf *b = atomic_load_explicit(&punch_buf, memory_order_acquire);
	return b ? atomic_load(&b->durable_epoch) : 0;
}

int rk_durable_fd(void)
{
	return atomic_load_explicit(&punch_buf, memory_order_acquire) ? ag.durable_efd : -1;
}

int rk_checkpoint(void)
{
	if (!atomic_load_explicit(&punch_buf, memory_order_acquire) || getpid() != rk_g.pid)
		return -ENOTSUP;
	uint64_t one = 1;
	if (write(ag.request_efd, &one, sizeof one) == (ssize_t)sizeof one || errno == EAGAIN)
		return 0; /* EAGAIN: the counter is full, a request is pending anyway */
	return -errno;
}

bool rk_snapshot_active(void) { return atomic_load_explicit(&punch_buf, memory_order_acquire) != NULL; }

int rk_snapshot_fd(void)
{
	return ag.sock;
}
