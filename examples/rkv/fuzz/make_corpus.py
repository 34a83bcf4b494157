#!/usr/bin/env python3
"""Writes the seed corpus of the rkv fuzz target (corpus/, next to this file).

Each seed is one byte that says how the fuzz target cuts the input into
reads (0: one read; see rkv_fuzz.c), then what a client sends.  The seeds
are written from this table so that they can be read and changed here; run
it again after a change and commit both.  Regression seeds (inputs that once
crashed) are kept in corpus/ under names starting with "regress-" and are
not touched by this script."""

import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"

ONE_READ = b"\x00"
BYTE_AT_A_TIME = b"\x08"  # reads of 1 byte (2^(8 & 7))
SHORT_READS = b"\x03"  # reads of 1..8 bytes
LONG_READS = b"\x06"  # reads of 1..64 bytes


def mb(*args):
    """One request in RESP multibulk form."""
    out = b"*%d\r\n" % len(args)
    for arg in args:
        a = arg if isinstance(arg, bytes) else str(arg).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def mbs(*commands):
    return b"".join(mb(*c) for c in commands)


SEEDS = {
    # ---- strings
    "string-set-get": mbs(
        ("SET", "k", "v"), ("GET", "k"), ("GET", "missing"), ("STRLEN", "k"), ("TYPE", "k")
    ),
    "string-set-options": mbs(
        ("SET", "k", "v", "NX"),
        ("SET", "k", "w", "XX", "GET"),
        ("SET", "k", "x", "EX", "10"),
        ("SET", "k", "y", "PX", "1500", "GET"),
        ("SET", "k", "z", "KEEPTTL"),
        ("SET", "k", "a", "EXAT", "2000000005"),
        ("SET", "k", "b", "PXAT", "2000000000500"),
        ("SET", "k", "c", "NX", "XX"),
        ("SET", "k", "c", "EX", "0"),
        ("SET", "k", "c", "EX", "9223372036854775807"),
        ("SET", "k", "c", "KEEPTTL", "EX", "1"),
    ),
    "string-setnx-setex": mbs(
        ("SETNX", "k", "1"),
        ("SETNX", "k", "2"),
        ("SETEX", "s", "100", "v"),
        ("PSETEX", "p", "1", "v"),
        ("SETEX", "s", "-1", "v"),
        ("GETSET", "k", "3"),
        ("GETDEL", "k"),
        ("GETDEL", "k"),
    ),
    "string-mset-mget": mbs(
        ("MSET", "a", "1", "b", "2", "c", "3"), ("MGET", "a", "b", "nope", "c"), ("MSET", "a")
    ),
    "string-incr": mbs(
        ("INCR", "n"),
        ("INCRBY", "n", "41"),
        ("DECR", "n"),
        ("DECRBY", "n", "-9223372036854775808"),
        ("SET", "m", "9223372036854775806"),
        ("INCR", "m"),
        ("INCR", "m"),
        ("DECRBY", "n", "x"),
        ("SET", "s", "abc"),
        ("INCR", "s"),
        ("SET", "z", "007"),
        ("INCR", "z"),
    ),
    "string-append": mbs(
        ("APPEND", "a", "x"),
        ("APPEND", "a", "y" * 40),
        ("APPEND", "a", "z" * 200),
        ("GET", "a"),
        ("SET", "a", "short"),
        ("APPEND", "a", ""),
        ("STRLEN", "a"),
    ),
    "string-overwrite-sizes": mbs(
        ("SET", "k", "x" * 300),
        ("SET", "k", "y"),
        ("SET", "k", "z" * 100),
        ("SET", "k", "w" * 2000),
        ("GET", "k"),
    ),
    # ---- keys and expiry (a tuple: how to read, then the bytes)
    "keys-del-exists": mbs(
        ("MSET", "a", "1", "b", "2"),
        ("EXISTS", "a", "b", "c", "a"),
        ("DEL", "a", "c"),
        ("UNLINK", "b"),
        ("DBSIZE",),
    ),
    "keys-expire-options": mbs(
        ("SET", "k", "v"),
        ("EXPIRE", "k", "100", "NX"),
        ("EXPIRE", "k", "50", "GT"),
        ("EXPIRE", "k", "50", "LT"),
        ("PEXPIRE", "k", "1000", "XX"),
        ("EXPIRE", "k", "1", "NX", "XX"),
        ("EXPIRE", "k", "1", "GT", "LT"),
        ("EXPIRE", "k", "1", "FOO"),
        ("TTL", "k"),
        ("PTTL", "k"),
        ("PERSIST", "k"),
        ("TTL", "k"),
        ("EXPIREAT", "k", "2000000100"),
        ("PEXPIREAT", "k", "1"),
        ("EXISTS", "k"),
    ),
    "keys-expire-overflow": mbs(
        ("SET", "k", "v"),
        ("EXPIRE", "k", "9223372036854775807"),
        ("PEXPIRE", "k", "-9223372036854775808"),
        ("EXPIREAT", "k", "-1"),
        ("PEXPIRE", "k", "9223372036854775807"),
    ),
    "keys-keys-patterns": mbs(
        ("MSET", "hello", "1", "hallo", "2", "hxllo", "3", "heeeello", "4", "h*llo", "5"),
        ("KEYS", "*"),
        ("KEYS", "h?llo"),
        ("KEYS", "h*llo"),
        ("KEYS", "h[ae]llo"),
        ("KEYS", "h[^e]llo"),
        ("KEYS", "h[a-b]llo"),
        ("KEYS", "h\\*llo"),
        ("KEYS", "[z-a]*"),
        ("KEYS", "h["),
        ("KEYS", "***"),
    ),
    "keys-scan": mbs(
        ("MSET", *[f"key:{i}" for i in range(40) for _ in (0, 1)]),
        ("SCAN", "0"),
        ("SCAN", "0", "COUNT", "5"),
        ("SCAN", "7", "MATCH", "key:1*", "COUNT", "100"),
        ("SCAN", "0", "TYPE", "string"),
        ("SCAN", "0", "TYPE", "list"),
        ("SCAN", "18446744073709551615"),
        ("SCAN", "x"),
        ("SCAN", "0", "COUNT", "0"),
        ("SCAN", "0", "COUNT"),
    ),
    "keys-ttl-expiring": (
        SHORT_READS,
        mbs(("SET", "a", "1", "PX", "1"), ("SET", "b", "2", "PX", "700"), ("SET", "c", "3", "EX", "1"))
        + b"GET a\r\nGET b\r\nTTL c\r\nPTTL b\r\nDBSIZE\r\nKEYS *\r\nSCAN 0\r\n",
    ),
    "keys-many-ttls": (
        LONG_READS,
        mbs(*[("SET", f"t{i}", "v", "PX", str(1 + 37 * i)) for i in range(30)])
        + mbs(("DBSIZE",), ("PERSIST", "t29"), ("DEL", "t28")),
    ),
    "keys-grow-flush": mbs(*[("SET", f"k{i}", "v") for i in range(70)])
    + mbs(("FLUSHALL",), ("DBSIZE",))
    + mbs(*[("SET", f"k{i}", "v", "EX", "5") for i in range(20)])
    + mbs(("FLUSHDB", "ASYNC"), ("FLUSHALL", "x")),
    # ---- server
    "server-info": mbs(
        ("INFO",),
        ("INFO", "server"),
        ("INFO", "memory", "keyspace"),
        ("INFO", "all"),
        ("INFO", "everything"),
        ("INFO", "default"),
        ("INFO", "nosuch"),
    ),
    "server-config": mbs(
        ("CONFIG", "GET", "*"),
        ("CONFIG", "GET", "max*", "s?ve"),
        ("CONFIG", "SET", "maxmemory", "1kb"),
        ("SET", "k", "x" * 2000),
        ("SET", "j", "y"),
        ("CONFIG", "SET", "maxmemory", "0"),
        ("CONFIG", "SET", "save", "10 1 20"),
        ("CONFIG", "GET", "save"),
        ("CONFIG", "SET", "save", "x"),
        ("CONFIG", "SET", "port", "1"),
        ("CONFIG", "RESETSTAT"),
        ("CONFIG", "GET"),
        ("CONFIG", "FOO"),
    ),
    "server-save": mbs(
        ("MSET", "a", "1", "b", "2"),
        ("SET", "t", "v", "EX", "100"),
        ("SAVE",),
        ("LASTSAVE",),
        ("BGSAVE",),
        ("BGSAVE", "SCHEDULE"),
        ("SAVE", "x"),
    ),
    "server-misc": mbs(
        ("DBSIZE",), ("TIME",), ("SELECT", "0"), ("SELECT", "1"), ("SELECT", "x"), ("LASTSAVE",)
    ),
    "server-refused": mbs(("DEBUG", "SLEEP", "1"), ("DEBUG", "SEGFAULT"), ("SHUTDOWN", "NOSAVE"), ("PING",)),
    # ---- connection
    "conn-ping-echo": mbs(("PING",), ("PING", "hi"), ("PING", "a", "b"), ("ECHO", "x"), ("ECHO",)),
    "conn-hello": mbs(
        ("HELLO",),
        ("HELLO", "3"),
        ("GET", "nope"),
        ("CONFIG", "GET", "port"),
        ("HELLO", "3", "SETNAME", "me"),
        ("HELLO", "4"),
        ("HELLO", "x"),
        ("HELLO", "2", "AUTH", "u", "p"),
        ("HELLO", "2"),
    ),
    "conn-client": mbs(
        ("CLIENT", "SETNAME", "conn1"),
        ("CLIENT", "GETNAME"),
        ("CLIENT", "ID"),
        ("CLIENT", "SETINFO", "LIB-NAME", "x"),
        ("CLIENT", "SETNAME", "bad name"),
        ("CLIENT", "SETNAME", ""),
        ("CLIENT", "GETNAME", "x"),
        ("CLIENT", "KILL"),
    ),
    "conn-command": mbs(
        ("COMMAND",), ("COMMAND", "COUNT"), ("COMMAND", "COUNT", "x"), ("COMMAND", "DOCS", "GET")
    ),
    "conn-quit": mbs(("SET", "k", "v"), ("QUIT",), ("GET", "k")),
    "conn-unknown-arity": mbs(("NOSUCH", "a", "b" * 200), ("GET",), ("GET", "a", "b"), ("", "x"), ("set",)),
    # ---- inline
    "inline-basic": b"PING\r\nSET k v\r\nGET k\r\n\r\n\r\nset  k2\t v2 \r\nmget k k2\nEXISTS k\r\n",
    "inline-quotes": b'SET "a b" "c\\x41\\n\\t\\"d"\r\nGET "a b"\r\nSET \'q\' \'it\\\'s\'\r\nECHO "\\x4"\r\n'
    b'ECHO "\\xzz"\r\nECHO ""\r\n',
    "inline-unbalanced": b'SET "a b c\r\nPING\r\n',
    "inline-quote-then-text": b'SET "a"b c\r\n',
    "inline-long": b"ECHO " + b"x" * 3000 + b"\r\nPING\r\n",
    # ---- pipelines, several reads
    "pipeline-mixed": mbs(("SET", "a", "1"), ("INCR", "a"))
    + b"GET a\r\n"
    + mbs(("MGET", "a", "b"))
    + b"PING\r\n",
    "pipeline-bytewise": (
        BYTE_AT_A_TIME,
        mbs(("SET", "key", "value"), ("APPEND", "key", "more"), ("GET", "key")) + b"DEL key\r\n",
    ),
    "pipeline-binary": mbs(
        ("SET", b"\x00\r\n\xff", b"\r\n*1\r\n$4\r\n"), ("GET", b"\x00\r\n\xff"), ("KEYS", "*")
    ),
    "pipeline-big-bulk": (LONG_READS, mbs(("SET", "big", "B" * 3000), ("GET", "big"), ("STRLEN", "big"))),
    "pipeline-empty-arrays": b"*0\r\n*-1\r\n" + mb("PING") + b"*0\r\n",
    # ---- malformed and partial
    "bad-mbulk-count": b"*abc\r\n",
    "bad-mbulk-huge": b"*1048577\r\n$4\r\nPING\r\n",
    "bad-mbulk-max": b"*1048576\r\n$4\r\nPING\r\n$1\r\nx\r\n",
    "bad-mbulk-digits": b"*1234567890123456789\r\n",
    "bad-mbulk-no-cr": b"*1\n$4\r\nPING\r\n",
    "bad-expected-dollar": b"*2\r\n$3\r\nGET\r\n:1\r\n",
    "bad-bulk-negative": b"*1\r\n$-1\r\n",
    "bad-bulk-letters": b"*1\r\n$x\r\nPING\r\n",
    "bad-bulk-too-big": b"*2\r\n$4\r\nECHO\r\n$536870913\r\nx\r\n",
    "partial-bulk-huge": b"*2\r\n$4\r\nECHO\r\n$536870912\r\nonly a few bytes of it",
    "partial-count-line": b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1",
    "partial-mid-bulk": (SHORT_READS, mbs(("SET", "a", "1")) + b"*2\r\n$3\r\nGET\r\n$5\r\nab"),
    "partial-inline": b"SET a b",
    "bad-bulk-no-crlf": b"*2\r\n$4\r\nECHOxx$1\r\nab\r\n*1\r\n$4\r\nPING\r\n",
}


def main():
    CORPUS.mkdir(exist_ok=True)
    for old in CORPUS.iterdir():
        if not old.name.startswith("regress-"):
            old.unlink()
    for name, seed in SEEDS.items():
        # a seed is what the client sends, in one read unless it says how
        reads, body = seed if isinstance(seed, tuple) else (ONE_READ, seed)
        (CORPUS / name).write_bytes(reads + body)
    print(f"{len(SEEDS)} seeds in {CORPUS}", file=sys.stderr)


if __name__ == "__main__":
    main()
