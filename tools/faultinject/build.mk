# tools/faultinject: the fault-injection pass (an LLVM 19 plugin), its
# run-time library and the rekindle-fi-cc wrapper (docs/faultinject.md).
FI_LLVM_CONFIG ?= llvm-config-19
FI_CXX ?= clang++-19
FI_PLUGIN := $(BUILD)/lib/rekindle-faultinject.so
FI_RT := $(BUILD)/lib/librekindle-fi.a
FI_CC := $(BUILD)/bin/rekindle-fi-cc
FI_PASS_SRCS := $(wildcard tools/faultinject/pass/*.cpp)
FI_PASS_OBJS := $(patsubst tools/faultinject/pass/%.cpp,$(BUILD)/faultinject/%.o,$(FI_PASS_SRCS))
FI_HDRS := tools/faultinject/include/rekindle_fi.h tools/faultinject/pass/FaultInject.h
FI_LIT := /usr/lib/llvm-19/build/utils/lit/lit.py

.PHONY: faultinject faultinject-lit rkv-fi
faultinject: $(FI_PLUGIN) $(FI_RT) $(FI_CC)

$(BUILD)/faultinject/%.o: tools/faultinject/pass/%.cpp $(FI_HDRS)
	@mkdir -p $(dir $@)
	$(FI_CXX) $(patsubst -I%,-isystem %,$(shell $(FI_LLVM_CONFIG) --cxxflags)) -O2 -g -fPIC -Wall -Wextra -Werror -c $< -o $@
# No -lLLVM: the plugin uses the LLVM of the clang or opt that loads it.
$(FI_PLUGIN): $(FI_PASS_OBJS)
	@mkdir -p $(dir $@)
	$(FI_CXX) -shared -o $@ $^
$(BUILD)/faultinject/rk_fi_rt.o: tools/faultinject/runtime/rk_fi_rt.c $(FI_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -std=c11 -Wall -Wextra -Werror -fPIC -Itools/faultinject/include -c $< -o $@
$(FI_RT): $(BUILD)/faultinject/rk_fi_rt.o
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
$(FI_CC): tools/faultinject/rekindle-fi-cc.in
	@mkdir -p $(dir $@)
	sed -e 's|@PLUGIN@|$(abspath $(FI_PLUGIN))|' -e 's|@RUNTIME@|$(abspath $(FI_RT))|' \
		-e 's|@INCLUDE@|$(abspath tools/faultinject/include)|' $< > $@.tmp
	chmod 0755 $@.tmp && mv $@.tmp $@

# The IR tests of every fault type (lit + FileCheck; llvm-19-tools).
faultinject-lit: faultinject
	python3 $(FI_LIT) -sv --param plugin=$(abspath $(FI_PLUGIN)) --param exec_root=$(abspath $(BUILD))/faultinject/lit tools/faultinject/test

# rkv built with the pass (rkv's own build is unchanged): a smoke test
# that the injector handles a real server, and the binary the overhead
# measurement and campaigns use.
# rkv-clang is the same build without the pass: the baseline of the
# injector's unarmed overhead (rkv itself is built by $(CC)).
RKV_FI := $(BUILD)/examples/rkv-fi
RKV_CLANG := $(BUILD)/examples/rkv-clang
rkv-fi: $(RKV_FI) $(RKV_CLANG)
$(RKV_FI): $(RKV_SRCS) $(RKV_HDRS) $(LIB_A) $(RT_HDRS) $(FI_PLUGIN) $(FI_RT) $(FI_CC)
	@mkdir -p $(dir $@)
	$(FI_CC) $(CFLAGS) $(RK_CFLAGS) $(RKV_SRCS) -o $@ $(LINK_RK) -lm
$(RKV_CLANG): $(RKV_SRCS) $(RKV_HDRS) $(LIB_A) $(RT_HDRS)
	@mkdir -p $(dir $@)
	clang-19 $(CFLAGS) $(RK_CFLAGS) $(RKV_SRCS) -o $@ $(LINK_RK) -lm

# `make test` builds the injector and rkv-fi; tests/test_faultinject.py
# runs the lit tests, the C programs and the rkv smoke test.
test system-test: faultinject $(RKV_FI)

# The unarmed overhead on rkv (docs/results.md, "Fault injector").
# bench_micro: the gate's cost where calls are all there is.
FI_MICRO := $(BUILD)/faultinject/micro-fi $(BUILD)/faultinject/micro-clang
$(BUILD)/faultinject/micro-fi: tools/faultinject/bench_micro.c $(FI_PLUGIN) $(FI_RT) $(FI_CC)
	@mkdir -p $(dir $@)
	$(FI_CC) -O2 -Wall -Wextra -Werror $< -o $@
$(BUILD)/faultinject/micro-clang: tools/faultinject/bench_micro.c
	@mkdir -p $(dir $@)
	clang-19 -O2 -g -Wall -Wextra -Werror $< -o $@
.PHONY: bench-faultinject
bench-faultinject: deps $(RKV_FI) $(RKV_CLANG) $(FI_MICRO)
	python3 tools/faultinject/bench_overhead.py $(BUILD)
