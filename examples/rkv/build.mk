# examples/rkv: the Redis-protocol cache on librekindle, and the same server
# on plain malloc (-DRKV_PLAIN_MALLOC), the baseline for Rekindle's overhead.
RKV_SRCS := $(wildcard examples/rkv/*.c)
RKV_HDRS := $(wildcard examples/rkv/*.h)
EXAMPLE_BINS += $(BUILD)/examples/rkv $(BUILD)/examples/rkv-malloc

$(BUILD)/examples/rkv: $(RKV_SRCS) $(RKV_HDRS) $(LIB_A) $(RT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RK_CFLAGS) $(RKV_SRCS) -o $@ $(LINK_RK) -lm
$(BUILD)/examples/rkv-malloc: $(RKV_SRCS) $(RKV_HDRS) $(LIB_A) $(RT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RK_CFLAGS) -DRKV_PLAIN_MALLOC $(RKV_SRCS) -o $@ $(LINK_RK) -lm
