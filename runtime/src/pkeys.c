/* pkeys.c - write protection of preserved arenas with memory protection
 * keys.  An arena opened RK_ARENA_WRITE_PROTECT gets a key of its own; the
 * key's write access is off in a thread's PKRU except inside that thread's
 * unsafe regions of the arena (control.c) and the runtime's own writes
 * (rk_wp_write_begin/end), so a stray write from transient code faults at
 * the instruction instead of corrupting state the next incarnation reuses.
 * PKRU is per thread and inherited by new threads; a signal handler starts
 * with the kernel's default PKRU, which denies every key but 0, so the
 * runtime's handlers open the arenas first (rk_wp_signal_entry). */
#include "rk_internal.h"

#include <errno.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <sys/mman.h>

static _Atomic uint32_t our_key_bits; /* AD|WD bits of the keys we hold */
static _Atomic int warned_unavailable;

static void warn_unavailable(const struct rk_arena *a, const char *why)
{
	if (atomic_exchange(&warned_unavailable, 1))
		return;
	struct rk_ev e;
	rk_ev_begin(&e, "warning");
	rk_ev_str(&e, "what", "write protection unavailable; arenas stay writable everywhere");
	rk_ev_str(&e, "arena", a->name);
	rk_ev_str(&e, "why", why);
	rk_ev_end(&e);
}

int rk_wp_protect(struct rk_arena *a)
{
#if defined(__x86_64__)
	/* Write access off in this thread from the start; threads created
	 * from here on inherit it. */
	int key = pkey_alloc(0, PKEY_DISABLE_WRITE);
	if (key < 0) {
		int e = errno;
		warn_unavailable(a, e == EINVAL || e == ENOSYS ? "no memory protection keys on this CPU or kernel"
							       : strerror(e));
		return -ENOTSUP;
	}
	if (pkey_mprotect(a->hdr, a->hdr_max, PROT_READ | PROT_WRITE, key) < 0) {
		int e = errno;
		(void)pkey_free(key);
		warn_unavailable(a, strerror(e));
		return -e;
	}
	a->pkey = key;
	atomic_fetch_or(&our_key_bits, RK_PKRU_AD(key) | RK_PKRU_WD(key));
	struct rk_ev ev;
	rk_ev_begin(&ev, "write_protected");
	rk_ev_str(&ev, "arena", a->name);
	rk_ev_u64(&ev, "pkey", (uint64_t)key);
	rk_ev_end(&ev);
	return 0;
#else
	warn_unavailable(a, "memory protection keys are only supported on x86-64");
	return -ENOTSUP;
#endif
}

void rk_wp_signal_entry(void)
{
	uint32_t bits = atomic_load_explicit(&our_key_bits, memory_order_relaxed);
	if (bits)
		rk_pkru_write(rk_pkru_read() & ~bits);
}

/* A thread the runtime starts (the pre-fault thread) gets the kernel's init
 * PKRU from a creator that had no key yet, which denies every key but 0: an
 * arena protected while it runs would fault it inside the runtime.  Give it
 * read access to every key (and write access to none but 0) up front, so no
 * key allocated later can race it. */
void rk_wp_reader_thread(void)
{
#if defined(__x86_64__)
	unsigned a, b, c, d;
	if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 4))) /* OSPKE: rdpkru/wrpkru usable */
		rk_pkru_write((rk_pkru_read() & ~0x55555554u) | 0xaaaaaaa8u);
#endif
}
