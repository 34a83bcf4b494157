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
#include <stdlib.h>
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

/* The header checks of one mapped arena; an independent one that fails
 * them is dropped alone when it is the last one mapped (drop_independent
 * takes it off the end of the table). */
static int validate_arena(const struct rk_manifest_arena *d, struct rk_arena *a, bool last, char *why, size_t wl)
{
	int r = rk_arena_validate(a, d->base, d->max, why, wl);
	if (r < 0 && !(last && drop_independent(d, a, why))) {
		rk_g.info.decision_code = RK_REASON_ARENA_CHECK_FAILED;
		return r;
	}
	return 0;
}

static int attach_arenas(const struct rk_manifest *m, char *why, size_t wl)
{
	unsigned first = rk_g.narenas;
	for (unsigned i = 0; i < m->narenas; i++) {
		const struct rk_manifest_arena *d = &m->arenas[i];
		struct rk_arena *a = &rk_g.arenas[rk_g.narenas];
		if (d->flags & RK_MARENA_DROPPED) {
			char msg[240];
			if (d->flags & RK_MARENA_NOT_IN_SNAPSHOT)
				snprintf(msg, sizeof msg, "not in snapshots (RK_ARENA_NO_SNAPSHOT): restored empty");
			else
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
		/* a restore: the memfd holds the snapshot exactly; tracking its
		 * writes from here on spares its first snapshot a read of it all */
		if (rk_g.info.snapshot[0] && !rk_g.lazy_restore && !(d->flags & RK_ARENA_NO_SNAPSHOT))
			rk_snapshot_track_from_map(d->base, d->max, d->fd, d->ino);
		memset(a, 0, sizeof *a);
		a->hdr = p;
		a->hdr_max = d->max;
		rk_fd_set_cloexec(d->fd, true); /* the restart cleared it; not for the app's children */
		a->fd = d->fd;
		a->dev = d->dev;
		a->ino = d->ino;
		a->index = rk_g.narenas++;
		a->inherited = true;
		a->flags = d->flags & (RK_ARENA_INDEPENDENT | RK_ARENA_WRITE_PROTECT | RK_ARENA_NO_SNAPSHOT);
		rk_strlcpy(a->name, d->name, sizeof a->name);
		if (!rk_g.lazy_restore && validate_arena(d, a, true, why, wl) < 0)
			return -EINVAL;
	}
	if (!rk_g.lazy_restore)
		return 0;
	/* every arena is mapped and none was touched: register them all for
	 * the supervisor's pages, then read them */
	int r = rk_lazy_begin(why, wl);
	if (r < 0) {
		rk_g.info.decision_code = RK_REASON_ARENA_CHECK_FAILED;
		return r;
	}
	for (unsigned i = 0, k = 0; i < m->narenas; i++) {
		const struct rk_manifest_arena *d = &m->arenas[i];
		if (d->flags & RK_MARENA_DROPPED)
			continue;
		if (validate_arena(d, &rk_g.arenas[first + k++], false, why, wl) < 0)
			return -EINVAL;
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

static const char *const cleanup_names[] = {"none", "pending", "sweep", "check"};

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

/* The check's disagreements in one arena, as an event. */
static void log_check(const struct rk_arena *a, uint64_t reached, uint64_t first_reached, uint64_t not_pending)
{
	if (!reached && !not_pending)
		return;
	struct rk_ev e;
	rk_ev_begin(&e, "cleanup_check");
	rk_ev_str(&e, "arena", a->name);
	rk_ev_u64(&e, "pending_reached", reached);
	if (reached)
		rk_ev_hex(&e, "first_reached", first_reached);
	rk_ev_u64(&e, "swept_not_pending", not_pending);
	rk_ev_str(&e, "meaning", reached ? "pending objects were reachable: published without a commit (rk_keep, rk_commit)"
					 : "unreached objects were not pending: the pending cleanup leaves them");
	rk_ev_end(&e);
}

/* One arena's cleanup; adds to *t.  0 or -errno (then the arena is left as
 * it was, still in recovery). */
static int cleanup_arena(struct rk_arena *a, enum rk_cleanup mode, struct rk_cleanup_stats *t)
{
	struct rk_sweep_stats st = {0};
	bool marks = a->marks_set || a->hdr->marks_dirty;
	uint64_t bytes = 0, reached = 0, first_reached = 0, not_pending = 0;
	int r = 0;
	t->pending_overflow += a->pending_overflow;
	if (mode == RK_CLEANUP_NONE || mode == RK_CLEANUP_PENDING) {
		bool free_them = mode == RK_CLEANUP_PENDING;
		uint64_t n = rk_pending_settle(a, free_them, &bytes);
		t->pending += n;
		t->pending_bytes += bytes;
		if (free_them) {
			t->objects_freed += n;
			t->bytes_freed += bytes;
		}
		/* without marks there is nothing to walk: O(1) whatever the size */
		r = marks ? rk_arena_clear_marks(a) : 0;
	} else {
		/* The orphaned logs hold no blocks: the sweep may run first, and
		 * they are settled only once it succeeded (a refusal leaves them
		 * for the next try). */
		struct rk_ptrvec pv = {0};
		uint64_t n = rk_pending_list(a, &pv, &bytes), ignored = 0;
		qsort(pv.v, pv.n, sizeof *pv.v, cmp_u64);
		for (size_t i = 0; i < pv.n; i++)
			if (rk_object_marked(a, (const void *)(uintptr_t)pv.v[i]) && !reached++)
				first_reached = pv.v[i];
		bool check = mode == RK_CLEANUP_CHECK && pv.n == n; /* a complete list (malloc did not fail) */
		r = rk_arena_sweep(a, &st, pv.v, pv.n, check ? &not_pending : NULL);
		free(pv.v);
		if (r == 0) {
			/* the sweep freed (and untagged) the unmarked ones */
			(void)rk_pending_settle(a, false, &ignored);
			t->pending += n;
			t->pending_bytes += bytes;
			t->objects_freed += st.objects_freed;
			t->bytes_freed += st.bytes_freed;
			t->objects_kept += st.objects_kept;
			t->bytes_kept += st.bytes_kept;
			t->pending_reached += reached;
			t->swept_not_pending += not_pending;
			if (mode == RK_CLEANUP_CHECK)
				log_check(a, reached, first_reached, not_pending);
		}
	}
	if (r == 0)
		a->hdr->marks_dirty = 0;
	return r;
}

int rk_finish_recovery_mode(enum rk_cleanup mode, struct rk_cleanup_stats *stats)
{
	struct rk_cleanup_stats total = {0};
	if (stats)
		*stats = total;
	if ((unsigned)mode > RK_CLEANUP_CHECK)
		return -EINVAL;
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
		uint32_t wp = rk_wp_write_begin(a);
		int r = cleanup_arena(a, mode, &total);
		rk_wp_write_end(wp);
		a->marks_set = false;
		if (r < 0)
			return r;
		a->sweep_pending = false;
	}
	rk_g.recovery = false;
	rk_control_set_state(RK_CTL_RUNNING);
	total.cleanup_ns = rk_now_ns() - t0;
	if (stats)
		*stats = total;
	struct rk_ev e;
	rk_ev_begin(&e, "recovered");
	rk_ev_u64(&e, "generation", rk_g.info.generation);
	rk_ev_str(&e, "cleanup", cleanup_names[mode]);
	rk_ev_u64(&e, "objects_freed", total.objects_freed);
	rk_ev_u64(&e, "bytes_freed", total.bytes_freed);
	rk_ev_u64(&e, "objects_kept", total.objects_kept);
	rk_ev_u64(&e, "bytes_kept", total.bytes_kept);
	rk_ev_u64(&e, "pending", total.pending);
	if (total.pending_overflow)
		rk_ev_u64(&e, "pending_overflow", total.pending_overflow);
	if (mode == RK_CLEANUP_CHECK) {
		rk_ev_u64(&e, "pending_reached", total.pending_reached);
		rk_ev_u64(&e, "swept_not_pending", total.swept_not_pending);
	}
	rk_ev_u64(&e, "sweep_us", total.cleanup_ns / 1000);
	rk_ev_end(&e);
	return 0;
}

int rk_finish_recovery(bool cleanup, struct rk_sweep_stats *stats)
{
	struct rk_cleanup_stats cs;
	int r = rk_finish_recovery_mode(cleanup ? RK_CLEANUP_SWEEP : RK_CLEANUP_NONE, &cs);
	if (stats)
		*stats = (struct rk_sweep_stats){cs.objects_freed, cs.bytes_freed, cs.objects_kept, cs.bytes_kept};
	return r;
}
