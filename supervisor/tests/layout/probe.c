/* Prints the layout the runtime's C headers define for what the supervisor
 * reads directly (the control block, the arena header's checked prefix, and
 * for `rekindle inspect` the arena header, page map and slab header), one
 * "NAME VALUE" line each; supervisor/tests/layout.rs compiles and runs it
 * and compares with the Rust constants, so the two cannot drift. */
#include "rk_internal.h"
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>

#include <stddef.h>
#include <stdio.h>

#define P(name, v) printf("%s %llu\n", name, (unsigned long long)(v))
#define OFF(name, field) P(name, offsetof(struct rk_control, field))
#define AOFF(name, field) P(name, offsetof(struct rk_arena_hdr, field))
/* an entry with every field set: kind 5, class 0xab, the mark, n 0x12345 */
#define PG_SAMPLE (0x5ull | (0xabull << 4) | RK_PG_MARK | (0x12345ull << 32))

int main(void)
{
	P("CONTROL_MAGIC", RK_CONTROL_MAGIC);
	P("CONTROL_VERSION", RK_CONTROL_VERSION);
	P("CONTROL_SIZE", RK_CONTROL_SIZE);
	P("CONTROL_NSLOTS", RK_CONTROL_SLOTS);
	P("CONTROL_SLOT_SIZE", sizeof(struct rk_ctl_slot));
	P("CONTROL_MAX_ARENAS", RK_MAX_ARENAS);
	P("CONTROL_ARENA_NAME_LEN", RK_CONTROL_NAME);
	P("CONTROL_REQUEST_REASON_LEN", sizeof(((struct rk_control *)0)->request_reason));
	P("CONTROL_FLAG_WARM_DISABLED", RK_CTL_WARM_DISABLED);
	P("CONTROL_STATE_NONE", RK_CTL_NONE);
	P("CONTROL_STATE_RUNNING", RK_CTL_RUNNING);
	P("CONTROL_STATE_RECOVERING", RK_CTL_RECOVERING);
	P("CONTROL_STATE_READY", RK_CTL_READY);
	P("CONTROL_STATE_RESTARTING", RK_CTL_RESTARTING);
	P("CONTROL_REQ_WARM", RK_REQ_WARM);
	P("CONTROL_REQ_COLD", RK_REQ_COLD);
	OFF("OFF_MAGIC", magic);
	OFF("OFF_VERSION", version);
	OFF("OFF_SIZE", size);
	OFF("OFF_PID", pid);
	OFF("OFF_GENERATION", generation);
	OFF("OFF_STATE", state);
	OFF("OFF_FLAGS", flags);
	OFF("OFF_HEARTBEAT_COUNT", heartbeat_count);
	OFF("OFF_HEARTBEAT_NS", heartbeat_ns);
	OFF("OFF_PRESERVED", preserved_bytes);
	OFF("OFF_REQUEST_MODE", request_mode);
	OFF("OFF_REQUEST_REASON", request_reason);
	OFF("OFF_NSLOTS", nslots);
	OFF("OFF_SLOT_SIZE", slot_size);
	OFF("OFF_NARENAS", narenas);
	OFF("OFF_INDEPENDENT", independent_mask);
	OFF("OFF_ARENA_TABLE_SUM", arena_table_sum);
	OFF("OFF_SLOTS", slots);
	OFF("OFF_ARENA_NAMES", arena_names);
	P("SLOT_OFF_TID", offsetof(struct rk_ctl_slot, tid));
	P("SLOT_OFF_DEPTH", offsetof(struct rk_ctl_slot, depth));
	P("SLOT_DEPTH_SIZE", sizeof(((struct rk_ctl_slot *)0)->depth[0]));
	P("ARENA_MAGIC", RK_ARENA_MAGIC);
	P("ARENA_VERSION", RK_ARENA_VERSION);
	P("ARENA_OFF_MAGIC", offsetof(struct rk_arena_hdr, magic));
	P("ARENA_OFF_VERSION", offsetof(struct rk_arena_hdr, version));
	P("ARENA_CHECKED_LEN", offsetof(struct rk_arena_hdr, hdr_checksum));
	P("ARENA_HDR_PREFIX", offsetof(struct rk_arena_hdr, hdr_checksum) + sizeof(uint64_t));
	/* what `rekindle inspect` reads (supervisor/src/inspect.rs) */
	AOFF("ARENA_OFF_PAGE_SIZE", page_size);
	AOFF("ARENA_OFF_LAYOUT", layout);
	AOFF("ARENA_OFF_BASE", base);
	AOFF("ARENA_OFF_MAX_BYTES", max_bytes);
	AOFF("ARENA_OFF_MAP_OFFSET", map_offset);
	AOFF("ARENA_OFF_HEAP_OFFSET", heap_offset);
	AOFF("ARENA_OFF_NAME", name);
	P("ARENA_NAME_LEN", sizeof(((struct rk_arena_hdr *)0)->name));
	AOFF("ARENA_OFF_ROOT_LOCK", root_lock);
	AOFF("ARENA_OFF_ROOTS_CHECKSUM", roots_checksum);
	AOFF("ARENA_OFF_ROOTS", roots);
	P("ARENA_MAX_ROOTS", RK_MAX_ROOTS);
	P("ROOT_SIZE", sizeof(struct rk_root));
	P("ROOT_OFF_NAME", offsetof(struct rk_root, name));
	P("ROOT_NAME_LEN", sizeof(((struct rk_root *)0)->name));
	P("ROOT_OFF_PTR", offsetof(struct rk_root, ptr));
	AOFF("ARENA_OFF_HEAP_LOCK", heap_lock);
	AOFF("ARENA_OFF_TOP", top);
	AOFF("ARENA_OFF_COMMITTED", committed);
	AOFF("ARENA_OFF_ALLOCATED", allocated_bytes);
	AOFF("ARENA_OFF_CLASSES", classes);
	P("ARENA_NCLASSES", RK_NCLASSES);
	P("CLASS_STATE_SIZE", sizeof(struct rk_class_state));
	P("CLASS_OFF_LOCK", offsetof(struct rk_class_state, lock));
	P("CLASS_OFF_COUNT", offsetof(struct rk_class_state, count));
	P("CLASS_OFF_SLABS", offsetof(struct rk_class_state, slabs));
	AOFF("ARENA_OFF_TCACHES", tcaches);
	P("ARENA_MAX_TCACHES", RK_MAX_TCACHES);
	P("TCACHE_SIZE", sizeof(struct rk_tcache));
	P("TCACHE_OFF_OWNER", offsetof(struct rk_tcache, owner));
	P("TCACHE_OFF_ALLOC_DELTA", offsetof(struct rk_tcache, alloc_delta));
	P("TCACHE_OFF_BINS", offsetof(struct rk_tcache, bins));
	P("TCACHE_BIN_SIZE", sizeof(struct rk_tcache_bin));
	P("BIN_OFF_COUNT", offsetof(struct rk_tcache_bin, count));
	P("ARENA_HDR_SIZE", sizeof(struct rk_arena_hdr));
	P("ARENA_PAGE", RK_PAGE);
	P("ARENA_SMALL_MAX", RK_SMALL_MAX);
	P("ARENA_TCACHE_MAX", RK_TCACHE_MAX);
	/* the page map entry: kinds, and the fields of a sample entry */
	P("PG_NONE", RK_PG_NONE);
	P("PG_SLAB", RK_PG_SLAB);
	P("PG_LARGE", RK_PG_LARGE);
	P("PG_CONT", RK_PG_CONT);
	P("PG_FREE", RK_PG_FREE);
	P("PG_MARK", RK_PG_MARK);
	P("PG_SAMPLE", PG_SAMPLE);
	P("PG_SAMPLE_KIND", RK_PG_KIND(PG_SAMPLE));
	P("PG_SAMPLE_CLASS", RK_PG_CLASS(PG_SAMPLE));
	P("PG_SAMPLE_N", RK_PG_N(PG_SAMPLE));
	P("PG_MAKE_SLAB_39_4096", RK_PG_MAKE(RK_PG_SLAB, 39, 4096));
	P("PG_MAKE_LARGE_0_1", RK_PG_MAKE(RK_PG_LARGE, 0, 1));
	P("PG_MAKE_CONT_0_7", RK_PG_MAKE(RK_PG_CONT, 0, 7));
	P("PG_MAKE_FREE_0_300", RK_PG_MAKE(RK_PG_FREE, 0, 300));
	/* the slab header */
	P("SLAB_MAGIC", RK_SLAB_MAGIC);
	P("SLAB_SIZE", sizeof(struct rk_slab));
	P("SLAB_HEADER_BYTES", RK_ALIGN_UP(sizeof(struct rk_slab), 16)); /* alloc.c slab_header_bytes() */
	P("SLAB_MAX_OBJECTS", RK_SLAB_BITMAP_WORDS * 64);
	P("SLAB_OFF_MAGIC", offsetof(struct rk_slab, magic));
	P("SLAB_OFF_CLS", offsetof(struct rk_slab, cls));
	P("SLAB_OFF_NOBJS", offsetof(struct rk_slab, nobjs));
	P("SLAB_OFF_NPAGES", offsetof(struct rk_slab, npages));
	P("SLAB_OFF_FIRST", offsetof(struct rk_slab, first));
	for (int r = 0; r < RK_REASON_COUNT; r++)
		printf("REASON_%d %d %s %d\n", r, r, rk_reason_name((enum rk_reason)r),
		       rk_reason_restorable((enum rk_reason)r));
	P("REASON_COUNT", RK_REASON_COUNT);
	/* the snapshot agent's messages and shared buffer (agent_link.rs) */
	P("SNAP_BUF_MAGIC", RK_SNAP_BUF_MAGIC);
	P("SNAP_BUF_VERSION", RK_SNAP_BUF_VERSION);
	P("SNAP_BUF_HDR_LEN", sizeof(struct rk_snap_buf));
	P("SNAP_OFF_REGIONS_OFF", offsetof(struct rk_snap_buf, regions_off));
	P("SNAP_OFF_VEC_OFF", offsetof(struct rk_snap_buf, vec_off));
	P("SNAP_OFF_PUNCH_OFF", offsetof(struct rk_snap_buf, punch_off));
	P("SNAP_OFF_MANIFEST_OFF", offsetof(struct rk_snap_buf, manifest_off));
	P("SNAP_OFF_VEC_CAP", offsetof(struct rk_snap_buf, vec_cap));
	P("SNAP_OFF_PUNCH_CAP", offsetof(struct rk_snap_buf, punch_cap));
	P("SNAP_OFF_NREGIONS", offsetof(struct rk_snap_buf, nregions));
	P("SNAP_OFF_NVEC", offsetof(struct rk_snap_buf, nvec));
	P("SNAP_OFF_MANIFEST_LEN", offsetof(struct rk_snap_buf, manifest_len));
	P("SNAP_OFF_NPUNCH", offsetof(struct rk_snap_buf, npunch));
	P("SNAP_OFF_OPEN_EPOCH", offsetof(struct rk_snap_buf, open_epoch));
	P("SNAP_OFF_DURABLE_EPOCH", offsetof(struct rk_snap_buf, durable_epoch));
	P("SNAP_HELLO_FDS", RK_SNAP_HELLO_FDS);
	P("SNAP_REGION_LEN", sizeof(struct rk_snap_region));
	P("SNAP_REGION_OFF_NAME", offsetof(struct rk_snap_region, name));
	P("SNAP_REGION_OFF_ADDR", offsetof(struct rk_snap_region, addr));
	P("SNAP_REGION_OFF_FIRST", offsetof(struct rk_snap_region, first));
	P("SNAP_REGION_OFF_INO", offsetof(struct rk_snap_region, ino));
	P("SNAP_REGION_NEW", RK_SNAP_REGION_NEW);
	P("SNAP_REGION_TRACKED_FROM_MAP", RK_SNAP_REGION_TRACKED_FROM_MAP);
	P("SNAP_REGION_ARENA", RK_SNAP_ARENA);
	P("SNAP_REGION_RANGE", RK_SNAP_RANGE);
	P("SNAP_RUN_LEN", 3 * sizeof(uint64_t)); /* struct page_region */
	P("SNAP_PUNCH_LEN", sizeof(struct rk_snap_punch));
	P("SNAP_MAX_REGIONS", RK_SNAP_MAX_REGIONS);
	P("SNAP_T_HELLO", RK_SNAP_HELLO);
	P("SNAP_T_DIRTY", RK_SNAP_DIRTY);
	P("SNAP_T_RELEASED", RK_SNAP_RELEASED);
	P("SNAP_T_SCAN", RK_SNAP_SCAN);
	P("SNAP_T_CONTINUE", RK_SNAP_CONTINUE);
	P("SNAP_T_RELEASE", RK_SNAP_RELEASE);
	P("SNAP_HELLO_LEN", sizeof(struct rk_snap_hello));
	P("SNAP_SCAN_LEN", sizeof(struct rk_snap_scan));
	P("SNAP_SCAN_CUT", RK_SNAP_SCAN_CUT);
	P("SNAP_SCAN_PROBE", RK_SNAP_SCAN_PROBE);
	P("SNAP_DIRTY_OFF_UNCHANGED", offsetof(struct rk_snap_dirty, unchanged));
	P("SNAP_DIRTY_OFF_EPOCH", offsetof(struct rk_snap_dirty, epoch));
	P("SNAP_DIRTY_LEN", sizeof(struct rk_snap_dirty));
	P("SNAP_SEQ_LEN", sizeof(struct rk_snap_seq));
	P("SNAP_RELEASED_LEN", sizeof(struct rk_snap_released));
	P("SNAP_STATUS_REGION_OPEN", RK_SNAP_REGION_OPEN);
	P("SNAP_STATUS_RESTARTING", RK_SNAP_RESTARTING);
	P("SNAP_STATUS_LAYOUT_CHANGING", RK_SNAP_LAYOUT_CHANGING);
	P("SNAP_STATUS_SCAN_FAILED", RK_SNAP_SCAN_FAILED);
	P("SNAP_STATUS_STOP_TIMEOUT", RK_SNAP_STOP_TIMEOUT);
	P("SNAP_STATUS_BAD_REQUEST", RK_SNAP_BAD_REQUEST);
	P("SNAP_STATUS_UNAVAILABLE", RK_SNAP_UNAVAILABLE);
	P("INHERIT_RESTORED", RK_INHERIT_RESTORED);
	P("INHERIT_LAZY", RK_INHERIT_LAZY);
	P("ATTACH_CAP_LAZY", RK_ATTACH_CAP_LAZY);
	P("OFF_LAZY_PAGES", offsetof(struct rk_control, lazy_pages));
	P("LAZY_REGION_LEN", sizeof(struct rk_lazy_region));
	P("LAZY_REGION_NAME_LEN", sizeof(((struct rk_lazy_region *)0)->name));
	P("UFFDIO_COPY", UFFDIO_COPY);
	P("UFFDIO_UNREGISTER", UFFDIO_UNREGISTER);
	P("UFFDIO_WAKE", UFFDIO_WAKE);
	P("UFFD_MSG_LEN", sizeof(struct uffd_msg));
	P("UFFD_MSG_OFF_ADDRESS", offsetof(struct uffd_msg, arg.pagefault.address));
	P("UFFD_MSG_OFF_FORK_UFD", offsetof(struct uffd_msg, arg.fork.ufd));
	P("UFFD_EVENT_PAGEFAULT", UFFD_EVENT_PAGEFAULT);
	P("UFFD_EVENT_FORK", UFFD_EVENT_FORK);
#define ROFF(name, field) P(name, offsetof(struct rk_redo_ring, field))
	P("REDO_MAGIC", RK_REDO_MAGIC);
	P("REDO_VERSION", RK_REDO_VERSION);
	P("REDO_HEADER", RK_REDO_HEADER);
	P("REDO_REC_HEAD", RK_REDO_REC_HEAD);
	P("REDO_STRUCT_SIZE", sizeof(struct rk_redo_ring));
	ROFF("REDO_OFF_MAGIC", magic);
	ROFF("REDO_OFF_VERSION", version);
	ROFF("REDO_OFF_HEADER_SIZE", header_size);
	ROFF("REDO_OFF_RING_BYTES", ring_bytes);
	ROFF("REDO_OFF_COMMITTED", committed);
	ROFF("REDO_OFF_WANT", want);
	ROFF("REDO_OFF_APP_GAPS", app_gaps);
	ROFF("REDO_OFF_REPLAY_PENDING", replay_pending);
	ROFF("REDO_OFF_STARTED_AT", started_at);
	ROFF("REDO_OFF_STARTED_LINE", started_line);
	ROFF("REDO_OFF_LINE", line);
	ROFF("REDO_OFF_LINE_GAPS", line_gaps);
	ROFF("REDO_OFF_LINE_START", line_start);
	ROFF("REDO_OFF_DRAINED", drained);
	ROFF("REDO_OFF_DURABLE", durable);
	ROFF("REDO_OFF_WRITER_ERRNO", writer_errno);
	return 0;
}
