"""Shared helpers for the system tests: locate the build, run programs, parse
the runtime's JSON event lines ({"rekindle": ...} on stderr) and the test
apps' state lines ({"app": ...} on stdout)."""

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("REKINDLE_BUILD", ROOT / "build"))


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    states: list = field(default_factory=list)
    events: list = field(default_factory=list)

    def events_of(self, kind):
        return [e for e in self.events if e["rekindle"] == kind]


def json_lines(text, key):
    out = []
    for line in text.splitlines():
        if line.startswith(f'{{"{key}"'):
            out.append(json.loads(line))
    return out


def shmem_huge_denied():
    """True where the kernel refuses huge pages for shmem altogether."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            return "[deny]" in f.read()
    except OSError:
        return True  # no THP in this kernel


def arena_pmd_kb(pid, arena):
    """ShmemPmdMapped (KiB mapped with huge pages) of the mapping of the
    arena named `arena` (its memfd, rekindle:NAME) in process pid."""
    with open(f"/proc/{pid}/smaps") as f:
        lines = f.read().splitlines()
    at = next(i for i, ln in enumerate(lines) if f"rekindle:{arena} " in ln + " ")
    for ln in lines[at + 1 :]:
        if ln.startswith("ShmemPmdMapped:"):
            return int(ln.split()[1])
        if "-" in ln.split()[0]:  # the next mapping
            break
    raise AssertionError(f"no ShmemPmdMapped line for the arena {arena}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the test (item.rep_call, ...), for
    fixtures that say more when the test failed."""
    rep = yield
    setattr(item, "rep_" + rep.when, rep)
    return rep


def process_state(pid):
    """Each thread's state, wait channel and kernel stack: what a server
    that stopped answering was doing (read before it is stopped)."""
    out = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError as e:
        return f"pid {pid}: {e}"
    for tid in tids:
        parts = []
        for f in ("stat", "wchan", "stack"):
            try:
                parts.append(Path(f"/proc/{pid}/task/{tid}/{f}").read_text())
            except OSError as e:
                parts.append(f"({f}: {e})")
        stat = parts[0].rsplit(")", 1)[-1].split()
        out.append(f"pid {pid} thread {tid} state {stat[0] if stat else '?'} wchan {parts[1]}\n{parts[2]}")
    return "\n".join(out)


def run_app(name, *args, env=None, timeout=60, pass_fds=()):
    exe = BUILD / "apps" / name
    if not exe.exists():
        pytest.fail(f"{exe} missing: run `make` first")
    full_env = dict(os.environ)
    full_env.pop("REKINDLE_MANIFEST_FD", None)
    full_env.update(env or {})
    p = subprocess.run(
        [str(exe), *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        pass_fds=pass_fds,
        check=False,  # the exit status is part of what tests check
    )
    return Run(
        p.returncode,
        p.stdout,
        p.stderr,
        json_lines(p.stdout, "app"),
        json_lines(p.stderr, "rekindle"),
    )


@pytest.fixture
def supervise(tmp_path):
    """Starts `rekindle run`s for a test (supervisor_harness.Supervisor's
    arguments); stops them after."""
    from supervisor_harness import Supervisor

    started = []

    def start(*options, **kw):
        sub = tmp_path / f"s{len(started)}"
        sub.mkdir()
        s = Supervisor(sub, *options, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()
