/* rekindle_ev.h - what the error-virtualization pass and its run-time
 * library agree on (docs/errvirt.md): the library model's vocabulary, the
 * marker that tells instrumented code from library code, and the entry
 * points the pass calls.  C and C++ both include it. */
#ifndef REKINDLE_EV_H
#define REKINDLE_EV_H

#include <stddef.h>
#include <stdint.h>

/* Recoverability classes (FIRestarter, Table II). */
enum rk_ev_class {
	EV_REVERSIBLE = 1, /* an action undoes it: close what open opened */
	EV_NOREVERT,       /* nothing in the process to undo: read, getpid */
	EV_DEFER,          /* its effect waits for the commit: free, close */
	EV_RESTORE,        /* it writes our memory: log what it will write */
	EV_IRRECOV,        /* its effect left the process: write, send */
	/* a write to a peer: irrecoverable, unless the run-time is asked to
	 * mask it (REKINDLE_EV_MASK_SOCKET_WRITES=1) and its fd is a socket:
	 * then a gate whose error is a connection reset (docs/errvirt.md,
	 * "Masking socket writes") */
	EV_OUTPUT,
};

/* How a call reports failure (what the gate injects). */
enum rk_ev_err {
	EV_ERR_NONE = 0,  /* cannot fail, or nobody could tell */
	EV_ERR_NEG1,      /* -1 and errno */
	EV_ERR_NULL,      /* NULL and errno */
	EV_ERR_MAPFAILED, /* MAP_FAILED and errno */
	EV_ERR_ERRNO,     /* the error number itself, 0 on success (posix_memalign) */
};

/* What undoes a call: run on rollback, after memory is restored. */
enum rk_ev_comp {
	EV_COMP_NONE = 0,
	EV_COMP_CLOSE_RET,          /* close(ret) */
	EV_COMP_CLOSE_PIPE_A0,      /* close(a0[0]), close(a0[1]) */
	EV_COMP_MUNMAP_RET_A1,      /* munmap(ret, a1) */
	EV_COMP_FREE_RET,           /* free(ret) */
	EV_COMP_FCLOSE_RET,         /* fclose(ret) */
	EV_COMP_RK_FREE_A0_RET,     /* rk_free(a0, ret) */
	EV_COMP_RK_UNSAFE_END_A0,   /* rk_unsafe_end(a0) */
	EV_COMP_RK_UNSAFE_BEGIN_A0, /* rk_unsafe_begin(a0) */
	EV_COMP_FREE_DEREF_A0,      /* free(*a0), when the call returned 0 */
	EV_COMP_CLOSEDIR_RET,       /* closedir(ret) */
	EV_COMP_SHUTDOWN_A0,        /* shutdown(a0, SHUT_RDWR): the reset made real */
};

/* What a call writes in our memory, logged before it runs. */
enum rk_ev_logspec {
	EV_LOG_NONE = 0,
	EV_LOG_A0_LEN_A1,    /* a0[0 .. a1) */
	EV_LOG_A0_LEN_A2,    /* a0[0 .. a2) */
	EV_LOG_A0_LEN_A1XA2, /* a0[0 .. a1 * a2) */
	EV_LOG_A0_STRCPY,    /* a0[0 .. strlen(a1) + 1) */
	EV_LOG_A0_STRCAT,    /* a0[strlen(a0) .. + strlen(a1) + 1) */
	EV_LOG_A1_WORD,      /* *(void **)a1, when a1 is not NULL */
	EV_LOG_A1_TM,        /* *(struct tm *)a1 (localtime_r, gmtime_r) */
	EV_LOG_A1_LEN_A2,    /* a1[0 .. a2) (strerror_r, an unchecked read) */
	EV_LOG_A1_STAT,      /* *(struct stat *)a1 (an unchecked stat, fstat) */
	EV_LOG_A2_STAT,      /* *(struct stat *)a2 (an unchecked fstatat) */
	EV_LOG_A1_TIMESPEC,  /* *(struct timespec *)a1 (clock_gettime) */
	EV_LOG_A0_TIMEVAL,   /* *(struct timeval *)a0 and *(struct timezone *)a1 (gettimeofday) */
	EV_LOG_A0_DOUBLES_A1, /* a0[0 .. a1) doubles (getloadavg) */
};

/* One row of the library model (libmodel.def). */
struct rk_ev_fn {
	const char *name;
	uint8_t cls, err, comp, log;
	int err_errno;
	const char *wrapper; /* EV_DEFER and realloc: the call goes here */
};

/* Indices into the model: EV_FN_<name>. */
enum rk_ev_fn_index {
#define EV_FN(name, cls, err, errnum, comp, log, wrapper) EV_FN_##name,
#include "libmodel.def"
#undef EV_FN
	EV_FN_COUNT
};

/* Every instrumented function carries this 8-byte word just before its
 * entry (LLVM prefix data): a call through a pointer, or to a declared
 * function, checks it to tell our code from a library's. */
#define RK_EV_MAGIC 0x6b7665725f6b72ull /* "rk_revk" */

/* An alloca this large is a hole in the frame copies (a server's event
 * array, a read buffer): copying it at every gate would cost more than
 * logging the few words written to it. */
#define RK_EV_HOLE_MIN 512u

/* The undo filter: one slot per 8-byte word, tagged with the transaction's
 * epoch in the top 16 bits (user addresses are below 2^47). */
#define RK_EV_FILTER_SLOTS 4096u
#define RK_EV_EPOCH_SHIFT 48

#ifdef __cplusplus
extern "C" {
#endif
extern const struct rk_ev_fn rk_ev_model[EV_FN_COUNT];
#ifdef __cplusplus
}
#endif

#endif
