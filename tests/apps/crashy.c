/* crashy - a small program that keeps a linked list in an arena and dies on
 * request, for the end-to-end tests of the runtime.  Prints one JSON line
 * per incarnation on stdout ({"app":"state",...}) with what it found.
 *
 *   crashy [--objects N] [--payload BYTES] [--inflight K] [--range]
 *          [--crash GEN:KIND]... [--squat-on-restart] [--swap-arena-on-restart]
 *          [--no-cleanup] [--replace-self-with PATH] [--fork-crash]
 *          [--steal-range-fd FILE] [--check-fd N] [--fork-open] [--hook-abort]
 *          [--signal-helper]
 *          [--churn-threads N] [--listen PORT] [--fill-mb N]
 *
 * KIND: segv bus arena-bus arena-bus-far wild wp-stray fpe ill abort restart restart-cold in-runtime hold-lock
 *       corrupt-header corrupt-control corrupt-manifest exit
 * An incarnation with no crash for its generation prints its state and
 * exits 0. */
#include "rekindle.h"
#include "../../runtime/src/rk_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

struct node {
	struct node *next;
	uint64_t index;
	uint64_t value;
	char payload[];
};

RK_PRESERVED static uint64_t incarnations_seen;
RK_PRESERVED static const char *preserved_literal = "literal-in-image";
RK_PRESERVED static struct node *static_head;
RK_PRESERVED static int (*preserved_fn)(int);

#define RANGE_ADDR ((void *)0x100000000000ull)
#define RANGE_LEN (2 * 4096)

static volatile int *volatile null_ptr; /* written through to fault */

static int in_image_fn(int x)
{
	return x + 1;
}

static uint64_t value_of(uint64_t i)
{
	return i * 2654435761u + 17;
}

/* --fill-mb: 1 MiB large objects holding their own index, rooted as "fill" */
static int fill(rk_arena *a, uint64_t mb)
{
	uint64_t **tab = rk_calloc(a, mb, sizeof *tab);
	if (!tab)
		return -1;
	for (uint64_t i = 0; i < mb; i++) {
		tab[i] = rk_alloc(a, 1 << 20);
		if (!tab[i])
			return -1;
		for (size_t k = 0; k < (1 << 20) / 8; k += 512)
			tab[i][k] = i * 1000003 + k;
	}
	rk_root_set(a, "fill", tab);
	return 0;
}

static long fill_verify(rk_arena *a, uint64_t mb)
{
	uint64_t **tab = rk_root_get(a, "fill");
	long n = 0;
	if (!tab)
		return -1;
	for (uint64_t i = 0; i < mb && tab[i]; i++, n++) {
		if (rk_is_recovery() && (rk_mark(a, tab) < 0 || rk_mark(a, tab[i]) < 0))
			return -1;
		for (size_t k = 0; k < (1 << 20) / 8; k += 512)
			if (tab[i][k] != i * 1000003 + k)
				return -1;
	}
	return n;
}

static void *churn_main(void *arg)
{
	rk_arena *a = arg;
	void *keep[64] = {0};
	for (uint64_t i = 0;; i++) {
		unsigned s = (unsigned)(i * 7919 % 64);
		rk_free(a, keep[s]);
		keep[s] = rk_alloc(a, 16 + (i * 31) % 40000);
	}
	return NULL;
}

static int listen_on(unsigned port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(fd, 16) < 0)
		return errno;
	return 0;
}

static struct node *build(rk_arena *a, uint64_t n, size_t payload)
{
	struct node *head = NULL;
	for (uint64_t i = n; i-- > 0;) {
		struct node *x = rk_alloc(a, sizeof *x + payload);
		if (!x) {
			fprintf(stderr, "crashy: rk_alloc: %s\n", strerror(errno));
			exit(3);
		}
		x->index = i;
		x->value = value_of(i);
		memset(x->payload, (int)(i & 0xff), payload);
		x->next = head;
		head = x;
	}
	return head;
}

/* Checks contents; marks every node if marking. Returns nodes or -1. */
static long verify(rk_arena *a, struct node *head, uint64_t n, size_t payload, int mark)
{
	uint64_t i = 0;
	for (struct node *x = head; x; x = x->next, i++) {
		if (x->index != i || x->value != value_of(i))
			return -1;
		for (size_t k = 0; k < payload; k++)
			if ((unsigned char)x->payload[k] != (i & 0xff))
				return -1;
		if (mark && rk_mark(a, x) < 0)
			return -1;
	}
	return i == n ? (long)i : -1;
}

/* The fd whose /proc/self/fd link starts with prefix ("/memfd:rekindle:data"
 * matches "/memfd:rekindle:data (deleted)"), or -1. */
static int fd_named(const char *prefix)
{
	for (int fd = 3; fd < 256; fd++) {
		char link[64], target[128];
		snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
		ssize_t n = readlink(link, target, sizeof target - 1);
		if (n > 0 && (target[n] = 0, strncmp(target, prefix, strlen(prefix)) == 0))
			return fd;
	}
	return -1;
}

/* A stray write over the magic of the memfd whose link starts with prefix. */
static void flip_magic(const char *prefix, const char *what)
{
	int fd = fd_named(prefix);
	uint64_t magic = 0;
	if (fd < 0 || pread(fd, &magic, sizeof magic, 0) != sizeof magic)
		fprintf(stderr, "crashy: no %s to corrupt\n", what);
	magic ^= 0x5a;
	if (fd >= 0 && pwrite(fd, &magic, sizeof magic, 0) != sizeof magic)
		fprintf(stderr, "crashy: corrupt %s: %s\n", what, strerror(errno));
}

/* --wp: an object in a write-protected arena "wp", rooted as "obj" */
static volatile uint64_t *wp_obj;

static void open_wp_arena(void)
{
	rk_arena *w = rk_arena_open_flags("wp", 1u << 20, RK_ARENA_WRITE_PROTECT);
	if (!w) {
		perror("crashy: rk_arena_open_flags wp");
		return;
	}
	wp_obj = rk_root_get(w, "obj");
	if (wp_obj) {
		rk_mark(w, (const void *)wp_obj);
		return;
	}
	rk_unsafe_begin(w);
	wp_obj = rk_calloc(w, 1, 64);
	rk_root_set(w, "obj", (void *)wp_obj);
	rk_unsafe_end(w);
}

static void die_as(const char *kind, rk_arena *a)
{
	fflush(stdout);
	if (!strcmp(kind, "segv")) {
		*null_ptr = 1;
	} else if (!strcmp(kind, "bus")) {
		int fd = memfd_create("bus", 0);
		char *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		p[4096] = 1; /* beyond the end of the file */
	} else if (!strcmp(kind, "arena-bus")) {
		/* a read past the end of the arena's file, at the same address
		 * each time: what a corrupt length kept in preserved data does */
		volatile const char *past = (const char *)a->hdr + a->hdr_max - 64;
		printf("%d\n", *past);
	} else if (!strcmp(kind, "arena-bus-far")) {
		/* past the end of the arena's file too, a megabyte before the
		 * address arena-bus reads: a corrupt length in another entry */
		volatile const char *past = (const char *)a->hdr + a->hdr_max - 64 - (1u << 20);
		printf("%d\n", *past);
	} else if (!strcmp(kind, "wild")) {
		/* a wild pointer kept in preserved data: the same bad address
		 * outside preserved memory each time */
		*(volatile int *)(uintptr_t)0xdead0000ull = 1;
	} else if (!strcmp(kind, "wp-stray")) {
		/* a stray write into the write-protected arena (--wp): the
		 * protection stops it (SEGV_PKUERR), at the same preserved
		 * object each time, and the data stays intact */
		if (!wp_obj)
			fprintf(stderr, "crashy: wp-stray needs --wp\n");
		else
			*wp_obj = 42;
	} else if (!strcmp(kind, "fpe")) {
		volatile int n = 7, z = 0;
		printf("%d\n", n / z);
	} else if (!strcmp(kind, "ill")) {
		__builtin_trap();
	} else if (!strcmp(kind, "abort")) {
		abort();
	} else if (!strcmp(kind, "restart")) {
		int r = rk_restart("app: rejuvenation");
		fprintf(stderr, "crashy: rk_restart returned %d\n", r);
		exit(4);
	} else if (!strcmp(kind, "restart-cold")) {
		rk_restart_cold("app: cold requested");
		exit(4);
	} else if (!strcmp(kind, "in-runtime")) {
		/* use-after-free into a cached block: the next allocation follows a
		 * wild pointer inside the allocator */
		void *p = rk_alloc(a, 48);
		rk_free(a, p);
		*(void **)p = (void *)0x10;
		rk_alloc(a, 48);
		rk_alloc(a, 48);
	} else if (!strcmp(kind, "hold-lock")) {
		/* as if a thread died inside the allocator */
		atomic_store(&a->hdr->heap_lock, 4242);
		*null_ptr = 1;
	} else if (!strcmp(kind, "corrupt-header")) {
		a->hdr->name[RK_NAME_MAX - 1] ^= 0x5a;
		*null_ptr = 1;
	} else if (!strcmp(kind, "corrupt-control")) {
		/* a wild write over the (supervisor's) control block, where
		 * unsafe regions are counted: the restart cannot tell whether
		 * one was open */
		flip_magic("/memfd:rekindle:control", "shared control block");
		*null_ptr = 1;
	} else if (!strcmp(kind, "corrupt-manifest")) {
		/* what the next incarnation reads is not a manifest (the restart
		 * recomputes the checksum, not the magic) */
		flip_magic("/memfd:rekindle:manifest", "manifest");
		*null_ptr = 1;
	} else if (!strcmp(kind, "exit")) {
		exit(0);
	}
	fprintf(stderr, "crashy: unknown crash kind %s\n", kind);
	exit(2);
}

/* --fork-open: a forked child (no exec) opens an arena, which rewrites the
 * manifest in the parent; the parent's next restart must not see it. */
static void fork_and_open_arena(void)
{
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0)
		_exit(rk_arena_open("child-arena", 4u << 20) ? 0 : 1);
	int st = 0;
	if (pid < 0 || waitpid(pid, &st, 0) < 0)
		perror("crashy: fork");
}

/* --hook-abort: the failure hook itself fails (abort): the process must die
 * of SIGABRT, not wait forever for its own restart. */
static bool abort_in_hook(int sig, void *ctx)
{
	(void)sig;
	(void)ctx;
	abort();
}

/* --signal-helper: SIGHUP to our children (the teardown helper is one), as
 * `pkill -HUP crashy` would; reports whether they are all still there. */
static void signal_children(void)
{
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
	if (fd >= 0)
		close(fd);
	int sent = 0, alive = 0;
	buf[n > 0 ? n : 0] = 0;
	for (char *p = buf, *end; *p; p = end) {
		long pid = strtol(p, &end, 10);
		if (end == p)
			break;
		sent += kill((pid_t)pid, SIGHUP) == 0;
	}
	nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
	for (char *p = buf, *end; *p; p = end) {
		long pid = strtol(p, &end, 10);
		if (end == p)
			break;
		/* exit signal 0: no zombie to reap by us; a dead one is a zombie */
		char st[64], line[128] = "";
		snprintf(st, sizeof st, "/proc/%ld/stat", pid);
		int sfd = open(st, O_RDONLY | O_CLOEXEC);
		ssize_t k = sfd >= 0 ? read(sfd, line, sizeof line - 1) : -1;
		if (sfd >= 0)
			close(sfd);
		char *rp = k > 0 ? strrchr(line, ')') : NULL;
		alive += rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
	}
	printf("{\"signal\":\"children\",\"sent\":%d,\"alive\":%d}\n", sent, alive);
	fflush(stdout);
}

static int arena_fd_cloexec(const char *want)
{
	int fd = fd_named(want);
	return fd < 0 ? -1 : (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0;
}

static int count_open_fds(void)
{
	int n = 0;
	for (int fd = 0; fd < 1024; fd++)
		n += fcntl(fd, F_GETFD) >= 0;
	return n;
}

/* --replace-self-with: an "upgrade" of the binary on disk before the crash;
 * the restart must still run the binary that is running. */
static void replace_own_binary(const char *with)
{
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0 || (self[n] = 0, rename(with, self) < 0))
		perror("crashy: replace own binary");
}

/* --fork-crash: a forked child (no exec) faults; it must die of the signal,
 * not restart on its parent's arenas. */
static void fork_and_crash_child(void)
{
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		*null_ptr = 1;
		_exit(0);
	}
	int st = 0;
	if (pid < 0 || waitpid(pid, &st, 0) < 0)
		perror("crashy: fork");
	printf("{\"fork\":\"child\",\"child_signal\":%d,\"child_exit\":%d}\n", WIFSIGNALED(st) ? WTERMSIG(st) : 0,
	       WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	fflush(stdout);
}

/* --steal-range-fd: close the preserved range's memfd behind the runtime's
 * back and put another file at its fd number, then make the runtime
 * rewrite its manifest (a second arena): the next start must refuse it. */
static void steal_range_fd(const char *file)
{
	int fd = fd_named("/memfd:rekindle:range");
	if (fd < 0) {
		fprintf(stderr, "crashy: no range fd to steal\n");
		return;
	}
	int other = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (other < 0 || ftruncate(other, RANGE_LEN) < 0 || dup3(other, fd, O_CLOEXEC) < 0)
		perror("crashy: steal range fd");
	close(other);
	if (!rk_arena_open("extra", 4u << 20))
		perror("crashy: rk_arena_open extra");
}

static void swap_inherited_arena(const char *want)
{
	char exact[96];
	snprintf(exact, sizeof exact, "%s ", want); /* not "rekindle:data2" */
	int fd = fd_named(exact);
	if (fd < 0) {
		fprintf(stderr, "crashy: no inherited arena fd to swap\n");
		return;
	}
	off_t size = lseek(fd, 0, SEEK_END);
	int other = memfd_create("rekindle:data", 0);
	if (other < 0 || ftruncate(other, size) < 0 || dup2(other, fd) < 0)
		perror("crashy: swap arena");
	close(other);
}

int main(int argc, char **argv)
{
	uint64_t objects = 1000, inflight = 0;
	size_t payload = 32;
	int want_range = 0, cleanup = 1;
	const char *crash_at[16];
	int ncrash = 0;
	int squat = 0, swap_arena = 0, fork_crash = 0, check_fd = -1, fork_open = 0, hook_abort = 0;
	int signal_helper = 0, want_wp = 0;
	const char *replace_with = NULL, *steal_range_file = NULL;
	unsigned churn = 0, listen_port = 0;
	uint64_t fill_mb = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--objects") && i + 1 < argc)
			objects = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--payload") && i + 1 < argc)
			payload = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--inflight") && i + 1 < argc)
			inflight = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--crash") && i + 1 < argc && ncrash < 16)
			crash_at[ncrash++] = argv[++i];
		else if (!strcmp(argv[i], "--wp"))
			want_wp = 1;
		else if (!strcmp(argv[i], "--squat-on-restart"))
			squat = 1;
		else if (!strcmp(argv[i], "--swap-arena-on-restart"))
			swap_arena = 1;
		else if (!strcmp(argv[i], "--replace-self-with") && i + 1 < argc)
			replace_with = argv[++i];
		else if (!strcmp(argv[i], "--fork-crash"))
			fork_crash = 1;
		else if (!strcmp(argv[i], "--fork-open"))
			fork_open = 1;
		else if (!strcmp(argv[i], "--hook-abort"))
			hook_abort = 1;
		else if (!strcmp(argv[i], "--signal-helper"))
			signal_helper = 1;
		else if (!strcmp(argv[i], "--steal-range-fd") && i + 1 < argc)
			steal_range_file = argv[++i];
		else if (!strcmp(argv[i], "--check-fd") && i + 1 < argc)
			check_fd = (int)strtol(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--range"))
			want_range = 1;
		else if (!strcmp(argv[i], "--no-cleanup"))
			cleanup = 0;
		else if (!strcmp(argv[i], "--churn-threads") && i + 1 < argc)
			churn = (unsigned)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--listen") && i + 1 < argc)
			listen_port = (unsigned)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--fill-mb") && i + 1 < argc)
			fill_mb = strtoull(argv[++i], NULL, 0);
		else {
			fprintf(stderr, "usage: crashy [--objects N] [--payload B] [--inflight K] [--range] "
					"[--crash GEN:KIND]... [--squat-on-restart] [--no-cleanup] "
					"[--churn-threads N] [--listen PORT] [--fill-mb N]\n");
			return 2;
		}
	}
	/* --squat-on-restart: occupy the arena address range before rk_init of
	 * a restarted incarnation (the runtime must then refuse to go warm). */
	if (squat && getenv("REKINDLE_MANIFEST_FD"))
		mmap((void *)0x200000000000ull, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);

	/* --swap-arena-on-restart: put another memfd of the same name and size
	 * at the inherited arena's fd number (the runtime must refuse it). */
	if (swap_arena && getenv("REKINDLE_MANIFEST_FD"))
		swap_inherited_arena("/memfd:rekindle:data");

	int r = rk_init(argc, argv, NULL);
	if (r < 0) {
		fprintf(stderr, "crashy: rk_init: %s\n", strerror(-r));
		return 3;
	}
	const struct rk_restart_info *info = rk_restart_info();

	int listen_errno = listen_port ? listen_on(listen_port) : 0;
	rk_arena *a = rk_arena_open("data", (256ull << 20) + (fill_mb << 20) * 2);
	if (!a) {
		fprintf(stderr, "crashy: rk_arena_open: %s\n", strerror(errno));
		return 3;
	}
	const char *state = "rebuilt";
	struct node *head;
	long found = 0;
	struct rk_sweep_stats sw = {0};
	char *range = NULL;
	if (want_range) {
		if (!rk_is_recovery())
			range = mmap(RANGE_ADDR, RANGE_LEN, PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		else
			range = RANGE_ADDR;
	}
	int range_state = 0, fill_ok = 1;
	if (want_wp)
		open_wp_arena();
	if (rk_is_recovery()) {
		head = rk_root_get(a, "list");
		found = verify(a, head, objects, payload, cleanup);
		state = found < 0 ? "corrupt" : "preserved";
		if (fill_mb)
			fill_ok = fill_verify(a, fill_mb) == (long)fill_mb;
		if (want_range)
			range_state = rk_preserve_range(range, RANGE_LEN) == 1 && !strcmp(range, "range-data") ? 1 : -1;
		r = rk_finish_recovery(cleanup, &sw);
		if (r < 0)
			fprintf(stderr, "crashy: rk_finish_recovery: %s\n", strerror(-r));
	} else {
		head = build(a, objects, payload);
		found = (long)objects;
		if (fill_mb && fill(a, fill_mb) < 0)
			return 3;
		if (fill_mb)
			fill_ok = fill_verify(a, fill_mb) == (long)fill_mb;
		rk_root_set(a, "list", head);
		static_head = head;
		if (want_range) {
			strcpy(range, "range-data");
			range_state = rk_preserve_range(range, RANGE_LEN) == 0 ? 2 : -1;
		}
		if (steal_range_file)
			steal_range_fd(steal_range_file);
	}
	incarnations_seen++;
	if (!preserved_fn)
		preserved_fn = in_image_fn;
	struct rk_arena_stats st;
	rk_arena_stats(a, &st);
	static const char *kinds[] = {"fresh", "warm", "cold"};
	char comm[16] = "";
	prctl(PR_GET_NAME, comm);
	printf("{\"app\":\"state\",\"pid\":%d,\"generation\":%u,\"kind\":\"%s\",\"state\":\"%s\",\"objects\":%ld,"
	       "\"head\":\"%p\",\"arena_base\":\"0x%llx\",\"static_head_ok\":%s,\"incarnations_seen\":%llu,"
	       "\"literal\":\"%s\",\"fn_ok\":%s,\"swept_objects\":%llu,\"swept_bytes\":%llu,\"kept_objects\":%llu,"
	       "\"range\":%d,\"allocated_bytes\":%llu,\"reason\":\"%s\",\"decision\":\"%s\",\"statics_restored\":%u,"
	       "\"listen_errno\":%d,\"fill_ok\":%s,\"comm\":\"%s\",\"check_fd_open\":%d,\"open_fds\":%d,"
	       "\"arena_fd_cloexec\":%d}\n",
	       getpid(), info->generation, kinds[info->kind], state, found, (void *)head,
	       (unsigned long long)st.base, static_head == head ? "true" : "false",
	       (unsigned long long)incarnations_seen, preserved_literal, preserved_fn == in_image_fn ? "true" : "false",
	       (unsigned long long)sw.objects_freed, (unsigned long long)sw.bytes_freed,
	       (unsigned long long)sw.objects_kept, range_state, (unsigned long long)st.allocated_bytes,
	       info->reason, info->decision, info->statics_restored, listen_errno,
	       fill_ok ? "true" : "false", comm, check_fd < 0 ? -1 : fcntl(check_fd, F_GETFD) >= 0, count_open_fds(),
	       arena_fd_cloexec("/memfd:rekindle:data"));
	fflush(stdout);

	/* objects of "requests in flight": allocated, reachable from nothing */
	for (uint64_t i = 0; i < inflight; i++)
		rk_alloc(a, 64 + (i % 7) * 100);

	/* threads allocating and freeing in the arena while main dies */
	pthread_t tids[8];
	for (unsigned i = 0; i < churn && i < 8; i++)
		pthread_create(&tids[i], NULL, churn_main, a);
	if (churn)
		nanosleep(&(struct timespec){0, 30 * 1000 * 1000}, NULL);

	if (info->generation == 0 && fork_crash)
		fork_and_crash_child();
	if (info->generation == 0 && fork_open)
		fork_and_open_arena();
	if (hook_abort)
		rk_set_failure_hook(abort_in_hook, NULL);
	if (info->generation == 0 && signal_helper)
		signal_children();
	if (info->generation == 0 && replace_with)
		replace_own_binary(replace_with);
	for (int i = 0; i < ncrash; i++) {
		char *colon = strchr(crash_at[i], ':');
		if (colon && strtoul(crash_at[i], NULL, 10) == info->generation)
			die_as(colon + 1, a);
	}
	return 0;
}
