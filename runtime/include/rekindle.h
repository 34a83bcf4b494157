/*
 * rekindle.h - librekindle: preserved arenas and warm restart, in user space.
 *
 * An application keeps its long-lived state in named arenas (memfd-backed
 * shared mappings at fixed virtual addresses).  When it faults, or asks to,
 * the runtime re-executes the same binary from main() with the same argv and
 * environment; the new incarnation finds its arenas mapped at the same
 * addresses, with no copy, and everything transient (stacks, threads, the
 * malloc heap, fds) fresh.  When a warm restart is unsafe the restart goes
 * cold: arenas are dropped and the application runs its own recovery.
 *
 * Typical use:
 *
 *     rk_init(argc, argv, NULL);
 *     rk_arena *kv = rk_arena_open("kv", 1ull << 30);
 *     if (rk_is_recovery()) {
 *         table = rk_root_get(kv, "table");
 *         rk_finish_recovery_mode(RK_CLEANUP_PENDING, NULL); // free what was in flight
 *     } else {
 *         table = build_from_snapshot_or_empty(kv);
 *         rk_root_set(kv, "table", table);
 *     }
 *     ... every change of the table inside rk_unsafe_begin/rk_unsafe_end ...
 *
 * The cleanup frees the objects each thread allocated since its last
 * commit (the end of its last unsafe region), which nothing preserved can
 * point to if the app keeps the publication rule (see "Pending allocations"
 * below).  Its cost is that of the objects in flight, not of the arena.
 *
 * Every decision (warm, cold and why) is logged as one JSON line on stderr
 * starting with {"rekindle":.  Functions returning int return 0 (or a count)
 * on success and -errno on failure unless stated otherwise.
 */
#ifndef REKINDLE_H
#define REKINDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RK_VERSION_MAJOR 0
#define RK_VERSION_MINOR 1

#define RK_MAX_ARENAS 16
#define RK_MAX_RANGES 16
#define RK_NAME_MAX 47 /* arena and root names, without the NUL */

typedef struct rk_arena rk_arena;

/* How this incarnation started. */
enum rk_start_kind {
	RK_START_FRESH = 0, /* first start: no previous incarnation */
	RK_START_WARM = 1,  /* restarted with preserved state */
	RK_START_COLD = 2,  /* restarted, preserved state dropped */
};

/* Why a start is warm or cold: a stable number per reason, the same in the
 * runtime's events (as rk_reason_name), rk_restart_info, the supervisor's
 * protocol and its events.  Numbers are never reused; new reasons are
 * appended.  tests/contract/decisions.tsv holds the cases both deciders
 * (runtime/src/decide.c and supervisor/src/decide.rs) must agree on. */
enum rk_reason {
	RK_REASON_NONE = 0,                  /* first start: nothing was decided */
	RK_REASON_ALL_CHECKS_PASSED = 1,     /* warm */
	RK_REASON_COLD_REQUESTED = 2,        /* rk_restart_cold, `rekindle restart --cold` */
	RK_REASON_FAULT_IN_RUNTIME = 3,      /* the faulting pc is inside librekindle */
	RK_REASON_NO_MANIFEST = 4,           /* the supervisor holds no preserved state */
	RK_REASON_CONTROL_BLOCK_CORRUPT = 5, /* the evidence of unsafe regions is gone */
	RK_REASON_CRASH_LOOP = 6,            /* a failure within the window after a warm start */
	RK_REASON_REPEATED_FAULT = 7,        /* the same fault on the same preserved page again */
	RK_REASON_MANIFEST_BUSY = 8,         /* a failure while the arena list was rewritten */
	RK_REASON_WARM_DISABLED = 9,         /* rk_set_warm_allowed(false) */
	RK_REASON_HOOK_COLD = 10,            /* the app's failure hook chose cold */
	RK_REASON_UNSAFE_REGION_OPEN = 11,   /* a dependent arena was being changed */
	RK_REASON_ARENA_CHECK_FAILED = 12,   /* an arena failed its header or consistency checks */
	RK_REASON_INDEPENDENT_DROPPED = 13,  /* warm, some independent arenas dropped */
	RK_REASON_CROSSCHECK_MISMATCH = 14,  /* warm onto a cross-check's validated state */
	RK_REASON_MANIFEST_CORRUPT = 15,     /* the previous incarnation's manifest is unusable */
	RK_REASON_ADDRESS_TAKEN = 16,        /* an arena's or range's address is taken */
	RK_REASON_FOREIGN_FD = 17,           /* an inherited fd is not the file the manifest names */
	RK_REASON_RESTORED = 18,             /* warm from a durable snapshot (rekindle restore) */
};
#define RK_REASON_COUNT 19

/* The stable snake_case name of a reason ("unsafe_region_open"), as events
 * carry it; "unknown" for a number this header does not know. */
static inline const char *rk_reason_name(enum rk_reason r)
{
	static const char *const names[RK_REASON_COUNT] = {
		"none",           "all_checks_passed",   "cold_requested",          "fault_in_runtime",
		"no_manifest",    "control_block_corrupt", "crash_loop",            "repeated_fault",
		"manifest_busy",  "warm_disabled",       "hook_cold",               "unsafe_region_open",
		"arena_check_failed", "independent_dropped", "crosscheck_mismatch", "manifest_corrupt",
		"address_taken",  "foreign_fd",          "restored",
	};
	return (unsigned)r < RK_REASON_COUNT ? names[r] : "unknown";
}

/* rk_options.flags */
#define RK_OPT_NO_SIGNAL_HANDLERS 0x1u /* do not catch SEGV/BUS/FPE/ILL/ABRT */
#define RK_OPT_PREFAULT 0x2u           /* pre-fault preserved pages in the background */
#define RK_OPT_QUIET 0x4u              /* no event lines on stderr */

struct rk_options {
	unsigned flags;
	/* Start of the address range reserved for arenas; 0 = default
	 * (0x200000000000, or $REKINDLE_ARENA_BASE). */
	uint64_t arena_base;
	/* A second failure within this many ms of a warm restart goes cold;
	 * 0 = default 1000 ($REKINDLE_CRASHLOOP_MS). */
	unsigned crashloop_window_ms;
	/* Give up (die with the original signal) after this many consecutive
	 * incarnations each failing within the window; 0 = default 5. */
	unsigned max_fast_failures;
};

/* Facts about this incarnation and the end of the previous one. */
struct rk_restart_info {
	enum rk_start_kind kind;
	unsigned generation;   /* 0 for the first incarnation */
	int signal;            /* signal that ended the previous one, 0 if none */
	uint64_t fault_addr;   /* si_addr of that signal */
	char reason[128];      /* why the previous incarnation ended */
	char decision[160];    /* why this start is warm or cold */
	uint64_t restart_ns;   /* previous rk_restart() entry to our rk_init() return */
	uint64_t preserved_bytes; /* bytes in use in the arenas we inherited */
	unsigned statics_restored; /* RK_PRESERVED sections restored */
	unsigned arenas_dropped;   /* half-changed arenas not reused (independent ones) */
	enum rk_reason decision_code; /* `decision` as a stable code */
	/* A warm start from a durable snapshot (`rekindle restore`): the
	 * snapshot's id; "" otherwise.  The state is the snapshot's, not the
	 * previous incarnation's: kind is RK_START_WARM, decision_code
	 * RK_REASON_RESTORED. */
	char snapshot[64];
};

/* Sweep statistics from rk_finish_recovery(true, ...). */
struct rk_sweep_stats {
	uint64_t objects_freed;
	uint64_t bytes_freed;
	uint64_t objects_kept;
	uint64_t bytes_kept;
};

/* How rk_finish_recovery_mode cleans up after a warm restart. */
enum rk_cleanup {
	/* Free nothing: the objects in flight at the failure leak.  O(1). */
	RK_CLEANUP_NONE = 0,
	/* The default: free the dead threads' pending allocations (each
	 * thread's allocations since its last commit).  O(objects in flight);
	 * needs no marks.  Sound if the app keeps the publication rule. */
	RK_CLEANUP_PENDING = 1,
	/* Mark and sweep: free every object rk_mark() did not reach since
	 * rk_init.  O(arena): a walk of every object and every free list. */
	RK_CLEANUP_SWEEP = 2,
	/* A debugging aid: the sweep, and a comparison with what the pending
	 * path would have freed; every disagreement is counted and logged
	 * (event "cleanup_check").  Needs the app's marks, as the sweep. */
	RK_CLEANUP_CHECK = 3,
};

/* What rk_finish_recovery_mode did. */
struct rk_cleanup_stats {
	uint64_t objects_freed;
	uint64_t bytes_freed;
	uint64_t objects_kept;     /* sweep, check: objects the marks reached */
	uint64_t bytes_kept;
	uint64_t pending;          /* the dead threads' pending objects (freed unless NONE) */
	uint64_t pending_bytes;
	/* Log entries that full logs dropped (a thread that allocated more
	 * than 128 objects in one arena since its last commit; the older half
	 * go): an upper bound on the objects in flight that PENDING missed and
	 * that leak (the sweep frees them). */
	uint64_t pending_overflow;
	/* check: pending objects that the marks reached.  The app published
	 * them without committing them (the rule below was broken): PENDING
	 * would have freed live objects.  The check keeps them. */
	uint64_t pending_reached;
	/* check: objects nothing reached that were not pending (an object
	 * unlinked in a region but freed after it, an overflow, a thread with
	 * no cache slot): PENDING leaks them, the sweep frees them. */
	uint64_t swept_not_pending;
	uint64_t cleanup_ns;       /* time spent in rk_finish_recovery_mode */
};

struct rk_arena_stats {
	uint64_t base;          /* fixed virtual address of the arena */
	uint64_t max_bytes;     /* reserved size */
	uint64_t mapped_bytes;  /* size of the backing memfd (grows on demand) */
	uint64_t heap_bytes;    /* bytes of the heap carved so far */
	uint64_t allocated_bytes; /* bytes handed out and not freed (class-rounded) */
};

/* ---- lifecycle ---------------------------------------------------------- */

/* Call first thing in main().  Records argv/env for restarts, installs the
 * fatal-signal handlers and, in a restarted incarnation, validates and maps
 * the inherited arenas.  opts may be NULL.  Returns 0 or -errno. */
int rk_init(int argc, char **argv, const struct rk_options *opts);

/* True when this incarnation is a warm restart whose recovery is not yet
 * finished (between rk_init and rk_finish_recovery). */
bool rk_is_recovery(void);

/* Facts about this start; valid after rk_init. */
const struct rk_restart_info *rk_restart_info(void);

/* End recovery: clean up as mode says (enum rk_cleanup; RK_CLEANUP_PENDING
 * is the one to use), and drop the inherited arenas the new incarnation did
 * not reopen.  stats may be NULL.  RK_CLEANUP_SWEEP and RK_CLEANUP_CHECK
 * must run before other threads allocate in the arenas (-EBUSY otherwise;
 * recovery then goes on, and the call can be repeated); NONE and PENDING
 * need no such care.  Outside recovery (not a warm start, or already
 * finished) it does nothing and returns 0.  -EINVAL for an unknown mode.
 * Call it before allocating (as the template above does): objects
 * allocated during recovery are born marked, for a sweep, and with NONE or
 * PENDING those marks are then cleared by a walk of the arena. */
int rk_finish_recovery_mode(enum rk_cleanup mode, struct rk_cleanup_stats *stats);

/* The older form: rk_finish_recovery_mode(cleanup ? RK_CLEANUP_SWEEP :
 * RK_CLEANUP_NONE).  With cleanup, every arena object not reached by
 * rk_mark() since rk_init is freed (a walk of the whole arena).  Without
 * cleanup, called before any rk_mark or allocation, it costs O(1) whatever
 * the arenas' size: the objects in flight at the failure leak. */
int rk_finish_recovery(bool cleanup, struct rk_sweep_stats *stats);

/* Restart now, warm if every check passes, cold otherwise.  Safe to call
 * from a signal handler.  Returns only on failure (-errno). */
int rk_restart(const char *reason);
/* Restart now, dropping all preserved state. */
int rk_restart_cold(const char *reason);

/* Fault in every preserved page now; with background=true in a detached
 * thread.  Returns 0 or -errno. */
int rk_prefault(bool background);
/* Moves arena memory into huge pages where the kernel allows it
 * (MADV_COLLAPSE), so that a warm restart maps it again with one fault per
 * 2 MiB instead of 512 and walks it with fewer TLB misses: the 2 MiB ranges
 * from arena offset *offset to the one holding the heap's top, at most
 * max_ranges of them; *offset moves past them (RK_HUGEPAGES_TOP: start
 * from the top's range).  A caller that keeps its offset and calls often
 * collapses each range as the heap reaches it, while it is cheap.  Returns
 * the ranges collapsed (0: at the top), or -errno: EINVAL the kernel cannot
 * (older than 6.1, no THP, shmem_enabled "deny"), ENOMEM or EAGAIN none to
 * be had now (*offset stays), EPERM the arena is in durable snapshots
 * (`rekindle run --snapshot-dir`), which keep it in small pages: a write to
 * a huge page would be reported, and copied, as 512 written pages. */
#define RK_HUGEPAGES_TOP UINT64_MAX
int rk_arena_hugepages(rk_arena *arena, uint64_t *offset, unsigned max_ranges);

/* Keeps the arena in huge pages with rk_arena_hugepages, a range a call,
 * from the app's own loop.  RK_HUGEPAGES_GROW, every loop iteration:
 * collapses each 2 MiB range as the heap's top reaches it, while it is
 * nearly empty (about 0.5 ms).  RK_HUGEPAGES_RESCAN, from a cron (a range a
 * tick): goes over what is below, the last incarnation's ranges and those
 * a large free split since (a full range is a ~4 ms copy).  No huge page to
 * be had: RK_HUGEPAGES_WAITING, and calls do nothing for 1 s; refused by
 * the kernel or the arena in durable snapshots: RK_HUGEPAGES_REFUSED, for
 * good.  Each change of state is a "hugepages" event.  Returns the ranges
 * collapsed (more may follow at once: call again without waiting), 0, or
 * -EINVAL. */
enum rk_hugepages_pass { RK_HUGEPAGES_GROW, RK_HUGEPAGES_RESCAN };
int rk_hugepages_step(rk_arena *arena, enum rk_hugepages_pass pass);

enum rk_hugepages_state {
	RK_HUGEPAGES_NOT_KEPT = 0, /* rk_hugepages_step not called yet */
	RK_HUGEPAGES_ON,
	RK_HUGEPAGES_WAITING, /* no huge page to be had now (error: ENOMEM, EAGAIN, EBUSY) */
	RK_HUGEPAGES_REFUSED, /* for good (error: EPERM durable snapshots, EINVAL the kernel cannot) */
};

struct rk_hugepages_status {
	enum rk_hugepages_state state;
	int error;      /* the errno behind WAITING or REFUSED */
	uint64_t bytes; /* collapsed by this incarnation's calls */
};

/* The state of rk_hugepages_step's policy; 0 or -EINVAL. */
int rk_hugepages_status(const rk_arena *arena, struct rk_hugepages_status *st);

/* ---- supervision and correctness ---------------------------------------- */

/* True when running under `rekindle run` (the supervisor holds the arenas'
 * fds, so even a SIGKILL does not lose them). */
bool rk_is_supervised(void);

/* Call from the main loop at a safe point (no data structure half-changed).
 * Under a supervisor with --hang-timeout, a heartbeat that stops marks a
 * hang.  A restart the supervisor asked for (rekindle restart, leak) is
 * taken here, at this safe point.  Cheap: a clock read and two stores.
 *
 * An idle server blocks in epoll_wait or poll: it must not block longer
 * than rk_heartbeat_interval_ms() between two heartbeats, or it is taken
 * for hung.  Use it as the wait's timeout:
 *     for (;;) { rk_heartbeat(); n = epoll_wait(ep, ev, 64, rk_heartbeat_interval_ms()); ... } */
void rk_heartbeat(void);

/* How many listening sockets the supervisor (`rekindle run --listen`) or
 * systemd handed this process: they are fds 3 to 3+n-1, already bound and
 * listening, and stay open across restarts, so clients queue in their
 * backlog meanwhile.  0 when none (LISTEN_FDS unset, or LISTEN_PID names
 * another process).  Call after rk_init. */
int rk_listen_fds(void);

/* How long the app may go between two rk_heartbeat() calls: a third of the
 * supervisor's --hang-timeout (at least 1 ms), or -1 when no hang timeout
 * is set (not supervised, or --hang-timeout 0): block as long as you like.
 * -1 is also poll's and epoll_wait's "no timeout". */
int rk_heartbeat_interval_ms(void);

/* ---- Durable snapshots (`rekindle run --snapshot-dir`, docs/snapshots.md) --
 * The supervisor snapshots the preserved state at consistent cuts; the
 * app's epochs order them (they grow at each cut, and at each interval
 * snapshot found unchanged, so only their order means something).  A
 * write made inside an unsafe region that
 * has ended is in the snapshot of epoch rk_epoch() (read after the region)
 * or in an earlier one; it is on disk once rk_durable_epoch() >= that.  To
 * send a reply only once the state it depends on is durable (external
 * consistency): note e = rk_epoch() after the write, call rk_checkpoint(),
 * and hold the reply until rk_durable_epoch() >= e; poll rk_durable_fd()
 * to learn when it advances.  Many writes share one snapshot (group
 * commit).  Without snapshots: rk_epoch() and rk_durable_epoch() are 0 (so
 * the wait above ends at once), rk_durable_fd() is -1 and rk_checkpoint()
 * returns -ENOTSUP: the app knows its writes are not durable. */
uint64_t rk_epoch(void);
uint64_t rk_durable_epoch(void);
/* Readable (an eventfd) whenever rk_durable_epoch() has advanced; read 8
 * bytes to clear it.  -1 without snapshots. */
int rk_durable_fd(void);
/* Ask for a snapshot as soon as possible (returns at once); 0 or -errno. */
int rk_checkpoint(void);

/* ---- The redo log (`rekindle run --snapshot-dir`; Aurora's sls_ntflush) --
 * For an app whose writes must be durable before it answers, a snapshot per
 * group of writes costs a cut and a copy of every page written.  The redo
 * log costs a copy of a record: the app appends a record of each change
 * (what it needs to do the change again), the supervisor writes and syncs
 * the records, and a restore after the machine died starts from the newest
 * snapshot and hands the app the records after it to apply again.
 *
 *   rk_unsafe_begin(a);
 *   int64_t at = rk_redo_append(rec, n);  // before the change: if it fails,
 *   if (at >= 0) apply(change);           //   do the change the other way
 *   rk_unsafe_end(a);                     // the record is committed here
 *   rk_redo_flush();                      // once per batch of requests
 *   ... hold the reply until rk_redo_durable() >= at (poll rk_redo_fd()).
 *
 * Rules.  Append inside the unsafe region of the change the record
 * describes, before the change; a record is committed when the thread's
 * outermost region ends, so a death inside the region neither keeps the
 * change nor replays the record.  While the log is open (rk_redo_open())
 * every change of preserved state must have its record: a snapshot's
 * position tells which records it already holds.  A change that cannot be
 * logged (a record larger than rk_redo_max()) is made after rk_redo_gap(),
 * which closes the log; the supervisor opens it again at its next snapshot
 * (rk_checkpoint() asks for one), and meanwhile appends return -EAGAIN and
 * writes are made durable by snapshots (rk_epoch/rk_checkpoint above).
 * The log also starts closed in every incarnation that did not inherit it
 * whole (the first, one started from a snapshot).  Records must replay
 * deterministically: log the effect (an absolute expiry time), not a
 * request whose outcome depends on the clock.
 *
 * Returns: rk_redo_append the position just after the record (what to
 * wait for), or -ENOTSUP (no redo log in this process: unsupervised, no
 * --snapshot-dir, or a cluster), -EAGAIN (the log is closed), -EINVAL (no
 * unsafe region open in this thread), -EMSGSIZE (larger than
 * rk_redo_max()), -ETIMEDOUT (the ring stayed full for a second: the
 * supervisor is not writing), -EIO (the supervisor's writer failed; its
 * event says why).  Every failure but -ENOTSUP and -EAGAIN also closes the
 * log (as rk_redo_gap), so the change the app then makes without its record
 * is never followed by records that assume it.  One record at a time per
 * process (a lock); records of several threads are committed once none of
 * them has a region open. */
bool rk_redo_open(void);
int64_t rk_redo_append(const void *rec, size_t len);
size_t rk_redo_max(void);
/* Ask the supervisor to make every committed record durable (returns at
 * once; one flush serves every record committed before it). */
int rk_redo_flush(void);
/* Every record that ends at or before this position is durable. */
uint64_t rk_redo_durable(void);
/* The position just after the last committed record (0 without a log). */
uint64_t rk_redo_position(void);
/* Readable (an eventfd) whenever rk_redo_durable() advances; read 8 bytes
 * to clear it.  -1 without a redo log. */
int rk_redo_fd(void);
/* Closes the log until the supervisor's next snapshot (see above). */
int rk_redo_gap(void);
/* In an incarnation started from a snapshot (`rekindle restore`, a start
 * from the store, a crash restored): apply, in order, every durable record
 * that followed that snapshot.  Call it once, from the thread that called
 * rk_init, before rk_ready and before serving; apply runs each record's
 * change in its own unsafe region as the live path does (its appends are
 * not needed: the log is closed).  Until it returns, a death restores the
 * snapshot again.  Returns the number of records applied (0 when there is
 * nothing to replay), or apply's negative return (replay stops there), or
 * -errno. */
int64_t rk_redo_replay(int (*apply)(const void *rec, size_t len, void *ctx), void *ctx);

/* The app serves again (after rk_finish_recovery on a warm start, or after
 * its own recovery).  The supervisor times restarts up to this point. */
int rk_ready(void);

/* Unsafe regions: wrap every change of preserved state in the arena (the
 * arena is the component).  A failure while a region of an arena is open (in
 * any thread) means that arena may be half-changed: it is not reused.  If the
 * arena was opened RK_ARENA_INDEPENDENT only it is dropped (the next
 * incarnation gets it back empty, rk_arena_preserved() false) and the other
 * arenas stay warm; otherwise the whole restart goes cold.  The allocator's
 * own critical sections count as unsafe regions of their arena.  Nestable,
 * per thread, a few ns, no syscall.  Other threads' open regions are waited
 * for (50 ms at most) before a restart decides. */
void rk_unsafe_begin(rk_arena *arena);
void rk_unsafe_end(rk_arena *arena);

/* Pending allocations.  Each object a thread allocates is *pending* until
 * that thread's next commit: the end of any unsafe region (any arena, nested
 * or not), rk_commit(), or rk_root_set().  At a warm start the pending
 * objects of the dead threads are what RK_CLEANUP_PENDING frees.  That is
 * sound under one rule, the publication rule:
 *
 *   A pointer to an object may be stored into preserved state (anything
 *   the roots reach) only inside an unsafe region, and only by the thread
 *   that allocated the object, unless the object was committed first:
 *   by its allocating thread (rk_commit(), or any region end), or by the
 *   publishing thread with rk_keep() before the region ends.
 *
 * The first half is the unsafe-region contract itself.  Since a warm restart
 * happens only when no region of a reused arena is open, every object
 * published by then was committed by the end of its region.  The second
 * half is about handing an object to another thread (a queue, a worker
 * pool): the receiver's region end commits only the receiver's own
 * allocations, so the receiver calls rk_keep(arena, obj) inside the region
 * that publishes it, or the sender calls rk_commit() before handing it
 * over.  Freeing needs no care: any thread may free any object, pending or
 * not.  What the pending path cannot see leaks (the sweep still frees it):
 * an object unlinked inside a region but freed after the region's end (free
 * it inside), an object allocated 64 to 128 allocations (of its thread, in
 * its arena, not counting temporaries freed at once) before a commit that
 * has not come yet (a full log drops its older half: stats
 * pending_overflow), a handed-over object its allocating thread committed
 * (by any region end of its own) before the receiver published or freed it,
 * and the allocations of threads beyond the 128th using one arena at a time
 * (they are never pending).
 *
 * Cost: an allocation tags the object and appends it to the thread's log
 * (a few ns; bench/results/cleanup.md); a free writes one more word of the
 * block; a commit is one store per arena with pending objects. */

/* Commits every object this thread allocated so far, in every arena. */
void rk_commit(void);
/* Commits one object, whichever thread allocated it (0, or -EINVAL if ptr
 * is not an allocated object of the arena).  For a thread that publishes an
 * object another thread allocated: call it before the publishing region
 * ends. */
int rk_keep(rk_arena *arena, const void *ptr);

/* True when no thread has an unsafe region of the arena open right now.
 * Async-signal-safe: meant for the app's failure hook. */
bool rk_component_is_safe(const rk_arena *arena);

/* The app's own say at a failure.  Runs inside the fault handler (so only
 * async-signal-safe code), after the other threads were stopped at their
 * next unsafe-region entry and before the runtime decides.  It may inspect
 * components with rk_component_is_safe() and drop some with
 * rk_component_drop(); returning false makes the whole restart cold.  Not
 * called when the process died without running a handler (SIGKILL under
 * `rekindle run`): the supervisor then applies the default policy above. */
typedef bool (*rk_failure_hook)(int sig, void *ctx);
void rk_set_failure_hook(rk_failure_hook hook, void *ctx);
/* From the failure hook: do not reuse this arena, keep the others warm. */
int rk_component_drop(rk_arena *arena);

/* The app can veto warm restarts for a while (for example during a
 * migration of its own data); failures then restart cold.  The veto lasts
 * until rk_set_warm_allowed(true) or the end of this incarnation. */
void rk_set_warm_allowed(bool allowed);

/* ---- cross-check validation --------------------------------------------- */

/* After a warm restart the app serves at once from the preserved state S_i,
 * while a validator process runs the app's default (cold) recovery into
 * separate memory (S_r) and compares the two.  Match: the validator exits and
 * this incarnation goes on, now validated.  Mismatch: a hot switch, i.e. a
 * warm restart onto S_r (the speculative incarnation and everything it
 * changed in S_i are discarded; RK_PRESERVED statics are not restored).
 * Both outcomes are "crosscheck" events.
 *
 * The validator sees S_i as it was at rk_crosscheck_start, whatever this
 * incarnation writes meanwhile: the arena is write-protected with
 * userfaultfd, and the first write to each page copies the page's old
 * contents into the validator before it proceeds (one fault, one 4 KiB copy
 * per page written during validation; nothing for pages not written). */
struct rk_crosscheck {
	/* The root (rk_root_set name) of the checked state, in both copies. */
	const char *root;
	/* In the validator: build S_r with the app's default recovery, in
	 * scratch, a fresh arena of its own; return its root (NULL: failed).
	 * It must reproduce the state at the failure, not later. */
	void *(*recover)(rk_arena *scratch, void *ctx);
	/* In the validator: true when S_i (preserved) and S_r (recovered) are
	 * equivalent (the app decides what may differ); otherwise false with a
	 * short description in why. */
	bool (*compare)(const void *preserved, const void *recovered, char *why, size_t cap, void *ctx);
	void *ctx;
	/* Address space for the scratch arena; 0 = the checked arena's size. */
	size_t scratch_bytes;
};

enum rk_crosscheck_state {
	RK_CC_NONE = 0,     /* not started (not a warm start, or already validated) */
	RK_CC_RUNNING = 1,  /* the validator is working */
	RK_CC_MATCH = 2,    /* S_i equals S_r: validated */
	RK_CC_MISMATCH = 3, /* a hot switch onto S_r is under way */
	RK_CC_FAILED = 4,   /* no verdict (the validator failed); S_i stays in use */
};

/* Call after recovery (rk_finish_recovery) of a warm start, before serving.
 * Returns 0 (also when there is nothing to check: a fresh or cold start, or
 * a start from an already validated state) or -errno; the validation then
 * runs in the background. */
int rk_crosscheck_start(rk_arena *arena, const struct rk_crosscheck *cc);
enum rk_crosscheck_state rk_crosscheck_state(void);

/* ---- arenas ------------------------------------------------------------- */

/* Open (warm restart: reattach) the arena called name, reserving max_bytes
 * of address space.  Returns NULL with errno set on failure. */
rk_arena *rk_arena_open(const char *name, size_t max_bytes);

/* rk_arena_open_flags() flags */
/* A component of its own: no other arena points into it and it points into
 * no other, so a failure that finds it half-changed drops only it. */
#define RK_ARENA_INDEPENDENT 0x1u
/* Write-protect the arena with a memory protection key: a thread may write
 * it only inside its unsafe regions (and through rk_* calls), so a stray
 * write from transient code faults at once instead of corrupting preserved
 * state.  Every write to the arena must then be inside rk_unsafe_begin/end,
 * including the initialisation of new objects.  Threads started before the
 * arena was opened can neither read nor write it outside unsafe regions:
 * open protected arenas before starting threads.  A thread inherits its
 * creator's rights, so one started inside an unsafe region can write the
 * arena until it ends a region of its own: start threads outside regions.
 * An outermost region of a protected arena changes the rights twice (two
 * WRPKRUs, about 35 ns on AMD Zen 3): keep such regions coarse.  Without
 * pkeys (CPU or kernel) the arena is unprotected, and a warning says so
 * once. */
#define RK_ARENA_WRITE_PROTECT 0x2u
/* Leave the arena out of durable snapshots (Aurora's sls_mctl): for state
 * the app can rebuild, such as a cache, that is not worth the stop time and
 * the disk.  A warm restart keeps it as always; a restore from a snapshot
 * (rekindle restore, rollback, a cold restart or crash loop with a store)
 * gives it back empty (rk_arena_preserved false), so nothing in the other
 * arenas may point into it.  Reopening with or without the flag changes it
 * from the next snapshot on. */
#define RK_ARENA_NO_SNAPSHOT 0x4u
rk_arena *rk_arena_open_flags(const char *name, size_t max_bytes, unsigned flags);
/* True when the arena's contents come from the previous incarnation; false
 * for a new arena or one dropped at the failure (it starts empty). */
bool rk_arena_preserved(const rk_arena *arena);
/* True when the arena really is write-protected (pkeys available). */
bool rk_arena_write_protected(const rk_arena *arena);
int rk_arena_stats(const rk_arena *arena, struct rk_arena_stats *out);
/* True if ptr points into the arena's reserved range. */
bool rk_arena_contains(const rk_arena *arena, const void *ptr);

void *rk_alloc(rk_arena *arena, size_t size);
void *rk_calloc(rk_arena *arena, size_t nmemb, size_t size);
void *rk_realloc(rk_arena *arena, void *ptr, size_t size);
void rk_free(rk_arena *arena, void *ptr);
size_t rk_usable_size(rk_arena *arena, const void *ptr);
/* The usable size of the block rk_alloc(arena, size) returns (its size
 * class, or whole pages), without allocating or reading any arena: what
 * rk_usable_size says of the block, so an app that counts its memory needs
 * no page-map lookup after each allocation. */
size_t rk_alloc_size(size_t size);

/* Named roots: how the restarted application finds its data.  ptr NULL
 * removes the root.  At most 64 roots per arena.  rk_root_set publishes:
 * it commits this thread's pending allocations first. */
int rk_root_set(rk_arena *arena, const char *name, void *ptr);
void *rk_root_get(rk_arena *arena, const char *name);

/* Mark an object (any pointer into it) as reachable, for the sweep of
 * rk_finish_recovery.  Returns 1 if newly marked, 0 if already marked,
 * -EINVAL if ptr is not an allocated arena object. */
int rk_mark(rk_arena *arena, const void *ptr);

/* A debugging and testing aid: walks the whole arena (O(arena)) and counts
 * its allocated objects (neither on a free list nor in a cache); calls each
 * (may be NULL) on every one, with the allocator's locks held, so each must
 * not call the allocator.  -EBUSY if another thread holds a cache in the
 * arena (its blocks move meanwhile); -EIO if the free lists are corrupt. */
struct rk_census {
	uint64_t objects;
	uint64_t bytes;
	uint64_t free_objects; /* slab slots on a free list or in our cache */
};
typedef void (*rk_census_fn)(void *obj, size_t size, void *ctx);
int rk_arena_census(rk_arena *arena, rk_census_fn each, void *ctx, struct rk_census *out);

/* ---- other preserved memory -------------------------------------------- */

/* Preserve [addr, addr+len) (page aligned) across restarts, zero copy: the
 * pages are moved onto a memfd in place.  In a warm-restarted incarnation
 * the range is already mapped again by rk_init and this returns 1. */
int rk_preserve_range(void *addr, size_t len);

/* Place a static or global variable in the preserved section: its value is
 * saved when the runtime restarts the process and restored by rk_init of a
 * warm restart.  Words holding addresses inside the old load image (function
 * pointers, pointers to other statics or string literals) are relocated when
 * ASLR moved the image; pointers into arenas stay valid as they are.
 * Pointers to malloc memory, stacks or libraries must not be stored here. */
#define RK_PRESERVED __attribute__((section("rk_preserved"), used))

/* Registers this module's rk_preserved section with the runtime (internal;
 * runs as a constructor in every translation unit including this header). */
void rk__statics_register(void *start, void *stop);
#ifndef RK_INTERNAL
extern char __start_rk_preserved[] __attribute__((weak, visibility("hidden")));
extern char __stop_rk_preserved[] __attribute__((weak, visibility("hidden")));
__attribute__((constructor, used)) static void rk__register_module_statics(void)
{
	if (&__start_rk_preserved[0] != &__stop_rk_preserved[0])
		rk__statics_register(&__start_rk_preserved[0], &__stop_rk_preserved[0]);
}
#endif

#ifdef __cplusplus
}
#endif

#include "rekindle_stages.h"
#endif /* REKINDLE_H */
