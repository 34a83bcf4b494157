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

# The fuzz target (examples/rkv/fuzz/README.md): libFuzzer, so clang, with
# ASan and UBSan, against the malloc store.  main.c is compiled in with its
# main() renamed: libFuzzer brings its own main, and the harness uses the
# rest of main.c (srv, js, parse_save, ...) as it is.  rkv_log is wrapped
# to keep protocol errors from flooding the fuzzer's output.
# `make all` builds it only where clang-19 and its libFuzzer runtime are
# installed (a machine without them still builds everything else); `make
# test` and `make fuzz-rkv` always build it, after deps.sh installed them.
FUZZ_CC ?= clang-19
RKV_FUZZ := $(BUILD)/examples/rkv-fuzz
RKV_FUZZ_SRCS := $(RKV_SRCS) $(wildcard examples/rkv/fuzz/*.c)
RKV_FUZZ_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	-DRKV_PLAIN_MALLOC -Dmain=rkv_server_main -Iexamples/rkv -Wl,--wrap=rkv_log
# libclang-rt-19-dev: the libFuzzer runtime (old and per-target layouts)
RKV_FUZZ_RT := $(firstword $(wildcard $(foreach f,libclang_rt.fuzzer-$(shell uname -m).a libclang_rt.fuzzer.a,\
	$(shell $(FUZZ_CC) -print-file-name=$(f) 2>/dev/null))))
ifneq ($(RKV_FUZZ_RT),)
EXAMPLE_BINS += $(RKV_FUZZ)
endif

$(RKV_FUZZ): $(RKV_FUZZ_SRCS) $(RKV_HDRS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(RK_CFLAGS) $(RKV_FUZZ_FLAGS) $(RKV_FUZZ_SRCS) -o $@ -lm
