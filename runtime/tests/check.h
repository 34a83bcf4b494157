/* check.h - the unit tests' assertion helpers (header only).
 *
 * Every CHECK counts one pass or one failure; a failure prints file:line,
 * the expression and the values.  check_done() prints the closing line
 * "<name>: N passed, M failed" and returns the exit status, so main() ends
 * with `return check_done();`.  Counters are atomic: worker threads may
 * CHECK too, but hot loops should count their own errors and CHECK the
 * total once, so that the pass count stays meaningful. */
#ifndef RK_TEST_CHECK_H
#define RK_TEST_CHECK_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define CHECK_MAX_REPORTS 60 /* a broken invariant can fail thousands of times */

static atomic_uint check_passed_, check_failed_;
static const char *check_name_ = "test";
static const char *check_case_ = "";

static inline void check_begin(const char *name)
{
	check_name_ = name;
	setvbuf(stdout, NULL, _IOLBF, 0); /* keep our lines in order with stderr */
}

static inline double check_ms_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* Runs one test case and says how long it took. */
#define RUN(fn)                                                                           \
	do {                                                                              \
		struct timespec t0_;                                                      \
		unsigned f0_ = atomic_load(&check_failed_);                               \
		check_case_ = #fn;                                                        \
		clock_gettime(CLOCK_MONOTONIC, &t0_);                                     \
		fn();                                                                     \
		printf("%s: %-40s %s (%.0f ms)\n", check_name_, #fn,                     \
		       atomic_load(&check_failed_) == f0_ ? "ok" : "FAILED", check_ms_since(&t0_)); \
	} while (0)

/* Records one result; on failure prints where and the formatted detail. */
static inline bool check_report(bool ok, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static inline bool check_report(bool ok, const char *file, int line, const char *fmt, ...)
{
	if (ok) {
		atomic_fetch_add(&check_passed_, 1);
		return true;
	}
	unsigned n = atomic_fetch_add(&check_failed_, 1);
	if (n < CHECK_MAX_REPORTS) {
		char msg[512];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof msg, fmt, ap);
		va_end(ap);
		printf("%s:%d: [%s] FAILED: %s\n", file, line, check_case_, msg);
	} else if (n == CHECK_MAX_REPORTS) {
		printf("... further failures not shown\n");
	}
	return false;
}

#define CHECK(c) check_report(!!(c), __FILE__, __LINE__, "%s", #c)
/* CHECK with a printf-style explanation of the values involved. */
#define CHECK_MSG(c, ...) check_report(!!(c), __FILE__, __LINE__, __VA_ARGS__)

#define CHECK_EQ(a, b)                                                                                  \
	do {                                                                                            \
		uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                                        \
		check_report(a_ == b_, __FILE__, __LINE__, "%s == %s: %" PRIu64 " (0x%" PRIx64 ") vs %" PRIu64 \
			     " (0x%" PRIx64 ")", #a, #b, a_, a_, b_, b_);                                 \
	} while (0)

/* Signed comparison, for return codes such as -EINVAL. */
#define CHECK_EQ_INT(a, b)                                                                            \
	do {                                                                                          \
		intmax_t a_ = (intmax_t)(a), b_ = (intmax_t)(b);                                      \
		check_report(a_ == b_, __FILE__, __LINE__, "%s == %s: %jd vs %jd", #a, #b, a_, b_);    \
	} while (0)

#define CHECK_PTR_EQ(a, b)                                                                          \
	do {                                                                                        \
		const void *a_ = (a), *b_ = (b);                                                    \
		check_report(a_ == b_, __FILE__, __LINE__, "%s == %s: %p vs %p", #a, #b, a_, b_);  \
	} while (0)

#define CHECK_STR_HAS(hay, needle)                                                                  \
	do {                                                                                        \
		const char *h_ = (hay), *n_ = (needle);                                             \
		check_report(h_ && strstr(h_, n_) != NULL, __FILE__, __LINE__, "%s contains \"%s\": \"%s\"", \
			     #hay, n_, h_ ? h_ : "(null)");                                         \
	} while (0)

/* Prints the closing line; returns main's exit status. */
static inline int check_done(void)
{
	unsigned p = atomic_load(&check_passed_), f = atomic_load(&check_failed_);
	printf("%s: %u passed, %u failed\n", check_name_, p, f);
	fflush(stdout);
	return f == 0 && p > 0 ? 0 : 1;
}

#endif
