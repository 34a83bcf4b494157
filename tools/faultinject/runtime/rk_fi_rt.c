/* The fault injector's run-time side, linked into every instrumented
 * program.  At startup it reads the environment once:
 *   REKINDLE_FAULT=<hash>:<index>[,<hash>:<index>...]
 *                                   the site(s) to arm (up to RK_FI_MAX_ARMED;
 *                                   PHOENIX arms ten instructions a run)
 *   REKINDLE_FAULT_AFTER=<n>[,<n>...]  let each site run clean n times first
 *                                   (one count for all, or one per site)
 *   REKINDLE_FAULT_ARM_SIGNAL=<signo>  the sites stay off (and their
 *                                   executions uncounted) until the process
 *                                   gets this signal: PHOENIX's "signal the
 *                                   application to switch" (§4.4)
 *   REKINDLE_FAULT_MODE=persistent|transient  act every time from then on
 *                                   (default) or only once
 *   REKINDLE_FAULT_TRACE=<path>     count every site's executions ("%p" in
 *                                   the path becomes the pid)
 *   REKINDLE_FAULT_LOG_FD=<fd>      where the "fired" line goes (default 2)
 * A bad value stops the program before main with a reason code, exit 2.
 *
 * Tracing keeps the counters in a file mapped MAP_SHARED (<path>.counts),
 * so they survive a crash or SIGKILL; a normal exit also writes <path>: one
 * "<site id> <count>" line per executed site.  tools/faultinject/
 * rekindle-fi-trace reads the counters file after a crash. */
#define _GNU_SOURCE
#include "rekindle_fi.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define TRACE_MAGIC "RKFITRC1"

/* One module's record in the counters file, at a page-aligned offset. */
struct trace_record {
	char magic[8];
	uint64_t hash;
	uint32_t nsites;
	uint32_t reserved;
	uint64_t counts[];
};

enum mode { MODE_PERSISTENT, MODE_TRANSIENT };

#define RK_FI_MAX_ARMED 16

/* One site REKINDLE_FAULT names. */
struct armed_site {
	uint64_t hash;
	uint64_t index;
	uint64_t after;
	struct rk_fi_module *target; /* the module holding it */
	uint64_t executions;
	int fired;
};

static struct {
	int parsed;
	int armed;            /* how many sites REKINDLE_FAULT names */
	struct armed_site sites[RK_FI_MAX_ARMED];
	enum mode mode;
	int arm_signal;       /* 0: live from the start */
	int live;             /* the sites act (set by the arming signal) */
	int log_fd;
	const char *trace;    /* REKINDLE_FAULT_TRACE, %p expanded */
	char trace_path[4096];
	int trace_fd;
	off_t trace_size;
	struct rk_fi_module *modules;
} st = {.log_fd = 2, .trace_fd = -1};

static const char *const type_names[RK_FI_NTYPES] = {
#define RK_FI_NAME(n, s) [n] = s,
	RK_FI_TYPES(RK_FI_NAME)
#undef RK_FI_NAME
};

__attribute__((noreturn, format(printf, 2, 3))) static void die(const char *reason, const char *fmt, ...);

static void die(const char *reason, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	dprintf(2, "rekindle-fault: error reason=%s: %s\n", reason, msg);
	_exit(2);
}

static int parse_u64(const char *s, int base, uint64_t *out)
{
	char *end;
	if (*s == '\0' || *s == '-' || *s == '+' || *s == ' ')
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, base);
	if (errno || *end != '\0')
		return -EINVAL;
	*out = v;
	return 0;
}

/* "<16 hex digits>:<decimal index>", as the sites list prints ids. */
static void parse_site(const char *v, struct armed_site *a)
{
	const char *colon = strchr(v, ':');
	char hex[17];
	if (!colon || colon - v != 16)
		die("bad_site_id", "REKINDLE_FAULT: '%s' is not <16 hex digits>:<index>", v);
	memcpy(hex, v, 16);
	hex[16] = '\0';
	for (int i = 0; i < 16; i++)
		if (!strchr("0123456789abcdef", hex[i]))
			die("bad_site_id", "REKINDLE_FAULT: '%s' is not <16 hex digits>:<index>", v);
	if (parse_u64(hex, 16, &a->hash) || parse_u64(colon + 1, 10, &a->index))
		die("bad_site_id", "REKINDLE_FAULT: '%s' is not <16 hex digits>:<index>", v);
}

/* Splits a comma-separated list into its items (at most max, each shorter
 * than 64 bytes), calling item(text, i) for each; returns how many.  An
 * empty item, too many, or too long: die(reason). */
static int split_list(const char *var, const char *v, int max, const char *reason,
		      void (*item)(const char *text, int i))
{
	int n = 0;
	for (const char *p = v;; n++) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char buf[64];
		if (n >= max)
			die(reason, "%s='%s' has more than %d items", var, v, max);
		if (len == 0 || len >= sizeof buf)
			die(reason, "%s='%s' has an empty or overlong item", var, v);
		memcpy(buf, p, len);
		buf[len] = '\0';
		item(buf, n);
		if (!end)
			return n + 1;
		p = end + 1;
	}
}

static void fault_item(const char *text, int i)
{
	parse_site(text, &st.sites[i]);
	for (int j = 0; j < i; j++)
		if (st.sites[j].hash == st.sites[i].hash && st.sites[j].index == st.sites[i].index)
			die("bad_site_id", "REKINDLE_FAULT names %s twice", text);
}

static void after_item(const char *text, int i)
{
	if (parse_u64(text, 10, &st.sites[i].after))
		die("bad_after", "REKINDLE_FAULT_AFTER: '%s' is not a count", text);
}

static void expand_trace_path(const char *v)
{
	size_t o = 0;
	for (const char *p = v; *p; p++) {
		int n;
		if (p[0] == '%' && p[1] == 'p') {
			n = snprintf(st.trace_path + o, sizeof st.trace_path - o, "%d", (int)getpid());
			p++;
		} else {
			n = snprintf(st.trace_path + o, sizeof st.trace_path - o, "%c", *p);
		}
		if (n < 0 || (size_t)n >= sizeof st.trace_path - o)
			die("bad_trace_path", "REKINDLE_FAULT_TRACE is longer than %zu bytes", sizeof st.trace_path);
		o += (size_t)n;
	}
	st.trace = st.trace_path;
}

static void open_trace(void)
{
	char counts[sizeof st.trace_path + 8];
	snprintf(counts, sizeof counts, "%s.counts", st.trace);
	st.trace_fd = open(counts, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (st.trace_fd < 0)
		die("trace_open_failed", "cannot open '%s': %s", counts, strerror(errno));
}

static void on_arm_signal(int sig)
{
	(void)sig;
	__atomic_store_n(&st.live, 1, __ATOMIC_RELAXED);
}

static void parse_arm_signal(const char *v)
{
	uint64_t n;
	if (!st.armed)
		die("arm_signal_without_fault", "REKINDLE_FAULT_ARM_SIGNAL is set but REKINDLE_FAULT is not");
	if (parse_u64(v, 10, &n) || n == 0 || n > (uint64_t)SIGRTMAX || n == SIGKILL || n == SIGSTOP)
		die("bad_arm_signal", "REKINDLE_FAULT_ARM_SIGNAL='%s' is not a signal number that can be caught", v);
	struct sigaction sa = {.sa_handler = on_arm_signal, .sa_flags = SA_RESTART};
	sigemptyset(&sa.sa_mask);
	if (sigaction((int)n, &sa, NULL) < 0)
		die("bad_arm_signal", "REKINDLE_FAULT_ARM_SIGNAL=%s: sigaction: %s", v, strerror(errno));
	st.arm_signal = (int)n;
}

static void parse_env(void)
{
	const char *v;
	uint64_t n;
	st.parsed = 1;
	if ((v = getenv("REKINDLE_FAULT")) && *v)
		st.armed = split_list("REKINDLE_FAULT", v, RK_FI_MAX_ARMED, "bad_site_id", fault_item);
	if ((v = getenv("REKINDLE_FAULT_AFTER"))) {
		if (!st.armed)
			die("after_without_fault", "REKINDLE_FAULT_AFTER is set but REKINDLE_FAULT is not");
		int n = split_list("REKINDLE_FAULT_AFTER", v, RK_FI_MAX_ARMED, "bad_after", after_item);
		if (n == 1)
			for (int i = 1; i < st.armed; i++)
				st.sites[i].after = st.sites[0].after;
		else if (n != st.armed)
			die("bad_after", "REKINDLE_FAULT_AFTER has %d counts for %d sites (give one, or one per site)",
			    n, st.armed);
	}
	if ((v = getenv("REKINDLE_FAULT_ARM_SIGNAL")))
		parse_arm_signal(v);
	st.live = st.arm_signal == 0;
	if ((v = getenv("REKINDLE_FAULT_MODE"))) {
		if (!st.armed)
			die("mode_without_fault", "REKINDLE_FAULT_MODE is set but REKINDLE_FAULT is not");
		if (strcmp(v, "persistent") == 0)
			st.mode = MODE_PERSISTENT;
		else if (strcmp(v, "transient") == 0)
			st.mode = MODE_TRANSIENT;
		else
			die("bad_mode", "REKINDLE_FAULT_MODE='%s' is neither persistent nor transient", v);
	}
	if ((v = getenv("REKINDLE_FAULT_LOG_FD"))) {
		if (parse_u64(v, 10, &n) || n > 1u << 20 || fcntl((int)n, F_GETFD) < 0)
			die("bad_log_fd", "REKINDLE_FAULT_LOG_FD='%s' is not an open file descriptor", v);
		st.log_fd = (int)n;
	}
	if ((v = getenv("REKINDLE_FAULT_TRACE"))) {
		if (!*v)
			die("bad_trace_path", "REKINDLE_FAULT_TRACE is empty");
		expand_trace_path(v);
		open_trace();
	}
}

/* Gives m its record in the counters file and opens all its sites. */
static void trace_module(struct rk_fi_module *m)
{
	long page = sysconf(_SC_PAGESIZE);
	size_t bytes = sizeof(struct trace_record) + (size_t)m->nsites * sizeof(uint64_t);
	size_t len = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
	off_t at = st.trace_size;
	if (ftruncate(st.trace_fd, at + (off_t)len) < 0)
		die("trace_write_failed", "cannot grow the counters file: %s", strerror(errno));
	struct trace_record *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, st.trace_fd, at);
	if (r == MAP_FAILED)
		die("trace_write_failed", "cannot map the counters file: %s", strerror(errno));
	st.trace_size = at + (off_t)len;
	r->hash = m->hash;
	r->nsites = m->nsites;
	memcpy(r->magic, TRACE_MAGIC, 8); /* last: a reader skips a half-made record */
	m->counts = r->counts;
	memset(m->site_on, 1, m->nsites);
	for (uint32_t i = 0; i < m->nsites; i++)
		m->fn_on[m->site_fn[i]] = 1;
}

void __rk_fi_register(struct rk_fi_module *m)
{
	if (!st.parsed)
		parse_env();
	if (m->abi != RK_FI_ABI)
		die("abi_mismatch", "module %s was built for injector ABI %u, this runtime is %u", m->source,
		    (unsigned)m->abi, RK_FI_ABI);
	m->next = st.modules;
	st.modules = m;
	if (st.trace_fd >= 0)
		trace_module(m);
	for (int i = 0; i < st.armed; i++) {
		struct armed_site *a = &st.sites[i];
		if (m->hash != a->hash)
			continue;
		if (a->index >= m->nsites)
			die("unknown_site", "REKINDLE_FAULT: %016llx:%llu: module %s has %u sites",
			    (unsigned long long)a->hash, (unsigned long long)a->index, m->source, (unsigned)m->nsites);
		a->target = m;
		m->site_on[a->index] = 1;
		m->fn_on[m->site_fn[a->index]] = 1;
	}
}

static void report_fired(struct rk_fi_module *m, uint32_t site)
{
	char line[160];
	uint8_t t = m->site_type[site];
	int n = snprintf(line, sizeof line, "rekindle-fault: fired site=%016llx:%u type=%s\n",
			 (unsigned long long)m->hash, (unsigned)site, t < RK_FI_NTYPES ? type_names[t] : "unknown");
	if (n > 0 && write(st.log_fd, line, (size_t)n) < 0) {
		/* nowhere left to say it; the fault still acts */
	}
}

int __rk_fi_hit(struct rk_fi_module *m, uint32_t site)
{
	if (m->counts)
		__atomic_fetch_add(&m->counts[site], 1, __ATOMIC_RELAXED);
	for (int i = 0; i < st.armed; i++) {
		struct armed_site *a = &st.sites[i];
		if (m != a->target || site != a->index)
			continue;
		if (!__atomic_load_n(&st.live, __ATOMIC_RELAXED))
			return 0;
		uint64_t n = __atomic_add_fetch(&a->executions, 1, __ATOMIC_RELAXED);
		if (n <= a->after || (st.mode == MODE_TRANSIENT && n != a->after + 1))
			return 0;
		if (!__atomic_exchange_n(&a->fired, 1, __ATOMIC_RELAXED))
			report_fired(m, site);
		return 1;
	}
	return 0;
}

/* At a normal exit: "<id> <count>" per executed site, written to a
 * temporary name and renamed so a reader never sees half a list. */
static void write_trace(void)
{
	char tmp[sizeof st.trace_path + 8];
	snprintf(tmp, sizeof tmp, "%s.tmp", st.trace);
	FILE *f = fopen(tmp, "w");
	if (!f) {
		dprintf(2, "rekindle-fault: error reason=trace_write_failed: cannot open '%s': %s\n", tmp,
			strerror(errno));
		return;
	}
	for (struct rk_fi_module *m = st.modules; m; m = m->next)
		for (uint32_t i = 0; i < m->nsites; i++) {
			uint64_t c = __atomic_load_n(&m->counts[i], __ATOMIC_RELAXED);
			if (c)
				fprintf(f, "%016llx:%u %llu\n", (unsigned long long)m->hash, (unsigned)i,
					(unsigned long long)c);
		}
	if (fclose(f) != 0 || rename(tmp, st.trace) != 0)
		dprintf(2, "rekindle-fault: error reason=trace_write_failed: '%s': %s\n", st.trace, strerror(errno));
}

/* 102: after every instrumented module registered itself at 101. */
__attribute__((constructor(102))) static void rk_fi_check(void)
{
	if (!st.parsed)
		parse_env();
	for (int i = 0; i < st.armed; i++)
		if (!st.sites[i].target)
			die("unknown_site", "REKINDLE_FAULT: %016llx:%llu: no instrumented module has hash %016llx",
			    (unsigned long long)st.sites[i].hash, (unsigned long long)st.sites[i].index,
			    (unsigned long long)st.sites[i].hash);
	if (st.trace_fd >= 0 && atexit(write_trace) != 0)
		die("trace_write_failed", "atexit failed");
}
