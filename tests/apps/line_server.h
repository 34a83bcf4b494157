/* line_server.h - the small TCP server of the test apps: one command per
 * line, one reply per command, up to 16 clients, poll(2).  Header-only: each
 * app is one translation unit. */
#ifndef LINE_SERVER_H
#define LINE_SERVER_H

#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define LINE_SERVER_CLIENTS 16

/* Runs one command (the line without its newline); writes the reply. */
typedef void (*line_command_fn)(char *line, char *out, size_t cap);
/* Called at the top of every loop iteration: a safe point (the apps beat). */
typedef void (*line_tick_fn)(void);

/* The poll timeout between two ticks, in ms (-1: until something happens). */
static int line_server_poll_ms = 10;

static void line_server_run(int lfd, line_command_fn command, line_tick_fn tick)
{
	struct pollfd p[1 + LINE_SERVER_CLIENTS];
	char buf[LINE_SERVER_CLIENTS][256];
	size_t have[LINE_SERVER_CLIENTS] = {0};
	int n = 1;
	p[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
	for (;;) {
		tick();
		if (poll(p, (nfds_t)n, line_server_poll_ms) <= 0)
			continue;
		if ((p[0].revents & POLLIN) && n < 1 + LINE_SERVER_CLIENTS) {
			int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
			if (c >= 0) {
				have[n - 1] = 0;
				p[n++] = (struct pollfd){.fd = c, .events = POLLIN};
			}
		}
		for (int i = 1; i < n; i++) {
			if (!p[i].revents)
				continue;
			ssize_t r = read(p[i].fd, buf[i - 1] + have[i - 1], sizeof buf[0] - 1 - have[i - 1]);
			if (r <= 0) {
				close(p[i].fd);
				p[i] = p[--n];
				have[i - 1] = have[n - 1];
				memcpy(buf[i - 1], buf[n - 1], have[i - 1]);
				i--;
				continue;
			}
			have[i - 1] += (size_t)r;
			char *nl;
			while ((nl = memchr(buf[i - 1], '\n', have[i - 1]))) {
				char out[1024];
				*nl = 0;
				command(buf[i - 1], out, sizeof out);
				if (write(p[i].fd, out, strlen(out)) < 0)
					break;
				size_t used = (size_t)(nl + 1 - buf[i - 1]);
				memmove(buf[i - 1], nl + 1, have[i - 1] - used);
				have[i - 1] -= used;
			}
			if (have[i - 1] == sizeof buf[0] - 1)
				have[i - 1] = 0; /* overlong line: drop it */
		}
	}
}

#endif
