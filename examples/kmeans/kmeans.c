/* kmeans - a long computation that survives crashes with stage-based
 * progress recovery (rekindle_stages.h).
 *
 * Lloyd's k-means over N points of D float dimensions, generated from a
 * seed (no input file: the points stand in for a large input that a real
 * job would read).  Points, assignments and centroids live in an arena.
 * Every iteration runs three stages:
 *
 *   assign    nearest centroid of each point -> assign[], inertia.
 *             Overwrites its outputs completely: no hooks.
 *   update    new centroids from the assignments, written in place (an
 *             empty cluster keeps its old centroid, so the stage reads what
 *             it overwrites).  preserve saves the centroids, restore puts
 *             them back.
 *   converge  movement of the centroids since the previous iteration.
 *
 * After a fault the runtime restarts the process warm; the loop runs again
 * from the top and rk_stage skips what had completed.  The arithmetic is
 * deterministic (fixed summation order, double accumulators), so a crashed
 * and resumed run ends with bit-identical centroids.
 *
 *   kmeans [--points N] [--dims D] [--k K] [--iters I] [--seed S] [--tol T]
 *          [--mode stages|scratch|checkpoint] [--checkpoint-every N]
 *          [--checkpoint-file F] [--crash-at ITER:STAGE[:FRACTION]]...
 *          [--reseed-after-crash S] [--corrupt-progress-after-crash] [--quiet]
 *
 * Modes: stages (warm restart, resume from the last completed stage),
 * scratch (every restart is cold: start again from iteration 0),
 * checkpoint (cold restarts; every N iterations the centroids are written
 * to a file, and a start resumes from it after regenerating the points).
 * STAGE is assign, update, converge, preserve (update's preserve hook) or
 * restore (its restore hook); FRACTION (default 0.5) is how far into the
 * stage the fault strikes (1 = after all its work, before the progress
 * record says so).  The nth --crash-at fires in incarnation n-1 only.
 * The last stdout line is JSON: {"kmeans":"result", ...}. */
#include "rekindle.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define STATE_MAGIC 0x314e41454d4b5200ull /* "\0RKMEAN1" */
#define CKPT_MAGIC 0x31544b504b4d4b00ull
#define MAX_CRASHES 8
#define MAX_K 1024

enum mode { MODE_STAGES, MODE_SCRATCH, MODE_CHECKPOINT };

struct params {
	uint64_t n, d, k, seed;
};

/* Everything that survives a warm restart, under the root "kmeans". */
struct km_state {
	uint64_t magic;
	struct params prm;
	uint64_t points_ready;    /* the points are all generated */
	uint64_t centroids_ready; /* the initial centroids are in place */
	float *points;            /* n * d */
	uint32_t *assign;         /* n */
	float *centroids;         /* k * d */
	double inertia, shift;
	uint64_t converged;
};

struct crash {
	uint64_t iter;
	char stage[16];
	double frac;
};

struct opts {
	struct params prm;
	uint64_t iters, ckpt_every, reseed;
	double tol;
	enum mode mode;
	const char *ckpt_file;
	struct crash crashes[MAX_CRASHES];
	unsigned ncrashes;
	bool reseed_set, corrupt, quiet;
};

/* What the stage functions need. */
struct job {
	struct km_state *st;
	rk_progress *prog;
	const struct opts *o;
	uint64_t iter;
	const struct crash *crash; /* the fault of this incarnation, or NULL */
	unsigned generation;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU time of the process, all incarnations: exec keeps the counters. */
static double cpu_s(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) < 0)
		return 0;
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static uint64_t mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
	const unsigned char *c = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ c[i]) * 0x100000001b3ull;
	return h;
}

static uint64_t params_hash(const struct params *prm)
{
	return fnv(prm, sizeof *prm, 0xcbf29ce484222325ull);
}

/* ---- fault injection ------------------------------------------------------ */

/* Faults here if this incarnation's crash is at (iteration, stage) and the
 * stage is `done` of `total` of the way through. */
static void maybe_crash(const struct job *j, const char *stage, uint64_t done, uint64_t total)
{
	const struct crash *c = j->crash;
	if (!c || c->iter != j->iter || strcmp(c->stage, stage) != 0)
		return;
	if ((double)done < c->frac * (double)total)
		return;
	printf("crash: iteration %" PRIu64 ", stage %s, %.0f%% done (NULL pointer write)\n", j->iter, stage,
	       total ? 100.0 * (double)done / (double)total : 100.0);
	fflush(stdout);
	volatile int *volatile bad = NULL;
	*bad = 1;
}

/* Points [lo, hi) of the stage are done: the fault may strike in between. */
#define CRASH_POINT(j, stage, done, total) maybe_crash((j), (stage), (done), (total))

/* ---- data -------------------------------------------------------------------- */

/* Point i: near one of k true centres (uniform in [0, 100)), with noise. */
static void generate_points(struct km_state *st)
{
	const struct params *p = &st->prm;
	float *centres = malloc(p->k * p->d * sizeof *centres);
	if (!centres) {
		perror("kmeans: malloc");
		exit(1);
	}
	for (uint64_t c = 0; c < p->k * p->d; c++)
		centres[c] = (float)(mix(p->seed * 0x9e3779b97f4a7c15ull + c) % 100000) / 1000.0f;
	for (uint64_t i = 0; i < p->n; i++) {
		uint64_t h = mix(p->seed ^ (i * 0xd1b54a32d192ed03ull));
		const float *ctr = centres + (h % p->k) * p->d;
		float *x = st->points + i * p->d;
		for (uint64_t j = 0; j < p->d; j++) {
			uint64_t r = mix(h + j);
			float noise = (float)((r & 0xffff) + ((r >> 16) & 0xffff)) / 65536.0f - 1.0f;
			x[j] = ctr[j] + 12.0f * noise;
		}
	}
	free(centres);
}

static void init_centroids(struct km_state *st)
{
	const struct params *p = &st->prm;
	for (uint64_t c = 0; c < p->k; c++)
		memcpy(st->centroids + c * p->d, st->points + (c * p->n / p->k) * p->d, p->d * sizeof(float));
	st->inertia = 0;
	st->shift = 0;
	st->converged = 0;
}

static uint64_t centroids_hash(const struct km_state *st)
{
	return fnv(st->centroids, st->prm.k * st->prm.d * sizeof(float), 0xcbf29ce484222325ull);
}

/* ---- the stages ----------------------------------------------------------------- */

/* assign: writes all of assign[] and inertia from points and centroids,
 * which it does not change, so running it again is always right. */
static int stage_assign(void *ctx)
{
	struct job *j = ctx;
	struct km_state *st = j->st;
	uint64_t n = st->prm.n, d = st->prm.d, k = st->prm.k;
	/* centroids transposed (d x k) so the inner loop runs over centroids:
	 * independent lanes the compiler can vectorise without reordering
	 * any sum */
	float *ct = malloc(d * k * sizeof *ct), *dist = malloc(k * sizeof *dist);
	if (!ct || !dist) {
		free(ct);
		free(dist);
		return -ENOMEM;
	}
	for (uint64_t c = 0; c < k; c++)
		for (uint64_t t = 0; t < d; t++)
			ct[t * k + c] = st->centroids[c * d + t];
	double inertia = 0;
	uint64_t step = n / 64 + 1;
	for (uint64_t i = 0; i < n; i++) {
		if (i % step == 0)
			CRASH_POINT(j, "assign", i, n);
		const float *x = st->points + i * d;
		for (uint64_t c = 0; c < k; c++)
			dist[c] = 0;
		for (uint64_t t = 0; t < d; t++) {
			float xt = x[t];
			const float *row = ct + t * k;
			for (uint64_t c = 0; c < k; c++) {
				float diff = xt - row[c];
				dist[c] += diff * diff;
			}
		}
		uint32_t best = 0;
		for (uint32_t c = 1; c < k; c++)
			if (dist[c] < dist[best])
				best = c;
		st->assign[i] = best;
		inertia += dist[best];
	}
	CRASH_POINT(j, "assign", n, n);
	st->inertia = inertia;
	free(ct);
	free(dist);
	return 0;
}

static float *saved_centroids(struct job *j)
{
	return rk_progress_buffer(j->prog, "centroids.prev", j->st->prm.k * j->st->prm.d * sizeof(float));
}

/* update's preserve hook: copy the centroids it is about to overwrite. */
static int preserve_centroids(void *ctx)
{
	struct job *j = ctx;
	uint64_t k = j->st->prm.k, d = j->st->prm.d;
	float *save = saved_centroids(j);
	if (!save)
		return -errno;
	for (uint64_t c = 0; c < k; c++) {
		CRASH_POINT(j, "preserve", c, k);
		memcpy(save + c * d, j->st->centroids + c * d, d * sizeof(float));
	}
	return 0;
}

/* update's restore hook: the saved copy back (idempotent). */
static int restore_centroids(void *ctx)
{
	struct job *j = ctx;
	uint64_t k = j->st->prm.k, d = j->st->prm.d;
	float *save = saved_centroids(j);
	if (!save)
		return -errno;
	printf("restore: centroids of iteration %" PRIu64 " put back\n", j->iter);
	for (uint64_t c = 0; c < k; c++) {
		CRASH_POINT(j, "restore", c, k);
		memcpy(j->st->centroids + c * d, save + c * d, d * sizeof(float));
	}
	return 0;
}

/* update: per-cluster means in double, summed in point order; written in
 * place, centroid by centroid.  An empty cluster keeps its centroid, so
 * the stage depends on the values it overwrites: after a fault halfway
 * the restore hook is what makes redoing it right. */
static int stage_update(void *ctx)
{
	struct job *j = ctx;
	struct km_state *st = j->st;
	uint64_t n = st->prm.n, d = st->prm.d, k = st->prm.k;
	double *sum = calloc(k * d, sizeof *sum);
	uint64_t *count = calloc(k, sizeof *count);
	if (!sum || !count) {
		free(sum);
		free(count);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < n; i++) {
		const float *x = st->points + i * d;
		double *s = sum + (uint64_t)st->assign[i] * d;
		for (uint64_t t = 0; t < d; t++)
			s[t] += x[t];
		count[st->assign[i]]++;
	}
	for (uint64_t c = 0; c < k; c++) {
		CRASH_POINT(j, "update", c, k);
		if (count[c] == 0)
			continue;
		for (uint64_t t = 0; t < d; t++)
			st->centroids[c * d + t] = (float)(sum[c * d + t] / (double)count[c]);
	}
	CRASH_POINT(j, "update", k, k);
	free(sum);
	free(count);
	return 0;
}

/* converge: how far the centroids moved (against the copy update saved). */
static int stage_converge(void *ctx)
{
	struct job *j = ctx;
	struct km_state *st = j->st;
	const float *prev = saved_centroids(j);
	if (!prev)
		return -errno;
	double shift = 0;
	for (uint64_t i = 0; i < st->prm.k * st->prm.d; i++) {
		double diff = (double)st->centroids[i] - (double)prev[i];
		shift += diff * diff;
	}
	CRASH_POINT(j, "converge", 1, 1);
	st->shift = shift;
	st->converged = j->o->tol >= 0 && shift <= j->o->tol;
	return 0;
}

/* ---- checkpoints (the comparison: --mode checkpoint) -------------------------------- */

struct ckpt_hdr {
	uint64_t magic;
	struct params prm;
	uint64_t iteration, converged;
	double inertia, shift;
	uint64_t checksum; /* of the centroids */
};

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

/* Written to F.tmp, fsynced, renamed over F: a crash leaves the old or the
 * new checkpoint. */
static int checkpoint_write(const struct opts *o, const struct km_state *st, uint64_t iteration)
{
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp", o->ckpt_file);
	size_t bytes = st->prm.k * st->prm.d * sizeof(float);
	struct ckpt_hdr h = {CKPT_MAGIC, st->prm, iteration, st->converged, st->inertia, st->shift,
			     fnv(st->centroids, bytes, 0xcbf29ce484222325ull)};
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	int r = write_all(fd, &h, sizeof h);
	if (r == 0)
		r = write_all(fd, st->centroids, bytes);
	if (r == 0 && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && rename(tmp, o->ckpt_file) < 0)
		r = -errno;
	return r;
}

/* Returns the iterations the checkpoint covers (its centroids loaded into
 * st), or 0 when there is none or it does not match these parameters. */
static uint64_t checkpoint_load(const struct opts *o, struct km_state *st)
{
	int fd = open(o->ckpt_file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	struct ckpt_hdr h;
	size_t bytes = st->prm.k * st->prm.d * sizeof(float);
	float *c = malloc(bytes);
	uint64_t it = 0;
	if (c && read(fd, &h, sizeof h) == (ssize_t)sizeof h && h.magic == CKPT_MAGIC &&
	    memcmp(&h.prm, &st->prm, sizeof h.prm) == 0 && read(fd, c, bytes) == (ssize_t)bytes &&
	    fnv(c, bytes, 0xcbf29ce484222325ull) == h.checksum) {
		memcpy(st->centroids, c, bytes);
		st->converged = h.converged;
		st->inertia = h.inertia;
		st->shift = h.shift;
		it = h.iteration;
	} else {
		printf("checkpoint %s unusable: ignored\n", o->ckpt_file);
	}
	free(c);
	close(fd);
	return it;
}

/* ---- options -------------------------------------------------------------------------- */

static _Noreturn void usage(void)
{
	fprintf(stderr, "usage: kmeans [--points N] [--dims D] [--k K] [--iters I] [--seed S] [--tol T]\n"
			"              [--mode stages|scratch|checkpoint] [--checkpoint-every N] [--checkpoint-file F]\n"
			"              [--crash-at ITER:STAGE[:FRACTION]]... [--reseed-after-crash S]\n"
			"              [--corrupt-progress-after-crash] [--quiet]\n");
	exit(2);
}

static bool parse_crash(const char *s, struct crash *c)
{
	char stage[16];
	c->frac = 0.5;
	int n = sscanf(s, "%" SCNu64 ":%15[a-z]:%lf", &c->iter, stage, &c->frac);
	if (n < 2 || c->frac < 0 || c->frac > 1)
		return false;
	static const char *const ok[] = {"assign", "update", "converge", "preserve", "restore"};
	for (unsigned i = 0; i < 5; i++)
		if (strcmp(stage, ok[i]) == 0) {
			strcpy(c->stage, stage);
			return true;
		}
	return false;
}

static void parse(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){.prm = {200000, 16, 16, 1}, .iters = 20, .tol = -1, .mode = MODE_STAGES};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		bool takes = true;
		if (!strcmp(a, "--points") && v)
			o->prm.n = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--dims") && v)
			o->prm.d = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--k") && v)
			o->prm.k = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--iters") && v)
			o->iters = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--seed") && v)
			o->prm.seed = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--tol") && v)
			o->tol = strtod(v, NULL);
		else if (!strcmp(a, "--checkpoint-every") && v)
			o->ckpt_every = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--checkpoint-file") && v)
			o->ckpt_file = v;
		else if (!strcmp(a, "--reseed-after-crash") && v)
			o->reseed = strtoull(v, NULL, 0), o->reseed_set = true;
		else if (!strcmp(a, "--mode") && v) {
			if (!strcmp(v, "stages"))
				o->mode = MODE_STAGES;
			else if (!strcmp(v, "scratch"))
				o->mode = MODE_SCRATCH;
			else if (!strcmp(v, "checkpoint"))
				o->mode = MODE_CHECKPOINT;
			else
				usage();
		} else if (!strcmp(a, "--crash-at") && v) {
			if (o->ncrashes == MAX_CRASHES || !parse_crash(v, &o->crashes[o->ncrashes++]))
				usage();
		} else {
			takes = false;
			if (!strcmp(a, "--corrupt-progress-after-crash"))
				o->corrupt = true;
			else if (!strcmp(a, "--quiet"))
				o->quiet = true;
			else
				usage();
		}
		i += takes;
	}
	if (!o->prm.n || !o->prm.d || !o->prm.k || o->prm.k > MAX_K || o->prm.k > o->prm.n)
		usage();
	if (o->mode == MODE_CHECKPOINT && (!o->ckpt_every || !o->ckpt_file))
		usage();
}

/* ---- set-up ----------------------------------------------------------------------------- */

static void die(const char *what, int err)
{
	fprintf(stderr, "kmeans: %s: %s\n", what, strerror(err));
	exit(1);
}

/* Arena state from the previous incarnation, if it is for these
 * parameters; marked for the sweep. */
static struct km_state *find_state(rk_arena *a, const struct params *prm)
{
	struct km_state *st = rk_root_get(a, "kmeans");
	if (!st || st->magic != STATE_MAGIC || memcmp(&st->prm, prm, sizeof *prm) != 0 || !st->points_ready)
		return NULL;
	rk_mark(a, st);
	rk_mark(a, st->points);
	rk_mark(a, st->assign);
	rk_mark(a, st->centroids);
	return st;
}

static struct km_state *build_state(rk_arena *a, const struct params *prm)
{
	struct km_state *st = rk_calloc(a, 1, sizeof *st);
	if (!st)
		die("arena", ENOMEM);
	st->prm = *prm;
	st->points = rk_alloc(a, prm->n * prm->d * sizeof(float));
	st->assign = rk_calloc(a, prm->n, sizeof(uint32_t));
	st->centroids = rk_calloc(a, prm->k * prm->d, sizeof(float));
	if (!st->points || !st->assign || !st->centroids)
		die("arena", ENOMEM);
	generate_points(st);
	st->magic = STATE_MAGIC;
	st->points_ready = 1; /* one store: a fault before it regenerates */
	int r = rk_root_set(a, "kmeans", st);
	if (r < 0)
		die("rk_root_set", -r);
	return st;
}

static const struct crash *this_crash(const struct opts *o, unsigned generation)
{
	return generation < o->ncrashes ? &o->crashes[generation] : NULL;
}

int main(int argc, char **argv)
{
	/* Before rk_init, so every incarnation inherits them: the job's start
	 * time, and no crash-loop window (the faults here are injected). */
	char t0s[32];
	snprintf(t0s, sizeof t0s, "%.6f", now_s());
	setenv("KMEANS_T0", t0s, 0);
	setenv("REKINDLE_CRASHLOOP_MS", "0", 0);
	struct opts o;
	parse(argc, argv, &o);
	int r = rk_init(argc, argv, NULL);
	if (r < 0)
		die("rk_init", -r);
	double t_start = now_s(), t0 = strtod(getenv("KMEANS_T0"), NULL);
	const struct rk_restart_info *info = rk_restart_info();
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (o.mode != MODE_STAGES)
		rk_set_warm_allowed(false); /* the baselines restart cold */
	if (info->generation > 0 && o.reseed_set)
		o.prm.seed = o.reseed; /* as if the configuration changed under the job */

	size_t arena_bytes = o.prm.n * (o.prm.d + 1) * 4 + o.prm.k * o.prm.d * 64 + (64u << 20);
	rk_arena *a = rk_arena_open("kmeans", arena_bytes);
	if (!a)
		die("rk_arena_open", errno);
	if (o.corrupt && info->generation > 0) {
		char *rec = rk_root_get(a, "rk.progress.kmeans");
		if (rec)
			rec[9] ^= 0x40; /* inside the record's header: its checksum fails */
	}
	rk_progress *prog = rk_progress_open(a, "kmeans", params_hash(&o.prm));
	if (!prog)
		die("rk_progress_open", errno);
	struct rk_progress_status ps;
	rk_progress_status(prog, &ps);
	struct km_state *st = rk_is_recovery() ? find_state(a, &o.prm) : NULL;
	r = rk_finish_recovery(true, NULL);
	if (r < 0)
		die("rk_finish_recovery", -r);
	printf("incarnation %u (%s%s%s): progress %s\n", info->generation,
	       info->kind == RK_START_FRESH ? "fresh" : info->kind == RK_START_WARM ? "warm" : "cold",
	       info->generation ? ", after " : "", info->generation ? info->reason : "", ps.reason);

	double t_setup = now_s();
	bool regenerated = st == NULL;
	if (!st)
		st = build_state(a, &o.prm);
	uint64_t first = 0;
	if (!ps.resumed || !st->centroids_ready) {
		/* Progress starts over, so the mutable state does too.  The points
		 * depend only on the parameters and are kept if they survived. */
		st->centroids_ready = 0;
		init_centroids(st);
		if (o.mode == MODE_CHECKPOINT && (first = checkpoint_load(&o, st)) > 0)
			printf("checkpoint: resuming after iteration %" PRIu64 "\n", first - 1);
		if ((r = rk_progress_reset(prog, first)) < 0)
			die("rk_progress_reset", -r);
		st->centroids_ready = 1;
	}
	double setup_s = now_s() - t_setup;
	printf("setup: %s %" PRIu64 " points x %" PRIu64 " dims (%.1f MiB) in %.2f s\n",
	       regenerated ? "generated" : "kept", o.prm.n, o.prm.d,
	       (double)(o.prm.n * o.prm.d * 4) / 1048576.0, setup_s);

	struct job j = {.st = st, .prog = prog, .o = &o, .crash = this_crash(&o, info->generation),
			.generation = info->generation};
	uint64_t it = 0;
	while ((r = rk_progress_begin_iteration(prog, &it)) == 0 && it < o.iters && !st->converged) {
		double ti = now_s();
		j.iter = it;
		static const char *const names[] = {"assign", "update", "converge"};
		rk_stage_fn runs[] = {stage_assign, stage_update, stage_converge};
		rk_stage_fn pres[] = {NULL, preserve_centroids, NULL};
		rk_stage_fn rests[] = {NULL, restore_centroids, NULL};
		for (unsigned s = 0; s < 3; s++) {
			r = rk_stage(prog, names[s], runs[s], pres[s], rests[s], &j);
			if (r < 0)
				die(names[s], -r);
			if (r == RK_STAGE_SKIPPED)
				printf("skip: iteration %" PRIu64 " stage %s completed before the restart\n", it,
				       names[s]);
		}
		if ((r = rk_progress_end_iteration(prog)) < 0)
			die("rk_progress_end_iteration", -r);
		if (!o.quiet)
			printf("iteration %" PRIu64 ": inertia %.6e shift %.3e (%.2f s)\n", it, st->inertia, st->shift,
			       now_s() - ti);
		if (o.mode == MODE_CHECKPOINT && (it + 1) % o.ckpt_every == 0) {
			double tc = now_s();
			if ((r = checkpoint_write(&o, st, it + 1)) < 0)
				die("checkpoint", -r);
			printf("checkpoint: iteration %" PRIu64 " written in %.3f s\n", it, now_s() - tc);
		}
	}
	if (r < 0 && r != -EALREADY)
		die("rk_progress_begin_iteration", -r);
	rk_progress_done(prog);
	rk_progress_status(prog, &ps);
	if (o.mode == MODE_CHECKPOINT)
		unlink(o.ckpt_file); /* the job is complete */
	double t_end = now_s();
	printf("{\"kmeans\":\"result\",\"mode\":\"%s\",\"points\":%" PRIu64 ",\"dims\":%" PRIu64 ",\"k\":%" PRIu64
	       ",\"seed\":%" PRIu64 ",\"iterations\":%" PRIu64 ",\"inertia\":%.17g,\"hash\":\"%016" PRIx64
	       "\",\"total_s\":%.3f,\"cpu_s\":%.3f,\"incarnation_s\":%.3f,\"setup_s\":%.3f,\"restarts\":%u,\"resumed\":%s"
	       ",\"stages_run\":%" PRIu64 ",\"stages_skipped\":%" PRIu64 ",\"restores\":%" PRIu64 "}\n",
	       o.mode == MODE_STAGES ? "stages" : o.mode == MODE_SCRATCH ? "scratch" : "checkpoint", o.prm.n,
	       o.prm.d, o.prm.k, o.prm.seed, it, st->inertia, centroids_hash(st), t_end - t0, cpu_s(), t_end - t_start,
	       setup_s, info->generation, ps.resumed ? "true" : "false", ps.stages_run, ps.stages_skipped,
	       ps.restores);
	rk_progress_close(prog);
	return 0;
}
