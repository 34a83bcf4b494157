/* log.c - one JSON line per runtime event on stderr, async-signal-safe:
 * fixed buffer, no stdio, no allocation, a single write(2). */
#include "rk_internal.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

size_t rk_strlcpy(char *dst, const char *src, size_t cap)
{
	size_t n = 0;
	if (cap == 0)
		return 0;
	while (src && src[n] && n + 1 < cap) {
		dst[n] = src[n];
		n++;
	}
	dst[n] = 0;
	return n;
}

size_t rk_strlcat(char *dst, const char *src, size_t cap)
{
	size_t n = strnlen(dst, cap);
	return n + rk_strlcpy(dst + n, src, cap - n);
}

size_t rk_fmt_u64(char *dst, uint64_t v)
{
	char tmp[24];
	size_t n = 0;
	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	for (size_t i = 0; i < n; i++)
		dst[i] = tmp[n - 1 - i];
	dst[n] = 0;
	return n;
}

static void put(struct rk_ev *e, const char *s, size_t n)
{
	if (e->len + n >= sizeof e->buf - 3) /* room for "}\n" */
		n = sizeof e->buf - 3 - e->len;
	memcpy(e->buf + e->len, s, n);
	e->len += n;
}

static void puts_(struct rk_ev *e, const char *s)
{
	put(e, s, strlen(s));
}

static void put_json_string(struct rk_ev *e, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	put(e, "\"", 1);
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\') {
			char esc[2] = {'\\', (char)c};
			put(e, esc, 2);
		} else if (c < 0x20) {
			char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
			put(e, esc, 6);
		} else {
			put(e, (const char *)&c, 1);
		}
	}
	put(e, "\"", 1);
}

static void key(struct rk_ev *e, const char *k)
{
	put(e, ",", 1);
	put_json_string(e, k);
	put(e, ":", 1);
}

void rk_ev_begin(struct rk_ev *e, const char *event)
{
	char num[24];
	e->len = 0;
	puts_(e, "{\"rekindle\":");
	put_json_string(e, event);
	key(e, "pid");
	puts_(e, (rk_fmt_u64(num, (uint64_t)getpid()), num));
	key(e, "t_ns");
	puts_(e, (rk_fmt_u64(num, rk_now_ns()), num));
}

void rk_ev_str(struct rk_ev *e, const char *k, const char *v)
{
	key(e, k);
	put_json_string(e, v);
}

void rk_ev_u64(struct rk_ev *e, const char *k, uint64_t v)
{
	char num[24];
	key(e, k);
	rk_fmt_u64(num, v);
	puts_(e, num);
}

void rk_ev_i64(struct rk_ev *e, const char *k, int64_t v)
{
	char num[24];
	key(e, k);
	if (v < 0) {
		put(e, "-", 1);
		v = -v;
	}
	rk_fmt_u64(num, (uint64_t)v);
	puts_(e, num);
}

void rk_ev_hex(struct rk_ev *e, const char *k, uint64_t v)
{
	static const char hex[] = "0123456789abcdef";
	char s[19] = "0x";
	int n = 2;
	bool started = false;
	for (int sh = 60; sh >= 0; sh -= 4) {
		unsigned d = (unsigned)(v >> sh) & 15;
		if (d || started || sh == 0) {
			s[n++] = hex[d];
			started = true;
		}
	}
	s[n] = 0;
	rk_ev_str(e, k, s);
}

void rk_ev_end(struct rk_ev *e)
{
	e->buf[e->len++] = '}';
	e->buf[e->len++] = '\n';
	if (rk_cfg.flags & RK_OPT_QUIET)
		return;
	size_t off = 0;
	while (off < e->len) {
		ssize_t w = write(STDERR_FILENO, e->buf + off, e->len - off);
		if (w <= 0)
			break; /* nothing sensible to do with a broken stderr */
		off += (size_t)w;
	}
}

/* What the kernel says about a fault (si_code): SEGV_PKUERR names a stray
 * write into a write-protected arena, SEGV_MAPERR a wild pointer, ... */
const char *rk_si_code_name(int sig, int code)
{
	if (code <= 0)
		return code == SI_USER ? "SI_USER" : code == SI_TKILL ? "SI_TKILL" : code == SI_QUEUE ? "SI_QUEUE" : "SI_OTHER";
	switch (sig) {
	case SIGSEGV:
		return code == SEGV_MAPERR ? "SEGV_MAPERR" : code == SEGV_ACCERR ? "SEGV_ACCERR"
		       : code == SEGV_PKUERR ? "SEGV_PKUERR" : "SEGV_OTHER";
	case SIGBUS:
		return code == BUS_ADRALN ? "BUS_ADRALN" : code == BUS_ADRERR ? "BUS_ADRERR"
		       : code == BUS_OBJERR ? "BUS_OBJERR" : "BUS_OTHER";
	case SIGFPE:
		return code == FPE_INTDIV ? "FPE_INTDIV" : code == FPE_INTOVF ? "FPE_INTOVF" : "FPE_OTHER";
	case SIGILL:
		return code == ILL_ILLOPC ? "ILL_ILLOPC" : code == ILL_ILLOPN ? "ILL_ILLOPN" : "ILL_OTHER";
	default:
		return "kernel";
	}
}

const char *rk_signame(int sig)
{
	switch (sig) {
	case SIGSEGV: return "SIGSEGV";
	case SIGBUS: return "SIGBUS";
	case SIGFPE: return "SIGFPE";
	case SIGILL: return "SIGILL";
	case SIGABRT: return "SIGABRT";
	case SIGKILL: return "SIGKILL";
	case SIGTERM: return "SIGTERM";
	default: return "signal";
	}
}
