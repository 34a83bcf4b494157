"""The fault injector (tools/faultinject, docs/faultinject.md): its lit tests
of the IR transformation, and real programs built with the pass: unarmed
they behave exactly like an uninstrumented build, each fault type armed at a
known site changes what it must, REKINDLE_FAULT_AFTER/_MODE pick the
executions, a trace lists the executed sites (also after SIGKILL), ids stay
the same across builds, bad settings stop the program with a reason code,
and rkv builds and serves with the pass."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rkv_harness import Rkv, resp

from conftest import BUILD, ROOT

FI = ROOT / "tools" / "faultinject"
sys.path.insert(0, str(FI))
from fi_sites import read_sites  # noqa: E402
from fi_trace import read_counts  # noqa: E402

FI_CC = BUILD / "bin" / "rekindle-fi-cc"
PLUGIN = BUILD / "lib" / "rekindle-faultinject.so"
RKV_FI = BUILD / "examples" / "rkv-fi"
# relative, as a build passes it: the module hash includes the source name
PROGRAM = "tools/faultinject/test/programs/faults.c"
LIT = Path("/usr/lib/llvm-19/build/utils/lit/lit.py")
FIRED = re.compile(r"^rekindle-fault: fired site=([0-9a-f]{16}:\d+) type=([a-z-]+)$", re.M)


def need(path):
    if not path.exists():
        pytest.fail(f"{path} missing: run `make faultinject rkv-fi` first")


def build(out_dir, cc=None, opt="-O1"):
    """faults.c built with the pass (or with plain clang-19 when cc is
    given), the way a project's build would: from the repository root."""
    need(FI_CC)
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = out_dir / "faults"
    cmd = [str(cc or FI_CC), opt, "-Wall", "-Wextra", "-Werror", PROGRAM, "-o", str(exe)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("REKINDLE_FI_")}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=120)
    return exe


def run(exe, *args, env=None, timeout=30):
    full = {k: v for k, v in os.environ.items() if not k.startswith("REKINDLE_FAULT")}
    full.update(env or {})
    return subprocess.run(
        [str(exe), *map(str, args)], capture_output=True, text=True, env=full, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    return build(tmp_path_factory.mktemp("fi") / "a")


@pytest.fixture(scope="module")
def sites(faults):
    return read_sites(faults)


def site(sites, function, ftype):
    """The one site of ftype in function."""
    found = [s for s in sites if s["function"] == function and s["type"] == ftype]
    assert len(found) == 1, f"{ftype} sites in {function}: {found}"
    return found[0]["id"]


def values(stdout):
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def test_lit_ir_tests(tmp_path):
    need(PLUGIN)
    n_tests = len(list((FI / "test").glob("*.ll")))
    p = subprocess.run(
        [sys.executable, str(LIT), "-v", "--param", f"plugin={PLUGIN}", "--param", f"exec_root={tmp_path}",
         str(FI / "test")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("PASS: ") == n_tests >= 9, p.stdout


def test_unarmed_matches_uninstrumented_build(faults, tmp_path):
    plain = build(tmp_path / "plain", cc="clang-19")
    with pytest.raises(Exception, match="reason=not_instrumented"):
        read_sites(plain)
    for args in (["12"], ["3"], ["-4", "loop", "30"], ["200", "loop", "5"]):
        a, b = run(faults, *args), run(plain, *args)
        assert (a.returncode, a.stdout) == (b.returncode, b.stdout) == (0, b.stdout)
        assert a.stderr == "" and "rekindle-fault" not in a.stderr


def test_unarmed_output(faults):
    r = run(faults, 12)
    assert r.returncode == 0
    assert r.stdout.splitlines() == [
        "is_big=1", "counter=12", "offset=19", "clamped", "clamp=100", "sum=66", "noted",
    ]  # fmt: skip


# Each fault type at its site in faults.c, and what it must change with
# input 12 (unarmed: is_big=1 counter=12 offset=19 clamp=100 sum=66).
CASES = [
    ("fi_is_big", "comparison-inversion", {"is_big": "0"}, []),
    ("fi_set_counter", "missing-assignment", {"counter": "1"}, []),  # the old value stays
    ("fi_set_counter", "wrong-result-stored", {"counter": "0"}, []),
    ("fi_offset", "wrong-operand", {"offset": "13"}, []),  # x + 7 -> x + 1
    ("fi_clamp", "missing-if", {"clamp": "120"}, ["clamped"]),  # the body never runs
    ("fi_maybe_note", "missing-call", {}, ["noted"]),  # fi_note is not called
]


@pytest.mark.parametrize(("function", "ftype", "changed", "gone"), CASES, ids=[c[1] for c in CASES])
def test_armed_fault_changes_behaviour(faults, sites, function, ftype, changed, gone):
    sid = site(sites, function, ftype)
    base = values(run(faults, 12).stdout)
    r = run(faults, 12, env={"REKINDLE_FAULT": sid})
    assert r.returncode == 0, r.stderr
    got = values(r.stdout)
    assert got == {**base, **changed}
    for line in gone:
        assert line not in r.stdout.splitlines()
    assert FIRED.findall(r.stderr) == [(sid, ftype)]  # reported once


def test_uninitialized_variable_reads_stale_stack(faults, sites):
    sid = site(sites, "fi_sum_prefix", "uninitialized-variable")
    r = run(faults, 12, env={"REKINDLE_FAULT": sid})
    assert r.returncode == 0
    got = values(r.stdout)
    # buf's memset is skipped: the entries past 12 hold fi_dirty_stack's junk
    assert got["sum"] != "66"
    assert {k: v for k, v in got.items() if k != "sum"} == {
        k: v for k, v in values(run(faults, 12).stdout).items() if k != "sum"
    }
    assert FIRED.findall(r.stderr) == [(sid, "uninitialized-variable")]


def test_a_fault_that_never_executes_never_fires(faults, sites):
    sid = next(s["id"] for s in sites if s["function"] == "fi_never")
    r = run(faults, 12, env={"REKINDLE_FAULT": sid})
    assert r.returncode == 0 and r.stdout == run(faults, 12).stdout
    assert FIRED.findall(r.stderr) == []


# fi_is_big runs 21 times with "12 loop 20": once in main, then for i in
# 0..19 (9 of which are > 10).  AFTER=5 leaves the first 5 clean.
@pytest.mark.parametrize(
    ("env", "is_big", "big"),
    [
        ({}, "0", "11"),  # persistent from the first: every result inverted
        ({"REKINDLE_FAULT_AFTER": "5"}, "1", "7"),  # i = 4..19 inverted
        ({"REKINDLE_FAULT_AFTER": "5", "REKINDLE_FAULT_MODE": "transient"}, "1", "10"),  # only i = 4
        ({"REKINDLE_FAULT_MODE": "persistent"}, "0", "11"),
        ({"REKINDLE_FAULT_AFTER": "21"}, "1", "9"),  # never reaches its execution
    ],
    ids=["persistent", "after5", "after5-transient", "explicit-persistent", "after-all"],
)
def test_after_and_mode(faults, sites, env, is_big, big):
    sid = site(sites, "fi_is_big", "comparison-inversion")
    r = run(faults, 12, "loop", 20, env={"REKINDLE_FAULT": sid, **env})
    assert r.returncode == 0
    got = values(r.stdout)
    assert (got["is_big"], got["big"]) == (is_big, big)
    assert len(FIRED.findall(r.stderr)) == (0 if env.get("REKINDLE_FAULT_AFTER") == "21" else 1)


def test_several_sites_armed_at_once(faults, sites):
    # PHOENIX arms ten instructions a run: REKINDLE_FAULT takes a list, and
    # every site in it acts (each reported once), with one AFTER for all or
    # one per site
    big = site(sites, "fi_is_big", "comparison-inversion")
    off = site(sites, "fi_offset", "wrong-operand")
    never = next(s["id"] for s in sites if s["function"] == "fi_never")
    r = run(faults, 12, "loop", 20, env={"REKINDLE_FAULT": f"{big},{off},{never}"})
    assert r.returncode == 0, r.stderr
    got = values(r.stdout)
    assert (got["is_big"], got["big"], got["offset"]) == ("0", "11", "13")
    assert sorted(FIRED.findall(r.stderr)) == sorted([(big, "comparison-inversion"), (off, "wrong-operand")])
    # one count per site: fi_is_big's first 5 runs clean, fi_offset never reached
    r = run(faults, 12, "loop", 20, env={"REKINDLE_FAULT": f"{big},{off}", "REKINDLE_FAULT_AFTER": "5,1"})
    got = values(r.stdout)
    assert (got["is_big"], got["big"], got["offset"]) == ("1", "7", "19")
    assert FIRED.findall(r.stderr) == [(big, "comparison-inversion")]
    # one count for all
    r = run(faults, 12, "loop", 20, env={"REKINDLE_FAULT": f"{big},{off}", "REKINDLE_FAULT_AFTER": "1"})
    got = values(r.stdout)
    assert (got["is_big"], got["offset"]) == ("1", "19")


def test_arm_signal_keeps_sites_off_until_it_comes(faults, sites):
    # REKINDLE_FAULT_ARM_SIGNAL: PHOENIX's switch; never sent, nothing
    # acts (the campaign's test sends it: test_fault_campaign.py)
    big = site(sites, "fi_is_big", "comparison-inversion")
    r = run(faults, 12, "loop", 20, env={"REKINDLE_FAULT": big, "REKINDLE_FAULT_ARM_SIGNAL": "12"})
    assert r.returncode == 0 and r.stdout == run(faults, 12, "loop", 20).stdout
    assert FIRED.findall(r.stderr) == []
    for env, reason in (
        ({"REKINDLE_FAULT_ARM_SIGNAL": "12"}, "arm_signal_without_fault"),
        ({"REKINDLE_FAULT": big, "REKINDLE_FAULT_ARM_SIGNAL": "9"}, "bad_arm_signal"),
        ({"REKINDLE_FAULT": big, "REKINDLE_FAULT_ARM_SIGNAL": "usr2"}, "bad_arm_signal"),
    ):
        r = run(faults, 12, env=env)
        assert r.returncode == 2 and f"rekindle-fault: error reason={reason}:" in r.stderr, (env, r.stderr)


@pytest.mark.parametrize(
    ("fault", "after", "reason"),
    [
        ("{a},{a}", None, "bad_site_id"),  # the same site twice
        ("{a},", None, "bad_site_id"),  # an empty item
        ("{many}", None, "bad_site_id"),  # 17 different sites: more than 16
        ("{a},{b}", "1,2,3", "bad_after"),  # neither one count nor one per site
        ("{a},{b}", "1,x", "bad_after"),
    ],
    ids=["twice", "empty", "too-many", "after-count", "after-bad"],
)
def test_bad_site_lists_stop_with_reason(faults, sites, fault, after, reason):
    a = site(sites, "fi_is_big", "comparison-inversion")
    b = site(sites, "fi_offset", "wrong-operand")
    many = ",".join(s["id"] for s in sites[:17])
    assert len(set(many.split(","))) == 17
    env = {"REKINDLE_FAULT": fault.format(a=a, b=b, many=many)}
    if after is not None:
        env["REKINDLE_FAULT_AFTER"] = after
    r = run(faults, 12, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert f"rekindle-fault: error reason={reason}:" in r.stderr


def test_fired_line_goes_to_log_fd(faults, sites, tmp_path):
    sid = site(sites, "fi_offset", "wrong-operand")
    log = tmp_path / "log"
    with open(log, "w") as f:
        env = {**os.environ, "REKINDLE_FAULT": sid, "REKINDLE_FAULT_LOG_FD": str(f.fileno())}
        p = subprocess.run(
            [str(faults), "12"], env=env, pass_fds=(f.fileno(),), capture_output=True, text=True, timeout=30,
            check=False,
        )  # fmt: skip
    assert p.returncode == 0 and "rekindle-fault" not in p.stderr
    assert FIRED.findall(log.read_text()) == [(sid, "wrong-operand")]


def test_trace_lists_executed_sites(faults, sites, tmp_path):
    trace = tmp_path / "trace"
    r = run(faults, 12, "loop", 20, env={"REKINDLE_FAULT_TRACE": str(trace)})
    assert r.returncode == 0 and r.stdout == run(faults, 12, "loop", 20).stdout  # tracing changes nothing
    counts = read_counts(trace)
    assert counts == read_counts(f"{trace}.counts")  # the text list and the live counters agree
    by_fn = {}
    for s in sites:
        by_fn.setdefault(s["function"], []).append(s["id"])
    assert counts[site(sites, "fi_is_big", "comparison-inversion")] == 21
    assert counts[site(sites, "fi_set_counter", "missing-assignment")] == 1
    assert not any(sid in counts for sid in by_fn["fi_never"])
    for fn in ("fi_is_big", "fi_set_counter", "fi_offset", "fi_clamp", "fi_sum_prefix", "fi_maybe_note"):
        assert any(sid in counts for sid in by_fn[fn]), fn
    assert set(counts) <= {s["id"] for s in sites}


def test_trace_survives_sigkill(faults, sites, tmp_path):
    trace = tmp_path / "t-%p"
    r = run(faults, 12, "kill", env={"REKINDLE_FAULT_TRACE": str(trace)})
    assert r.returncode == -9
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and re.fullmatch(r"t-\d+\.counts", files[0]), files  # no text list: no exit
    counts = read_counts(tmp_path / files[0])
    assert counts[site(sites, "fi_is_big", "comparison-inversion")] == 1
    assert counts[site(sites, "fi_maybe_note", "missing-call")] == 1


def test_ids_stable_across_builds(faults, sites, tmp_path):
    again = build(tmp_path / "b")
    assert read_sites(again) == sites
    # and the per-object sites files of a separate compile hold the same
    obj = tmp_path / "c" / "faults.o"
    obj.parent.mkdir()
    subprocess.run([str(FI_CC), "-O1", "-c", PROGRAM, "-o", str(obj)], cwd=ROOT, check=True, timeout=120)
    listed = json.loads(Path(f"{obj}.fisites.json").read_text())
    assert listed["sites"] == sites
    assert {s["id"].split(":")[0] for s in sites} == {listed["module"]}
    # a different build of the same source is a different module
    other = build(tmp_path / "o2", opt="-O2")
    assert {s["id"].split(":")[0] for s in read_sites(other)} != {listed["module"]}


def test_every_type_found(sites):
    assert {s["type"] for s in sites} == {
        "comparison-inversion", "missing-assignment", "wrong-operand", "missing-if",
        "uninitialized-variable", "wrong-result-stored", "missing-call",
    }  # fmt: skip
    for s in sites:
        assert s["loc"] == f"{s['file']}:{s['line']}:{s['col']}" and s["description"]


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"REKINDLE_FAULT": "nothex"}, "bad_site_id"),
        ({"REKINDLE_FAULT": "0123456789abcdef:x"}, "bad_site_id"),
        ({"REKINDLE_FAULT": "0123456789abcdef:1"}, "unknown_site"),
        ({"REKINDLE_FAULT_AFTER": "3"}, "after_without_fault"),
        ({"REKINDLE_FAULT_MODE": "transient"}, "mode_without_fault"),
        ({"REKINDLE_FAULT_TRACE": ""}, "bad_trace_path"),
        ({"REKINDLE_FAULT_TRACE": "/nonexistent/dir/t"}, "trace_open_failed"),
        ({"REKINDLE_FAULT_LOG_FD": "99"}, "bad_log_fd"),
    ],
)
def test_bad_settings_stop_with_reason(faults, sites, env, reason):
    r = run(faults, 12, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert f"rekindle-fault: error reason={reason}:" in r.stderr


@pytest.mark.parametrize(("key", "value", "reason"), [
    ("REKINDLE_FAULT_AFTER", "-1", "bad_after"), ("REKINDLE_FAULT_MODE", "sometimes", "bad_mode"),
])  # fmt: skip
def test_bad_arming_options(faults, sites, key, value, reason):
    sid = site(sites, "fi_is_big", "comparison-inversion")
    r = run(faults, 12, env={"REKINDLE_FAULT": sid, key: value})
    assert r.returncode == 2 and f"reason={reason}:" in r.stderr


def test_site_index_past_module_end(faults, sites):
    mod = sites[0]["id"].split(":")[0]
    r = run(faults, 12, env={"REKINDLE_FAULT": f"{mod}:{len(sites)}"})
    assert r.returncode == 2 and "reason=unknown_site:" in r.stderr


def test_rkv_with_the_pass(tmp_path):
    """rkv built with the pass serves unarmed; a trace of a workload lists
    sites in its command code; a fault armed there fires."""
    need(RKV_FI)
    rkv_sites = read_sites(RKV_FI)
    assert len(rkv_sites) > 1000
    trace = tmp_path / "trace"
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    srv = Rkv(tmp_path / "a", exe=RKV_FI, env={"REKINDLE_FAULT_TRACE": str(trace)})
    try:
        c = srv.client()
        c.set("k", "v")
        assert c.get("k") == b"v"
        assert c.incr("n") == 1 and c.dbsize() == 2
        assert c.append("k", "w") == 2 and c.get("k") == b"vw"
        assert c.delete("n") == 1 and c.exists("n") == 0
    finally:
        srv.close()
    assert srv.proc.returncode == 0, srv.stderr()[-2000:]
    counts = read_counts(trace)
    executed = [s for s in rkv_sites if s["id"] in counts]
    assert any(s["function"] == "cmd_dbsize" for s in executed)
    assert any(s["file"].endswith("commands.c") for s in executed)
    # arm a site DBSIZE executes: the fault fires when DBSIZE comes
    sid = next(s["id"] for s in executed if s["function"] == "cmd_dbsize")
    srv = Rkv(tmp_path / "b", exe=RKV_FI, env={"REKINDLE_FAULT": sid})
    try:
        assert FIRED.findall(srv.stderr()) == []
        srv.raw(resp("DBSIZE"), timeout=1.0)
        assert [f[0] for f in FIRED.findall(srv.stderr())] == [sid]
    finally:
        srv.close()
