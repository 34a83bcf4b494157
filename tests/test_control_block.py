"""The control block is the supervisor's evidence of open unsafe regions.  A
block whose header was clobbered (a wild write in the app, or another process
with the fd) must not vouch for a warm restart: the next decision is cold with
its reason, the block is replaced, and status, events and metrics say so."""

import os
import urllib.request

from supervisor_harness import free_port
from test_supervisor import NO_WINDOW, up_and_set


def control_block_path(pid):
    """/proc path of the control block memfd that process `pid` holds."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:rekindle:control"):
            return f"/proc/{pid}/fd/{fd}"
    raise AssertionError(f"process {pid} holds no control block")


def clobber_magic(pid):
    fd = os.open(control_block_path(pid), os.O_RDWR)
    try:
        (b,) = os.pread(fd, 1, 0)
        os.pwrite(fd, bytes([b ^ 0x5A]), 0)
    finally:
        os.close(fd)


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in {text}")


def test_clobbered_control_block_goes_cold_is_replaced_and_reported(supervise):
    port = free_port()
    sup = supervise("--metrics", f"127.0.0.1:{port}", *NO_WINDOW)
    up_and_set(sup)
    clobber_magic(sup.proc.pid)

    # seen while the app still runs (the periodic check), and reported once
    corrupt = sup.wait_event("control_block", lambda e: e["status"] == "corrupt")
    assert corrupt["code"] == "bad_magic", corrupt
    status = sup.cli("status", sup.name, "--json").stdout
    assert '"ok":false' in status.replace(" ", ""), status
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert metric(metrics, "rekindle_control_block_ok") == 0
    assert metric(metrics, 'rekindle_control_block_corrupt_total{damage="bad_magic"') == 1

    # a death without a handler: the supervisor decides, and cannot know
    # whether a region was open
    sup.command("kill", expect_reply=False)
    sup.wait_up(1)
    decision = sup.wait_event("decision")
    assert (decision["mode"], decision["reason"]) == ("cold", "control block corrupt: bad magic"), decision
    assert decision["code"] == "control_block_corrupt"
    assert sup.wait_up(1)["code"] == "control_block_corrupt", "the new incarnation got the code (INHERIT)"
    sup.wait_event("control_block", lambda e: e["status"] == "recreated")
    after = sup.state()
    assert after["kind"] == "cold" and after["supervised"], after
    assert "foreign magic" not in sup.stderr(), "the new incarnation got a good block"

    # the new block is the evidence again: a death inside a region is cold
    # for that reason, and a plain death is warm
    assert sup.command("set 5 777")["ok"]
    sup.command("unsafe-kill", expect_reply=False)
    sup.wait_up(2)
    decision = sup.wait_event("decision", count=2)
    assert decision["mode"] == "cold" and "unsafe region open in arena table" in decision["reason"], decision
    assert decision["code"] == "unsafe_region_open"
    sup.command("kill", expect_reply=False)
    sup.wait_up(3)
    assert sup.wait_event("decision", count=3)["mode"] == "warm"

    status = sup.cli("status", sup.name, "--json").stdout
    assert '"corruptions":1' in status.replace(" ", ""), status
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert metric(metrics, "rekindle_control_block_ok") == 1
    assert len(sup.events("control_block")) == 2


def poke(pid, offset, xor):
    fd = os.open(control_block_path(pid), os.O_RDWR)
    try:
        (b,) = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([b ^ xor]), offset)
    finally:
        os.close(fd)


def test_after_an_in_place_restart_the_app_is_supervised_again(supervise):
    """The runtime decides cold in place, then gives the block its header
    back: the next incarnation is supervised (a hang is still detected)."""
    sup = supervise("--hang-timeout", "1s", "--check-interval", "100ms", *NO_WINDOW)
    up_and_set(sup)
    clobber_magic(sup.proc.pid)
    sup.command("segv", expect_reply=False)
    up = sup.wait_up(1)
    assert (up["kind"], up["code"]) == ("cold", "control_block_corrupt"), up
    after = sup.state()
    assert after["supervised"], after
    assert "foreign magic" not in sup.stderr(), "the new incarnation found a good block"
    sup.wait_event("control_block", lambda e: e["status"] == "corrupt")
    sup.wait_event("control_block", lambda e: e["status"] == "repaired")
    status = sup.cli("status", sup.name, "--json").stdout.replace(" ", "")
    assert '"ok":true' in status and '"corruptions":1' in status, status
    sup.command("hang", expect_reply=False)
    failure = sup.wait_event("failure", lambda e: e["kind"] == "hang", timeout=15)
    assert failure["generation"] == 1


def test_a_stray_write_in_the_arena_table_is_damage(supervise):
    """Which arenas are independent decides what a death drops: a stray
    write over the mask must not make the supervisor keep a half-changed
    arena or drop the wrong one."""
    sup = supervise(*NO_WINDOW)
    up_and_set(sup)
    poke(sup.proc.pid, 204, 0xFF)  # independent_mask
    corrupt = sup.wait_event("control_block", lambda e: e["status"] == "corrupt")
    assert corrupt["code"] == "bad_arena_table", corrupt
    sup.command("kill", expect_reply=False)
    sup.wait_up(1)
    decision = sup.wait_event("decision")
    assert (decision["mode"], decision["code"]) == ("cold", "control_block_corrupt"), decision
    assert "arena table" in decision["reason"]
