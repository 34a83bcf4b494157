/* service - a small long-running server on the runtime, for the supervisor's
 * system tests.  It keeps a table of counters in an arena, beats from its
 * main loop, and answers one-line commands on a TCP socket: its own
 * (--port) or the supervisor's (LISTEN_FDS, fd 3).
 *
 *   service [--port N] [--entries N] [--fill-mb N] [--no-heartbeat]
 *           [--block interval|forever]
 *
 * --block: an idle server that blocks in poll between requests, for
 * rk_heartbeat_interval_ms() ("interval", as the README says to) or with no
 * timeout at all ("forever", what a port that ignores it does).
 *
 * Commands (one per line, one JSON line back):
 *   state            what this incarnation found and holds
 *   set I V          table[I] = V, inside an unsafe region
 *   segv | abort     fault (the runtime restarts in place)
 *   kill             SIGKILL itself (only the supervisor can restart it)
 *   segv-nohandler   die of SIGSEGV with no handler running
 *   exit N           exit with status N
 *   hang             stop beating and spin
 *   hang-masked      the same with every signal blocked
 *   exec-fail-hang   a restart whose exec fails (the binary loses its
 *                    execute permission for it), then hang
 *   leak MB          malloc and touch MB of private memory
 *   unsafe-kill      SIGKILL inside an unsafe region
 *   unsafe-segv      SIGSEGV inside an unsafe region
 *   corrupt-kill     flip a byte of the arena header, then SIGKILL
 *   nowarm-kill      rk_set_warm_allowed(false), then SIGKILL
 *   restart          rk_restart("app: rejuvenation")
 *   sess N           sessions.logins = N, inside an unsafe region of the
 *                    "sessions" arena (opened RK_ARENA_INDEPENDENT)
 *   sess-unsafe-kill SIGKILL inside an unsafe region of "sessions"
 *   sess-unsafe-segv SIGSEGV inside an unsafe region of "sessions"
 *   hook-drop-segv   a failure hook that drops "sessions" (safe as it is)
 *                    and reports what rk_component_is_safe said; then SIGSEGV
 *   hook-cold-segv   a failure hook that returns false; then SIGSEGV
 * On start it prints the same state line on stdout ({"app":"state",...}). */
#include "rekindle.h"
#include "../../runtime/src/rk_internal.h"
#include "line_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

struct table {
	uint64_t n;
	uint64_t sets; /* "set" commands applied, across incarnations */
	uint64_t fill_mb;
	unsigned char **fill; /* 1 MiB objects */
	uint64_t v[];
};

static rk_arena *arena;
static struct table *tab;
/* A second, independent component: dropping it never touches the table. */
struct sessions {
	uint64_t logins;
};
static rk_arena *sess_arena;
static struct sessions *sess;
static bool sess_preserved;
static int verified = 1; /* contents as expected after a warm start */
static int beating = 1;
static volatile int *volatile null_ptr;
static void *volatile leaked;

static uint64_t initial_value(uint64_t i)
{
	return i * 2654435761u + 7;
}

static struct table *build(uint64_t n, uint64_t fill_mb)
{
	struct table *t = rk_alloc(arena, sizeof *t + n * sizeof t->v[0]);
	if (!t)
		return NULL;
	t->n = n;
	t->sets = 0;
	t->fill_mb = fill_mb;
	for (uint64_t i = 0; i < n; i++)
		t->v[i] = initial_value(i);
	t->fill = fill_mb ? rk_calloc(arena, fill_mb, sizeof *t->fill) : NULL;
	for (uint64_t i = 0; i < fill_mb; i++) {
		if (!(t->fill[i] = rk_alloc(arena, 1u << 20)))
			return NULL;
		memset(t->fill[i], (int)(i & 0xff) | 1, 1u << 20);
	}
	return t;
}

/* Marks what the table reaches and checks the fill pattern (values may have
 * been changed by "set", so only their count is checked). */
static int recover(struct table *t)
{
	if (!t || rk_mark(arena, t) < 0)
		return 0;
	if (t->fill && rk_mark(arena, t->fill) < 0)
		return 0;
	for (uint64_t i = 0; t->fill && i < t->fill_mb; i++)
		if (rk_mark(arena, t->fill[i]) < 0 || t->fill[i][4095] != ((i & 0xff) | 1))
			return 0;
	return 1;
}

static int state_json(char *buf, size_t cap)
{
	const struct rk_restart_info *in = rk_restart_info();
	static const char *kinds[] = {"fresh", "warm", "cold"};
	uint64_t sum = 0;
	for (uint64_t i = 0; tab && i < tab->n; i++)
		sum += tab->v[i];
	return snprintf(buf, cap,
			"{\"app\":\"state\",\"pid\":%d,\"generation\":%u,\"kind\":\"%s\",\"verified\":%s,"
			"\"entries\":%llu,\"sets\":%llu,\"sum\":%llu,\"table\":\"%p\",\"reason\":\"%s\","
			"\"decision\":\"%s\",\"restart_us\":%llu,\"preserved_bytes\":%llu,\"supervised\":%s,"
			"\"sessions_preserved\":%s,\"logins\":%llu,\"arenas_dropped\":%u,\"heartbeat_interval_ms\":%d,\"listen_fds\":%d}\n",
			getpid(), in->generation, kinds[in->kind], verified ? "true" : "false",
			(unsigned long long)(tab ? tab->n : 0), (unsigned long long)(tab ? tab->sets : 0),
			(unsigned long long)sum, (void *)tab, in->reason, in->decision,
			(unsigned long long)(in->restart_ns / 1000), (unsigned long long)in->preserved_bytes,
			rk_is_supervised() ? "true" : "false", sess_preserved ? "true" : "false",
			(unsigned long long)(sess ? sess->logins : 0), in->arenas_dropped, rk_heartbeat_interval_ms(),
			rk_listen_fds());
}

static void die_by_sigkill(void)
{
	fflush(stdout);
	raise(SIGKILL);
}

static bool hook_drop_sessions(int sig, void *ctx)
{
	(void)sig;
	(void)ctx;
	/* sessions is safe here (no region open): drop it anyway, by choice */
	if (rk_component_is_safe(sess_arena) && rk_component_is_safe(arena))
		rk_component_drop(sess_arena);
	return true;
}

static bool hook_go_cold(int sig, void *ctx)
{
	(void)sig;
	(void)ctx;
	return false;
}

/* Runs one command; writes the reply into out. */
static void command(char *line, char *out, size_t cap)
{
	unsigned long long a = 0, b = 0;
	snprintf(out, cap, "{\"ok\":true}\n");
	if (!strcmp(line, "state")) {
		state_json(out, cap);
	} else if (sscanf(line, "set %llu %llu", &a, &b) == 2 && tab && a < tab->n) {
		rk_unsafe_begin(arena);
		tab->v[a] = b;
		tab->sets++;
		rk_unsafe_end(arena);
	} else if (!strcmp(line, "segv")) {
		*null_ptr = 1;
	} else if (!strcmp(line, "abort")) {
		abort();
	} else if (!strcmp(line, "kill")) {
		die_by_sigkill();
	} else if (!strcmp(line, "segv-nohandler")) {
		signal(SIGSEGV, SIG_DFL);
		*null_ptr = 1;
	} else if (sscanf(line, "exit %llu", &a) == 1) {
		exit((int)a);
	} else if (!strcmp(line, "hang")) {
		beating = 0;
	} else if (!strcmp(line, "exec-fail-hang")) {
		/* run a copy of the binary for this one: it is chmodded */
		char self[4096];
		ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
		if (n > 0 && (self[n] = 0, chmod(self, 0644) == 0)) {
			int r = rk_restart("app: an exec that fails");
			if (chmod(self, 0755) < 0)
				perror("service: chmod back");
			fprintf(stderr, "service: rk_restart returned %d\n", r);
		}
		beating = 0;
	} else if (!strcmp(line, "hang-masked")) {
		/* a hang the restart signal cannot reach: only SIGKILL ends it */
		sigset_t all;
		sigfillset(&all);
		sigprocmask(SIG_BLOCK, &all, NULL);
		beating = 0;
	} else if (sscanf(line, "leak %llu", &a) == 1) {
		char *p = malloc(a << 20);
		if (p)
			memset(p, 1, a << 20);
		leaked = p; /* kept, or the compiler drops the malloc */
	} else if (!strcmp(line, "unsafe-kill")) {
		rk_unsafe_begin(arena);
		tab->v[0]++;
		die_by_sigkill();
	} else if (!strcmp(line, "unsafe-segv")) {
		rk_unsafe_begin(arena);
		tab->v[0]++;
		*null_ptr = 1;
	} else if (!strcmp(line, "corrupt-kill")) {
		arena->hdr->name[RK_NAME_MAX - 1] ^= 0x5a;
		die_by_sigkill();
	} else if (!strcmp(line, "nowarm-kill")) {
		rk_set_warm_allowed(false);
		die_by_sigkill();
	} else if (!strcmp(line, "restart")) {
		rk_restart("app: rejuvenation");
	} else if (sscanf(line, "sess %llu", &a) == 1) {
		rk_unsafe_begin(sess_arena);
		sess->logins = a;
		rk_unsafe_end(sess_arena);
	} else if (!strcmp(line, "sess-unsafe-kill")) {
		rk_unsafe_begin(sess_arena);
		sess->logins++;
		die_by_sigkill();
	} else if (!strcmp(line, "sess-unsafe-segv")) {
		rk_unsafe_begin(sess_arena);
		sess->logins++;
		*null_ptr = 1;
	} else if (!strcmp(line, "hook-drop-segv")) {
		rk_set_failure_hook(hook_drop_sessions, NULL);
		*null_ptr = 1;
	} else if (!strcmp(line, "hook-cold-segv")) {
		rk_set_failure_hook(hook_go_cold, NULL);
		*null_ptr = 1;
	} else {
		snprintf(out, cap, "{\"ok\":false,\"error\":\"unknown command\"}\n");
	}
}

static int listen_socket(unsigned port)
{
	if (rk_listen_fds() >= 1)
		return 3; /* handed over by the supervisor: already bound and listening */
	if (!port)
		return -1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(fd, 64) < 0) {
		perror("service: bind");
		exit(3);
	}
	return fd;
}

static void tick(void)
{
	if (beating)
		rk_heartbeat();
	else
		for (;;) /* "hang": a busy loop that never beats */
			;
}

int main(int argc, char **argv)
{
	enum { BLOCK_NO, BLOCK_INTERVAL, BLOCK_FOREVER } block = BLOCK_NO;
	unsigned port = 0;
	uint64_t entries = 1000, fill_mb = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--port") && i + 1 < argc)
			port = (unsigned)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--entries") && i + 1 < argc)
			entries = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--fill-mb") && i + 1 < argc)
			fill_mb = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--no-heartbeat"))
			beating = 0;
		else if (!strcmp(argv[i], "--block") && i + 1 < argc && !strcmp(argv[i + 1], "interval"))
			block = BLOCK_INTERVAL, i++;
		else if (!strcmp(argv[i], "--block") && i + 1 < argc && !strcmp(argv[i + 1], "forever"))
			block = BLOCK_FOREVER, i++;
		else {
			fprintf(stderr, "usage: service [--port N] [--entries N] [--fill-mb N] [--no-heartbeat] "
					"[--block interval|forever]\n");
			return 2;
		}
	}
	int heartbeat = beating;
	int r = rk_init(argc, argv, NULL);
	if (r < 0) {
		fprintf(stderr, "service: rk_init: %s\n", strerror(-r));
		return 3;
	}
	arena = rk_arena_open("table", (64ull << 20) + entries * 8 + fill_mb * (2ull << 20));
	if (!arena) {
		fprintf(stderr, "service: rk_arena_open: %s\n", strerror(errno));
		return 3;
	}
	sess_arena = rk_arena_open_flags("sessions", 4ull << 20, RK_ARENA_INDEPENDENT);
	if (!sess_arena) {
		fprintf(stderr, "service: rk_arena_open_flags: %s\n", strerror(errno));
		return 3;
	}
	sess_preserved = rk_arena_preserved(sess_arena);
	if (sess_preserved) {
		sess = rk_root_get(sess_arena, "sessions");
		rk_mark(sess_arena, sess);
	} else {
		sess = rk_calloc(sess_arena, 1, sizeof *sess);
		rk_root_set(sess_arena, "sessions", sess);
	}
	if (rk_is_recovery()) {
		tab = rk_root_get(arena, "table");
		verified = recover(tab) && tab->n == entries;
		rk_finish_recovery(true, NULL);
	}
	if (!rk_is_recovery() && !tab) {
		tab = build(entries, fill_mb);
		if (!tab) {
			fprintf(stderr, "service: out of arena memory\n");
			return 3;
		}
		rk_root_set(arena, "table", tab);
	}
	int lfd = listen_socket(port);
	rk_ready();
	char line[1024];
	state_json(line, sizeof line);
	fputs(line, stdout);
	fflush(stdout);
	beating = heartbeat;
	if (block == BLOCK_INTERVAL)
		line_server_poll_ms = rk_heartbeat_interval_ms();
	else if (block == BLOCK_FOREVER)
		line_server_poll_ms = -1;
	if (lfd < 0) {
		for (;;) {
			if (beating)
				rk_heartbeat();
			usleep(10000);
		}
	}
	line_server_run(lfd, command, tick);
}
