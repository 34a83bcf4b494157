/* ev_unit.c - the error-virtualization run-time, end to end: built with
 * rekindle-ev-cc, each check crashes for real (a NULL write after a gated
 * library call) and must come back as that call's error, with memory,
 * registers and the call's effects undone.  With no argument it runs every
 * recoverable check and exits 0; with a mode it runs one case that must
 * NOT be recovered (tests/test_errvirt.py checks how it dies and why), or
 * socket-write, which is recovered only when socket writes are masked. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "count_fds.h"
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>

static int failures;
#define CHECK(cond)                                                                                    \
	do {                                                                                           \
		if (!(cond)) {                                                                         \
			fprintf(stderr, "ev_unit: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                                                    \
		}                                                                                      \
	} while (0)

/* the crash: a write through a pointer the compiler cannot see is NULL */
static int *volatile nowhere;
/* keeps an allocation alive for the optimizer (malloc+free pairs vanish) */
static void *volatile sink;
static volatile int crash_on = 1;
__attribute__((noinline)) static void crash(void)
{
	if (crash_on)
		*nowhere = 1;
}

/* ---- memory: globals, heap, a callee's writes, a memcpy -------------- */
static long counters[8];
static char text[64] = "untouched";

__attribute__((noinline)) static void scribble(long *c, int n)
{
	for (int i = 0; i < n; i++)
		c[i] += 1000 + i; /* some words twice: logged once */
	for (int i = 0; i < n; i++)
		c[i] += 1;
}

__attribute__((noinline)) static int memory_case(char *heap)
{
	char *p = malloc(32); /* the gate: its result is checked */
	if (!p)
		return -errno;
	sink = p;
	memcpy(p, "fresh", 6); /* memory of this transaction: not logged */
	scribble(counters, 8);
	memcpy(text, "overwritten", 12);
	strcpy(heap, "heap changed");
	crash();
	free(p);
	return 0;
}

static void check_memory(void)
{
	for (int i = 0; i < 8; i++)
		counters[i] = i;
	char *heap = malloc(64);
	CHECK(heap);
	strcpy(heap, "heap before");
	int r = memory_case(heap);
	CHECK(r == -ENOMEM);
	for (int i = 0; i < 8; i++)
		CHECK(counters[i] == i);
	CHECK(strcmp(text, "untouched") == 0);
	CHECK(strcmp(heap, "heap before") == 0);
	free(heap);
}

/* ---- registers: values live across the gate in callee-saved registers - */
__attribute__((noinline)) static long opaque(long x)
{
	__asm__ volatile("" : "+r"(x));
	return x;
}

__attribute__((noinline)) static long registers_case(long seed)
{
	long a = opaque(seed * 3), b = opaque(seed * 5), c = opaque(seed * 7), d = opaque(seed * 11),
	     e = opaque(seed * 13);
	int fd = open("/dev/null", O_RDONLY);
	if (fd < 0) /* after the rollback: a..e as they were at the gate */
		return a + b * 10 + c * 100 + d * 1000 + e * 10000;
	a = opaque(a + 1);
	b = opaque(b + 2);
	c = opaque(c + 3);
	d = opaque(d + 4);
	e = opaque(e + 5);
	crash();
	close(fd);
	return -(a + b + c + d + e);
}

static void check_registers(void)
{
	long r = registers_case(1);
	CHECK(r == 3 + 50 + 700 + 11000 + 130000);
	CHECK(errno == EACCES);
}

/* ---- a loop counter spilled in the frame, moved on after the gate ------ */
__attribute__((noinline)) static int frame_case(int n)
{
	volatile int i = 0; /* in the frame, not a register */
	int seen = -1;
	for (; i < n; i++) {
		void *p = malloc(16);
		sink = p;
		if (!p) {
			seen = i; /* the iteration whose malloc failed */
			break;
		}
		free(p);
		if (i == 3) {
			i += 10;
			crash();
		}
	}
	return seen;
}

static void check_frame(void)
{
	CHECK(frame_case(6) == 3);
}

/* ---- a large local array: left out of the frame copies, its stores logged */
__attribute__((noinline)) static long sum(const int *b, int n)
{
	long t = 0;
	for (int i = 0; i < n; i++)
		t += b[i];
	return t;
}

__attribute__((noinline)) static long hole_case(void)
{
	int big[512]; /* 2 KiB: a hole */
	for (int i = 0; i < 512; i++)
		big[i] = i;
	void *p = malloc(8);
	sink = p;
	if (!p)
		return sum(big, 512); /* as at the gate */
	for (int i = 0; i < 512; i += 3)
		big[i] = -1;
	big[7] = opaque(big[7] + 1000);
	crash();
	return -sum(big, 512);
}

static void check_hole(void)
{
	CHECK(hole_case() == 511L * 512 / 2);
}

/* ---- stack words: dead below the gate, copied in its frame, logged above */
uint64_t __rk_ev_stack_skips(void); /* the run-time's */

/* a store through a pointer: the pass cannot tell whose frame it hits */
__attribute__((noinline)) static void put(long *p, long v)
{
	*p = v;
}

__attribute__((noinline)) static long lsum(const long *b, int n)
{
	long t = 0;
	for (int i = 0; i < n; i++)
		t += b[i];
	return t;
}

/* Called after the gate: its frame lies below the gate's stack pointer,
 * which a rollback abandons, so its words need no log entry. */
__attribute__((noinline)) static long below_gate(void)
{
	long mine[8];
	for (int i = 0; i < 8; i++)
		put(&mine[opaque(i)], i);
	return lsum(mine, 8);
}

/* own: in the gate's frame, which the checkpoint copies (its words need no
 * entry either); big: a hole the copy leaves out (its words must be
 * logged); above: the caller's frame, not copied yet (logged too). */
__attribute__((noinline)) static long stack_case(long *above)
{
	long own[4];
	long big[128]; /* 1 KiB: a hole */
	for (int i = 0; i < 4; i++)
		put(&own[opaque(i)], i + 1);
	for (int i = 0; i < 128; i++)
		put(&big[opaque(i)], i);
	char *p = malloc(16);
	if (!p)
		return lsum(own, 4) * 1000 + lsum(big, 128); /* as at the gate */
	sink = p;
	for (int i = 0; i < 4; i++)
		put(&own[opaque(i)], -1);
	put(&big[opaque(5)], -5);
	put(&big[opaque(100)], -100);
	put(above, 99);
	sink = (void *)(lsum(own, 4) + lsum(big, 128) + below_gate()); /* keeps the stores */
	crash();
	return -1;
}

static void check_stack(void)
{
	long above = 7;
	/* a write closes the window: the stores before stack_case's gate are
	 * then in no transaction, and only the skips after it count */
	CHECK(write(-1, "", 0) == -1);
	uint64_t s0 = __rk_ev_stack_skips();
	CHECK(stack_case(&above) == 10 * 1000 + 127 * 128 / 2);
	CHECK(errno == ENOMEM);
	CHECK(above == 7);
	/* own's 4 words (copied) and below_gate's 8 (dead) took no entry */
	uint64_t skips = __rk_ev_stack_skips() - s0;
	if (skips < 12)
		fprintf(stderr, "ev_unit: %llu stack skips\n", (unsigned long long)skips);
	CHECK(skips >= 12);
}

/* ---- a gate's frame with a hole returns, and the next frames reuse it ---- */
__attribute__((noinline)) static long popped_gate(void)
{
	long big[128]; /* 1 KiB: a hole */
	for (int i = 0; i < 128; i++)
		big[i] = opaque(i);
	char *p = malloc(16);
	if (!p)
		return lsum(big, 128); /* as at the gate */
	sink = p;
	big[3] = opaque(-3);
	sink = (void *)lsum(big, 128);
	return 0; /* the hole is dropped, the frame's bytes free */
}

/* 480 bytes of the frame's own: no hole, its stores never logged */
__attribute__((noinline)) static void reuse_stack(void)
{
	volatile long a[60];
	for (int i = 0; i < 60; i++)
		a[i] = -7;
}

__attribute__((noinline)) static long popped_case(void)
{
	long r = popped_gate();
	if (r != 0)
		return r; /* the rollback resumed popped_gate, whose malloc failed */
	reuse_stack();
	crash();
	return -1;
}

static void check_popped_hole(void)
{
	CHECK(popped_case() == 127 * 128 / 2);
	CHECK(errno == ENOMEM);
}

/* ---- every gate class injects its error, and compensation undoes -------- */

__attribute__((noinline)) static int open_case(void)
{
	int fd = open("/dev/null", O_RDONLY);
	if (fd < 0)
		return -errno;
	crash();
	return fd;
}

__attribute__((noinline)) static int socket_case(void)
{
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0)
		return -errno;
	crash();
	return fd;
}

__attribute__((noinline)) static int pipe_case(void)
{
	int p[2];
	if (pipe(p) < 0)
		return -errno;
	crash();
	return p[0];
}

__attribute__((noinline)) static int read_case(int fd)
{
	char b[8];
	ssize_t n = read(fd, b, sizeof b);
	if (n < 0)
		return -errno;
	crash();
	return (int)n;
}

#define HINT ((void *)0x5a5a00000000ul)
__attribute__((noinline)) static void *mmap_case(void)
{
	void *p = mmap(HINT, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	*(int *)p = 1;
	crash();
	return p;
}

__attribute__((noinline)) static int fopen_case(void)
{
	FILE *f = fopen("/dev/null", "r");
	if (!f)
		return -errno;
	crash();
	fclose(f);
	return 0;
}

static void check_gates(void)
{
	int before = count_fds();
	CHECK(open_case() == -EACCES);
	CHECK(socket_case() == -EMFILE);
	CHECK(pipe_case() == -EMFILE);
	CHECK(fopen_case() == -EACCES);
	CHECK(count_fds() == before); /* compensation closed them all */
	int fd = open("/dev/zero", O_RDONLY);
	CHECK(fd >= 0);
	CHECK(read_case(fd) == -EIO);
	close(fd);
	errno = 0;
	CHECK(mmap_case() == NULL);
	CHECK(errno == ENOMEM);
	unsigned char vec;
	CHECK(mincore(HINT, 4096, &vec) < 0 && errno == ENOMEM); /* unmapped again */
}

/* ---- fresh blocks: stores into what the transaction allocated ---------- */
void __rk_ev_logged(uint64_t *words, uint64_t *range_bytes); /* the run-time's */
static long pool_global;

/* nginx's pools: posix_memalign reports the block through an out-pointer.
 * The gate's block and an abort-checked malloc's (an embedded call, as
 * lighttpd's ck_malloc) are both freed by a rollback, so their stores need
 * no log; the global's store does, and comes back. */
__attribute__((noinline)) static int fresh_case(int n)
{
	void *pool;
	int e = posix_memalign(&pool, 64, 4096);
	if (e)
		return -e;
	sink = pool;
	long *w = pool;
	for (int i = 0; i < n; i++)
		w[opaque(i)] = i; /* opaque: no memset, word stores */
	long *c = malloc(1024);
	if (!c)
		abort();
	sink = c;
	for (int i = 0; i < 128; i++)
		c[opaque(i)] = -i;
	pool_global = 7;
	crash();
	return 0;
}

static void check_fresh(void)
{
	pool_global = 1;
	uint64_t w0, b0, w1, b1;
	__rk_ev_logged(&w0, &b0);
	CHECK(fresh_case(512) == -ENOMEM);
	__rk_ev_logged(&w1, &b1);
	CHECK(pool_global == 1);
	/* 640 words stored, all but a few (sink, pool_global) fresh */
	CHECK(w1 - w0 < 16);
	CHECK(b1 - b0 < 1024);
}

/* ---- deferred calls: a rolled back free or close never happened -------- */
__attribute__((noinline)) static int defer_case(char *keep, int fd)
{
	char *p = malloc(8);
	if (!p)
		return -errno;
	sink = p;
	free(keep);
	close(fd);
	free(p);
	crash();
	return 0;
}

static void check_defer(void)
{
	char *keep = malloc(4096);
	CHECK(keep);
	memset(keep, 'k', 4096);
	int fd = open("/dev/null", O_RDONLY);
	CHECK(defer_case(keep, fd) == -ENOMEM);
	CHECK(fcntl(fd, F_GETFD) >= 0); /* still open */
	char *other = malloc(4096);
	CHECK(other != keep); /* keep was not freed */
	CHECK(keep[0] == 'k' && keep[4095] == 'k');
	free(other);
	free(keep);
	close(fd);
}

/* A transaction's deferred calls happen before the next gate's call: a
 * closed fd must not reach the next epoll_wait, or the next open. */
static void check_commit_before_gate(void)
{
	int fd = open("/dev/null", O_RDONLY);
	CHECK(fd >= 0);
	close(fd);
	void *p = malloc(8);
	sink = p;
	CHECK(fcntl(fd, F_GETFD) < 0 && errno == EBADF);
	free(p);
}

/* ---- libc formatting inside a transaction ------------------------------ */
/* strftime and strerror_r write the caller's buffer: the model logs it, and
 * the window stays open across them (unmodelled, each was an unknown call
 * that closed it: lighttpd's listings and error log). */
static char stamp[64] = "stamp before";
static char errtext[128] = "errtext before";

__attribute__((noinline)) static int formatting_case(void)
{
	char *p = malloc(16); /* the gate */
	if (!p)
		return -errno;
	sink = p;
	struct tm tm = {.tm_year = 126, .tm_mon = 10, .tm_mday = 24};
	if (strftime(stamp, sizeof stamp, "%Y-%m-%d", &tm) == 0)
		return -1;
	/* an unknown error number: glibc writes "Unknown error N" into the buffer */
	char *e = strerror_r(12345, errtext, sizeof errtext);
	sink = e;
	crash();
	free(p);
	return 0;
}

static void check_formatting(void)
{
	CHECK(formatting_case() == -ENOMEM);
	CHECK(strcmp(stamp, "stamp before") == 0);
	CHECK(strcmp(errtext, "errtext before") == 0);
}

/* A clock is no gate (its error diverts nothing): a crash after a checked
 * clock_gettime rolls back to the malloc before it.  The time it wrote into
 * a global, and what an unchecked fstat wrote, come back. */
static struct timespec started = {.tv_sec = 7, .tv_nsec = 8};
static struct stat seen_stat;

__attribute__((noinline)) static int clock_case(int fd)
{
	char *p = malloc(16); /* the gate */
	if (!p)
		return -errno;
	sink = p;
	if (clock_gettime(CLOCK_REALTIME, &started) != 0)
		return -1000; /* an error path a clock gate would have taken */
	(void)fstat(fd, &seen_stat);
	crash();
	free(p);
	return 0;
}

static void check_clock(void)
{
	int fd = open("/dev/null", O_RDONLY);
	CHECK(fd >= 0);
	memset(&seen_stat, 0x5a, sizeof seen_stat);
	CHECK(clock_case(fd) == -ENOMEM);
	CHECK(started.tv_sec == 7 && started.tv_nsec == 8);
	unsigned char *b = (unsigned char *)&seen_stat;
	int same = 1;
	for (size_t i = 0; i < sizeof seen_stat; i++)
		same &= b[i] == 0x5a;
	CHECK(same);
	close(fd);
}

/* lighttpd's once-a-second timer reads the load average, and its shutdown
 * unloads its modules: getloadavg's doubles are logged, and dlclose waits
 * for the commit (a rollback keeps the module loaded). */
static double loads[3] = {-1, -2, -3};

__attribute__((noinline)) static int module_case(void *lib)
{
	char *p = malloc(16); /* the gate */
	if (!p)
		return -errno;
	sink = p;
	(void)getloadavg(loads, 3);
	if (dlclose(lib) != 0)
		return -1;
	crash();
	free(p);
	return 0;
}

static void check_module(void)
{
	void *lib = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
	CHECK(lib);
	if (!lib)
		return;
	CHECK(module_case(lib) == -ENOMEM);
	CHECK(loads[0] == -1 && loads[1] == -2 && loads[2] == -3);
	CHECK(dlsym(lib, "cos") != NULL); /* the handle is still open */
	CHECK(dlclose(lib) == 0);
}

/* ---- cases that must not be recovered (run one per process) ------------- */
__attribute__((noinline)) static int second_fault(void)
{
	char *p = malloc(8);
	sink = p;
	if (!p) {
		crash(); /* the error path crashes too */
		return -1;
	}
	crash();
	return 0;
}

__attribute__((noinline)) static int irrecoverable(void)
{
	char *p = malloc(8);
	if (!p)
		return -1;
	sink = p;
	if (write(STDOUT_FILENO, "sent\n", 5) != 5) /* the bytes left: no way back */
		return -1;
	crash();
	return 0;
}

/* A reply written to a socket, then a crash in the same transaction.  With
 * REKINDLE_EV_MASK_SOCKET_WRITES=1 the write is a gate: the crash rolls back
 * to just after it and it fails with ECONNRESET; the peer has the bytes,
 * and the socket is shut down (its reads end, its writes fail).  Without
 * it, the bytes left and the crash is not recovered. */
__attribute__((noinline)) static ssize_t reply_then_crash(int fd, long *state)
{
	char *p = malloc(8); /* a window open before the write */
	if (!p)
		return -ENOMEM;
	sink = p;
	*state = 1;
	ssize_t n = write(fd, "reply", 5);
	if (n < 0)
		return -errno;
	*state = 2; /* rolled back with the crash */
	crash();
	return n;
}

static int socket_write(void)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
		return 1;
	signal(SIGPIPE, SIG_IGN);
	long state = 0;
	ssize_t r = reply_then_crash(sv[0], &state);
	char buf[16] = {0};
	ssize_t got = read(sv[1], buf, sizeof buf);
	ssize_t eof = read(sv[1], buf + 8, sizeof buf - 8);
	ssize_t again = write(sv[0], "x", 1);
	int again_errno = errno;
	printf("ret=%zd state=%ld peer=%.*s eof=%zd again=%zd again_errno=%d\n", r, state, (int)(got > 0 ? got : 0),
	       buf, eof, again, again_errno);
	return !(r == -ECONNRESET && state == 1 && got == 5 && memcmp(buf, "reply", 5) == 0 && eof == 0 && again == -1 &&
		 again_errno == EPIPE);
}

/* The same on standard error made a socket (journald's, under systemd): a
 * log line, never masked. */
static int stderr_socket_write(void)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0 || dup2(sv[0], STDERR_FILENO) < 0)
		return 1;
	long state = 0;
	ssize_t r = reply_then_crash(STDERR_FILENO, &state);
	printf("stderr-socket-write survived (%zd)\n", r);
	return 3;
}

/* The same with a regular file: its bytes are not a peer's, so nothing
 * masks them, whatever the setting. */
static int file_write(void)
{
	FILE *f = tmpfile();
	if (!f)
		return 1;
	long state = 0;
	ssize_t r = reply_then_crash(fileno(f), &state);
	fprintf(stderr, "ev_unit: file-write survived (%zd)\n", r);
	return 3;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "socket-write") == 0)
		return socket_write();
	if (argc > 1 && strcmp(argv[1], "file-write") == 0)
		return file_write();
	if (argc > 1 && strcmp(argv[1], "stderr-socket-write") == 0)
		return stderr_socket_write();
	if (argc > 1) {
		int r = 1;
		if (strcmp(argv[1], "second-fault") == 0)
			r = second_fault();
		else if (strcmp(argv[1], "irrecoverable") == 0)
			r = irrecoverable();
		fprintf(stderr, "ev_unit: %s survived (%d)\n", argv[1], r);
		return 3;
	}
	check_memory();
	check_registers();
	check_frame();
	check_hole();
	check_stack();
	check_popped_hole();
	check_gates();
	check_fresh();
	check_defer();
	check_commit_before_gate();
	check_formatting();
	check_clock();
	check_module();
	if (failures) {
		fprintf(stderr, "ev_unit: %d checks failed\n", failures);
		return 1;
	}
	printf("ev_unit: all checks passed\n");
	return 0;
}
