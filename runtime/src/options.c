/* options.c - every setting of the runtime in one table: the environment
 * variables it reads and the rk_options fields that override them.  rk_init
 * parses them all once, first thing, into rk_cfg, which the rest of the
 * runtime reads (signal handlers too: rk_cfg is written before rk_init
 * installs any).  A malformed or out-of-range value is never ignored
 * silently: one "warning" event names the variable, the value and the
 * default used instead.  An empty variable counts as unset.
 *
 * Not settings, so not here: the fds handed over by the supervisor or by the
 * previous incarnation ($REKINDLE_MANIFEST_FD, $REKINDLE_CONTROL_FD,
 * $REKINDLE_SUPERVISOR_FD) are the handover protocol; they are read, checked
 * and taken out of the environment where they are used (manifest.c,
 * control.c, supervisor_link.c). */
#include "rk_internal.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rk_config rk_cfg;

#define DEFAULT_ARENA_BASE 0x200000000000ull /* 32 TiB: far from PIE, heap, mmap, stack */

struct option {
	const char *env;              /* NULL: an rk_options field only */
	size_t field, field_size;     /* where it goes in rk_cfg */
	size_t opt, opt_size;         /* the rk_options field whose non-zero value wins (size 0: none) */
	int base;                     /* of the number, for strtoull (0: 0x... is hex, 0... octal) */
	bool hex;                     /* the warning shows the default in hex */
	uint64_t dflt, min, max;
	bool (*valid)(uint64_t v);    /* a check beyond min and max, or NULL */
	const char *expected;         /* what the warning says a value must be */
};

#define CFG(f) .field = offsetof(struct rk_config, f), .field_size = sizeof(((struct rk_config *)0)->f)
#define OPT(f) .opt = offsetof(struct rk_options, f), .opt_size = sizeof(((struct rk_options *)0)->f)

static bool page_aligned(uint64_t v)
{
	return v % RK_PAGE == 0;
}

/* SIGRTMIN and SIGRTMAX are not constants (glibc keeps some for itself). */
static bool restart_signal_ok(uint64_t v)
{
	return v == 0 || (v >= (uint64_t)SIGRTMIN && v <= (uint64_t)SIGRTMAX);
}

static const struct option options[] = {
	/* Start of the 16 TiB address range reserved for arenas.  It is mapped
	 * PROT_NONE at exactly that address, so 0, an address that is not
	 * page-aligned and one beyond any user address space never work. */
	{.env = "REKINDLE_ARENA_BASE", CFG(arena_base), OPT(arena_base), .base = 0, .hex = true,
	 .dflt = DEFAULT_ARENA_BASE, .min = RK_PAGE, .max = (1ull << 56) - RK_PAGE, .valid = page_aligned,
	 .expected = "a page-aligned address below 2^56, not 0"},
	/* A failure this soon after a warm restart goes cold; 0 turns the
	 * window off (the supervisor passes its --crashloop-window). */
	{.env = "REKINDLE_CRASHLOOP_MS", CFG(crashloop_ms), OPT(crashloop_window_ms), .base = 0, .dflt = 1000,
	 .min = 0, .max = UINT_MAX, .expected = "milliseconds, 0 (no window) to 4294967295"},
	/* Give up after this many consecutive incarnations each failing
	 * within the window. */
	{.env = NULL, CFG(max_fast_failures), OPT(max_fast_failures), .dflt = 5},
	/* The real-time signal by which the supervisor asks for a restart
	 * (signals.c); 0: none. */
	{.env = "REKINDLE_RESTART_SIGNAL", CFG(restart_signal), .base = 10, .dflt = 0, .min = 0, .max = INT_MAX,
	 .valid = restart_signal_ok, .expected = "a real-time signal number (SIGRTMIN to SIGRTMAX), or 0 for none"},
	/* 1: no teardown helper, exec tears the old address space down on
	 * the restart path (for measurements only). */
	{.env = "REKINDLE_SYNC_TEARDOWN", CFG(sync_teardown), .base = 10, .dflt = 0, .min = 0, .max = 1,
	 .expected = "0 or 1"},
	/* KiB of pages that each incarnation keeps and frees just before a
	 * restart's exec, for the new one (teardown.c); 0: no pool. */
	{.env = "REKINDLE_EXEC_POOL_KB", CFG(exec_pool_kb), .base = 10, .dflt = 512, .min = 0, .max = 64u << 10,
	 .expected = "KiB, 0 to 65536"},
	/* Socket activation (systemd, `rekindle run --listen`): fds 3 to
	 * 3+N-1 are the app's and stay open across a restart. */
	{.env = "LISTEN_FDS", CFG(listen_fds), .base = 10, .dflt = 0, .min = 0, .max = INT_MAX - 3,
	 .expected = "a number of fds"},
	/* The supervisor's --hang-timeout: rk_heartbeat_interval_ms() tells
	 * the app how long it may block between two heartbeats; 0: none. */
	{.env = "REKINDLE_HANG_TIMEOUT_MS", CFG(hang_timeout_ms), .base = 10, .dflt = 0, .min = 0, .max = UINT_MAX,
	 .expected = "milliseconds, 0 (no hang detection) to 4294967295"},
	/* Test hook of stages.c: the first incarnation tears its Nth progress
	 * record update and restarts; 0: off. */
	{.env = "REKINDLE_STAGES_TEAR_AT", CFG(stages_tear_at), .base = 10, .dflt = 0, .min = 0, .max = UINT64_MAX,
	 .expected = "a number of updates"},
};

/* Digits only (strtoull would also take blanks and a sign, and negate). */
static bool parse_number(const char *s, int base, uint64_t *out)
{
	if (*s < '0' || *s > '9')
		return false;
	int saved = errno;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(s, &end, base);
	bool ok = errno == 0 && *end == 0;
	errno = saved;
	*out = x;
	return ok;
}

static void warn_ignored(const struct option *o, const char *value, const char *what)
{
	char shown[68], dflt[24];
	rk_strlcpy(shown, value, 65);
	if (strlen(value) > 64)
		rk_strlcat(shown, "...", sizeof shown);
	snprintf(dflt, sizeof dflt, o->hex ? "%#llx" : "%llu", (unsigned long long)o->dflt);
	struct rk_ev e;
	rk_ev_begin(&e, "warning");
	rk_ev_str(&e, "what", what);
	rk_ev_str(&e, "variable", o->env);
	rk_ev_str(&e, "value", shown);
	rk_ev_str(&e, "expected", o->expected);
	rk_ev_str(&e, "default", dflt);
	rk_ev_end(&e);
}

static uint64_t from_env(const struct option *o)
{
	const char *v = o->env ? getenv(o->env) : NULL;
	uint64_t x;
	if (!v || !*v)
		return o->dflt;
	if (!parse_number(v, o->base, &x)) {
		warn_ignored(o, v, "malformed setting ignored; using the default");
		return o->dflt;
	}
	if (x < o->min || x > o->max || (o->valid && !o->valid(x))) {
		warn_ignored(o, v, "setting out of range ignored; using the default");
		return o->dflt;
	}
	return x;
}

static uint64_t load(const void *p, size_t size)
{
	if (size == sizeof(uint64_t))
		return *(const uint64_t *)p;
	return *(const unsigned *)p;
}

static void store(void *p, size_t size, uint64_t v)
{
	if (size == sizeof(uint64_t))
		*(uint64_t *)p = v;
	else if (size == sizeof(unsigned))
		*(unsigned *)p = (unsigned)v; /* every such option's max fits */
	else
		*(bool *)p = v != 0;
}

void rk_options_parse(const struct rk_options *opts)
{
	memset(&rk_cfg, 0, sizeof rk_cfg);
	rk_cfg.flags = opts ? opts->flags : 0; /* first: RK_OPT_QUIET silences the warnings */
	for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
		const struct option *o = &options[i];
		uint64_t v = opts && o->opt_size ? load((const char *)opts + o->opt, o->opt_size) : 0;
		store((char *)&rk_cfg + o->field, o->field_size, v ? v : from_env(o));
	}
}
