# examples/kmeans: stage-based progress recovery (docs/stages.md)
EXAMPLE_BINS += $(BUILD)/examples/kmeans
$(BUILD)/examples/kmeans: examples/kmeans/kmeans.c $(LIB_A) $(RT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RK_CFLAGS) $< -o $@ $(LINK_RK) -lm
