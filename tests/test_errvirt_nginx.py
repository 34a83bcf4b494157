"""Error virtualization on nginx 1.22.1 from Debian's source package,
unchanged, built with rekindle-ev-cc (tools/errvirt/servers/nginx.sh), run
as one process with one thread (`master_process off; daemon off;`: errvirt
serves one thread per process, docs/errvirt.md, "Threads").

The crash tests use the build with the project's fault injector and then
errvirt (nginx-fi-ev): a persistent fault in the directory listing (a
non-critical path: the autoindex module) that crashes nginx when errvirt is
off, and that errvirt turns into an error response while another
connection keeps being served by the same process."""

import http.client
import os
import signal
import sys
from pathlib import Path

import pytest

from conftest import BUILD

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "errvirt" / "servers"))
sys.path.insert(0, str(ROOT / "tools" / "faultinject"))
import http_servers as hs  # noqa: E402
from fi_sites import read_sites  # noqa: E402

NGINX_EV = BUILD / "errvirt" / "nginx-ev" / "inst" / "sbin" / "nginx"
NGINX_FI_EV = BUILD / "errvirt" / "nginx-fi-ev" / "inst" / "sbin" / "nginx"


def need(exe):
    if not exe.exists():
        pytest.fail(f"{exe} missing: run `make errvirt-nginx {NGINX_FI_EV.relative_to(BUILD.parent)}` first")


@pytest.fixture
def servers():
    started = []

    def start(exe, d, env):
        s = hs.Server("nginx", exe, d, env=env)
        started.append(s)
        if not s.wait_serving():
            s.stop()
            pytest.fail(f"nginx did not serve: {s.text()[-2000:]}")
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        s.err.close()


def listing_fault():
    """The injector's site for `ngx_str_set(&r->headers_out.content_type,
    "text/html")` in ngx_http_autoindex_handler with its pointer's store
    removed: the header filter then copies 9 bytes from NULL.  The last
    gate before it is the listing's opendir (nginx sends the header before
    it reads the directory), so errvirt makes opendir fail with EACCES, and
    nginx's own error path answers 403."""
    found = [
        s
        for s in read_sites(NGINX_FI_EV)
        if s["function"] == "ngx_http_autoindex_handler"
        and s["type"] == "missing-assignment"
        and s["loc"].startswith("src/http/modules/ngx_http_autoindex_module.c:276:")
        and s["description"] == "store of ptr removed"
    ]
    assert len(found) == 1, found
    return found[0]["id"]


def threads_and_children(pid):
    tasks = len(os.listdir(f"/proc/{pid}/task"))
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return tasks, children


def test_nginx_serves_unchanged(servers, tmp_path):
    need(NGINX_EV)
    s = servers(NGINX_EV, tmp_path, dict(os.environ, REKINDLE_EV_REPORT="1"))
    assert threads_and_children(s.pid) == (1, [])  # one process, one thread
    conns = [http.client.HTTPConnection("127.0.0.1", s.port, timeout=5) for _ in range(3)]
    for i in range(30):
        c = conns[i % 3]
        for path in ("/index.html", f"/missing-{i}", "/dir/", "/big.bin"):
            status, body = hs.get(c, path)
            assert hs.check(status, body, path) == "ok", (path, status)
    for c in conns:
        c.close()
    assert s.terminate() == 0  # SIGTERM (see Server.terminate for nginx's race)
    text = s.text()
    assert "exit" in (tmp_path / "error.log").read_text()
    (report,) = s.ev("report")
    assert report["gates"] > 120  # at least an accept or recv and an open per request
    assert report["recoveries"] == 0 and report["fallbacks"] == 0
    assert not s.ev("recovered") and not s.ev("fallback"), text[-2000:]


def test_listing_fault_crashes_nginx_without_errvirt(servers, tmp_path):
    """The fault is a real fail-stop crash: with errvirt off at run time
    (the same binary), the first listing kills nginx with SIGSEGV."""
    need(NGINX_FI_EV)
    env = dict(
        os.environ, REKINDLE_FAULT=listing_fault(), REKINDLE_FAULT_MODE="persistent", REKINDLE_EV="off"
    )
    s = servers(NGINX_FI_EV, tmp_path, env)
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
    assert hs.get(c, "/index.html")[0] == 200
    with pytest.raises((OSError, http.client.HTTPException)):
        hs.get(c, "/dir/")
    assert s.proc.wait(timeout=10) == -signal.SIGSEGV
    assert "rekindle-fault: fired" in s.text()


def test_listing_crash_becomes_error_response(servers, tmp_path):
    """With errvirt, each crashing listing request gets an HTTP error
    response; another keep-alive connection is served throughout, on the
    same socket, by the same process, which never restarts."""
    need(NGINX_FI_EV)
    env = dict(
        os.environ, REKINDLE_FAULT=listing_fault(), REKINDLE_FAULT_MODE="persistent", REKINDLE_EV_REPORT="1"
    )
    s = servers(NGINX_FI_EV, tmp_path, env)
    other = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
    assert hs.get(other, "/index.html") == (200, hs.INDEX)
    sock = other.sock
    statuses = []
    for _ in range(3):
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
        status, _body = hs.get(c, "/dir/")
        statuses.append(status)
        c.close()
        assert hs.get(other, "/index.html") == (200, hs.INDEX)
        assert hs.get(other, "/big.bin") == (200, hs.expected("/big.bin"))
    assert statuses == [403, 403, 403]  # opendir's EACCES, as nginx reports it
    assert other.sock is sock  # the same connection all along
    assert s.proc.poll() is None
    assert threads_and_children(s.pid) == (1, [])
    rec, inj = s.ev("recovered"), s.ev("injected")
    assert len(rec) == 3 and len(inj) == 3, s.text()[-3000:]
    assert {e["pid"] for e in rec + inj} == {s.pid}
    assert all(e["signal"] == "SIGSEGV" and e["gate"] == "opendir" for e in rec)
    assert all(e["gate"] == "opendir" and e["compensation"] == "closedir_ret" for e in inj)
    assert not s.ev("fallback")
    assert "rekindle-fault: fired" in s.text()
    other.close()
    assert s.terminate() == 0  # SIGTERM (see Server.terminate for nginx's race)
    (report,) = s.ev("report")
    assert report["recoveries"] == 3 and report["fallbacks"] == 0
