# examples/leaderboard: the small server of docs/porting.md, twice: on plain
# malloc (the "before", no runtime) and ported to Rekindle (the "after").
EXAMPLE_BINS += $(BUILD)/examples/leaderboard $(BUILD)/examples/leaderboard_plain
$(BUILD)/examples/leaderboard: examples/leaderboard/leaderboard.c $(LIB_A) $(RT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RK_CFLAGS) $< -o $@ $(LINK_RK)
$(BUILD)/examples/leaderboard_plain: examples/leaderboard/leaderboard_plain.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RK_CFLAGS) $< -o $@
