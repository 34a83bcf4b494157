#!/usr/bin/env bash
# Installs what the build, tests and benchmarks need, only where missing.
# Idempotent; run by `make demo`, `make test` and `make bench`.
set -euo pipefail

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }
have cc || need_apt+=(gcc)
have make || need_apt+=(make)
have objcopy || need_apt+=(binutils)
have pkg-config || need_apt+=(pkg-config) # tests/test_install.py builds with it
have python3 || need_apt+=(python3 python3-pip)
# The supervisor is Rust (crates.io).  The image has rustup's toolchain;
# Debian's cargo is the fallback where it is missing.
have cargo || [ -x "$HOME/.cargo/bin/cargo" ] || need_apt+=(cargo)
# Real Redis 7 and its clients: rkv's tests and benchmarks drive both.
have redis-server || need_apt+=(redis-server)
have redis-cli && have redis-benchmark || need_apt+=(redis-tools)
# rkv's fuzz target (examples/rkv/fuzz): clang and its libFuzzer runtime.
have clang-19 || need_apt+=(clang-19)
dpkg -s libclang-rt-19-dev >/dev/null 2>&1 || need_apt+=(libclang-rt-19-dev)
# The fault injector (tools/faultinject): LLVM's headers, and FileCheck/lit.
have llvm-config-19 || need_apt+=(llvm-19-dev)
have FileCheck-19 || need_apt+=(llvm-19-tools)
# Redis from Debian's source package (examples/redis): dpkg-source to unpack
# it, patch for our series, the libraries debian/rules builds with, and tcl
# for Redis's own test suite.
have dpkg-source || need_apt+=(dpkg-dev)
have patch || need_apt+=(patch)
have gdb || need_apt+=(gdb) # tests/test_redis_port.py stops the port inside XACK/XCLAIM
have tclsh8.6 || need_apt+=(tcl8.6)
# Failover (docs/failover.md): a real etcd (server and etcdctl) that the
# tests, benchmarks and the demo start in network namespaces.
have etcd || need_apt+=(etcd-server)
have etcdctl || need_apt+=(etcd-client)
# lossy links for the failover tests: nftables drops a share of a host's
# packets (this kernel has no tc netem: CONFIG_NET_SCH_NETEM is not set)
have nft || need_apt+=(nftables)
# the etcd client crate (etcd-client) compiles etcd's .proto files: protoc
have protoc || need_apt+=(protobuf-compiler)
# error virtualization's overhead on lighttpd and nginx (tools/errvirt): wrk
have wrk || need_apt+=(wrk)
for p in libjemalloc-dev liblzf-dev libsystemd-dev libssl-dev debian-archive-keyring; do
	dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
	echo "deps: installing ${need_apt[*]} (apt)" >&2
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: need root to apt-get install ${need_apt[*]}" >&2
		exit 1
	fi
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Python test tooling (PyPI), pinned in tests/requirements.txt.
if ! python3 -c 'import pytest, redis, matplotlib' >/dev/null 2>&1; then
	echo "deps: installing Python test requirements (pip)" >&2
	python3 -m pip install -q -r "$(dirname "$0")/../tests/requirements.txt"
fi

# QEMU and a kernel image for the pkeys emulation test (tests/test_pkeys.py),
# only where the host CPU has no PKU (or REKINDLE_PKEYS_QEMU=1).
bash "$(dirname "$0")/../tests/pkeys/deps.sh"
# the power-cut test (tests/powercut): QEMU and a 6.7+ Debian kernel package
# downloaded into build/powercut (never installed); 77: cannot be had (the test skips)
bash "$(dirname "$0")/../tests/powercut/deps.sh" "${BUILD:-build}" || [ $? -eq 77 ]
