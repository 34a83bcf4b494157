/* resp.c - RESP2 requests (multibulk and inline) in, replies out.
 *
 * The parser is incremental: a multibulk request may arrive in any number
 * of reads.  Arguments are kept as offsets into the input buffer (it may be
 * moved or grown while a request is incomplete) and turned into pointers
 * once the request is whole, so commands read them in place: no copy and no
 * allocation per request. */
#include "rkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MULTIBULK (1024 * 1024) /* Redis: invalid multibulk length above */
#define MAX_INLINE (64 * 1024)      /* Redis: PROTO_INLINE_MAX_SIZE */

/* ---- replies ---------------------------------------------------------- */

bool out_reserve(struct conn *c, size_t n)
{
	if (c->ocap - c->olen >= n)
		return true;
	if (c->opos > 0 && c->opos == c->olen) {
		c->opos = c->olen = 0;
		if (c->ocap >= n)
			return true;
	}
	size_t cap = c->ocap ? c->ocap : 16384;
	while (cap - c->olen < n)
		cap *= 2;
	char *p = realloc(c->obuf, cap);
	if (!p) {
		c->closing = true; /* no memory for the reply: drop the client */
		return false;
	}
	c->obuf = p;
	c->ocap = cap;
	return true;
}

void reply_raw(struct conn *c, const char *p, size_t n)
{
	if (!out_reserve(c, n))
		return;
	memcpy(c->obuf + c->olen, p, n);
	c->olen += n;
}

/* Writes v in decimal at p; returns the length. */
static size_t fmt_ll(char *p, long long v)
{
	char tmp[24];
	unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
	size_t n = 0, len = 0;
	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	if (v < 0)
		p[len++] = '-';
	while (n)
		p[len++] = tmp[--n];
	return len;
}

static void reply_prefixed(struct conn *c, char type, long long v)
{
	if (!out_reserve(c, 24))
		return;
	char *p = c->obuf + c->olen;
	p[0] = type;
	size_t n = 1 + fmt_ll(p + 1, v);
	p[n++] = '\r';
	p[n++] = '\n';
	c->olen += n;
}

void reply_int(struct conn *c, long long v) { reply_prefixed(c, ':', v); }
void reply_array(struct conn *c, long long n) { reply_prefixed(c, '*', n); }
void reply_nil(struct conn *c)
{
	if (c->proto == 3)
		reply_raw(c, "_\r\n", 3);
	else
		reply_raw(c, "$-1\r\n", 5);
}

void reply_map(struct conn *c, long long pairs)
{
	if (c->proto == 3)
		reply_prefixed(c, '%', pairs);
	else
		reply_prefixed(c, '*', pairs * 2);
}

void reply_bulk(struct conn *c, const char *s, size_t n)
{
	if (!out_reserve(c, n + 26))
		return;
	reply_prefixed(c, '$', (long long)n);
	memcpy(c->obuf + c->olen, s, n);
	c->obuf[c->olen + n] = '\r';
	c->obuf[c->olen + n + 1] = '\n';
	c->olen += n + 2;
}

/* Status and error texts must not hold CR or LF (Redis replaces them). */
static void reply_line(struct conn *c, char type, const char *s)
{
	size_t n = strlen(s);
	if (!out_reserve(c, n + 3))
		return;
	char *p = c->obuf + c->olen;
	p[0] = type;
	for (size_t i = 0; i < n; i++)
		p[1 + i] = s[i] == '\r' || s[i] == '\n' ? ' ' : s[i];
	p[n + 1] = '\r';
	p[n + 2] = '\n';
	c->olen += n + 3;
}

void reply_status(struct conn *c, const char *s) { reply_line(c, '+', s); }
void reply_error(struct conn *c, const char *s) { reply_line(c, '-', s); }

void reply_errorf(struct conn *c, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	reply_line(c, '-', buf);
}

/* ---- requests --------------------------------------------------------- */

static int protocol_error(struct conn *c, const char *what)
{
	reply_errorf(c, "ERR Protocol error: %s", what);
	rkv_log("protocol_error", "\"client\":%llu,\"error\":%s", (unsigned long long)c->id, js(what));
	c->close_after_reply = true;
	return PARSE_ERROR;
}

/* Redis's string2ll for the lengths: digits only, optional '-'. */
static bool parse_len(const char *p, size_t n, long long *out)
{
	bool neg = n > 0 && p[0] == '-';
	size_t i = neg;
	unsigned long long v = 0;
	if (i == n || n - i > 18)
		return false;
	for (; i < n; i++) {
		if (p[i] < '0' || p[i] > '9')
			return false;
		v = v * 10 + (unsigned long long)(p[i] - '0');
	}
	*out = neg ? -(long long)v : (long long)v;
	return true;
}

static bool push_arg(struct conn *c, size_t off, size_t len)
{
	if (c->argc == c->argcap) {
		size_t cap = c->argcap ? c->argcap * 2 : 16;
		size_t *o = realloc(c->argoff, cap * sizeof *o);
		if (o)
			c->argoff = o;
		size_t *l = realloc(c->arglen, cap * sizeof *l);
		if (l)
			c->arglen = l;
		struct arg *a = realloc(c->argv, cap * sizeof *a);
		if (a)
			c->argv = a;
		if (!o || !l || !a) {
			c->closing = true;
			return false;
		}
		c->argcap = cap;
	}
	c->argoff[c->argc] = off;
	c->arglen[c->argc++] = len;
	return true;
}

/* Splits an inline line in place, with Redis's quoting: "..." with \n \r
 * \t \b \a \\ \" \xHH escapes, '...' with \'.  Unquoted words point into
 * the line; quoted ones are unescaped where they stand (never longer). */
static int parse_inline(struct conn *c, size_t start, size_t end)
{
	char *b = c->ibuf;
	size_t i = start;
	for (;;) {
		while (i < end && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r'))
			i++;
		if (i == end)
			return PARSE_COMMAND;
		size_t w = i; /* write position of the unescaped word */
		size_t off = i;
		if (b[i] == '"' || b[i] == '\'') {
			char q = b[i++];
			bool closed = false;
			while (i < end) {
				char ch = b[i];
				if (ch == '\\' && q == '"' && i + 1 < end) {
					char e = b[i + 1];
					static const char *hex = "0123456789abcdef";
					const char *h1, *h2;
					if (e == 'x' && i + 3 < end && (h1 = strchr(hex, b[i + 2] | 0x20)) && b[i + 2] &&
					    (h2 = strchr(hex, b[i + 3] | 0x20)) && b[i + 3]) {
						ch = (char)((h1 - hex) * 16 + (h2 - hex));
						i += 4;
					} else {
						ch = e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : e == 'b' ? '\b'
							: e == 'a' ? '\a' : e;
						i += 2;
					}
				} else if (ch == '\\' && q == '\'' && i + 1 < end && b[i + 1] == '\'') {
					ch = '\'';
					i += 2;
				} else if (ch == q) {
					i++;
					closed = true;
					break;
				} else {
					i++;
				}
				b[w++] = ch;
			}
			/* the closing quote must end the word */
			if (!closed || (i < end && b[i] != ' ' && b[i] != '\t' && b[i] != '\r'))
				return protocol_error(c, "unbalanced quotes in request");
		} else {
			while (i < end && b[i] != ' ' && b[i] != '\t' && b[i] != '\r')
				i++;
			w = i;
		}
		if (!push_arg(c, off, w - off))
			return PARSE_ERROR;
	}
}

int resp_parse(struct conn *c)
{
	while (c->mb_left == 0) {
		if (c->ipos >= c->ilen)
			return PARSE_NEED_MORE;
		char *p = c->ibuf + c->ipos;
		size_t avail = c->ilen - c->ipos;
		char *nl = memchr(p, '\n', avail);
		if (*p != '*') {
			if (!nl)
				return avail > MAX_INLINE ? protocol_error(c, "too big inline request") : PARSE_NEED_MORE;
			size_t start = c->ipos, end = (size_t)(nl - c->ibuf);
			c->ipos = end + 1;
			c->argc = 0;
			int r = parse_inline(c, start, end);
			if (r != PARSE_COMMAND)
				return r;
			if (c->argc == 0)
				continue; /* empty line: ignored, like Redis */
			goto done;
		}
		if (!nl)
			return avail > MAX_INLINE ? protocol_error(c, "too big mbulk count string") : PARSE_NEED_MORE;
		long long n;
		size_t len = (size_t)(nl - p);
		if (len < 2 || p[len - 1] != '\r' || !parse_len(p + 1, len - 2, &n) || n > MAX_MULTIBULK)
			return protocol_error(c, "invalid multibulk length");
		c->req_start = c->ipos;
		c->ipos += len + 1;
		if (n <= 0)
			continue; /* *0 and *-1 are no request */
		c->mb_left = (long)n;
		c->bulk_len = -1;
		c->argc = 0;
	}
	while (c->mb_left > 0) {
		if (c->bulk_len < 0) {
			char *p = c->ibuf + c->ipos;
			size_t avail = c->ilen - c->ipos;
			if (avail == 0)
				return PARSE_NEED_MORE;
			if (*p != '$') {
				char what[64];
				snprintf(what, sizeof what, "expected '$', got '%c'", *p);
				return protocol_error(c, what);
			}
			char *nl = memchr(p, '\n', avail);
			if (!nl)
				return avail > MAX_INLINE ? protocol_error(c, "too big bulk count string")
							  : PARSE_NEED_MORE;
			long long n;
			size_t len = (size_t)(nl - p);
			if (len < 2 || p[len - 1] != '\r' || !parse_len(p + 1, len - 2, &n) || n < 0 ||
			    n > RKV_MAX_BULK)
				return protocol_error(c, "invalid bulk length");
			c->ipos += len + 1;
			c->bulk_len = (long)n;
		}
		if (c->ilen - c->ipos < (size_t)c->bulk_len + 2)
			return PARSE_NEED_MORE;
		if (!push_arg(c, c->ipos, (size_t)c->bulk_len))
			return PARSE_ERROR;
		c->ipos += (size_t)c->bulk_len + 2;
		c->bulk_len = -1;
		c->mb_left--;
	}
done:
	for (size_t i = 0; i < c->argc; i++) {
		c->argv[i].p = c->ibuf + c->argoff[i];
		c->argv[i].n = c->arglen[i];
	}
	return PARSE_COMMAND;
}

void resp_done(struct conn *c)
{
	c->argc = 0;
}
