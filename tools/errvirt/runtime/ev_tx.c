/* ev_tx.c - transactions: a gate begins one (after the commit of the one
 * before: deferred frees and closes happen then), an irrecoverable or
 * unknown call closes the window, embedded calls leave notes (what undoes
 * them) or defer their effect, and an injected error compensates the gate's
 * call.  Everything here runs on the owner thread only; other threads pass
 * through (docs/errvirt.md, "Threads"). */
#define _GNU_SOURCE
#include "ev_internal.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

EV_TLS struct ev_regs rk_ev_regs;
EV_TLS int ev_role;
/* An output call's decision, from __rk_ev_tx_end_output to its checkpoint:
 * open a window after it (a socket, masking asked for), or not; and the
 * last real gate's pc, which the checkpoint of an output call that opens
 * nothing must not replace (fallback lines name the transaction by it). */
static EV_TLS bool ev_output_opens;
static EV_TLS uintptr_t ev_gate_rip;

/* librekindle's allocator and regions, when the program links it */
extern void rk_free(void *arena, void *p) __attribute__((weak));
extern void rk_unsafe_begin(void *arena) __attribute__((weak));
extern void rk_unsafe_end(void *arena) __attribute__((weak));

static bool ev_owner(void)
{
	if (ev_role == EV_ROLE_OWNER)
		return true;
	if (ev_role == EV_ROLE_FOREIGN || !ev)
		return false;
	int expected = 0, me = ev_gettid();
	if (__atomic_compare_exchange_n(&ev->owner_tid, &expected, me, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		ev_role = EV_ROLE_OWNER;
		ev_stack_init();
		return true;
	}
	ev_role = EV_ROLE_FOREIGN;
	return false;
}

static void ev_run_deferred(const struct ev_op *op)
{
	switch (op->kind) {
	case EV_DEF_FREE:
		free((void *)op->a0);
		break;
	case EV_DEF_CLOSE:
		(void)close((int)op->a0);
		break;
	case EV_DEF_MUNMAP:
		(void)munmap((void *)op->a0, op->a1);
		break;
	case EV_DEF_CLOSEDIR:
		(void)closedir((DIR *)op->a0);
		break;
	case EV_DEF_DLCLOSE:
		(void)dlclose((void *)op->a0);
		break;
	case EV_DEF_RK_FREE:
		if (rk_free && rk_unsafe_begin && rk_unsafe_end) {
			/* the free is one whole change of the arena on its own */
			rk_unsafe_begin((void *)op->a0);
			rk_free((void *)op->a0, (void *)op->a1);
			rk_unsafe_end((void *)op->a0);
		}
		break;
	}
}

/* The transaction can no longer be undone: what it deferred happens now. */
void ev_commit(struct ev_state *s)
{
	for (uint32_t i = 0; i < s->ndefer; i++)
		ev_run_deferred(&s->defer[i]);
	s->ndefer = 0;
	s->nnote = 0;
	ev_log_reset(s);
}

static void ev_end_window(struct ev_state *s, const char *reason, int32_t fn, uintptr_t pc)
{
	s->window_open = false;
	s->closed_reason = reason;
	s->closed_by_fn = fn;
	s->closed_by_pc = pc;
	s->closed_callee = 0;
	__rk_ev_key = 0;
	__rk_ev_stack_top = UINTPTR_MAX;
	ev_commit(s);
}

void ev_close_window(struct ev_state *s, const char *reason, int32_t fn, uintptr_t pc)
{
	if (!s->window_open)
		return;
	s->closes++;
	ev_end_window(s, reason, fn, pc);
}

/* Just before a gate's call: the transaction ends, and what it deferred
 * happens now, before the call can see it (a deferred close must take the
 * fd out of the epoll set before the next epoll_wait).  A fault inside the
 * call itself is then not recovered (ev_window_closed, "ev_in_gate_call"). */
void __rk_ev_tx_end(uint32_t fn)
{
	if (ev_role == EV_ROLE_OWNER && ev->window_open)
		ev_end_window(ev, "ev_in_gate_call", (int32_t)fn, (uintptr_t)__builtin_return_address(0));
}

bool ev_deferring(void)
{
	return ev_role == EV_ROLE_OWNER && ev->window_open;
}

uint64_t rk_ev_tx_begin(uint32_t fn)
{
	if (fn < EV_FN_COUNT && rk_ev_model[fn].cls == EV_OUTPUT) {
		if (!ev_output_opens) {
			rk_ev_regs.rip = ev_gate_rip; /* the window stays closed */
			return 0;
		}
		ev_output_opens = false;
	}
	if (!ev_owner())
		return 0;
	struct ev_state *s = ev;
	ev_commit(s); /* normally done already, by __rk_ev_tx_end */
	s->window_open = true;
	s->recovered_window = false;
	s->gate_fn = fn;
	s->gates++;
	ev_log_new_epoch(s);
	(void)ev_log_frame(s);
	/* the probe: the checkpoint returns non-zero as after a rollback */
	return ev_probe_gate(s, rk_ev_regs.rip, fn) ? 1 : 0;
}

static void ev_window_close_at(uint32_t fn, uintptr_t pc)
{
	if (ev_role != EV_ROLE_OWNER || !ev->window_open)
		return;
	ev->closed_irrecoverable++;
	ev_count_closer(ev, pc);
	ev_close_window(ev, "ev_irrecoverable_call", (int32_t)fn, pc);
}

void __rk_ev_window_close(uint32_t fn)
{
	ev_window_close_at(fn, (uintptr_t)__builtin_return_address(0));
}

/* A peer's connection: a stream socket, and not standard input, output or
 * error (under systemd, stderr is journald's socket, and a log line must
 * not turn into a reset).  getsockopt fails with ENOTSOCK on anything else. */
static bool ev_is_peer_stream(int fd)
{
	int type = 0;
	socklen_t len = sizeof type;
	return fd > STDERR_FILENO && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

/* Just before a checked output call (write, writev, send*, sendfile): with
 * masking asked for and a peer's stream socket to write to (not stdio), it
 * is a gate like any other (the transaction before it commits; a crash
 * after it rolls back to just after it, and the call fails with
 * ECONNRESET); otherwise the bytes leave for good and the window ends, as
 * at an irrecoverable call. */
void __rk_ev_tx_end_output(uint32_t fn, uint64_t fd)
{
	ev_output_opens = false;
	ev_gate_rip = rk_ev_regs.rip;
	if (!ev || ev_role == EV_ROLE_FOREIGN)
		return;
	uintptr_t pc = (uintptr_t)__builtin_return_address(0);
	if (ev->mask_outputs && ev_is_peer_stream((int)fd)) {
		ev_output_opens = true;
		if (ev_role == EV_ROLE_OWNER) {
			ev->output_gates++;
			if (ev->window_open)
				ev_end_window(ev, "ev_in_gate_call", (int32_t)fn, pc);
		}
		return;
	}
	ev_window_close_at(fn, pc);
}

void __rk_ev_unknown_call(void *callee)
{
	if (ev_role != EV_ROLE_OWNER || !ev->window_open)
		return;
	ev->closed_unknown++;
	ev_count_closer(ev, (uintptr_t)callee);
	ev_close_window(ev, "ev_unknown_call", -1, (uintptr_t)__builtin_return_address(0));
	ev->closed_callee = (uintptr_t)callee; /* named in a fallback line */
}

static void ev_push(uint32_t kind, uint64_t ret, uint64_t a0, uint64_t a1, bool note)
{
	struct ev_state *s = ev;
	uint32_t *n = note ? &s->nnote : &s->ndefer;
	uint32_t cap = note ? EV_NOTE_CAP : EV_DEFER_CAP;
	if (*n == cap) {
		ev_close_window(s, note ? "ev_notes_full" : "ev_defer_full", -1, 0);
		if (!note)
			ev_run_deferred(&(struct ev_op){kind, ret, a0, a1});
		return;
	}
	(note ? s->note : s->defer)[(*n)++] = (struct ev_op){kind, ret, a0, a1};
}

/* An embedded call that something undoes (rk_unsafe_begin, a malloc whose
 * result nobody checks): remember how, for a rollback. */
void __rk_ev_note(uint32_t fn, uint64_t ret, uint64_t a0, uint64_t a1)
{
	if (!ev_deferring())
		return;
	ev_push(fn, ret, a0, a1, true);
	/* a block the note frees on a rollback: fresh (ev_fresh.c) */
	if (ev->window_open)
		ev_fresh_call(ev, fn, ret, a0, a1, 0);
}

/* What a state-restoration call will write, logged before it runs. */
void __rk_ev_log_call(uint32_t fn, uint64_t a0, uint64_t a1, uint64_t a2)
{
	if (__rk_ev_key == 0 || fn >= EV_FN_COUNT)
		return;
	const char *d = (const char *)a0, *src = (const char *)a1;
	switch (rk_ev_model[fn].log) {
	case EV_LOG_A0_LEN_A1:
		__rk_ev_log_range((void *)a0, a1);
		break;
	case EV_LOG_A0_LEN_A2:
		__rk_ev_log_range((void *)a0, a2);
		break;
	case EV_LOG_A0_LEN_A1XA2:
		__rk_ev_log_range((void *)a0, a1 * a2);
		break;
	case EV_LOG_A0_STRCPY:
		__rk_ev_log_range((void *)a0, strlen(src) + 1);
		break;
	case EV_LOG_A0_STRCAT:
		__rk_ev_log_range((void *)(d + strlen(d)), strlen(src) + 1);
		break;
	case EV_LOG_A1_WORD:
		if (a1)
			__rk_ev_log_range((void *)a1, sizeof(void *));
		break;
	case EV_LOG_A1_TM:
		if (a1)
			__rk_ev_log_range((void *)a1, sizeof(struct tm));
		break;
	/* a NULL pointer: the call fails (EFAULT) or crashes itself; nothing
	 * of ours to log */
	case EV_LOG_A1_LEN_A2:
		if (a1)
			__rk_ev_log_range((void *)a1, a2);
		break;
	case EV_LOG_A1_STAT:
		if (a1)
			__rk_ev_log_range((void *)a1, sizeof(struct stat));
		break;
	case EV_LOG_A2_STAT:
		if (a2)
			__rk_ev_log_range((void *)a2, sizeof(struct stat));
		break;
	case EV_LOG_A1_TIMESPEC:
		if (a1)
			__rk_ev_log_range((void *)a1, sizeof(struct timespec));
		break;
	case EV_LOG_A0_DOUBLES_A1:
		/* getloadavg fills at most 3; a1 is an int, widened unsigned */
		if (a0 && (int32_t)a1 > 0)
			__rk_ev_log_range((void *)a0, (a1 < 3 ? a1 : 3) * sizeof(double));
		break;
	case EV_LOG_A0_TIMEVAL:
		if (a0)
			__rk_ev_log_range((void *)a0, sizeof(struct timeval));
		if (a1)
			__rk_ev_log_range((void *)a1, sizeof(struct timezone));
		break;
	}
}

/* ---- deferred calls: the pass sends free, close, munmap, rk_free here -- */

void __rk_ev_free(void *p)
{
	if (!p)
		return;
	if (ev_deferring())
		ev_push(EV_DEF_FREE, 0, (uint64_t)p, 0, false);
	else
		free(p);
}

int __rk_ev_close(int fd)
{
	if (!ev_deferring())
		return close(fd);
	ev_push(EV_DEF_CLOSE, 0, (uint64_t)fd, 0, false);
	return 0;
}

int __rk_ev_closedir(void *dir)
{
	if (!ev_deferring())
		return closedir(dir);
	ev_push(EV_DEF_CLOSEDIR, 0, (uint64_t)dir, 0, false);
	return 0;
}

int __rk_ev_dlclose(void *handle)
{
	if (!ev_deferring())
		return dlclose(handle);
	ev_push(EV_DEF_DLCLOSE, 0, (uint64_t)handle, 0, false);
	return 0;
}

int __rk_ev_munmap(void *p, size_t n)
{
	if (!ev_deferring())
		return munmap(p, n);
	ev_push(EV_DEF_MUNMAP, 0, (uint64_t)p, n, false);
	return 0;
}

void __rk_ev_rk_free(void *arena, void *p)
{
	if (!p)
		return;
	if (ev_deferring())
		ev_push(EV_DEF_RK_FREE, 0, (uint64_t)arena, (uint64_t)p, false);
	else if (rk_free)
		rk_free(arena, p);
}

/* realloc frees its argument: copy instead, and defer the old block's free,
 * so a rollback to before this call finds the old block intact. */
void *__rk_ev_realloc(void *p, size_t n)
{
	if (!p || !ev_deferring())
		return realloc(p, n);
	if (n == 0) {
		__rk_ev_free(p);
		return NULL;
	}
	void *q = malloc(n);
	if (!q)
		return NULL;
	size_t old = malloc_usable_size(p);
	memcpy(q, p, old < n ? old : n);
	__rk_ev_free(p);
	return q;
}

/* ---- the injected error -------------------------------------------------- */

/* The gate's checkpoint returned a second time: memory and registers are as
 * they were just after the call.  Undo the embedded calls of the rolled
 * back transaction, forget what it deferred (its frees must not happen),
 * undo the gate's own call, and set errno; the gate then returns the
 * error value.  The window goes on, marked: a second fault in it is not
 * recovered (docs/errvirt.md, "Recovery"). */
void __rk_ev_compensate(uint32_t fn, uint64_t ret, uint64_t a0, uint64_t a1)
{
	struct ev_state *s = ev;
	for (uint32_t i = s->nnote; i-- > 0;) {
		const struct ev_op *o = &s->note[i];
		ev_compensate_one(rk_ev_model[o->kind].comp, o->ret, o->a0, o->a1);
	}
	s->nnote = 0;
	s->ndefer = 0;
	const struct rk_ev_fn *m = &rk_ev_model[fn < EV_FN_COUNT ? fn : 0];
	ev_compensate_one(m->comp, ret, a0, a1);
	s->injections++;
	if (m->cls == EV_OUTPUT)
		s->output_injections++;
	s->in_recovery = false;
	ev_log_new_epoch(s);
	(void)ev_log_frame(s);
	struct ev_line l;
	ev_line_begin(&l, "injected", "ev_injected");
	ev_line_str(&l, "gate", m->name);
	ev_line_u64(&l, "errno", (uint64_t)m->err_errno);
	ev_line_str(&l, "compensation", ev_comp_name(m->comp));
	/* the bytes went out: the peer holds what the program believes unsent */
	if (m->cls == EV_OUTPUT)
		ev_line_u64(&l, "masked_output", 1);
	/* signal to resumed execution: the program's error path runs next */
	ev_line_u64(&l, "recovery_ns", ev_now_ns() - s->fault_ns);
	ev_line_end(&l);
	errno = m->err_errno;
}
