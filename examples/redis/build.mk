# examples/redis: Redis 7.0.15 from Debian's source package, stock and
# ported to Rekindle (examples/redis/README.md).  Not part of `all`: the
# fetch and the two builds take a few minutes.
#   make redis        fetch (cached), build stock and the port
#   make test-redis   Redis's own test suite, whole, against the port
#   make test-redis-stock   the same against the stock build
#   make test-redis-bugs    PHOENIX's R1, R3, R4 re-created (examples/redis/bugs)
#   make bench-redis  the port against stock: redis-benchmark, availability
.PHONY: redis redis-port test-redis test-redis-stock test-redis-bugs bench-redis
redis-port: deps runtime
	@bash examples/redis/build.sh rekindle
redis: redis-port
	@bash examples/redis/build.sh stock
test-redis: redis-port test-redis-bugs
	@bash examples/redis/runtest.sh rekindle
test-redis-bugs: deps all redis-port
	REKINDLE_REDIS_BUGS=1 REKINDLE_BUILD=$(abspath $(BUILD)) python3 -m pytest -q tests/test_redis_bugs.py
bench-redis: deps all redis
	python3 bench/redis_port_bench.py $(BUILD)
test-redis-stock: redis
	@bash examples/redis/runtest.sh stock
