/* leaderboard_plain - a small leaderboard server on plain malloc: the
 * "before" of docs/porting.md.  leaderboard.c is the same server ported to
 * Rekindle; `diff leaderboard_plain.c leaderboard.c` is the port.
 *
 *   leaderboard_plain [--port N]       (default 7070, on 127.0.0.1)
 *
 * One command per line over TCP, one reply per command:
 *   score NAME POINTS   adds POINTS (may be negative) to NAME's total -> "NAME TOTAL"
 *   get NAME            -> "NAME TOTAL", or "ERR no such player"
 *   top N               the N best (1..100): "RANK NAME TOTAL" lines, then "END"
 *   players             -> how many players there are
 *   crash               a NULL pointer write (what a bug does)
 *   crash-in-update     the same, halfway through a score update
 * NAME is 1 to 31 characters without spaces.  Errors start with "ERR".
 *
 * The state: every player in a hash table by name (chained, doubled as it
 * fills) and in a skip list ordered by total, highest first, ties by name. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define NAME_LEN 31
#define LEVELS 12 /* skip list levels: enough for 16M players (p = 1/4) */

struct player {
	struct player *chain; /* next in its hash bucket */
	int64_t total;
	char name[NAME_LEN + 1];
	int levels;
	struct player *next[]; /* skip list: the next player at each level */
};

struct board {
	uint64_t count, nbuckets;
	struct player **buckets;
	struct player *head[LEVELS]; /* skip list: the first player at each level */
};

static struct board *board;
static volatile int *volatile nowhere; /* NULL: the crash commands write to it */

static uint64_t hash(const char *s)
{
	uint64_t h = 14695981039346656037ull; /* FNV-1a */
	while (*s)
		h = (h ^ (unsigned char)*s++) * 1099511628211ull;
	return h;
}

static struct player *find(const char *name)
{
	struct player *p = board->buckets[hash(name) & (board->nbuckets - 1)];
	while (p && strcmp(p->name, name))
		p = p->chain;
	return p;
}

/* True when p ranks before a player with this total and name. */
static bool ranks_before(const struct player *p, int64_t total, const char *name)
{
	return p->total > total || (p->total == total && strcmp(p->name, name) < 0);
}

/* At each level, the link a player with this total and name goes after. */
static void find_links(int64_t total, const char *name, struct player **link[LEVELS])
{
	struct player **next = board->head;
	for (int l = LEVELS - 1; l >= 0; l--) {
		while (next[l] && ranks_before(next[l], total, name))
			next = next[l]->next;
		link[l] = &next[l];
	}
}

static void list_insert(struct player *p)
{
	struct player **link[LEVELS];
	find_links(p->total, p->name, link);
	for (int l = 0; l < p->levels; l++) {
		p->next[l] = *link[l];
		*link[l] = p;
	}
}

static void list_remove(struct player *p)
{
	struct player **link[LEVELS];
	find_links(p->total, p->name, link);
	for (int l = 0; l < p->levels; l++)
		*link[l] = p->next[l];
}

static int random_levels(void)
{
	static uint64_t x = 88172645463325252ull; /* xorshift64 */
	int n = 1;
	for (; n < LEVELS; n++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		if (x & 3)
			break;
	}
	return n;
}

static struct board *new_board(void)
{
	struct board *b = calloc(1, sizeof *b);
	if (!b || !(b->buckets = calloc(1024, sizeof *b->buckets)))
		return NULL;
	b->nbuckets = 1024;
	return b;
}

/* Doubles the hash table. */
static int grow(void)
{
	uint64_t n = board->nbuckets * 2;
	struct player **b = calloc(n, sizeof *b);
	if (!b)
		return -1;
	for (uint64_t i = 0; i < board->nbuckets; i++)
		for (struct player *p = board->buckets[i], *chain; p; p = chain) {
			chain = p->chain;
			p->chain = b[hash(p->name) & (n - 1)];
			b[hash(p->name) & (n - 1)] = p;
		}
	free(board->buckets);
	board->buckets = b;
	board->nbuckets = n;
	return 0;
}

/* Adds points to name's total (a new player starts at 0).  NULL: out of
 * memory.  crash_midway faults with the player out of the skip list. */
static struct player *add_points(const char *name, int64_t points, bool crash_midway)
{
	struct player *p = find(name);
	if (p) {
		list_remove(p);
	} else {
		if (board->count >= board->nbuckets && grow() < 0)
			return NULL;
		int levels = random_levels();
		if (!(p = calloc(1, sizeof *p + levels * sizeof p->next[0])))
			return NULL;
		strcpy(p->name, name);
		p->levels = levels;
		p->chain = board->buckets[hash(name) & (board->nbuckets - 1)];
		board->buckets[hash(name) & (board->nbuckets - 1)] = p;
		board->count++;
	}
	if (crash_midway)
		*nowhere = 1;
	p->total += points;
	list_insert(p);
	return p;
}

/* ---- the protocol ------------------------------------------------------- */

struct conn {
	int fd;
	size_t inlen, outlen, outcap;
	char *out;
	char in[4096];
};

static void reply(struct conn *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (c->outlen + n + 1 > c->outcap) {
		size_t cap = (c->outlen + n + 1) * 2;
		char *out = realloc(c->out, cap);
		if (!out)
			return;
		c->out = out, c->outcap = cap;
	}
	va_start(ap, fmt);
	c->outlen += vsnprintf(c->out + c->outlen, n + 1, fmt, ap);
	va_end(ap);
}

static bool parse_int(const char *s, long long min, long long max, long long *out)
{
	char *end;
	errno = 0;
	*out = s ? strtoll(s, &end, 10) : 0;
	return s && *s && !*end && !errno && *out >= min && *out <= max;
}

static bool valid_name(const char *s)
{
	return s && strlen(s) <= NAME_LEN;
}

static void command(struct conn *c, char *line)
{
	char *save, *cmd = strtok_r(line, " ", &save);
	char *a = strtok_r(NULL, " ", &save), *b = strtok_r(NULL, " ", &save);
	bool more = strtok_r(NULL, " ", &save), crash = cmd && !strcmp(cmd, "crash-in-update");
	long long n;
	struct player *p;
	if (!cmd) {
		reply(c, "ERR empty line\n");
	} else if (!strcmp(cmd, "score") || crash) {
		if (!valid_name(a) || !parse_int(b, -1000000000, 1000000000, &n) || more) {
			reply(c, "ERR usage: score NAME POINTS\n");
			return;
		}
		p = add_points(a, n, crash);
		if (p)
			reply(c, "%s %lld\n", p->name, (long long)p->total);
		else
			reply(c, "ERR out of memory\n");
	} else if (!strcmp(cmd, "get") && valid_name(a) && !b) {
		if ((p = find(a)))
			reply(c, "%s %lld\n", p->name, (long long)p->total);
		else
			reply(c, "ERR no such player\n");
	} else if (!strcmp(cmd, "top") && parse_int(a, 1, 100, &n) && !b) {
		p = board->head[0];
		for (int rank = 1; p && rank <= n; rank++, p = p->next[0])
			reply(c, "%d %s %lld\n", rank, p->name, (long long)p->total);
		reply(c, "END\n");
	} else if (!strcmp(cmd, "players") && !a) {
		reply(c, "%llu\n", (unsigned long long)board->count);
	} else if (!strcmp(cmd, "crash") && !a) {
		*nowhere = 1;
	} else {
		reply(c, "ERR unknown command or bad arguments\n");
	}
}

/* Runs the lines c has sent and writes the replies.  A client that does
 * not read its replies is not read from until it does.  -1: close c. */
static int serve(struct conn *c, int ep)
{
	for (;;) {
		size_t done = 0;
		char *nl;
		while (c->outlen < (1u << 20) && (nl = memchr(c->in + done, '\n', c->inlen - done))) {
			*nl = 0;
			if (nl > c->in + done && nl[-1] == '\r')
				nl[-1] = 0;
			command(c, c->in + done);
			done = (size_t)(nl + 1 - c->in);
		}
		memmove(c->in, c->in + done, c->inlen -= done);
		if (c->inlen == sizeof c->in)
			return -1; /* a line too long */
		ssize_t w = c->outlen ? write(c->fd, c->out, c->outlen) : 0;
		if (w < 0 && errno != EAGAIN)
			return -1;
		if (w > 0)
			memmove(c->out, c->out + w, c->outlen -= (size_t)w);
		bool more = !c->outlen && memchr(c->in, '\n', c->inlen);
		if (!more) {
			struct epoll_event ev = {.events = c->outlen ? EPOLLOUT : EPOLLIN, .data.ptr = c};
			return epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
		}
	}
}

static void event(struct conn *c, uint32_t events, int ep)
{
	if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
		ssize_t r = read(c->fd, c->in + c->inlen, sizeof c->in - c->inlen);
		if (r <= 0 && !(r < 0 && errno == EAGAIN))
			goto close;
		c->inlen += r > 0 ? (size_t)r : 0;
	}
	if (serve(c, ep) == 0)
		return;
close:
	close(c->fd);
	free(c->out);
	free(c);
}

static int listen_socket(unsigned port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(fd, 128) < 0)
		return -1;
	return fd;
}

int main(int argc, char **argv)
{
	unsigned port = 7070;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--port") && i + 1 < argc)
			port = (unsigned)strtoul(argv[++i], NULL, 10);
		else
			return fprintf(stderr, "usage: %s [--port N]\n", argv[0]), 2;
	}
	board = new_board();
	if (!board)
		return fprintf(stderr, "leaderboard: out of memory\n"), 1;
	fprintf(stderr, "leaderboard: started empty\n");
	int lfd = listen_socket(port), ep = epoll_create1(EPOLL_CLOEXEC);
	if (lfd < 0 || ep < 0)
		return fprintf(stderr, "leaderboard: port %u: %s\n", port, strerror(errno)), 1;
	struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
	for (;;) {
		struct epoll_event ev[64];
		int n = epoll_wait(ep, ev, 64, -1);
		for (int i = 0; i < n; i++) {
			if (ev[i].data.ptr) {
				event(ev[i].data.ptr, ev[i].events, ep);
				continue;
			}
			int fd;
			while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
				struct conn *c = calloc(1, sizeof *c);
				struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
				if (!c || (c->fd = fd, epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev) < 0))
					close(fd), free(c);
			}
		}
	}
}
