/* rekindle_glue.c - every Rekindle call of rkv, except the unsafe-region
 * macros of store.h around each change of the keyspace.
 *
 * Start:      rk_init, then the arena "keyspace"
 * Warm start: the root "db"; by default rk_finish_recovery(false) at once
 *             and a check of the table in slices while serving; with
 *             --recovery-sweep yes first a traversal that rk_mark()s the
 *             table, every entry (key and value share it) and checks the
 *             counts on the way, then a sweep of what nothing reaches (the
 *             objects of the request that was in flight)
 * Any start:  rk_ready once serving, rk_heartbeat each loop iteration
 * Under -DRKV_PLAIN_MALLOC all of this is compiled out. */
#include "rkv.h"
#include "store.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef RKV_PLAIN_MALLOC

rk_arena *rkv_arena;

int glue_init(int argc, char **argv, uint64_t arena_size)
{
	int r = rk_init(argc, argv, NULL);
	if (r < 0)
		return r;
	rkv_arena = rk_arena_open("keyspace", arena_size);
	if (!rkv_arena)
		return -errno;
	if (srv.cfg.prefault && rk_is_recovery()) {
		r = rk_prefault(true); /* the runtime logs "prefaulted" when done */
		if (r < 0)
			rkv_log("warning", "\"what\":\"rk_prefault\",\"error\":%s", js(strerror(-r)));
	}
	return 0;
}

/* What is wrong with the db header, or NULL: the bucket array must hold
 * the mask's buckets, or every lookup reads past it; the TTL list's head
 * and active expiry's cursor must be entries, as the first TTL change
 * writes through the one and the next expiry cycle reads the other. */
static const char *db_fault(const struct db *db)
{
	if (db->magic != RKV_DB_MAGIC || rk_usable_size(rkv_arena, db) < sizeof *db)
		return "the db header is not an rkv keyspace";
	size_t fit = rk_usable_size(rkv_arena, db->buckets) / sizeof *db->buckets;
	if ((db->mask & (db->mask + 1)) || db->mask >= fit)
		return "the bucket array is smaller than the table's mask";
	if ((db->xhead && rk_usable_size(rkv_arena, db->xhead) < sizeof *db->xhead) ||
	    (db->xcursor && rk_usable_size(rkv_arena, db->xcursor) < sizeof *db->xcursor))
		return "a broken TTL list head";
	return NULL;
}

/* What is wrong with e as an entry, or NULL.  It must be a block of the
 * arena, checked before any field is read (a stray pointer may lead past
 * the arena's mapped end); its lengths must fit the block (a corrupt vlen
 * made every GET of it read past the block: SIGBUS, then a warm restart
 * that kept it; a corrupt cap let a SET write past it). */
static const char *block_fault(const struct entry *e)
{
	size_t usable = rk_usable_size(rkv_arena, e);
	if (usable < sizeof *e)
		return "an entry that is not a block of the arena";
	if ((uint64_t)e->klen + e->vlen > e->cap || offsetof(struct entry, data) + (size_t)e->cap > usable)
		return "an entry whose key and value lengths exceed its block";
	return NULL;
}

/* What is wrong with entry e of bucket b, or NULL: block_fault, and its
 * hash must name bucket b.  Hashing the key again would catch more, but it
 * took half again the check's time. */
static const char *entry_fault(const struct db *db, const struct entry *e, uint64_t b)
{
	const char *fault = block_fault(e);
	if (fault)
		return fault;
	return (e->hash & db->mask) != b ? "an entry in the wrong bucket" : NULL;
}

/* Marks what the db reaches and cross-checks it: each entry intact and
 * marked once (no cycle, no sharing), the counts right, the TTL list
 * consistent.  Returns what is wrong, or NULL.  It ends on a cycle
 * whatever the count says: rk_mark returns 0 for an entry seen before,
 * and the TTL list walk stops after as many entries as the table has
 * with a TTL. */
static const char *mark_db(struct db *db)
{
	uint64_t n = 0, x = 0;
	const char *fault = db_fault(db);
	if (fault)
		return fault;
	if (rk_mark(rkv_arena, db) < 0 || rk_mark(rkv_arena, db->buckets) != 1)
		return "the db header or bucket array is shared";
	KS_FOREACH (db, e) {
		if ((fault = entry_fault(db, e, b_)) != NULL)
			return fault;
		if (rk_mark(rkv_arena, e) != 1 || ++n > db->count)
			return "an entry reached twice, or more entries than the count";
		x += e->expire_ms != 0;
	}
	for (struct entry *e = db->xhead, *prev = NULL; e; prev = e, e = e->xnext)
		if (rk_usable_size(rkv_arena, e) < sizeof *e || !e->expire_ms || e->xprev != prev || x-- == 0)
			return "a broken TTL list";
	return n == db->count && x == 0 ? NULL : "the counts disagree with the table";
}

void glue_check_failed(const char *why)
{
	static char reason[120];
	if (srv.stopping) { /* the save at SIGTERM finished the check: exit, saving nothing */
		rkv_log("recovery_check_failed", "\"why\":%s,\"action\":\"exit without saving\"", js(why));
		exit(1);
	}
	rkv_log("recovery_check_failed", "\"why\":%s,\"action\":\"cold restart\"", js(why));
	snprintf(reason, sizeof reason, "rkv: keyspace check failed: %s", why);
	rk_restart_cold(reason);
	abort(); /* rk_restart_cold returns only if it could not exec */
}

/* With --recovery-sweep yes: mark and check everything, sweep, then serve.
 * Otherwise serve at once (recovery ends in O(1); the objects of the
 * request in flight at the crash leak) and check the table in slices of
 * a fraction of a millisecond from the event loop (glue_verify_step). */
uint64_t glue_unchecked = UINT64_MAX; /* next bucket to check; MAX: none pending */
static double verify_started_ms;
static double verify_cpu_ms; /* the slices' CPU time (the machine may be shared) */
/* The blocks the arena's heap has room for, as of heap_blocks_ms: taking
 * it reads every thread cache's line of the arena header (rk_arena_stats,
 * ~10 us: as much as a GET, or a short slice), so it is taken every 10 ms
 * at most.  It only grows, and is far above any real chain's length. */
static uint64_t heap_blocks;
static double heap_blocks_ms;
/* Buckets a request checked ahead of the slices (one bit each): checked
 * once, not at every request that walks them.  NULL if it could not be
 * allocated (then a request checks its chain every time). */
static uint64_t *request_checked;
static uint64_t request_checked_mask; /* the table's mask it was sized for */
static uint64_t chain_limit(const struct db *db);

struct db *glue_recover(bool sweep, uint64_t *freed_objects, uint64_t *freed_bytes)
{
	struct rk_sweep_stats st = {0};
	if (!rk_is_recovery())
		return NULL;
	struct db *db = rk_root_get(rkv_arena, "db");
	const char *fault = !db ? NULL : sweep ? mark_db(db) : db_fault(db);
	if (fault)
		glue_check_failed(fault);
	int r = rk_finish_recovery(sweep, &st);
	if (r < 0)
		rkv_log("warning", "\"what\":\"rk_finish_recovery\",\"error\":%s", js(strerror(-r)));
	*freed_objects = st.objects_freed;
	*freed_bytes = st.bytes_freed;
	if (db && !sweep) {
		glue_unchecked = 0;
		verify_started_ms = mono_ms();
		heap_blocks_ms = -1e9;
		(void)chain_limit(db); /* takes heap_blocks, which a request's check reads */
		request_checked = calloc((db->mask >> 6) + 1, sizeof *request_checked);
		request_checked_mask = db->mask;
	}
	return db; /* NULL if the last incarnation died before publishing one */
}

/* A TTL list link of e is broken: it leads to no entry, or not back to e. */
static bool ttl_links_broken(const struct db *db, const struct entry *e)
{
	if ((e->xprev && rk_usable_size(rkv_arena, e->xprev) < sizeof *e) ||
	    (e->xnext && rk_usable_size(rkv_arena, e->xnext) < sizeof *e))
		return true;
	return (e->xprev ? e->xprev->xnext : db->xhead) != e || (e->xnext && e->xnext->xprev != e);
}

/* The most entries one chain can hold: one more than the count (a SET
 * links its entry before it counts it), but never more than the arena's
 * heap has room for, as the count may be corrupt too.  A longer chain
 * meets an entry twice: a cycle, which a walk would follow forever. */
static uint64_t chain_limit(const struct db *db)
{
	double now = mono_ms();
	if (now - heap_blocks_ms >= 10) {
		struct rk_arena_stats st;
		heap_blocks = (rk_arena_stats(rkv_arena, &st) == 0 ? st.heap_bytes : srv.cfg.arena_size) /
			      sizeof(struct entry);
		heap_blocks_ms = now;
	}
	return db->count < heap_blocks ? db->count + 1 : heap_blocks;
}

/* Checks the chain of bucket b: each entry intact (entry_fault, before it
 * is followed), not more of them than chain_limit, their TTL links
 * consistent both ways; a failure restarts cold. */
static void check_chain(const struct db *db, uint64_t b, uint64_t limit)
{
	uint64_t n = 0;
	for (const struct entry *e = db->buckets[b]; e; e = e->next) {
		/* the entry's line and the allocator's page map line that
		 * rk_usable_size reads are two cache misses: start both at once */
		__builtin_prefetch(e);
		const char *fault = entry_fault(db, e, b);
		if (fault)
			glue_check_failed(fault);
		if (++n > limit)
			glue_check_failed("a bucket chain longer than the count or the arena allows: a cycle");
		if (e->expire_ms && ttl_links_broken(db, e))
			glue_check_failed("a broken TTL list link");
	}
}

static double thread_cpu_ms(void)
{
	struct timespec ts;
	return clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0 ? ts.tv_sec * 1e3 + ts.tv_nsec / 1e6 : 0;
}

/* True if a request checked bucket b ahead of the slices. */
static bool request_checked_bucket(const struct db *db, uint64_t b)
{
	return request_checked && db->mask == request_checked_mask && (request_checked[b >> 6] >> (b & 63) & 1);
}

/* A request is about to walk bucket b, which the slices have not reached. */
void glue_check_bucket(const struct db *db, uint64_t b)
{
	if (b < glue_unchecked || b > db->mask)
		return;
	__builtin_prefetch(&db->buckets[b]); /* a miss of its own, beside the bitmap's */
	if (request_checked_bucket(db, b))
		return; /* checked already; a change since went through a region of ours */
	check_chain(db, b, db->count < heap_blocks ? db->count + 1 : heap_blocks); /* chain_limit, no clock */
	if (request_checked && db->mask == request_checked_mask)
		request_checked[b >> 6] |= 1ull << (b & 63);
}

/* An entry reached through the TTL list (active expiry) rather than a
 * checked chain: it must be an entry before it is read, checked or not. */
void glue_check_ttl_entry(const struct entry *e)
{
	const char *fault = block_fault(e);
	if (fault)
		glue_check_failed(fault);
}

/* How far ahead of the bucket being checked the slices prefetch a chain's
 * first entry: each is a cache miss of its own, and the next ones' misses
 * overlap it.  A prefetch of a corrupt pointer does not fault. */
#define VERIFY_PREFETCH 16

/* Checks buckets until the clock passes deadline_ms (at least 64 of them),
 * skipping those a request checked.  Local checks only, so clients may
 * change the table between two slices. */
static void verify_until(const struct db *db, double deadline_ms, uint64_t limit)
{
	uint64_t b = glue_unchecked;
	for (; b <= db->mask && ((b & 63) || mono_ms() < deadline_ms || b == glue_unchecked); b++) {
		if (b + VERIFY_PREFETCH <= db->mask) {
			const char *ahead = (const char *)db->buckets[b + VERIFY_PREFETCH];
			if (ahead) {
				__builtin_prefetch(ahead);
				__builtin_prefetch(ahead + offsetof(struct entry, data) - 1); /* the lengths */
			}
		}
		if (!request_checked_bucket(db, b))
			check_chain(db, b, limit);
	}
	glue_unchecked = b;
	if (b > db->mask) {
		glue_unchecked = UINT64_MAX;
		free(request_checked);
		request_checked = NULL;
		rkv_log("verified", "\"keys\":%llu,\"verify_ms\":%.1f,\"check_ms\":%.1f", (unsigned long long)db->count,
			mono_ms() - verify_started_ms, verify_cpu_ms);
	}
}

/* The check's pacing.  While clients are waiting: a slice of
 * VERIFY_SLICE_US each time --recovery-check-cpu percent of the time since
 * the last one adds up to it, so that the check takes that share of the
 * CPU from requests (which check the chains they walk themselves).  When
 * no client has sent anything for VERIFY_IDLE_AFTER_MS: short slices (a
 * request may come at any moment).  A turn of the loop that finds nothing
 * sooner is not idleness: a closed-loop client sends its next batch right
 * after our reply, and slices there cost it 10-15% (measured at 5 M keys).
 * Credit does not pile up while idle. */
#define VERIFY_SLICE_US 100.0
#define VERIFY_IDLE_US 20.0
#define VERIFY_IDLE_AFTER_MS 2.0

bool glue_verify_step(struct db *db, bool clients_waiting)
{
	static double credit_us, last_ms, last_request_ms;
	if (glue_unchecked == UINT64_MAX || !db)
		return false;
	double now = mono_ms(), budget_us = VERIFY_IDLE_US;
	if (clients_waiting)
		last_request_ms = now;
	bool busy = now - last_request_ms < VERIFY_IDLE_AFTER_MS;
	if (busy) {
		credit_us += last_ms > 0 ? (now - last_ms) * 10.0 * srv.cfg.recovery_check_cpu : 0;
		credit_us = credit_us < 2 * VERIFY_SLICE_US ? credit_us : 2 * VERIFY_SLICE_US;
		last_ms = now;
		if (credit_us < VERIFY_SLICE_US)
			return true;
		budget_us = credit_us;
	}
	double cpu0 = thread_cpu_ms();
	verify_until(db, now + budget_us / 1000.0, chain_limit(db));
	double spent_ms = mono_ms() - now;
	verify_cpu_ms += thread_cpu_ms() - cpu0;
	credit_us = busy ? credit_us - spent_ms * 1000.0 : credit_us;
	last_ms = mono_ms();
	return glue_unchecked != UINT64_MAX;
}

/* Whatever walks every chain (KEYS, a save, table growth, FLUSHALL)
 * finishes the check first, in one go. */
void glue_verify_all(struct db *db)
{
	if (glue_unchecked != UINT64_MAX && db)
		verify_until(db, INFINITY, chain_limit(db));
}

void glue_publish(struct db *db) { rk_root_set(rkv_arena, "db", db); }
void glue_ready(void) { rk_ready(); }
void glue_heartbeat(void) { rk_heartbeat(); }
unsigned glue_generation(void) { return rk_restart_info()->generation; }

const char *glue_start_kind(void)
{
	switch (rk_restart_info()->kind) {
	case RK_START_WARM:
		return "warm";
	case RK_START_COLD:
		return "cold";
	default:
		return "fresh";
	}
}

const char *glue_reason(void)
{
	const struct rk_restart_info *i = rk_restart_info();
	return i->kind == RK_START_FRESH ? "first start" : i->decision[0] ? i->decision : i->reason;
}

uint64_t glue_arena_bytes(void)
{
	struct rk_arena_stats st;
	return rk_arena_stats(rkv_arena, &st) == 0 ? st.allocated_bytes : 0;
}

const char *glue_oom_reply(void) { return "OOM out of memory: the keyspace arena is full (--arena-size)"; }
int glue_durable_fd(void) { return rk_durable_fd(); }
uint64_t glue_epoch(void) { return rk_epoch(); }

bool glue_inherited_undurable_state(void)
{
	/* a restore starts from a durable snapshot; a warm restart in place
	 * from whatever the last incarnation wrote */
	const struct rk_restart_info *i = rk_restart_info();
	return i->kind == RK_START_WARM && !i->snapshot[0];
}
uint64_t glue_durable_epoch(void) { return rk_durable_epoch(); }
int glue_checkpoint(void) { return rk_checkpoint(); }
int64_t glue_redo_append(const void *rec, size_t len) { return rk_redo_append(rec, len); }
int glue_redo_gap(void) { return rk_redo_gap(); }
int glue_redo_flush(void) { return rk_redo_flush(); }
uint64_t glue_redo_durable(void) { return rk_redo_durable(); }
uint64_t glue_redo_position(void) { return rk_redo_position(); }
int glue_redo_fd(void) { return rk_redo_fd(); }
bool glue_redo_open(void) { return rk_redo_open(); }
int64_t glue_redo_replay(int (*apply)(const void *rec, size_t len, void *ctx), void *ctx)
{
	UNSAFE_BEGIN(); /* a death while replaying: the state is half the log's */
	int64_t r = rk_redo_replay(apply, ctx);
	UNSAFE_END();
	return r;
}

/* Huge pages: after a warm restart the first touch of each 4 KiB page of
 * the keyspace was a fault, 262,144 per GiB, and the client's first reads
 * and the table's check paid them on the server's CPU (~85 ms a GiB, with
 * the kernel's fault-around).  Kept in huge pages, the keyspace is mapped
 * again with a fault per 2 MiB.  The runtime's policy (rk_hugepages_step):
 * the top pass from the loop, the rescan from cron once the warm start's
 * check is over. */
bool glue_hugepages_step(void)
{
	return srv.cfg.hugepages && rk_hugepages_step(rkv_arena, RK_HUGEPAGES_GROW) > 0;
}

void glue_hugepages_rescan(void)
{
	if (srv.cfg.hugepages && glue_unchecked == UINT64_MAX) /* not while the check runs */
		(void)rk_hugepages_step(rkv_arena, RK_HUGEPAGES_RESCAN);
}

/* INFO's arena_hugepages: on, off (--hugepages no), waiting, or why not */
const char *glue_hugepages_state(void)
{
	static char why[96];
	struct rk_hugepages_status st;
	if (rk_hugepages_status(rkv_arena, &st) < 0 || st.state == RK_HUGEPAGES_NOT_KEPT)
		return "off";
	if (st.state == RK_HUGEPAGES_ON)
		return "on";
	if (st.state == RK_HUGEPAGES_WAITING)
		return "waiting";
	if (st.error == EPERM)
		return "the keyspace is in durable snapshots (small pages)";
	snprintf(why, sizeof why, "refused by the kernel: %s", strerror(st.error));
	return why;
}

uint64_t glue_hugepage_bytes(void)
{
	struct rk_hugepages_status st;
	return rk_hugepages_status(rkv_arena, &st) < 0 ? 0 : st.bytes;
}

#else /* RKV_PLAIN_MALLOC: the baseline, with no preserved state */

int glue_init(int argc, char **argv, uint64_t arena_size)
{
	(void)argc, (void)argv, (void)arena_size;
	return 0;
}
struct db *glue_recover(bool sweep, uint64_t *freed_objects, uint64_t *freed_bytes)
{
	(void)sweep;
	*freed_objects = *freed_bytes = 0;
	return NULL;
}
bool glue_verify_step(struct db *db, bool clients_waiting)
{
	(void)db, (void)clients_waiting;
	return false;
}
uint64_t glue_unchecked = UINT64_MAX;
void glue_check_bucket(const struct db *db, uint64_t b) { (void)db, (void)b; }
void glue_check_ttl_entry(const struct entry *e) { (void)e; }
void glue_verify_all(struct db *db) { (void)db; }
void glue_check_failed(const char *why)
{
	rkv_log("keyspace_broken", "\"why\":%s", js(why));
	abort(); /* no preserved state: only a bug of rkv gets here */
}
void glue_publish(struct db *db) { (void)db; }
void glue_ready(void) {}
void glue_heartbeat(void) {}
unsigned glue_generation(void) { return 0; }
const char *glue_start_kind(void) { return "fresh"; }
const char *glue_reason(void) { return "plain malloc build"; }
uint64_t glue_arena_bytes(void) { return 0; }
const char *glue_oom_reply(void) { return "OOM out of memory: malloc failed"; }
int glue_durable_fd(void) { return -1; }
uint64_t glue_epoch(void) { return 0; }
bool glue_inherited_undurable_state(void) { return false; }
uint64_t glue_durable_epoch(void) { return 0; }
int glue_checkpoint(void) { return -ENOTSUP; }
int64_t glue_redo_append(const void *rec, size_t len)
{
	(void)rec;
	(void)len;
	return -ENOTSUP;
}
int glue_redo_gap(void) { return -ENOTSUP; }
int glue_redo_flush(void) { return -ENOTSUP; }
uint64_t glue_redo_durable(void) { return 0; }
uint64_t glue_redo_position(void) { return 0; }
int glue_redo_fd(void) { return -1; }
bool glue_redo_open(void) { return false; }
int64_t glue_redo_replay(int (*apply)(const void *rec, size_t len, void *ctx), void *ctx)
{
	(void)apply;
	(void)ctx;
	return 0;
}
bool glue_hugepages_step(void) { return false; }
void glue_hugepages_rescan(void) {}
const char *glue_hugepages_state(void) { return "off"; }
uint64_t glue_hugepage_bytes(void) { return 0; }

#endif
