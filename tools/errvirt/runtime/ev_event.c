/* ev_event.c - the run-time library's decisions as JSON lines on stderr
 * ({"rekindle_ev": kind, "reason": code, ...}), built without stdio: the
 * signal handler writes them too. */
#define _GNU_SOURCE
#include "ev_internal.h"

#include <unistd.h>

static void put(struct ev_line *l, const char *s)
{
	while (*s && l->n < sizeof l->buf - 3)
		l->buf[l->n++] = *s++;
}

static void put_u64(struct ev_line *l, uint64_t v, unsigned base)
{
	char tmp[24];
	int i = 0;
	do {
		tmp[i++] = "0123456789abcdef"[v % base];
		v /= base;
	} while (v);
	while (i > 0 && l->n < sizeof l->buf - 3)
		l->buf[l->n++] = tmp[--i];
}

void ev_line_begin(struct ev_line *l, const char *kind, const char *reason)
{
	l->n = 0;
	put(l, "{\"rekindle_ev\":\"");
	put(l, kind);
	put(l, "\"");
	ev_line_str(l, "reason", reason);
	ev_line_u64(l, "pid", (uint64_t)getpid());
}

void ev_line_str(struct ev_line *l, const char *key, const char *val)
{
	put(l, ",\"");
	put(l, key);
	put(l, "\":\"");
	put(l, val ? val : "");
	put(l, "\"");
}

void ev_line_u64(struct ev_line *l, const char *key, uint64_t v)
{
	put(l, ",\"");
	put(l, key);
	put(l, "\":");
	put_u64(l, v, 10);
}

void ev_line_hex(struct ev_line *l, const char *key, uint64_t v)
{
	put(l, ",\"");
	put(l, key);
	put(l, "\":\"0x");
	put_u64(l, v, 16);
	put(l, "\"");
}

void ev_line_end(struct ev_line *l)
{
	l->buf[l->n++] = '}';
	l->buf[l->n++] = '\n';
	/* one write: the line does not interleave with others */
	if (write(STDERR_FILENO, l->buf, l->n) < 0)
		return;
}
