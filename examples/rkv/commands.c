/* commands.c - the commands of rkv, with Redis's semantics and Redis's
 * error replies.  Each command reads c->argv (pointers into the request
 * buffer) and appends its reply to c->obuf. */
#include "rkv.h"
#include "store.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define A(i) (c->argv[i])
#define ARGC ((int)c->argc)

#define CMD_DENYOOM 0x1u /* refused when used memory > maxmemory */
#define CMD_LOADING 0x2u /* allowed while loading (unused: loading is synchronous) */
#define CMD_NO_DATA 0x4u /* reads and writes no key, and says nothing of the keyspace */
#define CMD_WRITE 0x8u   /* may change the keyspace: logged under --sync-via redo */

struct command {
	const char *name;
	void (*fn)(struct conn *c);
	int arity; /* Redis convention: N exactly, -N at least */
	unsigned flags;
	/* Its keys, Redis's convention: argv[first], then every step-th up to
	 * argv[last] (-1: the last argument); first 0: no key, the command may
	 * read or write anything (durability.c holds on it as on everything). */
	int first, last, step;
};

static const char *const ERR_INT = "ERR value is not an integer or out of range";
static const char *const ERR_SYNTAX = "ERR syntax error";
static const char *const ERR_OVERFLOW = "ERR increment or decrement would overflow";
static const char *const ERR_BGSAVE = "ERR Background save already in progress";

static bool eq(struct arg a, const char *s)
{
	size_t n = strlen(s);
	return a.n == n && strncasecmp(a.p, s, n) == 0;
}

/* Redis's string2ll: optional '-', no '+', no leading zeros, no spaces. */
static bool to_ll(struct arg a, long long *out)
{
	const char *p = a.p;
	size_t n = a.n, i = 0;
	if (n == 0 || n > 20)
		return false;
	if (n == 1 && p[0] == '0') {
		*out = 0;
		return true;
	}
	bool neg = p[0] == '-';
	if (neg && ++i == n)
		return false;
	if (p[i] < '1' || p[i] > '9')
		return false;
	unsigned long long v = 0;
	for (; i < n; i++) {
		if (p[i] < '0' || p[i] > '9')
			return false;
		unsigned d = (unsigned)(p[i] - '0');
		if (v > (ULLONG_MAX - d) / 10)
			return false;
		v = v * 10 + d;
	}
	if (neg) {
		if (v > (unsigned long long)LLONG_MAX + 1)
			return false;
		*out = v == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)v;
	} else {
		if (v > LLONG_MAX)
			return false;
		*out = (long long)v;
	}
	return true;
}

static struct entry *lookup(struct arg k)
{
	struct entry *e = ks_lookup(srv.db, k.p, k.n, srv.now_ms);
	if (e)
		srv.st.hits++;
	else
		srv.st.misses++;
	return e;
}

/* The keyspace could not allocate: with maxmemory 0 too, so the reply must
 * not blame maxmemory.  (Redis aborts when its malloc fails.) */
static void reply_oom(struct conn *c)
{
	reply_error(c, glue_oom_reply());
}

static void reply_over_maxmemory(struct conn *c)
{
	reply_error(c, "OOM command not allowed when used memory > 'maxmemory'.");
}

/* Redis 7's replies for a container command (CONFIG, CLIENT, ...): a
 * known subcommand with the wrong arity, or an unknown subcommand. */
static void reply_sub_arity(struct conn *c, const char *cmd)
{
	char sub[64];
	size_t n = A(1).n < sizeof sub - 1 ? A(1).n : sizeof sub - 1;
	for (size_t i = 0; i < n; i++)
		sub[i] = (char)tolower((unsigned char)A(1).p[i]);
	sub[n] = 0;
	reply_errorf(c, "ERR wrong number of arguments for '%s|%s' command", cmd, sub);
}

static void reply_sub_unknown(struct conn *c, const char *cmd)
{
	reply_errorf(c, "ERR unknown subcommand '%.*s'. Try %s HELP.", (int)(A(1).n > 128 ? 128 : A(1).n), A(1).p,
		     cmd);
}

/* ---- connection, server --------------------------------------------- */

static void cmd_ping(struct conn *c)
{
	if (ARGC > 2)
		reply_error(c, "ERR wrong number of arguments for 'ping' command");
	else if (ARGC == 2)
		reply_bulk(c, A(1).p, A(1).n);
	else
		reply_raw(c, "+PONG\r\n", 7);
}

static void cmd_echo(struct conn *c) { reply_bulk(c, A(1).p, A(1).n); }

static void cmd_quit(struct conn *c)
{
	reply_ok(c);
	c->close_after_reply = true;
}

static void cmd_select(struct conn *c)
{
	long long db;
	if (!to_ll(A(1), &db))
		reply_error(c, ERR_INT);
	else if (db != 0)
		reply_error(c, "ERR DB index is out of range");
	else
		reply_ok(c);
}

static void cmd_dbsize(struct conn *c) { reply_int(c, (long long)srv.db->count); }

static void cmd_flushall(struct conn *c)
{
	if (ARGC > 2 || (ARGC == 2 && !eq(A(1), "async") && !eq(A(1), "sync"))) {
		reply_error(c, ERR_SYNTAX);
		return;
	}
	ks_flush(srv.db);
	reply_ok(c);
}

static void cmd_time(struct conn *c)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	char s[24], u[24];
	int sn = snprintf(s, sizeof s, "%lld", (long long)ts.tv_sec);
	int un = snprintf(u, sizeof u, "%ld", ts.tv_nsec / 1000);
	reply_array(c, 2);
	reply_bulk(c, s, (size_t)sn);
	reply_bulk(c, u, (size_t)un);
}

static void cmd_lastsave(struct conn *c) { reply_int(c, srv.db->last_save_s); }

/* --durability async|sync: SAVE is a checkpoint whose OK waits until it is
 * durable (the loop goes on meanwhile); BGSAVE one not waited for. */
static bool checkpoint_instead(struct conn *c, bool wait)
{
	if (srv.cfg.durability == DUR_NONE)
		return false;
	uint64_t e = durability_checkpoint();
	if (!e) {
		reply_error(c, "ERR checkpoint failed: Rekindle's snapshots are unavailable (see the log)");
		return true;
	}
	size_t at = c->olen;
	if (!wait) {
		reply_status(c, "Background saving started");
		return true;
	}
	reply_ok(c);
	durability_hold(c, e, at);
	return true;
}

static void cmd_save(struct conn *c)
{
	if (checkpoint_instead(c, true))
		return;
	if (srv.db->bgsave_pid) {
		reply_error(c, ERR_BGSAVE);
		return;
	}
	int r = snapshot_save(srv.db);
	if (r < 0)
		reply_errorf(c, "ERR snapshot failed: %s", strerror(-r));
	else
		reply_ok(c);
}

static void cmd_bgsave(struct conn *c)
{
	if (ARGC > 2 || (ARGC == 2 && !eq(A(1), "schedule"))) {
		reply_error(c, ERR_SYNTAX);
		return;
	}
	if (checkpoint_instead(c, false))
		return;
	if (srv.db->bgsave_pid) {
		reply_error(c, ERR_BGSAVE);
		return;
	}
	int r = snapshot_bgsave(srv.db);
	if (r < 0)
		reply_errorf(c, "ERR background save failed: %s", strerror(-r));
	else
		reply_status(c, "Background saving started");
}

/* SHUTDOWN [NOSAVE|SAVE]: saves when save points are configured (or SAVE). */
static void cmd_shutdown(struct conn *c)
{
	bool save = srv.cfg.nsave > 0 || srv.cfg.durability != DUR_NONE;
	if (ARGC == 2 && eq(A(1), "nosave"))
		save = false;
	else if (ARGC == 2 && eq(A(1), "save"))
		save = true;
	else if (ARGC > 1) {
		reply_error(c, ERR_SYNTAX);
		return;
	}
	if (save && durable_save() < 0) {
		reply_error(c, "ERR Errors trying to SHUTDOWN. Check logs.");
		return;
	}
	rkv_log("shutdown", "\"saved\":%s", save ? "true" : "false");
	exit(0);
}

static void cmd_command(struct conn *c);

static void reply_cstr(struct conn *c, const char *s) { reply_bulk(c, s, strlen(s)); }

/* HELLO [protover [SETNAME name]]: RESP3 is what redis-py 8 asks for by
 * default.  rkv's replies differ only in nulls and maps. */
static void cmd_hello(struct conn *c)
{
	long long ver = c->proto;
	if (ARGC >= 2 && !to_ll(A(1), &ver)) {
		reply_error(c, "ERR Protocol version is not an integer or out of range");
		return;
	}
	if (ver != 2 && ver != 3) {
		reply_error(c, "NOPROTO unsupported protocol version");
		return;
	}
	for (int i = 2; i < ARGC; i++) {
		if (eq(A(i), "setname") && i + 1 < ARGC) {
			free(c->name);
			c->name = strndup(A(i + 1).p, A(i + 1).n);
			i++;
		} else {
			reply_errorf(c, "ERR Syntax error in HELLO option '%.*s'", (int)A(i).n, A(i).p);
			return;
		}
	}
	c->proto = (int)ver;
	reply_map(c, 7);
	reply_cstr(c, "server");
	reply_cstr(c, "redis");
	reply_cstr(c, "version");
	reply_cstr(c, "7.0.15");
	reply_cstr(c, "proto");
	reply_int(c, ver);
	reply_cstr(c, "id");
	reply_int(c, (long long)c->id);
	reply_cstr(c, "mode");
	reply_cstr(c, "standalone");
	reply_cstr(c, "role");
	reply_cstr(c, "master");
	reply_cstr(c, "modules");
	reply_array(c, 0);
}

static void cmd_client(struct conn *c)
{
	if (eq(A(1), "setname") && ARGC == 3) {
		for (size_t i = 0; i < A(2).n; i++)
			if (A(2).p[i] <= ' ' || A(2).p[i] > '~') {
				reply_error(c, "ERR Client names cannot contain spaces, newlines or special characters.");
				return;
			}
		free(c->name);
		c->name = A(2).n ? strndup(A(2).p, A(2).n) : NULL;
		reply_ok(c);
	} else if (eq(A(1), "getname") && ARGC == 2) {
		if (c->name)
			reply_bulk(c, c->name, strlen(c->name));
		else
			reply_nil(c);
	} else if (eq(A(1), "id") && ARGC == 2) {
		reply_int(c, (long long)c->id);
	} else if (eq(A(1), "setinfo") && ARGC == 4) {
		reply_ok(c); /* redis-py sends LIB-NAME and LIB-VER on connect */
	} else if (eq(A(1), "setname") || eq(A(1), "getname") || eq(A(1), "id") || eq(A(1), "setinfo")) {
		reply_sub_arity(c, "client");
	} else {
		reply_sub_unknown(c, "CLIENT");
	}
}

/* ---- strings ---------------------------------------------------------- */

static void cmd_get(struct conn *c)
{
	struct entry *e = lookup(A(1));
	if (e)
		reply_bulk(c, entry_val(e), e->vlen);
	else
		reply_nil(c);
}

/* Relative or absolute expiry argument to an absolute time in ms; false
 * (reply sent) if invalid.  unit: 1000 for seconds, 1 for ms. */
static bool expire_arg(struct conn *c, struct arg a, long long unit, bool absolute, const char *cmd,
		       int64_t *out)
{
	long long v;
	if (!to_ll(a, &v)) {
		reply_error(c, ERR_INT);
		return false;
	}
	if (v <= 0 || v > LLONG_MAX / unit || (!absolute && v * unit > LLONG_MAX - srv.now_ms)) {
		reply_errorf(c, "ERR invalid expire time in '%s' command", cmd);
		return false;
	}
	*out = v * unit + (absolute ? 0 : srv.now_ms);
	return true;
}

#define SET_NX 1
#define SET_XX 2
#define SET_GET 4

/* The common part of SET, SETNX, SETEX, PSETEX, GETSET: 1 if set, 0 if NX
 * or XX said no, -1 out of memory.  With SET_GET the old value (or nil) is
 * replied here. */
static int set_generic(struct conn *c, struct arg k, struct arg v, int flags, int64_t expire)
{
	struct entry *old = NULL;
	/* Only these need to know whether the key exists: a plain SET hashes once. */
	if ((flags & (SET_NX | SET_XX | SET_GET)) || expire < 0)
		old = ks_lookup(srv.db, k.p, k.n, srv.now_ms);
	if (flags & SET_GET) {
		if (old)
			reply_bulk(c, entry_val(old), old->vlen);
		else
			reply_nil(c);
	}
	if ((flags & SET_NX && old) || (flags & SET_XX && !old))
		return 0;
	if (expire < 0 && !old)
		expire = 0; /* KEEPTTL of a new key */
	return ks_set(srv.db, k.p, k.n, v.p, v.n, expire) ? 1 : -1;
}

static void reply_set(struct conn *c, int r, int flags)
{
	if (r < 0)
		reply_oom(c);
	else if (!(flags & SET_GET))
		r ? reply_ok(c) : reply_nil(c);
}

/* SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL] */
static void cmd_set(struct conn *c)
{
	int flags = 0, ex = -1; /* ex: index of the expiry argument */
	long long unit = 0;
	bool absolute = false, keepttl = false;
	for (int i = 3; i < ARGC; i++) {
		struct arg a = A(i);
		if (eq(a, "nx") && !(flags & SET_XX)) {
			flags |= SET_NX;
		} else if (eq(a, "xx") && !(flags & SET_NX)) {
			flags |= SET_XX;
		} else if (eq(a, "get")) {
			flags |= SET_GET;
		} else if (eq(a, "keepttl") && ex < 0) {
			keepttl = true;
		} else if ((eq(a, "ex") || eq(a, "px") || eq(a, "exat") || eq(a, "pxat")) && ex < 0 && !keepttl &&
			   i + 1 < ARGC) {
			unit = (a.p[0] | 0x20) == 'e' ? 1000 : 1;
			absolute = a.n == 4;
			ex = ++i;
		} else {
			reply_error(c, ERR_SYNTAX);
			return;
		}
	}
	int64_t expire = keepttl ? -1 : 0;
	if (ex > 0 && !expire_arg(c, A(ex), unit, absolute, "set", &expire))
		return;
	reply_set(c, set_generic(c, A(1), A(2), flags, expire), flags);
}

static void cmd_setnx(struct conn *c)
{
	int r = set_generic(c, A(1), A(2), SET_NX, 0);
	if (r < 0)
		reply_oom(c);
	else
		reply_int(c, r);
}

static void setex_generic(struct conn *c, long long unit, const char *name)
{
	int64_t expire;
	if (expire_arg(c, A(2), unit, false, name, &expire))
		reply_set(c, set_generic(c, A(1), A(3), 0, expire), 0);
}
static void cmd_setex(struct conn *c) { setex_generic(c, 1000, "setex"); }
static void cmd_psetex(struct conn *c) { setex_generic(c, 1, "psetex"); }

static void cmd_getset(struct conn *c) { set_generic(c, A(1), A(2), SET_GET, 0); }

static void cmd_getdel(struct conn *c)
{
	struct entry *e = lookup(A(1));
	if (!e) {
		reply_nil(c);
		return;
	}
	reply_bulk(c, entry_val(e), e->vlen);
	ks_del(srv.db, A(1).p, A(1).n);
}

static void cmd_mget(struct conn *c)
{
	reply_array(c, ARGC - 1);
	for (int i = 1; i < ARGC; i++) {
		struct entry *e = lookup(A(i));
		if (e)
			reply_bulk(c, entry_val(e), e->vlen);
		else
			reply_nil(c);
	}
}

static void cmd_mset(struct conn *c)
{
	if (ARGC % 2 == 0) {
		reply_error(c, "ERR wrong number of arguments for 'mset' command");
		return;
	}
	ks_txn_begin(srv.db);
	for (int i = 1; i < ARGC; i += 2)
		if (!ks_set(srv.db, A(i).p, A(i).n, A(i + 1).p, A(i + 1).n, 0)) {
			ks_txn_end(srv.db);
			reply_oom(c);
			return;
		}
	ks_txn_end(srv.db);
	reply_ok(c);
}

static void incr_generic(struct conn *c, long long by)
{
	struct entry *e = ks_lookup(srv.db, A(1).p, A(1).n, srv.now_ms);
	long long v = 0;
	if (e && !to_ll((struct arg){entry_val(e), e->vlen}, &v)) {
		reply_error(c, ERR_INT);
		return;
	}
	if ((by < 0 && v < LLONG_MIN - by) || (by > 0 && v > LLONG_MAX - by)) {
		reply_error(c, ERR_OVERFLOW);
		return;
	}
	v += by;
	char buf[24];
	int n = snprintf(buf, sizeof buf, "%lld", v);
	/* INCR keeps the TTL, so an existing entry changes only its value */
	if (e ? !ks_set_value(srv.db, e, buf, (size_t)n, "", 0) : !ks_set(srv.db, A(1).p, A(1).n, buf, (size_t)n, 0))
		reply_oom(c);
	else
		reply_int(c, v);
}

static void cmd_incr(struct conn *c) { incr_generic(c, 1); }
static void cmd_decr(struct conn *c) { incr_generic(c, -1); }

static void cmd_incrby(struct conn *c)
{
	long long by;
	if (!to_ll(A(2), &by))
		reply_error(c, ERR_INT);
	else
		incr_generic(c, by);
}

static void cmd_decrby(struct conn *c)
{
	long long by;
	if (!to_ll(A(2), &by))
		reply_error(c, ERR_INT);
	else if (by == LLONG_MIN)
		reply_error(c, "ERR decrement would overflow");
	else
		incr_generic(c, -by);
}

static void cmd_append(struct conn *c)
{
	struct entry *e = ks_lookup(srv.db, A(1).p, A(1).n, srv.now_ms);
	if (!e) {
		e = ks_set(srv.db, A(1).p, A(1).n, A(2).p, A(2).n, 0);
	} else {
		if ((long long)e->vlen + (long long)A(2).n > RKV_MAX_BULK) {
			reply_error(c, "ERR string exceeds maximum allowed size (proto-max-bulk-len)");
			return;
		}
		e = ks_set_value(srv.db, e, entry_val(e), e->vlen, A(2).p, A(2).n);
	}
	if (!e)
		reply_oom(c);
	else
		reply_int(c, e->vlen);
}

static void cmd_strlen(struct conn *c)
{
	struct entry *e = lookup(A(1));
	reply_int(c, e ? e->vlen : 0);
}

static void cmd_type(struct conn *c)
{
	reply_status(c, lookup(A(1)) ? "string" : "none");
}

/* ---- keys ------------------------------------------------------------- */

static void cmd_del(struct conn *c)
{
	long long n = 0;
	bool changing = false; /* the region opens at the first delete */
	for (int i = 1; i < ARGC; i++)
		if (ks_lookup(srv.db, A(i).p, A(i).n, srv.now_ms)) {
			if (!changing)
				ks_txn_begin(srv.db);
			changing = true;
			n += ks_del(srv.db, A(i).p, A(i).n);
		}
	if (changing)
		ks_txn_end(srv.db);
	reply_int(c, n);
}

static void cmd_exists(struct conn *c)
{
	long long n = 0;
	for (int i = 1; i < ARGC; i++)
		n += lookup(A(i)) != NULL;
	reply_int(c, n);
}

#define EXP_NX 1
#define EXP_XX 2
#define EXP_GT 4
#define EXP_LT 8

/* EXPIRE/PEXPIRE/EXPIREAT/PEXPIREAT key time [NX|XX|GT|LT] (Redis 7) */
static void expire_generic(struct conn *c, long long unit, bool absolute, const char *name)
{
	int fl = 0;
	for (int i = 3; i < ARGC; i++) {
		if (eq(A(i), "nx"))
			fl |= EXP_NX;
		else if (eq(A(i), "xx"))
			fl |= EXP_XX;
		else if (eq(A(i), "gt"))
			fl |= EXP_GT;
		else if (eq(A(i), "lt"))
			fl |= EXP_LT;
		else {
			reply_errorf(c, "ERR Unsupported option %.*s", (int)A(i).n, A(i).p);
			return;
		}
	}
	if ((fl & EXP_NX) && (fl & (EXP_XX | EXP_GT | EXP_LT))) {
		reply_error(c, "ERR NX and XX, GT or LT options at the same time are not compatible");
		return;
	}
	if ((fl & EXP_GT) && (fl & EXP_LT)) {
		reply_error(c, "ERR GT and LT options at the same time are not compatible");
		return;
	}
	long long v;
	if (!to_ll(A(2), &v)) {
		reply_error(c, ERR_INT);
		return;
	}
	long long base = absolute ? 0 : srv.now_ms;
	if (v > LLONG_MAX / unit || v < LLONG_MIN / unit || (v *= unit, v > 0 && v > LLONG_MAX - base) ||
	    (v < 0 && v < LLONG_MIN + base)) {
		reply_errorf(c, "ERR invalid expire time in '%s' command", name);
		return;
	}
	long long when = v + base;
	struct entry *e = ks_lookup(srv.db, A(1).p, A(1).n, srv.now_ms);
	if (!e) {
		reply_int(c, 0);
		return;
	}
	/* No TTL counts as an infinite one for GT and LT, as in Redis. */
	if (((fl & EXP_NX) && e->expire_ms) || ((fl & EXP_XX) && !e->expire_ms) ||
	    ((fl & EXP_GT) && (!e->expire_ms || when <= e->expire_ms)) ||
	    ((fl & EXP_LT) && e->expire_ms && when >= e->expire_ms)) {
		reply_int(c, 0);
		return;
	}
	if (when <= srv.now_ms) /* already expired: delete now */
		ks_del(srv.db, A(1).p, A(1).n);
	else
		ks_set_expire(srv.db, e, when);
	reply_int(c, 1);
}

static void cmd_expire(struct conn *c) { expire_generic(c, 1000, false, "expire"); }
static void cmd_pexpire(struct conn *c) { expire_generic(c, 1, false, "pexpire"); }
static void cmd_expireat(struct conn *c) { expire_generic(c, 1000, true, "expireat"); }
static void cmd_pexpireat(struct conn *c) { expire_generic(c, 1, true, "pexpireat"); }

static void ttl_generic(struct conn *c, bool ms)
{
	struct entry *e = ks_lookup(srv.db, A(1).p, A(1).n, srv.now_ms);
	if (!e)
		reply_int(c, -2);
	else if (!e->expire_ms)
		reply_int(c, -1);
	else {
		long long ttl = e->expire_ms - srv.now_ms;
		if (ttl < 0)
			ttl = 0;
		reply_int(c, ms ? ttl : (ttl + 500) / 1000);
	}
}

static void cmd_ttl(struct conn *c) { ttl_generic(c, false); }
static void cmd_pttl(struct conn *c) { ttl_generic(c, true); }

static void cmd_persist(struct conn *c)
{
	struct entry *e = ks_lookup(srv.db, A(1).p, A(1).n, srv.now_ms);
	if (!e || !e->expire_ms) {
		reply_int(c, 0);
		return;
	}
	ks_set_expire(srv.db, e, 0);
	reply_int(c, 1);
}

/* Collects matching entries, then replies (the count must come first). */
struct keylist {
	struct entry **v;
	size_t n, cap;
	struct glob pat;
	bool all, oom;
};

static void keylist_add(struct entry *e, void *arg)
{
	struct keylist *kl = arg;
	if (!kl->all && !ks_glob_match(&kl->pat, e->data, e->klen))
		return;
	if (kl->n == kl->cap) {
		size_t cap = kl->cap ? kl->cap * 2 : 64;
		struct entry **v = realloc(kl->v, cap * sizeof *v);
		if (!v) {
			kl->oom = true;
			return;
		}
		kl->v = v;
		kl->cap = cap;
	}
	kl->v[kl->n++] = e;
}

static void keylist_reply(struct conn *c, struct keylist *kl)
{
	reply_array(c, (long long)kl->n);
	for (size_t i = 0; i < kl->n; i++)
		reply_bulk(c, kl->v[i]->data, kl->v[i]->klen);
	free(kl->v);
}

static void cmd_keys(struct conn *c)
{
	struct keylist kl = {.all = A(1).n == 1 && A(1).p[0] == '*'};
	ks_glob_init(&kl.pat, A(1).p, A(1).n);
	KS_FOREACH (srv.db, e)
		if (!e->expire_ms || e->expire_ms >= srv.now_ms)
			keylist_add(e, &kl);
	if (kl.oom) {
		free(kl.v);
		reply_error(c, "ERR out of memory");
		return;
	}
	keylist_reply(c, &kl);
}

/* SCAN cursor [MATCH pattern] [COUNT n] [TYPE type] */
static void cmd_scan(struct conn *c)
{
	char *end;
	char cur[24];
	if (A(1).n == 0 || A(1).n >= sizeof cur) {
		reply_error(c, "ERR invalid cursor");
		return;
	}
	memcpy(cur, A(1).p, A(1).n);
	cur[A(1).n] = 0;
	errno = 0;
	unsigned long long cursor = strtoull(cur, &end, 10);
	if (*end || errno || !isdigit((unsigned char)cur[0])) {
		reply_error(c, "ERR invalid cursor");
		return;
	}
	long long count = 10;
	struct keylist kl = {.all = true};
	bool none = false;
	for (int i = 2; i < ARGC; i += 2) {
		if (i + 1 >= ARGC) {
			reply_error(c, ERR_SYNTAX);
			return;
		}
		if (eq(A(i), "count")) {
			if (!to_ll(A(i + 1), &count)) {
				reply_error(c, ERR_INT);
				return;
			}
			if (count < 1) {
				reply_error(c, ERR_SYNTAX);
				return;
			}
		} else if (eq(A(i), "match")) {
			ks_glob_init(&kl.pat, A(i + 1).p, A(i + 1).n);
			kl.all = A(i + 1).n == 1 && A(i + 1).p[0] == '*';
		} else if (eq(A(i), "type")) {
			none = !eq(A(i + 1), "string");
		} else {
			reply_error(c, ERR_SYNTAX);
			return;
		}
	}
	uint64_t next = ks_scan(srv.db, cursor, (uint64_t)count, srv.now_ms, keylist_add, &kl);
	if (kl.oom) {
		free(kl.v);
		reply_error(c, "ERR out of memory");
		return;
	}
	if (none)
		kl.n = 0;
	char buf[24];
	int n = snprintf(buf, sizeof buf, "%llu", (unsigned long long)next);
	reply_array(c, 2);
	reply_bulk(c, buf, (size_t)n);
	keylist_reply(c, &kl);
}

/* ---- INFO, CONFIG ------------------------------------------------------- */

struct sbuf {
	char *p;
	size_t n, cap;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
		va_end(ap);
		if (n < 0)
			return;
		if (b->p && b->n + (size_t)n < b->cap) {
			b->n += (size_t)n;
			return;
		}
		size_t cap = b->cap ? b->cap * 2 : 4096;
		while (cap < b->n + (size_t)n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return;
		b->p = p;
		b->cap = cap;
	}
}

static void human(char *out, size_t n, uint64_t bytes)
{
	if (bytes < 1024)
		snprintf(out, n, "%lluB", (unsigned long long)bytes);
	else if (bytes < (1u << 20))
		snprintf(out, n, "%.2fK", bytes / 1024.0);
	else if (bytes < (1u << 30))
		snprintf(out, n, "%.2fM", bytes / 1048576.0);
	else
		snprintf(out, n, "%.2fG", bytes / 1073741824.0);
}

static bool want(struct conn *c, const char *section, bool dflt)
{
	if (ARGC < 2)
		return dflt;
	for (int i = 1; i < ARGC; i++)
		if (eq(A(i), section) || eq(A(i), "all") || eq(A(i), "everything") || (dflt && eq(A(i), "default")))
			return true;
	return false;
}

static void cmd_info(struct conn *c)
{
	struct sbuf b = {0};
	struct db *db = srv.db;
	int64_t up = (srv.now_ms - srv.start_ms) / 1000;
	if (want(c, "server", true))
		sb_printf(&b,
			  "# Server\r\nredis_version:7.0.15\r\nrkv_version:%s\r\nredis_mode:standalone\r\n"
			  "os:Linux\r\narch_bits:64\r\nmultiplexing_api:epoll\r\nprocess_id:%d\r\n"
			  "tcp_port:%d\r\nuptime_in_seconds:%lld\r\nuptime_in_days:%lld\r\nhz:10\r\n"
			  "executable:%s\r\nrekindle_start:%s\r\nrekindle_generation:%u\r\n\r\n",
			  RKV_VERSION, (int)getpid(), srv.cfg.port, (long long)up, (long long)up / 86400, srv.exe,
			  srv.start_kind, srv.generation);
	if (want(c, "clients", true))
		sb_printf(&b, "# Clients\r\nconnected_clients:%llu\r\nmaxclients:%u\r\n\r\n",
			  (unsigned long long)srv.clients, srv.cfg.maxclients);
	if (want(c, "memory", true)) {
		char h1[32], h2[32];
		human(h1, sizeof h1, db->mem);
		human(h2, sizeof h2, srv.cfg.maxmemory);
		sb_printf(&b,
			  "# Memory\r\nused_memory:%llu\r\nused_memory_human:%s\r\nmaxmemory:%llu\r\n"
			  "maxmemory_human:%s\r\nmaxmemory_policy:noeviction\r\narena_allocated_bytes:%llu\r\n"
			  "arena_hugepages:%s\r\narena_hugepage_bytes:%llu\r\n\r\n",
			  (unsigned long long)db->mem, h1, (unsigned long long)srv.cfg.maxmemory, h2,
			  (unsigned long long)glue_arena_bytes(), glue_hugepages_state(),
			  (unsigned long long)glue_hugepage_bytes());
	}
	if (want(c, "persistence", true))
		sb_printf(&b,
			  "# Persistence\r\nloading:%d\r\nrdb_changes_since_last_save:%llu\r\n"
			  "rdb_bgsave_in_progress:%d\r\nrdb_last_save_time:%lld\r\nrdb_last_bgsave_status:%s\r\n"
			  "aof_enabled:0\r\nrekindle_durability:%s\r\nrekindle_epoch:%llu\r\n"
			  "rekindle_durable_epoch:%llu\r\nrekindle_write_epoch:%llu\r\n"
			  "rekindle_clients_held:%llu\r\n\r\n",
			  srv.loading, (unsigned long long)db->dirty, db->bgsave_pid != 0, (long long)db->last_save_s,
			  db->bgsave_ok ? "ok" : "err", durability_name(srv.cfg.durability),
			  (unsigned long long)glue_epoch(), (unsigned long long)glue_durable_epoch(),
			  (unsigned long long)durability_write_epoch(), (unsigned long long)durability_held());
	if (want(c, "stats", true))
		sb_printf(&b,
			  "# Stats\r\ntotal_connections_received:%llu\r\ntotal_commands_processed:%llu\r\n"
			  "rejected_connections:%llu\r\nexpired_keys:%llu\r\nkeyspace_hits:%llu\r\n"
			  "keyspace_misses:%llu\r\n\r\n",
			  (unsigned long long)srv.st.connections, (unsigned long long)srv.st.commands,
			  (unsigned long long)srv.rejected_connections,
			  (unsigned long long)db->st.expired, (unsigned long long)srv.st.hits,
			  (unsigned long long)srv.st.misses);
	if (want(c, "keyspace", true)) {
		sb_printf(&b, "# Keyspace\r\n");
		if (db->count)
			sb_printf(&b, "db0:keys=%llu,expires=%llu,avg_ttl=0\r\n", (unsigned long long)db->count,
				  (unsigned long long)db->expires);
	}
	/* Redis ends the text without the last section's blank line */
	while (b.n >= 3 && b.p[b.n - 1] == '\n' && b.p[b.n - 3] == '\n')
		b.n -= 2;
	reply_bulk(c, b.p ? b.p : "", b.n);
	free(b.p);
}

static void config_value(const char *name, char *out, size_t n)
{
	const struct config *cf = &srv.cfg;
	out[0] = 0;
	if (!strcmp(name, "save")) {
		size_t len = 0;
		for (int i = 0; i < cf->nsave && len < n; i++)
			len += (size_t)snprintf(out + len, n - len, "%s%ld %ld", i ? " " : "", cf->save[i].seconds,
						cf->save[i].changes);
	} else if (!strcmp(name, "appendonly")) {
		snprintf(out, n, "no");
	} else if (!strcmp(name, "maxmemory")) {
		snprintf(out, n, "%llu", (unsigned long long)cf->maxmemory);
	} else if (!strcmp(name, "maxmemory-policy")) {
		snprintf(out, n, "noeviction");
	} else if (!strcmp(name, "port")) {
		snprintf(out, n, "%d", cf->port);
	} else if (!strcmp(name, "bind")) {
		snprintf(out, n, "%s", cf->bind);
	} else if (!strcmp(name, "dir")) {
		snprintf(out, n, "%s", cf->dir);
	} else if (!strcmp(name, "dbfilename")) {
		snprintf(out, n, "%s", cf->dbfilename);
	} else if (!strcmp(name, "databases")) {
		snprintf(out, n, "1");
	} else if (!strcmp(name, "enable-debug-command")) {
		snprintf(out, n, "%s", cf->enable_debug == 1 ? "yes" : cf->enable_debug == 2 ? "local" : "no");
	} else if (!strcmp(name, "proto-max-bulk-len")) {
		snprintf(out, n, "%lld", RKV_MAX_BULK);
	} else if (!strcmp(name, "hz")) {
		snprintf(out, n, "10");
	} else if (!strcmp(name, "maxclients")) {
		snprintf(out, n, "%u", cf->maxclients);
	} else if (!strcmp(name, "timeout")) {
		snprintf(out, n, "0");
	}
}

static const char *const config_names[] = {"save", "appendonly", "maxmemory", "maxmemory-policy", "port", "bind",
					   "dir", "dbfilename", "databases", "enable-debug-command",
					   "proto-max-bulk-len", "hz", "timeout", "maxclients"};
#define NCONFIG (sizeof config_names / sizeof config_names[0])

int parse_save(const char *s, struct config *cf);

static void cmd_config(struct conn *c)
{
	if (eq(A(1), "get") && ARGC >= 3) {
		bool hit[NCONFIG] = {0};
		long long n = 0;
		for (int i = 2; i < ARGC; i++)
			for (size_t k = 0; k < NCONFIG; k++)
				if (!hit[k] && ks_glob(A(i).p, A(i).n, config_names[k], strlen(config_names[k])))
					hit[k] = true, n++;
		reply_map(c, n);
		for (size_t k = 0; k < NCONFIG; k++)
			if (hit[k]) {
				char v[4400];
				config_value(config_names[k], v, sizeof v);
				reply_bulk(c, config_names[k], strlen(config_names[k]));
				reply_bulk(c, v, strlen(v));
			}
	} else if (eq(A(1), "set") && ARGC == 4 && (eq(A(2), "save") || eq(A(2), "maxmemory"))) {
		char v[4400];
		snprintf(v, sizeof v, "%.*s", (int)A(3).n, A(3).p);
		int r = eq(A(2), "save") ? parse_save(v, &srv.cfg) : parse_bytes(v, &srv.cfg.maxmemory);
		if (r < 0)
			reply_errorf(c, "ERR CONFIG SET failed (possibly related to argument '%.*s') - argument invalid",
				     (int)A(2).n, A(2).p);
		else
			reply_ok(c);
	} else if (eq(A(1), "set") && ARGC >= 4 && ARGC % 2 == 0) {
		reply_errorf(c, "ERR Unknown option or number of arguments for CONFIG SET - '%.*s'",
			     (int)(A(2).n > 128 ? 128 : A(2).n), A(2).p);
	} else if (eq(A(1), "resetstat") && ARGC == 2) {
		memset(&srv.st, 0, sizeof srv.st);
		srv.db->st.expired = 0;
		reply_ok(c);
	} else if (eq(A(1), "get") || eq(A(1), "set") || eq(A(1), "resetstat")) {
		reply_sub_arity(c, "config");
	} else {
		reply_sub_unknown(c, "CONFIG");
	}
}

/* ---- DEBUG ------------------------------------------------------------ */

static void cmd_debug(struct conn *c)
{
	if (!srv.cfg.enable_debug) {
		reply_error(c, "ERR DEBUG command not allowed. If the enable-debug-command option is set to \"local\", "
			       "you can run it from a local connection, otherwise you need to set this "
			       "option in the configuration file, and then restart the server.");
		return;
	}
	if (eq(A(1), "segfault")) {
		rkv_log("debug", "\"what\":\"segfault\"");
		volatile int *volatile bad = NULL;
		*bad = 1; /* outside any unsafe region: the restart goes warm */
	} else if (eq(A(1), "assert")) {
		rkv_log("debug", "\"what\":\"assert\"");
		abort();
	} else if (eq(A(1), "crash-in-mutation") && ARGC == 3) {
		rkv_log("debug", "\"what\":\"crash-in-mutation\"");
		ks_crash_in_mutation(srv.db, A(2).p, A(2).n);
	} else if (eq(A(1), "crash-after-alloc") && ARGC == 3) {
		/* for tests/test_errvirt.py: a request that faults after a checked
		 * allocation, whose error path replies an error (no log line
		 * first: its write would end the recoverable window) */
		char *copy = malloc(A(2).n + 1);
		if (!copy) {
			reply_error(c, "ERR out of memory");
			return;
		}
		memcpy(copy, A(2).p, A(2).n);
		volatile int *volatile bad = NULL;
		*bad = 1;
		reply_bulk(c, copy, A(2).n);
		free(copy);
	} else if (eq(A(1), "sleep") && ARGC == 3) {
		char v[64];
		snprintf(v, sizeof v, "%.*s", (int)(A(2).n < 63 ? A(2).n : 63), A(2).p);
		double s = strtod(v, NULL);
		if (s > 0 && isfinite(s)) {
			struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
			while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
				;
		}
		reply_ok(c);
	} else {
		reply_sub_unknown(c, "DEBUG");
	}
}

/* ---- table and dispatch ------------------------------------------------- */

static const struct command commands[] = {
	{"get", cmd_get, 2, 0, 1, 1, 1},
	{"set", cmd_set, -3, CMD_DENYOOM | CMD_WRITE, 1, 1, 1},
	{"setnx", cmd_setnx, 3, CMD_DENYOOM | CMD_WRITE, 1, 1, 1},
	{"setex", cmd_setex, 4, CMD_DENYOOM | CMD_WRITE, 1, 1, 1},
	{"psetex", cmd_psetex, 4, CMD_DENYOOM | CMD_WRITE, 1, 1, 1},
	{"getset", cmd_getset, 3, CMD_DENYOOM | CMD_WRITE, 1, 1, 1},
	{"getdel", cmd_getdel, 2, CMD_WRITE, 1, 1, 1},
	{"mget", cmd_mget, -2, 0, 1, -1, 1},
	{"mset", cmd_mset, -3, CMD_DENYOOM | CMD_WRITE, 1, -1, 2},
	{"incr", cmd_incr, 2, CMD_DENYOOM | CMD_WRITE, 1, 1, 1},
	{"decr", cmd_decr, 2, CMD_DENYOOM | CMD_WRITE, 1, 1, 1},
	{"incrby", cmd_incrby, 3, CMD_DENYOOM | CMD_WRITE, 1, 1, 1},
	{"decrby", cmd_decrby, 3, CMD_DENYOOM | CMD_WRITE, 1, 1, 1},
	{"append", cmd_append, 3, CMD_DENYOOM | CMD_WRITE, 1, 1, 1},
	{"strlen", cmd_strlen, 2, 0, 1, 1, 1},
	{"type", cmd_type, 2, 0, 1, 1, 1},
	{"del", cmd_del, -2, CMD_WRITE, 1, -1, 1},
	{"unlink", cmd_del, -2, CMD_WRITE, 1, -1, 1},
	{"exists", cmd_exists, -2, 0, 1, -1, 1},
	{"expire", cmd_expire, -3, CMD_WRITE, 1, 1, 1},
	{"pexpire", cmd_pexpire, -3, CMD_WRITE, 1, 1, 1},
	{"expireat", cmd_expireat, -3, CMD_WRITE, 1, 1, 1},
	{"pexpireat", cmd_pexpireat, -3, CMD_WRITE, 1, 1, 1},
	{"ttl", cmd_ttl, 2, 0, 1, 1, 1},
	{"pttl", cmd_pttl, 2, 0, 1, 1, 1},
	{"persist", cmd_persist, 2, CMD_WRITE, 1, 1, 1},
	{"keys", cmd_keys, 2, 0, 0, 0, 0},
	{"scan", cmd_scan, -2, 0, 0, 0, 0},
	{"dbsize", cmd_dbsize, 1, 0, 0, 0, 0},
	{"flushall", cmd_flushall, -1, CMD_WRITE, 0, 0, 0},
	{"flushdb", cmd_flushall, -1, CMD_WRITE, 0, 0, 0},
	{"ping", cmd_ping, -1, CMD_LOADING | CMD_NO_DATA, 0, 0, 0},
	{"echo", cmd_echo, 2, CMD_NO_DATA, 0, 0, 0},
	{"select", cmd_select, 2, CMD_LOADING | CMD_NO_DATA, 0, 0, 0},
	{"quit", cmd_quit, -1, CMD_LOADING | CMD_NO_DATA, 0, 0, 0},
	{"info", cmd_info, -1, CMD_LOADING, 0, 0, 0},
	{"config", cmd_config, -2, CMD_LOADING | CMD_NO_DATA, 0, 0, 0},
	{"command", cmd_command, -1, CMD_LOADING | CMD_NO_DATA, 0, 0, 0},
	{"client", cmd_client, -2, CMD_LOADING | CMD_NO_DATA, 0, 0, 0},
	{"hello", cmd_hello, -1, CMD_LOADING | CMD_NO_DATA, 0, 0, 0},
	{"save", cmd_save, 1, 0, 0, 0, 0},
	{"bgsave", cmd_bgsave, -1, 0, 0, 0, 0},
	{"lastsave", cmd_lastsave, 1, CMD_LOADING, 0, 0, 0},
	{"shutdown", cmd_shutdown, -1, CMD_LOADING, 0, 0, 0},
	{"time", cmd_time, 1, CMD_LOADING | CMD_NO_DATA, 0, 0, 0},
	{"debug", cmd_debug, -2, 0, 0, 0, 0},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

/* Open addressing on the lower-case name: one short hash per request
 * instead of strcasecmp against every command. */
#define SLOTS 256
static const struct command *slots[SLOTS];

static unsigned name_hash(const char *s, size_t n)
{
	unsigned h = 2166136261u;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)(s[i] | 0x20)) * 16777619u;
	return h;
}

void commands_init(void)
{
	for (size_t i = 0; i < NCOMMANDS; i++) {
		unsigned h = name_hash(commands[i].name, strlen(commands[i].name));
		while (slots[h % SLOTS])
			h++;
		slots[h % SLOTS] = &commands[i];
	}
}

static const struct command *find_command(struct arg name)
{
	for (unsigned h = name_hash(name.p, name.n);; h++) {
		const struct command *cmd = slots[h % SLOTS];
		if (!cmd)
			return NULL;
		if (eq(name, cmd->name))
			return cmd;
	}
}

static void cmd_command(struct conn *c)
{
	if (ARGC == 2 && eq(A(1), "count"))
		reply_int(c, (long long)NCOMMANDS);
	else if (ARGC > 2 && eq(A(1), "count"))
		reply_sub_arity(c, "command");
	else if (ARGC >= 2 && eq(A(1), "docs"))
		reply_map(c, 0); /* no docs: redis-cli copes */
	else
		reply_array(c, 0);
}

bool command_reads_no_data(const struct command *cmd) { return cmd && (cmd->flags & CMD_NO_DATA); }

bool command_keys(const struct command *cmd, int argc, struct key_range *r)
{
	if (!cmd || !cmd->first || argc <= cmd->first)
		return false;
	r->first = cmd->first;
	r->last = cmd->last < 0 ? argc + cmd->last : cmd->last;
	r->step = cmd->step;
	return r->last >= r->first && r->last < argc;
}

const struct command *command_exec(struct conn *c)
{
	const struct command *cmd = find_command(A(0));
	srv.st.commands++;
	c->redo_at = 0;
	if (!cmd) {
		char args[160];
		size_t len = 0;
		args[0] = 0;
		for (int i = 1; i < ARGC && len < 128; i++)
			len += (size_t)snprintf(args + len, sizeof args - len, "'%.*s' ",
						(int)(A(i).n < 128 - len ? A(i).n : 128 - len), A(i).p);
		reply_errorf(c, "ERR unknown command '%.*s', with args beginning with: %s",
			     (int)(A(0).n > 128 ? 128 : A(0).n), A(0).p, args);
		return NULL;
	}
	if ((cmd->arity > 0 && ARGC != cmd->arity) || ARGC < -cmd->arity) {
		reply_errorf(c, "ERR wrong number of arguments for '%s' command", cmd->name);
		return NULL;
	}
	/* a replayed write was accepted when it ran (keys expired since may still
	 * count here: their deletion by the expiry cycle is not logged) */
	if ((cmd->flags & CMD_DENYOOM) && srv.cfg.maxmemory && srv.db->mem > srv.cfg.maxmemory &&
	    !durability_replaying) {
		reply_over_maxmemory(c);
		return NULL;
	}
	if ((cmd->flags & CMD_WRITE) && durability_logging()) {
		/* the record before the change, in the change's region: a death
		 * in between neither keeps the one nor replays the other */
		UNSAFE_BEGIN();
		c->redo_at = durability_log_command(c);
		cmd->fn(c);
		UNSAFE_END();
		return cmd;
	}
	cmd->fn(c);
	return cmd;
}
