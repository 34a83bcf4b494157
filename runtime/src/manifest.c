/* manifest.c - the manifest: a memfd in which each incarnation tells the
 * next one what it inherits (arenas, preserved ranges, RK_PRESERVED statics,
 * and the restart's decision).  rk_init creates it, reusing the memfd of the
 * incarnation before last (the spare) when one was handed on; every change of
 * the arena or range list rewrites its tables (rk_manifest_sync); and rk_init
 * finds the previous incarnation's: in $REKINDLE_MANIFEST_FD after an
 * in-place restart, or from the supervisor after a respawn.  The restart
 * (restart.c) writes its decision into it with plain stores, which is
 * async-signal-safe. */
#include "rk_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

void rk_manifest_sync(void)
{
	struct rk_manifest *m = rk_g.manifest;
	/* a forked child (validator or not) shares the manifest with its
	 * parent's successor-to-be: it writes none of it */
	if (!m || rk_g.validator || getpid() != rk_g.pid)
		return;
	rk_g.manifest_busy = 1;
	atomic_signal_fence(memory_order_seq_cst);
	unsigned n = 0;
	for (unsigned i = 0; i < rk_g.narenas; i++) {
		const struct rk_arena *a = &rk_g.arenas[i];
		if (!a->hdr)
			continue;
		struct rk_manifest_arena *d = &m->arenas[n++];
		memset(d, 0, sizeof *d);
		rk_strlcpy(d->name, a->name, sizeof d->name);
		d->fd = a->fd;
		d->flags = a->flags & (RK_ARENA_INDEPENDENT | RK_ARENA_WRITE_PROTECT | RK_ARENA_NO_SNAPSHOT);
		d->base = a->hdr->base;
		d->max = a->hdr->max_bytes;
		d->dev = a->dev;
		d->ino = a->ino;
	}
	m->narenas = n;
	n = 0;
	for (unsigned i = 0; i < rk_nranges; i++) {
		m->ranges[n].fd = rk_ranges[i].fd;
		m->ranges[n].addr = rk_ranges[i].addr;
		m->ranges[n].len = rk_ranges[i].len;
		m->ranges[n].dev = rk_ranges[i].dev;
		m->ranges[n].ino = rk_ranges[i].ino;
		n++;
	}
	m->nranges = n;
	m->next_arena_addr = rk_g.next_arena_addr;
	/* Valid at every moment but mid-update: after a death that runs no
	 * handler (SIGKILL) the supervisor hands this manifest on as it is. */
	m->checksum = rk_manifest_checksum(m);
	atomic_signal_fence(memory_order_seq_cst);
	rk_g.manifest_busy = 0;
	rk_control_name_arenas();
	if (rk_g.initialized)
		(void)rk_sup_send_fds(); /* the supervisor holds the new set from now on */
}

/* The previous incarnation's spare memfd if it handed one on (no memfd to
 * create, no fresh pages to fault in: 20-30 us of a restart on cold caches),
 * else a new one.  *reused says which. */
static int manifest_memfd(const struct rk_manifest *old, size_t size, bool *reused)
{
	*reused = false;
	if (old && old->spare_fd >= 0 && rk_fd_is_file(old->spare_fd, old->spare_dev, old->spare_ino)) {
		struct stat st;
		if (fstat(old->spare_fd, &st) == 0 &&
		    (st.st_size >= (off_t)size || ftruncate(old->spare_fd, (off_t)size) == 0)) {
			rk_fd_set_cloexec(old->spare_fd, true);
			*reused = true;
			return old->spare_fd;
		}
	}
	int fd = memfd_create("rekindle:manifest", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

int rk_manifest_create(const struct rk_manifest *old)
{
	size_t size = RK_ALIGN_UP(RK_MANIFEST_FIXED + rk_statics_total(), RK_PAGE);
	bool reused;
	int fd = manifest_memfd(old, size, &reused);
	if (fd < 0)
		return fd;
	struct rk_manifest *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		int e = -errno;
		close(fd);
		return e;
	}
	if (reused)
		memset(m, 0, sizeof *m); /* the manifest of two incarnations ago */
	m->spare_fd = -1; /* until rk_manifest_offer_spare */
	m->magic = RK_MANIFEST_MAGIC;
	m->version = RK_MANIFEST_VERSION;
	m->generation = rk_g.info.generation;
	m->last_kind = rk_g.info.kind;
	m->fast_failures = old ? old->fast_failures : 0;
	m->reserve_base = rk_g.reserve_base;
	m->reserve_len = rk_g.reserve_len;
	(void)prctl(PR_GET_NAME, m->comm);
	rk_statics_describe(m);
	rk_g.manifest = m;
	rk_g.manifest_fd = fd;
	rk_g.manifest_size = size;
	rk_manifest_sync();
	return 0;
}

/* The previous manifest's memfd (inherited_fd, -1 if none) becomes our
 * successor's to write, but only once a supervisor, if there is one, holds
 * ours instead: nobody may rewrite the manifest a supervisor holds (it hands
 * that one on after a death).  Updated like the arena list: a restart in
 * the middle goes cold rather than trust a half-written manifest. */
void rk_manifest_offer_spare(int inherited_fd, bool supervisor_has_ours)
{
	struct rk_manifest *m = rk_g.manifest;
	if (inherited_fd < 0)
		return;
	if (!supervisor_has_ours || !m) {
		close(inherited_fd);
		return;
	}
	rk_g.manifest_busy = 1;
	atomic_signal_fence(memory_order_seq_cst);
	m->spare_fd = inherited_fd;
	rk_fd_file_id(inherited_fd, &m->spare_dev, &m->spare_ino);
	m->checksum = rk_manifest_checksum(m);
	atomic_signal_fence(memory_order_seq_cst);
	rk_g.manifest_busy = 0;
	rk_g.manifest_spare_fd = inherited_fd;
}

/* Maps a manifest memfd (a private copy: writes stay ours) and checks it.
 * On success closes fd unless keep; on failure closes it unless it is a
 * stray fd of the app's: ours says it is the runtime's anyway (handed over
 * by the supervisor); otherwise only one that carries the manifest magic is
 * closed. */
static struct rk_manifest *manifest_map(int fd, bool ours, bool keep, uint64_t *size, char *why, size_t wl)
{
	struct stat st;
	struct rk_manifest *m = MAP_FAILED;
	if (fstat(fd, &st) < 0 || st.st_size < (off_t)sizeof(struct rk_manifest)) {
		snprintf(why, wl, "the manifest is truncated");
	} else if ((m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
		snprintf(why, wl, "cannot map the manifest: %s", strerror(errno));
	} else if (m->magic != RK_MANIFEST_MAGIC || m->version != RK_MANIFEST_VERSION || m->narenas > RK_MAX_ARENAS ||
		   m->nranges > RK_MAX_RANGES || m->nstatics > RK_MAX_STATICS ||
		   m->checksum != rk_manifest_checksum(m)) {
		snprintf(why, wl, "manifest from the previous incarnation is corrupt");
		ours = ours || m->magic == RK_MANIFEST_MAGIC;
		munmap((void *)m, (size_t)st.st_size);
		m = MAP_FAILED;
	}
	if ((m != MAP_FAILED && !keep) || (m == MAP_FAILED && ours))
		close(fd); /* a private mapping needs no fd */
	if (m != MAP_FAILED)
		*size = (uint64_t)st.st_size;
	return m;
}

/* Maps the previous incarnation's manifest, if an in-place restart handed
 * one on; its fd stays open in *kept_fd (the spare for our successor). */
const struct rk_manifest *rk_manifest_inherit(uint64_t *size, int *kept_fd, char *why, size_t wl)
{
	const char *v = getenv("REKINDLE_MANIFEST_FD");
	if (!v)
		return NULL;
	char *end;
	long fd = strtol(v, &end, 10);
	unsetenv("REKINDLE_MANIFEST_FD"); /* not for the app's own children */
	/* a shmem file, then magic, version and checksum: no readlink in /proc
	 * (20 us for a new process's first one) on the restart path */
	if (*end || fd < 0 || fd > INT_MAX || !rk_fd_is_shmem((int)fd)) {
		snprintf(why, wl, "REKINDLE_MANIFEST_FD=%.40s is not a rekindle manifest", v);
		return MAP_FAILED; /* not ours: leave that fd alone */
	}
	const struct rk_manifest *m = manifest_map((int)fd, false, true, size, why, wl);
	if (m != MAP_FAILED) {
		*kept_fd = (int)fd;
		rk_fd_set_cloexec((int)fd, true); /* not for the app's children; a restart hands it on */
	}
	return m;
}

/* Takes the handed-over fd whose memfd is called exactly "rekindle:<name>". */
static int take_fd_named(struct rk_inherit *inh, bool *used, const char *name)
{
	char want[96];
	snprintf(want, sizeof want, "/memfd:rekindle:%s", name);
	for (unsigned i = 1; i < inh->nfds; i++) {
		if (!used[i] && rk_fd_is_memfd(inh->fds[i], want, true)) {
			used[i] = true;
			return inh->fds[i];
		}
	}
	return -1;
}

/* A restore: the supervisor made new memfds from a snapshot and matched
 * them by name, so the files are not the ones the manifest recorded; the
 * statics saved at the snapshot's cut are kept. */
static void manifest_adopt_restored(struct rk_manifest *m, const struct rk_inherit *inh)
{
	for (unsigned i = 0; i < m->narenas; i++)
		if (m->arenas[i].fd >= 0)
			rk_fd_file_id(m->arenas[i].fd, &m->arenas[i].dev, &m->arenas[i].ino);
	for (unsigned i = 0; i < m->nranges; i++)
		rk_fd_file_id(m->ranges[i].fd, &m->ranges[i].dev, &m->ranges[i].ino);
	rk_strlcpy(rk_g.info.snapshot, inh->reason, sizeof rk_g.info.snapshot);
}

/* The supervisor respawned us after a death and vouches for warm: take the
 * dead incarnation's manifest and point its entries at the fds the
 * supervisor handed over, matched by memfd name.  The rest of the warm path
 * (mapping, header checks) is the same as after an in-place restart. */
static const struct rk_manifest *manifest_from_supervisor(struct rk_inherit *inh, uint64_t *size, char *why,
							  size_t wl)
{
	bool used[1 + 2 * RK_MAX_ARENAS] = {true};
	struct rk_manifest *m = MAP_FAILED;
	bool matched = false;
	if (!rk_fd_is_memfd(inh->fds[0], "/memfd:rekindle:manifest", false)) {
		snprintf(why, wl, "the supervisor handed over a manifest fd that is not a rekindle manifest");
		close(inh->fds[0]); /* handed to us: ours to close */
	} else
		m = manifest_map(inh->fds[0], true, false, size, why, wl);
	if (m != MAP_FAILED) {
		matched = true;
		/* The supervisor keeps back the arenas it found half-changed
		 * (independent ones) and says how many: exactly those lack an fd,
		 * and, after a restore, the arenas left out of snapshots. */
		unsigned missing = 0;
		bool restored = inh->flags & RK_INHERIT_RESTORED;
		for (unsigned i = 0; i < m->narenas; i++) {
			struct rk_manifest_arena *a = &m->arenas[i];
			if ((a->fd = take_fd_named(inh, used, a->name)) >= 0)
				continue;
			a->flags |= RK_MARENA_DROPPED;
			if (restored && (a->flags & RK_ARENA_NO_SNAPSHOT))
				a->flags |= RK_MARENA_NOT_IN_SNAPSHOT;
			else
				missing++;
		}
		matched = missing == inh->dropped;
		for (unsigned i = 0; i < m->nranges && matched; i++) {
			char name[48];
			snprintf(name, sizeof name, "range:%llx", (unsigned long long)m->ranges[i].addr);
			matched = (m->ranges[i].fd = take_fd_named(inh, used, name)) >= 0;
		}
		if (!matched)
			snprintf(why, wl, "the fds the supervisor handed over do not match the manifest's arenas");
	}
	for (unsigned i = 1; i < inh->nfds; i++)
		if (!used[i] || !matched)
			close(inh->fds[i]);
	if (!matched) {
		if (m != MAP_FAILED)
			munmap(m, *size);
		return MAP_FAILED;
	}
	if (inh->flags & RK_INHERIT_RESTORED) {
		manifest_adopt_restored(m, inh);
		rk_g.lazy_restore = (inh->flags & RK_INHERIT_LAZY) != 0;
	}
	else
		m->statics_saved = 0; /* no handler ran to save them */
	m->next_mode = RK_NEXT_WARM;
	m->generation = inh->generation ? inh->generation - 1 : 0;
	m->signal = inh->signal;
	m->fault_addr = 0;
	m->t_restart_ns = inh->t_detect_ns;
	m->holder_pid = 0; /* the dead one's helper is the supervisor's to reap */
	m->spare_fd = -1;  /* a number in the dead process, not in ours */
	rk_strlcpy(m->reason, inh->reason, sizeof m->reason);
	rk_strlcpy(m->decision, inh->decision, sizeof m->decision);
	m->decision_code = inh->decision_code;
	return m;
}

/* Under a supervisor, a process not started by an in-place restart asks the
 * supervisor what it inherits.  Returns a manifest (warm), NULL (fresh or
 * cold: rk_g.info is filled in) or MAP_FAILED (why says it). */
const struct rk_manifest *rk_manifest_inherit_supervised(uint64_t *size, char *why, size_t wl)
{
	struct rk_inherit inh;
	if (rk_sup_attach(&inh, why, wl) < 0)
		return MAP_FAILED;
	if (inh.mode == 0)
		return NULL;
	rk_g.info.kind = RK_START_COLD;
	rk_g.info.generation = inh.generation;
	rk_g.info.signal = inh.signal;
	rk_g.t_restart_ns = inh.t_detect_ns;
	rk_strlcpy(rk_g.info.reason, inh.reason, sizeof rk_g.info.reason);
	rk_strlcpy(rk_g.info.decision, inh.decision, sizeof rk_g.info.decision);
	rk_g.info.decision_code = (enum rk_reason)inh.decision_code;
	return inh.mode == 1 ? manifest_from_supervisor(&inh, size, why, wl) : NULL;
}
