/* rkv.h - shared declarations of rkv, a Redis-protocol (RESP2) in-memory
 * key-value cache whose keyspace lives in a Rekindle arena.
 *
 * One file, one job:
 *   main.c          options, listening sockets, epoll loop, connections, cron
 *   resp.c          RESP2/inline request parser and reply writer
 *   keyspace.c      hash table, entries, expiry (the preserved state)
 *   commands.c      command table and the commands
 *   snapshot.c      snapshot file: write (SAVE/BGSAVE), verify, load
 *   durability.c    --durability: Rekindle checkpoints, replies held until durable
 *   rekindle_glue.c every Rekindle call except the unsafe-region macros
 *   store.h         where the keyspace's memory comes from (arena or malloc)
 */
#ifndef RKV_H
#define RKV_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define RKV_VERSION "0.1.0"
#define RKV_MAX_BULK (512ll << 20) /* proto-max-bulk-len of Redis */

/* ---- keyspace (lives in the arena: no pointers to malloc memory) -------- */

/* Key and value share one allocation: one alloc per new key, and an
 * overwrite that fits is a memcpy in place. */
struct entry {
	struct entry *next;             /* bucket chain */
	struct entry *xprev, *xnext;    /* list of entries with a TTL */
	uint64_t hash;
	int64_t expire_ms;              /* absolute CLOCK_REALTIME ms; 0 = none */
	uint32_t klen, vlen, cap;       /* cap: bytes available in data[] */
	char data[];                    /* key, then value */
};

static inline const char *entry_val(const struct entry *e) { return e->data + e->klen; }

struct db_stats {
	/* were the request counters, now srv.st; kept so that the layout of
	 * stored dbs (arenas, snapshots) stays */
	uint64_t unused[4];
	uint64_t expired;               /* keys expired: changes with the keyspace */
};

#define RKV_DB_MAGIC 0x726b762d64623031ull /* "rkv-db01" */

/* The root object "db": everything rkv keeps across a warm restart. */
struct db {
	uint64_t magic;
	uint64_t seed;                  /* hash seed: stored hashes must stay valid */
	struct entry **buckets;
	uint64_t mask;                  /* nbuckets - 1 (power of two) */
	uint64_t count, expires;
	uint64_t mem;                   /* bytes of entries and buckets */
	struct entry *xhead;            /* entries with a TTL */
	struct entry *xcursor;          /* active expiry resumes here */
	uint64_t dirty;                 /* changes since the last save */
	int64_t last_save_s;
	int64_t bgsave_pid;             /* child still running, 0 if none */
	uint64_t bgsave_dirty;          /* dirty when that child was forked */
	int64_t bgsave_try_s;           /* last attempt, for the retry delay */
	int bgsave_ok;                  /* last background save succeeded */
	struct db_stats st;             /* counter: plain stores, no region needed */
};

struct db *ks_create(void);
uint64_t ks_hash(const struct db *db, const char *k, size_t n);
/* Entry for key or NULL; an expired entry is deleted on the way (lazy expiry). */
struct entry *ks_lookup(struct db *db, const char *k, size_t kn, int64_t now);
/* Sets key to value; expire_ms: -1 keeps the old TTL, 0 none, >0 absolute.
 * Returns the entry or NULL (errno ENOMEM). */
struct entry *ks_set(struct db *db, const char *k, size_t kn, const char *v, size_t vn, int64_t expire_ms);
/* Replaces e's value by the concatenation v1+v2 (APPEND, INCR); may move e. */
struct entry *ks_set_value(struct db *db, struct entry *e, const char *v1, size_t n1, const char *v2, size_t n2);
bool ks_del(struct db *db, const char *k, size_t kn);
/* One command's changes of several keys (DEL, MSET) as one unsafe region,
 * from its first change to its last (PHOENIX's rule for a transaction): a
 * failure between two of them restarts cold instead of keeping half the
 * command.  Nests with the regions of the calls above. */
void ks_txn_begin(struct db *db);
void ks_txn_end(struct db *db);
void ks_set_expire(struct db *db, struct entry *e, int64_t expire_ms);
void ks_flush(struct db *db);
/* One active-expiry cycle: samples keys with a TTL like Redis. */
void ks_active_expire(struct db *db, int64_t now, int64_t budget_us);
/* Calls fn on each live entry of the buckets reached from cursor, Redis
 * style (reverse-binary cursor: full iteration survives resizes); returns
 * the next cursor, 0 at the end. */
uint64_t ks_scan(struct db *db, uint64_t cursor, uint64_t count, int64_t now, void (*fn)(struct entry *, void *),
		 void *arg);
/* Redis's glob patterns.  A pattern matched against many keys is looked
 * at once (ks_glob_init), then matched against each (ks_glob_match). */
struct glob {
	const char *p;
	size_t pn;
	size_t last_star;               /* just past the last star; SIZE_MAX: none */
	size_t tail_tokens;             /* chars the pattern takes after it */
};
void ks_glob_init(struct glob *g, const char *p, size_t pn);
bool ks_glob_match(const struct glob *g, const char *s, size_t sn);
bool ks_glob(const char *pat, size_t pn, const char *s, size_t sn);
/* For the mark traversal, KEYS and the snapshot: every entry, expired or
 * not.  After a warm restart it finishes the check of the table first
 * (glue_verify_all): a chain of the last incarnation may be a cycle. */
#define KS_FOREACH(db, e)                                                      \
	for (uint64_t b_ = (glue_verify_all(db), 0); b_ <= (db)->mask; b_++)    \
		for (struct entry *e = (db)->buckets[b_]; e; e = e->next)
/* Test hook: a SET that faults half-way, inside its unsafe region. */
void ks_crash_in_mutation(struct db *db, const char *k, size_t kn);

/* ---- connections, replies ---------------------------------------------- */

struct arg {
	const char *p;
	size_t n;
};

struct conn {
	int fd;
	uint64_t id;
	char *ibuf;                     /* request bytes, [ipos, ilen) unparsed */
	size_t ilen, icap, ipos;
	char *obuf;                     /* reply bytes, [opos, olen) unsent */
	size_t olen, ocap, opos;
	/* parser state of a multibulk request in progress */
	long mb_left;                   /* bulks still to read, 0 = none pending */
	size_t req_start;               /* where that request began in ibuf */
	long bulk_len;                  /* -1: expecting a $ line */
	size_t argc, argcap;
	size_t *argoff, *arglen;        /* offsets into ibuf (it may move) */
	struct arg *argv;
	bool close_after_reply, closing, reading;
	int proto;                      /* 2, or 3 after HELLO 3 */
	char *name;
	int64_t last_read_ms;           /* for the idle rule of the input buffer */
	size_t ipeak;                   /* most of ibuf in use since cron last looked */
	struct conn *prev, *next;       /* every connection, for cron */
	/* --durability (durability.c): obuf from held_from on waits until
	 * rk_durable_epoch() >= hold_epoch; 0: nothing held */
	uint64_t hold_epoch;
	/* --sync-via redo: ... or until rk_redo_durable() >= hold_redo */
	uint64_t hold_redo;
	/* the redo position of the command just run, 0 if it was not logged */
	uint64_t redo_at;
	size_t held_from;
	struct conn *hprev, *hnext;     /* connections holding replies */
	uint64_t gather_round;          /* released in this gather round, not heard from since */
};

/* What a connection may send now: its replies up to the first held one. */
static inline size_t conn_sendable_end(const struct conn *c)
{
	return c->hold_epoch || c->hold_redo ? c->held_from : c->olen;
}

/* resp.c */
enum { PARSE_NEED_MORE = 0, PARSE_COMMAND = 1, PARSE_ERROR = -1 };
/* Parses the next request from c->ibuf; on PARSE_COMMAND, c->argv/argc hold
 * it; on PARSE_ERROR, the error reply is already queued. */
int resp_parse(struct conn *c);
void resp_done(struct conn *c); /* the command was executed: forget its args */
void reply_raw(struct conn *c, const char *p, size_t n);
void reply_status(struct conn *c, const char *s);
void reply_error(struct conn *c, const char *s);
void reply_errorf(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void reply_int(struct conn *c, long long v);
void reply_bulk(struct conn *c, const char *p, size_t n);
void reply_nil(struct conn *c);
void reply_array(struct conn *c, long long n);
void reply_map(struct conn *c, long long pairs); /* RESP3 map, or a flat RESP2 array */
#define reply_ok(c) reply_raw(c, "+OK\r\n", 5)
bool out_reserve(struct conn *c, size_t n);

/* ---- configuration and server-wide state (main.c) --------------------- */

/* Why parse_bytes refused a size (main.c; CONFIG SET maxmemory too). */
enum { BYTES_NOT_A_NUMBER = -1, BYTES_UNKNOWN_UNIT = -2, BYTES_TOO_LARGE = -3 };
int parse_bytes(const char *s, uint64_t *out);

struct save_point {
	long seconds, changes;
};

enum durability { DUR_NONE, DUR_ASYNC, DUR_SYNC };

struct config {
	int port;
	char bind[64];
	char dir[4096];
	char dbfilename[256];
	struct save_point save[8];
	int nsave;
	uint64_t maxmemory;
	int enable_debug;               /* 0 no, 1 yes, 2 local (loopback clients) */
	uint64_t arena_size;
	bool recovery_sweep;            /* mark and sweep before serving after a warm restart */
	bool hugepages;                 /* collapse the keyspace arena into huge pages */
	unsigned recovery_check_cpu;    /* percent of a busy CPU for the warm start's check */
	bool prefault;                  /* warm start: fault the keyspace in from a thread */
	unsigned maxclients;            /* lowered at start to fit the open file limit */
	enum durability durability;
	bool sync_redo;                 /* --sync-via redo: sync writes through the redo log */
};

/* Request counters of this incarnation (INFO stats), as Redis counts from
 * its start: on the heap, not in the arena, so that a read-only load writes
 * no page a snapshot must copy (an interval snapshot then finds nothing
 * changed and is not taken). */
struct req_stats {
	uint64_t commands, connections, hits, misses;
};

struct server {
	struct config cfg;
	struct db *db;
	struct req_stats st;
	int64_t now_ms;                 /* CLOCK_REALTIME, cached per loop iteration */
	int64_t start_ms;
	const char *start_kind;         /* fresh, warm, cold */
	unsigned generation;
	uint64_t clients;
	uint64_t rejected_connections;  /* over maxclients (this incarnation) */
	int listen_fd;
	bool listen_inherited;
	bool loading;
	bool stopping;                  /* SIGTERM: saving, then exit */
	char exe[4096];
};
extern struct server srv;

int64_t now_realtime_ms(void);
/* One JSON line on stderr: {"rkv":"<event>",<fields>}. */
void rkv_log(const char *event, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Quotes s as a JSON string into a rotating static buffer. */
const char *js(const char *s);

/* commands.c */
struct command;
void commands_init(void);
/* Runs the request in c->argv; the command run, or NULL (unknown, wrong
 * arity, refused: nothing read or written). */
const struct command *command_exec(struct conn *c);
/* A command's keys in argv: argv[first], argv[first + step], ... up to
 * argv[last]. */
struct key_range {
	int first, last, step;
};
/* PING, HELLO, CLIENT, CONFIG, ...: its reply depends on no key. */
bool command_reads_no_data(const struct command *cmd);
/* false: the command names no key (it may read or write anything). */
bool command_keys(const struct command *cmd, int argc, struct key_range *r);

/* snapshot.c */
int snapshot_save(struct db *db);     /* foreground; 0 or -errno */
int snapshot_bgsave(struct db *db);   /* forks; 0 or -errno */
void snapshot_reap(struct db *db);    /* collects a finished child */
/* How snapshot_load ended.  The first two are the file's content: it can
 * never load, and is moved aside.  The last two are the moment's: the
 * file may be fine, and rkv refuses to start rather than replace it. */
enum {
	SNAP_OK = 0,             /* loaded, or no file */
	SNAP_CORRUPT = -1,       /* torn, truncated, corrupt: not a snapshot */
	SNAP_NOT_REGULAR = -2,   /* a directory, FIFO, socket or device */
	SNAP_UNREADABLE = -3,    /* a system call failed with *err (EACCES, EIO, ENOMEM, ...) */
	SNAP_NO_ROOM = -4,       /* valid, but larger than the keyspace can hold */
};
/* Loads the snapshot into db (empty): SNAP_OK, or a SNAP_ code with the db
 * left empty; *why says what happened, *err the errno of SNAP_UNREADABLE. */
int snapshot_load(struct db *db, uint64_t *keys, const char **why, int *err);
void snapshot_path(char *out, size_t n);
/* Moves the snapshot file that could not be loaded to
 * NAME.rejected-<unix seconds>[.N], never over an existing file, so that no
 * save replaces it; 0 with the new path in kept, or -errno. */
int snapshot_set_aside(char *kept, size_t n);

/* main.c */
double mono_ms(void); /* CLOCK_MONOTONIC in ms */
/* SAVE's work as --durability says: rkv.snap, or a checkpoint waited for
 * (at most 30 s); 0 or -errno. */
int durable_save(void);
/* Sends what a connection's released replies allow, and polls it again
 * (durability.c); may free it. */
void conn_release(struct conn *c);

/* durability.c */
const char *durability_name(enum durability d);
/* Exits with a clear error when the mode needs snapshots and has none. */
void durability_init(void);
int durability_fd(void);         /* to poll, or -1 */
/* After each command (cmd: what command_exec returned): notes a write's
 * epoch and the keys it wrote; under sync holds the reply that begins at
 * reply_start while a state it may depend on is not durable. */
void durability_after_command(struct conn *c, const struct command *cmd, uint64_t dirty_before,
			      size_t reply_start);
/* Holds c's replies from reply_start on until epoch is durable. */
void durability_hold(struct conn *c, uint64_t epoch, size_t reply_start);
void durability_forget(struct conn *c);  /* the connection goes */
/* Asks for a snapshot now; the epoch it will make durable (0: failed, logged). */
uint64_t durability_checkpoint(void);
void durability_tick(void);      /* loop end: one checkpoint for the replies held */
int64_t durability_wait_ns(void); /* how long the loop may sleep before the next tick, or -1 */
void durability_advanced(void);  /* the durable fd is readable: release replies */
/* Blocks until epoch is durable or timeout_ms pass (shutdown); true if durable. */
bool durability_wait(uint64_t epoch, int timeout_ms);
uint64_t durability_held(void);  /* connections holding replies */
uint64_t durability_write_epoch(void);
/* --sync-via redo (durability.c): a write command's record, appended inside
 * the command's unsafe region before it runs; its position, or 0 if it was
 * not logged (the snapshot path keeps it durable then). */
uint64_t durability_log_command(const struct conn *c);
bool durability_logging(void);
int durability_redo_fd(void);   /* to poll too, or -1 */
/* A start from a snapshot: the redo log's records after it, run again. */
void durability_replay(void);
extern bool durability_replaying;

/* rekindle_glue.c */
/* rk_init and the arena; returns 0 or -errno. */
int glue_init(int argc, char **argv, uint64_t arena_size);
/* The preserved db after a warm restart, or NULL: then the caller builds
 * one and passes it to glue_publish.  sweep: mark, check and sweep before
 * returning; else return at once and let glue_verify_step check the table
 * in slices from the event loop. */
struct db *glue_recover(bool sweep, uint64_t *freed_objects, uint64_t *freed_bytes);
/* A slice of that check, paced to a small share of the CPU while clients
 * are waiting (a larger one when none is); true: more to check. */
bool glue_verify_step(struct db *db, bool clients_waiting);
/* While that check is pending, buckets from glue_unchecked on (UINT64_MAX:
 * none) are not checked yet, and the chain of one may be corrupt: a cycle,
 * an entry longer than its block.  A request checks a bucket before it
 * walks its chain (glue_check_bucket: the slices' check of that chain),
 * and whatever walks every chain finishes the check first
 * (glue_verify_all).  A failure restarts cold, as the slices' does. */
extern uint64_t glue_unchecked;
void glue_check_bucket(const struct db *db, uint64_t b);
void glue_verify_all(struct db *db);
/* An entry reached through the TTL list, not a chain: a block, its lengths. */
void glue_check_ttl_entry(const struct entry *e);
/* Logs recovery_check_failed with why and restarts cold. */
void glue_check_failed(const char *why) __attribute__((noreturn));
void glue_publish(struct db *db);
const char *glue_start_kind(void);
const char *glue_reason(void);
unsigned glue_generation(void);
void glue_ready(void);
void glue_heartbeat(void);
uint64_t glue_arena_bytes(void);
/* With --hugepages yes (rk_hugepages_step): the top pass, one 2 MiB range
 * a call (true: more to do at once), from the loop; and a range of the
 * rescan, from cron. */
bool glue_hugepages_step(void);
void glue_hugepages_rescan(void);
/* For INFO: "on", "off" (--hugepages no), "waiting" or why not; and the
 * bytes collapsed in this incarnation. */
const char *glue_hugepages_state(void);
uint64_t glue_hugepage_bytes(void);
/* The durability API (rk_epoch, ...); -1/0/-ENOTSUP without snapshots. */
int glue_durable_fd(void);
uint64_t glue_epoch(void);
/* A warm restart in place: the state may hold writes of the last
 * incarnation that no durable snapshot has yet. */
bool glue_inherited_undurable_state(void);
uint64_t glue_durable_epoch(void);
/* The redo log (rk_redo_*); -ENOTSUP / 0 / -1 without one. */
int64_t glue_redo_append(const void *rec, size_t len);
int glue_redo_gap(void);
int glue_redo_flush(void);
uint64_t glue_redo_durable(void);
uint64_t glue_redo_position(void);
int glue_redo_fd(void);
bool glue_redo_open(void);
int64_t glue_redo_replay(int (*apply)(const void *rec, size_t len, void *ctx), void *ctx);
int glue_checkpoint(void);
/* The error reply when the keyspace cannot allocate (not maxmemory's). */
const char *glue_oom_reply(void);

#endif /* RKV_H */
