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
#include <stdlib.h>
#include <string.h>

#ifndef RKV_PLAIN_MALLOC

rk_arena *rkv_arena;

int glue_init(int argc, char **argv, uint64_t arena_size)
{
	int r = rk_init(argc, argv, NULL);
	if (r < 0)
		return r;
	rkv_arena = rk_arena_open("keyspace", arena_size);
	return rkv_arena ? 0 : -errno;
}

/* Marks what the db reaches and cross-checks it: each entry marked once (no
 * cycle, no sharing), in the bucket its hash names, the counts right, the
 * TTL list consistent. */
static bool mark_db(struct db *db)
{
	uint64_t n = 0, x = 0;
	if (db->magic != RKV_DB_MAGIC || rk_mark(rkv_arena, db) < 0 || rk_mark(rkv_arena, db->buckets) != 1)
		return false;
	KS_FOREACH (db, e) {
		if (rk_mark(rkv_arena, e) != 1 || (e->hash & db->mask) != b_ || ++n > db->count)
			return false;
		x += e->expire_ms != 0;
	}
	for (struct entry *e = db->xhead, *prev = NULL; e; prev = e, e = e->xnext)
		if (!e->expire_ms || e->xprev != prev || x-- == 0)
			return false;
	return n == db->count && x == 0;
}

static void cold_restart(const char *why)
{
	rkv_log("recovery_check_failed", "\"why\":%s,\"action\":\"cold restart\"", js(why));
	rk_restart_cold("rkv: keyspace cross-check failed");
	abort(); /* rk_restart_cold returns only if it could not exec */
}

/* With --recovery-sweep yes: mark and check everything, sweep, then serve.
 * Otherwise serve at once (recovery ends in O(1); the objects of the
 * request in flight at the crash leak) and check the table in slices of
 * a fraction of a millisecond from the event loop (glue_verify_step). */
static uint64_t verify_cursor = UINT64_MAX; /* next bucket to check; MAX: none pending */
static double verify_started_ms;

struct db *glue_recover(bool sweep, uint64_t *freed_objects, uint64_t *freed_bytes)
{
	struct rk_sweep_stats st = {0};
	if (!rk_is_recovery())
		return NULL;
	struct db *db = rk_root_get(rkv_arena, "db");
	if (db && sweep && !mark_db(db))
		cold_restart("mark pass: the table is inconsistent");
	if (db && !sweep && (db->magic != RKV_DB_MAGIC || !rk_arena_contains(rkv_arena, db->buckets)))
		cold_restart("the db header is not an rkv keyspace");
	int r = rk_finish_recovery(sweep, &st);
	if (r < 0)
		rkv_log("warning", "\"what\":\"rk_finish_recovery\",\"error\":%s", js(strerror(-r)));
	*freed_objects = st.objects_freed;
	*freed_bytes = st.bytes_freed;
	if (db && !sweep) {
		verify_cursor = 0;
		verify_started_ms = mono_ms();
	}
	return db; /* NULL if the last incarnation died before publishing one */
}

/* Checks buckets for up to budget_us: each entry inside the arena, in the
 * bucket its hash names, its TTL links consistent both ways.  Local checks
 * only, so clients may change the table between two slices.  Bounded by
 * time, not by buckets: right after a restart every entry is a page fault. */
bool glue_verify_step(struct db *db, double budget_us)
{
	if (verify_cursor == UINT64_MAX || !db)
		return false;
	uint64_t b = verify_cursor;
	double deadline = mono_ms() + budget_us / 1000.0;
	for (; b <= db->mask && ((b & 255) || mono_ms() < deadline || b == verify_cursor); b++) {
		uint64_t chain = 0;
		for (struct entry *e = db->buckets[b]; e; e = e->next) {
			if (!rk_arena_contains(rkv_arena, e) || (e->hash & db->mask) != b || ++chain > db->count + 1)
				cold_restart("an entry outside the arena, in the wrong bucket, or a cycle");
			if (e->expire_ms && ((e->xprev ? e->xprev->xnext : db->xhead) != e ||
					     (e->xnext && e->xnext->xprev != e)))
				cold_restart("a broken TTL list link");
		}
	}
	verify_cursor = b;
	if (b > db->mask) {
		verify_cursor = UINT64_MAX;
		rkv_log("verified", "\"keys\":%llu,\"verify_ms\":%.1f", (unsigned long long)db->count,
			mono_ms() - verify_started_ms);
	}
	return verify_cursor != UINT64_MAX;
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
bool glue_verify_step(struct db *db, double budget_us)
{
	(void)db, (void)budget_us;
	return false;
}
void glue_publish(struct db *db) { (void)db; }
void glue_ready(void) {}
void glue_heartbeat(void) {}
unsigned glue_generation(void) { return 0; }
const char *glue_start_kind(void) { return "fresh"; }
const char *glue_reason(void) { return "plain malloc build"; }
uint64_t glue_arena_bytes(void) { return 0; }

#endif
