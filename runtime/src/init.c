/* init.c - rk_init and the process-wide state (rk_g).  rk_init starts an
 * incarnation: it finds what the previous one left (manifest.c), decides
 * warm or cold, reattaches the preserved state (recovery.c) or reserves a new
 * address range for arenas (arena.c), creates this incarnation's manifest,
 * gets ready for the next restart (restart.c, teardown.c, signals.c) and
 * says how it started. */
#include "rk_internal.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define RESERVE_BYTES 0x100000000000ull /* 16 TiB of address space, PROT_NONE */

struct rk_state rk_g = {.manifest_fd = -1, .manifest_spare_fd = -1, .switch_fd = -1};

uint64_t rk_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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
		rk_ev_str(&e, "code", rk_reason_name(in->decision_code));
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
	rk_options_parse(opts);
	uint64_t base = rk_cfg.arena_base;

	int r = rk_control_open();
	if (r < 0)
		return r;
	(void)rk_sup_open();
	rk_redo_attach();
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
		rk_g.info.decision_code = RK_REASON_MANIFEST_CORRUPT;
		old = NULL;
	} else if (old) {
		process_name_restore(old);
		rk_g.info.generation = old->generation + 1;
		rk_g.info.signal = old->signal;
		rk_g.prev_si_code = old->si_code;
		rk_g.same_fault_count = old->same_fault_count;
		rk_g.info.fault_addr = old->fault_addr;
		rk_g.t_restart_ns = old->t_restart_ns;
		rk_g.holder_pid = old->holder_pid;
		rk_g.validator_reap = old->validator_pid;
		rk_strlcpy(rk_g.info.reason, old->reason, sizeof rk_g.info.reason);
		if (old->next_mode == RK_NEXT_WARM && rk_recovery_attach(old, msize, why, sizeof why) == 0) {
			rk_g.info.kind = RK_START_WARM;
			rk_g.validated = (old->flags & RK_MANIFEST_VALIDATED) != 0;
			rk_strlcpy(rk_g.info.decision, old->decision, sizeof rk_g.info.decision);
			rk_g.info.decision_code = (enum rk_reason)old->decision_code;
			rk_g.recovery = true;
		} else {
			rk_g.info.kind = RK_START_COLD;
			if (old->next_mode == RK_NEXT_WARM) {
				rk_recovery_close_inherited(old);
				rk_strlcpy(rk_g.info.decision, why, sizeof rk_g.info.decision);
				if (rk_g.info.decision_code == RK_REASON_NONE)
					rk_g.info.decision_code = RK_REASON_ARENA_CHECK_FAILED;
			} else {
				rk_strlcpy(rk_g.info.decision, old->decision, sizeof rk_g.info.decision);
				rk_g.info.decision_code = (enum rk_reason)old->decision_code;
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
	if (r == 0 && !(rk_cfg.flags & RK_OPT_NO_SIGNAL_HANDLERS))
		r = rk_signals_install();
	if (r < 0) {
		if (inherited_manifest_fd >= 0)
			close(inherited_manifest_fd);
		return r;
	}
	rk_g.initialized = true;
	rk_reap_teardown_holder();
	rk_g.info.preserved_bytes = preserved_bytes();
	if (rk_g.info.kind == RK_START_WARM && (rk_cfg.flags & RK_OPT_PREFAULT))
		(void)rk_prefault(true);
	rk_teardown_holder_stand();
	rk_control_begin(rk_g.info.generation, rk_g.recovery ? RK_CTL_RECOVERING : RK_CTL_RUNNING);
	rk_redo_hold_until_replayed(); /* after the slots' reset */
	atomic_store(&rk_ctl->preserved_bytes, rk_g.info.preserved_bytes);
	/* Everything above counts; left out are only the messages that report
	 * it (to a supervisor, and the start line) and the spare's offer, which
	 * must follow them (a fstat and the checksum). */
	if (rk_g.info.kind != RK_START_FRESH && rk_g.t_restart_ns)
		rk_g.info.restart_ns = rk_now_ns() - rk_g.t_restart_ns;
	log_start();
	rk_sup_hello();
	rk_manifest_offer_spare(inherited_manifest_fd, rk_sup_send_fds() == 0);
	rk_snapshot_agent_start();
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
