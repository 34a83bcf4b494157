/* redo.c - the app's redo log: records appended to a ring the supervisor
 * holds and writes to disk (rekindle.h, "The redo log"; the ring's layout is
 * in rk_internal.h).  The app's threads copy a record and, once a batch is
 * done, write one eventfd; the supervisor's writer thread does the write
 * and the sync.  A restore hands the records after its snapshot back to the
 * app (rk_redo_replay). */
#include "rk_internal.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* How long an append waits for ring space before it fails. */
#define SPACE_WAIT_MS 1000
/* The largest record: a quarter of the ring, so one record never waits for
 * space the writer cannot free (the ring holds committed bytes only). */
#define MAX_SHARE 4

__thread bool rk_tls_redo_pending __attribute__((tls_model("initial-exec")));

static struct {
	struct rk_redo_ring *ring;
	unsigned char *data;
	uint64_t mask;
	int fd, kick, done;
	char env[64]; /* REKINDLE_REDO_FDS=... for the next image */
	pthread_mutex_t lock;
	uint64_t reserved; /* the end of the last record appended (>= committed) */
	unsigned writers;  /* threads whose records are not yet committed */
	/* a restore's replay */
	int replay_fd;
	bool hold;            /* the restored arenas count as open regions */
	uint32_t held;        /* which arena indexes */
	uint32_t init_tid;
} rd = {.fd = -1, .kick = -1, .done = -1, .lock = PTHREAD_MUTEX_INITIALIZER, .replay_fd = -1};

static void redo_event(const char *what, const char *code, int err)
{
	struct rk_ev e;
	rk_ev_begin(&e, "redo");
	rk_ev_str(&e, "what", what);
	if (code)
		rk_ev_str(&e, "code", code);
	if (err)
		rk_ev_str(&e, "error", strerror(err));
	rk_ev_end(&e);
}

static bool parse_fds(const char *v, int out[3])
{
	for (int i = 0; i < 3; i++) {
		char *end;
		long n = strtol(v, &end, 10);
		if (end == v || n < 3 || n > INT_MAX || (i < 2 ? *end != ',' : *end != 0))
			return false;
		out[i] = (int)n;
		v = end + 1;
	}
	return true;
}

static int map_ring(int fd)
{
	struct stat st;
	if (!rk_fd_is_shmem(fd) || fstat(fd, &st) < 0 || st.st_size < (off_t)(RK_REDO_HEADER + RK_PAGE))
		return -EINVAL;
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	struct rk_redo_ring *r = p;
	uint64_t n = r->ring_bytes;
	if (r->magic != RK_REDO_MAGIC || r->version != RK_REDO_VERSION || r->header_size != RK_REDO_HEADER ||
	    n == 0 || (n & (n - 1)) || n + RK_REDO_HEADER != (uint64_t)st.st_size) {
		munmap(p, (size_t)st.st_size);
		return -EPROTO;
	}
	rd.ring = r;
	rd.data = (unsigned char *)p + RK_REDO_HEADER;
	rd.mask = n - 1;
	return 0;
}

/* A forked child is not the app: its appends would interleave with the
 * parent's in the same ring. */
static void forget_in_child(void)
{
	rd.ring = NULL;
	rd.writers = 0;
	rk_tls_redo_pending = false;
	pthread_mutex_init(&rd.lock, NULL);
}

static void replay_attach(void)
{
	const char *v = getenv("REKINDLE_REDO_REPLAY");
	if (!v)
		return;
	char *end;
	long fd = strtol(v, &end, 10);
	if (*end || fd < 3 || fd > INT_MAX) {
		redo_event("ignoring a malformed REKINDLE_REDO_REPLAY", "redo_replay_env", 0);
	} else {
		rd.replay_fd = (int)fd;
		rk_fd_set_cloexec(rd.replay_fd, true); /* this incarnation's alone */
	}
	unsetenv("REKINDLE_REDO_REPLAY");
}

void rk_redo_attach(void)
{
	(void)pthread_atfork(NULL, NULL, forget_in_child);
	replay_attach();
	const char *v = getenv("REKINDLE_REDO_FDS");
	if (!v)
		return;
	int fds[3];
	int e = parse_fds(v, fds) ? map_ring(fds[0]) : -EINVAL;
	if (e < 0) {
		redo_event("REKINDLE_REDO_FDS is not a rekindle redo ring; no redo log", "redo_ring_foreign", -e);
	} else {
		rd.fd = fds[0];
		rd.kick = fds[1];
		rd.done = fds[2];
		rk_strlcpy(rd.env, "REKINDLE_REDO_FDS=", sizeof rd.env);
		rk_strlcat(rd.env, v, sizeof rd.env);
		/* ours across in-place restarts (hand_over_fds), not the app's children's */
		for (int i = 0; i < 3; i++)
			rk_fd_set_cloexec(fds[i], true);
		rd.reserved = atomic_load(&rd.ring->committed); /* a dead thread's uncommitted tail is dropped */
		atomic_store(&rd.ring->started_at, rd.reserved);
		atomic_store(&rd.ring->started_line, rk_redo_open() ? atomic_load(&rd.ring->line) : 0);
	}
	unsetenv("REKINDLE_REDO_FDS"); /* restart.c re-adds it */
}

void rk_redo_hold_until_replayed(void)
{
	/* Only a warm start that kept every arena as it was continues the line
	 * the ring may hold open.  Any other (fresh, cold, an independent arena
	 * dropped, a cross-check's validated copy) has a state that is not that
	 * line's snapshot plus its records.  (A start from a snapshot finds the
	 * log closed already.)  Before the agent starts: no cut comes first. */
	bool same_state = rk_g.info.kind == RK_START_WARM && rk_g.info.decision_code == RK_REASON_ALL_CHECKS_PASSED;
	if (rd.ring && !same_state && rk_redo_open())
		(void)rk_redo_gap();
	if (rd.replay_fd < 0 || !rk_ctl)
		return;
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		if (!rk_g.arenas[i].hdr)
			continue;
		rk_unsafe_note_enter(i);
		rd.held |= 1u << i;
	}
	rd.hold = true;
	rd.init_tid = rk_gettid();
	if (rd.ring)
		atomic_store(&rd.ring->replay_pending, 1);
}

void rk_redo_arena_created(unsigned index)
{
	if (!rd.hold || index >= RK_MAX_ARENAS || (rd.held & (1u << index)) || rk_gettid() != rd.init_tid)
		return;
	rk_unsafe_note_enter(index);
	rd.held |= 1u << index;
}

int rk_redo_fds(int fds[3])
{
	if (!rd.ring)
		return -1;
	fds[0] = rd.fd;
	fds[1] = rd.kick;
	fds[2] = rd.done;
	return 0;
}

const char *rk_redo_env(void) { return rd.ring ? rd.env : NULL; }

bool rk_redo_open(void)
{
	struct rk_redo_ring *r = rd.ring;
	return r && atomic_load(&r->line) != 0 && atomic_load(&r->line_gaps) == atomic_load(&r->app_gaps) &&
	       atomic_load(&r->writer_errno) == 0;
}

size_t rk_redo_max(void) { return rd.ring ? (size_t)((rd.mask + 1) / MAX_SHARE - RK_REDO_REC_HEAD) : 0; }

static void ring_put(uint64_t at, const void *src, size_t n)
{
	uint64_t off = at & rd.mask, room = rd.mask + 1 - off;
	if (n <= room) {
		memcpy(rd.data + off, src, n);
		return;
	}
	memcpy(rd.data + off, src, (size_t)room);
	memcpy(rd.data, (const unsigned char *)src + room, n - (size_t)room);
}

static void kick(void)
{
	uint64_t one = 1;
	if (write(rd.kick, &one, sizeof one) < 0 && errno != EAGAIN)
		redo_event("cannot wake the supervisor's writer", "redo_kick_failed", errno);
}

static void drain_done(void)
{
	uint64_t n;
	(void)!read(rd.done, &n, sizeof n);
}

/* With the lock held: waits (the lock dropped meanwhile) until the ring
 * has room for need more bytes; 0 or -errno. */
static int wait_for_space(uint64_t need)
{
	uint64_t size = rd.mask + 1;
	int64_t until = (int64_t)(rk_now_ns() / 1000000) + SPACE_WAIT_MS;
	while (rd.reserved + need - atomic_load(&rd.ring->drained) > size) {
		int left = (int)(until - (int64_t)(rk_now_ns() / 1000000));
		if (left <= 0)
			return -ETIMEDOUT;
		if (atomic_load(&rd.ring->writer_errno))
			return -EIO;
		pthread_mutex_unlock(&rd.lock);
		/* the writer drains committed bytes: make ours count */
		uint64_t c = atomic_load(&rd.ring->committed);
		if (c > atomic_load(&rd.ring->want))
			atomic_store(&rd.ring->want, c);
		kick();
		struct pollfd p = {.fd = rd.done, .events = POLLIN};
		(void)poll(&p, 1, left < 10 ? left : 10);
		if (p.revents & POLLIN)
			drain_done();
		pthread_mutex_lock(&rd.lock);
	}
	return 0;
}

int64_t rk_redo_append(const void *rec, size_t len)
{
	if (!rd.ring)
		return -ENOTSUP;
	pthread_mutex_lock(&rd.lock);
	int64_t ret;
	if (len > rk_redo_max()) {
		ret = -EMSGSIZE;
	} else if (!rk_unsafe_my_depth()) {
		ret = -EINVAL;
	} else if (atomic_load(&rd.ring->writer_errno)) {
		ret = -EIO;
	} else if (!rk_redo_open()) {
		ret = -EAGAIN;
	} else if ((ret = wait_for_space(RK_REDO_REC_HEAD + len)) == 0 && !rk_redo_open()) {
		ret = -EAGAIN; /* closed while the lock was dropped to wait */
	} else if (ret == 0) {
		uint32_t head = (uint32_t)len;
		ring_put(rd.reserved, &head, sizeof head);
		ring_put(rd.reserved + RK_REDO_REC_HEAD, rec, len);
		rd.reserved += RK_REDO_REC_HEAD + len;
		if (!rk_tls_redo_pending) {
			rk_tls_redo_pending = true;
			rd.writers++;
		}
		ret = (int64_t)rd.reserved;
	}
	/* a change the app makes without its record (what the header tells it
	 * to do when this fails) must not be followed by records on this line */
	if (ret < 0 && ret != -EAGAIN)
		atomic_fetch_add(&rd.ring->app_gaps, 1);
	pthread_mutex_unlock(&rd.lock);
	return ret;
}

void rk_redo_commit_thread(void)
{
	pthread_mutex_lock(&rd.lock);
	rk_tls_redo_pending = false;
	if (rd.writers && --rd.writers == 0 && rd.ring)
		atomic_store_explicit(&rd.ring->committed, rd.reserved, memory_order_release);
	pthread_mutex_unlock(&rd.lock);
}

int rk_redo_flush(void)
{
	if (!rd.ring)
		return -ENOTSUP;
	uint64_t c = atomic_load(&rd.ring->committed);
	if (c <= atomic_load(&rd.ring->durable) || c <= atomic_load(&rd.ring->want))
		return 0; /* durable already, or asked for */
	atomic_store(&rd.ring->want, c);
	kick();
	return 0;
}

uint64_t rk_redo_durable(void) { return rd.ring ? atomic_load(&rd.ring->durable) : 0; }

uint64_t rk_redo_position(void) { return rd.ring ? atomic_load(&rd.ring->committed) : 0; }

int rk_redo_fd(void) { return rd.ring ? rd.done : -1; }

int rk_redo_gap(void)
{
	if (!rd.ring)
		return -ENOTSUP;
	pthread_mutex_lock(&rd.lock);
	atomic_fetch_add(&rd.ring->app_gaps, 1);
	pthread_mutex_unlock(&rd.lock);
	return 0;
}

static void release_hold(void)
{
	if (!rd.hold)
		return;
	if (rd.ring)
		atomic_store(&rd.ring->replay_pending, 0);
	for (unsigned i = 0; i < RK_MAX_ARENAS; i++)
		if (rd.held & (1u << i))
			rk_unsafe_note_leave(i);
	rd.held = 0;
	rd.hold = false;
}

/* Walks the records of [p, p + n); -EPROTO where their lengths do not add
 * up (the supervisor checked them: a bug, not damage). */
static int64_t apply_all(const unsigned char *p, uint64_t n, int (*apply)(const void *, size_t, void *),
			 void *ctx)
{
	int64_t count = 0;
	uint64_t at = 0;
	while (at < n) {
		uint32_t len;
		if (n - at < RK_REDO_REC_HEAD)
			return -EPROTO;
		memcpy(&len, p + at, sizeof len);
		at += RK_REDO_REC_HEAD;
		if (len > n - at)
			return -EPROTO;
		int r = apply(p + at, len, ctx);
		if (r < 0)
			return r;
		at += len;
		count++;
	}
	return count;
}

int64_t rk_redo_replay(int (*apply)(const void *rec, size_t len, void *ctx), void *ctx)
{
	if (rd.replay_fd < 0)
		return 0;
	if (!apply)
		return -EINVAL;
	if (rd.hold && rk_gettid() != rd.init_tid)
		return -EINVAL; /* the hold is counted in rk_init's thread's slot */
	uint64_t t0 = rk_now_ns();
	struct stat st;
	int64_t r = 0;
	if (fstat(rd.replay_fd, &st) < 0) {
		r = -errno;
	} else if (st.st_size > 0) {
		void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, rd.replay_fd, 0);
		if (p == MAP_FAILED) {
			r = -errno;
		} else {
			r = apply_all(p, (uint64_t)st.st_size, apply, ctx);
			munmap(p, (size_t)st.st_size);
		}
	}
	if (r < 0) {
		/* the hold stays: a death now restores the snapshot again */
		redo_event("replay failed", "redo_replay_failed", r == -EPROTO ? 0 : (int)-r);
		return r;
	}
	close(rd.replay_fd);
	rd.replay_fd = -1;
	release_hold();
	struct rk_ev e;
	rk_ev_begin(&e, "redo_replay");
	rk_ev_u64(&e, "records", (uint64_t)r);
	rk_ev_u64(&e, "bytes", (uint64_t)st.st_size);
	rk_ev_u64(&e, "took_us", (rk_now_ns() - t0) / 1000);
	rk_ev_end(&e);
	return r;
}
