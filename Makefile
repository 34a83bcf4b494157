# Rekindle - top-level build.  `make demo` and `make test` are all a fresh
# clone needs; both install missing dependencies first (scripts/deps.sh).
SHELL := /bin/bash
# rustup installs cargo here; a non-login shell (CI) may not have it on PATH
export PATH := $(HOME)/.cargo/bin:$(PATH)
BUILD ?= build
CC ?= cc
CFLAGS ?= -O2 -g
RK_CFLAGS := -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -Iruntime/include
# The runtime's code goes to its own section (rk_text) so a fault inside it is
# recognised by pc; keep the compiler from splitting functions into other
# text sections.
RT_CFLAGS := $(RK_CFLAGS) -fPIC -fno-reorder-blocks-and-partition -fno-reorder-functions -Iruntime/src

RT_SRCS := $(wildcard runtime/src/*.c)
RT_OBJS := $(patsubst runtime/src/%.c,$(BUILD)/runtime/%.o,$(RT_SRCS))
RT_HDRS := $(wildcard runtime/include/*.h) runtime/src/rk_internal.h
LIB_SO := $(BUILD)/lib/librekindle.so
LIB_A := $(BUILD)/lib/librekindle.a
PC := $(BUILD)/lib/pkgconfig/rekindle.pc
# Programs link the static library: no LD_LIBRARY_PATH games in tests.
LINK_RK := $(LIB_A) -pthread

UNIT_TESTS := $(patsubst runtime/tests/%.c,$(BUILD)/tests/%,$(wildcard runtime/tests/*.c))
TEST_APPS := $(patsubst tests/apps/%.c,$(BUILD)/apps/%,$(wildcard tests/apps/*.c))
BENCH_BINS := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
# Multi-file examples live in examples/NAME/ with a build.mk fragment that
# adds its programs to EXAMPLE_BINS (and its tests' helpers, if any).
EXAMPLE_BINS :=
include $(wildcard examples/*/build.mk)
# The fault injector (an LLVM pass) and its test and rkv targets.
include tools/faultinject/build.mk
# Error virtualization (an LLVM pass and its run-time), docs/errvirt.md.
include tools/errvirt/build.mk
# The supervisor (Rust): cargo decides what to rebuild; its outputs stay in build/.
SUPERVISOR := $(BUILD)/bin/rekindle
CARGO_FLAGS := --release --locked --manifest-path supervisor/Cargo.toml --target-dir $(abspath $(BUILD))/cargo

.PHONY: all deps runtime supervisor install uninstall test unit-test system-test demo bench bench-alloc bench-restart bench-supervisor bench-rkv bench-availability bench-stages bench-snapshots bench-snapshot-stop bench-snapshot-rkv bench-restore bench-failover bench-initial-sync fuzz-rkv lint clean
all: runtime supervisor $(TEST_APPS) $(BUILD)/apps/crashy-shared $(BENCH_BINS) $(EXAMPLES) $(EXAMPLE_BINS)
runtime: $(LIB_SO) $(LIB_A) $(PC)

deps:
	@bash scripts/deps.sh

# The installed supervisor carries no debug info (it stays in
# rekindle.debug beside it, found by gdb and perf through the debuglink):
# 58 MB instead of 8, and a restore after a reboot starts from a cold disk,
# where the larger file cost about 20 ms (docs/results.md).
supervisor:
	cargo build $(CARGO_FLAGS)
	@mkdir -p $(BUILD)/bin
	objcopy --only-keep-debug $(BUILD)/cargo/release/rekindle $(SUPERVISOR).debug
	objcopy --strip-debug --add-gnu-debuglink=$(SUPERVISOR).debug $(BUILD)/cargo/release/rekindle $(SUPERVISOR).new
	chmod 0755 $(SUPERVISOR).new
	mv -f $(SUPERVISOR).new $(SUPERVISOR)

# The Rust binding (bindings/rust, its own cargo package): links the static
# library above; its tests run the example server as real processes.
RUST_BINDING_FLAGS := --locked --manifest-path bindings/rust/Cargo.toml --target-dir $(abspath $(BUILD))/cargo-rust
RUST_BINDING_ENV := REKINDLE_LIB_DIR=$(abspath $(BUILD))/lib REKINDLE_BUILD=$(abspath $(BUILD))
.PHONY: rust-binding
rust-binding: runtime
	$(RUST_BINDING_ENV) cargo build $(RUST_BINDING_FLAGS) --all-targets
	$(RUST_BINDING_ENV) cargo test $(RUST_BINDING_FLAGS)

$(BUILD)/runtime/%.o: runtime/src/%.c $(RT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RT_CFLAGS) -c $< -o $@.tmp.o
	objcopy --rename-section .text=rk_text,alloc,load,readonly,code,contents $@.tmp.o $@
	@rm -f $@.tmp.o
	@if objdump -h $@ | grep -q ' \.text\.'; then echo "$@: code outside rk_text" >&2; exit 1; fi

$(LIB_SO): $(RT_OBJS) runtime/librekindle.map
	@mkdir -p $(dir $@)
	$(CC) -shared -pthread -Wl,-soname,librekindle.so.0 -Wl,--version-script=runtime/librekindle.map -o $@.0 $(RT_OBJS)
	ln -sf librekindle.so.0 $@
$(LIB_A): $(RT_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
$(PC): runtime/rekindle.pc.in
	@mkdir -p $(dir $@)
	sed -e 's|@PREFIX@|$(abspath $(BUILD))|' -e 's|@INCLUDEDIR@|$(abspath runtime/include)|' $< > $@

# `make install PREFIX=/opt/rekindle` (default /usr/local; DESTDIR for
# staging): the library (static and shared), headers, pkg-config file, the
# `rekindle` binary and its man pages, generated from the CLI's definition.
PREFIX ?= /usr/local
INSTALL_FILES := lib/librekindle.a lib/librekindle.so.0 lib/librekindle.so lib/pkgconfig/rekindle.pc \
	include/rekindle.h include/rekindle_stages.h bin/rekindle \
	$(addprefix share/man/man1/,rekindle.1 rekindle-run.1 rekindle-status.1 rekindle-ps.1 rekindle-restart.1 rekindle-stop.1 rekindle-inspect.1 \
		rekindle-snapshots.1 rekindle-verify.1 rekindle-gc.1 rekindle-send.1 rekindle-recv.1 rekindle-cluster.1)
install: runtime supervisor
	@case "$(PREFIX)" in /*) ;; *) echo "make install: PREFIX must be an absolute path, not '$(PREFIX)'" >&2; exit 2;; esac
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 0644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 0755 $(LIB_SO).0 $(DESTDIR)$(PREFIX)/lib/
	ln -sf librekindle.so.0 $(DESTDIR)$(PREFIX)/lib/librekindle.so
	install -m 0644 runtime/include/rekindle.h runtime/include/rekindle_stages.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@INCLUDEDIR@|$(PREFIX)/include|' runtime/rekindle.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/rekindle.pc
	install -m 0755 $(SUPERVISOR) $(DESTDIR)$(PREFIX)/bin/
	$(BUILD)/cargo/release/rekindle-man $(DESTDIR)$(PREFIX)/share/man/man1
uninstall:
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/,$(INSTALL_FILES))

$(BUILD)/tests/%: runtime/tests/%.c $(LIB_A) $(RT_HDRS) $(wildcard runtime/tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RK_CFLAGS) -Iruntime/src $< -o $@ $(LINK_RK)
$(BUILD)/apps/%: tests/apps/%.c $(LIB_A) $(RT_HDRS) $(wildcard tests/apps/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RK_CFLAGS) $< -o $@ $(LINK_RK)
# the same test app against the shared library, to test that build too
$(BUILD)/apps/crashy-shared: tests/apps/crashy.c $(LIB_SO) $(RT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RK_CFLAGS) $< -o $@ -L$(BUILD)/lib -lrekindle -Wl,-rpath,$(abspath $(BUILD))/lib -pthread
$(BUILD)/bench/%: bench/%.c $(LIB_A) $(RT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RK_CFLAGS) $< -o $@ $(LINK_RK)
$(BUILD)/examples/%: examples/%.c $(LIB_A) $(RT_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(RK_CFLAGS) $< -o $@ $(LINK_RK)

# $(RKV_FUZZ) by name: `all` leaves it out where clang was missing when make
# started, and deps has installed it by now (tests/test_rkv_fuzz.py needs it)
test: deps all $(UNIT_TESTS) $(RKV_FUZZ) redis-port
	@bash scripts/run-tests.sh $(BUILD)
# the C unit tests alone (`make test` runs them with everything else)
unit-test: $(UNIT_TESTS)
	@fail=0; for t in $(UNIT_TESTS); do $$t || { echo "FAILED: $$t" >&2; fail=1; }; done; exit $$fail
# the system tests alone (pytest; real processes, the supervisor, rkv, QEMU)
system-test: all
	REKINDLE_BUILD=$(abspath $(BUILD)) python3 -m pytest -q tests

demo: deps all rkv-ev
	@bash scripts/demo.sh $(BUILD)

bench: bench-alloc bench-restart bench-supervisor bench-rkv bench-availability bench-stages
bench-alloc: deps all
	@bash bench/run_alloc.sh $(BUILD)
bench-restart: deps all
	@bash bench/run_restart.sh $(BUILD)
bench-supervisor: deps all
	python3 bench/supervisor_bench.py $(BUILD) --sizes 1024 8192 --rounds 7
# rkv against real Redis 7, same run: redis-benchmark GET/SET, 50 clients
bench-rkv: deps all
	python3 bench/rkv_throughput.py $(BUILD)
# crash mid-run, four ways back; table and PNG timeline in bench/results/
bench-availability: deps all
	python3 bench/availability.py $(BUILD)
# the stage example: mid-run crash vs from scratch vs periodic checkpoint
bench-stages: deps all
	python3 bench/stages_bench.py $(BUILD)
# durable snapshots (docs/results.md "Durable snapshots"): all three below
bench-snapshots: bench-snapshot-stop bench-snapshot-rkv bench-restore
# the stop per snapshot at 2 and 8 GiB, 0.1 to 10% of pages written per interval
bench-snapshot-stop: deps all
	python3 bench/snapshot_bench.py $(BUILD) --sizes-mb 2048 8192 --permille 1 10 100
# rkv under snapshots and --durability sync against Redis 7's AOF and BGSAVE:
# redis-benchmark throughput, memory, disk
bench-snapshot-rkv: deps all
	python3 bench/snapshot_rkv_bench.py $(BUILD) --repeat 5 --keys 1000000
# restore after the machine dies (1 M and 5 M keys) against Redis's RDB and
# AOF, and acknowledged writes lost under load; root (drop_caches)
bench-restore: deps all
	python3 bench/restore_bench.py $(BUILD) --keys 1000000 5000000 --repeat 3
# Failover (issue 14): Rekindle (etcd + rkv nodes, sync/async) against Redis +
# Sentinel on network-namespace hosts (root); kill -9, partitions; failover
# time as a client sees it, acknowledged writes lost; bench/results/failover.*
bench-failover: deps all
	python3 bench/failover_bench.py $(BUILD) --repeat 3 --keys 1000000

# A standby joining late at 5 M keys, against a Redis 7 replica (root).
bench-initial-sync: deps all
	python3 bench/initial_sync_bench.py $(BUILD) --repeat 2 --keys 5000000

# A long fuzzing campaign of rkv (examples/rkv/fuzz/README.md): new inputs
# go to $(BUILD)/fuzz/rkv-corpus, crashes to $(BUILD)/fuzz/; the corpus in
# the repository is read, never written.
FUZZ_SECONDS ?= 600
fuzz-rkv: deps $(RKV_FUZZ)
	@mkdir -p $(BUILD)/fuzz/rkv-corpus
	$(RKV_FUZZ) -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 -dict=examples/rkv/fuzz/dict \
		-artifact_prefix=$(BUILD)/fuzz/ -print_final_stats=1 $(BUILD)/fuzz/rkv-corpus examples/rkv/fuzz/corpus

lint: runtime
	@command -v ruff >/dev/null || { echo "lint: installing ruff (pip)" >&2; python3 -m pip install -q ruff; }
	ruff check tests bench scripts tools
	cargo fmt --manifest-path supervisor/Cargo.toml -- --check
	cargo clippy $(CARGO_FLAGS) --all-targets -- -D warnings
	cargo fmt --manifest-path bindings/rust/Cargo.toml -- --check
	$(RUST_BINDING_ENV) cargo clippy $(RUST_BINDING_FLAGS) --all-targets -- -D warnings

clean:
	rm -rf $(BUILD)

# The fault campaign (issue 15; docs/faultinject.md, "The campaign"): rkv and
# the Redis port built with the injector into $(BUILD)/faults, RUNS runs per
# target and configuration (with and without unsafe regions); writes
# bench/results/faults.{json,md,png}.  `make test` builds the rkv one for
# tests/test_fault_campaign.py.  FAULT_METHODS=ours,phoenix adds PHOENIX's
# method (docs/faultinject.md, "PHOENIX's method and ours").
RUNS ?= 100
FAULT_TARGETS ?= rkv,redis
FAULT_SEED ?= 1
FAULT_METHODS ?= ours
.PHONY: faults-build bench-faults
$(BUILD)/faults/rkv-fi: $(RKV_SRCS) $(RKV_HDRS) $(LIB_A) $(RT_HDRS) bench/faults/fi_shim.c bench/faults/build.sh $(FI_PLUGIN) $(FI_RT) $(FI_CC)
	BUILD=$(BUILD) bash bench/faults/build.sh rkv
faults-build: deps runtime supervisor faultinject
	BUILD=$(BUILD) bash bench/faults/build.sh all
bench-faults: faults-build
	python3 bench/faults/campaign.py --runs $(RUNS) --targets $(FAULT_TARGETS) --seed $(FAULT_SEED) --methods $(FAULT_METHODS) --build $(BUILD)
# the instrumented Redis port (build.sh rebuilds it only when a patch or
# the runtime changed): about 4 min on 2 cores, so its two tests in
# tests/test_fault_campaign.py (patches 0004 and 0005) run by
# `make test-faults-redis` (and `make test-redis`), not by `make test`
.PHONY: faults-redis test-faults-redis
faults-redis: deps runtime faultinject
	BUILD=$(BUILD) bash bench/faults/build.sh redis
test-faults-redis: deps all faults-redis
	REKINDLE_FAULTS_REDIS=1 REKINDLE_BUILD=$(abspath $(BUILD)) python3 -m pytest -q tests/test_fault_campaign.py -k "test_redis_event_loop or test_redis_keyspace_check"
test-redis: test-faults-redis
test system-test: $(BUILD)/faults/rkv-fi
