#!/usr/bin/env bash
# Runs every test: the runtime's C unit tests, the supervisor's and the Rust
# binding's cargo tests, then the pytest system tests.
set -uo pipefail
BUILD=${1:-build}
export REKINDLE_BUILD="$(cd "$BUILD" && pwd)"
fail=0
passed=0
for t in "$BUILD"/tests/*; do
	[ -x "$t" ] || continue
	echo "== unit: $(basename "$t")"
	start=$(date +%s%N)
	if "$t"; then
		passed=$((passed + 1))
		echo "   ok ($((($(date +%s%N) - start) / 1000000)) ms)"
	else
		echo "   FAILED: $t" >&2
		fail=$((fail + 1))
	fi
done
echo "unit: $passed passed, $fail failed"
echo "== supervisor: cargo test"
if ! cargo test --release --locked --quiet --manifest-path supervisor/Cargo.toml --target-dir "$REKINDLE_BUILD/cargo"; then
	echo "   FAILED: cargo test" >&2
	fail=$((fail + 1))
fi
echo "== rust binding: cargo test"
if ! REKINDLE_LIB_DIR="$REKINDLE_BUILD/lib" cargo test --locked --quiet --manifest-path bindings/rust/Cargo.toml --target-dir "$REKINDLE_BUILD/cargo-rust"; then
	echo "   FAILED: rust binding cargo test" >&2
	fail=$((fail + 1))
fi
python3 -m pytest -q tests
rc=$?
if [ "$fail" -ne 0 ]; then
	exit 1
fi
exit $rc
