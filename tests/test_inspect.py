"""System tests of `rekindle inspect`: a real supervisor around the service
app, whose arenas ("table" and "sessions", opened RK_ARENA_INDEPENDENT) the
supervisor reads from the memfds it holds.  The service allocates a known
set of objects: in "table", the table itself (32 + 8 * entries bytes: the
8 KiB class for 1000 entries), the array of fill pointers (8 * fill_mb
bytes) and fill_mb objects of 1 MiB (large runs); in "sessions", one
8-byte object (the 16 B class).

An open unsafe region is not checked here: the service has no command that
stays inside a region while it can be asked, and the reading of the control
block's slots into each arena is unit-tested (inspect::tests)."""

import json

from supervisor_harness import SERVICE

MIB = 1 << 20
FILL_MB = 2


def start(supervise):
    sup = supervise("--crashloop-window", "0ms", app=[SERVICE, "--entries", "1000", "--fill-mb", FILL_MB])
    sup.wait_up(0)
    state = sup.state()  # the app has built its table and set its roots
    sup.wait_event("fds", lambda e: {"table", "sessions"} <= set(e["arenas"]))
    return sup, state


def inspect(sup):
    p = sup.cli("inspect", sup.name, "--json")
    return json.loads(p.stdout)


def arenas_by_name(reply):
    return {a["name"]: a for a in reply["arenas"]}


def classes_of(arena):
    return {c["size"]: c["objects"] for c in arena["classes"]}


def root_of(arena, name):
    found = [r for r in arena["roots"] if r["name"] == name]
    assert len(found) == 1, arena["roots"]
    return found[0]


def assert_service_arenas(reply, state):
    arenas = arenas_by_name(reply)
    assert set(arenas) == {"table", "sessions"}, reply
    for a in arenas.values():
        assert a["header_ok"] and a["layout_ok"] and a["roots_ok"], a
        assert a["exact"], a["problems"]
        assert a["walk"]["complete"] and a["walk"]["source"] == "pread"
        assert a["problems"] == [] and a["locks_held"] == [] and a["open_regions"] == []
        assert a["header_name"] == a["name"]
        assert a["committed"] == a["mapped"] and a["heap_bytes"] <= a["mapped"] <= a["max_bytes"]

    table = arenas["table"]
    # the table (8 KiB class), the fill pointers (16 B), FILL_MB large runs
    assert classes_of(table) == {8192: 1, 16: 1}, table["classes"]
    assert table["large"] == {"objects": FILL_MB, "bytes": FILL_MB * MIB, "largest": MIB}
    assert table["allocated_bytes"] == 8192 + 16 + FILL_MB * MIB
    assert table["counted_bytes"] == table["allocated_bytes"]
    assert table["objects"] == 2 + FILL_MB
    root = root_of(table, "table")
    assert root["address"] == int(state["table"], 16), "the address the app uses"
    assert table["base"] <= root["address"] < table["base"] + table["max_bytes"]
    assert root["in_arena"] and root["in_heap"]
    assert root["target"] == {"kind": "slab", "size": 8192}

    sessions = arenas["sessions"]
    assert classes_of(sessions) == {16: 1}
    assert sessions["allocated_bytes"] == 16 and sessions["large"]["objects"] == 0
    root = root_of(sessions, "sessions")
    assert sessions["base"] <= root["address"] < sessions["base"] + sessions["max_bytes"]
    assert root["target"] == {"kind": "slab", "size": 16}


def test_inspect_reads_both_arenas_their_objects_and_roots(supervise):
    sup, state = start(supervise)
    reply = inspect(sup)
    assert reply["ok"] and reply["name"] == sup.name
    assert reply["pid"] == state["pid"] and reply["generation"] == state["generation"] == 0
    assert reply["kind"] == "fresh" and reply["linked"]
    assert reply["open_regions"] == [] and reply["control_block"]["ok"]
    assert reply["elapsed_us"] < reply["budget_ms"] * 1000
    assert_service_arenas(reply, state)


def test_inspect_after_a_warm_restart_finds_the_same_objects(supervise):
    sup, before = start(supervise)
    sup.command("kill", expect_reply=False)
    sup.wait_up(1)
    after = sup.state()
    assert after["kind"] == "warm" and after["table"] == before["table"]
    reply = inspect(sup)
    assert reply["generation"] == 1 and reply["kind"] == "warm" and reply["pid"] == after["pid"]
    # the recovery marked what the table reaches: nothing was swept
    assert_service_arenas(reply, after)


def test_inspect_prints_a_table(supervise):
    sup, state = start(supervise)
    out = sup.cli("inspect", sup.name).stdout
    lines = out.splitlines()
    assert lines[0].startswith(f"{sup.name}: app pid {state['pid']}, generation 0 (fresh start)"), out
    assert any(line.split()[:1] == ["ARENA"] for line in lines), out
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("table ", "sessions "))}
    assert set(rows) == {"table", "sessions"}, out
    assert rows["table"][-1] == "ok" and rows["sessions"][-1] == "ok", out
    assert f"root:     table = {state['table']} (8 KiB slab object)" in out, out
    assert "classes:  8 KiB x1 (8.0 KiB), 16 B x1 (16 B)" in out, out
    assert f"large:    {FILL_MB} object(s), {FILL_MB}.0 MiB (largest 1.0 MiB)" in out, out
    assert "open unsafe regions: none" in out, out


def test_inspect_of_an_app_without_the_runtime_says_there_is_no_arena(supervise):
    sup = supervise(app=["sleep", "60"])
    sup.wait_event("spawn")
    p = sup.cli("inspect", sup.name, check=False)
    assert p.returncode == 1, p
    assert p.stdout == "" and "does not use librekindle" in p.stderr, p.stderr
    p = sup.cli("inspect", sup.name, "--json", check=False)
    assert p.returncode == 1
    assert json.loads(p.stdout)["arenas"] == []


def test_inspect_of_no_supervisor_is_a_clear_error(supervise):
    sup = supervise(app=["sleep", "60"])
    p = sup.cli("inspect", "nobody-here", check=False)
    assert p.returncode == 1 and 'no supervisor named "nobody-here"' in p.stderr, p.stderr
