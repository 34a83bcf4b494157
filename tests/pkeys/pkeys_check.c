/*
 * pkeys_check.c - functional test of RK_ARENA_WRITE_PROTECT (memory
 * protection keys) for a CPU that has PKU.  On a host with PKU it runs every
 * check natively (tests/test_pkeys.py); where the host has none it is built
 * static and booted as /init of a tiny initramfs under QEMU TCG
 * (tests/pkeys/run_qemu.sh), whose emulated CPU has PKU, and on the host it
 * checks the warned fallback and skips the rest.
 *
 * Without arguments it is the driver: as PID 1 it mounts /proc and /dev,
 * then runs each sub-test in a fresh process (fork + exec of itself, so each
 * one starts with its own rk_init) and powers the machine off.  Each sub-test
 * prints "PASS name: ..." / "FAIL name: ..." / "SKIP name: ..." / "INFO ..."
 * lines and exits with its number of failures.  The driver ends with
 * "PKEYS_CHECK_DONE failed=N".
 */
#include <rekindle.h>

#include <cpuid.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures;

#define PASS(name, ...) report("PASS", name, __VA_ARGS__)
#define CHECK(cond, name, ...) report((cond) ? "PASS" : "FAIL", name, __VA_ARGS__)

__attribute__((format(printf, 3, 4))) static bool report(const char *what, const char *name, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s %s: ", what, name);
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
	va_end(ap);
	if (strcmp(what, "FAIL") == 0)
		failures++;
	return strcmp(what, "FAIL") != 0;
}

static _Noreturn void die(const char *what)
{
	printf("FAIL setup: %s: %s\n", what, strerror(errno));
	fflush(stdout);
	_exit(100);
}

/* ---- PKRU access (the runtime's own inlines are internal) ---------------- */

static bool have_pku; /* CPUID.7.0:ECX.PKU and OSPKE (the kernel turned it on) */

/* 0 without PKU, where rdpkru/wrpkru are invalid opcodes */
static __attribute__((noinline)) uint32_t pkru_read(void)
{
	if (!have_pku)
		return 0;
	uint32_t eax, edx, ecx = 0;
	__asm__ volatile(".byte 0x0f,0x01,0xee" : "=a"(eax), "=d"(edx) : "c"(ecx)); /* rdpkru */
	return eax;
}

static inline void pkru_write(uint32_t v)
{
	if (!have_pku)
		return;
	__asm__ volatile(".byte 0x0f,0x01,0xef" : : "a"(v), "c"(0), "d"(0) : "memory"); /* wrpkru */
}

#define WD(k) (2u << (2 * (k)))
#define AD(k) (1u << (2 * (k)))

static void cpu_flags(bool *pku, bool *ospke)
{
	unsigned a, b, c, d;
	*pku = *ospke = false;
	if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
		*pku = c & (1u << 3);
		*ospke = c & (1u << 4);
	}
}

/* ---- probing an access: a SIGSEGV handler that jumps back ---------------- */

struct probe {
	bool faulted;
	int code;
	unsigned pkey;
	void *addr;
	uint32_t pkru_in_handler; /* what the kernel gave the handler */
};

static __thread sigjmp_buf probe_jmp;
static __thread volatile int probe_armed;
static __thread struct probe probe_res;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	uint32_t pkru = pkru_read(); /* first thing: the PKRU the kernel set up */
	if (!probe_armed) {
		signal(sig, SIG_DFL);
		return; /* an unexpected fault: die of it on return */
	}
	probe_res.faulted = true;
	probe_res.code = si->si_code;
	probe_res.pkey = si->si_pkey;
	probe_res.addr = si->si_addr;
	probe_res.pkru_in_handler = pkru;
	probe_armed = 0;
	siglongjmp(probe_jmp, 1);
}

/* old: where to save the handler it replaces (NULL: not kept) */
static void install_probe_handler_saving(struct sigaction *old)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, old) < 0)
		die("sigaction SIGSEGV");
}

static void install_probe_handler(void)
{
	install_probe_handler_saving(NULL);
}

/* Writes (or reads) *p in this thread and says whether it faulted.  A
 * siglongjmp out of a handler keeps the handler's PKRU (the kernel's
 * init_pkru): put the thread's own value back. */
static struct probe probe_access(volatile uint64_t *p, bool write, uint64_t v)
{
	volatile uint32_t saved = pkru_read();
	memset(&probe_res, 0, sizeof probe_res);
	if (sigsetjmp(probe_jmp, 1) == 0) {
		probe_armed = 1;
		if (write)
			*p = v;
		else
			(void)*p;
		probe_armed = 0;
	}
	pkru_write(saved);
	return probe_res;
}

static bool is_pku_fault(const struct probe *r, int key, const volatile void *addr)
{
	return r->faulted && r->code == SEGV_PKUERR && (int)r->pkey == key && r->addr == addr;
}

static const char *probe_str(const struct probe *r, char *buf, size_t cap)
{
	if (!r->faulted)
		snprintf(buf, cap, "no fault");
	else
		snprintf(buf, cap, "SIGSEGV si_code=%d%s si_pkey=%u si_addr=%p handler PKRU=0x%08x", r->code,
			 r->code == SEGV_PKUERR ? " (SEGV_PKUERR)" : "", r->pkey, r->addr,
			 r->pkru_in_handler);
	return buf;
}

/* The key of a newly protected arena: the one whose bits opening it changed. */
static int key_from_pkru(uint32_t before, uint32_t after)
{
	for (int k = 1; k < 16; k++)
		if (((before ^ after) >> (2 * k)) & 3u)
			return k;
	return -1;
}

static void init_runtime(int argc, char **argv, unsigned flags)
{
	struct rk_options o = {.flags = flags};
	int r = rk_init(argc, argv, &o);
	if (r < 0) {
		errno = -r;
		die("rk_init");
	}
}

/* ---- sub-test "basic": (a) .. (e) and PKRU around signal handlers ------- */

static volatile uint32_t usr1_pkru;
static void on_usr1(int sig)
{
	(void)sig;
	usr1_pkru = pkru_read();
	pkru_write(0); /* open every key: sigreturn must undo this */
}

static rk_arena *h_arena;
static volatile uint64_t *h_obj;
static struct probe h_probe;
static void on_usr2(int sig)
{
	(void)sig;
	rk_unsafe_begin(h_arena);
	h_probe = probe_access(h_obj + 2, true, 0x9999);
	rk_unsafe_end(h_arena);
}

static int test_basic(int argc, char **argv)
{
	char b1[160];
	init_runtime(argc, argv, RK_OPT_NO_SIGNAL_HANDLERS);
	install_probe_handler();
	uint32_t pkru0 = pkru_read();
	printf("INFO basic: PKRU at start 0x%08x\n", pkru0);
	rk_arena *plain = rk_arena_open("plain", 16u << 20);
	rk_arena *a = rk_arena_open_flags("wp", 64u << 20, RK_ARENA_WRITE_PROTECT);
	if (!plain || !a)
		die("rk_arena_open_flags");
	uint32_t pkru1 = pkru_read();
	/* (a) */
	if (!have_pku) {
		CHECK(!rk_arena_write_protected(a), "a.fallback",
		      "no PKU on this CPU: rk_arena_write_protected()=false, arena usable unprotected");
		volatile uint64_t *p = rk_alloc(a, 64);
		*p = 7; /* writable everywhere */
		CHECK(p && *p == 7, "a.fallback-write", "write outside a region works when unprotected");
		printf("SKIP basic: (b)-(e) need PKU\n");
		return failures;
	}
	CHECK(rk_arena_write_protected(a), "a.protected", "rk_arena_write_protected()=true after RK_ARENA_WRITE_PROTECT");
	CHECK(!rk_arena_write_protected(plain), "a.plain-unprotected", "an arena opened without the flag is not");
	int key = key_from_pkru(pkru0, pkru1);
	CHECK(key > 0 && (pkru1 & WD(key)) && !(pkru1 & AD(key)), "a.pkru-after-open",
	      "key %d, PKRU 0x%08x -> 0x%08x: write-disabled, readable", key, pkru0, pkru1);

	/* (b) reads outside regions; the object is initialised in a region */
	volatile uint64_t *p = rk_alloc(a, 4 * sizeof(uint64_t));
	if (!p)
		die("rk_alloc");
	rk_unsafe_begin(a);
	p[0] = 0x1111;
	p[1] = 0x2222;
	rk_unsafe_end(a);
	struct probe r = probe_access(p, false, 0);
	CHECK(!r.faulted && p[0] == 0x1111 && p[1] == 0x2222, "b.read-outside", "read %#lx %#lx outside any region",
	      (unsigned long)p[0], (unsigned long)p[1]);

	/* (c) a stray write faults with SEGV_PKUERR and does not land */
	r = probe_access(p, true, 0xbad);
	CHECK(is_pku_fault(&r, key, p) && p[0] == 0x1111, "c.stray-write-faults", "%s; value still %#lx",
	      probe_str(&r, b1, sizeof b1), (unsigned long)p[0]);
	CHECK(r.faulted && (r.pkru_in_handler & AD(key)), "c.handler-pkru",
	      "the handler ran with the kernel's init PKRU 0x%08x (key %d access-disabled, not the interrupted 0x%08x)",
	      r.pkru_in_handler, key, pkru1);
	/* the same write in a child with no handler: it dies of SIGSEGV */
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		p[1] = 0xbad;
		_exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) < 0)
		die("waitpid");
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "c.stray-write-kills", "unhandled, the child died of %s",
	      WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "nothing (exited)");
	/* the write on the plain arena is not affected */
	volatile uint64_t *q = rk_alloc(plain, 8);
	r = probe_access(q, true, 5);
	CHECK(!r.faulted && *q == 5, "c.plain-arena-writable", "the unprotected arena is writable outside regions");

	/* (d) regions open the key, nested ones until the outermost end */
	rk_unsafe_begin(a);
	r = probe_access(p, true, 0x3333);
	CHECK(!r.faulted && p[0] == 0x3333, "d.write-in-region", "PKRU 0x%08x, write landed", pkru_read());
	rk_unsafe_begin(a);
	rk_unsafe_begin(a);
	rk_unsafe_end(a);
	r = probe_access(p, true, 0x4444);
	CHECK(!r.faulted && p[0] == 0x4444, "d.nested-inner-end", "after an inner end (depth 2) the write still lands");
	rk_unsafe_end(a);
	r = probe_access(p + 1, true, 0x5555);
	CHECK(!r.faulted && p[1] == 0x5555, "d.nested-depth1", "depth 1: still writable");
	rk_unsafe_end(a);
	r = probe_access(p, true, 0xbad);
	CHECK(is_pku_fault(&r, key, p) && p[0] == 0x4444 && pkru_read() == pkru1, "d.outermost-end",
	      "after the outermost end: %s; PKRU back to 0x%08x", probe_str(&r, b1, sizeof b1), pkru_read());
	rk_unsafe_end(a); /* unbalanced: ignored */
	rk_unsafe_begin(a);
	r = probe_access(p, true, 0x6666);
	rk_unsafe_end(a);
	CHECK(!r.faulted && pkru_read() == pkru1, "d.unbalanced-end", "an extra end is ignored; regions still work");
	rk_unsafe_begin(plain); /* another arena's region does not open this one */
	r = probe_access(p, true, 0xbad);
	rk_unsafe_end(plain);
	CHECK(is_pku_fault(&r, key, p), "d.other-arena-region", "a region of another arena leaves it closed: %s",
	      probe_str(&r, b1, sizeof b1));

	/* PKRU and signals: sigreturn puts the interrupted PKRU back */
	if (signal(SIGUSR1, on_usr1) == SIG_ERR)
		die("signal SIGUSR1");
	rk_unsafe_begin(a);
	uint32_t in_region = pkru_read();
	raise(SIGUSR1);
	uint32_t after = pkru_read();
	r = probe_access(p, true, 0x7777);
	rk_unsafe_end(a);
	CHECK((usr1_pkru & AD(key)) && after == in_region && !r.faulted,
	      "signal.pkru", "in a region PKRU 0x%08x; handler entered with 0x%08x (key closed); after sigreturn 0x%08x",
	      in_region, usr1_pkru, after);
	raise(SIGUSR1);
	CHECK(pkru_read() == pkru1, "signal.pkru-outside", "outside regions: handler 0x%08x, after sigreturn 0x%08x",
	      usr1_pkru, pkru_read());

	/* A handler that interrupted a region of the arena opens its own region
	 * (the thread already has its slot): the kernel closed the key for the
	 * handler, so the nested begin must open it again. */
	h_arena = a;
	h_obj = p;
	if (signal(SIGUSR2, on_usr2) == SIG_ERR)
		die("signal SIGUSR2");
	rk_unsafe_begin(a);
	raise(SIGUSR2);
	rk_unsafe_end(a);
	CHECK(!h_probe.faulted && p[2] == 0x9999, "signal.region-in-handler",
	      "rk_unsafe_begin in a handler that interrupted a region: %s", probe_str(&h_probe, b1, sizeof b1));
	h_probe.faulted = false;
	raise(SIGUSR2);
	CHECK(!h_probe.faulted, "signal.region-in-handler-outside",
	      "the same handler outside a region: %s", probe_str(&h_probe, b1, sizeof b1));
	CHECK(pkru_read() == pkru1, "signal.after-handlers", "PKRU 0x%08x afterwards", pkru_read());

	/* fork inside a region: the child ends the region and is protected */
	fflush(stdout);
	rk_unsafe_begin(a);
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		rk_unsafe_end(a);
		struct probe c = probe_access(p, true, 0xbad);
		_exit(is_pku_fault(&c, key, p) ? 0 : 1);
	}
	rk_unsafe_end(a);
	if (waitpid(pid, &st, 0) < 0)
		die("waitpid");
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "d.fork-in-region",
	      "a child forked inside a region is protected again after its rk_unsafe_end (%s)",
	      WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "stray write faulted" : "stray write landed");

	/* (e) the runtime's own writers, outside any region */
	uint32_t before = pkru_read();
	bool ok = true;
	uint64_t *objs[2000];
	for (int i = 0; i < 2000; i++) { /* enough to carve new slabs and grow */
		objs[i] = rk_alloc(a, 16 + (size_t)(i % 37) * 48);
		ok &= objs[i] != NULL;
	}
	CHECK(ok && pkru_read() == before, "e.rk_alloc", "2000 allocations outside regions; PKRU unchanged 0x%08x",
	      pkru_read());
	for (int i = 0; i < 2000; i += 2)
		rk_free(a, objs[i]);
	CHECK(pkru_read() == before, "e.rk_free", "1000 frees; PKRU unchanged");
	uint64_t *z = rk_calloc(a, 100, sizeof(uint64_t));
	ok = z != NULL;
	for (int i = 0; ok && i < 100; i++)
		ok = z[i] == 0;
	CHECK(ok && pkru_read() == before, "e.rk_calloc", "zeroed, PKRU unchanged");
	rk_unsafe_begin(a);
	for (int i = 0; i < 100; i++)
		z[i] = (uint64_t)i * 3;
	rk_unsafe_end(a);
	uint64_t *z2 = rk_realloc(a, z, 64 * 1024);
	ok = z2 != NULL;
	for (int i = 0; ok && i < 100; i++)
		ok = z2[i] == (uint64_t)i * 3;
	CHECK(ok && pkru_read() == before, "e.rk_realloc", "grown to 64 KiB, contents copied, PKRU unchanged");
	CHECK(rk_root_set(a, "table", z2) == 0 && rk_root_get(a, "table") == z2 && pkru_read() == before,
	      "e.rk_root_set-get", "root set and read back outside regions");
	CHECK(rk_root_set(a, "table", NULL) == 0 && rk_root_get(a, "table") == NULL, "e.rk_root-remove",
	      "root removed");
	rk_free(a, z2);
	rk_unsafe_begin(a);
	void *in = rk_alloc(a, 100);
	r = probe_access(p, true, 0x8888);
	rk_unsafe_end(a);
	CHECK(in && !r.faulted, "e.alloc-in-region", "rk_alloc inside a region leaves the region writable");
	r = probe_access(p, true, 0xbad);
	CHECK(is_pku_fault(&r, key, p), "e.still-protected", "after all that, a stray write still faults");
	for (int i = 1; i < 2000; i += 2)
		rk_free(a, objs[i]);
	return failures;
}

/* ---- sub-test "thread": (f) --------------------------------------------- */

static rk_arena *t_arena;
static volatile uint64_t *t_obj;
static int t_key;
static pthread_barrier_t t_bar;

static void *early_thread(void *arg)
{
	(void)arg;
	char b1[160];
	pthread_barrier_wait(&t_bar); /* the main thread opens the arena */
	pthread_barrier_wait(&t_bar);
	uint32_t pk = pkru_read();
	struct probe r = probe_access(t_obj, false, 0);
	CHECK(is_pku_fault(&r, t_key, t_obj), "f.early-thread-no-read",
	      "a thread started before the open (PKRU 0x%08x) cannot read: %s", pk, probe_str(&r, b1, sizeof b1));
	rk_unsafe_begin(t_arena);
	r = probe_access(t_obj + 1, true, 0xea);
	rk_unsafe_end(t_arena);
	CHECK(!r.faulted && t_obj[1] == 0xea, "f.early-thread-region", "it can write inside a region");
	r = probe_access(t_obj, false, 0);
	struct probe w = probe_access(t_obj, true, 0xbad);
	CHECK(!r.faulted && is_pku_fault(&w, t_key, t_obj), "f.early-thread-after-region",
	      "after its first region it reads, and a stray write faults");
	return NULL;
}

static void *late_thread(void *arg)
{
	(void)arg;
	char b1[160];
	uint32_t pk = pkru_read();
	struct probe r = probe_access(t_obj, false, 0);
	CHECK(!r.faulted && t_obj[0] == 0x10, "f.new-thread-read", "a thread started after the open reads (PKRU 0x%08x)",
	      pk);
	r = probe_access(t_obj, true, 0xbad);
	CHECK(is_pku_fault(&r, t_key, t_obj) && t_obj[0] == 0x10, "f.new-thread-stray-write", "%s",
	      probe_str(&r, b1, sizeof b1));
	rk_unsafe_begin(t_arena);
	r = probe_access(t_obj + 2, true, 0x1a);
	rk_unsafe_end(t_arena);
	CHECK(!r.faulted && t_obj[2] == 0x1a, "f.new-thread-region", "writes inside its region");
	void *x = rk_alloc(t_arena, 200);
	rk_free(t_arena, x);
	CHECK(x != NULL, "f.new-thread-alloc", "rk_alloc/rk_free from the thread outside regions");
	return NULL;
}

/* A region open in one thread does not open the key in another. */
static atomic_int region_phase;
static void *region_holder(void *arg)
{
	(void)arg;
	rk_unsafe_begin(t_arena);
	atomic_store(&region_phase, 1);
	while (atomic_load(&region_phase) != 2)
		sched_yield();
	rk_unsafe_end(t_arena);
	return NULL;
}

static int test_thread(int argc, char **argv)
{
	char b1[160];
	init_runtime(argc, argv, RK_OPT_NO_SIGNAL_HANDLERS);
	if (!have_pku) {
		printf("SKIP thread: needs PKU\n");
		return 0;
	}
	install_probe_handler();
	pthread_t early, late, holder;
	if (pthread_barrier_init(&t_bar, NULL, 2) != 0)
		die("pthread_barrier_init");
	if (pthread_create(&early, NULL, early_thread, NULL) != 0)
		die("pthread_create");
	pthread_barrier_wait(&t_bar);
	uint32_t before = pkru_read();
	t_arena = rk_arena_open_flags("wp", 16u << 20, RK_ARENA_WRITE_PROTECT);
	if (!t_arena)
		die("rk_arena_open_flags");
	t_key = key_from_pkru(before, pkru_read());
	t_obj = rk_calloc(t_arena, 4, sizeof(uint64_t));
	rk_unsafe_begin(t_arena);
	t_obj[0] = 0x10;
	rk_unsafe_end(t_arena);
	pthread_barrier_wait(&t_bar);
	if (pthread_join(early, NULL) != 0)
		die("pthread_join");
	if (pthread_create(&late, NULL, late_thread, NULL) != 0 || pthread_join(late, NULL) != 0)
		die("pthread_create/join");
	if (pthread_create(&holder, NULL, region_holder, NULL) != 0)
		die("pthread_create");
	while (atomic_load(&region_phase) != 1)
		sched_yield();
	struct probe r = probe_access(t_obj, true, 0xbad);
	CHECK(is_pku_fault(&r, t_key, t_obj) && !rk_component_is_safe(t_arena), "f.region-is-per-thread",
	      "another thread's open region does not open the key here: %s", probe_str(&r, b1, sizeof b1));
	atomic_store(&region_phase, 2);
	if (pthread_join(holder, NULL) != 0)
		die("pthread_join");
	return failures;
}

/* ---- sub-test "multi": two protected arenas, handlers, threads, fork --- */

static rk_arena *m_a, *m_b;
static volatile uint64_t *m_pa, *m_pb;
static int m_ka, m_kb;
static struct probe m_hb, m_ha;
static volatile uint32_t m_handler_pkru;

/* Interrupts a region of m_a: a region of m_b of its own */
static void on_usr1_other(int sig)
{
	(void)sig;
	m_handler_pkru = pkru_read();
	rk_unsafe_begin(m_b);
	m_hb = probe_access(m_pb, true, 0xb1);
	rk_unsafe_end(m_b);
	m_ha = probe_access(m_pa + 1, true, 0xbad); /* the handler is not in m_a's region */
}

static struct probe m_born_before, m_born_region, m_born_after, m_born_b;
static void *born_in_region(void *arg)
{
	(void)arg;
	m_born_before = probe_access(m_pa + 2, true, 0xc1); /* the creator's PKRU, inherited */
	rk_unsafe_begin(m_a);
	m_born_region = probe_access(m_pa + 2, true, 0xc2);
	rk_unsafe_end(m_a);
	m_born_after = probe_access(m_pa + 2, true, 0xbad);
	m_born_b = probe_access(m_pb + 2, true, 0xbad);
	return NULL;
}

static int test_multi(int argc, char **argv)
{
	char b1[160], b2[160];
	init_runtime(argc, argv, RK_OPT_NO_SIGNAL_HANDLERS);
	if (!have_pku) {
		printf("SKIP multi: needs PKU\n");
		return 0;
	}
	install_probe_handler();
	uint32_t p0 = pkru_read();
	m_a = rk_arena_open_flags("wp_a", 16u << 20, RK_ARENA_WRITE_PROTECT);
	uint32_t p1 = pkru_read();
	m_b = rk_arena_open_flags("wp_b", 16u << 20, RK_ARENA_WRITE_PROTECT);
	uint32_t closed = pkru_read();
	if (!m_a || !m_b)
		die("rk_arena_open_flags");
	m_ka = key_from_pkru(p0, p1);
	m_kb = key_from_pkru(p1, closed);
	m_pa = rk_calloc(m_a, 4, sizeof(uint64_t));
	m_pb = rk_calloc(m_b, 4, sizeof(uint64_t));
	if (!m_pa || !m_pb || m_ka <= 0 || m_kb <= 0 || m_ka == m_kb)
		die("setup");

	/* regions of two arenas, interleaved: each end closes its own key only */
	rk_unsafe_begin(m_a);
	rk_unsafe_begin(m_b);
	struct probe wa = probe_access(m_pa, true, 1), wb = probe_access(m_pb, true, 1);
	rk_unsafe_end(m_a);
	struct probe wa2 = probe_access(m_pa, true, 0xbad), wb2 = probe_access(m_pb, true, 2);
	rk_unsafe_end(m_b);
	struct probe wb3 = probe_access(m_pb, true, 0xbad);
	CHECK(!wa.faulted && !wb.faulted && is_pku_fault(&wa2, m_ka, m_pa) && !wb2.faulted &&
		      is_pku_fault(&wb3, m_kb, m_pb) && pkru_read() == closed && m_pa[0] == 1 && m_pb[0] == 2,
	      "multi.interleaved", "keys %d and %d: begin a, begin b, end a (a %s, b writable), end b (b %s); PKRU 0x%08x",
	      m_ka, m_kb, probe_str(&wa2, b1, sizeof b1), probe_str(&wb3, b2, sizeof b2), pkru_read());

	/* the runtime's writers inside a region: the key stays open, PKRU as
	 * the region set it; another arena's writer closes its key again */
	rk_unsafe_begin(m_a);
	uint32_t in = pkru_read();
	void *x = rk_alloc(m_a, 100);
	bool same = pkru_read() == in;
	rk_free(m_a, x);
	same &= pkru_read() == in;
	same &= rk_root_set(m_a, "r", (void *)m_pa) == 0 && rk_root_get(m_a, "r") == m_pa && pkru_read() == in;
	void *y = rk_alloc(m_b, 100);
	same &= y != NULL && pkru_read() == in;
	wa = probe_access(m_pa, true, 3);
	wb = probe_access(m_pb, true, 0xbad);
	rk_unsafe_end(m_a);
	rk_free(m_b, y);
	CHECK(same && !wa.faulted && m_pa[0] == 3 && is_pku_fault(&wb, m_kb, m_pb) && pkru_read() == closed,
	      "multi.writers-in-region", "rk_alloc/rk_free/roots in a region of their arena leave PKRU 0x%08x; "
	      "rk_alloc of the other arena closes its key again: %s", in, probe_str(&wb, b1, sizeof b1));

	/* a handler that interrupted a region of a opens a region of b */
	if (signal(SIGUSR1, on_usr1_other) == SIG_ERR)
		die("signal SIGUSR1");
	rk_unsafe_begin(m_a);
	raise(SIGUSR1);
	wa = probe_access(m_pa, true, 4);
	wb = probe_access(m_pb, true, 0xbad);
	rk_unsafe_end(m_a);
	CHECK(!m_hb.faulted && m_pb[0] == 0xb1 && (m_handler_pkru & AD(m_ka)) && is_pku_fault(&m_ha, m_ka, m_pa + 1),
	      "multi.handler-other-arena", "handler (entered with PKRU 0x%08x) wrote b in its region: %s; a stays "
	      "closed to it: %s", m_handler_pkru, probe_str(&m_hb, b1, sizeof b1), probe_str(&m_ha, b2, sizeof b2));
	CHECK(!wa.faulted && m_pa[0] == 4 && is_pku_fault(&wb, m_kb, m_pb) && pkru_read() == closed,
	      "multi.after-handler", "after sigreturn the interrupted region of a is writable, b is closed (%s)",
	      probe_str(&wb, b1, sizeof b1));

	/* a thread created inside a region inherits the creator's PKRU (key
	 * open) until a region of its own in that arena ends */
	rk_unsafe_begin(m_a);
	pthread_t t;
	if (pthread_create(&t, NULL, born_in_region, NULL) != 0 || pthread_join(t, NULL) != 0)
		die("pthread_create/join");
	wa = probe_access(m_pa, true, 5);
	rk_unsafe_end(m_a);
	printf("INFO multi: a thread created inside a region of a, before any region of its own: %s\n",
	       m_born_before.faulted ? "a stray write faulted" : "a stray write landed (it inherited the open key)");
	CHECK(!m_born_region.faulted && is_pku_fault(&m_born_after, m_ka, m_pa + 2) &&
		      is_pku_fault(&m_born_b, m_kb, m_pb + 2) && !wa.faulted && m_pa[0] == 5,
	      "multi.thread-born-in-region", "after its own region of a: %s; b: %s; the creator's region still "
	      "writable", probe_str(&m_born_after, b1, sizeof b1), probe_str(&m_born_b, b2, sizeof b2));

	/* fork inside nested regions: the child closes the key at its
	 * outermost end, not before */
	fflush(stdout);
	rk_unsafe_begin(m_a);
	rk_unsafe_begin(m_a);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		rk_unsafe_end(m_a);
		struct probe c1 = probe_access(m_pa + 3, true, 6);
		rk_unsafe_end(m_a);
		struct probe c2 = probe_access(m_pa + 3, true, 0xbad);
		struct probe c3 = probe_access(m_pb + 3, true, 0xbad);
		_exit(!c1.faulted && is_pku_fault(&c2, m_ka, m_pa + 3) && is_pku_fault(&c3, m_kb, m_pb + 3) ? 0 : 1);
	}
	rk_unsafe_end(m_a);
	wa = probe_access(m_pa, true, 7);
	rk_unsafe_end(m_a);
	int st;
	if (waitpid(pid, &st, 0) < 0)
		die("waitpid");
	wa2 = probe_access(m_pa, true, 0xbad);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && !wa.faulted && is_pku_fault(&wa2, m_ka, m_pa),
	      "multi.fork-in-nested-region", "the child: writable after its inner end, protected after its outermost "
	      "(%s); the parent likewise", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "ok" : "wrong");
	return failures;
}

/* ---- sub-test "warm": (g) the runtime's handler with a protected arena -- */

static volatile uintptr_t null_addr; /* 0, out of the compiler's sight */

static int test_warm(int argc, char **argv)
{
	init_runtime(argc, argv, 0); /* the runtime's own fault handlers */
	const struct rk_restart_info *ri = rk_restart_info();
	rk_arena *a = rk_arena_open_flags("warm", 16u << 20, RK_ARENA_WRITE_PROTECT);
	if (!a)
		die("rk_arena_open_flags");
	printf("INFO warm: generation %u kind %d signal %d reason \"%s\" decision \"%s\"\n", ri->generation, ri->kind,
	       ri->signal, ri->reason, ri->decision);
	fflush(stdout);
	if (!have_pku) {
		printf("SKIP warm: needs PKU\n");
		return 0;
	}
	if (ri->generation == 0) {
		CHECK(ri->kind == RK_START_FRESH && rk_arena_write_protected(a), "g.fresh", "first start, protected");
		uint64_t *v = rk_alloc(a, 64);
		rk_unsafe_begin(a);
		v[0] = 0xC0FFEE;
		rk_unsafe_end(a);
		rk_root_set(a, "v", v);
		printf("INFO warm: wrote 0xC0FFEE in a region, now a NULL write outside regions\n");
		fflush(stdout);
		*(volatile int *)null_addr = 1;
		printf("FAIL g.null-fault: survived a NULL write\n");
		return 1;
	}
	uint64_t *v = rk_root_get(a, "v");
	if (ri->generation == 1) {
		CHECK(ri->kind == RK_START_WARM && ri->signal == SIGSEGV && ri->fault_addr == 0, "g.warm-after-null",
		      "warm restart after SIGSEGV at 0 (%.80s)", ri->decision);
		CHECK(v && v[0] == 0xC0FFEE, "g.value-kept", "root \"v\" found, value %#lx",
		      v ? (unsigned long)v[0] : 0ul);
		CHECK(rk_arena_write_protected(a), "g.protected-again", "the new incarnation protects the arena again");
		if (v)
			rk_mark(a, v);
		struct rk_sweep_stats st;
		int r = rk_finish_recovery(true, &st);
		CHECK(r == 0 && st.objects_kept >= 1, "g.recovery", "rk_finish_recovery under protection: kept %lu freed %lu",
		      (unsigned long)st.objects_kept, (unsigned long)st.objects_freed);
		printf("INFO warm: now a stray write into the arena outside regions (the runtime's handler)\n");
		fflush(stdout);
		if (v)
			*(volatile uint64_t *)v = 0xBAD; /* SEGV_PKUERR; must not land */
		printf("FAIL g.stray-write: survived\n");
		return failures + 1;
	}
	CHECK(ri->kind == RK_START_WARM && ri->signal == SIGSEGV && ri->fault_addr == (uint64_t)(uintptr_t)v,
	      "g.warm-after-stray-write", "generation %u warm after SIGSEGV at the object (%.80s)", ri->generation,
	      ri->decision);
	CHECK(v && v[0] == 0xC0FFEE, "g.stray-write-did-not-land", "value still %#lx", v ? (unsigned long)v[0] : 0ul);
	if (v)
		rk_mark(a, v);
	rk_finish_recovery(true, NULL);
	return failures;
}

/* ---- sub-test "stages": a progress record in a protected arena ----------- */

/* The job's state: the stages change in[]; out[] is a temporary.  "square"
 * overwrites out[] from in[] (no hooks); "accumulate" adds out[] to in[],
 * which is wrong to do twice, so its preserve hook saves in[] in a save
 * area (rk_progress_buffer) and its restore hook puts it back.  The app's
 * own writes into the protected arena are in unsafe regions (stages.md);
 * the record's writes are the runtime's and need none. */
#define S_N 4
#define S_FP 0x5eed0001u
struct s_data {
	uint64_t in[S_N], out[S_N];
};
struct s_job {
	rk_arena *a;
	rk_progress *p;
	struct s_data *d;
	uint32_t pkru;  /* PKRU outside regions: every stage call must leave it so */
	bool pkru_ok;
	bool crash;     /* fault in the middle of "accumulate" */
};
static const uint64_t s_after_it0[S_N] = {2, 6, 12, 20}, s_after_it1[S_N] = {6, 42, 156, 420};

static int s_square(void *ctx)
{
	struct s_job *j = ctx;
	j->pkru_ok &= pkru_read() == j->pkru; /* the runtime closed the key before calling us */
	rk_unsafe_begin(j->a);
	for (int i = 0; i < S_N; i++)
		j->d->out[i] = j->d->in[i] * j->d->in[i];
	rk_unsafe_end(j->a);
	return 0;
}

static int s_save(void *ctx)
{
	struct s_job *j = ctx;
	uint64_t *save = rk_progress_buffer(j->p, "in", sizeof j->d->in); /* the runtime writes the entry */
	if (!save)
		return -errno;
	j->pkru_ok &= pkru_read() == j->pkru;
	rk_unsafe_begin(j->a);
	memcpy(save, j->d->in, sizeof j->d->in);
	rk_unsafe_end(j->a);
	return 0;
}

static int s_restore(void *ctx)
{
	struct s_job *j = ctx;
	const uint64_t *save = rk_progress_buffer(j->p, "in", sizeof j->d->in);
	if (!save)
		return -errno;
	rk_unsafe_begin(j->a);
	memcpy(j->d->in, save, sizeof j->d->in);
	rk_unsafe_end(j->a);
	return 0;
}

static int s_accumulate(void *ctx)
{
	struct s_job *j = ctx;
	for (int i = 0; i < S_N; i++) {
		rk_unsafe_begin(j->a);
		j->d->in[i] += j->d->out[i];
		rk_unsafe_end(j->a);
		if (j->crash && i == 1) { /* half done, outside any region: a warm restart */
			printf("INFO stages: NULL write in the middle of \"accumulate\" of iteration 1\n");
			fflush(stdout);
			*(volatile int *)null_addr = 1;
		}
	}
	return 0;
}

/* Runs iteration `want` of the job; returns the last error or 0. */
static int s_iteration(struct s_job *j, uint64_t want, int *ran)
{
	uint64_t it;
	int r = rk_progress_begin_iteration(j->p, &it);
	if (r < 0 || it != want)
		return r < 0 ? r : -EPROTO;
	*ran = 0;
	int rs = rk_stage(j->p, "square", s_square, NULL, NULL, j);
	j->pkru_ok &= pkru_read() == j->pkru;
	int ra = rk_stage(j->p, "accumulate", s_accumulate, s_save, s_restore, j);
	j->pkru_ok &= pkru_read() == j->pkru;
	if (rs < 0 || ra < 0)
		return rs < 0 ? rs : ra;
	*ran = (rs == RK_STAGE_RAN) + (ra == RK_STAGE_RAN);
	r = rk_progress_end_iteration(j->p);
	j->pkru_ok &= pkru_read() == j->pkru;
	return r;
}

static bool s_equal(const uint64_t *a, const uint64_t *b)
{
	return memcmp(a, b, S_N * sizeof *a) == 0;
}

/* A stray write into the job's data outside regions, under the probe's own
 * handler (the runtime's is put back after). */
static void s_stray_write(struct s_job *j, int key, const char *name)
{
	char b1[160];
	if (!have_pku)
		return;
	struct sigaction rt;
	install_probe_handler_saving(&rt);
	uint64_t v = j->d->in[0];
	struct probe r = probe_access(&j->d->in[0], true, 0xbad);
	if (sigaction(SIGSEGV, &rt, NULL) < 0)
		die("sigaction SIGSEGV");
	CHECK(is_pku_fault(&r, key, &j->d->in[0]) && j->d->in[0] == v, name, "a stray write into the job's data: %s",
	      probe_str(&r, b1, sizeof b1));
}

static int s_first(struct s_job *j, const struct rk_restart_info *ri, int key)
{
	struct rk_progress_status st;
	CHECK(ri->kind == RK_START_FRESH && (!have_pku || rk_arena_write_protected(j->a)), "stages.fresh",
	      "first start, protected=%d", rk_arena_write_protected(j->a));
	j->d = rk_calloc(j->a, 1, sizeof *j->d);
	if (!j->d || rk_root_set(j->a, "data", j->d) < 0)
		die("rk_calloc/rk_root_set");
	rk_unsafe_begin(j->a);
	for (int i = 0; i < S_N; i++)
		j->d->in[i] = (uint64_t)i + 1;
	rk_unsafe_end(j->a);
	j->p = rk_progress_open(j->a, "job", S_FP); /* record_create writes the record */
	CHECK(j->p && rk_progress_status(j->p, &st) == 0 && !st.resumed && !st.discarded && pkru_read() == j->pkru,
	      "stages.open-protected", "rk_progress_open made a new record in the protected arena; PKRU 0x%08x "
	      "(0x%08x before)", pkru_read(), j->pkru);
	if (!j->p)
		return failures;
	int ran = 0, r = s_iteration(j, 0, &ran);
	rk_progress_status(j->p, &st);
	CHECK(r == 0 && ran == 2 && s_equal(j->d->in, s_after_it0) && j->pkru_ok, "stages.publish",
	      "iteration 0: %d stages ran (rc %d), %lu record updates outside regions, PKRU closed around every hook",
	      ran, r, (unsigned long)st.record_updates);
	const uint64_t *save = rk_progress_buffer(j->p, "in", sizeof j->d->in);
	CHECK(save && rk_arena_contains(j->a, save) && save[0] == 1 && save[3] == 4, "stages.buffer",
	      "the save area is in the arena and holds iteration 0's input");
	s_stray_write(j, key, "stages.stray-write-faults");
	j->crash = true;
	r = s_iteration(j, 1, &ran);
	CHECK(false, "stages.crash", "survived the NULL write in iteration 1 (%d)", r);
	return failures;
}

static int s_resumed(struct s_job *j, const struct rk_restart_info *ri, int key)
{
	struct rk_progress_status st;
	if (!CHECK(ri->kind == RK_START_WARM, "stages.warm", "generation 1 kind %d: %s / %s", ri->kind, ri->reason,
		   ri->decision))
		return failures; /* cold: the record is gone */
	j->d = rk_root_get(j->a, "data");
	j->p = rk_progress_open(j->a, "job", S_FP);
	bool ok = j->p && j->d && rk_progress_status(j->p, &st) == 0;
	CHECK(ok && st.resumed && st.iteration == 1 && st.stage == 1 && st.phase == RK_PHASE_RUNNING &&
		      strcmp(st.stage_name, "accumulate") == 0,
	      "stages.warm-resume", "%s", ok ? st.reason : "no record or data");
	if (!ok)
		return failures;
	rk_mark(j->a, j->d);
	int r = rk_finish_recovery(true, NULL);
	CHECK(r == 0, "stages.recovery", "rk_finish_recovery with the record's marks: %d", r);
	int ran = 0;
	r = s_iteration(j, 1, &ran); /* "square" skipped, "accumulate" restored and run again */
	uint64_t it = 0;
	if (r == 0 && (r = rk_progress_begin_iteration(j->p, &it)) == 0)
		r = it == 2 ? rk_progress_done(j->p) : -EPROTO;
	rk_progress_status(j->p, &st);
	CHECK(r == 0 && s_equal(j->d->in, s_after_it1) && st.stages_skipped == 1 && st.restores == 1 && j->pkru_ok,
	      "stages.resumed-result", "in[] = %lu %lu %lu %lu after resuming (%lu skipped, %lu restored, %d ran; %d), "
	      "PKRU closed around every hook", (unsigned long)j->d->in[0], (unsigned long)j->d->in[1],
	      (unsigned long)j->d->in[2], (unsigned long)j->d->in[3], (unsigned long)st.stages_skipped,
	      (unsigned long)st.restores, ran, r);
	void *big = rk_progress_buffer(j->p, "in", 64u << 10); /* replaced: new entry, old buffer freed */
	CHECK(big && pkru_read() == j->pkru && rk_progress_reset(j->p, 0) == 0 && pkru_read() == j->pkru,
	      "stages.buffer-replace-reset", "a larger save area and rk_progress_reset, outside regions");
	rk_progress_close(j->p);
	j->p = rk_progress_open(j->a, "job", S_FP + 1); /* another fingerprint: frees the record, makes one */
	CHECK(j->p && rk_progress_status(j->p, &st) == 0 && st.discarded && pkru_read() == j->pkru, "stages.discard",
	      "%s", j->p ? st.reason : "rk_progress_open failed");
	s_stray_write(j, key, "stages.still-protected");
	rk_progress_close(j->p);
	return failures;
}

/* Without the runtime's own write bracket in stages.c, the first record
 * write faults (SEGV_PKUERR) inside the runtime: generation 1 is cold. */
static int test_stages(int argc, char **argv)
{
	init_runtime(argc, argv, 0); /* the runtime's own fault handlers */
	const struct rk_restart_info *ri = rk_restart_info();
	uint32_t before = pkru_read();
	struct s_job j = {.pkru_ok = true};
	j.a = rk_arena_open_flags("stages", 16u << 20, RK_ARENA_WRITE_PROTECT);
	if (!j.a)
		die("rk_arena_open_flags");
	j.pkru = pkru_read();
	int key = key_from_pkru(before, j.pkru); /* exec reset PKRU: this holds in every generation */
	printf("INFO stages: generation %u kind %d reason \"%s\" decision \"%s\" PKRU 0x%08x\n", ri->generation,
	       ri->kind, ri->reason, ri->decision, j.pkru);
	fflush(stdout);
	if (ri->generation == 0)
		return s_first(&j, ri, key);
	if (ri->generation == 1)
		return s_resumed(&j, ri, key);
	CHECK(false, "stages.generation", "generation %u: %s / %s", ri->generation, ri->reason, ri->decision);
	return failures;
}

/* ---- sub-test "prefault": RK_OPT_PREFAULT's thread and a protected arena -- */

/* The runtime's background pre-fault thread starts inside rk_init of a warm
 * restart, before the app reopens (and so protects) its arenas: its PKRU is
 * the kernel's init value, which denies access to every key but 0. */
static int test_prefault(int argc, char **argv)
{
	init_runtime(argc, argv, RK_OPT_PREFAULT);
	const struct rk_restart_info *ri = rk_restart_info();
	rk_arena *a = rk_arena_open_flags("big", 256u << 20, RK_ARENA_WRITE_PROTECT);
	if (!a)
		die("rk_arena_open_flags");
	if (!have_pku) {
		printf("SKIP prefault: needs PKU\n");
		return 0;
	}
	if (ri->generation == 0) {
		uint64_t *first = NULL;
		for (int i = 0; i < 64; i++) {
			uint64_t *b = rk_alloc(a, 1u << 20);
			if (!b)
				die("rk_alloc");
			rk_unsafe_begin(a);
			memset(b, 0x5a, 1u << 20);
			rk_unsafe_end(a);
			if (!first)
				first = b;
		}
		rk_root_set(a, "first", first);
		printf("INFO prefault: 64 MiB written; warm restart with RK_OPT_PREFAULT\n");
		fflush(stdout);
		rk_restart("prefault test");
		printf("FAIL prefault.restart: rk_restart returned\n");
		return 1;
	}
	if (ri->generation == 1) {
		struct timespec ts = {.tv_sec = 3};
		nanosleep(&ts, NULL); /* the pre-fault thread runs meanwhile */
		uint64_t *first = rk_root_get(a, "first");
		CHECK(first && first[0] == 0x5a5a5a5a5a5a5a5aull, "prefault.warm-protected",
		      "generation 1 survived its background pre-fault (see the prefaulted event's bytes)");
		if (first)
			rk_mark(a, first);
		rk_finish_recovery(false, NULL);
		return failures;
	}
	CHECK(false, "prefault.no-fault", "generation %u: the pre-fault thread faulted: %s / %s", ri->generation,
	      ri->reason, ri->decision);
	return failures;
}

/* ---- sub-test "bench": (h) emulated timings ----------------------------- */

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double pair_ns(rk_arena *a, long n, int depth)
{
	uint64_t t0 = now_ns();
	for (long i = 0; i < n; i++) {
		for (int d = 0; d < depth; d++)
			rk_unsafe_begin(a);
		for (int d = 0; d < depth; d++)
			rk_unsafe_end(a);
	}
	return (double)(now_ns() - t0) / (double)n;
}

static int test_bench(int argc, char **argv)
{
	init_runtime(argc, argv, RK_OPT_NO_SIGNAL_HANDLERS);
	rk_arena *plain = rk_arena_open("plain", 16u << 20);
	rk_arena *wp = rk_arena_open_flags("wp", 16u << 20, RK_ARENA_WRITE_PROTECT);
	if (!plain || !wp)
		die("rk_arena_open");
	const long n = 1000000, np = 20000; /* TCG's wrpkru flushes its TLB: slow */
	double e = 0, pl = 0, pr = 0, pr2 = 0;
	for (int rep = 0; rep < 3; rep++) { /* keep the best of 3 */
		uint64_t t0 = now_ns();
		for (long i = 0; i < n; i++)
			__asm__ volatile("" ::: "memory");
		double ev = (double)(now_ns() - t0) / (double)n;
		double p1 = pair_ns(plain, n, 1), p2 = pair_ns(wp, np, 1), p3 = pair_ns(wp, np, 2);
		if (rep == 0 || ev < e)
			e = ev;
		if (rep == 0 || p1 < pl)
			pl = p1;
		if (rep == 0 || p2 < pr)
			pr = p2;
		if (rep == 0 || p3 < pr2)
			pr2 = p3;
	}
	/* the driver is PID 1 only as the guest's /init */
	bool guest = getppid() == 1;
	printf("INFO h.%s: %s: empty loop %.1f ns/iter, rk_unsafe_begin/end pair %.1f ns unprotected, %.1f ns protected "
	       "(%s), %.1f ns nested x2 protected\n",
	       guest ? "emulated" : "native",
	       guest ? "guest timings (under QEMU TCG: emulated, NOT representative of hardware)" : "on this host's CPU",
	       e, pl, pr, rk_arena_write_protected(wp) ? "pkey, wrpkru" : "fallback: unprotected", pr2);
	PASS("h.bench", "measured %ld unprotected and %ld protected pairs, best of 3", n, np);
	return failures;
}

/* ---- driver -------------------------------------------------------------- */

static void setup_pid1(void)
{
	(void)mkdir("/proc", 0555);
	(void)mkdir("/dev", 0755);
	if (mount("proc", "/proc", "proc", 0, NULL) < 0 && errno != EBUSY)
		die("mount /proc");
	if (mount("devtmpfs", "/dev", "devtmpfs", 0, NULL) < 0 && errno != EBUSY)
		die("mount /dev");
	if (fcntl(1, F_GETFD) < 0) { /* no /dev/console in the initramfs: open it now */
		int fd = open("/dev/console", O_RDWR);
		if (fd < 0)
			_exit(101);
		for (int i = 0; i < 3; i++)
			if (fd != i && dup2(fd, i) < 0)
				_exit(102);
	}
}

static void cpuinfo_flags(void)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[4096];
	bool pku = false, ospke = false;
	while (f && fgets(line, sizeof line, f)) {
		if (strncmp(line, "flags", 5) != 0)
			continue;
		pku = strstr(line, " pku") != NULL;
		ospke = strstr(line, " ospke") != NULL;
		break;
	}
	if (f)
		fclose(f);
	bool c_pku, c_ospke;
	cpu_flags(&c_pku, &c_ospke);
	printf("INFO cpu: /proc/cpuinfo flags pku=%d ospke=%d; CPUID.7.0:ECX PKU=%d OSPKE=%d\n", pku, ospke, c_pku,
	       c_ospke);
}

static int run_sub(const char *self, const char *name, char **envp)
{
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		char *args[] = {(char *)self, (char *)name, NULL};
		execve("/proc/self/exe", args, envp);
		die("execve");
	}
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			die("waitpid");
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		printf("SUBTEST %s: ok\n", name);
		return 0;
	}
	if (WIFEXITED(st))
		printf("SUBTEST %s: %d failure(s) (exit %d)\n", name, WEXITSTATUS(st), WEXITSTATUS(st));
	else
		printf("FAIL subtest-%s: killed by signal %d (%s)\n", name, WTERMSIG(st), strsignal(WTERMSIG(st)));
	return 1;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	bool c_ospke;
	cpu_flags(&have_pku, &c_ospke);
	have_pku = have_pku && c_ospke;
	if (argc > 1) {
		if (strcmp(argv[1], "basic") == 0)
			return test_basic(argc, argv);
		if (strcmp(argv[1], "thread") == 0)
			return test_thread(argc, argv);
		if (strcmp(argv[1], "multi") == 0)
			return test_multi(argc, argv);
		if (strcmp(argv[1], "warm") == 0)
			return test_warm(argc, argv);
		if (strcmp(argv[1], "prefault") == 0)
			return test_prefault(argc, argv);
		if (strcmp(argv[1], "stages") == 0)
			return test_stages(argc, argv);
		if (strcmp(argv[1], "bench") == 0)
			return test_bench(argc, argv);
		fprintf(stderr, "usage: %s [basic|thread|multi|warm|prefault|stages|bench]\n", argv[0]);
		return 2;
	}
	bool pid1 = getpid() == 1;
	if (pid1)
		setup_pid1();
	printf("PKEYS_CHECK_START pid1=%d\n", pid1);
	cpuinfo_flags();
	char *env_plain[] = {"PATH=/", NULL};
	/* the warm test faults twice in a row: no crash-loop window */
	char *env_warm[] = {"PATH=/", "REKINDLE_CRASHLOOP_MS=0", NULL};
	int failed = 0;
	failed += run_sub(argv[0], "basic", env_plain);
	failed += run_sub(argv[0], "thread", env_plain);
	failed += run_sub(argv[0], "multi", env_plain);
	failed += run_sub(argv[0], "warm", env_warm);
	failed += run_sub(argv[0], "prefault", env_warm);
	failed += run_sub(argv[0], "stages", env_plain);
	failed += run_sub(argv[0], "bench", env_plain);
	printf("PKEYS_CHECK_DONE failed=%d\n", failed);
	fflush(stdout);
	if (pid1) {
		sync();
		reboot(RB_POWER_OFF);
		for (;;)
			pause();
	}
	return failed ? 1 : 0;
}
