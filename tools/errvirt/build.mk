# tools/errvirt: error virtualization (docs/errvirt.md): the LLVM 19 pass
# plugin, its run-time library and the rekindle-ev-cc wrapper.
EV_PLUGIN := $(BUILD)/lib/rekindle-errvirt.so
EV_RT := $(BUILD)/lib/librekindle-ev.a
EV_CC := $(BUILD)/bin/rekindle-ev-cc
EV_PASS_SRCS := $(wildcard tools/errvirt/pass/*.cpp)
EV_PASS_OBJS := $(patsubst tools/errvirt/pass/%.cpp,$(BUILD)/errvirt/%.o,$(EV_PASS_SRCS))
EV_HDRS := $(wildcard tools/errvirt/include/*) tools/errvirt/pass/ErrVirt.h tools/errvirt/runtime/ev_internal.h
EV_RT_SRCS := $(wildcard tools/errvirt/runtime/*.c)
EV_RT_ASM := $(wildcard tools/errvirt/runtime/*.S)
EV_RT_OBJS := $(patsubst tools/errvirt/runtime/%.c,$(BUILD)/errvirt/rt/%.o,$(EV_RT_SRCS)) \
	$(patsubst tools/errvirt/runtime/%.S,$(BUILD)/errvirt/rt/%.o,$(EV_RT_ASM))

.PHONY: errvirt errvirt-lit errvirt-unit rkv-ev
errvirt: $(EV_PLUGIN) $(EV_RT) $(EV_CC)

$(BUILD)/errvirt/%.o: tools/errvirt/pass/%.cpp $(EV_HDRS)
	@mkdir -p $(dir $@)
	$(FI_CXX) $(patsubst -I%,-isystem %,$(shell $(FI_LLVM_CONFIG) --cxxflags)) -Itools/errvirt/include -O2 -g -fPIC -Wall -Wextra -Werror -c $< -o $@
$(EV_PLUGIN): $(EV_PASS_OBJS)
	@mkdir -p $(dir $@)
	$(FI_CXX) -shared -o $@ $^
# The run-time's code goes to section rk_ev_text (as librekindle's to
# rk_text): a fault there is recognised by its pc and never recovered.
$(BUILD)/errvirt/rt/%.o: tools/errvirt/runtime/%.c $(EV_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -std=c11 -Wall -Wextra -Werror -fPIC -fno-reorder-blocks-and-partition -fno-reorder-functions \
		-Itools/errvirt/include -c $< -o $@.tmp.o
	objcopy --rename-section .text=rk_ev_text,alloc,load,readonly,code,contents $@.tmp.o $@
	@rm -f $@.tmp.o
	@if objdump -h $@ | grep -q ' \.text\.'; then echo "$@: code outside rk_ev_text" >&2; exit 1; fi
# the assembly files place their code in rk_ev_text themselves
$(BUILD)/errvirt/rt/%.o: tools/errvirt/runtime/%.S
	@mkdir -p $(dir $@)
	$(CC) -c $< -o $@
$(EV_RT): $(EV_RT_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
$(EV_CC): tools/errvirt/rekindle-ev-cc.in
	@mkdir -p $(dir $@)
	sed -e 's|@PLUGIN@|$(abspath $(EV_PLUGIN))|' -e 's|@RUNTIME@|$(abspath $(EV_RT))|' $< > $@.tmp
	chmod 0755 $@.tmp && mv $@.tmp $@

# The pass's IR tests (lit + FileCheck, like the fault injector's).
errvirt-lit: errvirt
	python3 $(FI_LIT) -sv --param plugin=$(abspath $(EV_PLUGIN)) --param exec_root=$(abspath $(BUILD))/errvirt/lit tools/errvirt/test

# The run-time's unit tests: C programs built with the wrapper, each a set
# of checks that crash for real and must come back as errors.
EV_UNIT_SRCS := $(wildcard tools/errvirt/test/unit/*.c)
EV_UNIT := $(patsubst tools/errvirt/test/unit/%.c,$(BUILD)/errvirt/unit/%,$(EV_UNIT_SRCS))
$(BUILD)/errvirt/unit/%: tools/errvirt/test/unit/%.c $(wildcard tools/errvirt/test/unit/*.h) $(EV_PLUGIN) $(EV_RT) $(EV_CC)
	@mkdir -p $(dir $@)
	$(EV_CC) -O2 -g -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE $< -o $@
errvirt-unit: $(EV_UNIT)
	@fail=0; for t in $(EV_UNIT); do $$t || { echo "FAILED: $$t" >&2; fail=1; }; done; exit $$fail

# rkv built with the pass (its own build is unchanged).
RKV_EV := $(BUILD)/examples/rkv-ev
rkv-ev: $(RKV_EV)
$(RKV_EV): $(RKV_SRCS) $(RKV_HDRS) $(LIB_A) $(RT_HDRS) $(EV_PLUGIN) $(EV_RT) $(EV_CC)
	@mkdir -p $(dir $@)
	$(EV_CC) $(CFLAGS) $(RK_CFLAGS) $(RKV_SRCS) -o $@ $(LINK_RK) -lm

# `make test` builds these; tests/test_errvirt.py runs the lit tests, the
# unit programs and the rkv system tests.
test system-test: errvirt $(EV_UNIT) $(RKV_EV)

# The overhead measurement (docs/errvirt.md, "Cost"): rkv-ev against
# rkv-clang (tools/faultinject/build.mk: clang-19 without a pass), and one
# build per saving of the undo log turned off, to measure its share.
RKV_EV_VARIANTS := $(BUILD)/examples/rkv-ev-nofilter $(BUILD)/examples/rkv-ev-nostack $(BUILD)/examples/rkv-ev-nofresh
$(BUILD)/examples/rkv-ev-nofilter: EV_VARIANT_ENV := REKINDLE_EV_NO_FILTER=1
$(BUILD)/examples/rkv-ev-nostack: EV_VARIANT_ENV := REKINDLE_EV_NO_STACK_SKIP=1
$(BUILD)/examples/rkv-ev-nofresh: EV_VARIANT_ENV := REKINDLE_EV_NO_FRESH_SKIP=1
$(RKV_EV_VARIANTS): $(RKV_SRCS) $(RKV_HDRS) $(LIB_A) $(RT_HDRS) $(EV_PLUGIN) $(EV_RT) $(EV_CC)
	@mkdir -p $(dir $@)
	$(EV_VARIANT_ENV) $(EV_CC) $(CFLAGS) $(RK_CFLAGS) $(RKV_SRCS) -o $@ $(LINK_RK) -lm
.PHONY: errvirt-bench-build bench-errvirt
errvirt-bench-build: $(RKV_EV) $(RKV_CLANG) $(RKV_EV_VARIANTS)
# A short run by default (the machine is shared): ROUNDS=N for more.
ROUNDS ?= 3
bench-errvirt: deps errvirt-bench-build
	python3 tools/errvirt/bench_overhead.py $(BUILD) --rounds $(ROUNDS)

# lighttpd 1.4.69 from Debian's source package, unchanged, built with the
# pass (and the same build without it, the overhead baseline).
.PHONY: errvirt-lighttpd
LIGHTTPD_EV := $(BUILD)/errvirt/lighttpd-ev/inst/sbin/lighttpd
errvirt-lighttpd: $(LIGHTTPD_EV)
	BUILD=$(BUILD) bash tools/errvirt/servers/lighttpd.sh clang
# the script rebuilds only when the source or the pass changed
$(LIGHTTPD_EV): $(EV_PLUGIN) $(EV_RT) $(EV_CC) tools/errvirt/servers/lighttpd.sh
	BUILD=$(BUILD) bash tools/errvirt/servers/lighttpd.sh ev
# tests/test_errvirt_lighttpd.py runs it (about 40 s to build on 2 cores)
test system-test: $(LIGHTTPD_EV)

# A first survivability smoke with the project's fault injector
# (tools/errvirt/fault_smoke.py): rkv built with both passes, the injector's
# planting its faults first, then errvirt instrumenting the result.
RKV_FI_EV := $(BUILD)/errvirt/rkv-fi-ev
$(RKV_FI_EV): $(RKV_SRCS) $(RKV_HDRS) $(LIB_A) $(RT_HDRS) $(FI_PLUGIN) $(FI_RT) $(EV_PLUGIN) $(EV_RT)
	@mkdir -p $(dir $@)
	clang-19 $(CFLAGS) -fno-omit-frame-pointer -fpass-plugin=$(FI_PLUGIN) -fpass-plugin=$(EV_PLUGIN) $(RK_CFLAGS) \
		$(RKV_SRCS) -o $@ $(LINK_RK) $(FI_RT) -Wl,--whole-archive $(EV_RT) -Wl,--no-whole-archive -lm
.PHONY: errvirt-fault-smoke
RUNS ?= 30
errvirt-fault-smoke: deps $(RKV_FI_EV)
	python3 tools/errvirt/fault_smoke.py $(BUILD) --runs $(RUNS)

# nginx 1.22.1 from Debian's source package, unchanged, built with the pass
# (and the same build without it, the overhead baseline).  One process, one
# thread: tests/test_errvirt_nginx.py runs it with `master_process off`.
.PHONY: errvirt-nginx
NGINX_EV := $(BUILD)/errvirt/nginx-ev/inst/sbin/nginx
errvirt-nginx: $(NGINX_EV)
	BUILD=$(BUILD) bash tools/errvirt/servers/nginx.sh clang
$(NGINX_EV): $(EV_PLUGIN) $(EV_RT) $(EV_CC) tools/errvirt/servers/nginx.sh
	BUILD=$(BUILD) bash tools/errvirt/servers/nginx.sh ev

# The fault campaign's compiler: the injector's pass, then errvirt's.
EV_FI_CC := $(BUILD)/bin/rekindle-fi-ev-cc
$(EV_FI_CC): tools/errvirt/rekindle-fi-ev-cc.in
	@mkdir -p $(dir $@)
	sed -e 's|@FI_PLUGIN@|$(abspath $(FI_PLUGIN))|' -e 's|@FI_RUNTIME@|$(abspath $(FI_RT))|' \
		-e 's|@EV_PLUGIN@|$(abspath $(EV_PLUGIN))|' -e 's|@EV_RUNTIME@|$(abspath $(EV_RT))|' $< > $@.tmp
	chmod 0755 $@.tmp && mv $@.tmp $@
# The servers built with both passes (the scripts' fi-ev kind).
NGINX_FI_EV := $(BUILD)/errvirt/nginx-fi-ev/inst/sbin/nginx
LIGHTTPD_FI_EV := $(BUILD)/errvirt/lighttpd-fi-ev/inst/sbin/lighttpd
EV_FI_DEPS := $(EV_PLUGIN) $(EV_RT) $(FI_PLUGIN) $(FI_RT) $(EV_FI_CC)
$(NGINX_FI_EV): $(EV_FI_DEPS) tools/errvirt/servers/nginx.sh
	BUILD=$(BUILD) bash tools/errvirt/servers/nginx.sh fi-ev
$(LIGHTTPD_FI_EV): $(EV_FI_DEPS) tools/errvirt/servers/lighttpd.sh
	BUILD=$(BUILD) bash tools/errvirt/servers/lighttpd.sh fi-ev
# tests/test_errvirt_nginx.py and test_errvirt_lighttpd.py inject a crash
# with the injector into these builds.
test system-test: $(NGINX_EV) $(NGINX_FI_EV) $(LIGHTTPD_FI_EV)

# The survivability and recovery-surface campaign (docs/results.md,
# "Error virtualization: faults"): persistent fail-stop faults, one per
# run, into nginx, lighttpd and rkv built with both passes.
.PHONY: bench-errvirt-faults
FAULT_CANDIDATES ?= 400
FAULT_WANT ?= nginx=20,lighttpd=41,rkv=10
FAULT_BUDGET ?= 600
# FAULT_SAMPLE=noncritical: FIRestarter's sample (docs/errvirt.md,
# "Non-critical transactions"), bench/results/errvirt-faults-noncritical.*
FAULT_SAMPLE ?= all
bench-errvirt-faults: deps $(NGINX_FI_EV) $(LIGHTTPD_FI_EV) $(RKV_FI_EV)
	python3 tools/errvirt/fault_campaign.py $(BUILD) --candidates $(FAULT_CANDIDATES) --want $(FAULT_WANT) --budget $(FAULT_BUDGET) --sample $(FAULT_SAMPLE)

# wrk throughput of nginx and lighttpd with the pass against the same
# source built by clang-19 alone (docs/results.md, "Error virtualization").
.PHONY: bench-errvirt-http
bench-errvirt-http: deps $(NGINX_EV) $(LIGHTTPD_EV)
	BUILD=$(BUILD) bash tools/errvirt/servers/nginx.sh clang
	BUILD=$(BUILD) bash tools/errvirt/servers/lighttpd.sh clang
	python3 tools/errvirt/bench_http.py $(BUILD) --rounds $(ROUNDS)
