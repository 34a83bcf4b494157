/*
 * rekindle_stages.h - stage-based progress recovery (included by rekindle.h).
 *
 * A long computation (an iterative solver, k-means, training) changes its
 * preserved state all the time, so wrapping it in unsafe regions would make
 * almost every failure restart cold and lose all progress.  Instead the
 * computation declares *stages*: each iteration runs the same sequence of
 * named stages, and a small progress record in an arena says which stage of
 * which iteration is under way.  After a warm restart the application runs
 * its loop again from the top; rk_progress_begin_iteration() returns the
 * interrupted iteration, rk_stage() skips the stages of it that had already
 * completed, repairs the interrupted one with its restore hook, and from
 * there on everything runs normally.
 *
 *     rk_progress *p = rk_progress_open(arena, "kmeans", params_hash);
 *     // on a warm start, before rk_finish_recovery: it marks its own objects
 *     uint64_t it;
 *     while (rk_progress_begin_iteration(p, &it) == 0 && it < iters) {
 *         rk_stage(p, "assign", assign, NULL, NULL, st);           // temporaries only
 *         rk_stage(p, "update", update, save_centroids, restore_centroids, st);
 *         rk_progress_end_iteration(p);
 *     }
 *     rk_progress_done(p);
 *
 * The contract for one stage (name, run, preserve, restore):
 *   - preserve(ctx) runs before run(ctx).  It saves what run is about to
 *     change, typically into a buffer from rk_progress_buffer().  It must
 *     not change the live data itself: a failure inside it is repaired by
 *     running it again.
 *   - run(ctx) does the stage's work.  It may change preserved state.
 *   - restore(ctx) runs only on recovery, when run may have been
 *     interrupted: it puts back what preserve saved, so that run can start
 *     again from the same state.  It must be idempotent (a failure inside
 *     it is repaired by running it again).
 *   - Both hooks may be NULL: the stage then only creates temporaries, or
 *     overwrites its outputs completely from inputs it does not change, so
 *     running it again from the start is enough.
 *   - Every change of preserved state inside the iteration happens inside
 *     some stage; code between stages only computes transient values.
 *   - A stage is a consistent point, so stages run outside unsafe regions.
 *     (A failure inside an rk_unsafe_begin/end region still goes cold.)
 * Hooks return 0 or a negative errno; a negative value stops the stage and
 * is returned by rk_stage() (the stage then counts as not completed).
 *
 * The record is updated with whole-record writes into the inactive one of
 * two slots, each with a checksum, published by one aligned store of the
 * slot index; a failure at any instruction leaves the old or the new state
 * valid.  A record whose checksums fail, whose job fingerprint differs
 * (other parameters, other data) or whose stage names differ from the
 * program's (another program version) is never resumed: rk_progress_open
 * starts over and says why in rk_progress_status().reason and in a
 * {"rekindle":"progress"} event line.  Not thread-safe: one thread drives
 * a job (the stages themselves may use threads).
 *
 * In an arena opened RK_ARENA_WRITE_PROTECT the runtime opens the key for
 * its own writes of the record.  What stages and hooks write (live data,
 * the save areas of rk_progress_buffer) is the application's and faults
 * outside an unsafe region; a failure inside one goes cold, so keep such
 * regions short or the job's data unprotected (docs/stages.md).
 */
#ifndef REKINDLE_STAGES_H
#define REKINDLE_STAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rk_progress rk_progress;
struct rk_arena;

/* A stage's code or hook; returns 0 or a negative errno. */
typedef int (*rk_stage_fn)(void *ctx);

#define RK_PROGRESS_JOB_MAX 35   /* job names: the root is "rk.progress.<job>" */
#define RK_STAGE_NAME_MAX 31     /* stage and buffer names, without the NUL */
#define RK_PROGRESS_BUFFERS 16   /* rk_progress_buffer() names per job */

/* rk_stage() results besides errors. */
#define RK_STAGE_RAN 0     /* the stage ran (restore first, if it was interrupted) */
#define RK_STAGE_SKIPPED 1 /* completed before the failure: not run again */

/* Where the job stands; phase values of struct rk_progress_status. */
enum rk_stage_phase {
	RK_PHASE_IDLE = 0,       /* stage `stage` not begun yet */
	RK_PHASE_PRESERVING = 1, /* inside the preserve hook of `stage` */
	RK_PHASE_RUNNING = 2,    /* inside the code (or restore hook) of `stage` */
	RK_PHASE_FINISHED = 3,   /* rk_progress_done() was called */
};

struct rk_progress_status {
	bool resumed;           /* rk_progress_open found a valid record to resume */
	bool discarded;         /* it found a record it could not use (see reason) */
	uint64_t iteration;     /* the resume point found at open ... */
	unsigned stage;         /* ... index of the stage within the iteration */
	enum rk_stage_phase phase;
	char stage_name[RK_STAGE_NAME_MAX + 1]; /* name of that stage, "" at a boundary */
	char reason[256];       /* why a record was discarded, or "fresh", or "resumed" */
	/* counters of this incarnation */
	uint64_t stages_run, stages_skipped, restores, record_updates;
};

/* Opens (warm start: finds) the progress record of job in arena.
 * fingerprint identifies the job's parameters and input: a record with
 * another fingerprint is discarded and the job starts over.  On a warm
 * start call it before rk_finish_recovery(): it rk_mark()s the record and
 * the buffers.  Returns NULL with errno set on failure (EINVAL for a bad
 * name, ENOMEM when the arena is full). */
rk_progress *rk_progress_open(struct rk_arena *arena, const char *job, uint64_t fingerprint);

/* What rk_progress_open found, and the counters so far. */
int rk_progress_status(const rk_progress *p, struct rk_progress_status *out);

/* Starts (or, on recovery, re-enters) an iteration: *iteration is 0 for a
 * new job, the interrupted iteration after a warm restart, and one more
 * after each rk_progress_end_iteration().  Returns 0, or -EALREADY when the
 * job was finished by rk_progress_done() (*iteration is then the number of
 * iterations done). */
int rk_progress_begin_iteration(rk_progress *p, uint64_t *iteration);

/* Runs the next stage of the current iteration, or skips it when it had
 * completed before the failure.  Returns RK_STAGE_RAN, RK_STAGE_SKIPPED,
 * a hook's negative error, -EPROTO when called outside an iteration, or
 * -ESTALE when name differs from the stage recorded at this position (the
 * program changed under a warm restart; nothing was run). */
int rk_stage(rk_progress *p, const char *name, rk_stage_fn run, rk_stage_fn preserve, rk_stage_fn restore,
	     void *ctx);

/* Ends the current iteration: its stages all completed.  Returns 0, -EPROTO
 * outside an iteration, or -ESTALE when stages recorded as completed were
 * not reached in this incarnation. */
int rk_progress_end_iteration(rk_progress *p);

/* The job is complete: later opens find it finished (begin_iteration
 * returns -EALREADY) until rk_progress_reset(). */
int rk_progress_done(rk_progress *p);

/* Forgets the progress: the next iteration is `iteration` (0 to start
 * over; another value after the app loaded a checkpoint of its own). */
int rk_progress_reset(rk_progress *p, uint64_t iteration);

/* A save area for preserve/restore hooks, kept in the arena with the
 * record: the buffer called name, of at least size bytes, created on first
 * use and found again after a warm restart (same address, same contents).
 * Asking for a larger size replaces it (contents not kept).  Returns NULL
 * with errno set on failure (EINVAL, ENOSPC for too many names, ENOMEM). */
void *rk_progress_buffer(rk_progress *p, const char *name, size_t size);

/* Frees the handle (not the record). */
void rk_progress_close(rk_progress *p);

#ifdef __cplusplus
}
#endif

#endif /* REKINDLE_STAGES_H */
