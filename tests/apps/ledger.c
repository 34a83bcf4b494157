/* ledger - a small server whose default recovery is a journal, for the
 * cross-check tests.  Its state, an array of counters, lives in the "ledger"
 * arena; every change is appended to the journal before it is applied, so a
 * cold start (and the cross-check's validator) rebuilds the same state by
 * replaying the journal.
 *
 *   ledger --port N|LISTEN_FDS --journal PATH [--entries N] [--crosscheck]
 *          [--check-delay-ms N]
 *
 * Commands (one per line, one line back):
 *   get I            {"v":V}
 *   set I V          journal "I V", then v[I] = V in an unsafe region
 *   corrupt I V      v[I] = V without the journal: a silent corruption
 *   segv             fault outside any unsafe region (warm restart)
 *   state            {"app":"state",...} with the cross-check state
 * --check-delay-ms makes the validator's recovery slow, so that tests can
 * write while a check runs. */
#include "rekindle.h"
#include "line_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct ledger {
	uint64_t n;
	uint64_t built_ns; /* environment-dependent: ignored by the comparison */
	uint64_t v[];
};

static rk_arena *arena;
static struct ledger *led;
static int journal_fd = -1;
static const char *journal_path;
static unsigned check_delay_ms;
static volatile int *volatile null_ptr;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The app's default recovery: zeros, then the first len bytes of the journal. */
static struct ledger *rebuild(rk_arena *a, uint64_t n, off_t len)
{
	FILE *f = fopen(journal_path, "r");
	if (!f && len > 0)
		return NULL; /* the journal is gone: no state to vouch for */
	struct ledger *l = rk_alloc(a, sizeof *l + n * 8);
	if (!l) {
		if (f)
			fclose(f);
		return NULL;
	}
	rk_unsafe_begin(a);
	l->n = n;
	l->built_ns = now_ns();
	memset(l->v, 0, n * 8);
	char line[64];
	off_t used = 0;
	while (f && used < len && fgets(line, sizeof line, f)) {
		used += (off_t)strlen(line);
		unsigned long long i, v;
		if (used <= len && sscanf(line, "%llu %llu", &i, &v) == 2 && i < n)
			l->v[i] = v;
	}
	if (f)
		fclose(f);
	rk_unsafe_end(a);
	return l;
}

struct check_ctx {
	uint64_t n;
	off_t journal_len; /* the journal at the failure: S_r must match that moment */
};

static void *recover_for_check(rk_arena *scratch, void *ctx)
{
	struct check_ctx *c = ctx;
	if (check_delay_ms)
		usleep(check_delay_ms * 1000u);
	return rebuild(scratch, c->n, c->journal_len);
}

static bool compare_ledgers(const void *preserved, const void *recovered, char *why, size_t cap, void *ctx)
{
	(void)ctx;
	const struct ledger *a = preserved, *b = recovered;
	if (a->n != b->n) {
		snprintf(why, cap, "entries: preserved %llu, recovered %llu", (unsigned long long)a->n,
			 (unsigned long long)b->n);
		return false;
	}
	for (uint64_t i = 0; i < a->n; i++)
		if (a->v[i] != b->v[i]) {
			snprintf(why, cap, "v[%llu]: preserved %llu, recovered %llu", (unsigned long long)i,
				 (unsigned long long)a->v[i], (unsigned long long)b->v[i]);
			return false;
		}
	return true;
}

static void state_json(char *out, size_t cap)
{
	static const char *kinds[] = {"fresh", "warm", "cold"};
	static const char *cc[] = {"none", "running", "match", "mismatch", "failed"};
	const struct rk_restart_info *in = rk_restart_info();
	snprintf(out, cap,
		 "{\"app\":\"state\",\"pid\":%d,\"generation\":%u,\"kind\":\"%s\",\"crosscheck\":\"%s\","
		 "\"ledger\":\"%p\",\"reason\":\"%s\",\"decision\":\"%s\"}\n",
		 getpid(), in->generation, kinds[in->kind], cc[rk_crosscheck_state()], (void *)led, in->reason,
		 in->decision);
}

static void command(char *line, char *out, size_t cap)
{
	unsigned long long i = 0, v = 0;
	snprintf(out, cap, "{\"ok\":true}\n");
	if (sscanf(line, "get %llu", &i) == 1 && i < led->n) {
		snprintf(out, cap, "{\"v\":%llu}\n", (unsigned long long)led->v[i]);
	} else if (sscanf(line, "set %llu %llu", &i, &v) == 2 && i < led->n) {
		char rec[64];
		int len = snprintf(rec, sizeof rec, "%llu %llu\n", i, v);
		if (write(journal_fd, rec, (size_t)len) != len) {
			snprintf(out, cap, "{\"ok\":false,\"error\":\"journal: %s\"}\n", strerror(errno));
			return;
		}
		rk_unsafe_begin(arena);
		led->v[i] = v;
		rk_unsafe_end(arena);
	} else if (sscanf(line, "corrupt %llu %llu", &i, &v) == 2 && i < led->n) {
		led->v[i] = v;
	} else if (!strcmp(line, "segv")) {
		*null_ptr = 1;
	} else if (!strcmp(line, "state")) {
		state_json(out, cap);
	} else {
		snprintf(out, cap, "{\"ok\":false,\"error\":\"bad command\"}\n");
	}
}

static int listen_on(unsigned port)
{
	const char *lf = getenv("LISTEN_FDS"), *lp = getenv("LISTEN_PID");
	if (lf && atoi(lf) >= 1 && lp && atoi(lp) == getpid())
		return 3; /* the supervisor's listening socket */
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
	    bind(fd, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(fd, 64) < 0) {
		perror("ledger: listen");
		exit(3);
	}
	return fd;
}

static void tick(void)
{
	rk_heartbeat();
}

int main(int argc, char **argv)
{
	unsigned port = 0;
	uint64_t entries = 100000;
	bool crosscheck = false;
	for (int k = 1; k < argc; k++) {
		if (!strcmp(argv[k], "--port") && k + 1 < argc)
			port = (unsigned)strtoul(argv[++k], NULL, 10);
		else if (!strcmp(argv[k], "--journal") && k + 1 < argc)
			journal_path = argv[++k];
		else if (!strcmp(argv[k], "--entries") && k + 1 < argc)
			entries = strtoull(argv[++k], NULL, 10);
		else if (!strcmp(argv[k], "--crosscheck"))
			crosscheck = true;
		else if (!strcmp(argv[k], "--check-delay-ms") && k + 1 < argc)
			check_delay_ms = (unsigned)strtoul(argv[++k], NULL, 10);
		else {
			fprintf(stderr, "usage: ledger --port N --journal PATH [--entries N] [--crosscheck] "
					"[--check-delay-ms N]\n");
			return 2;
		}
	}
	if ((!port && !getenv("LISTEN_FDS")) || !journal_path) {
		fprintf(stderr, "ledger: --port (or LISTEN_FDS) and --journal are required\n");
		return 2;
	}
	int r = rk_init(argc, argv, NULL);
	if (r < 0) {
		fprintf(stderr, "ledger: rk_init: %s\n", strerror(-r));
		return 3;
	}
	journal_fd = open(journal_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	arena = rk_arena_open("ledger", (64ull << 20) + entries * 8);
	if (journal_fd < 0 || !arena) {
		fprintf(stderr, "ledger: %s\n", strerror(errno));
		return 3;
	}
	struct stat st;
	static struct check_ctx ctx;
	ctx.n = entries;
	ctx.journal_len = fstat(journal_fd, &st) == 0 ? st.st_size : 0;
	if (rk_is_recovery()) {
		led = rk_root_get(arena, "ledger");
		rk_mark(arena, led);
		rk_finish_recovery(true, NULL);
	}
	if (!led) {
		led = rebuild(arena, entries, ctx.journal_len);
		rk_root_set(arena, "ledger", led);
	}
	if (crosscheck) {
		struct rk_crosscheck cc = {.root = "ledger",
					   .recover = recover_for_check,
					   .compare = compare_ledgers,
					   .ctx = &ctx};
		r = rk_crosscheck_start(arena, &cc);
		if (r < 0)
			fprintf(stderr, "ledger: rk_crosscheck_start: %s\n", strerror(-r));
	}
	int lfd = listen_on(port);
	rk_ready();
	line_server_run(lfd, command, tick);
}
