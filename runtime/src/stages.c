/* stages.c - stage-based progress recovery (rekindle_stages.h).
 *
 * The progress record lives in the arena under the root "rk.progress.<job>":
 *
 *   header  magic, version, fingerprint, job name, checksum (written once)
 *   current index (0 or 1) of the valid slot, changed by one aligned store
 *   slots[2] {seq, iteration, stage, phase, prefix hash, stage name, checksum}
 *   bufs[16] {name, ptr, size, checksum}: the save areas of the hooks
 *
 * An update writes the whole inactive slot, checksum last, and then
 * publishes it by storing its index into `current` (release).  A failure
 * before that store leaves the old slot current and intact; after it the
 * new slot is complete.  So a failure at any instruction leaves a valid
 * record, and no unsafe region is needed (one would turn a failure during
 * the update into a cold restart, losing the progress we want to keep).
 * In a write-protected arena the record's stores are the runtime's own
 * writes, bracketed by rk_wp_write_begin/end like the allocator's; what the
 * app's stages and hooks write is theirs to put in regions (stages.md).
 *
 * Resume rule, for the stage at index i of the current iteration and the
 * published state (stage s, phase ph):
 *   i < s                  completed before the failure: skip
 *   i == s, IDLE           not begun: run normally
 *   i == s, PRESERVING     the live data is untouched: preserve, run
 *   i == s, RUNNING        the data may be half-changed: restore, run
 * and the state moves IDLE -> [PRESERVING ->] RUNNING -> (s+1, IDLE), each
 * step published only after the hook before it returned. */
#include "rk_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG_MAGIC 0x31474f52504b5200ull /* "\0RKPROG1" */
#define PROG_VERSION 1u
#define ROOT_PREFIX "rk.progress."
#define NAME_CAP (RK_STAGE_NAME_MAX + 1)

struct prog_slot {
	uint64_t seq;        /* one more per update: which slot is newer, for humans */
	uint64_t iteration;
	uint32_t stage;      /* index within the iteration */
	uint32_t phase;      /* enum rk_stage_phase */
	uint64_t prefix;     /* hash of the names of stages 0..stage-1 of this iteration */
	char name[NAME_CAP]; /* stage `stage`, when phase is PRESERVING or RUNNING */
	uint64_t checksum;   /* of everything above */
};

struct prog_buf {
	char name[NAME_CAP];
	uint64_t ptr, size;
	uint64_t checksum; /* 0 = free; a torn entry fails it and counts as free */
};

struct prog_record {
	uint64_t magic;
	uint32_t version, pad_;
	uint64_t fingerprint;
	char job[RK_PROGRESS_JOB_MAX + 1];
	uint64_t hdr_checksum;
	_Atomic uint64_t current;
	struct prog_slot slots[2];
	struct prog_buf bufs[RK_PROGRESS_BUFFERS];
};

struct rk_progress {
	rk_arena *arena;
	struct prog_record *rec;
	bool in_iter;
	bool checking;    /* stages before the resume point: verify their names */
	struct prog_slot resume; /* the state found at open */
	unsigned index;   /* next stage of the current iteration */
	uint64_t prefix;  /* hash of the names of stages 0..index-1 */
	uint64_t iteration;
	uint64_t tear_at; /* fault injection: tear this update (1-based), 0 = off */
	struct rk_progress_status st;
};

/* ---- checksums and small helpers ------------------------------------------ */

static uint64_t hdr_sum(const struct prog_record *r)
{
	return rk_fnv1a(r, offsetof(struct prog_record, hdr_checksum), 0);
}

static uint64_t slot_sum(const struct prog_slot *s)
{
	return rk_fnv1a(s, offsetof(struct prog_slot, checksum), 0) | 1; /* never 0 */
}

static uint64_t buf_sum(const struct prog_buf *b)
{
	return rk_fnv1a(b, offsetof(struct prog_buf, checksum), 0) | 1;
}

static uint64_t name_hash(uint64_t prefix, const char *name)
{
	return rk_fnv1a(name, strlen(name) + 1, prefix); /* the NUL separates names */
}

#define PREFIX0 0xcbf29ce484222325ull /* FNV offset basis: no stage yet */

static bool name_ok(const char *name, size_t max)
{
	return name && name[0] && strnlen(name, max + 1) <= max;
}

static const char *phase_name(uint32_t ph)
{
	static const char *const names[] = {"idle", "preserving", "running", "finished"};
	return ph < 4 ? names[ph] : "?";
}

static const struct prog_slot *cur(const rk_progress *p)
{
	return &p->rec->slots[atomic_load_explicit(&p->rec->current, memory_order_acquire) & 1];
}

static void log_event(const rk_progress *p, const char *what)
{
	struct rk_ev e;
	rk_ev_begin(&e, "progress");
	rk_ev_str(&e, "job", p->rec->job);
	rk_ev_str(&e, "what", what);
	rk_ev_u64(&e, "iteration", p->st.iteration);
	rk_ev_u64(&e, "stage", p->st.stage);
	rk_ev_str(&e, "stage_name", p->st.stage_name);
	rk_ev_str(&e, "phase", phase_name(p->st.phase));
	rk_ev_str(&e, "reason", p->st.reason);
	rk_ev_end(&e);
}

/* ---- publishing ------------------------------------------------------------ */

/* Fault injection for the tests: with REKINDLE_STAGES_TEAR_AT=N, the first
 * incarnation writes half of its Nth update and then restarts, as if it had
 * died in the middle of the write. */
static void maybe_tear(rk_progress *p, struct prog_slot *next)
{
	if (!p->tear_at || p->st.record_updates != p->tear_at)
		return;
	memset((char *)next + sizeof *next / 2, 0x5a, sizeof *next - sizeof *next / 2);
	rk_restart("stages: torn progress update (fault injection)");
}

static void publish(rk_progress *p, uint64_t iteration, uint32_t stage, uint32_t phase, uint64_t prefix,
		    const char *name)
{
	struct prog_record *r = p->rec;
	uint64_t ci = atomic_load_explicit(&r->current, memory_order_relaxed) & 1;
	struct prog_slot *next = &r->slots[ci ^ 1];
	uint64_t seq = r->slots[ci].seq + 1;
	p->st.record_updates++;
	uint32_t wp = rk_wp_write_begin(p->arena); /* closed again before any hook runs */
	/* Field by field into the inactive slot: nobody reads it until the
	 * store of `current` below. */
	next->seq = seq;
	next->iteration = iteration;
	next->stage = stage;
	next->phase = phase;
	next->prefix = prefix;
	memset(next->name, 0, sizeof next->name);
	if (name)
		rk_strlcpy(next->name, name, sizeof next->name);
	maybe_tear(p, next);
	next->checksum = slot_sum(next);
	/* Release: the slot's bytes (and everything the finished hook wrote)
	 * are in memory before the index says so. */
	atomic_store_explicit(&r->current, ci ^ 1, memory_order_release);
	rk_wp_write_end(wp);
}

/* ---- opening ----------------------------------------------------------------- */

static void root_name(char *out, size_t cap, const char *job)
{
	snprintf(out, cap, "%s%s", ROOT_PREFIX, job);
}

/* Why r cannot be resumed, or NULL if it can. */
static const char *record_problem(rk_arena *a, const struct prog_record *r, const char *job, uint64_t fp,
				  char *why, size_t wl)
{
	if (rk_usable_size(a, r) < sizeof *r)
		return "the root does not point to a progress record";
	if (r->magic != PROG_MAGIC || r->version != PROG_VERSION || r->hdr_checksum != hdr_sum(r))
		return "corrupt record: bad magic, version or header checksum";
	if (strncmp(r->job, job, sizeof r->job) != 0)
		return "corrupt record: another job's name";
	if (r->fingerprint != fp) {
		snprintf(why, wl, "fingerprint %#" PRIx64 " differs from the record's %#" PRIx64
			 " (other job parameters or input)", fp, r->fingerprint);
		return why;
	}
	const struct prog_slot *s = &r->slots[atomic_load(&r->current) & 1];
	if (s->checksum != slot_sum(s))
		return "corrupt record: the current slot fails its checksum";
	if (s->phase > RK_PHASE_FINISHED || memchr(s->name, 0, sizeof s->name) == NULL)
		return "corrupt record: impossible phase or stage name";
	return NULL;
}

static struct prog_record *record_create(rk_arena *a, const char *job, uint64_t fp)
{
	struct prog_record *r = rk_calloc(a, 1, sizeof *r);
	if (!r)
		return NULL;
	uint32_t wp = rk_wp_write_begin(a);
	r->magic = PROG_MAGIC;
	r->version = PROG_VERSION;
	r->fingerprint = fp;
	rk_strlcpy(r->job, job, sizeof r->job);
	r->hdr_checksum = hdr_sum(r);
	r->slots[0] = (struct prog_slot){.seq = 1, .prefix = PREFIX0};
	r->slots[0].checksum = slot_sum(&r->slots[0]);
	atomic_store(&r->current, 0);
	rk_wp_write_end(wp);
	return r;
}

static void mark_record(rk_arena *a, struct prog_record *r)
{
	rk_mark(a, r);
	for (unsigned i = 0; i < RK_PROGRESS_BUFFERS; i++) {
		struct prog_buf *b = &r->bufs[i];
		if (b->checksum && b->checksum == buf_sum(b))
			rk_mark(a, (void *)(uintptr_t)b->ptr);
	}
}

static void describe_resume(rk_progress *p, const struct prog_slot *s)
{
	p->st.iteration = s->iteration;
	p->st.stage = s->stage;
	p->st.phase = (enum rk_stage_phase)s->phase;
	rk_strlcpy(p->st.stage_name, s->name, sizeof p->st.stage_name);
	static const char *const what[] = {
		"at a stage boundary", "in the preserve hook: preserve again, then run",
		"in the stage: restore (if it has a hook), then run again", "the job was finished"};
	snprintf(p->st.reason, sizeof p->st.reason, "resumed at iteration %" PRIu64 ", stage %u%s%s%s, %s",
		 s->iteration, s->stage, s->name[0] ? " (" : "", s->name, s->name[0] ? ")" : "", what[s->phase]);
}

/* $REKINDLE_STAGES_TEAR_AT (options.c), in the first incarnation only. */
static uint64_t env_tear_at(void)
{
	const struct rk_restart_info *info = rk_restart_info();
	if (!info || info->generation != 0)
		return 0;
	return rk_cfg.stages_tear_at;
}

rk_progress *rk_progress_open(rk_arena *a, const char *job, uint64_t fingerprint)
{
	if (!a || !name_ok(job, RK_PROGRESS_JOB_MAX)) {
		errno = EINVAL;
		return NULL;
	}
	rk_progress *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	p->arena = a;
	p->tear_at = env_tear_at();
	char root[RK_NAME_MAX + 1], why[128];
	root_name(root, sizeof root, job);
	struct prog_record *old = rk_root_get(a, root);
	const char *problem = old ? record_problem(a, old, job, fingerprint, why, sizeof why) : NULL;
	if (old && !problem) {
		p->rec = old;
		if (rk_is_recovery())
			mark_record(a, old);
		p->resume = *cur(p);
		describe_resume(p, &p->resume);
		p->st.resumed = true;
		p->checking = true;
		log_event(p, "resume");
		return p;
	}
	struct prog_record *r = record_create(a, job, fingerprint);
	int ret = r ? rk_root_set(a, root, r) : -ENOMEM;
	if (ret < 0) {
		rk_free(a, r);
		free(p);
		errno = -ret;
		return NULL;
	}
	p->rec = r;
	p->resume = *cur(p);
	if (problem) {
		/* An unmarked old record is swept by rk_finish_recovery; one we
		 * recognise as ours can go now. */
		if (rk_usable_size(a, old) >= sizeof *old && old->magic == PROG_MAGIC)
			rk_free(a, old);
		p->st.discarded = true;
		snprintf(p->st.reason, sizeof p->st.reason, "discarded: %s; starting over", problem);
		log_event(p, "discard");
	} else {
		rk_strlcpy(p->st.reason, "fresh: no progress record", sizeof p->st.reason);
	}
	return p;
}

int rk_progress_status(const rk_progress *p, struct rk_progress_status *out)
{
	if (!p || !out)
		return -EINVAL;
	*out = p->st;
	return 0;
}

void rk_progress_close(rk_progress *p)
{
	free(p);
}

/* ---- iterations and stages ---------------------------------------------------- */

int rk_progress_begin_iteration(rk_progress *p, uint64_t *iteration)
{
	if (!p || !iteration)
		return -EINVAL;
	const struct prog_slot *s = cur(p);
	*iteration = s->iteration;
	if (s->phase == RK_PHASE_FINISHED)
		return -EALREADY;
	if (p->in_iter && p->index > 0)
		return -EPROTO; /* stages of this iteration ran: end it first */
	p->in_iter = true;
	p->index = 0;
	p->prefix = PREFIX0;
	p->iteration = s->iteration;
	return 0;
}

/* Stage i == s.stage was interrupted, or never begun, in this iteration:
 * checks that it is the same stage as recorded. */
static int check_resumed(rk_progress *p, const struct prog_slot *s, const char *name)
{
	bool same_prefix = !p->checking || s->prefix == p->prefix;
	p->checking = false;
	/* the name of an interrupted stage is checked after a failed hook in
	 * this incarnation too: only that stage may repair its data */
	if (!same_prefix || (s->phase != RK_PHASE_IDLE && strcmp(s->name, name) != 0)) {
		snprintf(p->st.reason, sizeof p->st.reason,
			 "stage %u of iteration %" PRIu64 " is \"%s\" here but \"%s\" in the record, or earlier "
			 "stages differ: the program changed", p->index, p->iteration, name, s->name);
		log_event(p, "mismatch");
		return -ESTALE;
	}
	return 0;
}

int rk_stage(rk_progress *p, const char *name, rk_stage_fn run, rk_stage_fn preserve, rk_stage_fn restore,
	     void *ctx)
{
	if (!p || !run || !name_ok(name, RK_STAGE_NAME_MAX))
		return -EINVAL;
	if (!p->in_iter)
		return -EPROTO;
	const struct prog_slot *s = cur(p);
	uint32_t i = p->index;
	if (s->stage > i) { /* completed before the failure */
		p->prefix = name_hash(p->prefix, name);
		p->index++;
		p->st.stages_skipped++;
		return RK_STAGE_SKIPPED;
	}
	if (s->stage < i)
		return -EPROTO; /* cannot happen: each completed stage advances the record */
	int r = check_resumed(p, s, name);
	if (r < 0)
		return r;
	uint32_t phase = s->phase;
	if (phase == RK_PHASE_RUNNING && restore) {
		/* run may have changed the data halfway: put it back.  The state
		 * stays RUNNING, so a failure in here lands here again. */
		p->st.restores++;
		if ((r = restore(ctx)) < 0)
			return r;
	}
	if (phase == RK_PHASE_IDLE && preserve)
		publish(p, p->iteration, i, RK_PHASE_PRESERVING, p->prefix, name), phase = RK_PHASE_PRESERVING;
	if (phase == RK_PHASE_PRESERVING && preserve && (r = preserve(ctx)) < 0)
		return r;
	if (phase != RK_PHASE_RUNNING)
		publish(p, p->iteration, i, RK_PHASE_RUNNING, p->prefix, name);
	if ((r = run(ctx)) < 0)
		return r; /* RUNNING stays published: a retry restores first */
	p->prefix = name_hash(p->prefix, name);
	p->index++;
	p->st.stages_run++;
	publish(p, p->iteration, i + 1, RK_PHASE_IDLE, p->prefix, NULL);
	return RK_STAGE_RAN;
}

int rk_progress_end_iteration(rk_progress *p)
{
	if (!p)
		return -EINVAL;
	const struct prog_slot *s = cur(p);
	if (!p->in_iter)
		return -EPROTO;
	if (s->stage != p->index || (p->checking && s->prefix != p->prefix))
		return -ESTALE; /* the record has stages this incarnation did not reach */
	if (s->phase != RK_PHASE_IDLE)
		return -EPROTO; /* the last stage failed and was not run again */
	p->checking = false;
	p->in_iter = false;
	publish(p, p->iteration + 1, 0, RK_PHASE_IDLE, PREFIX0, NULL);
	return 0;
}

int rk_progress_done(rk_progress *p)
{
	if (!p)
		return -EINVAL;
	const struct prog_slot *s = cur(p);
	uint64_t done = s->iteration + (p->in_iter && s->stage > 0 ? 1 : 0);
	p->in_iter = false;
	p->checking = false;
	publish(p, done, 0, RK_PHASE_FINISHED, PREFIX0, NULL);
	return 0;
}

int rk_progress_reset(rk_progress *p, uint64_t iteration)
{
	if (!p)
		return -EINVAL;
	p->in_iter = false;
	p->checking = false;
	publish(p, iteration, 0, RK_PHASE_IDLE, PREFIX0, NULL);
	return 0;
}

/* ---- save areas ------------------------------------------------------------------ */

void *rk_progress_buffer(rk_progress *p, const char *name, size_t size)
{
	if (!p || !name_ok(name, RK_STAGE_NAME_MAX) || size == 0) {
		errno = EINVAL;
		return NULL;
	}
	struct prog_buf *slot = NULL, *empty = NULL;
	for (unsigned i = 0; i < RK_PROGRESS_BUFFERS; i++) {
		struct prog_buf *b = &p->rec->bufs[i];
		bool valid = b->checksum && b->checksum == buf_sum(b);
		if (valid && strncmp(b->name, name, sizeof b->name) == 0) {
			slot = b;
			break;
		}
		if (!valid && !empty)
			empty = b;
	}
	if (slot && slot->size >= size)
		return (void *)(uintptr_t)slot->ptr;
	if (!slot && !empty) {
		errno = ENOSPC;
		return NULL;
	}
	void *mem = rk_alloc(p->arena, size);
	if (!mem)
		return NULL;
	/* published below, outside any unsafe region: committed first, or
	 * the pending cleanup of a warm start would free it */
	(void)rk_keep(p->arena, mem);
	struct prog_buf *b = slot ? slot : empty;
	void *old = slot ? (void *)(uintptr_t)slot->ptr : NULL;
	/* A failure in the middle of these stores leaves an entry that fails
	 * its checksum: it counts as free, and the sweep frees both buffers.
	 * The entry is the runtime's; the buffer's contents are the app's. */
	uint32_t wp = rk_wp_write_begin(p->arena);
	b->checksum = 0;
	memset(b->name, 0, sizeof b->name);
	rk_strlcpy(b->name, name, sizeof b->name);
	b->ptr = (uint64_t)(uintptr_t)mem;
	b->size = size;
	atomic_signal_fence(memory_order_release);
	b->checksum = buf_sum(b);
	rk_wp_write_end(wp);
	if (old)
		rk_free(p->arena, old);
	return mem;
}
