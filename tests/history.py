"""A client-side history for the failover tests: every operation a client
did, with its outcome and CLOCK_MONOTONIC times (the clock of the events'
t_ns on this machine), and the checks run over it:

- no acknowledged write lost: every write the client saw acknowledged is
  on the server read at the end, with its value (each write sets its own
  key to its own value, so a write is identified by its key);
- no acknowledged write from a deposed term: no acknowledgement from a
  node's address that arrived after another node's term began.

An operation whose outcome the client does not know (an error or a timeout
after sending) is recorded as `unknown`: it may or may not have been
applied, and neither answer is a violation."""

import threading
import time
from dataclasses import dataclass

import redis

OK, FAILED, UNKNOWN = "ok", "failed", "unknown"


@dataclass
class Op:
    client: str
    key: str
    value: str
    addr: str | None  # the server that answered, when the client knows it
    t_start: int
    t_end: int
    outcome: str
    error: str = ""


class History:
    def __init__(self):
        self.ops: list[Op] = []
        self.lock = threading.Lock()

    def write(self, client, conn, key, value, addr=None):
        """conn.set(key, value), recorded.  Returns True if acknowledged."""
        t0 = time.monotonic_ns()
        try:
            r = conn.set(key, value)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            self._add(Op(client, key, value, addr, t0, time.monotonic_ns(), UNKNOWN, repr(e)))
            return False
        except redis.ResponseError as e:
            self._add(Op(client, key, value, addr, t0, time.monotonic_ns(), FAILED, repr(e)))
            return False
        outcome = OK if r is True else FAILED
        detail = "" if r is True else repr(r)
        self._add(Op(client, key, value, addr, t0, time.monotonic_ns(), outcome, detail))
        return r is True

    def _add(self, op):
        with self.lock:
            self.ops.append(op)

    def acked(self):
        with self.lock:
            return [o for o in self.ops if o.outcome == OK]

    def count(self, outcome=OK):
        with self.lock:
            return sum(1 for o in self.ops if o.outcome == outcome)


def check_no_acked_write_lost(history, reader, batch=500):
    """Every acknowledged write is on `reader` (a redis client of the
    server that serves now), with its value.  Returns the number checked."""
    acked = history.acked()
    lost = []
    for i in range(0, len(acked), batch):
        part = acked[i : i + batch]
        values = reader.mget([o.key for o in part])
        for o, v in zip(part, values, strict=True):
            if v != o.value.encode():
                lost.append((o.key, o.value, v))
    assert not lost, f"{len(lost)} acknowledged writes lost or changed (of {len(acked)}): {lost[:10]}"
    return len(acked)


def check_no_ack_from_deposed(history, addr, deposed_at_ns):
    """No acknowledgement from `addr` (HOST:PORT of the old primary) arrived
    after `deposed_at_ns` (the new term's start, CLOCK_MONOTONIC ns)."""
    late = [o for o in history.acked() if o.addr == addr and o.t_end > deposed_at_ns]
    assert not late, f"{len(late)} acknowledgements from the deposed primary {addr}: {late[:5]}"
