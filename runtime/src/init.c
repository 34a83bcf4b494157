/* init.c - rk_init and the life of arenas across incarnations: reserving the
 * address range, creating and reattaching arenas, deciding warm or cold from
 * what the previous incarnation left in the manifest, ending recovery. */
#include "rk_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_ARENA_BASE 0x200000000000ull /* 32 TiB: far from PIE, heap, mmap, stack */
#define RESERVE_BYTES 0x100000000000ull      /* 16 TiB of address space, PROT_NONE */

struct rk_state rk_g = {.manifest_fd = -1, .manifest_spare_fd = -1, .switch_fd = -1};

/* restart.c */
int rk_restart_setup(int argc, char **argv, int manifest_fd) RK_HIDDEN;
int rk_signals_install(void) RK_HIDDEN;

uint64_t rk_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return dflt;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 0);
	if (errno || *end) {
		fprintf(stderr, "{\"rekindle\":\"warning\",\"what\":\"ignoring malformed %s\"}\n", name);
		return dflt;
	}
	return x;
}

/* ---- reattaching inherited state ----------------------------------------- */

/* An in-place restart execs /proc/self/exe, which names the process "exe":
 * give it back the name it had at the previous rk_init, or, if the manifest
 * was refused, the name it was started with. */
static void process_name_restore(const struct rk_manifest *m)
{
	char now[16] = "";
	if (m && m->comm[0] && memchr(m->comm, 0, sizeof m->comm))
		(void)prctl(PR_SET_NAME, m->comm);
	else if (prctl(PR_GET_NAME, now) == 0 && !strcmp(now, "exe"))
		(void)prctl(PR_SET_NAME, program_invocation_short_name);
}

static void close_inherited_fds(const struct rk_manifest *m)
{
	for (unsigned i = 0; i < m->narenas; i++)
		if (!(m->arenas[i].flags & RK_MARENA_DROPPED) &&
		    rk_fd_is_file(m->arenas[i].fd, m->arenas[i].dev, m->arenas[i].ino))
			close(m->arenas[i].fd);
	for (unsigned i = 0; i < m->nranges; i++)
		if (rk_fd_is_file(m->ranges[i].fd, m->ranges[i].dev, m->ranges[i].ino))
			close(m->ranges[i].fd);
}

/* Unmaps everything a failed warm attempt mapped, reservation included;
 * the caller closes the inherited fds. */
static void undo_warm(void)
{
	munmap((void *)(uintptr_t)rk_g.reserve_base, rk_g.reserve_len);
	memset(rk_g.arenas, 0, sizeof rk_g.arenas);
	rk_g.narenas = 0;
	for (unsigned i = 0; i < rk_nranges; i++)
		munmap((void *)(uintptr_t)rk_ranges[i].addr, rk_ranges[i].len);
	rk_nranges = 0;
}

static void log_arena_dropped(const char *name, const char *why)
{
	struct rk_ev e;
	rk_ev_begin(&e, "arena_dropped");
	rk_ev_str(&e, "arena", name);
	rk_ev_str(&e, "why", why);
	rk_ev_end(&e);
	rk_g.info.arenas_dropped++;
}

/* An independent arena that fails its checks is dropped alone: the others
 * stay warm.  Returns true if it was dropped. */
static bool drop_independent(const struct rk_manifest_arena *d, struct rk_arena *a, const char *why)
{
	if (!(d->flags & RK_ARENA_INDEPENDENT))
		return false;
	char msg[240];
	snprintf(msg, sizeof msg, "independent arena failed its checks: %s", why);
	log_arena_dropped(d->name, msg);
	rk_arena_unreserve(d->base, d->max);
	close(d->fd);
	memset(a, 0, sizeof *a);
	rk_g.narenas--;
	return true;
}

static int attach_arenas(const struct rk_manifest *m, char *why, size_t wl)
{
	for (unsigned i = 0; i < m->narenas; i++) {
		const struct rk_manifest_arena *d = &m->arenas[i];
		struct rk_arena *a = &rk_g.arenas[rk_g.narenas];
		if (d->flags & RK_MARENA_DROPPED) {
			char msg[240];
			snprintf(msg, sizeof msg, "half-changed at the failure: %s", m->decision);
			log_arena_dropped(d->name, msg);
			continue;
		}
		if (d->base < rk_g.reserve_base || d->base + d->max > rk_g.reserve_base + rk_g.reserve_len ||
		    !rk_fd_is_file(d->fd, d->dev, d->ino)) {
			snprintf(why, wl, "arena %.47s: foreign fd or address outside the reserved range", d->name);
			return -EINVAL;
		}
		void *p = mmap((void *)(uintptr_t)d->base, d->max, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
			       d->fd, 0);
		if (p == MAP_FAILED) {
			snprintf(why, wl, "arena %.47s: cannot map at 0x%llx: %s", d->name, (unsigned long long)d->base,
				 strerror(errno));
			return -errno;
		}
		memset(a, 0, sizeof *a);
		a->hdr = p;
		a->hdr_max = d->max;
		rk_fd_set_cloexec(d->fd, true); /* the restart cleared it; not for the app's children */
		a->fd = d->fd;
		a->dev = d->dev;
		a->ino = d->ino;
		a->index = rk_g.narenas++;
		a->inherited = true;
		a->flags = d->flags & (RK_ARENA_INDEPENDENT | RK_ARENA_WRITE_PROTECT);
		rk_strlcpy(a->name, d->name, sizeof a->name);
		int r = rk_arena_validate(a, d->base, d->max, why, wl);
		if (r < 0 && !drop_independent(d, a, why))
			return r;
	}
	return 0;
}

static int attach_ranges(const struct rk_manifest *m, char *why, size_t wl)
{
	for (unsigned i = 0; i < m->nranges; i++) {
		const struct rk_manifest_range *d = &m->ranges[i];
		if (!rk_fd_is_file(d->fd, d->dev, d->ino)) {
			snprintf(why, wl, "preserved range 0x%llx: foreign fd", (unsigned long long)d->addr);
			return -EINVAL;
		}
		void *p = mmap((void *)(uintptr_t)d->addr, d->len, PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_FIXED_NOREPLACE, d->fd, 0);
		if (p != (void *)(uintptr_t)d->addr) {
			if (p != MAP_FAILED)
				munmap(p, d->len);
			snprintf(why, wl, "preserved range 0x%llx+%llu: address already taken in the new process",
				 (unsigned long long)d->addr, (unsigned long long)d->len);
			return -EEXIST;
		}
		rk_fd_set_cloexec(d->fd, true);
		rk_ranges[rk_nranges].fd = d->fd;
		rk_ranges[rk_nranges].dev = d->dev;
		rk_ranges[rk_nranges].ino = d->ino;
		rk_ranges[rk_nranges].addr = d->addr;
		rk_ranges[rk_nranges].len = d->len;
		rk_nranges++;
	}
	return 0;
}

static int try_warm(const struct rk_manifest *m, uint64_t msize, char *why, size_t wl)
{
	rk_g.reserve_base = m->reserve_base;
	rk_g.reserve_len = m->reserve_len;
	rk_g.next_arena_addr = m->next_arena_addr;
	if (!rk_arena_reserve_range(m->reserve_base, m->reserve_len)) {
		snprintf(why, wl, "arena address range 0x%llx+0x%llx is already taken in the new process",
			 (unsigned long long)m->reserve_base, (unsigned long long)m->reserve_len);
		return -EEXIST;
	}
	int r = attach_arenas(m, why, wl);
	if (r == 0)
		r = attach_ranges(m, why, wl);
	if (r < 0) {
		undo_warm();
		return r;
	}
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		rk_arena_recover(&rk_g.arenas[i]);
		rk_g.arenas[i].sweep_pending = true;
	}
	rk_g.info.statics_restored = rk_statics_restore(m, msize);
	return 0;
}

static uint64_t preserved_bytes(void)
{
	uint64_t t = 0;
	struct rk_arena_stats st;
	for (unsigned i = 0; i < rk_g.narenas; i++)
		if (rk_arena_stats(&rk_g.arenas[i], &st) == 0)
			t += st.allocated_bytes;
	for (unsigned i = 0; i < rk_nranges; i++)
		t += rk_ranges[i].len;
	return t;
}

static void log_start(void)
{
	static const char *kinds[] = {"fresh", "warm", "cold"};
	const struct rk_restart_info *in = &rk_g.info;
	struct rk_ev e;
	rk_ev_begin(&e, "start");
	rk_ev_str(&e, "kind", kinds[in->kind]);
	rk_ev_u64(&e, "generation", in->generation);
	if (in->kind != RK_START_FRESH) {
		rk_ev_str(&e, "reason", in->reason);
		rk_ev_str(&e, "decision", in->decision);
		rk_ev_u64(&e, "restart_us", in->restart_ns / 1000);
	}
	rk_ev_u64(&e, "arenas", rk_g.narenas);
	rk_ev_u64(&e, "preserved_bytes", in->preserved_bytes);
	rk_ev_u64(&e, "statics_restored", in->statics_restored);
	if (in->arenas_dropped)
		rk_ev_u64(&e, "arenas_dropped", in->arenas_dropped);
	rk_ev_end(&e);
}

int rk_init(int argc, char **argv, const struct rk_options *opts)
{
	char why[192] = "";
	if (rk_g.initialized)
		return -EALREADY;
	rk_g.start_ns = rk_now_ns();
	rk_g.pid = getpid();
	rk_g.flags = opts ? opts->flags : 0;
	rk_g.crashloop_ms = opts && opts->crashloop_window_ms ? opts->crashloop_window_ms
							      : (unsigned)env_u64("REKINDLE_CRASHLOOP_MS", 1000);
	rk_g.max_fast_failures = opts && opts->max_fast_failures ? opts->max_fast_failures : 5;
	uint64_t base = opts && opts->arena_base ? opts->arena_base : env_u64("REKINDLE_ARENA_BASE", DEFAULT_ARENA_BASE);

	int r = rk_control_open();
	if (r < 0)
		return r;
	(void)rk_sup_open();
	uint64_t msize = 0;
	int inherited_manifest_fd = -1;
	const struct rk_manifest *old = rk_manifest_inherit(&msize, &inherited_manifest_fd, why, sizeof why);
	if (!old && rk_sup_active())
		old = rk_manifest_inherit_supervised(&msize, why, sizeof why);
	if (old == MAP_FAILED) {
		process_name_restore(NULL);
		rk_g.info.kind = RK_START_COLD;
		if (!rk_g.info.reason[0])
			rk_strlcpy(rk_g.info.reason, "unknown: no valid manifest", sizeof rk_g.info.reason);
		rk_strlcpy(rk_g.info.decision, why, sizeof rk_g.info.decision);
		old = NULL;
	} else if (old) {
		process_name_restore(old);
		rk_g.info.generation = old->generation + 1;
		rk_g.info.signal = old->signal;
		rk_g.info.fault_addr = old->fault_addr;
		rk_g.t_restart_ns = old->t_restart_ns;
		rk_g.holder_pid = old->holder_pid;
		rk_g.validator_reap = old->validator_pid;
		rk_strlcpy(rk_g.info.reason, old->reason, sizeof rk_g.info.reason);
		if (old->next_mode == RK_NEXT_WARM && try_warm(old, msize, why, sizeof why) == 0) {
			rk_g.info.kind = RK_START_WARM;
			rk_g.validated = (old->flags & RK_MANIFEST_VALIDATED) != 0;
			rk_strlcpy(rk_g.info.decision, old->decision, sizeof rk_g.info.decision);
			rk_g.recovery = true;
		} else {
			rk_g.info.kind = RK_START_COLD;
			if (old->next_mode == RK_NEXT_WARM) {
				close_inherited_fds(old);
				rk_strlcpy(rk_g.info.decision, why, sizeof rk_g.info.decision);
			} else {
				rk_strlcpy(rk_g.info.decision, old->decision, sizeof rk_g.info.decision);
			}
		}
	}
	if (rk_g.info.kind != RK_START_WARM) {
		/* The range only has to stay the same from now on: if the usual one
		 * is taken, use the next one and say so. */
		uint64_t try = base;
		for (int k = 0; k < 3 && !rk_arena_reserve_range(try, RESERVE_BYTES); k++)
			try += RESERVE_BYTES;
		if (try != base && try < base + 3 * RESERVE_BYTES) {
			struct rk_ev ev;
			rk_ev_begin(&ev, "warning");
			rk_ev_str(&ev, "what", "arena address range taken; using the next one");
			rk_ev_hex(&ev, "wanted", base);
			rk_ev_hex(&ev, "base", try);
			rk_ev_end(&ev);
		}
		rk_g.reserve_base = try;
		rk_g.reserve_len = RESERVE_BYTES;
		rk_g.next_arena_addr = try;
		if (try >= base + 3 * RESERVE_BYTES) {
			int e = errno;
			struct rk_ev ev;
			rk_ev_begin(&ev, "error");
			rk_ev_str(&ev, "what", "cannot reserve the arena address range; set REKINDLE_ARENA_BASE");
			rk_ev_hex(&ev, "base", base);
			rk_ev_i64(&ev, "errno", e);
			rk_ev_end(&ev);
			if (old)
				munmap((void *)old, msize);
			if (inherited_manifest_fd >= 0)
				close(inherited_manifest_fd);
			return -e;
		}
	}
	r = rk_manifest_create(old);
	if (old)
		munmap((void *)old, msize);
	if (r == 0)
		r = rk_restart_setup(argc, argv, rk_g.manifest_fd);
	if (r == 0 && !(rk_g.flags & RK_OPT_NO_SIGNAL_HANDLERS))
		r = rk_signals_install();
	if (r < 0) {
		if (inherited_manifest_fd >= 0)
			close(inherited_manifest_fd);
		return r;
	}
	rk_g.initialized = true;
	rk_reap_teardown_holder();
	rk_g.info.preserved_bytes = preserved_bytes();
	if (rk_g.info.kind == RK_START_WARM && (rk_g.flags & RK_OPT_PREFAULT))
		(void)rk_prefault(true);
	rk_teardown_holder_stand();
	rk_control_begin(rk_g.info.generation, rk_g.recovery ? RK_CTL_RECOVERING : RK_CTL_RUNNING);
	atomic_store(&rk_ctl->preserved_bytes, rk_g.info.preserved_bytes);
	/* Everything above counts; left out are only the messages that report
	 * it (to a supervisor, and the start line) and the spare's offer, which
	 * must follow them (a fstat and the checksum). */
	if (rk_g.info.kind != RK_START_FRESH && rk_g.t_restart_ns)
		rk_g.info.restart_ns = rk_now_ns() - rk_g.t_restart_ns;
	log_start();
	rk_sup_hello();
	rk_manifest_offer_spare(inherited_manifest_fd, rk_sup_send_fds() == 0);
	return 0;
}

void rk_validator_detach(void)
{
	rk_g.validator = true;
	rk_g.manifest = NULL; /* the shared one belongs to the serving process */
	rk_sup_forget();
	/* our own copy of the control block: our unsafe regions are not the app's */
	void *c = mmap(NULL, RK_CONTROL_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (c != MAP_FAILED) {
		memcpy(c, rk_ctl, RK_CONTROL_SIZE);
		rk_ctl = c;
	}
	rk_unsafe_forget_thread();
	rk_tcache_forget_thread();
	/* a fault here ends the validation, not the app */
	for (int sig = 1; sig < 32; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			signal(sig, SIG_DFL);
}

bool rk_is_recovery(void)
{
	return rk_g.recovery;
}

const struct rk_restart_info *rk_restart_info(void)
{
	return &rk_g.info;
}

int rk_finish_recovery(bool cleanup, struct rk_sweep_stats *stats)
{
	struct rk_sweep_stats total = {0};
	if (stats)
		*stats = total;
	rk_reap_teardown_holder();
	if (!rk_g.recovery)
		return 0;
	uint64_t t0 = rk_now_ns();
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		struct rk_arena *a = &rk_g.arenas[i];
		if (!a->hdr || !a->inherited || !a->sweep_pending)
			continue;
		if (!a->reopened) {
			rk_arena_drop(a);
			continue;
		}
		struct rk_sweep_stats st = {0};
		uint32_t wp = rk_wp_write_begin(a);
		/* without cleanup and with no mark set there is nothing to walk:
		 * recovery ends in O(1), whatever the arena's size */
		bool marks = a->marks_set || a->hdr->marks_dirty;
		int r = cleanup ? rk_arena_sweep(a, &st) : marks ? rk_arena_clear_marks(a) : 0;
		if (r == 0)
			a->hdr->marks_dirty = 0;
		rk_wp_write_end(wp);
		a->marks_set = false;
		if (r < 0)
			return r;
		a->sweep_pending = false;
		total.objects_freed += st.objects_freed;
		total.bytes_freed += st.bytes_freed;
		total.objects_kept += st.objects_kept;
		total.bytes_kept += st.bytes_kept;
	}
	rk_g.recovery = false;
	rk_control_set_state(RK_CTL_RUNNING);
	if (stats)
		*stats = total;
	struct rk_ev e;
	rk_ev_begin(&e, "recovered");
	rk_ev_u64(&e, "generation", rk_g.info.generation);
	rk_ev_str(&e, "cleanup", cleanup ? "sweep" : "none");
	rk_ev_u64(&e, "objects_freed", total.objects_freed);
	rk_ev_u64(&e, "bytes_freed", total.bytes_freed);
	rk_ev_u64(&e, "objects_kept", total.objects_kept);
	rk_ev_u64(&e, "bytes_kept", total.bytes_kept);
	rk_ev_u64(&e, "sweep_us", (rk_now_ns() - t0) / 1000);
	rk_ev_end(&e);
	return 0;
}
