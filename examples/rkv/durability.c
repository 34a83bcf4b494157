/* durability.c - `--durability none|async|sync`: rkv's keyspace made durable
 * by Rekindle's snapshots (`rekindle run --snapshot-dir`), not by rkv's own
 * snapshot file.
 *
 *   none   rkv's own persistence (snapshot.c): SAVE, BGSAVE and the save
 *          points write rkv.snap.  Rekindle's snapshots, if any, run beside.
 *   async  SAVE, BGSAVE, SHUTDOWN SAVE and SIGTERM are Rekindle checkpoints
 *          (SAVE's reply waits until it is durable); replies go out at once,
 *          so a machine that dies loses at most the writes since the last
 *          snapshot (the supervisor's --snapshot-interval).  No rkv.snap.
 *   sync   as async, and every reply waits until the state it may depend on
 *          is durable (external consistency): a reply produced while a write
 *          is not yet in a durable snapshot is held until it is.  Replies
 *          held in one loop iteration share one checkpoint (group commit).
 *
 * How a reply is held: a connection that holds keeps its reply bytes from
 * held_from on (everything after the first held reply, so replies stay in
 * order) until rk_durable_epoch() reaches hold_epoch; the event loop polls
 * rk_durable_fd() and releases them (conn_release in main.c).
 *
 * What a reply depends on, under sync: a write's reply on that write's
 * epoch; a command that names its keys and writes nothing (GET, EXISTS, a
 * SET NX that found the key) on the newest pending write of those keys
 * only, so a read of a key nobody is writing is not held behind other
 * keys' writes (after a failover, reads are answered while the new term's
 * first snapshot is still being taken).  Pending writes are noted by key
 * hash in a small table; a hash collision only holds a reply that did not
 * need it.  PING, HELLO, CLIENT and the like depend on nothing.  A command
 * of no key that reads data (KEYS, DBSIZE, FLUSHALL, INFO, ...), a full
 * table, and the state a warm restart inherited (not durable until the
 * first snapshot of this incarnation) hold every reply, as without the
 * table. */
#include "rkv.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct conn *held_head;    /* connections holding replies */

#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* Group commit's gather: the clients a snapshot released answer a moment
 * later, while the engine would already be taking the next snapshot for
 * whoever was left waiting, so under load the clients split into two
 * groups that take turns and each reply waits for two snapshots.  Asking
 * for the next checkpoint once the connections just released have sent
 * their next command (or GATHER_MAX_NS passed), and never while one is
 * being taken, puts them in one group, as Redis's appendfsync always does
 * by blocking its loop in the fsync. */
#define GATHER_MAX_NS 500000ll
static uint64_t gather_round = 1; /* connections tagged with it are awaited */
static unsigned gather_left;      /* how many of them */
static int64_t gather_until_ns;
#define REASK_NS 100000000ll
static int64_t requested_ns; /* when the last checkpoint was asked for */
static bool gather_deferred; /* the last tick waited for the gather */
static uint64_t write_epoch;      /* epoch of the newest write (glue_epoch after it) */
static uint64_t requested_epoch;  /* glue_epoch() when a checkpoint was last asked for */
static uint64_t checkpoint_errors;

/* Keys written since the durable epoch: open addressing on the key's hash,
 * epoch 0 marks a free slot.  Cleared once everything in it is durable;
 * compacted when half full, or, if that frees too little, folded into
 * all_epoch (every reply waits for it) and emptied. */
#define PENDING_SLOTS 4096u
#define PENDING_MAX (PENDING_SLOTS / 2)
struct pending_key {
	uint64_t hash;
	uint64_t epoch;
	uint64_t redo; /* --sync-via redo: the position of its newest logged write */
};
static struct pending_key pending[PENDING_SLOTS];
static unsigned pending_n;
static uint64_t pending_newest; /* the newest epoch in the table */
static uint64_t pending_newest_redo;
static uint64_t all_epoch;      /* every reply depends on this epoch */
static uint64_t all_redo;       /* ... and on this redo position */
static uint64_t write_redo;     /* the position of the newest logged write */
bool durability_replaying;      /* durability_replay is running commands again */

const char *durability_name(enum durability d)
{
	return d == DUR_SYNC ? "sync" : d == DUR_ASYNC ? "async" : "none";
}

void durability_init(void)
{
	if (srv.cfg.durability == DUR_NONE)
		return;
	int fd = glue_durable_fd();
	if (fd < 0) {
		rkv_log("error", "\"what\":\"durability\",\"code\":\"no_snapshots\",\"durability\":\"%s\"",
			durability_name(srv.cfg.durability));
		fprintf(stderr,
			"rkv: --durability %s needs Rekindle's snapshots: run rkv under `rekindle run --snapshot-dir "
			"DIR ...` (no snapshot agent in this process)\n",
			durability_name(srv.cfg.durability));
		exit(1);
	}
	/* a warm restart keeps what the last incarnation wrote, which may not
	 * be in a durable snapshot yet (its replies were held, then lost): a
	 * reply may depend on any of it until this incarnation's first */
	if (glue_inherited_undurable_state()) {
		all_epoch = glue_epoch();
		/* and through the redo log if it is still open: its records hold
		 * some of the last incarnation's writes, a snapshot (asked for at
		 * the first reply held) the rest */
		if (srv.cfg.durability == DUR_SYNC && srv.cfg.sync_redo && glue_redo_open())
			all_redo = glue_redo_position();
	}
	if (srv.cfg.sync_redo && srv.cfg.durability == DUR_SYNC && glue_redo_fd() < 0) {
		rkv_log("error", "\"what\":\"durability\",\"code\":\"no_redo_log\"");
		fprintf(stderr, "rkv: --sync-via redo needs Rekindle's redo log: run rkv under `rekindle run "
				"--snapshot-dir DIR` without --cluster\n");
		exit(1);
	}
	rkv_log("durability",
		"\"mode\":\"%s\",\"epoch\":%llu,\"durable_epoch\":%llu,\"what\":\"SAVE, BGSAVE and shutdown are Rekindle "
		"checkpoints; rkv.snap is not written%s\"",
		durability_name(srv.cfg.durability), (unsigned long long)glue_epoch(),
		(unsigned long long)glue_durable_epoch(),
		srv.cfg.durability == DUR_SYNC ? "; replies wait until their state is durable" : "");
}

int durability_fd(void) { return srv.cfg.durability == DUR_NONE ? -1 : glue_durable_fd(); }

static void held_link(struct conn *c)
{
	c->hprev = NULL;
	c->hnext = held_head;
	if (held_head)
		held_head->hprev = c;
	held_head = c;
}

static void held_unlink(struct conn *c)
{
	if (c->hprev)
		c->hprev->hnext = c->hnext;
	else
		held_head = c->hnext;
	if (c->hnext)
		c->hnext->hprev = c->hprev;
	c->hprev = c->hnext = NULL;
}

static void hold(struct conn *c, uint64_t epoch, uint64_t redo, size_t reply_start)
{
	if (epoch <= glue_durable_epoch())
		epoch = 0;
	if (redo <= glue_redo_durable())
		redo = 0;
	if (!epoch && !redo)
		return;
	if (!c->hold_epoch && !c->hold_redo) {
		c->held_from = reply_start;
		held_link(c);
	}
	c->hold_epoch = MAX(c->hold_epoch, epoch);
	c->hold_redo = MAX(c->hold_redo, redo);
}

void durability_hold(struct conn *c, uint64_t epoch, size_t reply_start) { hold(c, epoch, 0, reply_start); }

static uint64_t key_hash(struct arg k) { return ks_hash(srv.db, k.p, k.n); }

static struct pending_key *pending_slot(uint64_t h)
{
	for (uint64_t i = h;; i++) {
		struct pending_key *p = &pending[i & (PENDING_SLOTS - 1)];
		if (!p->epoch || p->hash == h)
			return p; /* never full: at most PENDING_MAX are used */
	}
}

static void pending_clear(void)
{
	memset(pending, 0, sizeof pending);
	pending_n = 0;
	pending_newest = 0;
	pending_newest_redo = 0;
}

/* Keeps the entries not yet durable (rehashed into a fresh table). */
static void pending_compact(void)
{
	static struct pending_key keep[PENDING_MAX];
	uint64_t d = glue_durable_epoch(), dr = glue_redo_durable();
	unsigned n = 0;
	for (unsigned i = 0; i < PENDING_SLOTS; i++)
		if (pending[i].epoch > d || pending[i].redo > dr)
			keep[n++] = pending[i];
	uint64_t newest = pending_newest, newest_redo = pending_newest_redo;
	pending_clear();
	for (unsigned i = 0; i < n; i++)
		*pending_slot(keep[i].hash) = keep[i];
	pending_n = n;
	pending_newest = n ? newest : 0;
	pending_newest_redo = n ? newest_redo : 0;
}

/* The table is full.  Compaction pays only if it frees a good share: under
 * a steady load of writes to distinct keys the table never empties (the
 * next commit's writes are pending while the last one syncs), and compacting
 * at every write cost a third of rkv's CPU.  Otherwise every entry folds
 * into all_epoch (every reply waits for the newest of them, as a full table
 * always meant) and the table starts empty: one pass per PENDING_MAX/2
 * writes at least. */
static void pending_make_room(void)
{
	pending_compact();
	if (pending_n <= PENDING_MAX / 2)
		return;
	all_epoch = pending_newest > all_epoch ? pending_newest : all_epoch;
	all_redo = pending_newest_redo > all_redo ? pending_newest_redo : all_redo;
	pending_clear();
}

static void pending_note(uint64_t h, uint64_t epoch, uint64_t redo)
{
	if (pending_n >= PENDING_MAX)
		pending_make_room();
	struct pending_key *p = pending_slot(h);
	if (!p->epoch) {
		p->hash = h;
		pending_n++;
	}
	p->epoch = epoch > p->epoch ? epoch : p->epoch;
	p->redo = redo > p->redo ? redo : p->redo;
	pending_newest = epoch > pending_newest ? epoch : pending_newest;
	pending_newest_redo = redo > pending_newest_redo ? redo : pending_newest_redo;
}

/* A write ran, durable once epoch e is (0: not needed) and redo position
 * rd is (0: not logged): the keys it names are pending until then (a
 * command of no key: everything is). */
static void note_write(const struct conn *c, const struct command *cmd, uint64_t e, uint64_t rd)
{
	struct key_range r;
	if (!command_keys(cmd, (int)c->argc, &r)) {
		all_epoch = e > all_epoch ? e : all_epoch;
		all_redo = rd > all_redo ? rd : all_redo;
		return;
	}
	for (int i = r.first; i <= r.last; i += r.step)
		pending_note(key_hash(c->argv[i]), e ? e : 1, rd);
}

/* What a command that wrote nothing may have read: the newest epoch and
 * redo position of the writes it may depend on. */
static void read_depends_on(const struct conn *c, const struct command *cmd, uint64_t *e, uint64_t *rd)
{
	struct key_range r;
	*e = *rd = 0;
	if (command_reads_no_data(cmd))
		return; /* PING, HELLO, CLIENT SETINFO (every redis-py connection's first) */
	if (!command_keys(cmd, (int)c->argc, &r)) {
		*e = MAX(write_epoch, all_epoch);
		*rd = MAX(write_redo, all_redo);
		return;
	}
	*e = all_epoch;
	*rd = all_redo;
	for (int i = r.first; i <= r.last; i += r.step) {
		struct pending_key *p = pending_slot(key_hash(c->argv[i]));
		*e = MAX(*e, p->epoch);
		*rd = MAX(*rd, p->redo);
	}
}

void durability_after_command(struct conn *c, const struct command *cmd, uint64_t dirty_before,
			      size_t reply_start)
{
	if (srv.cfg.durability == DUR_NONE)
		return;
	if (c->gather_round == gather_round) {
		c->gather_round = 0;
		gather_left--;
	}
	if (durability_replaying)
		return; /* the replayed writes are durable already: they came from the log */
	bool wrote = srv.db->dirty != dirty_before;
	if (wrote && !c->redo_at)
		write_epoch = glue_epoch(); /* read after the write's unsafe region */
	if (srv.cfg.durability != DUR_SYNC)
		return;
	uint64_t need, need_redo;
	if (wrote && c->redo_at) {
		/* logged: durable with its record, no snapshot needed */
		write_redo = c->redo_at;
		note_write(c, cmd, 0, c->redo_at);
		need = 0;
		need_redo = c->redo_at;
	} else if (wrote) {
		note_write(c, cmd, write_epoch, 0);
		need = write_epoch;
		need_redo = 0;
	} else {
		read_depends_on(c, cmd, &need, &need_redo);
	}
	if (c->hold_epoch || c->hold_redo || need > glue_durable_epoch() || need_redo > glue_redo_durable())
		hold(c, need, need_redo, reply_start);
}

void durability_forget(struct conn *c)
{
	if (c->gather_round == gather_round) {
		c->gather_round = 0;
		gather_left--;
	}
	if (c->hold_epoch || c->hold_redo)
		held_unlink(c);
	c->hold_epoch = 0;
	c->hold_redo = 0;
}

uint64_t durability_checkpoint(void)
{
	uint64_t e = glue_epoch();
	int r = glue_checkpoint();
	if (r < 0) {
		if (checkpoint_errors++ == 0)
			rkv_log("error", "\"what\":\"checkpoint\",\"error\":%s", js(strerror(-r)));
		return 0;
	}
	requested_epoch = e;
	gather_round++; /* whoever is still awaited is not, any more */
	gather_left = 0;
	return e;
}

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000ll + t.tv_nsec;
}

void durability_tick(void)
{
	gather_deferred = false;
	if (srv.cfg.durability == DUR_NONE)
		return;
	uint64_t need = 0, need_redo = 0;
	for (struct conn *c = held_head; c; c = c->hnext) {
		need = MAX(need, c->hold_epoch);
		need_redo = MAX(need_redo, c->hold_redo);
	}
	if (need_redo > glue_redo_durable())
		(void)glue_redo_flush(); /* one flush for every record committed by now */
	if (need <= requested_epoch)
		return;
	int64_t now = now_ns();
	/* one checkpoint at a time: what comes in meanwhile waits for the next
	 * (asked again after REASK_NS, should the engine have dropped it) */
	if (requested_epoch > glue_durable_epoch() && now - requested_ns < REASK_NS)
		return;
	gather_deferred = gather_left && now < gather_until_ns;
	if (gather_deferred)
		return; /* durability_wait_ns() wakes the loop in time */
	(void)durability_checkpoint();
	requested_ns = now;
}

int64_t durability_wait_ns(void)
{
	if (!gather_deferred)
		return -1;
	int64_t left = gather_until_ns - now_ns();
	return left > 0 ? left : 0;
}

void durability_advanced(void)
{
	uint64_t n;
	int fd = glue_durable_fd();
	if (fd >= 0 && read(fd, &n, sizeof n) < 0 && errno != EAGAIN)
		rkv_log("error", "\"what\":\"read the durable fd\",\"error\":%s", js(strerror(errno)));
	int rfd = glue_redo_fd();
	if (rfd >= 0 && read(rfd, &n, sizeof n) < 0 && errno != EAGAIN)
		rkv_log("error", "\"what\":\"read the redo fd\",\"error\":%s", js(strerror(errno)));
	uint64_t d = glue_durable_epoch(), dr = glue_redo_durable();
	if (pending_n && d >= pending_newest && dr >= pending_newest_redo)
		pending_clear();
	if (d >= write_epoch && dr >= write_redo && srv.db->dirty) {
		srv.db->dirty = 0; /* LASTSAVE and INFO: everything written is on disk */
		srv.db->last_save_s = srv.now_ms / 1000;
	}
	gather_until_ns = now_ns() + GATHER_MAX_NS;
	for (struct conn *c = held_head, *next; c; c = next) {
		next = c->hnext;
		if (c->hold_epoch > d || c->hold_redo > dr)
			continue;
		held_unlink(c);
		c->hold_epoch = 0;
		c->hold_redo = 0;
		if (srv.cfg.durability == DUR_SYNC && c->gather_round != gather_round) {
			c->gather_round = gather_round;
			gather_left++;
		}
		conn_release(c); /* may free c */
	}
}

bool durability_wait(uint64_t epoch, int timeout_ms)
{
	double until = mono_ms() + timeout_ms;
	int fd = glue_durable_fd();
	while (glue_durable_epoch() < epoch) {
		int left = (int)(until - mono_ms());
		if (left <= 0 || fd < 0)
			return false;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, left) < 0 && errno != EINTR)
			return false;
		uint64_t n;
		if (read(fd, &n, sizeof n) < 0 && errno != EAGAIN)
			return false;
	}
	return true;
}

uint64_t durability_held(void)
{
	uint64_t n = 0;
	for (struct conn *c = held_head; c; c = c->hnext)
		n++;
	return n;
}

uint64_t durability_write_epoch(void) { return write_epoch; }

/* ---- --sync-via redo ---------------------------------------------------
 * A write command's record: the clock it ran at (so a replay computes the
 * same expiry times and expires the same keys), then its arguments, each a
 * u32 length and its bytes.  Replayed in order onto the snapshot the
 * restore started from, the commands make the same changes again. */
static unsigned char *rec_buf;
static size_t rec_cap;
static uint64_t redo_errors;

bool durability_logging(void)
{
	return srv.cfg.durability == DUR_SYNC && srv.cfg.sync_redo && !durability_replaying;
}

int durability_redo_fd(void) { return srv.cfg.durability == DUR_SYNC && srv.cfg.sync_redo ? glue_redo_fd() : -1; }

static bool rec_reserve(size_t n)
{
	if (n <= rec_cap)
		return true;
	size_t cap = rec_cap ? rec_cap : 4096;
	while (cap < n)
		cap *= 2;
	unsigned char *p = realloc(rec_buf, cap);
	if (!p)
		return false;
	rec_buf = p;
	rec_cap = cap;
	return true;
}

uint64_t durability_log_command(const struct conn *c)
{
	size_t n = 8 + 4;
	for (size_t i = 0; i < c->argc; i++)
		n += 4 + c->argv[i].n;
	int64_t at = -ENOMEM;
	if (rec_reserve(n)) {
		unsigned char *p = rec_buf;
		int64_t now = srv.now_ms;
		uint32_t argc = (uint32_t)c->argc;
		memcpy(p, &now, 8);
		memcpy(p + 8, &argc, 4);
		p += 12;
		for (size_t i = 0; i < c->argc; i++) {
			uint32_t len = (uint32_t)c->argv[i].n;
			memcpy(p, &len, 4);
			memcpy(p + 4, c->argv[i].p, len);
			p += 4 + len;
		}
		at = glue_redo_append(rec_buf, n);
	}
	if (at > 0)
		return (uint64_t)at;
	if (at == -EAGAIN)
		return 0; /* closed until the next snapshot: that path keeps it durable */
	/* too large, or the log failing: close it, so that no later record is
	 * replayed without this change; the snapshot path keeps it durable */
	(void)glue_redo_gap();
	if (at != -EMSGSIZE && redo_errors++ == 0)
		rkv_log("error", "\"what\":\"redo append\",\"error\":%s", js(strerror((int)-at)));
	return 0;
}

static int replay_one(const void *rec, size_t len, void *ctx)
{
	struct conn *c = ctx;
	const unsigned char *p = rec, *end = p + len;
	uint32_t argc;
	int64_t now;
	if (len < 12)
		return -EPROTO;
	memcpy(&now, p, 8);
	memcpy(&argc, p + 8, 4);
	p += 12;
	if (argc == 0 || argc > (len - 12) / 4)
		return -EPROTO;
	if (argc > c->argcap) {
		struct arg *a = realloc(c->argv, argc * sizeof *a);
		if (!a)
			return -ENOMEM;
		c->argv = a;
		c->argcap = argc;
	}
	for (uint32_t i = 0; i < argc; i++) {
		uint32_t n;
		if (end - p < 4)
			return -EPROTO;
		memcpy(&n, p, 4);
		p += 4;
		if ((size_t)(end - p) < n)
			return -EPROTO;
		c->argv[i] = (struct arg){.p = (const char *)p, .n = n};
		p += n;
	}
	c->argc = argc;
	srv.now_ms = now;
	uint64_t dirty = srv.db->dirty;
	const struct command *cmd = command_exec(c);
	durability_after_command(c, cmd, dirty, 0);
	c->olen = c->opos = 0; /* nobody waits for these replies */
	return 0;
}

void durability_replay(void)
{
	struct conn c = {.fd = -1, .proto = 2};
	durability_replaying = true;
	double t0 = mono_ms();
	int64_t n = glue_redo_replay(replay_one, &c);
	durability_replaying = false;
	srv.now_ms = now_realtime_ms();
	free(c.argv);
	free(c.obuf);
	if (n < 0) {
		rkv_log("error", "\"what\":\"redo replay\",\"error\":%s", js(strerror((int)-n)));
		exit(1); /* the supervisor starts from the snapshot again */
	}
	if (n > 0)
		rkv_log("redo_replay", "\"records\":%lld,\"keys\":%llu,\"ms\":%.3f", (long long)n,
			(unsigned long long)srv.db->count, mono_ms() - t0);
}
