/* snapshot.c - rkv's own persistence, the cold path: SAVE, BGSAVE and the
 * periodic save write a snapshot file; a fresh or cold start loads it.
 *
 * Format (little endian):
 *   header   "RKVSNAP\0" | u32 version (1) | u32 0 | i64 created (unix ms)
 *   record   u8 0x01 | u32 key length | u32 value length | i64 expiry
 *            (absolute unix ms, 0 = none) | key | value
 *   trailer  u8 0xFF | u64 record count | u32 CRC32C of every byte before it
 * The file is written to temp-PID.rkv, fsync'd, renamed over the old one and
 * the directory fsync'd.  A load reads the whole file and checks it (magic,
 * version, checksum, every record's bounds, the count) before it inserts one
 * key, so a torn or corrupt file is never half-loaded.
 *
 * BGSAVE cannot rely on fork's copy-on-write: the keyspace is a MAP_SHARED
 * arena, so the parent's writes would show through in the child.  The
 * parent therefore serializes into a private buffer (one pass over the
 * table) and the forked child does the slow part: write, fsync, rename. */
#include "rkv.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SNAP_VERSION 1u
#define HDR_BYTES 24u
#define REC_BYTES 17u
#define TRL_BYTES 13u

/* ---- CRC32C (Castagnoli), slicing-by-8, little-endian hosts ------------- */

static uint32_t crc_tab[8][256];

static void crc_init(void)
{
	if (crc_tab[0][1])
		return;
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		crc_tab[0][i] = c;
	}
	for (int t = 1; t < 8; t++)
		for (uint32_t i = 0; i < 256; i++)
			crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
}

static uint32_t crc32c(const void *buf, size_t n)
{
	const uint8_t *p = buf;
	uint32_t crc = ~0u;
	crc_init();
	for (; n >= 8; p += 8, n -= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		w ^= crc;
		crc = crc_tab[7][w & 0xff] ^ crc_tab[6][(w >> 8) & 0xff] ^ crc_tab[5][(w >> 16) & 0xff] ^
		      crc_tab[4][(w >> 24) & 0xff] ^ crc_tab[3][(w >> 32) & 0xff] ^ crc_tab[2][(w >> 40) & 0xff] ^
		      crc_tab[1][(w >> 48) & 0xff] ^ crc_tab[0][w >> 56];
	}
	while (n--)
		crc = crc_tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

/* ---- writing -------------------------------------------------------- */

static uint8_t *put(uint8_t *p, const void *v, size_t n)
{
	memcpy(p, v, n);
	return p + n;
}

/* The whole snapshot in one malloc buffer; NULL with errno set. */
static uint8_t *serialize(struct db *db, size_t *len)
{
	size_t n = HDR_BYTES + TRL_BYTES;
	KS_FOREACH (db, e)
		n += REC_BYTES + e->klen + e->vlen;
	uint8_t *buf = malloc(n), *p = buf;
	if (!buf)
		return NULL;
	uint32_t ver = SNAP_VERSION, zero = 0;
	int64_t now = now_realtime_ms();
	uint64_t count = 0;
	p = put(p, "RKVSNAP", 8);
	p = put(p, &ver, 4);
	p = put(p, &zero, 4);
	p = put(p, &now, 8);
	KS_FOREACH (db, e) {
		if (e->expire_ms && e->expire_ms < now)
			continue; /* expired: not worth a byte */
		*p++ = 0x01;
		p = put(p, &e->klen, 4);
		p = put(p, &e->vlen, 4);
		p = put(p, &e->expire_ms, 8);
		p = put(p, e->data, (size_t)e->klen + e->vlen);
		count++;
	}
	*p++ = 0xff;
	p = put(p, &count, 8);
	uint32_t crc = crc32c(buf, (size_t)(p - buf));
	p = put(p, &crc, 4);
	*len = (size_t)(p - buf);
	return buf;
}

void snapshot_path(char *out, size_t n)
{
	snprintf(out, n, "%s/%s", srv.cfg.dir, srv.cfg.dbfilename);
}

/* A rename is durable only once its directory is; 0 or -errno. */
static int fsync_dir(void)
{
	int dfd = open(srv.cfg.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	int r = fsync(dfd) < 0 ? -errno : 0;
	close(dfd);
	return r;
}

/* temp file, fsync, rename, fsync of the directory; 0 or -errno */
static int write_file(const uint8_t *buf, size_t len)
{
	char tmp[4400], path[4400];
	snprintf(tmp, sizeof tmp, "%s/temp-%d.rkv", srv.cfg.dir, (int)getpid());
	snapshot_path(path, sizeof path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	size_t off = 0;
	while (off < len) {
		ssize_t w = write(fd, buf + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			goto fail;
		off += (size_t)w;
	}
	if (fsync(fd) < 0)
		goto fail;
	if (close(fd) < 0) {
		fd = -1;
		goto fail;
	}
	fd = -1;
	if (rename(tmp, path) < 0)
		goto fail;
	return fsync_dir();
fail:;
	int err = errno;
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	return -err;
}

int snapshot_save(struct db *db)
{
	size_t len;
	uint8_t *buf = serialize(db, &len);
	if (!buf)
		return -errno;
	int r = write_file(buf, len);
	free(buf);
	if (r < 0) {
		rkv_log("save_failed", "\"error\":%s", js(strerror(-r)));
		return r;
	}
	db->dirty = 0;
	db->last_save_s = now_realtime_ms() / 1000;
	rkv_log("saved", "\"bytes\":%zu,\"keys\":%llu", len, (unsigned long long)db->count);
	return 0;
}

int snapshot_bgsave(struct db *db)
{
	size_t len;
	db->bgsave_try_s = now_realtime_ms() / 1000;
	uint8_t *buf = serialize(db, &len);
	if (!buf)
		return -errno;
	pid_t pid = fork();
	if (pid < 0) {
		int err = errno;
		free(buf);
		return -err;
	}
	if (pid == 0) {
		/* The child must not restart itself through the runtime's handlers,
		 * nor keep the listening socket or the runtime's fds open: a warm
		 * restart of the parent re-binds the port meanwhile. */
		static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM, SIGINT};
		for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
			signal(sigs[i], SIG_DFL);
		close_range(3, ~0u, 0);
		_exit(write_file(buf, len) < 0 ? 1 : 0);
	}
	free(buf);
	db->bgsave_pid = pid;
	db->bgsave_dirty = db->dirty;
	rkv_log("bgsave_started", "\"child\":%d,\"bytes\":%zu", (int)pid, len);
	return 0;
}

void snapshot_reap(struct db *db)
{
	int st;
	pid_t pid;
	/* without __WALL this never reaps the runtime's helper (exit signal 0) */
	while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
		if (pid != db->bgsave_pid)
			continue; /* a child of an incarnation that went cold */
		db->bgsave_pid = 0;
		db->bgsave_ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
		if (db->bgsave_ok) {
			db->dirty -= db->bgsave_dirty < db->dirty ? db->bgsave_dirty : db->dirty;
			db->last_save_s = now_realtime_ms() / 1000;
		}
		rkv_log("bgsave_done", "\"child\":%d,\"ok\":%s", (int)pid, db->bgsave_ok ? "true" : "false");
	}
}

/* ---- loading ---------------------------------------------------------- */

static char why_buf[256];

static int reject(const char **why, const char *fmt, unsigned long long v)
{
	snprintf(why_buf, sizeof why_buf, fmt, v);
	*why = why_buf;
	return -EINVAL;
}

/* Checks everything; returns the record count or -EINVAL with *why. */
static long long verify(const uint8_t *p, size_t size, const char **why)
{
	if (size < HDR_BYTES + TRL_BYTES)
		return reject(why, "file too short (%llu bytes): torn write", size);
	if (memcmp(p, "RKVSNAP", 8) != 0)
		return reject(why, "bad magic%.0llu", 0);
	uint32_t ver, crc;
	memcpy(&ver, p + 8, 4);
	if (ver != SNAP_VERSION)
		return reject(why, "unsupported version %llu", ver);
	memcpy(&crc, p + size - 4, 4);
	if (crc32c(p, size - 4) != crc)
		return reject(why, "checksum mismatch (CRC32C over %llu bytes): torn or corrupt", size - 4);
	size_t pos = HDR_BYTES, end = size - TRL_BYTES;
	unsigned long long n = 0;
	while (pos < end) {
		uint32_t kl, vl;
		if (p[pos] != 0x01)
			return reject(why, "bad record tag at offset %llu", pos);
		if (end - pos < REC_BYTES)
			return reject(why, "bad record length at offset %llu", pos);
		memcpy(&kl, p + pos + 1, 4);
		memcpy(&vl, p + pos + 5, 4);
		if ((uint64_t)kl + vl > end - pos - REC_BYTES || vl > RKV_MAX_BULK || kl > RKV_MAX_BULK)
			return reject(why, "bad record length at offset %llu", pos);
		pos += REC_BYTES + kl + vl;
		n++;
	}
	uint64_t count;
	memcpy(&count, p + end + 1, 8);
	if (pos != end || p[end] != 0xff || count != n)
		return reject(why, "bad trailer (records counted %llu)", n);
	return (long long)n;
}

/* A system call failed: *err says which errno, *why what was being done. */
static int unreadable(const char **why, int *err, const char *doing, int e)
{
	snprintf(why_buf, sizeof why_buf, "%s: %s", doing, strerror(e));
	*why = why_buf;
	*err = e;
	return SNAP_UNREADABLE;
}

/* The whole file in a malloc buffer *out of *size bytes: SNAP_OK (with
 * *out NULL if there is no file), SNAP_NOT_REGULAR or SNAP_UNREADABLE.  It is
 * looked at before it is opened, and opened without blocking: a FIFO at
 * the path would block open() until a writer came, a device has no
 * business being read.  read(), not mmap: an I/O error is then EIO, not a
 * SIGBUS in the middle of the load. */
static int read_whole(const char *path, uint8_t **out, size_t *size, const char **why, int *err)
{
	struct stat sb;
	int r, fd;
	*out = NULL;
	*size = 0;
	while ((r = stat(path, &sb)) < 0 && errno == EINTR)
		;
	if (r < 0 && errno == ENOENT) {
		*why = "no snapshot file";
		return SNAP_OK;
	}
	if (r < 0)
		return unreadable(why, err, "cannot stat", errno);
	if (!S_ISREG(sb.st_mode))
		goto not_regular;
	while ((fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)) < 0 && errno == EINTR)
		;
	if (fd < 0)
		return unreadable(why, err, "cannot open", errno);
	if (fstat(fd, &sb) < 0) {
		int e = errno;
		close(fd);
		return unreadable(why, err, "cannot fstat", e);
	}
	if (!S_ISREG(sb.st_mode)) { /* put there since the stat */
		close(fd);
		goto not_regular;
	}
	size_t want = (size_t)sb.st_size, got = 0;
	uint8_t *buf = malloc(want ? want : 1);
	if (!buf) {
		close(fd);
		snprintf(why_buf, sizeof why_buf, "cannot allocate %zu bytes to read it: %s", want, strerror(ENOMEM));
		*why = why_buf;
		*err = ENOMEM;
		return SNAP_UNREADABLE;
	}
	while (got < want) {
		ssize_t n = read(fd, buf + got, want - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			free(buf);
			close(fd);
			return unreadable(why, err, "cannot read", e);
		}
		if (n == 0)
			break; /* shorter than it was: verify calls it torn */
		got += (size_t)n;
	}
	close(fd);
	*out = buf;
	*size = got;
	return SNAP_OK;
not_regular:
	*why = S_ISDIR(sb.st_mode)	? "a directory, not a snapshot file"
	       : S_ISFIFO(sb.st_mode) ? "a FIFO, not a snapshot file"
	       : S_ISSOCK(sb.st_mode) ? "a socket, not a snapshot file"
				      : "a device, not a snapshot file";
	return SNAP_NOT_REGULAR;
}

int snapshot_load(struct db *db, uint64_t *keys, const char **why, int *err)
{
	char path[4400];
	uint8_t *p;
	size_t size;
	snapshot_path(path, sizeof path);
	*keys = 0;
	*err = 0;
	int r = read_whole(path, &p, &size, why, err);
	if (r != SNAP_OK || !p)
		return r;
	long long n = verify(p, size, why);
	if (n < 0) {
		free(p);
		return SNAP_CORRUPT;
	}
	int64_t now = now_realtime_ms();
	uint64_t skipped = 0;
	size_t pos = HDR_BYTES;
	/* One region around the whole load: a fault half-way must not leave a
	 * partial keyspace for a warm restart to keep. */
	UNSAFE_BEGIN();
	for (long long i = 0; i < n; i++) {
		uint32_t kl, vl;
		int64_t exp;
		memcpy(&kl, p + pos + 1, 4);
		memcpy(&vl, p + pos + 5, 4);
		memcpy(&exp, p + pos + 9, 8);
		const char *k = (const char *)p + pos + REC_BYTES;
		pos += REC_BYTES + kl + vl;
		if (exp && exp < now) {
			skipped++; /* expired while on disk */
			continue;
		}
		if (!ks_set(db, k, kl, k + kl, vl, exp)) {
			snprintf(why_buf, sizeof why_buf, "valid, but out of memory after %llu of its %lld keys (%zu bytes)",
				 (unsigned long long)db->count, n, size);
			*why = why_buf;
			ks_flush(db); /* all or nothing */
			r = SNAP_NO_ROOM;
			break;
		}
	}
	UNSAFE_END();
	free(p);
	if (r == SNAP_OK) {
		*keys = db->count;
		snprintf(why_buf, sizeof why_buf, "loaded %llu keys (%llu expired skipped)",
			 (unsigned long long)db->count, (unsigned long long)skipped);
		*why = why_buf;
	}
	db->dirty = 0;
	return r;
}

/* ---- a snapshot that could not be loaded -------------------------------- */

/* rename without replacing an existing file; 0 or -errno */
static int rename_noreplace(const char *from, const char *to)
{
	if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return -errno;
	/* A file system without RENAME_NOREPLACE: look first.  Nothing else
	 * creates these names, so the gap between the two calls is harmless. */
	struct stat st;
	if (lstat(to, &st) == 0)
		return -EEXIST;
	if (errno != ENOENT)
		return -errno;
	return rename(from, to) == 0 ? 0 : -errno;
}

int snapshot_set_aside(char *kept, size_t n)
{
	char path[4400];
	snapshot_path(path, sizeof path);
	long long now_s = now_realtime_ms() / 1000;
	for (int k = 0; k < 100; k++) {
		int len = k ? snprintf(kept, n, "%s.rejected-%lld.%d", path, now_s, k)
			    : snprintf(kept, n, "%s.rejected-%lld", path, now_s);
		if (len < 0 || (size_t)len >= n)
			return -ENAMETOOLONG;
		int r = rename_noreplace(path, kept);
		if (r == -EEXIST)
			continue; /* never over an earlier rejected file */
		if (r < 0)
			return r;
		r = fsync_dir();
		if (r < 0) /* moved, if not yet durably: say so, go on */
			rkv_log("warning", "\"what\":\"fsync of the snapshot directory\",\"error\":%s", js(strerror(-r)));
		return 0;
	}
	return -EEXIST;
}
