/* test_options - the settings table (options.c): rk_options_parse, called
 * here directly, as rk_init calls it first thing.
 *
 * 1. Nothing set: every default, no event.
 * 2. Valid values: each variable is used as given, no event.
 * 3. A malformed or out-of-range value: the default, and exactly one
 *    "warning" event naming the variable, the value and the default.
 * 4. A non-zero rk_options field overrides its variable, which is then not
 *    read at all (no warning for a malformed one); a zero field does not.
 * 5. RK_OPT_QUIET: the default still, and no line on stderr.
 *
 * The events are read back from stderr, which each case points at a
 * temporary file for the duration of the parse. */
#include "check.h"
#include "rk_internal.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static const char *const vars[] = {
	"REKINDLE_ARENA_BASE",   "REKINDLE_CRASHLOOP_MS", "REKINDLE_RESTART_SIGNAL", "REKINDLE_SYNC_TEARDOWN",
	"REKINDLE_EXEC_POOL_KB", "LISTEN_FDS",            "REKINDLE_STAGES_TEAR_AT",
};

static void clear_env(void)
{
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
		unsetenv(vars[i]);
}

/* What rk_options_parse wrote on stderr, in out (NUL-terminated). */
static void parse_capturing(const struct rk_options *opts, char *out, size_t cap)
{
	FILE *tmp = tmpfile();
	int saved = dup(STDERR_FILENO);
	if (!tmp || saved < 0) {
		perror("test_options: tmpfile/dup");
		exit(1);
	}
	fflush(stderr);
	dup2(fileno(tmp), STDERR_FILENO);
	rk_options_parse(opts);
	dup2(saved, STDERR_FILENO);
	close(saved);
	ssize_t n = pread(fileno(tmp), out, cap - 1, 0);
	out[n > 0 ? n : 0] = 0;
	fclose(tmp);
	fputs(out, stderr); /* still shown, after the fact */
}

/* Lines of s that contain needle. */
static unsigned count_lines(const char *s, const char *needle)
{
	char copy[4096], *save = NULL;
	unsigned n = 0;
	snprintf(copy, sizeof copy, "%s", s);
	for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		n += strstr(line, needle) != NULL;
	return n;
}

static void defaults_without_any_setting(void)
{
	char out[4096];
	clear_env();
	setenv("REKINDLE_CRASHLOOP_MS", "", 1); /* empty: unset */
	parse_capturing(NULL, out, sizeof out);
	CHECK_EQ(rk_cfg.flags, 0);
	CHECK_EQ(rk_cfg.arena_base, 0x200000000000ull);
	CHECK_EQ(rk_cfg.crashloop_ms, 1000);
	CHECK_EQ(rk_cfg.max_fast_failures, 5);
	CHECK_EQ_INT(rk_cfg.restart_signal, 0);
	CHECK(!rk_cfg.sync_teardown);
	CHECK_EQ(rk_cfg.exec_pool_kb, 512);
	CHECK_EQ(rk_cfg.listen_fds, 0);
	CHECK_EQ(rk_cfg.stages_tear_at, 0);
	CHECK_MSG(out[0] == 0, "no event expected, got: %s", out);
}

static void valid_values_are_used(void)
{
	char out[4096], sig[16];
	clear_env();
	snprintf(sig, sizeof sig, "%d", SIGRTMIN + 6);
	setenv("REKINDLE_ARENA_BASE", "0x300000000000", 1);
	setenv("REKINDLE_CRASHLOOP_MS", "0", 1);
	setenv("REKINDLE_RESTART_SIGNAL", sig, 1);
	setenv("REKINDLE_SYNC_TEARDOWN", "1", 1);
	setenv("REKINDLE_EXEC_POOL_KB", "0", 1);
	setenv("LISTEN_FDS", "2", 1);
	setenv("REKINDLE_STAGES_TEAR_AT", "7", 1);
	parse_capturing(NULL, out, sizeof out);
	CHECK_EQ(rk_cfg.arena_base, 0x300000000000ull);
	CHECK_EQ(rk_cfg.crashloop_ms, 0);
	CHECK_EQ_INT(rk_cfg.restart_signal, SIGRTMIN + 6);
	CHECK(rk_cfg.sync_teardown);
	CHECK_EQ(rk_cfg.exec_pool_kb, 0);
	CHECK_EQ(rk_cfg.listen_fds, 2);
	CHECK_EQ(rk_cfg.stages_tear_at, 7);
	CHECK_MSG(out[0] == 0, "no event expected, got: %s", out);

	/* the edges of each range, and the bases the variables always took */
	setenv("REKINDLE_CRASHLOOP_MS", "0x10", 1);
	setenv("REKINDLE_EXEC_POOL_KB", "65536", 1);
	setenv("REKINDLE_SYNC_TEARDOWN", "0", 1);
	setenv("REKINDLE_RESTART_SIGNAL", "0", 1);
	setenv("REKINDLE_ARENA_BASE", "4096", 1); /* the first page: mmap refuses it, but it is a base */
	setenv("REKINDLE_STAGES_TEAR_AT", "18446744073709551615", 1);
	parse_capturing(NULL, out, sizeof out);
	CHECK_EQ(rk_cfg.crashloop_ms, 16);
	CHECK_EQ(rk_cfg.exec_pool_kb, 65536);
	CHECK(!rk_cfg.sync_teardown);
	CHECK_EQ_INT(rk_cfg.restart_signal, 0);
	CHECK_EQ(rk_cfg.arena_base, 4096);
	CHECK_EQ(rk_cfg.stages_tear_at, UINT64_MAX);
	CHECK_MSG(out[0] == 0, "no event expected, got: %s", out);
}

/* One variable set to value: the default and one warning saying so. */
static void expect_default(const char *var, const char *value, const char *what, const char *dflt)
{
	char out[4096], want[160];
	clear_env();
	setenv(var, value, 1);
	parse_capturing(NULL, out, sizeof out);
	CHECK_MSG(count_lines(out, "{\"rekindle\":\"warning\"") == 1, "%s=%s: one warning expected, got: %s", var,
		  value, out);
	snprintf(want, sizeof want, "\"variable\":\"%s\"", var);
	CHECK_STR_HAS(out, want);
	snprintf(want, sizeof want, "\"default\":\"%s\"", dflt);
	CHECK_STR_HAS(out, want);
	CHECK_STR_HAS(out, what);
	CHECK_STR_HAS(out, "\"expected\":");
}

static void malformed_values_give_the_default_and_a_warning(void)
{
	const char *malformed = "malformed setting ignored";
	expect_default("REKINDLE_CRASHLOOP_MS", "12ms", malformed, "1000");
	CHECK_EQ(rk_cfg.crashloop_ms, 1000);
	expect_default("REKINDLE_CRASHLOOP_MS", "-1", malformed, "1000"); /* strtoull would take -1 */
	CHECK_EQ(rk_cfg.crashloop_ms, 1000);
	expect_default("REKINDLE_CRASHLOOP_MS", " 5", malformed, "1000");
	CHECK_EQ(rk_cfg.crashloop_ms, 1000);
	expect_default("REKINDLE_ARENA_BASE", "0x", malformed, "0x200000000000");
	CHECK_EQ(rk_cfg.arena_base, 0x200000000000ull);
	expect_default("REKINDLE_ARENA_BASE", "99999999999999999999999", malformed, "0x200000000000");
	CHECK_EQ(rk_cfg.arena_base, 0x200000000000ull);
	expect_default("REKINDLE_EXEC_POOL_KB", "1M", malformed, "512");
	CHECK_EQ(rk_cfg.exec_pool_kb, 512);
	expect_default("REKINDLE_SYNC_TEARDOWN", "yes", malformed, "0");
	CHECK(!rk_cfg.sync_teardown);
	expect_default("REKINDLE_RESTART_SIGNAL", "SIGRTMIN", malformed, "0");
	CHECK_EQ_INT(rk_cfg.restart_signal, 0);
	expect_default("LISTEN_FDS", "two", malformed, "0");
	CHECK_EQ(rk_cfg.listen_fds, 0);
	expect_default("REKINDLE_STAGES_TEAR_AT", "3x", malformed, "0");
	CHECK_EQ(rk_cfg.stages_tear_at, 0);

	/* the value in the event: as given, cut after 64 bytes */
	char out[4096], longv[200];
	memset(longv, '7', sizeof longv - 2);
	longv[sizeof longv - 2] = 'x';
	longv[sizeof longv - 1] = 0;
	clear_env();
	setenv("REKINDLE_CRASHLOOP_MS", "12ms", 1);
	parse_capturing(NULL, out, sizeof out);
	CHECK_STR_HAS(out, "\"value\":\"12ms\"");
	setenv("REKINDLE_CRASHLOOP_MS", longv, 1);
	parse_capturing(NULL, out, sizeof out);
	CHECK_STR_HAS(out, "\"value\":\"7777777777777777777777777777777777777777777777777777777777777777...\"");
	CHECK_EQ(rk_cfg.crashloop_ms, 1000);
}

static void out_of_range_values_give_the_default_and_a_warning(void)
{
	const char *range = "setting out of range ignored";
	char sig[16];
	expect_default("REKINDLE_CRASHLOOP_MS", "4294967296", range, "1000"); /* was cut to 0 */
	CHECK_EQ(rk_cfg.crashloop_ms, 1000);
	expect_default("REKINDLE_EXEC_POOL_KB", "65537", range, "512");
	CHECK_EQ(rk_cfg.exec_pool_kb, 512);
	expect_default("REKINDLE_SYNC_TEARDOWN", "2", range, "0");
	CHECK(!rk_cfg.sync_teardown);
	expect_default("REKINDLE_RESTART_SIGNAL", "9", range, "0"); /* SIGKILL */
	CHECK_EQ_INT(rk_cfg.restart_signal, 0);
	snprintf(sig, sizeof sig, "%d", SIGRTMAX + 1);
	expect_default("REKINDLE_RESTART_SIGNAL", sig, range, "0");
	CHECK_EQ_INT(rk_cfg.restart_signal, 0);
	expect_default("REKINDLE_ARENA_BASE", "0", range, "0x200000000000");
	CHECK_EQ(rk_cfg.arena_base, 0x200000000000ull);
	expect_default("REKINDLE_ARENA_BASE", "0x200000000001", range, "0x200000000000"); /* not page-aligned */
	CHECK_EQ(rk_cfg.arena_base, 0x200000000000ull);
	expect_default("REKINDLE_ARENA_BASE", "0x100000000000000", range, "0x200000000000"); /* 2^56 */
	CHECK_EQ(rk_cfg.arena_base, 0x200000000000ull);
	expect_default("LISTEN_FDS", "2147483647", range, "0");
	CHECK_EQ(rk_cfg.listen_fds, 0);
}

static void each_bad_variable_is_reported_once(void)
{
	char out[4096];
	clear_env();
	setenv("REKINDLE_CRASHLOOP_MS", "soon", 1);
	setenv("REKINDLE_EXEC_POOL_KB", "99999999", 1);
	setenv("LISTEN_FDS", "3", 1);
	parse_capturing(NULL, out, sizeof out);
	CHECK_EQ(count_lines(out, "\"rekindle\":\"warning\""), 2);
	CHECK_EQ(count_lines(out, "\"variable\":\"REKINDLE_CRASHLOOP_MS\""), 1);
	CHECK_EQ(count_lines(out, "\"variable\":\"REKINDLE_EXEC_POOL_KB\""), 1);
	CHECK_EQ(rk_cfg.listen_fds, 3);
}

static void options_override_the_environment(void)
{
	char out[4096];
	clear_env();
	setenv("REKINDLE_CRASHLOOP_MS", "250", 1);
	setenv("REKINDLE_ARENA_BASE", "not an address", 1);
	struct rk_options o = {.flags = RK_OPT_PREFAULT,
			       .arena_base = 0x400000000000ull,
			       .crashloop_window_ms = 3000,
			       .max_fast_failures = 9};
	parse_capturing(&o, out, sizeof out);
	CHECK_EQ(rk_cfg.flags, RK_OPT_PREFAULT);
	CHECK_EQ(rk_cfg.arena_base, 0x400000000000ull);
	CHECK_EQ(rk_cfg.crashloop_ms, 3000);
	CHECK_EQ(rk_cfg.max_fast_failures, 9);
	CHECK_MSG(out[0] == 0, "the overridden variables are not read: no event expected, got: %s", out);

	/* a zero field is "not set": the variable (or the default) counts */
	struct rk_options z = {.flags = 0};
	setenv("REKINDLE_ARENA_BASE", "0x500000000000", 1);
	parse_capturing(&z, out, sizeof out);
	CHECK_EQ(rk_cfg.arena_base, 0x500000000000ull);
	CHECK_EQ(rk_cfg.crashloop_ms, 250);
	CHECK_EQ(rk_cfg.max_fast_failures, 5);
	CHECK_MSG(out[0] == 0, "no event expected, got: %s", out);
}

static void quiet_still_takes_the_default(void)
{
	char out[4096];
	clear_env();
	setenv("REKINDLE_EXEC_POOL_KB", "lots", 1);
	struct rk_options o = {.flags = RK_OPT_QUIET};
	parse_capturing(&o, out, sizeof out);
	CHECK_EQ(rk_cfg.exec_pool_kb, 512);
	CHECK_MSG(out[0] == 0, "RK_OPT_QUIET: no event expected, got: %s", out);
}

int main(void)
{
	check_begin("test_options");
	RUN(defaults_without_any_setting);
	RUN(valid_values_are_used);
	RUN(malformed_values_give_the_default_and_a_warning);
	RUN(out_of_range_values_give_the_default_and_a_warning);
	RUN(each_bad_variable_is_reported_once);
	RUN(options_override_the_environment);
	RUN(quiet_still_takes_the_default);
	return check_done();
}
