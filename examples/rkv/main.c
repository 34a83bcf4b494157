/* main.c - rkv's options, listening socket, epoll loop, connections and
 * cron (active expiry, periodic BGSAVE, reaping the save child).
 *
 *   rkv [--port N] [--bind ADDR] [--dir PATH] [--dbfilename NAME]
 *       [--save "SECONDS CHANGES ..."] [--maxmemory BYTES]
 *       [--enable-debug yes|no|local] [--arena-size BYTES]
 *       [--durability none|async|sync]
 *
 * Connections and their buffers are transient: plain malloc, gone with the
 * process.  Only the keyspace is preserved (keyspace.c, rekindle_glue.c). */
#include "rkv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK (16 * 1024)
#define OUT_PAUSE (4u << 20)        /* stop reading a client whose replies pile up */
#define MAX_QUERY (1024ull << 20)   /* Redis: client-query-buffer-limit */
#define INPUT_SHRINK_MIN (32u << 10) /* Redis: PROTO_RESIZE_THRESHOLD */
#define INPUT_BIG (1u << 20)        /* freed as soon as all of it is consumed */
#define INPUT_IDLE_MS 2000          /* Redis: a query buffer idle over 2 s shrinks */
#define CRON_MS 100                 /* Redis hz 10 */
#define RESERVED_FDS 32             /* Redis: fds kept for the process itself, not for clients */
/* The runtime reserves 16 TiB of address space for all arenas; one takes
 * its size rounded up to 2 MiB, and a guard page. */
#define ARENA_SIZE_MAX ((16ull << 40) - (2ull << 20))

struct server srv;
static volatile sig_atomic_t stop_signal;
static int epfd;
static char listen_tag; /* epoll data.ptr of the listening socket */
static char durable_tag; /* epoll data.ptr of rk_durable_fd() (--durability) */
static bool listen_paused; /* not polled until the next cron tick */
static int spare_fd = -1; /* let go to accept and refuse a client when out of fds */
static uint64_t next_client_id = 1;
static struct conn *conns_head, *conns_tail; /* cron walks them from the head */

/* ---- time, log ---------------------------------------------------------- */

int64_t now_realtime_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec * 1000ll + ts.tv_nsec / 1000000;
}

double mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

const char *js(const char *s)
{
	static char bufs[4][512];
	static int k;
	char *out = bufs[k++ & 3];
	size_t n = 0;
	out[n++] = '"';
	for (; *s && n < sizeof bufs[0] - 8; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			n += (size_t)snprintf(out + n, 8, "\\%c", ch);
		else if (ch < 0x20)
			n += (size_t)snprintf(out + n, 8, "\\u%04x", ch);
		else
			out[n++] = (char)ch;
	}
	out[n++] = '"';
	out[n] = 0;
	return out;
}

void rkv_log(const char *event, const char *fmt, ...)
{
	char line[2048];
	int n = snprintf(line, sizeof line, "{\"rkv\":\"%s\",\"pid\":%d,\"t_ms\":%lld", event, (int)getpid(),
			 (long long)now_realtime_ms());
	if (fmt && *fmt && n < (int)sizeof line - 2) {
		line[n++] = ',';
		va_list ap;
		va_start(ap, fmt);
		int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
		va_end(ap);
		n = m < 0 ? n : n + m;
	}
	if (n > (int)sizeof line - 3)
		n = (int)sizeof line - 3;
	line[n++] = '}';
	line[n++] = '\n';
	/* one write per line: lines of concurrent writers do not interleave */
	if (write(STDERR_FILENO, line, (size_t)n) < 0)
		return;
}

/* ---- options ------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f, "usage: rkv [options]\n"
		   "  --port N                 TCP port (default 6379)\n"
		   "  --bind ADDR              address to listen on (default 127.0.0.1)\n"
		   "  --dir PATH               snapshot directory (default .)\n"
		   "  --dbfilename NAME        snapshot file name (default rkv.snap)\n"
		   "  --save \"SEC CHANGES ...\" BGSAVE after SEC seconds and CHANGES changes;\n"
		   "                           --save SEC means one change; --save \"\" disables\n"
		   "                           (default \"3600 1 300 100 60 10000\")\n"
		   "  --maxmemory BYTES        refuse writes above this (100mb, 1gb; 0 = no limit)\n"
		   "  --enable-debug yes|no|local  allow DEBUG (default no)\n"
		   "  --arena-size BYTES       address space reserved for the keyspace (default 16gb)\n"
		   "  --maxclients N           most clients at once (default 10000; lowered to fit\n"
		   "                           the open file limit less 32)\n"
		   "  --recovery-sweep yes|no  after a warm restart, mark and sweep before serving (yes), or\n"
		   "                           serve at once and check the table in the background (no,\n"
		   "                           default; the crashed request's objects leak)\n"
		   "  --recovery-check-cpu P   after a warm restart, check the table with P%% of the CPU\n"
		   "                           while clients are waiting (default 2; all of it when idle)\n"
		   "  --prefault yes|no        after a warm restart, fault the keyspace in from a thread\n"
		   "                           (default no: with huge pages there is little to fault)\n"
		   "  --hugepages yes|no       keep the keyspace in huge pages where the kernel allows it,\n"
		   "                           so a warm restart maps it again at once (default yes)\n"
		   "  --durability MODE        none: SAVE/BGSAVE write rkv.snap (default); async: they are\n"
		   "                           Rekindle checkpoints (needs `rekindle run --snapshot-dir`);\n"
		   "                           sync: as async, and each reply waits until the state it\n"
		   "                           may depend on is in a durable snapshot (group commit)\n"
		   "  --sync-via snapshots|redo  with --durability sync: make writes durable by snapshots\n"
		   "                           (default), or by records of them in Rekindle's redo log\n"
		   "                           (one append and one fdatasync per group; a restore replays\n"
		   "                           the records after its snapshot)\n"
		   "  --help, --version\n"
		   "Under `rekindle run --listen`, the socket in $LISTEN_FDS is used instead of --port.\n");
}

/* Redis's memtoull: k=1000, kb=1024, m, mb, g, gb.  0 or a BYTES_ error. */
int parse_bytes(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!*s || *s == '-')
		return BYTES_NOT_A_NUMBER;
	unsigned long long v = strtoull(s, &end, 10);
	if (end == s)
		return BYTES_NOT_A_NUMBER;
	if (errno == ERANGE)
		return BYTES_TOO_LARGE;
	static const struct {
		const char *suffix;
		unsigned long long mul;
	} units[] = {{"", 1},     {"b", 1},      {"k", 1000},     {"kb", 1024},
		     {"m", 1000000}, {"mb", 1 << 20}, {"g", 1000000000}, {"gb", 1 << 30}};
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
		if (!strcasecmp(end, units[i].suffix)) {
			if (v > ULLONG_MAX / units[i].mul)
				return BYTES_TOO_LARGE;
			*out = v * units[i].mul;
			return 0;
		}
	return BYTES_UNKNOWN_UNIT;
}

int parse_save(const char *s, struct config *cf)
{
	struct config tmp = *cf;
	tmp.nsave = 0;
	while (*s) {
		char *end;
		while (*s == ' ')
			s++;
		if (!*s)
			break;
		if (tmp.nsave == (int)(sizeof tmp.save / sizeof tmp.save[0]))
			return -E2BIG;
		long sec = strtol(s, &end, 10), ch = 1;
		if (end == s || sec < 0 || (*end && *end != ' '))
			return -EINVAL;
		s = end;
		while (*s == ' ')
			s++;
		if (*s) {
			ch = strtol(s, &end, 10);
			if (end == s || ch < 0 || (*end && *end != ' '))
				return -EINVAL;
			s = end;
		}
		tmp.save[tmp.nsave].seconds = sec;
		tmp.save[tmp.nsave++].changes = ch;
	}
	*cf = tmp;
	return 0;
}

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "rkv: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, " (try --help)\n");
	va_end(ap);
	exit(1);
}

/* Exits saying why parse_bytes refused value r for option opt. */
static void die_bytes(const char *opt, const char *v, int r)
{
	char *unit;
	errno = 0;
	(void)strtoull(v, &unit, 10);
	if (r == BYTES_UNKNOWN_UNIT)
		die_usage("bad %s '%s': unknown unit '%s' (expected b, k, kb, m, mb, g or gb)", opt, v, unit);
	if (r == BYTES_TOO_LARGE)
		die_usage("bad %s '%s': more than 2^64 bytes", opt, v);
	die_usage("bad %s '%s': expected bytes like 100mb or 1gb", opt, v);
}

static void parse_options(int argc, char **argv, struct config *cf)
{
	*cf = (struct config){.port = 6379, .bind = "127.0.0.1", .dir = ".", .dbfilename = "rkv.snap",
			      .arena_size = 16ull << 30, .maxclients = 10000, .hugepages = true,
			      .recovery_check_cpu = 2};
	parse_save("3600 1 300 100 60 10000", cf);
	for (int i = 1; i < argc; i++) {
		const char *o = argv[i];
		if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
			usage(stdout);
			exit(0);
		}
		if (!strcmp(o, "--version") || !strcmp(o, "-v")) {
			printf("rkv v=%s\n", RKV_VERSION);
			exit(0);
		}
		static const char *const with_value[] = {"--port",      "--bind",       "--dir",
							 "--dbfilename", "--save",      "--maxmemory",
							 "--enable-debug", "--arena-size", "--recovery-sweep",
							 "--maxclients", "--hugepages", "--recovery-check-cpu",
							 "--prefault", "--durability", "--sync-via"};
		bool known = false;
		for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
			known |= !strcmp(o, with_value[k]);
		if (!known)
			die_usage("unknown option '%s'", o);
		if (i + 1 >= argc)
			die_usage("option '%s' needs a value", o);
		const char *v = argv[++i];
		char *end;
		if (!strcmp(o, "--port")) {
			long p = strtol(v, &end, 10);
			if (*end || end == v || p < 1 || p > 65535)
				die_usage("bad --port '%s': expected 1..65535", v);
			cf->port = (int)p;
		} else if (!strcmp(o, "--bind")) {
			if (strlen(v) >= sizeof cf->bind)
				die_usage("bad --bind '%s'", v);
			strcpy(cf->bind, v);
		} else if (!strcmp(o, "--dir")) {
			struct stat st;
			if (strlen(v) >= sizeof cf->dir || stat(v, &st) < 0 || !S_ISDIR(st.st_mode))
				die_usage("bad --dir '%s': not a directory", v);
			strcpy(cf->dir, v);
		} else if (!strcmp(o, "--dbfilename")) {
			if (!*v || strchr(v, '/') || strlen(v) >= sizeof cf->dbfilename)
				die_usage("bad --dbfilename '%s': a file name, without '/'", v);
			strcpy(cf->dbfilename, v);
		} else if (!strcmp(o, "--save")) {
			if (parse_save(v, cf) < 0)
				die_usage("bad --save '%s': expected \"SECONDS [CHANGES] ...\" or \"\"", v);
		} else if (!strcmp(o, "--maxmemory")) {
			int r = parse_bytes(v, &cf->maxmemory);
			if (r < 0)
				die_bytes(o, v, r);
		} else if (!strcmp(o, "--arena-size")) {
			int r = parse_bytes(v, &cf->arena_size);
			if (r < 0)
				die_bytes(o, v, r);
			if (cf->arena_size < (1u << 20))
				die_usage("bad --arena-size '%s': expected at least 1mb", v);
			if (cf->arena_size > ARENA_SIZE_MAX)
				die_usage("bad --arena-size '%s': more than the 16 TiB of address space Rekindle reserves "
					  "for arenas (at most %llu bytes: 16 TiB less 2 MiB)",
					  v, ARENA_SIZE_MAX);
		} else if (!strcmp(o, "--maxclients")) {
			long n = strtol(v, &end, 10);
			if (*end || end == v || n < 1 || n > 10000000)
				die_usage("bad --maxclients '%s': expected 1..10000000", v);
			cf->maxclients = (unsigned)n;
		} else if (!strcmp(o, "--recovery-sweep")) {
			if (strcmp(v, "yes") && strcmp(v, "no"))
				die_usage("bad --recovery-sweep '%s': expected yes or no", v);
			cf->recovery_sweep = !strcmp(v, "yes");
		} else if (!strcmp(o, "--recovery-check-cpu")) {
			long n = strtol(v, &end, 10);
			if (*end || end == v || n < 1 || n > 100)
				die_usage("bad --recovery-check-cpu '%s': expected a percent, 1..100", v);
			cf->recovery_check_cpu = (unsigned)n;
		} else if (!strcmp(o, "--prefault")) {
			if (strcmp(v, "yes") && strcmp(v, "no"))
				die_usage("bad --prefault '%s': expected yes or no", v);
			cf->prefault = !strcmp(v, "yes");
		} else if (!strcmp(o, "--durability")) {
			if (!strcmp(v, "none"))
				cf->durability = DUR_NONE;
			else if (!strcmp(v, "async"))
				cf->durability = DUR_ASYNC;
			else if (!strcmp(v, "sync"))
				cf->durability = DUR_SYNC;
			else
				die_usage("bad --durability '%s': expected none, async or sync", v);
		} else if (!strcmp(o, "--sync-via")) {
			if (!strcmp(v, "redo"))
				cf->sync_redo = true;
			else if (!strcmp(v, "snapshots"))
				cf->sync_redo = false;
			else
				die_usage("bad --sync-via '%s': expected snapshots or redo", v);
		} else if (!strcmp(o, "--hugepages")) {
			if (strcmp(v, "yes") && strcmp(v, "no"))
				die_usage("bad --hugepages '%s': expected yes or no", v);
			cf->hugepages = !strcmp(v, "yes");
		} else if (!strcmp(o, "--enable-debug")) {
			if (!strcmp(v, "yes"))
				cf->enable_debug = 1;
			else if (!strcmp(v, "local"))
				cf->enable_debug = 2;
			else if (!strcmp(v, "no"))
				cf->enable_debug = 0;
			else
				die_usage("bad --enable-debug '%s': expected yes, no or local", v);
		}
	}
	if (cf->sync_redo && cf->durability != DUR_SYNC)
		die_usage("--sync-via redo needs --durability sync");
}

/* ---- listening socket --------------------------------------------------- */

/* The supervisor's socket (systemd convention: fd 3), or our own bind. */
static int open_listener(void)
{
	const char *lf = getenv("LISTEN_FDS"), *lp = getenv("LISTEN_PID");
	if (lf && lp && atoi(lf) >= 1 && atoi(lp) == getpid()) {
		srv.listen_inherited = true;
		int fl = fcntl(3, F_GETFL);
		if (fl < 0 || fcntl(3, F_SETFL, fl | O_NONBLOCK) < 0)
			return -errno;
		return 3;
	}
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV};
	struct addrinfo *ai;
	char port[8];
	snprintf(port, sizeof port, "%d", srv.cfg.port);
	int r = getaddrinfo(srv.cfg.bind, port, &hints, &ai);
	if (r != 0) {
		rkv_log("error", "\"what\":\"bind address\",\"error\":%s", js(gai_strerror(r)));
		return -EINVAL;
	}
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
	if (fd < 0) {
		freeaddrinfo(ai);
		return -errno;
	}
	/* SO_REUSEADDR: a warm restart binds again at once, whatever state the
	 * previous incarnation's connections are in. */
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
		goto fail;
	/* The old incarnation's socket is closed by the exec; allow a moment in
	 * case a straggler (a forked child) still holds it. */
	for (int tries = 0; bind(fd, ai->ai_addr, ai->ai_addrlen) < 0; tries++) {
		struct timespec ts = {0, 10 * 1000 * 1000};
		if (errno != EADDRINUSE || tries == 100)
			goto fail;
		nanosleep(&ts, NULL);
	}
	if (listen(fd, 511) < 0)
		goto fail;
	freeaddrinfo(ai);
	return fd;
fail:;
	int err = errno;
	freeaddrinfo(ai);
	close(fd);
	return -err;
}

/* ---- connections -------------------------------------------------------- */

static void conn_events(struct conn *c)
{
	uint32_t ev = (c->reading ? EPOLLIN : 0) | (conn_sendable_end(c) > c->opos ? EPOLLOUT : 0);
	struct epoll_event e = {.events = ev, .data.ptr = c};
	if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &e) < 0)
		c->closing = true;
}

static void conns_link_tail(struct conn *c)
{
	c->next = NULL;
	c->prev = conns_tail;
	if (conns_tail)
		conns_tail->next = c;
	else
		conns_head = c;
	conns_tail = c;
}

static void conns_unlink(struct conn *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		conns_head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		conns_tail = c->prev;
	c->prev = c->next = NULL;
}

static void conn_free(struct conn *c)
{
	conns_unlink(c);
	durability_forget(c);
	close(c->fd); /* also removes it from the epoll set */
	free(c->ibuf);
	free(c->obuf);
	free(c->argoff);
	free(c->arglen);
	free(c->argv);
	free(c->name);
	free(c);
	srv.clients--;
}

/* A flood of one event must not flood the log: one line per second per
 * code at most; quiet counts the events not logged since the last line. */
struct log_limit {
	int64_t last_ms;
	int last_code;
	uint64_t quiet;
};

static bool log_allowed(struct log_limit *l, int code)
{
	if (code == l->last_code && srv.now_ms - l->last_ms < 1000) {
		l->quiet++;
		return false;
	}
	l->last_code = code;
	l->last_ms = srv.now_ms;
	return true;
}

/* Redis's answer to a client over maxclients, then close. */
static void refuse_client(int fd)
{
	static const char msg[] = "-ERR max number of clients reached\r\n";
	static struct log_limit limit;
	if (write(fd, msg, sizeof msg - 1) != (ssize_t)sizeof msg - 1) {
		/* a new socket takes 37 bytes; if not, the client is gone anyway */
	}
	close(fd);
	srv.rejected_connections++;
	if (log_allowed(&limit, 0)) {
		rkv_log("client_refused",
			"\"why\":\"max number of clients reached\",\"maxclients\":%u,\"not_logged\":%llu",
			srv.cfg.maxclients, (unsigned long long)limit.quiet);
		limit.quiet = 0;
	}
}

/* The listening socket stays readable while clients wait, so a failing
 * accept retried at once would spin: it is left out of epoll until the
 * next cron tick. */
static void pause_listener(void)
{
	struct epoll_event e = {.events = 0, .data.ptr = &listen_tag};
	if (listen_paused)
		return;
	if (epoll_ctl(epfd, EPOLL_CTL_MOD, srv.listen_fd, &e) < 0)
		rkv_log("error", "\"what\":\"pause the listener\",\"error\":%s", js(strerror(errno)));
	else
		listen_paused = true;
}

static void resume_listener(void)
{
	struct epoll_event e = {.events = EPOLLIN, .data.ptr = &listen_tag};
	if (!listen_paused)
		return;
	if (epoll_ctl(epfd, EPOLL_CTL_MOD, srv.listen_fd, &e) < 0)
		rkv_log("error", "\"what\":\"resume the listener\",\"error\":%s", js(strerror(errno)));
	else
		listen_paused = false;
}

/* accept failed with err (not EAGAIN and the like).  Out of fds (EMFILE,
 * ENFILE), the spare fd is let go for one accept, to refuse that client
 * with Redis's error instead of leaving it waiting; true: accept again.
 * Otherwise, or without a spare, the listener pauses. */
static bool accept_failed(int lfd, int err)
{
	static struct log_limit limit;
	if (log_allowed(&limit, err)) {
		rkv_log("accept_failed", "\"error\":%s,\"errno\":%d,\"not_logged\":%llu", js(strerror(err)), err,
			(unsigned long long)limit.quiet);
		limit.quiet = 0;
	}
	if ((err == EMFILE || err == ENFILE) && spare_fd >= 0) {
		close(spare_fd);
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		int accept_err = errno;
		if (fd >= 0)
			refuse_client(fd);
		spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (spare_fd >= 0 && (fd >= 0 || accept_err == EAGAIN || accept_err == EWOULDBLOCK))
			return fd >= 0; /* refused one, or none was waiting */
	}
	pause_listener();
	return false;
}

static void accept_clients(int lfd)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			int err = errno;
			if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED)
				return;
			if (accept_failed(lfd, err))
				continue;
			return;
		}
		if (srv.clients >= srv.cfg.maxclients) {
			refuse_client(fd);
			continue;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* fails harmlessly on unix sockets */
		struct conn *c = calloc(1, sizeof *c);
		struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
		if (!c || epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
			free(c);
			close(fd);
			continue;
		}
		c->fd = fd;
		c->id = next_client_id++;
		c->last_read_ms = srv.now_ms;
		conns_link_tail(c);
		c->bulk_len = -1;
		c->proto = 2;
		c->reading = true;
		srv.clients++;
		srv.st.connections++;
	}
}

/* Where the bytes still needed begin: the request being read, if any. */
static size_t input_base(const struct conn *c)
{
	return c->mb_left > 0 ? c->req_start : c->ipos;
}

/* Moves the bytes still needed to the start of the buffer. */
static void input_compact(struct conn *c)
{
	size_t base = input_base(c);
	if (base == 0)
		return;
	memmove(c->ibuf, c->ibuf + base, c->ilen - base);
	for (size_t i = 0; i < c->argc; i++)
		c->argoff[i] -= base;
	c->ilen -= base;
	c->ipos -= base;
	c->req_start -= base;
}

/* Bytes the buffer must keep: what it holds unparsed, or the whole bulk
 * being read. */
static size_t input_needed(const struct conn *c)
{
	size_t base = input_base(c), held = c->ilen - base;
	if (c->mb_left > 0 && c->bulk_len >= 0) {
		size_t bulk_end = c->ipos - base + (size_t)c->bulk_len + 2;
		return bulk_end > held ? bulk_end : held;
	}
	return held;
}

static void input_free(struct conn *c)
{
	free(c->ibuf);
	c->ibuf = NULL;
	c->icap = c->ilen = c->ipos = c->req_start = 0;
}

/* Redis's clientsCronResizeQueryBuffer: a buffer over 32 KB shrinks when its
 * connection has been idle for 2 s, or when it is more than twice the peak
 * use since cron last looked; never below what is still needed.  An empty
 * one is freed: a new one is 16 KB away. */
static void input_cron(struct conn *c)
{
	size_t need = input_needed(c);
	bool idle = srv.now_ms - c->last_read_ms >= INPUT_IDLE_MS;
	if (c->icap > INPUT_SHRINK_MIN && (idle || c->icap / 2 > c->ipeak)) {
		size_t to = idle || need > c->ipeak ? need : c->ipeak;
		if (need == 0) {
			input_free(c);
		} else if (to < c->icap) {
			input_compact(c);
			char *p = realloc(c->ibuf, to);
			if (p) { /* a shrink that fails keeps the old buffer */
				c->ibuf = p;
				c->icap = to;
			}
		}
	}
	c->ipeak = need;
}

/* Like Redis's clientsCron: max(5, clients / 10) connections a tick, so each
 * is looked at once a second; the one at the head moves to the tail. */
static void clients_cron(void)
{
	uint64_t n = srv.clients / (1000 / CRON_MS);
	n = n < 5 ? 5 : n;
	n = n > srv.clients ? srv.clients : n;
	for (; n && conns_head; n--) {
		struct conn *c = conns_head;
		conns_unlink(c);
		conns_link_tail(c);
		input_cron(c);
	}
}

/* Sends what is queued and not held; false if the connection is gone. */
static bool conn_flush(struct conn *c)
{
	size_t end = conn_sendable_end(c);
	while (c->opos < end) {
		ssize_t n = write(c->fd, c->obuf + c->opos, end - c->opos);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0)
			return false;
		c->opos += (size_t)n;
	}
	if (c->opos == c->olen) {
		c->opos = c->olen = 0;
		/* a large reply's buffer is not kept for the connection's life */
		if (c->ocap > (1u << 20)) {
			free(c->obuf);
			c->obuf = NULL;
			c->ocap = 0;
		}
		if (c->close_after_reply)
			return false;
	}
	return !c->closing;
}

/* Runs every complete request in the buffer, then writes the replies once. */
static void conn_process(struct conn *c)
{
	while (!c->close_after_reply && !c->closing) {
		if (c->olen - c->opos > OUT_PAUSE)
			break; /* the client does not read its replies: wait */
		int r = resp_parse(c);
		if (r != PARSE_COMMAND)
			break;
		uint64_t dirty = srv.db->dirty;
		size_t reply_start = c->olen;
		const struct command *cmd = command_exec(c);
		durability_after_command(c, cmd, dirty, reply_start);
		resp_done(c);
	}
	/* A big request's buffer is not kept for the connection's life (Redis
	 * hands such a buffer over to the value it holds). */
	if (c->icap > INPUT_BIG && input_needed(c) == 0)
		input_free(c);
	if (!conn_flush(c)) {
		conn_free(c);
		return;
	}
	/* after the flush: a reply the socket took whole (the client reading
	 * as fast as it is written) leaves nothing to wait for, and no
	 * EPOLLOUT would come to read again */
	bool paused = c->olen - c->opos > OUT_PAUSE;
	bool reading = !paused && !c->close_after_reply;
	bool want_out = conn_sendable_end(c) > c->opos;
	if (reading != c->reading || want_out) {
		c->reading = reading;
		conn_events(c);
	}
}

/* Makes room to read: drops consumed bytes, grows for a big bulk. */
static bool conn_make_room(struct conn *c)
{
	size_t base = input_base(c);
	if (base > 0 && (base == c->ilen || base >= c->icap / 2 || c->icap - c->ilen < READ_CHUNK))
		input_compact(c);
	size_t need = READ_CHUNK;
	if (c->mb_left > 0 && c->bulk_len >= 0 && c->ilen - c->ipos < (size_t)c->bulk_len + 2)
		need = (size_t)c->bulk_len + 2 - (c->ilen - c->ipos); /* the whole bulk in one go */
	if (c->icap - c->ilen >= need)
		return true;
	size_t cap = c->icap ? c->icap : READ_CHUNK;
	while (cap - c->ilen < need)
		cap *= 2;
	if (cap > MAX_QUERY + READ_CHUNK) {
		rkv_log("client_closed", "\"client\":%llu,\"why\":\"query buffer limit\"", (unsigned long long)c->id);
		return false;
	}
	char *p = realloc(c->ibuf, cap);
	if (!p)
		return false;
	c->ibuf = p;
	c->icap = cap;
	return true;
}

static void conn_readable(struct conn *c)
{
	if (!conn_make_room(c)) {
		conn_free(c);
		return;
	}
	ssize_t n = read(c->fd, c->ibuf + c->ilen, c->icap - c->ilen);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n <= 0) {
		conn_free(c);
		return;
	}
	c->ilen += (size_t)n;
	c->last_read_ms = srv.now_ms;
	if (c->ilen > c->ipeak)
		c->ipeak = c->ilen;
	conn_process(c);
}

static void conn_writable(struct conn *c)
{
	if (!conn_flush(c)) {
		conn_free(c);
		return;
	}
	if (conn_sendable_end(c) > c->opos)
		return;
	/* drained: requests may be waiting in the buffer already */
	c->reading = !c->close_after_reply;
	conn_events(c);
	conn_process(c);
}

void conn_release(struct conn *c)
{
	if (!conn_flush(c)) {
		conn_free(c);
		return;
	}
	if (conn_sendable_end(c) > c->opos) {
		conn_events(c); /* the rest when the socket takes it */
		return;
	}
	/* drained: a client paused for its pile of replies reads again */
	c->reading = !c->close_after_reply;
	conn_events(c);
	conn_process(c);
}

/* ---- cron --------------------------------------------------------------- */

static void cron(void)
{
	struct db *db = srv.db;
	resume_listener();
	clients_cron();
	ks_active_expire(db, srv.now_ms, 25000); /* at most 25% of a 100 ms tick */
	glue_hugepages_rescan();
	snapshot_reap(db);
	if (srv.cfg.durability != DUR_NONE)
		return; /* Rekindle's snapshots, not save points */
	int64_t now_s = srv.now_ms / 1000;
	if (db->bgsave_pid || (!db->bgsave_ok && now_s - db->bgsave_try_s < 5))
		return; /* after a failed save, retry in 5 s like Redis */
	for (int i = 0; i < srv.cfg.nsave; i++) {
		const struct save_point *sp = &srv.cfg.save[i];
		if (db->dirty >= (uint64_t)sp->changes && now_s - db->last_save_s >= sp->seconds && db->dirty > 0) {
			rkv_log("periodic_save", "\"seconds\":%ld,\"changes\":%ld", sp->seconds, sp->changes);
			int r = snapshot_bgsave(db);
			if (r < 0) {
				db->bgsave_ok = 0;
				rkv_log("bgsave_failed", "\"error\":%s", js(strerror(-r)));
			}
			break;
		}
	}
}

static void on_stop(int sig)
{
	stop_signal = sig;
}

static void shutdown_now(void)
{
	bool save = srv.cfg.nsave > 0 || srv.cfg.durability != DUR_NONE;
	srv.stopping = true;
	int r = save ? durable_save() : 0;
	rkv_log("shutdown", "\"signal\":%d,\"saved\":%s", (int)stop_signal, save && r == 0 ? "true" : "false");
	exit(r < 0 ? 1 : 0);
}

/* SAVE's work, the way --durability says: rkv.snap, or a checkpoint
 * waited for (at most 30 s); 0 or -errno. */
int durable_save(void)
{
	if (srv.cfg.durability == DUR_NONE)
		return snapshot_save(srv.db);
	uint64_t e = durability_checkpoint();
	if (!e)
		return -EIO;
	if (!durability_wait(e, 30000)) {
		rkv_log("error", "\"what\":\"checkpoint\",\"epoch\":%llu,\"error\":\"not durable within 30 s\"",
			(unsigned long long)e);
		return -ETIMEDOUT;
	}
	return 0;
}

/* ---- main --------------------------------------------------------------- */

static void raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max; /* 10000 clients need more than 1024 */
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			rkv_log("warning", "\"what\":\"setrlimit\",\"error\":%s", js(strerror(errno)));
	}
}

/* A snapshot rkv could not load must survive: the next save would replace
 * it with the (empty) keyspace.  One whose content can never load (torn,
 * corrupt, not a regular file) is moved aside and rkv starts empty; if it
 * cannot be moved, rkv refuses to start.  One that could not be read now
 * (no permission, an I/O error, out of fds or memory) or does not fit the
 * keyspace may be fine: rkv refuses to start and leaves it where it is, as
 * Redis does.  code is the stable reason. */
static void snapshot_unusable(const char *path, int r, const char *why, int err)
{
	const char *code = r == SNAP_CORRUPT	   ? "corrupt"
			   : r == SNAP_NOT_REGULAR ? "not_regular"
			   : r == SNAP_NO_ROOM	   ? "no_room"
						   : "unreadable";
	if (r == SNAP_UNREADABLE) {
		rkv_log("snapshot_rejected",
			"\"path\":%s,\"code\":\"%s\",\"why\":%s,\"errno\":%d,\"action\":\"refusing to start\"", js(path),
			code, js(why), err);
		fprintf(stderr, "rkv: cannot read the snapshot %s: %s (errno %d); refusing to start, so that no save "
				"replaces it (the file is left as it is)\n", path, why, err);
		exit(1);
	}
	if (r == SNAP_NO_ROOM) {
		rkv_log("snapshot_rejected",
			"\"path\":%s,\"code\":\"%s\",\"why\":%s,\"arena_size\":%llu,\"action\":\"refusing to start\"",
			js(path), code, js(why), (unsigned long long)srv.cfg.arena_size);
		fprintf(stderr, "rkv: the snapshot %s does not fit the keyspace: %s; raise --arena-size (now %llu "
				"bytes); refusing to start, so that no save replaces it (the file is left as it is)\n",
			path, why, (unsigned long long)srv.cfg.arena_size);
		exit(1);
	}
	char kept[4600];
	int e = snapshot_set_aside(kept, sizeof kept);
	if (e == 0) {
		rkv_log("snapshot_rejected",
			"\"path\":%s,\"code\":\"%s\",\"why\":%s,\"kept_as\":%s,\"action\":\"starting empty\"", js(path),
			code, js(why), js(kept));
		return;
	}
	rkv_log("snapshot_rejected",
		"\"path\":%s,\"code\":\"%s\",\"why\":%s,\"action\":\"refusing to start\",\"set_aside_error\":%s", js(path),
		code, js(why), js(strerror(-e)));
	fprintf(stderr, "rkv: cannot load the snapshot %s (%s) nor move it aside (%s); "
			"refusing to start, so that no save replaces it\n", path, why, strerror(-e));
	exit(1);
}

/* Like Redis: clients may use the open file limit less RESERVED_FDS (the
 * runtime's, the listener, epoll, the snapshot, the spare); maxclients is
 * lowered to fit, with a warning.  A limit that leaves no room is fatal. */
static void fit_maxclients(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
		rkv_log("warning", "\"what\":\"getrlimit\",\"error\":%s", js(strerror(errno)));
		return;
	}
	if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (rlim_t)srv.cfg.maxclients + RESERVED_FDS)
		return;
	unsigned long long limit = (unsigned long long)rl.rlim_cur;
	if (limit <= RESERVED_FDS) {
		rkv_log("error", "\"what\":\"maxclients\",\"fd_limit\":%llu,\"reserved_fds\":%d", limit, RESERVED_FDS);
		fprintf(stderr, "rkv: the open file limit (ulimit -n) of %llu leaves no room for clients; "
				"raise it to at least %d\n", limit, RESERVED_FDS + 1);
		exit(1);
	}
	rkv_log("warning",
		"\"what\":\"maxclients\",\"requested\":%u,\"maxclients\":%llu,\"fd_limit\":%llu,\"reserved_fds\":%d,"
		"\"why\":\"lowered to fit the open file limit (ulimit -n)\"",
		srv.cfg.maxclients, limit - RESERVED_FDS, limit, RESERVED_FDS);
	srv.cfg.maxclients = (unsigned)(limit - RESERVED_FDS);
}

/* The keyspace after a start of any kind: the preserved one if warm, else
 * a new one filled from the snapshot. */
static uint64_t open_keyspace(void)
{
	uint64_t freed_objects = 0, freed_bytes = 0, keys = 0;
	srv.db = glue_recover(srv.cfg.recovery_sweep, &freed_objects, &freed_bytes);
	if (srv.db) {
		rkv_log("recovered", "\"keys\":%llu,\"expires\":%llu,\"swept_objects\":%llu,\"swept_bytes\":%llu",
			(unsigned long long)srv.db->count, (unsigned long long)srv.db->expires,
			(unsigned long long)freed_objects, (unsigned long long)freed_bytes);
		durability_replay(); /* a start from a snapshot: the writes logged after it */
		return srv.db->count;
	}
	srv.db = ks_create();
	if (!srv.db) {
		rkv_log("error", "\"what\":\"keyspace\",\"error\":%s", js(strerror(errno)));
		exit(1);
	}
	const char *why = "";
	char path[4400];
	snapshot_path(path, sizeof path);
	srv.loading = true;
	int err = 0;
	int r = snapshot_load(srv.db, &keys, &why, &err);
	srv.loading = false;
	if (r != SNAP_OK)
		snapshot_unusable(path, r, why, err);
	else
		rkv_log("snapshot", "\"path\":%s,\"result\":%s", js(path), js(why));
	glue_publish(srv.db);
	/* a start from a snapshot taken before the keyspace existed: its
	 * records build it from empty */
	durability_replay();
	return srv.db->count;
}

int main(int argc, char **argv)
{
	double t0 = mono_ms();
	/* Options first: parsing has no side effects, and --help or a bad
	 * option should not print the runtime's start event. */
	parse_options(argc, argv, &srv.cfg);
	int r = glue_init(argc, argv, srv.cfg.arena_size);
	if (r < 0) {
		fprintf(stderr, "rkv: cannot set up the keyspace arena: %s\n", strerror(-r));
		return 1;
	}
	durability_init(); /* before listening: a mode it cannot serve is refused at once */
	srv.start_ms = now_realtime_ms();
	srv.start_kind = glue_start_kind();
	srv.generation = glue_generation();
	ssize_t n = readlink("/proc/self/exe", srv.exe, sizeof srv.exe - 1);
	srv.exe[n > 0 ? n : 0] = 0;
	signal(SIGPIPE, SIG_IGN);
	struct sigaction sa = {.sa_handler = on_stop}; /* no SA_RESTART: epoll_wait returns */
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	raise_fd_limit();
	fit_maxclients();
	spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (spare_fd < 0)
		rkv_log("warning", "\"what\":\"spare fd\",\"error\":%s", js(strerror(errno)));
	commands_init();

	/* Listen before loading: clients queue in the backlog meanwhile. */
	srv.listen_fd = open_listener();
	if (srv.listen_fd < 0) {
		rkv_log("error", "\"what\":\"listen\",\"port\":%d,\"error\":%s", srv.cfg.port,
			js(strerror(-srv.listen_fd)));
		return 1;
	}
	uint64_t keys = open_keyspace();
	epfd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event le = {.events = EPOLLIN, .data.ptr = &listen_tag};
	struct epoll_event de = {.events = EPOLLIN, .data.ptr = &durable_tag};
	struct epoll_event re = {.events = EPOLLIN, .data.ptr = &durable_tag};
	if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, srv.listen_fd, &le) < 0 ||
	    (durability_fd() >= 0 && epoll_ctl(epfd, EPOLL_CTL_ADD, durability_fd(), &de) < 0) ||
	    (durability_redo_fd() >= 0 && epoll_ctl(epfd, EPOLL_CTL_ADD, durability_redo_fd(), &re) < 0)) {
		rkv_log("error", "\"what\":\"epoll\",\"error\":%s", js(strerror(errno)));
		return 1;
	}
	glue_ready();
	rkv_log("ready",
		"\"start\":\"%s\",\"keys\":%llu,\"ready_ms\":%.3f,\"generation\":%u,\"reason\":%s,\"port\":%d,"
		"\"listen\":\"%s\"",
		srv.start_kind, (unsigned long long)keys, mono_ms() - t0, srv.generation, js(glue_reason()),
		srv.cfg.port, srv.listen_inherited ? "inherited" : "bound");

	struct epoll_event ev[1024];
	int64_t next_cron = 0;
	bool verifying = true, collapsing = true, durable_ready = false;
	for (;;) {
		glue_heartbeat(); /* a safe point: no request is half-done here */
		int64_t gather_ns = durability_wait_ns();
		struct timespec wait = {.tv_sec = CRON_MS / 1000, .tv_nsec = (CRON_MS % 1000) * 1000000l};
		if (verifying || collapsing)
			wait = (struct timespec){0};
		else if (gather_ns >= 0)
			wait = (struct timespec){.tv_sec = gather_ns / 1000000000, .tv_nsec = gather_ns % 1000000000};
		int nev = epoll_pwait2(epfd, ev, 1024, &wait, NULL);
		if (nev < 0 && errno != EINTR) {
			rkv_log("error", "\"what\":\"epoll_wait\",\"error\":%s", js(strerror(errno)));
			return 1;
		}
		if (stop_signal)
			shutdown_now();
		srv.now_ms = now_realtime_ms();
		/* After a warm restart, a slice of the table's check, before any
		 * request: the first may have waited in the backlog meanwhile. */
		verifying = glue_verify_step(srv.db, nev > 0);
		collapsing = glue_hugepages_step();
		for (int i = 0; i < nev; i++) {
			if (ev[i].data.ptr == &listen_tag) {
				accept_clients(srv.listen_fd);
				continue;
			}
			if (ev[i].data.ptr == &durable_tag) {
				durable_ready = true; /* after the batch: it may free conns the batch names */
				continue;
			}
			struct conn *c = ev[i].data.ptr;
			/* EPOLLOUT first: a freed conn is never touched after */
			if (ev[i].events & EPOLLOUT)
				conn_writable(c);
			else if (ev[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
				conn_readable(c);
		}
		if (srv.now_ms >= next_cron) {
			cron();
			next_cron = srv.now_ms + CRON_MS;
		}
		if (durable_ready)
			durability_advanced();
		durable_ready = false;
		durability_tick(); /* one checkpoint for every reply held meanwhile */
	}
}
