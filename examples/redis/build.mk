# examples/redis: Redis 7.0.15 from Debian's source package, stock and
# ported to Rekindle (examples/redis/README.md).  Not part of `all`: the
# fetch and the two builds take a few minutes.
#   make redis        fetch (cached), build stock and the port
#   make test-redis   Redis's own test suite, whole, against the port
#   make test-redis-stock   the same against the stock build
.PHONY: redis redis-port test-redis test-redis-stock
redis-port: deps runtime
	@bash examples/redis/build.sh rekindle
redis: redis-port
	@bash examples/redis/build.sh stock
test-redis: redis-port
	@bash examples/redis/runtest.sh rekindle
test-redis-stock: redis
	@bash examples/redis/runtest.sh stock
