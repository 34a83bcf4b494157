"""Runs `rekindle run` around a test app for the supervisor's system tests:
starts it with an events file and a private runtime dir, reads its JSON
events ({"supervisor": ...}), and talks to the service app over TCP."""

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BUILD

REKINDLE = BUILD / "bin" / "rekindle"
SERVICE = BUILD / "apps" / "service"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_command(port, line, timeout=10.0, expect_reply=True):
    """Sends one command to the service app; retries the connect while it restarts."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
                s.sendall(line.encode() + b"\n")
                if not expect_reply:
                    return None
                reply = s.makefile().readline()
                if reply:
                    return json.loads(reply)
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"no reply to {line!r}")
        time.sleep(0.02)


def wait_generation(port, generation, stderr_path, timeout=10.0):
    """Polls a test app's `state` command until that generation answers;
    returns its state.  The app's stderr goes into the failure message."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            s = service_command(port, "state", timeout=2.0)
            if s["generation"] == generation:
                return s
        except (AssertionError, json.JSONDecodeError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"generation {generation} never came up: {Path(stderr_path).read_text()}")


class Supervisor:
    """One `rekindle run` in the background; stopped by close()."""

    def __init__(self, tmp_path, *options, app=None, name="svc", env=None):
        if not REKINDLE.exists():
            pytest.fail(f"{REKINDLE} missing: run `make` first")
        self.name = name
        self.port = free_port()
        self.runtime_dir = tmp_path / "run"
        self.events_path = tmp_path / "events.jsonl"
        self.env = dict(os.environ)
        self.env.pop("NOTIFY_SOCKET", None)
        self.env["REKINDLE_RUNTIME_DIR"] = str(self.runtime_dir)
        self.env.update(env or {})
        if app is None:
            app = [str(SERVICE), "--entries", "1000"]
        cmd = [
            str(REKINDLE),
            "run",
            "--name",
            name,
            "--events",
            str(self.events_path),
            "--listen",
            f"127.0.0.1:{self.port}",
            *map(str, options),
            "--",
            *map(str, app),
        ]
        self.out = open(tmp_path / "stdout.txt", "w+")  # noqa: SIM115 - closed in close()
        self.err = open(tmp_path / "stderr.txt", "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=self.err, env=self.env)

    # ---- events -------------------------------------------------------------
    def events(self, kind=None):
        if not self.events_path.exists():
            return []
        out = []
        text = self.events_path.read_text()
        # the supervisor may be writing a line right now: only whole lines
        whole = text[: text.rfind("\n") + 1]
        for line in whole.splitlines():
            if not line.strip():
                continue
            e = json.loads(line)
            if kind is None or e.get("supervisor") == kind:
                out.append(e)
        return out

    def wait_event(self, kind, pred=lambda e: True, timeout=10.0, count=1):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.events(kind) if pred(e)]
            if len(found) >= count:
                return found[count - 1]
            if self.proc.poll() is not None and kind not in ("stop", "giveup", "decision", "failure"):
                break
            time.sleep(0.02)
        raise AssertionError(
            f"no {kind!r} event (#{count}) within {timeout}s; events: {self.events()}\n"
            f"stderr: {self.stderr()[-3000:]}"
        )

    def wait_up(self, generation, timeout=10.0):
        return self.wait_event("up", lambda e: e.get("generation") == generation, timeout)

    def stderr(self):
        self.err.flush()
        return Path(self.err.name).read_text()

    # ---- the service app ------------------------------------------------------
    def command(self, line, timeout=10.0, expect_reply=True):
        try:
            return service_command(self.port, line, timeout, expect_reply)
        except AssertionError as e:
            raise AssertionError(f"{e}; stderr: {self.stderr()[-2000:]}") from None

    def state(self):
        return self.command("state")

    def cli(self, *args, check=True):
        p = subprocess.run(
            [str(REKINDLE), *map(str, args)],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
            check=False,
        )
        if check and p.returncode != 0:
            raise AssertionError(f"rekindle {args} failed ({p.returncode}): {p.stderr}")
        return p

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()
        self.err.close()
