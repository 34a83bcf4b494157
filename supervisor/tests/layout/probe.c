/* Prints the layout the runtime's C headers define for what the supervisor
 * reads directly (the control block, the arena header's checked prefix), one
 * "NAME VALUE" line each; supervisor/tests/layout.rs compiles and runs it
 * and compares with the Rust constants, so the two cannot drift. */
#include "rk_internal.h"

#include <stddef.h>
#include <stdio.h>

#define P(name, v) printf("%s %llu\n", name, (unsigned long long)(v))
#define OFF(name, field) P(name, offsetof(struct rk_control, field))

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
	for (int r = 0; r < RK_REASON_COUNT; r++)
		printf("REASON_%d %d %s\n", r, r, rk_reason_name((enum rk_reason)r));
	P("REASON_COUNT", RK_REASON_COUNT);
	return 0;
}
