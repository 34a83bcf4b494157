/* test_stages - stage-based progress recovery (rekindle_stages.h), in one
 * process: a "crash" is a hook that does part (or all) of its work and
 * then fails; the test then drops the handle and opens the record again,
 * as the next incarnation would, and runs the job to the end.  For every
 * crash point the final data must equal an uninterrupted run's.  Real
 * restarts (faults, warm re-exec, torn record updates) are covered by
 * tests/test_stages.py with examples/kmeans. */
#include "testlib.h"

#define N 8
#define ITERS 4

static rk_arena *arena;

/* The job's preserved data: every stage but the first changes it in a
 * way that is wrong to do twice. */
struct data {
	uint64_t v[N];
	uint64_t tmp[N]; /* stage "square"'s output */
};

struct ctx {
	rk_progress *p;
	struct data *d;
	/* crash injection: the call numbered crash_at fails after doing
	 * `partial` (half) or all of its work */
	unsigned calls, crash_at;
	bool partial, crashed;
	unsigned preserves, restores, runs;
	char trace[512];
};

static void trace(struct ctx *c, const char *what)
{
	rk_strlcat(c->trace, what, sizeof c->trace);
	rk_strlcat(c->trace, " ", sizeof c->trace);
}

/* True when this call is the one that crashes: it stops after *upto of n
 * elements. */
static bool crash_here(struct ctx *c, unsigned *upto)
{
	*upto = N;
	if (++c->calls != c->crash_at)
		return false;
	c->crashed = true;
	*upto = c->partial ? N / 2 : N;
	return true;
}

static uint64_t *save_area(struct ctx *c)
{
	return rk_progress_buffer(c->p, "v.saved", sizeof c->d->v);
}

static int preserve_v(void *arg)
{
	struct ctx *c = arg;
	uint64_t *s = save_area(c);
	if (!s)
		return -errno;
	unsigned upto;
	bool crash = crash_here(c, &upto);
	for (unsigned i = 0; i < upto; i++)
		s[i] = c->d->v[i];
	c->preserves++;
	trace(c, "P");
	return crash ? -EINTR : 0;
}

static int restore_v(void *arg)
{
	struct ctx *c = arg;
	uint64_t *s = save_area(c);
	if (!s)
		return -errno;
	unsigned upto;
	bool crash = crash_here(c, &upto);
	for (unsigned i = 0; i < upto; i++)
		c->d->v[i] = s[i];
	c->restores++;
	trace(c, "R");
	return crash ? -EINTR : 0;
}

/* square: tmp from v, overwritten completely: no hooks needed. */
static int run_square(void *arg)
{
	struct ctx *c = arg;
	unsigned upto;
	bool crash = crash_here(c, &upto);
	for (unsigned i = 0; i < upto; i++)
		c->d->tmp[i] = c->d->v[i] * c->d->v[i] + 1;
	c->runs++;
	trace(c, "sq");
	return crash ? -EINTR : 0;
}

/* accumulate: v += tmp * (i + 1), in place. */
static int run_accumulate(void *arg)
{
	struct ctx *c = arg;
	unsigned upto;
	bool crash = crash_here(c, &upto);
	for (unsigned i = 0; i < upto; i++)
		c->d->v[i] += c->d->tmp[i] * (i + 1);
	c->runs++;
	trace(c, "acc");
	return crash ? -EINTR : 0;
}

/* rotate: v[i] ^= v[i+1] rotated, in place and order-dependent. */
static int run_rotate(void *arg)
{
	struct ctx *c = arg;
	unsigned upto;
	bool crash = crash_here(c, &upto);
	for (unsigned i = 0; i < upto; i++)
		c->d->v[i] ^= (c->d->v[(i + 1) % N] << 7) | (c->d->v[(i + 1) % N] >> 57);
	c->runs++;
	trace(c, "rot");
	return crash ? -EINTR : 0;
}

static struct data *new_data(void)
{
	struct data *d = rk_calloc(arena, 1, sizeof *d);
	for (unsigned i = 0; i < N; i++)
		d->v[i] = i * 3 + 1;
	return d;
}

/* Runs the job until it ends or a hook fails; returns 0 when done. */
static int run_job(struct ctx *c)
{
	uint64_t it;
	int r;
	while ((r = rk_progress_begin_iteration(c->p, &it)) == 0 && it < ITERS) {
		if ((r = rk_stage(c->p, "square", run_square, NULL, NULL, c)) < 0)
			return r;
		if ((r = rk_stage(c->p, "accumulate", run_accumulate, preserve_v, restore_v, c)) < 0)
			return r;
		if ((r = rk_stage(c->p, "rotate", run_rotate, preserve_v, restore_v, c)) < 0)
			return r;
		if ((r = rk_progress_end_iteration(c->p)) < 0)
			return r;
	}
	if (r < 0 && r != -EALREADY)
		return r;
	return rk_progress_done(c->p);
}

static void reference(uint64_t out[N], struct rk_progress_status *st)
{
	struct ctx c = {0};
	c.d = new_data();
	c.p = rk_progress_open(arena, "reference", 1);
	CHECK(c.p != NULL);
	CHECK_EQ_INT(run_job(&c), 0);
	memcpy(out, c.d->v, sizeof c.d->v);
	rk_progress_status(c.p, st);
	CHECK_EQ(c.runs, 3 * ITERS);
	CHECK_EQ(c.preserves, 2 * ITERS);
	CHECK_EQ(c.restores, 0);
	CHECK_STR_HAS(c.trace, "sq P acc P rot sq P acc");
	rk_progress_close(c.p);
	rk_root_set(arena, "rk.progress.reference", NULL);
}

static void fresh_run(void)
{
	uint64_t ref[N];
	struct rk_progress_status st;
	reference(ref, &st);
	CHECK(!st.resumed && !st.discarded);
	CHECK_STR_HAS(st.reason, "fresh");
	CHECK_EQ(st.stages_run, 3 * ITERS);
	CHECK_EQ(st.stages_skipped, 0);
	/* per iteration: square 2 updates (running, done), accumulate and rotate
	 * 3 each (preserving, running, done), the end 1; then done */
	CHECK_EQ(st.record_updates, ITERS * 9 + 1);

	/* a finished job stays finished when opened again */
	rk_progress *p = rk_progress_open(arena, "once", 7);
	uint64_t it = 99;
	CHECK_EQ_INT(rk_progress_begin_iteration(p, &it), 0);
	CHECK_EQ(it, 0);
	CHECK_EQ_INT(rk_progress_end_iteration(p), 0);
	CHECK_EQ_INT(rk_progress_done(p), 0);
	rk_progress_close(p);
	p = rk_progress_open(arena, "once", 7);
	CHECK_EQ_INT(rk_progress_status(p, &st), 0);
	CHECK(st.resumed && st.phase == RK_PHASE_FINISHED);
	CHECK_EQ_INT(rk_progress_begin_iteration(p, &it), -EALREADY);
	CHECK_EQ(it, 1);
	CHECK_EQ_INT(rk_progress_reset(p, 5), 0);
	CHECK_EQ_INT(rk_progress_begin_iteration(p, &it), 0);
	CHECK_EQ(it, 5);
	rk_progress_close(p);
	rk_root_set(arena, "rk.progress.once", NULL);
}

/* Every hook call of the job, crashing halfway or after all its work,
 * then a "restart": the result is the uninterrupted one, and only the
 * interrupted iteration's remaining stages run again. */
static void crash_everywhere(void)
{
	uint64_t ref[N];
	struct rk_progress_status st;
	reference(ref, &st);
	unsigned total_calls = 5 * ITERS, bad = 0, cases = 0;
	for (unsigned at = 1; at <= total_calls; at++) {
		for (int partial = 0; partial < 2; partial++) {
			struct ctx c = {.crash_at = at, .partial = partial};
			c.d = new_data();
			rk_root_set(arena, "data", c.d);
			c.p = rk_progress_open(arena, "job", 42);
			int r = run_job(&c);
			CHECK_EQ_INT(r, -EINTR);
			rk_progress_close(c.p);
			/* the next incarnation: same arena, new handle, no crash */
			unsigned runs_before = c.runs;
			c.crash_at = 0;
			c.trace[0] = 0;
			c.p = rk_progress_open(arena, "job", 42);
			rk_progress_status(c.p, &st);
			CHECK(st.resumed);
			CHECK_EQ_INT(run_job(&c), 0);
			rk_progress_status(c.p, &st);
			bool same = memcmp(c.d->v, ref, sizeof ref) == 0;
			/* no iteration completed before the crash ran again: at most
			 * the crashed iteration's three stages, and the later ones */
			unsigned done_iters = (at - 1) / 5;
			bool redo = c.runs - runs_before > 3 * (ITERS - done_iters);
			if (!same || redo)
				printf("crash at call %u (%s): %s%s; trace %s\n", at, partial ? "half done" : "all done",
				       same ? "" : "other data ", redo ? "redid completed stages" : "", c.trace);
			bad += !same || redo;
			cases++;
			rk_progress_close(c.p);
			rk_root_set(arena, "rk.progress.job", NULL);
			rk_root_set(arena, "data", NULL);
			rk_free(arena, c.d);
		}
	}
	CHECK_MSG(bad == 0, "%u of %u crash points ended with other data or redid completed iterations", bad, cases);
	CHECK_EQ(cases, 2 * total_calls);
}

/* The resume decisions one by one, at known crash points. */
static void resume_rules(void)
{
	struct rk_progress_status st;
	/* call 1: square of iteration 0; calls 2, 3: preserve and run of
	 * accumulate; 4, 5: rotate.  Crash in accumulate's run (call 3). */
	struct ctx c = {.crash_at = 3, .partial = true};
	c.d = new_data();
	c.p = rk_progress_open(arena, "rules", 1);
	CHECK_EQ_INT(run_job(&c), -EINTR);
	rk_progress_close(c.p);
	c.crash_at = 0;
	c.trace[0] = 0;
	c.p = rk_progress_open(arena, "rules", 1);
	rk_progress_status(c.p, &st);
	CHECK(st.resumed && st.iteration == 0 && st.stage == 1 && st.phase == RK_PHASE_RUNNING);
	CHECK_STR_HAS(st.stage_name, "accumulate");
	CHECK_STR_HAS(st.reason, "resumed at iteration 0, stage 1 (accumulate)");
	uint64_t it;
	CHECK_EQ_INT(rk_progress_begin_iteration(c.p, &it), 0);
	CHECK_EQ(it, 0);
	CHECK_EQ_INT(rk_stage(c.p, "square", run_square, NULL, NULL, &c), RK_STAGE_SKIPPED);
	CHECK_EQ_INT(rk_stage(c.p, "accumulate", run_accumulate, preserve_v, restore_v, &c), RK_STAGE_RAN);
	CHECK_EQ_INT(rk_stage(c.p, "rotate", run_rotate, preserve_v, restore_v, &c), RK_STAGE_RAN);
	CHECK_EQ_INT(rk_progress_end_iteration(c.p), 0);
	/* restore, then the stage again; preserve not re-run (it had completed) */
	CHECK_STR_HAS(c.trace, "R acc P rot");
	CHECK(strncmp(c.trace, "R acc", 5) == 0);
	rk_progress_close(c.p);

	/* crash inside a preserve hook (call 2 of a fresh job): preserve again,
	 * no restore */
	rk_root_set(arena, "rk.progress.rules", NULL);
	struct ctx e = {.crash_at = 2, .partial = true};
	e.d = new_data();
	e.p = rk_progress_open(arena, "rules", 1);
	CHECK_EQ_INT(run_job(&e), -EINTR);
	rk_progress_close(e.p);
	e.crash_at = 0;
	e.trace[0] = 0;
	e.p = rk_progress_open(arena, "rules", 1);
	rk_progress_status(e.p, &st);
	CHECK(st.phase == RK_PHASE_PRESERVING && st.stage == 1);
	CHECK_EQ_INT(run_job(&e), 0);
	CHECK(strncmp(e.trace, "P acc", 5) == 0);
	CHECK_EQ(e.restores, 0);
	rk_progress_close(e.p);
	rk_root_set(arena, "rk.progress.rules", NULL);
}

/* A failed hook in the same incarnation: calling rk_stage again repairs
 * first, exactly as a restart would. */
static void retry_after_error(void)
{
	uint64_t ref[N];
	struct rk_progress_status st;
	reference(ref, &st);
	struct ctx c = {.crash_at = 8, .partial = true}; /* accumulate's run, iteration 1 */
	c.d = new_data();
	c.p = rk_progress_open(arena, "retry", 1);
	CHECK_EQ_INT(run_job(&c), -EINTR);
	CHECK_EQ_INT(rk_progress_begin_iteration(c.p, &(uint64_t){0}), -EPROTO); /* stages ran: end first */
	CHECK_EQ_INT(rk_progress_end_iteration(c.p), -EPROTO); /* a stage is half done */
	/* another stage in its place is refused */
	CHECK_EQ_INT(rk_stage(c.p, "rotate", run_rotate, preserve_v, restore_v, &c), -ESTALE);
	CHECK_EQ_INT(rk_stage(c.p, "accumulate", run_accumulate, preserve_v, restore_v, &c), RK_STAGE_RAN);
	CHECK_EQ(c.restores, 1);
	CHECK_EQ_INT(rk_stage(c.p, "rotate", run_rotate, preserve_v, restore_v, &c), RK_STAGE_RAN);
	CHECK_EQ_INT(rk_progress_end_iteration(c.p), 0);
	CHECK_EQ_INT(run_job(&c), 0);
	CHECK(memcmp(c.d->v, ref, sizeof ref) == 0);
	rk_progress_close(c.p);
	rk_root_set(arena, "rk.progress.retry", NULL);
}

static void foreign_and_corrupt_records_start_over(void)
{
	struct rk_progress_status st;
	struct ctx c = {.crash_at = 7, .partial = true};
	c.d = new_data();
	c.p = rk_progress_open(arena, "other", 1);
	CHECK_EQ_INT(run_job(&c), -EINTR);
	rk_progress_close(c.p);

	/* other parameters: discarded, iteration 0 again */
	rk_progress *p = rk_progress_open(arena, "other", 2);
	rk_progress_status(p, &st);
	CHECK(!st.resumed && st.discarded);
	CHECK_STR_HAS(st.reason, "fingerprint 0x2 differs from the record's 0x1");
	uint64_t it = 9;
	CHECK_EQ_INT(rk_progress_begin_iteration(p, &it), 0);
	CHECK_EQ(it, 0);
	CHECK_EQ_INT(rk_stage(p, "square", run_square, NULL, NULL, &c), RK_STAGE_RAN);
	rk_progress_close(p);

	/* a flipped bit in the record's header: corrupt, discarded */
	char *rec = rk_root_get(arena, "rk.progress.other");
	rec[9] ^= 0x40;
	p = rk_progress_open(arena, "other", 2);
	rk_progress_status(p, &st);
	CHECK(!st.resumed && st.discarded);
	CHECK_STR_HAS(st.reason, "corrupt record");
	CHECK(rk_root_get(arena, "rk.progress.other") != rec); /* a new record */
	rk_progress_close(p);

	/* a root that points at something else */
	void *junk = rk_calloc(arena, 1, 64);
	rk_root_set(arena, "rk.progress.other", junk);
	p = rk_progress_open(arena, "other", 2);
	rk_progress_status(p, &st);
	CHECK(st.discarded);
	CHECK_STR_HAS(st.reason, "does not point to a progress record");
	rk_progress_close(p);
	rk_root_set(arena, "rk.progress.other", NULL);
	rk_free(arena, junk);
}

/* The program's stages differ from the record's: refused, nothing run. */
static void changed_program_is_refused(void)
{
	struct ctx c = {.crash_at = 5, .partial = true}; /* rotate's run, iteration 0 */
	c.d = new_data();
	c.p = rk_progress_open(arena, "changed", 1);
	CHECK_EQ_INT(run_job(&c), -EINTR);
	rk_progress_close(c.p);

	/* stage 2 is now called something else */
	rk_progress *p = rk_progress_open(arena, "changed", 1);
	uint64_t it;
	c.crash_at = 0;
	unsigned runs = c.runs;
	CHECK_EQ_INT(rk_progress_begin_iteration(p, &it), 0);
	CHECK_EQ_INT(rk_stage(p, "square", run_square, NULL, NULL, &c), RK_STAGE_SKIPPED);
	CHECK_EQ_INT(rk_stage(p, "accumulate", run_accumulate, preserve_v, restore_v, &c), RK_STAGE_SKIPPED);
	CHECK_EQ_INT(rk_stage(p, "spin", run_rotate, preserve_v, restore_v, &c), -ESTALE);
	CHECK_EQ(c.runs, runs);
	struct rk_progress_status st;
	rk_progress_status(p, &st);
	CHECK_STR_HAS(st.reason, "the program changed");
	rk_progress_close(p);

	/* an earlier stage renamed: caught by the names hash */
	p = rk_progress_open(arena, "changed", 1);
	CHECK_EQ_INT(rk_progress_begin_iteration(p, &it), 0);
	CHECK_EQ_INT(rk_stage(p, "cube", run_square, NULL, NULL, &c), RK_STAGE_SKIPPED);
	CHECK_EQ_INT(rk_stage(p, "accumulate", run_accumulate, preserve_v, restore_v, &c), RK_STAGE_SKIPPED);
	CHECK_EQ_INT(rk_stage(p, "rotate", run_rotate, preserve_v, restore_v, &c), -ESTALE);
	rk_progress_close(p);

	/* fewer stages than recorded before the end of the iteration */
	p = rk_progress_open(arena, "changed", 1);
	CHECK_EQ_INT(rk_progress_begin_iteration(p, &it), 0);
	CHECK_EQ_INT(rk_stage(p, "square", run_square, NULL, NULL, &c), RK_STAGE_SKIPPED);
	CHECK_EQ_INT(rk_progress_end_iteration(p), -ESTALE);
	rk_progress_close(p);
	rk_root_set(arena, "rk.progress.changed", NULL);
}

static void buffers_and_bad_arguments(void)
{
	rk_progress *p = rk_progress_open(arena, "bufs", 3);
	char *b = rk_progress_buffer(p, "one", 100);
	CHECK(b != NULL && rk_arena_contains(arena, b));
	memset(b, 0xab, 100);
	CHECK_PTR_EQ(rk_progress_buffer(p, "one", 50), b); /* found again, not shrunk */
	rk_progress_close(p);
	p = rk_progress_open(arena, "bufs", 3);
	CHECK_PTR_EQ(rk_progress_buffer(p, "one", 100), b); /* across a reopen */
	CHECK_EQ((unsigned char)b[99], 0xab);
	char *big = rk_progress_buffer(p, "one", 100000); /* grows: replaced */
	CHECK(big != NULL && big != b);
	CHECK_PTR_EQ(rk_progress_buffer(p, "one", 1), big);
	char name[8];
	unsigned made = 1;
	for (unsigned i = 0; i < RK_PROGRESS_BUFFERS + 2; i++) {
		snprintf(name, sizeof name, "b%u", i);
		made += rk_progress_buffer(p, name, 8) != NULL;
	}
	CHECK_EQ(made, RK_PROGRESS_BUFFERS);
	errno = 0;
	CHECK_PTR_EQ(rk_progress_buffer(p, "one-more", 8), NULL);
	CHECK_EQ_INT(errno, ENOSPC);
	CHECK_PTR_EQ(rk_progress_buffer(p, "", 8), NULL);
	CHECK_PTR_EQ(rk_progress_buffer(p, "zero", 0), NULL);

	/* stages outside an iteration, bad names */
	struct ctx c = {0};
	c.d = new_data();
	CHECK_EQ_INT(rk_stage(p, "x", run_square, NULL, NULL, &c), -EPROTO);
	CHECK_EQ_INT(rk_progress_end_iteration(p), -EPROTO);
	uint64_t it;
	CHECK_EQ_INT(rk_progress_begin_iteration(p, &it), 0);
	CHECK_EQ_INT(rk_stage(p, "", run_square, NULL, NULL, &c), -EINVAL);
	CHECK_EQ_INT(rk_stage(p, "x", NULL, NULL, NULL, &c), -EINVAL);
	CHECK_EQ_INT(rk_stage(p, "a-stage-name-of-thirty-two-chars", run_square, NULL, NULL, &c), -EINVAL);
	CHECK_EQ_INT(rk_stage(p, "a-stage-name-of-thirty-one-char", run_square, NULL, NULL, &c), RK_STAGE_RAN);
	rk_progress_close(p);
	rk_root_set(arena, "rk.progress.bufs", NULL);

	errno = 0;
	CHECK_PTR_EQ(rk_progress_open(arena, "", 1), NULL);
	CHECK_EQ_INT(errno, EINVAL);
	CHECK_PTR_EQ(rk_progress_open(NULL, "x", 1), NULL);
	CHECK_PTR_EQ(rk_progress_open(arena, "a-job-name-of-thirty-six-characters!", 1), NULL);
	p = rk_progress_open(arena, "a-job-name-of-thirty-five-character", 1);
	CHECK(p != NULL);
	CHECK(rk_root_get(arena, "rk.progress.a-job-name-of-thirty-five-character") != NULL);
	rk_progress_close(p);
	CHECK_EQ_INT(rk_progress_status(NULL, NULL), -EINVAL);
}

int main(int argc, char **argv)
{
	test_init(argc, argv, "test_stages");
	arena = test_arena("stages", 64u << 20);
	RUN(fresh_run);
	RUN(resume_rules);
	RUN(crash_everywhere);
	RUN(retry_after_error);
	RUN(foreign_and_corrupt_records_start_over);
	RUN(changed_program_is_refused);
	RUN(buffers_and_bad_arguments);
	return check_done();
}
