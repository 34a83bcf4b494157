"""The control socket under a flood of connections from our own uid: threads
open connections to NAME.sock as fast as they can and keep them open, saying
nothing or half a line, while `rekindle status` runs again and again and
then `rekindle stop`.  Every one of those must be answered: a client that
sends its request line at once is never evicted in favour of the flood.

Bounded: at most FLOOD_MAX connections in all, at most HELD of them open at
once (the oldest are closed), for at most FLOOD_SECONDS."""

import json
import socket
import threading
import time

import pytest

FLOODERS = 3
FLOOD_MAX = 400_000
FLOOD_SECONDS = 60.0
HELD = 500
STATUS_CALLS = 12


class Flood:
    """FLOODERS threads connecting to `path` until stopped or bounded; in
    "partial" mode each connection sends the start of a request and no
    more."""

    def __init__(self, path, mode):
        self.path = str(path)
        self.partial = mode == "partial"
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.held = []
        self.connections = 0
        self.refused = 0  # backlog full and the like: part of a flood
        self.deadline = time.monotonic() + FLOOD_SECONDS
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(FLOODERS)]

    def run(self):
        while not self.stopped.is_set() and time.monotonic() < self.deadline:
            with self.lock:
                if self.connections >= FLOOD_MAX:
                    return
            s = socket.socket(socket.AF_UNIX)
            try:
                s.settimeout(0.2)
                s.connect(self.path)
                if self.partial:
                    s.send(b'{"cmd":')
            except OSError:
                s.close()
                with self.lock:
                    self.refused += 1
                time.sleep(0.001)
                continue
            with self.lock:
                self.held.append(s)
                self.connections += 1
                if len(self.held) > HELD:
                    self.held.pop(0).close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        for t in self.threads:
            t.join(timeout=10)
        with self.lock:
            for s in self.held:
                s.close()
            self.held.clear()


@pytest.mark.parametrize("mode", ["idle", "partial"])
def test_status_and_stop_get_through_a_connection_flood(supervise, mode):
    sup = supervise(name="flooded")
    sup.wait_up(0)
    sock = sup.runtime_dir / "flooded.sock"
    failures = []
    latencies = []
    with Flood(sock, mode) as flood:
        # the flood is in full swing: the table is full and turning over
        while flood.connections < 2000 and time.monotonic() < flood.deadline:
            time.sleep(0.02)
        assert flood.connections >= 2000, "the flood did not get going"
        for _ in range(STATUS_CALLS):
            t0 = time.monotonic()
            p = sup.cli("status", "flooded", "--json", check=False)
            latencies.append(time.monotonic() - t0)
            if p.returncode != 0:
                failures.append((p.stderr or p.stdout).strip())
            else:
                assert json.loads(p.stdout)["name"] == "flooded", p.stdout
            time.sleep(0.1)
        t0 = time.monotonic()
        stop = sup.cli("stop", "flooded", check=False)
        stop_took = time.monotonic() - t0
        during = flood.connections
    stopped = stop.returncode == 0 and "flooded: stopped" in stop.stdout
    assert not failures and stopped, (
        f"{len(failures)} of {STATUS_CALLS} status calls failed: {failures[:3]}; "
        f"stop: {stop.returncode} {(stop.stdout + stop.stderr).strip()}"
    )
    assert sup.proc.wait(timeout=20) == 0
    # answered promptly, not after a timeout and a retry
    assert max(latencies) < 3, latencies
    assert stop_took < 10, stop_took
    # a real flood: several thousand connections came and went meanwhile
    assert during > 10 * 64, during
