"""`make bench-initial-sync` in its smallest form: a standby that joins a
Rekindle primary late gets the newest snapshot whole, and a Redis replica
started late syncs, with 2,000 keys.  Asserts the JSON's facts (a full sync,
the keys on the replica, sizes), never timings."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(
        not (BUILD / "bin" / "rekindle").exists() or not (BUILD / "bench" / "respload").exists(),
        reason="run make first",
    ),
    pytest.mark.skipif(not shutil.which("etcd") or not shutil.which("redis-server"), reason="make deps"),
]


def test_initial_sync_bench_writes_sane_results(tmp_path):
    argv = [sys.executable, str(ROOT / "bench" / "initial_sync_bench.py"), str(BUILD), "--keys", "2000",
            "--out", str(tmp_path), "--name", "t"]  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = {r["system"]: r for r in json.loads((tmp_path / "t.json").read_text())["rows"]}
    rk, rd = rows["rekindle"], rows["redis"]
    assert rk["sync"] == "full" and rk["join_to_applied_ms"] > 0, rk
    # the standby's store holds what the primary's does (one full snapshot
    # of the same pages, against the primary's deltas)
    assert 0 < rk["store_bytes_n2"] <= rk["store_bytes_n1"] * 2, rk
    assert rd["replica_keys"] == 2000 and rd["join_to_synced_ms"] > 0, rd
    assert (tmp_path / "t.md").read_text().startswith("## Initial sync")
