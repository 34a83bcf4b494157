/* keyspace.c - the hash table of rkv: chained buckets (power of two),
 * entries holding key and value in one allocation, absolute expiry times,
 * lazy and active expiry, SCAN, glob patterns.
 *
 * Every object here comes from store_alloc (the arena "keyspace" in the
 * Rekindle build) and every change happens between UNSAFE_BEGIN and
 * UNSAFE_END: a fault in the middle leaves a half-changed table, so the
 * restart must go cold.  Reads need no region. */
#include "rkv.h"
#include "store.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define INIT_BUCKETS 16u

/* ---- wyhash (final version 4, written from the published algorithm) ---- */

static inline uint64_t wymix(uint64_t a, uint64_t b)
{
	__uint128_t r = (__uint128_t)a * b;
	return (uint64_t)r ^ (uint64_t)(r >> 64);
}
static inline uint64_t wyr8(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}
static inline uint64_t wyr4(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}
static inline uint64_t wyr3(const uint8_t *p, size_t k)
{
	return ((uint64_t)p[0] << 16) | ((uint64_t)p[k >> 1] << 8) | p[k - 1];
}

static uint64_t wyhash(const void *key, size_t len, uint64_t seed)
{
	static const uint64_t s[4] = {0xa0761d6478bd642full, 0xe7037ed1a0b428dbull, 0x8ebc6af09c88c6e3ull,
				      0x589965cc75374cc3ull};
	const uint8_t *p = key;
	uint64_t a, b;
	seed ^= wymix(seed ^ s[0], s[1]);
	if (len <= 16) {
		if (len >= 4) {
			a = (wyr4(p) << 32) | wyr4(p + ((len >> 3) << 2));
			b = (wyr4(p + len - 4) << 32) | wyr4(p + len - 4 - ((len >> 3) << 2));
		} else if (len > 0) {
			a = wyr3(p, len);
			b = 0;
		} else {
			a = b = 0;
		}
	} else {
		size_t i = len;
		if (i > 48) {
			uint64_t see1 = seed, see2 = seed;
			do {
				seed = wymix(wyr8(p) ^ s[1], wyr8(p + 8) ^ seed);
				see1 = wymix(wyr8(p + 16) ^ s[2], wyr8(p + 24) ^ see1);
				see2 = wymix(wyr8(p + 32) ^ s[3], wyr8(p + 40) ^ see2);
				p += 48;
				i -= 48;
			} while (i > 48);
			seed ^= see1 ^ see2;
		}
		while (i > 16) {
			seed = wymix(wyr8(p) ^ s[1], wyr8(p + 8) ^ seed);
			i -= 16;
			p += 16;
		}
		a = wyr8(p + i - 16);
		b = wyr8(p + i - 8);
	}
	a ^= s[1];
	b ^= seed;
	__uint128_t r = (__uint128_t)a * b;
	return wymix((uint64_t)r ^ s[0] ^ len, (uint64_t)(r >> 64) ^ s[1]);
}

uint64_t ks_hash(const struct db *db, const char *k, size_t n)
{
	return wyhash(k, n, db->seed);
}

/* ---- entries -------------------------------------------------------- */

static inline size_t entry_bytes(const struct entry *e)
{
	return sizeof *e + e->cap;
}

static struct entry *entry_new(struct db *db, uint64_t h, const char *k, size_t kn, size_t room)
{
	struct entry *e = store_alloc(sizeof *e + kn + room);
	if (!e)
		return NULL;
	size_t cap = store_usable(e) - sizeof *e;
	memset(e, 0, sizeof *e);
	e->cap = cap > UINT32_MAX ? UINT32_MAX : (uint32_t)cap;
	e->hash = h;
	e->klen = (uint32_t)kn;
	memcpy(e->data, k, kn);
	db->mem += entry_bytes(e);
	return e;
}

/* A value fits in place if it is not much smaller than the block either:
 * a small value must not pin a large block. */
static inline bool entry_fits(const struct entry *e, size_t vn)
{
	size_t need = e->klen + vn;
	return need <= e->cap && (need >= e->cap / 2 || e->cap <= 64);
}

/* After a warm restart, a chain the check has not reached is checked
 * before it is walked: it may be a cycle, or hold a broken entry. */
static struct entry **find_link(struct db *db, const char *k, size_t kn, uint64_t h)
{
	if ((h & db->mask) >= glue_unchecked)
		glue_check_bucket(db, h & db->mask);
	struct entry **l = &db->buckets[h & db->mask];
	for (struct entry *e; (e = *l) != NULL; l = &e->next)
		if (e->hash == h && e->klen == kn && memcmp(e->data, k, kn) == 0)
			return l;
	return NULL;
}

static void xlist_add(struct db *db, struct entry *e)
{
	e->xprev = NULL;
	e->xnext = db->xhead;
	if (db->xhead)
		db->xhead->xprev = e;
	db->xhead = e;
	db->expires++;
}

static void xlist_del(struct db *db, struct entry *e)
{
	if (db->xcursor == e)
		db->xcursor = e->xnext;
	if (e->xprev)
		e->xprev->xnext = e->xnext;
	else
		db->xhead = e->xnext;
	if (e->xnext)
		e->xnext->xprev = e->xprev;
	e->xprev = e->xnext = NULL;
	db->expires--;
}

/* Puts n where o was, in its bucket chain and in the TTL list, and frees o. */
static void entry_swap(struct db *db, struct entry **link, struct entry *o, struct entry *n)
{
	n->next = o->next;
	n->expire_ms = o->expire_ms;
	if (o->expire_ms) {
		n->xprev = o->xprev;
		n->xnext = o->xnext;
		if (o->xprev)
			o->xprev->xnext = n;
		else
			db->xhead = n;
		if (o->xnext)
			o->xnext->xprev = n;
		if (db->xcursor == o)
			db->xcursor = n;
	}
	*link = n;
	db->mem -= entry_bytes(o);
	store_free(o);
}

static void entry_remove(struct db *db, struct entry **link)
{
	struct entry *e = *link;
	*link = e->next;
	if (e->expire_ms)
		xlist_del(db, e);
	db->count--;
	db->dirty++;
	db->mem -= entry_bytes(e);
	store_free(e);
}

static inline bool expired(const struct entry *e, int64_t now)
{
	return e->expire_ms && e->expire_ms < now; /* Redis: alive while now <= when */
}

/* ---- table ------------------------------------------------------------ */

struct db *ks_create(void)
{
	UNSAFE_BEGIN();
	struct db *db = store_alloc(sizeof *db);
	if (!db)
		goto out;
	memset(db, 0, sizeof *db);
	db->buckets = store_alloc(INIT_BUCKETS * sizeof *db->buckets);
	if (!db->buckets) {
		store_free(db);
		db = NULL;
		goto out;
	}
	memset(db->buckets, 0, INIT_BUCKETS * sizeof *db->buckets);
	db->mask = INIT_BUCKETS - 1;
	db->mem = store_usable(db->buckets);
	/* A random seed keeps chains short against chosen keys; it is stored
	 * with the table because the entries' hashes depend on it. */
	if (getrandom(&db->seed, sizeof db->seed, GRND_NONBLOCK) != sizeof db->seed)
		db->seed = (uint64_t)now_realtime_ms() * 0x9e3779b97f4a7c15ull;
	db->bgsave_ok = 1;
	db->last_save_s = now_realtime_ms() / 1000;
	db->magic = RKV_DB_MAGIC;
out:
	UNSAFE_END();
	return db;
}

/* Stop-the-world doubling at load factor 1 (inside the caller's region).
 * An allocation failure only leaves the chains longer. */
static void maybe_grow(struct db *db)
{
	if (db->count <= db->mask + 1)
		return;
	glue_verify_all(db); /* every chain is walked: all of them checked first */
	uint64_t nb = (db->mask + 1) * 2;
	struct entry **nbk = store_alloc(nb * sizeof *nbk);
	if (!nbk)
		return;
	memset(nbk, 0, nb * sizeof *nbk);
	for (uint64_t b = 0; b <= db->mask; b++) {
		struct entry *e = db->buckets[b], *next;
		for (; e; e = next) {
			next = e->next;
			e->next = nbk[e->hash & (nb - 1)];
			nbk[e->hash & (nb - 1)] = e;
		}
	}
	struct entry **old = db->buckets;
	db->mem += store_usable(nbk);
	db->mem -= store_usable(old);
	db->buckets = nbk;
	db->mask = nb - 1;
	store_free(old);
}

struct entry *ks_lookup(struct db *db, const char *k, size_t kn, int64_t now)
{
	struct entry **l = find_link(db, k, kn, ks_hash(db, k, kn));
	if (!l)
		return NULL;
	if (expired(*l, now)) {
		UNSAFE_BEGIN();
		entry_remove(db, l);
		db->st.expired++;
		UNSAFE_END();
		return NULL;
	}
	return *l;
}

struct entry *ks_set(struct db *db, const char *k, size_t kn, const char *v, size_t vn, int64_t expire_ms)
{
	uint64_t h = ks_hash(db, k, kn);
	struct entry *e;
	UNSAFE_BEGIN();
	struct entry **l = find_link(db, k, kn, h);
	if (l && entry_fits(*l, vn)) {
		e = *l;
	} else if (l) {
		e = entry_new(db, h, k, kn, vn);
		if (!e)
			goto out;
		entry_swap(db, l, *l, e);
	} else {
		e = entry_new(db, h, k, kn, vn);
		if (!e)
			goto out;
		struct entry **b = &db->buckets[h & db->mask];
		e->next = *b;
		*b = e;
		db->count++;
		maybe_grow(db);
	}
	memcpy(e->data + kn, v, vn);
	e->vlen = (uint32_t)vn;
	if (expire_ms >= 0)
		ks_set_expire(db, e, expire_ms);
	db->dirty++;
out:
	UNSAFE_END();
	if (!e)
		errno = ENOMEM;
	return e;
}

struct entry *ks_set_value(struct db *db, struct entry *e, const char *v1, size_t n1, const char *v2, size_t n2)
{
	size_t vn = n1 + n2;
	UNSAFE_BEGIN();
	if (entry_fits(e, vn)) {
		memmove(e->data + e->klen, v1, n1); /* v1 may be e's own value */
		memcpy(e->data + e->klen + n1, v2, n2);
	} else {
		/* Room to grow, like sds: APPEND in a loop stays linear. */
		size_t room = vn < (1u << 20) ? vn * 2 : vn + (1u << 20);
		struct entry *n = entry_new(db, e->hash, e->data, e->klen, room);
		if (!n) {
			e = NULL;
			goto out;
		}
		memcpy(n->data + n->klen, v1, n1);
		memcpy(n->data + n->klen + n1, v2, n2);
		entry_swap(db, find_link(db, e->data, e->klen, e->hash), e, n);
		e = n;
	}
	e->vlen = (uint32_t)vn;
	db->dirty++;
out:
	UNSAFE_END();
	if (!e)
		errno = ENOMEM;
	return e;
}

void ks_txn_begin(struct db *db)
{
	(void)db;
	UNSAFE_BEGIN();
}

void ks_txn_end(struct db *db)
{
	(void)db;
	UNSAFE_END();
}

bool ks_del(struct db *db, const char *k, size_t kn)
{
	struct entry **l = find_link(db, k, kn, ks_hash(db, k, kn));
	if (!l)
		return false;
	UNSAFE_BEGIN();
	entry_remove(db, l);
	UNSAFE_END();
	return true;
}

void ks_set_expire(struct db *db, struct entry *e, int64_t expire_ms)
{
	UNSAFE_BEGIN();
	if (expire_ms && !e->expire_ms)
		xlist_add(db, e);
	else if (!expire_ms && e->expire_ms)
		xlist_del(db, e);
	e->expire_ms = expire_ms;
	db->dirty++;
	UNSAFE_END();
}

void ks_flush(struct db *db)
{
	glue_verify_all(db); /* every entry is freed: all of them checked first */
	UNSAFE_BEGIN();
	db->dirty += db->count;
	for (uint64_t b = 0; b <= db->mask; b++) {
		struct entry *e = db->buckets[b], *next;
		for (; e; e = next) {
			next = e->next;
			store_free(e);
		}
		db->buckets[b] = NULL;
	}
	/* back to a small table, if one can be had */
	struct entry **nbk = store_alloc(INIT_BUCKETS * sizeof *nbk);
	if (nbk) {
		memset(nbk, 0, INIT_BUCKETS * sizeof *nbk);
		store_free(db->buckets);
		db->buckets = nbk;
		db->mask = INIT_BUCKETS - 1;
	}
	db->mem = store_usable(db->buckets);
	db->count = db->expires = 0;
	db->xhead = db->xcursor = NULL;
	UNSAFE_END();
}

static int64_t mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000ll + ts.tv_nsec / 1000;
}

/* Like Redis's active expire cycle: look at a sample of the keys with a
 * TTL (walking the TTL list from where the last cycle stopped), delete the
 * expired ones, and go again while more than 25% of them had expired.  The
 * first sample is 20 keys, or 1/20 of the TTL keys up to 1000, so that each
 * is looked at within 2 s (20 ticks) unless there are more than 20000. */
void ks_active_expire(struct db *db, int64_t now, int64_t budget_us)
{
	int64_t t0 = mono_us();
	uint64_t want = db->expires / 20 < 20 ? 20 : db->expires / 20 > 1000 ? 1000 : db->expires / 20;
	for (;;) {
		uint64_t sampled = 0, gone = 0;
		uint64_t n = db->expires < want ? db->expires : want;
		UNSAFE_BEGIN();
		for (; sampled < n && db->expires; sampled++) {
			struct entry *e = db->xcursor ? db->xcursor : db->xhead;
			glue_check_ttl_entry(e); /* not reached through a checked chain */
			db->xcursor = e->xnext;
			if (expired(e, now)) {
				struct entry **l = find_link(db, e->data, e->klen, e->hash);
				if (!l || *l != e)
					glue_check_failed("an entry in the TTL list but not in the table");
				entry_remove(db, l);
				db->st.expired++;
				gone++;
			}
		}
		UNSAFE_END();
		if (gone * 4 <= sampled || mono_us() - t0 > budget_us)
			break;
		want = 20;
	}
}

static uint64_t rev64(uint64_t v)
{
	v = ((v >> 1) & 0x5555555555555555ull) | ((v & 0x5555555555555555ull) << 1);
	v = ((v >> 2) & 0x3333333333333333ull) | ((v & 0x3333333333333333ull) << 2);
	v = ((v >> 4) & 0x0f0f0f0f0f0f0f0full) | ((v & 0x0f0f0f0f0f0f0f0full) << 4);
	return __builtin_bswap64(v);
}

uint64_t ks_scan(struct db *db, uint64_t v, uint64_t count, int64_t now, void (*fn)(struct entry *, void *),
		 void *arg)
{
	uint64_t m = db->mask, found = 0, visits = count * 10;
	do {
		if ((v & m) >= glue_unchecked)
			glue_check_bucket(db, v & m);
		for (struct entry *e = db->buckets[v & m]; e; e = e->next)
			if (!expired(e, now)) {
				fn(e, arg);
				found++;
			}
		/* increment the reversed cursor: visits the buckets in an order
		 * that still covers every key after the table doubles */
		v |= ~m;
		v = rev64(v);
		v++;
		v = rev64(v);
	} while (v && --visits && found < count);
	return v;
}

/* ---- glob patterns (KEYS, SCAN MATCH, CONFIG GET) ------------------------ */

/* Does the class whose body starts at p[k] (just past '[') admit ch?  Sets
 * *next past its ']'.  Redis's rules: '^' first negates, \x is x, a-z
 * is a range (either order), and a class without ']' runs to the end of
 * the pattern.  Ranges compare as char, which is signed on x86-64, so that
 * a range across 0x7f/0x80 means what it means to Redis there. */
static bool class_admits(const char *p, size_t pn, size_t k, char ch, size_t *next)
{
	bool neg = k < pn && p[k] == '^', match = false;
	k += neg;
	while (k < pn && p[k] != ']') {
		if (p[k] == '\\' && k + 1 < pn) {
			match |= p[k + 1] == ch;
			k += 2;
		} else if (k + 2 < pn && p[k + 1] == '-') {
			signed char lo = (signed char)p[k], hi = (signed char)p[k + 2], c = (signed char)ch;
			match |= lo <= hi ? c >= lo && c <= hi : c >= hi && c <= lo;
			k += 3;
		} else {
			match |= p[k] == ch;
			k++;
		}
	}
	*next = k < pn ? k + 1 : pn;
	return match != neg;
}

/* Does the token at p[i] (anything but '*': '?', a class, \x or a plain
 * char) match ch?  Sets *next past the token.  A backslash that ends the
 * pattern stands for itself. */
static bool token_matches(const char *p, size_t pn, size_t i, char ch, size_t *next)
{
	if (p[i] == '?') {
		*next = i + 1;
		return true;
	}
	if (p[i] == '[')
		return class_admits(p, pn, i + 1, ch, next);
	if (p[i] == '\\' && i + 1 < pn)
		i++;
	*next = i + 1;
	return p[i] == ch;
}

/* The most work a match may take, in pattern bytes looked at: 64 per byte
 * of pattern and key, and 16 M more.  Ordinary patterns stay far below it
 * (a star then a plain char costs about one per key byte); a long pattern
 * that matches a long key almost everywhere, as "*" then 100 KB of "a"
 * against 200 KB of "a"s, would take about 10^10 (two minutes, the loop
 * blocked) and gives up after about 35 M: no match, as Redis answers for a
 * pattern nested deeper than 1000 stars. */
#define GLOB_WORK_PER_BYTE 64u
#define GLOB_WORK_MIN (16u << 20)

static void glob_gave_up(size_t pn, size_t sn, uint64_t work)
{
	static int64_t last_ms; /* 0: the first one is logged */
	static uint64_t quiet;
	int64_t now = now_realtime_ms();
	if (now - last_ms < 1000) {
		quiet++; /* one line a second at most: KEYS may give up on every key */
		return;
	}
	last_ms = now;
	rkv_log("glob_gave_up",
		"\"pattern_bytes\":%zu,\"key_bytes\":%zu,\"work\":%llu,\"answer\":\"no match\",\"not_logged\":%llu", pn,
		sn, (unsigned long long)work, (unsigned long long)quiet);
	quiet = 0;
}

void ks_glob_init(struct glob *g, const char *p, size_t pn)
{
	*g = (struct glob){.p = p, .pn = pn, .last_star = SIZE_MAX};
	for (size_t i = 0, next; i < pn; i = next) {
		if (p[i] == '*') {
			next = i + 1;
			g->last_star = next;
			g->tail_tokens = 0;
		} else {
			token_matches(p, pn, i, 0, &next);
			g->tail_tokens++;
		}
	}
}

/* Redis's glob: * ? [abc] [^a] [a-z] and \x.  Every token but '*' takes
 * one char, so only the last star needs remembering: on a mismatch, that
 * star takes one more char and the rest is tried again from there.  A
 * longer match of an earlier star could only start the rest later, which
 * the last star already covers.  And past the pattern's last star, the
 * rest takes a known number of chars: it can only match the end of the
 * string, where it is tried once ("*" then 100 KB of "a" against 200 KB of
 * "a"s took 10^10 steps).  O(pattern * string) steps, where the recursive
 * matcher this replaces took exponential time ("*a*a*a...b" against
 * "aaa...", the CVE-2022-36021 kind); at most about GLOB_WORK_MIN +
 * GLOB_WORK_PER_BYTE * (pattern + string), past which the string counts
 * as not matching.  Without a star to go back to, each token is looked at
 * once, so only the tries again are counted. */
bool ks_glob_match(const struct glob *g, const char *s, size_t sn)
{
	const char *p = g->p;
	size_t pn = g->pn, i = 0, j = 0, star_i = SIZE_MAX, star_j = 0;
	uint64_t work = 0, budget = GLOB_WORK_MIN + GLOB_WORK_PER_BYTE * ((uint64_t)pn + sn);
	if (sn == 0)
		return pn == 0; /* Redis: even "**" does not match an empty key */
	while (j < sn) {
		size_t next = i;
		if (i < pn && p[i] == '*') {
			while (i < pn && p[i] == '*')
				i++;
			star_i = i;
			star_j = j;
			if (i == g->last_star) { /* the rest takes the string's last chars */
				if (sn - j < g->tail_tokens)
					return false;
				j = sn - g->tail_tokens;
				star_i = SIZE_MAX; /* one try: no other place can do */
			}
			continue;
		}
		bool ok = i < pn && token_matches(p, pn, i, s[j], &next);
		work += next - i + 1; /* a class is read to its end, match or not */
		if (ok) {
			i = next;
			j++;
		} else if (star_i == SIZE_MAX) {
			return false;
		} else if (work > budget) {
			glob_gave_up(pn, sn, work);
			return false;
		} else {
			i = star_i;
			j = ++star_j;
		}
	}
	while (i < pn && p[i] == '*')
		i++;
	return i == pn;
}

bool ks_glob(const char *p, size_t pn, const char *s, size_t sn)
{
	struct glob g;
	ks_glob_init(&g, p, pn);
	return ks_glob_match(&g, s, sn);
}

void ks_crash_in_mutation(struct db *db, const char *k, size_t kn)
{
	uint64_t h = ks_hash(db, k, kn);
	UNSAFE_BEGIN();
	struct entry *e = entry_new(db, h, k, kn, 0);
	if (e) {
		/* linked into its bucket, but neither counted nor valued yet */
		struct entry **b = &db->buckets[h & db->mask];
		e->next = *b;
		*b = e;
	}
	volatile int *volatile bad = NULL;
	*bad = 1; /* SIGSEGV with the region open: the restart must go cold */
	UNSAFE_END();
}
