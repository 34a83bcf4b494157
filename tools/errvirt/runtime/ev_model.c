/* ev_model.c - the library model's rows (include/libmodel.def) as data for
 * the run-time library, and the compensation actions they name. */
#define _GNU_SOURCE
#include "ev_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

const struct rk_ev_fn rk_ev_model[EV_FN_COUNT] = {
#define EV_FN(n, cls, err, errnum, comp, log, wrapper) {#n, cls, err, comp, log, errnum, wrapper},
#include "libmodel.def"
#undef EV_FN
};

extern void rk_free(void *arena, void *p) __attribute__((weak));
extern void rk_unsafe_begin(void *arena) __attribute__((weak));
extern void rk_unsafe_end(void *arena) __attribute__((weak));

static void ev_rk_free(void *arena, void *p)
{
	if (!p || !rk_free || !rk_unsafe_begin || !rk_unsafe_end)
		return;
	rk_unsafe_begin(arena);
	rk_free(arena, p);
	rk_unsafe_end(arena);
}

void ev_compensate_one(uint8_t comp, uint64_t ret, uint64_t a0, uint64_t a1)
{
	int saved = errno;
	switch (comp) {
	case EV_COMP_CLOSE_RET:
		if ((int)ret >= 0)
			(void)close((int)ret);
		break;
	case EV_COMP_CLOSE_PIPE_A0:
		if ((int)ret == 0 && a0) {
			(void)close(((int *)a0)[0]);
			(void)close(((int *)a0)[1]);
		}
		break;
	case EV_COMP_MUNMAP_RET_A1:
		if ((void *)ret != MAP_FAILED)
			(void)munmap((void *)ret, a1);
		break;
	case EV_COMP_FREE_RET:
		free((void *)ret);
		break;
	case EV_COMP_FCLOSE_RET:
		if (ret)
			(void)fclose((FILE *)ret);
		break;
	case EV_COMP_RK_FREE_A0_RET:
		ev_rk_free((void *)a0, (void *)ret);
		break;
	case EV_COMP_RK_UNSAFE_END_A0:
		if (rk_unsafe_end)
			rk_unsafe_end((void *)a0);
		break;
	case EV_COMP_RK_UNSAFE_BEGIN_A0:
		if (rk_unsafe_begin)
			rk_unsafe_begin((void *)a0);
		break;
	case EV_COMP_CLOSEDIR_RET:
		if (ret)
			(void)closedir((DIR *)ret);
		break;
	case EV_COMP_SHUTDOWN_A0:
		/* the program was told the peer reset the connection: make it so,
		 * or a retry on the same socket would send the bytes twice */
		(void)shutdown((int)a0, SHUT_RDWR);
		break;
	case EV_COMP_FREE_DEREF_A0:
		/* memory is as it was just after the call: *a0 is its block */
		if ((int)ret == 0 && a0)
			free(*(void **)a0);
		break;
	}
	errno = saved;
}

const char *ev_comp_name(uint8_t comp)
{
	static const char *const names[] = {
		[EV_COMP_NONE] = "none",
		[EV_COMP_CLOSE_RET] = "close_ret",
		[EV_COMP_CLOSE_PIPE_A0] = "close_pipe",
		[EV_COMP_MUNMAP_RET_A1] = "munmap_ret",
		[EV_COMP_FREE_RET] = "free_ret",
		[EV_COMP_FCLOSE_RET] = "fclose_ret",
		[EV_COMP_RK_FREE_A0_RET] = "rk_free_ret",
		[EV_COMP_RK_UNSAFE_END_A0] = "rk_unsafe_end",
		[EV_COMP_RK_UNSAFE_BEGIN_A0] = "rk_unsafe_begin",
		[EV_COMP_FREE_DEREF_A0] = "free_deref_a0",
		[EV_COMP_CLOSEDIR_RET] = "closedir_ret",
		[EV_COMP_SHUTDOWN_A0] = "shutdown",
	};
	return comp < sizeof names / sizeof names[0] && names[comp] ? names[comp] : "unknown";
}
