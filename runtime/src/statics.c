/* statics.c - RK_PRESERVED variables: each module's rk_preserved section is
 * saved into the manifest by the dying incarnation and restored by rk_init of
 * a warm restart.  When ASLR loaded the module elsewhere, 8-byte words that
 * held addresses inside the old load image are moved by the same offset, as
 * if the old offset had been reused; all other bytes are copied as they are. */
#include "rk_internal.h"

#include <link.h>
#include <string.h>

struct section {
	char *start;
	size_t size;
	uint64_t bias, image_lo, image_hi;
	char module[128];
};

static struct section secs[RK_MAX_STATICS];
static unsigned nsecs;
static unsigned dropped; /* sections beyond RK_MAX_STATICS */

void rk__statics_register(void *start, void *stop)
{
	for (unsigned i = 0; i < nsecs; i++)
		if (secs[i].start == start)
			return;
	if (nsecs == RK_MAX_STATICS) {
		dropped++;
		return;
	}
	secs[nsecs].start = start;
	secs[nsecs].size = (size_t)((char *)stop - (char *)start);
	nsecs++;
}

static int find_module(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct section *s = arg;
	uint64_t addr = (uint64_t)(uintptr_t)s->start, lo = UINT64_MAX, hi = 0;
	bool inside = false;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD)
			continue;
		uint64_t b = info->dlpi_addr + ph->p_vaddr, e = b + ph->p_memsz;
		lo = b < lo ? b : lo;
		hi = e > hi ? e : hi;
		if (addr >= b && addr < e)
			inside = true;
	}
	if (!inside)
		return 0;
	s->bias = info->dlpi_addr;
	s->image_lo = lo;
	s->image_hi = hi;
	rk_strlcpy(s->module, info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "(main)",
		   sizeof s->module);
	return 1;
}

size_t rk_statics_total(void)
{
	size_t t = 0;
	for (unsigned i = 0; i < nsecs; i++)
		t += RK_ALIGN_UP(secs[i].size, 16);
	return t;
}

void rk_statics_describe(struct rk_manifest *m)
{
	uint64_t off = RK_MANIFEST_FIXED;
	if (dropped) {
		struct rk_ev e;
		rk_ev_begin(&e, "warning");
		rk_ev_str(&e, "what", "too many modules with RK_PRESERVED variables; extra ones are not preserved");
		rk_ev_u64(&e, "dropped", dropped);
		rk_ev_end(&e);
	}
	for (unsigned i = 0; i < nsecs; i++) {
		struct section *s = &secs[i];
		if (!s->module[0])
			dl_iterate_phdr(find_module, s);
		struct rk_manifest_static *d = &m->statics[i];
		memset(d, 0, sizeof *d);
		d->addr = (uint64_t)(uintptr_t)s->start;
		d->size = s->size;
		d->image_lo = s->image_lo;
		d->image_hi = s->image_hi;
		d->image_offset = d->addr - s->bias;
		d->data_off = off;
		rk_strlcpy(d->module, s->module, sizeof d->module);
		off += RK_ALIGN_UP(s->size, 16);
	}
	m->nstatics = nsecs;
	m->statics_saved = 0;
}

void rk_statics_save(struct rk_manifest *m)
{
	for (unsigned i = 0; i < m->nstatics; i++) {
		const struct rk_manifest_static *d = &m->statics[i];
		memcpy((char *)m + d->data_off, (const void *)(uintptr_t)d->addr, d->size);
	}
	m->statics_saved = 1;
}

static void restore_one(const struct section *s, const struct rk_manifest_static *d, const char *saved)
{
	uint64_t delta = (uint64_t)(uintptr_t)s->start - d->addr;
	memcpy(s->start, saved, s->size);
	if (delta == 0)
		return;
	/* words are aligned as they were: the section moved by a page multiple */
	uint64_t first = RK_ALIGN_UP((uint64_t)(uintptr_t)s->start, 8) - (uint64_t)(uintptr_t)s->start;
	for (uint64_t off = first; off + 8 <= s->size; off += 8) {
		uint64_t w;
		memcpy(&w, s->start + off, 8);
		if (w >= d->image_lo && w < d->image_hi) {
			w += delta;
			memcpy(s->start + off, &w, 8);
		}
	}
}

unsigned rk_statics_restore(const struct rk_manifest *old, uint64_t old_size)
{
	unsigned restored = 0;
	if (!old->statics_saved)
		return 0;
	for (unsigned i = 0; i < old->nstatics && i < RK_MAX_STATICS; i++) {
		const struct rk_manifest_static *d = &old->statics[i];
		const struct section *match = NULL;
		for (unsigned j = 0; j < nsecs; j++) {
			struct section *s = &secs[j];
			if (!s->module[0])
				dl_iterate_phdr(find_module, s);
			if (s->size == d->size && (uint64_t)(uintptr_t)s->start - s->bias == d->image_offset &&
			    strncmp(s->module, d->module, sizeof s->module) == 0)
				match = s;
		}
		if (!match || d->data_off + d->size > old_size) {
			struct rk_ev e;
			rk_ev_begin(&e, "warning");
			rk_ev_str(&e, "what", "RK_PRESERVED section not restored: module not loaded or changed");
			rk_ev_str(&e, "module", d->module);
			rk_ev_end(&e);
			continue;
		}
		restore_one(match, d, (const char *)old + d->data_off);
		restored++;
	}
	return restored;
}
