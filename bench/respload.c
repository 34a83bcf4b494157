/* respload - a closed-loop RESP (Redis protocol) load generator for the
 * availability benchmark (bench/availability.py).  No Rekindle calls: it
 * drives rkv and real Redis 7 the same way.
 *
 *   respload load --port P --keys N [--value-size 100] [--pipeline 1000]
 *   respload run  --port P --keys N [--conns 4] [--pipeline 32]
 *                 [--write-pct 5] [--duration 600] [--bucket-ms 100]
 *                 [--no-verify] [--seed S]
 *
 * load: SETs keys k:00000000 .. k:N-1 to their canonical values
 *       ("c:KEY:" padded to --value-size) over one pipelined connection and
 *       prints {"respload":"loaded",...}.  It waits up to 120 s for the
 *       server to accept.
 *
 * run:  --conns connections, one thread each; thread t owns the keys
 *       k = t (mod conns), so every write to a key goes through one
 *       connection and the order of its writes is the order they were sent.
 *       A thread sends a batch of --pipeline commands and reads all replies
 *       (closed loop).  A command is a GET of a uniformly random owned key,
 *       or (--write-pct percent) a SET of a fresh value "w:KEY:SEQ:" with a
 *       per-thread sequence number.  A GET that misses (cache-aside) queues
 *       a SET of the key's current value (canonical, or the last
 *       acknowledged fresh value: the "database" value) for the next batch.
 *       On connection loss or an error the thread reconnects at once and
 *       then every 1 ms until it succeeds; the unreplied commands of the
 *       batch are in flight: a fresh SET among them is "uncertain" (it may
 *       or may not have been applied; either value is accepted later).
 *
 *       Acknowledged-write check: a GET of a key whose last acknowledged
 *       write was a fresh SET must return exactly that value (or the
 *       uncertain one).  A miss or another value counts as a lost
 *       acknowledged write (once; the key is then repaired with its value,
 *       like a cache-aside fill).  At the end (SIGINT/SIGTERM or
 *       --duration) every such key is read back once more (verify).
 *       SIGUSR1 and SIGUSR2 mark the snapshot and the crash: the summary
 *       counts the keys given a fresh acknowledged value between the two.  A value
 *       that names another key, or a fresh value never sent, is "corrupt".
 *
 *       Every --bucket-ms the reporter prints, on stdout, one line for the
 *       bucket that just closed: {"respload":"bucket","b":I,"get":..}.  At
 *       the end one summary line holds every bucket [get_ok, hits, misses,
 *       set_ok, fresh_writes_acked, errors], the gaps of at least 2 ms in
 *       which no command at all got a successful reply (absolute
 *       CLOCK_MONOTONIC ns, from 1 ms slots holding the first and last
 *       success time of every thread), and the verify result.  t0_ns is
 *       bucket 0's start on the same clock as Python's time.monotonic(). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 64
#define MAX_DEPTH 1024
#define KEY_LEN 10 /* "k:" + 8 digits */
#define GAP_MIN_US 2000
#define STALL_MS 10000 /* no reply at all for this long: reconnect */

enum { B_GET, B_HIT, B_MISS, B_SET, B_WR, B_ERR, B_N };
enum { C_GET, C_SET_FRESH, C_SET_FILL };

struct cfg {
	const char *host;
	int port;
	uint32_t keys;
	int vsize;
	int conns;
	int depth;
	int write_pct;
	double duration;
	int bucket_ms;
	bool verify;
	uint64_t seed;
};

static struct cfg C = {
	.host = "127.0.0.1", .vsize = 100, .conns = 4, .depth = 32,
	.write_pct = 5, .duration = 600, .bucket_ms = 100, .verify = true, .seed = 1,
};
static atomic_bool stop_flag;
static atomic_int epoch; /* SIGUSR1: 1 (snapshot taken), SIGUSR2: 2 (crash sent) */
static uint64_t t0_ns;
static uint32_t nbuckets, nslots;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		atomic_store(&epoch, 1);
	else if (sig == SIGUSR2)
		atomic_store(&epoch, 2);
	else
		atomic_store(&stop_flag, true);
}

struct cmd {
	uint8_t type;
	uint32_t j;   /* local key index */
	uint32_t seq; /* fresh SET: its sequence number; fill: the value's seq (0 = canonical) */
};

struct thr {
	int id;
	pthread_t th;
	uint32_t nkeys; /* keys owned: t, t+conns, ... */
	uint32_t *acked; /* last acknowledged fresh seq per owned key, 0 = canonical */
	uint32_t *alt;   /* an in-flight (uncertain) fresh seq, 0 = none */
	uint8_t *marked; /* a fresh write was acknowledged between SIGUSR1 and SIGUSR2 */
	uint32_t seq;
	uint64_t rng;
	_Atomic uint64_t *buckets; /* nbuckets * B_N */
	uint32_t *slot_first, *slot_last; /* us since t0, +1; 0 = none */
	uint32_t fillq[2 * MAX_DEPTH];
	uint32_t nfill;
	uint64_t lost_run, corrupt, reconnects, stalls;
	uint64_t v_checked, v_lost, v_uncertain_ok;
	char *wbuf;
	size_t wlen;
	char *rbuf;
	size_t rcap, rlen, rpos;
};

static uint64_t rnd(struct thr *t)
{
	uint64_t x = t->rng;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	t->rng = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static uint32_t key_of(struct thr *t, uint32_t j)
{
	return (uint32_t)t->id + j * (uint32_t)C.conns;
}

/* the tag at the start of key k's value: seq 0 = canonical "c:KEY:",
 * else "w:KEY:SEQ:"; returns its length (11 or 22) */
static int fmt_tag(char *v, uint32_t k, uint32_t seq)
{
	char s[32];
	int n = seq ? snprintf(s, sizeof s, "w:%08u:%010u:", k, seq) : snprintf(s, sizeof s, "c:%08u:", k);
	memcpy(v, s, (size_t)n);
	return n;
}

/* the whole value: the tag padded with 'x' (canonical) or 'y' (fresh) */
static void fmt_value(char *v, uint32_t k, uint32_t seq)
{
	int n = fmt_tag(v, k, seq);
	memset(v + n, seq ? 'y' : 'x', (size_t)(C.vsize - n));
}

static void put(struct thr *t, const void *p, size_t n)
{
	memcpy(t->wbuf + t->wlen, p, n);
	t->wlen += n;
}

static void put_get(struct thr *t, uint32_t k)
{
	char s[64];
	int n = snprintf(s, sizeof s, "*2\r\n$3\r\nGET\r\n$%d\r\nk:%08u\r\n", KEY_LEN, k);
	put(t, s, (size_t)n);
}

static void put_set(struct thr *t, uint32_t k, uint32_t seq)
{
	char s[64];
	int n = snprintf(s, sizeof s, "*3\r\n$3\r\nSET\r\n$%d\r\nk:%08u\r\n$%d\r\n", KEY_LEN, k, C.vsize);
	put(t, s, (size_t)n);
	fmt_value(t->wbuf + t->wlen, k, seq);
	t->wlen += (size_t)C.vsize;
	put(t, "\r\n", 2);
}

static int connect_once(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)C.port)};
	inet_pton(AF_INET, C.host, &a.sin_addr);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
		close(fd);
		return -1;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return fd;
}

/* Connects at once, then every 1 ms; -1 only when stopping or past deadline. */
static int connect_retry(uint64_t deadline_ns, bool honour_stop)
{
	for (;;) {
		int fd = connect_once();
		if (fd >= 0)
			return fd;
		if ((honour_stop && atomic_load(&stop_flag)) || (deadline_ns && now_ns() > deadline_ns))
			return -1;
		struct timespec ms = {0, 1000000};
		nanosleep(&ms, NULL);
	}
}

static int send_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w > 0) {
			p += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
			struct pollfd pf = {.fd = fd, .events = POLLOUT};
			if (poll(&pf, 1, STALL_MS) <= 0)
				return -1;
			continue;
		}
		return -1;
	}
	return 0;
}

/* Parses one reply at rbuf[rpos..rlen).  Returns 1 and fills kind/val/vlen,
 * or 0 if incomplete.  kind: '+', '-', ':', '$' (vlen -1 = nil), '?' = bad. */
static int parse_reply(struct thr *t, char *kind, const char **val, long *vlen)
{
	char *p = t->rbuf + t->rpos, *end = t->rbuf + t->rlen;
	char *nl = memchr(p, '\n', (size_t)(end - p));
	if (!nl)
		return 0;
	*kind = p[0];
	if (p[0] == '$') {
		long n = strtol(p + 1, NULL, 10);
		if (n < 0) {
			*vlen = -1;
			t->rpos = (size_t)(nl + 1 - t->rbuf);
			return 1;
		}
		if (end - (nl + 1) < n + 2)
			return 0;
		*val = nl + 1;
		*vlen = n;
		t->rpos = (size_t)(nl + 1 + n + 2 - t->rbuf);
		return 1;
	}
	if (p[0] != '+' && p[0] != '-' && p[0] != ':')
		*kind = '?';
	*val = p + 1;
	*vlen = nl - p - 1;
	t->rpos = (size_t)(nl + 1 - t->rbuf);
	return 1;
}

/* Reads more bytes: 1 = got some, 0 = poll timeout (check stop), -1 = lost. */
static int fill_rbuf(struct thr *t, int fd, int timeout_ms)
{
	if (t->rpos == t->rlen) {
		t->rpos = t->rlen = 0;
	} else if (t->rpos > t->rcap / 2) {
		memmove(t->rbuf, t->rbuf + t->rpos, t->rlen - t->rpos);
		t->rlen -= t->rpos;
		t->rpos = 0;
	}
	if (t->rlen == t->rcap) {
		t->rcap *= 2;
		t->rbuf = realloc(t->rbuf, t->rcap);
	}
	for (;;) {
		ssize_t r = recv(fd, t->rbuf + t->rlen, t->rcap - t->rlen, 0);
		if (r > 0) {
			t->rlen += (size_t)r;
			return 1;
		}
		if (r == 0)
			return -1;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return -1;
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		int pr = poll(&pf, 1, timeout_ms);
		if (pr == 0)
			return 0;
		if (pr < 0 && errno != EINTR)
			return -1;
	}
}

static void note_success(struct thr *t, uint64_t now)
{
	uint64_t us = (now - t0_ns) / 1000;
	uint32_t s = (uint32_t)(us / 1000);
	if (s >= nslots)
		return;
	uint32_t v = (uint32_t)us + 1;
	if (!t->slot_first[s])
		t->slot_first[s] = v;
	t->slot_last[s] = v;
}

static void count(struct thr *t, uint64_t now, uint64_t d[B_N])
{
	uint64_t b = (now - t0_ns) / ((uint64_t)C.bucket_ms * 1000000ull);
	if (b >= nbuckets) {
		atomic_store(&stop_flag, true);
		return;
	}
	for (int i = 0; i < B_N; i++)
		if (d[i]) {
			atomic_fetch_add_explicit(&t->buckets[b * B_N + i], d[i], memory_order_relaxed);
			d[i] = 0;
		}
}

static void queue_fill(struct thr *t, uint32_t j)
{
	if (t->nfill < sizeof t->fillq / sizeof t->fillq[0])
		t->fillq[t->nfill++] = j;
}

/* A GET's value for owned key j: 0 = as expected, 1 = lost acked write
 * (stale or other fresh value), 2 = corrupt. */
static int check_value(struct thr *t, uint32_t j, const char *v, long n)
{
	uint32_t k = key_of(t, j);
	char want[32];
	if (n != C.vsize)
		return 2;
	int tag = fmt_tag(want, k, t->acked[j]);
	if (memcmp(v, want, (size_t)tag) == 0)
		return 0;
	if (t->alt[j]) {
		fmt_tag(want, k, t->alt[j]);
		if (memcmp(v, want, 22) == 0) { /* the in-flight write was applied */
			t->acked[j] = t->alt[j];
			t->alt[j] = 0;
			return 0;
		}
	}
	/* names another key, or a fresh seq this thread never sent: corrupt */
	char kk[16];
	snprintf(kk, sizeof kk, "%08u", k);
	if (memcmp(v + 2, kk, 8) != 0)
		return 2;
	if (v[0] == 'w' && (uint32_t)strtoul(v + 11, NULL, 10) > t->seq)
		return 2;
	return t->acked[j] ? 1 : 0; /* canonical expected but an older fresh value: cannot be lost */
}

static void *run_thread(void *arg)
{
	struct thr *t = arg;
	struct cmd cmds[MAX_DEPTH + 2 * MAX_DEPTH];
	int fd = -1;
	uint64_t d[B_N] = {0};
	while (!atomic_load(&stop_flag)) {
		if (fd < 0) {
			fd = connect_retry(0, true);
			if (fd < 0)
				break;
		}
		/* build a batch: pending fills first, then GETs and fresh SETs */
		int n = 0;
		t->wlen = 0;
		for (uint32_t i = 0; i < t->nfill && n < C.depth; i++) {
			uint32_t j = t->fillq[i];
			cmds[n++] = (struct cmd){C_SET_FILL, j, t->acked[j]};
			put_set(t, key_of(t, j), t->acked[j]);
		}
		t->nfill = 0;
		while (n < C.depth) {
			uint64_t r = rnd(t);
			uint32_t j = (uint32_t)((r >> 8) % t->nkeys);
			if ((int)(r % 100) < C.write_pct) {
				uint32_t s = ++t->seq;
				cmds[n++] = (struct cmd){C_SET_FRESH, j, s};
				put_set(t, key_of(t, j), s);
			} else {
				cmds[n++] = (struct cmd){C_GET, j, 0};
				put_get(t, key_of(t, j));
			}
		}
		int got = 0;
		bool lost = send_all(fd, t->wbuf, t->wlen) < 0;
		uint64_t last_progress = now_ns();
		while (!lost && got < n) {
			int fr = fill_rbuf(t, fd, 100);
			uint64_t now = now_ns();
			if (fr < 0) {
				lost = true;
				break;
			}
			if (fr == 0) {
				if (now - last_progress > (uint64_t)STALL_MS * 1000000ull) {
					t->stalls++;
					lost = true;
				}
				if (atomic_load(&stop_flag))
					lost = true; /* unreplied ones stay in flight */
				continue;
			}
			char kind;
			const char *v = NULL;
			long vl = 0;
			bool ok_any = false;
			while (got < n && parse_reply(t, &kind, &v, &vl)) {
				struct cmd *c = &cmds[got++];
				if (kind == '?') {
					lost = true;
					break;
				}
				if (kind == '-') {
					d[B_ERR]++;
					if (c->type == C_SET_FILL)
						queue_fill(t, c->j); /* not applied: fill again */
					continue;
				}
				ok_any = true;
				if (c->type == C_GET) {
					d[B_GET]++;
					if (kind == '$' && vl < 0) {
						d[B_MISS]++;
						if (t->acked[c->j])
							t->lost_run++;
						t->alt[c->j] = 0;
						queue_fill(t, c->j);
					} else {
						int cv = check_value(t, c->j, v, vl);
						if (cv == 0) {
							d[B_HIT]++;
						} else if (cv == 1) {
							d[B_HIT]++; /* served, but stale: a lost acknowledged write */
							t->lost_run++;
							t->alt[c->j] = 0;
							queue_fill(t, c->j);
						} else {
							t->corrupt++;
						}
					}
				} else {
					d[B_SET]++;
					if (c->type == C_SET_FRESH) {
						d[B_WR]++;
						t->acked[c->j] = c->seq;
						t->alt[c->j] = 0;
						if (atomic_load_explicit(&epoch, memory_order_relaxed) == 1)
							t->marked[c->j] = 1;
					}
				}
			}
			if (ok_any) {
				note_success(t, now);
				last_progress = now;
			}
			count(t, now, d);
		}
		if (lost) {
			for (int i = got; i < n; i++)
				if (cmds[i].type == C_SET_FRESH)
					t->alt[cmds[i].j] = cmds[i].seq;
			if (!atomic_load(&stop_flag)) {
				d[B_ERR]++;
				t->reconnects++;
			}
			count(t, now_ns(), d);
			close(fd);
			fd = -1;
			t->rpos = t->rlen = 0;
		}
	}
	if (fd >= 0)
		close(fd);
	return NULL;
}

/* After the run: reads back every key whose last acknowledged write was fresh. */
static void *verify_thread(void *arg)
{
	struct thr *t = arg;
	int fd = connect_retry(now_ns() + 30000000000ull, false);
	if (fd < 0) {
		fprintf(stderr, "respload: verify: cannot connect\n");
		return NULL;
	}
	t->rpos = t->rlen = 0;
	uint32_t js[MAX_DEPTH];
	uint32_t j = 0;
	while (j < t->nkeys) {
		int n = 0;
		t->wlen = 0;
		for (; j < t->nkeys && n < 256; j++)
			if (t->acked[j]) {
				js[n++] = j;
				put_get(t, key_of(t, j));
			}
		if (!n)
			break;
		if (send_all(fd, t->wbuf, t->wlen) < 0)
			goto fail;
		for (int got = 0; got < n;) {
			char kind;
			const char *v = NULL;
			long vl = 0;
			if (!parse_reply(t, &kind, &v, &vl)) {
				if (fill_rbuf(t, fd, STALL_MS) <= 0)
					goto fail;
				continue;
			}
			uint32_t jj = js[got++];
			t->v_checked++;
			if (kind == '$' && vl < 0) {
				t->v_lost++;
			} else if (kind == '$') {
				uint32_t before = t->alt[jj];
				int cv = check_value(t, jj, v, vl);
				if (cv == 1)
					t->v_lost++;
				else if (cv == 2)
					t->corrupt++;
				else if (before && !t->alt[jj])
					t->v_uncertain_ok++;
			} else {
				t->v_lost++; /* an error reply: cannot confirm the write */
			}
		}
	}
	close(fd);
	return NULL;
fail:
	fprintf(stderr, "respload: verify: connection lost\n");
	close(fd);
	return NULL;
}

static void *reporter(void *arg)
{
	struct thr *ts = arg;
	uint64_t bns = (uint64_t)C.bucket_ms * 1000000ull;
	for (uint32_t b = 0; b < nbuckets && !atomic_load(&stop_flag); b++) {
		uint64_t due = t0_ns + (b + 1) * bns + 5000000ull; /* 5 ms grace */
		for (uint64_t now; (now = now_ns()) < due && !atomic_load(&stop_flag);) {
			uint64_t left = due - now;
			struct timespec s = {0, (long)(left < 20000000ull ? left : 20000000ull)};
			nanosleep(&s, NULL);
		}
		if (atomic_load(&stop_flag))
			break;
		uint64_t sum[B_N] = {0};
		for (int i = 0; i < C.conns; i++)
			for (int k = 0; k < B_N; k++)
				sum[k] += atomic_load_explicit(&ts[i].buckets[b * B_N + k], memory_order_relaxed);
		printf("{\"respload\":\"bucket\",\"b\":%u,\"get\":%lu,\"hit\":%lu,\"miss\":%lu,\"set\":%lu,"
		       "\"wr\":%lu,\"err\":%lu}\n",
		       b, sum[B_GET], sum[B_HIT], sum[B_MISS], sum[B_SET], sum[B_WR], sum[B_ERR]);
		fflush(stdout);
	}
	return NULL;
}

static int do_run(void)
{
	struct thr *ts = calloc((size_t)C.conns, sizeof *ts);
	nbuckets = (uint32_t)(C.duration * 1000 / C.bucket_ms) + 1;
	nslots = (uint32_t)(C.duration * 1000) + C.bucket_ms + 1;
	for (int i = 0; i < C.conns; i++) {
		struct thr *t = &ts[i];
		t->id = i;
		t->nkeys = (C.keys - (uint32_t)i + (uint32_t)C.conns - 1) / (uint32_t)C.conns;
		t->acked = calloc(t->nkeys, sizeof *t->acked);
		t->alt = calloc(t->nkeys, sizeof *t->alt);
		t->marked = calloc(t->nkeys, 1);
		t->rng = C.seed * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xD1B54A32D192ED03ull + 1;
		t->buckets = calloc((size_t)nbuckets * B_N, sizeof *t->buckets);
		t->slot_first = calloc(nslots, sizeof *t->slot_first);
		t->slot_last = calloc(nslots, sizeof *t->slot_last);
		t->wbuf = malloc((size_t)3 * MAX_DEPTH * (64 + (size_t)C.vsize));
		t->rcap = 1 << 16;
		t->rbuf = malloc(t->rcap);
		if (!t->acked || !t->alt || !t->marked || !t->buckets || !t->slot_first || !t->slot_last || !t->wbuf ||
		    !t->rbuf) {
			fprintf(stderr, "respload: out of memory\n");
			return 1;
		}
	}
	t0_ns = now_ns();
	for (int i = 0; i < C.conns; i++)
		pthread_create(&ts[i].th, NULL, run_thread, &ts[i]);
	pthread_t rep;
	pthread_create(&rep, NULL, reporter, ts);
	uint64_t end = t0_ns + (uint64_t)(C.duration * 1e9);
	while (!atomic_load(&stop_flag) && now_ns() < end) {
		struct timespec s = {0, 10000000};
		nanosleep(&s, NULL);
	}
	atomic_store(&stop_flag, true);
	uint64_t t_end = now_ns();
	for (int i = 0; i < C.conns; i++)
		pthread_join(ts[i].th, NULL);
	pthread_join(rep, NULL);
	uint32_t last_b = (uint32_t)((t_end - t0_ns) / ((uint64_t)C.bucket_ms * 1000000ull));
	if (last_b >= nbuckets)
		last_b = nbuckets - 1;
	if (C.verify) {
		for (int i = 0; i < C.conns; i++)
			pthread_create(&ts[i].th, NULL, verify_thread, &ts[i]);
		for (int i = 0; i < C.conns; i++)
			pthread_join(ts[i].th, NULL);
	}
	uint64_t lost_run = 0, corrupt = 0, reconn = 0, stalls = 0, vc = 0, vl = 0, vu = 0, uncertain = 0,
		 written = 0, marked = 0;
	for (int i = 0; i < C.conns; i++) {
		struct thr *t = &ts[i];
		lost_run += t->lost_run;
		corrupt += t->corrupt;
		reconn += t->reconnects;
		stalls += t->stalls;
		vc += t->v_checked;
		vl += t->v_lost;
		vu += t->v_uncertain_ok;
		for (uint32_t j = 0; j < t->nkeys; j++) {
			uncertain += t->alt[j] != 0;
			written += t->acked[j] != 0;
			marked += t->marked[j];
		}
	}
	printf("{\"respload\":\"summary\",\"t0_ns\":%lu,\"t_end_ns\":%lu,\"bucket_ms\":%d,\"keys\":%u,"
	       "\"conns\":%d,\"pipeline\":%d,\"write_pct\":%d,\"reconnects\":%lu,\"stalls\":%lu,"
	       "\"lost_run\":%lu,\"corrupt\":%lu,\"verify\":{\"done\":%s,\"checked\":%lu,\"lost\":%lu,"
	       "\"uncertain_applied\":%lu,\"uncertain_left\":%lu,\"keys_fresh\":%lu},"
	       "\"keys_written_between_marks\":%lu,\"buckets\":[",
	       t0_ns, t_end, C.bucket_ms, C.keys, C.conns, C.depth, C.write_pct, reconn, stalls, lost_run,
	       corrupt, C.verify ? "true" : "false", vc, vl, vu, uncertain, written, marked);
	for (uint32_t b = 0; b <= last_b; b++) {
		uint64_t sum[B_N] = {0};
		for (int i = 0; i < C.conns; i++)
			for (int k = 0; k < B_N; k++)
				sum[k] += atomic_load(&ts[i].buckets[b * B_N + k]);
		printf("%s[%lu,%lu,%lu,%lu,%lu,%lu]", b ? "," : "", sum[0], sum[1], sum[2], sum[3], sum[4], sum[5]);
	}
	printf("],\"gaps\":[");
	uint64_t prev_last = 0; /* us + 1 */
	int ngaps = 0;
	for (uint32_t s = 0; s < nslots; s++) {
		uint32_t f = 0, l = 0;
		for (int i = 0; i < C.conns; i++) {
			uint32_t a = ts[i].slot_first[s], z = ts[i].slot_last[s];
			if (a && (!f || a < f))
				f = a;
			if (z > l)
				l = z;
		}
		if (!f)
			continue;
		if (prev_last && f - prev_last >= GAP_MIN_US)
			printf("%s[%lu,%lu]", ngaps++ ? "," : "", t0_ns + (prev_last - 1) * 1000,
			       t0_ns + ((uint64_t)f - 1) * 1000);
		prev_last = l;
	}
	printf("],\"last_success_ns\":%lu}\n", prev_last ? t0_ns + (prev_last - 1) * 1000 : 0);
	fflush(stdout);
	return 0;
}

static int do_load(void)
{
	struct thr t = {.id = 0, .rcap = 1 << 20};
	size_t per = 1000;
	t.wbuf = malloc(per * (64 + (size_t)C.vsize));
	t.rbuf = malloc(t.rcap);
	uint64_t start = now_ns();
	int fd = connect_retry(start + 120000000000ull, false);
	if (fd < 0) {
		fprintf(stderr, "respload: load: cannot connect to %s:%d\n", C.host, C.port);
		return 1;
	}
	uint64_t t_conn = now_ns(), errors = 0;
	/* two chunks in flight: send chunk i+1 before reading chunk i's replies */
	size_t inflight[2] = {0, 0};
	int cur = 0;
	for (uint64_t k = 0; k < C.keys || inflight[0] || inflight[1];) {
		size_t n = 0;
		t.wlen = 0;
		for (; k < C.keys && n < per; k++, n++) {
			struct thr *tp = &t;
			char s[64];
			int m = snprintf(s, sizeof s, "*3\r\n$3\r\nSET\r\n$%d\r\nk:%08lu\r\n$%d\r\n", KEY_LEN, k, C.vsize);
			put(tp, s, (size_t)m);
			fmt_value(tp->wbuf + tp->wlen, (uint32_t)k, 0);
			tp->wlen += (size_t)C.vsize;
			put(tp, "\r\n", 2);
		}
		if (n && send_all(fd, t.wbuf, t.wlen) < 0)
			goto lost;
		inflight[cur] = n;
		cur ^= 1;
		/* read the older chunk's replies */
		for (size_t got = 0; got < inflight[cur];) {
			char kind;
			const char *v;
			long vl;
			if (!parse_reply(&t, &kind, &v, &vl)) {
				if (fill_rbuf(&t, fd, STALL_MS * 6) <= 0)
					goto lost;
				continue;
			}
			got++;
			if (kind != '+')
				errors++;
		}
		inflight[cur] = 0;
	}
	close(fd);
	uint64_t end = now_ns();
	printf("{\"respload\":\"loaded\",\"keys\":%u,\"value_size\":%d,\"errors\":%lu,\"connect_s\":%.3f,"
	       "\"load_s\":%.3f}\n",
	       C.keys, C.vsize, errors, (t_conn - start) / 1e9, (end - t_conn) / 1e9);
	return errors ? 1 : 0;
lost:
	fprintf(stderr, "respload: load: connection lost\n");
	return 1;
}

static void usage(void)
{
	fprintf(stderr, "usage: respload load|run --port P --keys N [--host H] [--value-size B] "
			"[--conns C] [--pipeline D] [--write-pct W] [--duration S] [--bucket-ms MS] "
			"[--no-verify] [--seed S]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		usage();
	const char *mode = argv[1];
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--no-verify")) {
			C.verify = false;
			continue;
		}
		if (!v)
			usage();
		i++;
		if (!strcmp(a, "--host"))
			C.host = v;
		else if (!strcmp(a, "--port"))
			C.port = atoi(v);
		else if (!strcmp(a, "--keys"))
			C.keys = (uint32_t)strtoul(v, NULL, 10);
		else if (!strcmp(a, "--value-size"))
			C.vsize = atoi(v);
		else if (!strcmp(a, "--conns"))
			C.conns = atoi(v);
		else if (!strcmp(a, "--pipeline"))
			C.depth = atoi(v);
		else if (!strcmp(a, "--write-pct"))
			C.write_pct = atoi(v);
		else if (!strcmp(a, "--duration"))
			C.duration = atof(v);
		else if (!strcmp(a, "--bucket-ms"))
			C.bucket_ms = atoi(v);
		else if (!strcmp(a, "--seed"))
			C.seed = strtoull(v, NULL, 10);
		else
			usage();
	}
	if (!C.port || !C.keys || C.keys > 99999999u || C.vsize < 32 || C.conns < 1 || C.conns > MAX_CONNS ||
	    C.depth < 1 || C.depth > MAX_DEPTH || C.keys < (uint32_t)C.conns || C.bucket_ms < 1 ||
	    C.duration <= 0)
		usage();
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (!strcmp(mode, "load"))
		return do_load();
	if (!strcmp(mode, "run"))
		return do_run();
	usage();
}
