/* ev_probe_unit.c - the program of the gate probe's test
 * (tests/test_errvirt.py, test_gate_probe_*): two loops of ten opens, one
 * whose error handler goes on without the file (it diverts: the next gate
 * is a malloc), one that retries the open until it succeeds (a critical
 * path's handler).  It prints what it saw; with no variable set, nothing
 * fails and it exits 0 (`make errvirt-unit` runs it so). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "count_fds.h"

static void *volatile sink;


__attribute__((noinline)) static int divert_loop(int *errors, int *first_error_at, int *last_errno)
{
	int opened = 0;
	for (int i = 0; i < 10; i++) {
		int fd = open("/dev/null", O_RDONLY);
		if (fd < 0) {
			/* the error path: report it somewhere else, skip the work */
			if (*errors == 0)
				*first_error_at = i;
			(*errors)++;
			*last_errno = errno;
			char *note = malloc(64);
			if (!note)
				return -1;
			sink = note;
			free(note);
			continue;
		}
		opened++;
		close(fd);
	}
	return opened;
}

__attribute__((noinline)) static int retry_loop(int *retries)
{
	int opened = 0;
	for (int i = 0; i < 10; i++) {
		int fd;
		while ((fd = open("/dev/null", O_RDONLY)) < 0)
			(*retries)++;
		opened++;
		close(fd);
	}
	return opened;
}

int main(void)
{
	int fds = count_fds();
	int errors = 0, first_error_at = -1, last_errno = 0, retries = 0;
	int diverted_opened = divert_loop(&errors, &first_error_at, &last_errno);
	int retried_opened = retry_loop(&retries);
	int leaked = count_fds() - fds;
	printf("divert_opened=%d errors=%d first_error_at=%d errno=%d retry_opened=%d retries=%d leaked=%d\n",
	       diverted_opened, errors, first_error_at, last_errno, retried_opened, retries, leaked);
	int probed = getenv("REKINDLE_EV_PROBE_GATE") != NULL;
	return (!probed && (errors || retries || leaked)) ? 1 : 0;
}
