"""Error virtualization on a real Debian server: lighttpd 1.4.69 from
Debian's source package, unchanged, built with rekindle-ev-cc
(tools/errvirt/servers/lighttpd.sh).  It serves files and errors on
keep-alive connections like any build, its loadable modules use the
program's copy of the run-time, its transactions pass gates, nothing is
rolled back, and SIGTERM stops it cleanly.  (No crash is injected here yet:
docs/errvirt.md, "Not done yet".)"""

import http.client
import json
import os
import signal
import subprocess
import time

import pytest
from supervisor_harness import free_port

from conftest import BUILD

INST = BUILD / "errvirt" / "lighttpd-ev" / "inst"
LIGHTTPD = INST / "sbin" / "lighttpd"


def ev_lines(text, kind):
    out = [json.loads(line) for line in text.splitlines() if line.startswith('{"rekindle_ev"')]
    return [e for e in out if e["rekindle_ev"] == kind]


@pytest.fixture
def lighttpd(tmp_path):
    if not LIGHTTPD.exists():
        pytest.fail(f"{LIGHTTPD} missing: run `make errvirt-lighttpd` first")
    www = tmp_path / "www"
    www.mkdir()
    (www / "index.html").write_text("hello from lighttpd\n")
    (www / "big.bin").write_bytes(os.urandom(256 * 1024))
    port = free_port()
    conf = tmp_path / "lighttpd.conf"
    conf.write_text(
        f'server.document-root = "{www}"\n'
        f"server.port = {port}\n"
        'server.bind = "127.0.0.1"\n'
        f'server.errorlog = "{tmp_path / "error.log"}"\n'
        'index-file.names = ("index.html")\n'
        'mimetype.assign = (".html" => "text/html", ".bin" => "application/octet-stream")\n'
    )
    err = open(tmp_path / "stderr", "w")  # noqa: SIM115 - closed below
    env = dict(os.environ, REKINDLE_EV_REPORT="1")
    proc = subprocess.Popen(
        [str(LIGHTTPD), "-D", "-f", str(conf), "-m", str(INST / "lib")], stderr=err, env=env
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            probe = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            probe.request("HEAD", "/")
            probe.getresponse().read()
            probe.close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"lighttpd did not serve: {(tmp_path / 'stderr').read_text()[-2000:]}")
            time.sleep(0.05)
    yield proc, port, www, tmp_path / "stderr"
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    err.close()


def test_lighttpd_serves_unchanged(lighttpd):
    proc, port, www, stderr = lighttpd
    big = (www / "big.bin").read_bytes()
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=5) for _ in range(3)]
    for i in range(30):
        c = conns[i % 3]
        c.request("GET", "/")
        r = c.getresponse()
        assert (r.status, r.read()) == (200, b"hello from lighttpd\n")
        c.request("GET", f"/missing-{i}")
        r = c.getresponse()
        r.read()
        assert r.status == 404
    conns[0].request("GET", "/big.bin")
    r = conns[0].getresponse()
    assert r.status == 200 and r.read() == big
    for c in conns:
        c.close()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=10)
    text = stderr.read_text()
    # lighttpd's own status: 1 when a connection was still open at the stop
    # (server.c: rc = 0 only if srv->conns is empty), which a client's close
    # racing the signal decides; a signal's death would be negative.
    assert rc in (0, 1), text[-2000:]
    assert "server stopped by UID" in (stderr.parent / "error.log").read_text()
    (report,) = ev_lines(text, "report")
    assert report["gates"] > 60  # at least a read and an accept or epoll_wait per request
    assert report["recoveries"] == 0 and report["fallbacks"] == 0
    assert not ev_lines(text, "recovered") and not ev_lines(text, "fallback")
