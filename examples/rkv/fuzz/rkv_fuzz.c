/* rkv_fuzz.c - libFuzzer target for rkv's request parser (resp.c) and its
 * command layer (commands.c, keyspace.c, snapshot.c), built against the
 * plain-malloc store with ASan and UBSan (see build.mk and README.md).
 *
 * An input is one client connection:
 *
 *   byte 0     how the rest is cut into reads: 0 = one read of everything;
 *              otherwise it seeds a small PRNG that draws each read's size
 *              (1 .. 2^(byte0 & 7) bytes), whether consumed bytes are
 *              dropped from the buffer before the read (main.c does that
 *              only now and then), and how far the clock moves between
 *              reads (0 .. 1.5 s, so that short TTLs expire mid-input)
 *   bytes 1..  what the client sends
 *
 * Each read is handled like conn_readable + conn_process in main.c:
 * resp_parse, command_exec and resp_done until the parser needs more, and
 * the replies are thrown away as if written.  The input buffer is
 * reallocated to its exact size on every read, so a parser that reads past
 * the bytes received hits ASan's redzone instead of stale bytes, and a
 * pointer kept across reads (instead of an offset) points into freed memory.
 *
 * The keyspace is real (ks_create) and flushed after each input, so every
 * input starts from the same state and a crash reproduces from its file
 * alone; inputs are at most -max_len bytes, which bounds the keyspace.
 * After the commands of each read the table is checked against its own
 * bookkeeping (counts, TTL list, memory), and after each successful SAVE
 * the snapshot is loaded back and compared with the keyspace.
 *
 * main.c is compiled in with main() renamed (-Dmain=rkv_server_main), so
 * the real js(), parse_save(), parse_bytes() and srv are used; its event
 * loop is never entered.  rkv_log is wrapped (-Wl,--wrap=rkv_log): every
 * protocol error logs a line, which would flood the fuzzer's output.  Set
 * RKV_FUZZ_LOG=1 to see the lines when replaying one input. */
#include "rkv.h"
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* A fixed clock: TTL arithmetic does not depend on when the input runs.
 * 2033-05-18, after the real time, so that snapshot.c (which compares
 * expiry times with the real clock) keeps every key set with a TTL
 * relative to it. */
#define FUZZ_EPOCH_MS 2000000000000ll
#define OUT_KEEP_MAX (1u << 20) /* main.c's conn_flush frees a larger reply buffer */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct config base_cfg; /* srv.cfg at the start of every input (CONFIG SET changes it) */
static const char *save_parent; /* SAVE writes into a new directory in here */
static bool log_lines;

/* ---- rkv_log, wrapped ------------------------------------------------ */

void __wrap_rkv_log(const char *event, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void __wrap_rkv_log(const char *event, const char *fmt, ...)
{
	/* Format even when quiet: the arguments (js() of client bytes) are
	 * part of what is fuzzed. */
	char line[2048] = "";
	va_list ap;
	va_start(ap, fmt);
	if (fmt)
		vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (log_lines)
		fprintf(stderr, "{\"rkv\":\"%s\",%s}\n", event, line);
}

/* ---- setup ------------------------------------------------------------ */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	log_lines = getenv("RKV_FUZZ_LOG") != NULL;
	/* the snapshot's fsyncs cost nothing on a tmpfs */
	save_parent = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

	/* As main() and parse_options() set things up, with what would fork,
	 * sleep or crash on purpose turned off: no save points (no cron runs
	 * anyway), DEBUG refused (CONFIG SET cannot turn it on), BGSAVE and
	 * SHUTDOWN are not run at all (see denied()). */
	base_cfg = (struct config){.port = 6379, .bind = "127.0.0.1", .dbfilename = "rkv.snap",
				   .maxmemory = 64ull << 20, .enable_debug = 0, .arena_size = 16ull << 30};
	snprintf(base_cfg.dir, sizeof base_cfg.dir, "%s/rkv-fuzz-XXXXXX", save_parent); /* see run_save() */
	srv.cfg = base_cfg;
	srv.start_ms = FUZZ_EPOCH_MS;
	srv.now_ms = FUZZ_EPOCH_MS;
	srv.start_kind = "fresh";
	srv.listen_fd = -1;
	snprintf(srv.exe, sizeof srv.exe, "rkv-fuzz");
	commands_init();
	srv.db = ks_create();
	if (!srv.db) {
		fprintf(stderr, "rkv-fuzz: ks_create: %s\n", strerror(errno));
		exit(1);
	}
	/* ks_create's seed is random; a fixed one (the table is still empty)
	 * gives every run the same bucket layout, so SCAN cursors and chain
	 * orders, and with them a crash, reproduce in another process. */
	srv.db->seed = 0x726b762d66757a7aull;
	return 0;
}

/* ---- checks ----------------------------------------------------------- */

static void broken(const char *what)
{
	fprintf(stderr, "rkv-fuzz: keyspace invariant broken: %s\n", what);
	abort();
}

/* The table against its own bookkeeping: what glue_verify_step and mark_db
 * check after a warm restart, and the counters keyspace.c keeps. */
static void check_keyspace(struct db *db)
{
	uint64_t n = 0, with_ttl = 0, mem = store_usable(db->buckets);
	if (db->mask & (db->mask + 1))
		broken("bucket count is not a power of two");
	KS_FOREACH (db, e) {
		if ((e->hash & db->mask) != b_ || e->hash != ks_hash(db, e->data, e->klen))
			broken("entry in the wrong bucket or with a stale hash");
		if ((uint64_t)e->klen + e->vlen > e->cap || e->cap > store_usable(e) - sizeof *e)
			broken("entry longer than its allocation");
		/* a duplicate key hides behind the first one of its chain */
		if (ks_lookup(db, e->data, e->klen, 0) != e)
			broken("key present twice");
		if (++n > db->count)
			broken("more entries than db->count");
		with_ttl += e->expire_ms != 0;
		mem += sizeof *e + e->cap;
	}
	if (n != db->count)
		broken("fewer entries than db->count");
	if (with_ttl != db->expires)
		broken("entries with a TTL differ from db->expires");
	if (mem != db->mem)
		broken("db->mem differs from the entries' and buckets' sizes");
	uint64_t listed = 0;
	bool cursor_seen = db->xcursor == NULL;
	for (struct entry *e = db->xhead, *prev = NULL; e; prev = e, e = e->xnext) {
		if (!e->expire_ms || e->xprev != prev || ++listed > db->expires)
			broken("TTL list inconsistent");
		cursor_seen |= e == db->xcursor;
	}
	if (listed != db->expires)
		broken("TTL list shorter than db->expires");
	if (!cursor_seen)
		broken("active-expiry cursor not in the TTL list");
}

/* A SAVE succeeded: the file must load back into the keyspace, less the
 * keys whose expiry time the real clock has passed.  snapshot.c drops those
 * on the way out and on the way in; the keyspace may still hold them (SET
 * ... PXAT 2 stores a key that is already expired, and the fuzz clock is
 * not the real one), and never serves them. */
static void check_snapshot(void)
{
	struct db *copy = ks_create();
	uint64_t keys;
	const char *why = "";
	if (!copy)
		return; /* out of memory: nothing to compare with */
	int err;
	int r = snapshot_load(copy, &keys, &why, &err);
	if (r < 0) {
		fprintf(stderr, "rkv-fuzz: snapshot written by SAVE does not load: %s\n", why);
		abort();
	}
	/* now 0 in the lookups: they must not expire anything themselves */
	KS_FOREACH (copy, e) {
		struct entry *live = ks_lookup(srv.db, e->data, e->klen, 0);
		if (!live || live->vlen != e->vlen || live->expire_ms != e->expire_ms ||
		    memcmp(entry_val(live), entry_val(e), e->vlen) != 0)
			broken("snapshot holds a key the keyspace does not, or another value or TTL");
	}
	int64_t real_now = now_realtime_ms();
	KS_FOREACH (srv.db, e)
		if (!ks_lookup(copy, e->data, e->klen, 0) && !(e->expire_ms && e->expire_ms < real_now))
			broken("snapshot lacks a key that has not expired");
	check_keyspace(copy);
	ks_flush(copy);
	store_free(copy->buckets);
	store_free(copy);
}

/* ---- one connection ----------------------------------------------------- */

/* xorshift64*: the cutting of an input, from its first byte */
static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

/* Commands the harness does not run: SHUTDOWN exits the process (libFuzzer
 * would report it as a crash), BGSAVE forks a child that nothing reaps here. */
static bool denied(struct arg name)
{
	static const char *const names[] = {"shutdown", "bgsave"};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (name.n == strlen(names[i]) && strncasecmp(name.p, names[i], name.n) == 0)
			return true;
	return false;
}

static bool is_save(const struct conn *c)
{
	return c->argc == 1 && c->argv[0].n == 4 && strncasecmp(c->argv[0].p, "save", 4) == 0;
}

/* SAVE into a directory that exists only while it runs: a crash elsewhere
 * (and a minimisation crashes thousands of times) leaves nothing behind. */
static void run_save(struct conn *c)
{
	char path[4400];
	snprintf(srv.cfg.dir, sizeof srv.cfg.dir, "%s/rkv-fuzz-XXXXXX", save_parent);
	if (!mkdtemp(srv.cfg.dir)) {
		fprintf(stderr, "rkv-fuzz: mkdtemp %s: %s\n", srv.cfg.dir, strerror(errno));
		abort();
	}
	command_exec(c);
	if (c->olen - c->opos >= 3 && memcmp(c->obuf + c->opos, "+OK", 3) == 0)
		check_snapshot();
	snapshot_path(path, sizeof path);
	unlink(path);
	rmdir(srv.cfg.dir);
}

/* Drops what the parser has consumed, as main.c's conn_make_room does:
 * from the start of a multibulk request in progress, else up to ipos. */
static void drop_consumed(struct conn *c)
{
	size_t base = c->mb_left > 0 ? c->req_start : c->ipos;
	if (base == 0)
		return;
	memmove(c->ibuf, c->ibuf + base, c->ilen - base);
	for (size_t i = 0; i < c->argc; i++)
		c->argoff[i] -= base;
	c->ilen -= base;
	c->ipos -= base;
	c->req_start -= base;
}

/* Appends one read into a buffer of exactly the bytes held. */
static void receive(struct conn *c, const uint8_t *p, size_t n)
{
	char *b = malloc(c->ilen + n);
	if (!b)
		abort();
	if (c->ilen)
		memcpy(b, c->ibuf, c->ilen);
	memcpy(b + c->ilen, p, n);
	free(c->ibuf);
	c->ibuf = b;
	c->ilen += n;
	c->icap = c->ilen;
}

/* main.c's conn_process, with the replies thrown away after each command;
 * false once the connection would be closed. */
static bool process(struct conn *c)
{
	bool ran = false;
	while (!c->close_after_reply && !c->closing) {
		if (resp_parse(c) != PARSE_COMMAND)
			break;
		ran = true;
		if (denied(c->argv[0]))
			reply_error(c, "ERR not run by the fuzz harness");
		else if (is_save(c))
			run_save(c);
		else
			command_exec(c);
		resp_done(c);
		c->opos = c->olen = 0; /* as if written */
		if (c->ocap > OUT_KEEP_MAX) {
			free(c->obuf);
			c->obuf = NULL;
			c->ocap = 0;
		}
	}
	if (ran)
		check_keyspace(srv.db);
	return !c->close_after_reply && !c->closing;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return -1; /* not added to the corpus */
	uint64_t rng = 0x9e3779b97f4a7c15ull * (data[0] + 1u);
	bool cut = data[0] != 0;
	size_t max_read = (size_t)1 << (data[0] & 7);
	data++;
	size--;

	srv.cfg = base_cfg;
	srv.now_ms = FUZZ_EPOCH_MS;
	memset(&srv.st, 0, sizeof srv.st);
	srv.db->st.expired = 0;
	srv.st.connections = 1;
	srv.clients = 1;
	struct conn c = {.fd = -1, .id = 1, .bulk_len = -1, .proto = 2, .reading = true};

	for (size_t off = 0; off < size;) {
		size_t n = cut ? 1 + next_rand(&rng) % max_read : size;
		if (n > size - off)
			n = size - off;
		if (cut && next_rand(&rng) % 2)
			drop_consumed(&c);
		receive(&c, data + off, n);
		off += n;
		if (!process(&c))
			break;
		if (cut) {
			srv.now_ms += (int64_t)(next_rand(&rng) % 1500);
			ks_active_expire(srv.db, srv.now_ms, 25000); /* as the cron does */
			check_keyspace(srv.db);
		}
	}

	free(c.ibuf);
	free(c.obuf);
	free(c.argoff);
	free(c.arglen);
	free(c.argv);
	free(c.name);
	/* Empty again (the next input starts from the same state), and as many
	 * frees as mallocs: otherwise libFuzzer suspects a leak and runs the
	 * input a second time under LeakSanitizer. */
	ks_flush(srv.db);
	return 0;
}
