"""nginx and lighttpd as the error-virtualization tests and the fault
campaign run them: one process, one thread, a document root with a static
file, a larger one and a directory listing (the small dynamic page), all on
loopback.  Shared by tests/test_errvirt_{nginx,lighttpd}.py and
tools/errvirt/fault_campaign.py, so both run the servers the same way.

nginx runs with `master_process off; daemon off;`: the one process serves
every connection (error virtualization serves one thread per process;
docs/errvirt.md, "Threads").  nginx keeps only the environment variables
its `env` directives name, so the configuration names the ones the
run-times read after main (the injector and errvirt read theirs before).
Logging as production configurations do: no access log, and no error-log
line per missing file (`log_not_found off`).  Each log line is a `write`,
an irrecoverable call that closes the recoverable window for the rest of
its request (docs/errvirt.md, "nginx")."""

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

INDEX = b"hello from rekindle\n"
BIG_SIZE = 64 * 1024
LISTING = ("a.txt", "b.txt", "c.txt")


class ServerError(Exception):
    def __init__(self, reason, msg):
        super().__init__(f"reason={reason}: {msg}")
        self.reason = reason


# The loopback ports free_port picks from; a caller may set another range
# (fault_campaign.py --ports).
PORT_RANGE = (56000, 57999)
# put before the server's argv (the fault campaign runs servers under
# `setarch -R`, with address randomization off)
ARGV_PREFIX = []


def free_port(lo=None, hi=None):
    """A free loopback port in PORT_RANGE, starting at a pid-dependent
    offset so concurrent runs rarely collide."""
    lo = PORT_RANGE[0] if lo is None else lo
    hi = PORT_RANGE[1] if hi is None else hi
    span = hi - lo + 1
    start = (os.getpid() * 7919 + time.monotonic_ns() // 1000) % span
    for i in range(span):
        port = lo + (start + i) % span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ServerError("no_free_port", f"no free port in {lo}-{hi}")


def make_docroot(d):
    www = Path(d) / "www"
    (www / "dir").mkdir(parents=True, exist_ok=True)
    (www / "index.html").write_bytes(INDEX)
    (www / "big.bin").write_bytes(bytes(i * 7 % 251 for i in range(BIG_SIZE)))
    for n in LISTING:
        (www / "dir" / n).write_text(n)
    return www


def nginx_conf(d, port, www):
    d = Path(d)
    (d / "logs").mkdir(exist_ok=True)
    conf = d / "nginx.conf"
    temps = "".join(
        f"  {k}_temp_path {d / ('tmp_' + k)};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf.write_text(
        "master_process off;\ndaemon off;\nworker_processes 1;\n"
        "env REKINDLE_EV_REPORT;\nenv REKINDLE_FAULT_TRACE;\n"
        f"error_log {d / 'error.log'} notice;\npid {d / 'nginx.pid'};\n"
        "events { worker_connections 256; }\n"
        "http {\n  access_log off;\n  log_not_found off;\n" + temps + "  keepalive_requests 100000;\n"
        f"  server {{\n    listen 127.0.0.1:{port};\n    root {www};\n"
        "    location /dir/ { autoindex on; }\n  }\n}\n"
    )
    return conf


def lighttpd_conf(d, port, www):
    conf = Path(d) / "lighttpd.conf"
    conf.write_text(
        f'server.document-root = "{www}"\nserver.port = {port}\nserver.bind = "127.0.0.1"\n'
        f'server.errorlog = "{Path(d) / "error.log"}"\n'
        'server.modules += ("mod_dirlisting")\n'
        'index-file.names = ("index.html")\n'
        "server.max-keep-alive-requests = 100000\n"
        '$HTTP["url"] =~ "^/dir/" { dir-listing.activate = "enable" }\n'
        'mimetype.assign = (".html" => "text/html", ".bin" => "application/octet-stream",\n'
        '                   ".txt" => "text/plain")\n'
    )
    return conf


def stop_process(proc, err, timeout=10):
    """SIGTERM, then SIGKILL after timeout; closes err (the process's stderr
    file); the exit status (negative: a signal)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    err.close()
    return proc.returncode


class Server:
    """One server process.  stderr goes to d/stderr; nginx sends its
    stderr to its error log once it runs, so lines() reads both."""

    def __init__(self, kind, exe, d, env=None, port=None):
        self.kind, self.exe, self.d = kind, Path(exe), Path(d)
        self.d.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.www = make_docroot(self.d)
        if kind == "nginx":
            conf = nginx_conf(self.d, self.port, self.www)
            argv = [str(self.exe), "-c", str(conf), "-p", str(self.d)]
        elif kind == "lighttpd":
            conf = lighttpd_conf(self.d, self.port, self.www)
            argv = [str(self.exe), "-D", "-f", str(conf), "-m", str(self.exe.parent.parent / "lib")]
        else:
            raise ServerError("usage", f"unknown server kind {kind!r}")
        self.err = open(self.d / "stderr", "w")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(ARGV_PREFIX + argv, stderr=self.err, stdout=subprocess.DEVNULL, env=env)
        self.pid = self.proc.pid

    def wait_serving(self, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("HEAD", "/index.html")
                c.getresponse().read()
                c.close()
                return True
            except (OSError, http.client.HTTPException):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    return False
                time.sleep(0.03)

    def terminate(self, timeout=10):
        """SIGTERM, and the exit status once the process has gone (None if
        it has not within timeout).  nginx in one process (`master_process
        off`) checks its terminate flag before it waits in epoll_wait with no
        timeout: a SIGTERM that lands between the two, while it handles a
        connection that just closed, waits for the next event (nginx's
        single-process race, wider with instrumented builds).  So each
        200 ms without an exit, a connection is opened and closed to wake it."""
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
        return None

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL; the exit status (negative: a signal)."""
        return stop_process(self.proc, self.err, timeout)

    def text(self):
        out = (self.d / "stderr").read_text(errors="replace")
        log = self.d / "error.log"
        if log.exists():
            out += log.read_text(errors="replace")
        return out

    def ev(self, kind=None):
        """The run-time's JSON lines ({"rekindle_ev": ...}), of one kind."""
        out = []
        for line in self.text().splitlines():
            i = line.find('{"rekindle_ev"')
            if i >= 0:
                try:
                    out.append(json.loads(line[i:]))
                except ValueError:
                    continue
        return [e for e in out if kind is None or e["rekindle_ev"] == kind]


def expected(path):
    """The body a correct server sends for path, or None (any 200 body)."""
    if path in ("/index.html", "/"):
        return INDEX
    if path == "/big.bin":
        return bytes(i * 7 % 251 for i in range(BIG_SIZE))
    return None


def check(status, body, path):
    """'ok', or what was wrong with a response to GET path."""
    if path.startswith("/missing"):
        return "ok" if status == 404 else f"status {status}"
    if status != 200:
        return f"status {status}"
    want = expected(path)
    if want is not None and body != want:
        return "wrong body"
    if path == "/dir/" and not all(n.encode() in body for n in LISTING):
        return "wrong listing"
    return "ok"


PATHS = ("/index.html", "/big.bin", "/dir/", "/missing-{i}", "/")


def get(conn, path):
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, r.read()
