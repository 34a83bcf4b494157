"""Error virtualization on a real Debian server: lighttpd 1.4.69 from
Debian's source package, unchanged, built with rekindle-ev-cc
(tools/errvirt/servers/lighttpd.sh).  It serves files and errors on
keep-alive connections like any build, its loadable modules use the
program's copy of the run-time, its transactions pass gates, nothing is
rolled back, and SIGTERM stops it cleanly.

The crash tests use the build with the project's fault injector and then
errvirt (lighttpd-fi-ev; faults go into the executable, not the modules): a
persistent fault on the directory-index path (a request for `/`, which
mod_indexfile maps to index.html) that crashes lighttpd when errvirt is
off, and that errvirt turns into an error response while another
connection keeps being served by the same process."""

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from supervisor_harness import free_port

from conftest import BUILD

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "errvirt" / "servers"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "faultinject"))
import http_servers as hs  # noqa: E402
from fi_sites import read_sites  # noqa: E402

INST = BUILD / "errvirt" / "lighttpd-ev" / "inst"
LIGHTTPD = INST / "sbin" / "lighttpd"
LIGHTTPD_FI_EV = BUILD / "errvirt" / "lighttpd-fi-ev" / "inst" / "sbin" / "lighttpd"


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


@pytest.fixture
def fi_lighttpd(tmp_path):
    started = []

    def start(env):
        if not LIGHTTPD_FI_EV.exists():
            pytest.fail(
                f"{LIGHTTPD_FI_EV} missing: run `make {LIGHTTPD_FI_EV.relative_to(BUILD.parent)}` first"
            )
        s = hs.Server("lighttpd", LIGHTTPD_FI_EV, tmp_path / f"run{len(started)}", env=env)
        started.append(s)
        if not s.wait_serving():
            s.stop()
            pytest.fail(f"lighttpd did not serve: {s.text()[-2000:]}")
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        s.err.close()


def index_fault():
    """The injector's site in mod_indexfile's per-request configuration
    (mod_indexfile_patch_config, inlined into mod_indexfile_subrequest):
    `i < used` inverted, so the loop reads past its conditions and the
    condition check dereferences a wild pointer.  The last gate before it
    is the stat of the directory, so errvirt makes that stat fail with
    EACCES, and lighttpd's own error path answers 403."""
    found = [
        s
        for s in read_sites(LIGHTTPD_FI_EV)
        if s["function"] == "mod_indexfile_subrequest"
        and s["type"] == "comparison-inversion"
        and s["loc"].endswith("src/mod_indexfile.c:48:42")
        and s["description"] == "icmp sgt inverted to sle"
    ]
    assert len(found) == 1, found
    return found[0]["id"]


def test_index_fault_crashes_lighttpd_without_errvirt(fi_lighttpd):
    env = dict(os.environ, REKINDLE_FAULT=index_fault(), REKINDLE_FAULT_MODE="persistent", REKINDLE_EV="off")
    s = fi_lighttpd(env)
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
    assert hs.get(c, "/index.html") == (200, hs.INDEX)
    with pytest.raises((OSError, http.client.HTTPException)):
        hs.get(c, "/")
    assert s.proc.wait(timeout=10) == -signal.SIGSEGV
    assert "rekindle-fault: fired" in s.text()


def test_index_crash_becomes_error_response(fi_lighttpd):
    env = dict(
        os.environ, REKINDLE_FAULT=index_fault(), REKINDLE_FAULT_MODE="persistent", REKINDLE_EV_REPORT="1"
    )
    s = fi_lighttpd(env)
    other = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
    assert hs.get(other, "/index.html") == (200, hs.INDEX)
    sock = other.sock
    statuses = []
    for _ in range(3):
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
        statuses.append(hs.get(c, "/")[0])
        c.close()
        assert hs.get(other, "/index.html") == (200, hs.INDEX)
        assert hs.get(other, "/big.bin") == (200, hs.expected("/big.bin"))
    assert statuses == [403, 403, 403]  # the stat's EACCES, as lighttpd reports it
    assert other.sock is sock  # the same connection all along
    assert s.proc.poll() is None
    assert len(os.listdir(f"/proc/{s.pid}/task")) == 1
    rec, inj = s.ev("recovered"), s.ev("injected")
    assert len(rec) == 3 and len(inj) == 3, s.text()[-3000:]
    assert {e["pid"] for e in rec + inj} == {s.pid}
    assert all(e["signal"] == "SIGSEGV" for e in rec)
    assert all(e["gate"] == "stat64" and e["errno"] == 13 for e in inj)
    assert not s.ev("fallback")
    other.close()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=10) in (0, 1)  # 1: a connection still open at the stop (see above)
    (report,) = s.ev("report")
    assert report["recoveries"] == 3 and report["fallbacks"] == 0
