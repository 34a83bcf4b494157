/* recovery.c - a warm start, from its beginning in rk_init to its end in
 * rk_finish_recovery.  rk_init hands over the previous incarnation's
 * manifest: every arena and preserved range it lists is mapped again at its
 * address from the fd the restart (or the supervisor) handed on, checked
 * (rk_arena_validate), and the dead threads' caches are folded back; any
 * failure undoes it all and the start goes cold, except that an independent
 * arena that fails its checks is dropped alone.  rk_finish_recovery sweeps
 * (or only unmarks) what the app did not mark, and drops the arenas it did
 * not reopen. */
#include "rk_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- reattaching inherited state ---- */

/* After a failed warm attempt: closes the fds the manifest hands on, each
 * only if it still is the file the manifest names (never an app's fd). */
void rk_recovery_close_inherited(const struct rk_manifest *m)
{
	for (unsigned i = 0; i < m->narenas; i++)
		if (!(m->arenas[i].flags & RK_MARENA_DROPPED) &&
		    rk_fd_is_file(m->arenas[i].fd, m->arenas[i].dev, m->arenas[i].ino))
			close(m->arenas[i].fd);
	for (unsigned i = 0; i < m->nranges; i++)
		if (rk_fd_is_file(m->ranges[i].fd, m->ranges[i].dev, m->ranges[i].ino))
			close(m->ranges[i].fd);
}

/* Unmaps everything a failed warm attempt mapped, reservation included;
 * the caller closes the inherited fds. */
static void undo_warm(void)
{
	munmap((void *)(uintptr_t)rk_g.reserve_base, rk_g.reserve_len);
	memset(rk_g.arenas, 0, sizeof rk_g.arenas);
	rk_g.narenas = 0;
	for (unsigned i = 0; i < rk_nranges; i++)
		munmap((void *)(uintptr_t)rk_ranges[i].addr, rk_ranges[i].len);
	rk_nranges = 0;
}

static void log_arena_dropped(const char *name, const char *why)
{
	struct rk_ev e;
	rk_ev_begin(&e, "arena_dropped");
	rk_ev_str(&e, "arena", name);
	rk_ev_str(&e, "why", why);
	rk_ev_end(&e);
	rk_g.info.arenas_dropped++;
}

/* An independent arena that fails its checks is dropped alone: the others
 * stay warm.  Returns true if it was dropped. */
static bool drop_independent(const struct rk_manifest_arena *d, struct rk_arena *a, const char *why)
{
	if (!(d->flags & RK_ARENA_INDEPENDENT))
		return false;
	char msg[240];
	snprintf(msg, sizeof msg, "independent arena failed its checks: %s", why);
	log_arena_dropped(d->name, msg);
	rk_arena_unreserve(d->base, d->max);
	close(d->fd);
	memset(a, 0, sizeof *a);
	rk_g.narenas--;
	return true;
}

static int attach_arenas(const struct rk_manifest *m, char *why, size_t wl)
{
	for (unsigned i = 0; i < m->narenas; i++) {
		const struct rk_manifest_arena *d = &m->arenas[i];
		struct rk_arena *a = &rk_g.arenas[rk_g.narenas];
		if (d->flags & RK_MARENA_DROPPED) {
			char msg[240];
			snprintf(msg, sizeof msg, "half-changed at the failure: %s", m->decision);
			log_arena_dropped(d->name, msg);
			continue;
		}
		if (d->base < rk_g.reserve_base || d->base + d->max > rk_g.reserve_base + rk_g.reserve_len ||
		    !rk_fd_is_file(d->fd, d->dev, d->ino)) {
			snprintf(why, wl, "arena %.47s: foreign fd or address outside the reserved range", d->name);
			rk_g.info.decision_code = RK_REASON_FOREIGN_FD;
			return -EINVAL;
		}
		void *p = mmap((void *)(uintptr_t)d->base, d->max, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
			       d->fd, 0);
		if (p == MAP_FAILED) {
			int err = errno;
			snprintf(why, wl, "arena %.47s: cannot map at 0x%llx: %s", d->name, (unsigned long long)d->base,
				 strerror(err));
			rk_g.info.decision_code = RK_REASON_ADDRESS_TAKEN;
			return -err;
		}
		memset(a, 0, sizeof *a);
		a->hdr = p;
		a->hdr_max = d->max;
		rk_fd_set_cloexec(d->fd, true); /* the restart cleared it; not for the app's children */
		a->fd = d->fd;
		a->dev = d->dev;
		a->ino = d->ino;
		a->index = rk_g.narenas++;
		a->inherited = true;
		a->flags = d->flags & (RK_ARENA_INDEPENDENT | RK_ARENA_WRITE_PROTECT);
		rk_strlcpy(a->name, d->name, sizeof a->name);
		int r = rk_arena_validate(a, d->base, d->max, why, wl);
		if (r < 0 && !drop_independent(d, a, why)) {
			rk_g.info.decision_code = RK_REASON_ARENA_CHECK_FAILED;
			return r;
		}
	}
	return 0;
}

static int attach_ranges(const struct rk_manifest *m, char *why, size_t wl)
{
	for (unsigned i = 0; i < m->nranges; i++) {
		const struct rk_manifest_range *d = &m->ranges[i];
		if (!rk_fd_is_file(d->fd, d->dev, d->ino)) {
			snprintf(why, wl, "preserved range 0x%llx: foreign fd", (unsigned long long)d->addr);
			rk_g.info.decision_code = RK_REASON_FOREIGN_FD;
			return -EINVAL;
		}
		void *p = mmap((void *)(uintptr_t)d->addr, d->len, PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_FIXED_NOREPLACE, d->fd, 0);
		if (p != (void *)(uintptr_t)d->addr) {
			if (p != MAP_FAILED)
				munmap(p, d->len);
			snprintf(why, wl, "preserved range 0x%llx+%llu: address already taken in the new process",
				 (unsigned long long)d->addr, (unsigned long long)d->len);
			rk_g.info.decision_code = RK_REASON_ADDRESS_TAKEN;
			return -EEXIST;
		}
		rk_fd_set_cloexec(d->fd, true);
		rk_ranges[rk_nranges].fd = d->fd;
		rk_ranges[rk_nranges].dev = d->dev;
		rk_ranges[rk_nranges].ino = d->ino;
		rk_ranges[rk_nranges].addr = d->addr;
		rk_ranges[rk_nranges].len = d->len;
		rk_nranges++;
	}
	return 0;
}

int rk_recovery_attach(const struct rk_manifest *m, uint64_t msize, char *why, size_t wl)
{
	rk_g.reserve_base = m->reserve_base;
	rk_g.reserve_len = m->reserve_len;
	rk_g.next_arena_addr = m->next_arena_addr;
	if (!rk_arena_reserve_range(m->reserve_base, m->reserve_len)) {
		snprintf(why, wl, "arena address range 0x%llx+0x%llx is already taken in the new process",
			 (unsigned long long)m->reserve_base, (unsigned long long)m->reserve_len);
		rk_g.info.decision_code = RK_REASON_ADDRESS_TAKEN;
		return -EEXIST;
	}
	int r = attach_arenas(m, why, wl);
	if (r == 0)
		r = attach_ranges(m, why, wl);
	if (r < 0) {
		undo_warm();
		return r;
	}
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		rk_arena_recover(&rk_g.arenas[i]);
		rk_g.arenas[i].sweep_pending = true;
	}
	rk_g.info.statics_restored = rk_statics_restore(m, msize);
	return 0;
}

/* ---- the end of recovery ---- */

int rk_finish_recovery(bool cleanup, struct rk_sweep_stats *stats)
{
	struct rk_sweep_stats total = {0};
	if (stats)
		*stats = total;
	rk_reap_teardown_holder();
	if (!rk_g.recovery)
		return 0;
	uint64_t t0 = rk_now_ns();
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		struct rk_arena *a = &rk_g.arenas[i];
		if (!a->hdr || !a->inherited || !a->sweep_pending)
			continue;
		if (!a->reopened) {
			rk_arena_drop(a);
			continue;
		}
		struct rk_sweep_stats st = {0};
		uint32_t wp = rk_wp_write_begin(a);
		/* without cleanup and with no mark set there is nothing to walk:
		 * recovery ends in O(1), whatever the arena's size */
		bool marks = a->marks_set || a->hdr->marks_dirty;
		int r = cleanup ? rk_arena_sweep(a, &st) : marks ? rk_arena_clear_marks(a) : 0;
		if (r == 0)
			a->hdr->marks_dirty = 0;
		rk_wp_write_end(wp);
		a->marks_set = false;
		if (r < 0)
			return r;
		a->sweep_pending = false;
		total.objects_freed += st.objects_freed;
		total.bytes_freed += st.bytes_freed;
		total.objects_kept += st.objects_kept;
		total.bytes_kept += st.bytes_kept;
	}
	rk_g.recovery = false;
	rk_control_set_state(RK_CTL_RUNNING);
	if (stats)
		*stats = total;
	struct rk_ev e;
	rk_ev_begin(&e, "recovered");
	rk_ev_u64(&e, "generation", rk_g.info.generation);
	rk_ev_str(&e, "cleanup", cleanup ? "sweep" : "none");
	rk_ev_u64(&e, "objects_freed", total.objects_freed);
	rk_ev_u64(&e, "bytes_freed", total.bytes_freed);
	rk_ev_u64(&e, "objects_kept", total.objects_kept);
	rk_ev_u64(&e, "bytes_kept", total.bytes_kept);
	rk_ev_u64(&e, "sweep_us", (rk_now_ns() - t0) / 1000);
	rk_ev_end(&e);
	return 0;
}
