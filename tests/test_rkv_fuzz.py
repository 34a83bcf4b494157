"""The rkv fuzz target (examples/rkv/fuzz, libFuzzer with ASan and UBSan):
every seed and regression input of the corpus in the repository replays
cleanly, and a short campaign from it finds nothing.  A crash, a sanitizer
report, a leak or a timeout fails the test with libFuzzer's output.

Long campaigns: `make fuzz-rkv FUZZ_SECONDS=600` (README.md there)."""

import shutil
import subprocess

import pytest

from conftest import BUILD, ROOT

FUZZ = BUILD / "examples" / "rkv-fuzz"
FUZZ_DIR = ROOT / "examples" / "rkv" / "fuzz"
CORPUS = FUZZ_DIR / "corpus"
DICT = FUZZ_DIR / "dict"
CAMPAIGN_SECONDS = 20


@pytest.fixture(scope="module")
def fuzzer():
    if not FUZZ.exists():
        if shutil.which("clang-19") is None:
            pytest.skip("no rkv-fuzz binary and no clang-19 to build it (scripts/deps.sh installs it)")
        pytest.fail(f"{FUZZ} missing, though clang-19 is installed: run `make` first")
    return FUZZ


def run_fuzzer(exe, *args, timeout):
    p = subprocess.run(
        [str(exe), *map(str, args)],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        check=False,  # the status is what the tests check
    )
    out = p.stdout + p.stderr
    # libFuzzer's last lines carry the verdict; a crash report sits before them
    assert p.returncode == 0, f"rkv-fuzz exited with {p.returncode}:\n{out[-12000:]}"
    return out


def test_corpus_replays_cleanly(fuzzer, tmp_path):
    seeds = sorted(CORPUS.iterdir())
    assert len(seeds) >= 30
    # -runs=0: run every file of the corpus once, then stop; a crashing
    # input is written under tmp_path, not into the working directory
    out = run_fuzzer(fuzzer, "-runs=0", "-timeout=10", f"-artifact_prefix={tmp_path}/", CORPUS, timeout=300)
    assert f"{len(seeds)} files found in" in out
    assert "INITED" in out


def test_short_campaign_finds_nothing(fuzzer, tmp_path):
    # on a copy: new inputs go to its first directory
    work = tmp_path / "corpus"
    shutil.copytree(CORPUS, work)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    out = run_fuzzer(
        fuzzer,
        f"-max_total_time={CAMPAIGN_SECONDS}",
        "-max_len=4096",
        "-seed=1",
        "-timeout=10",
        f"-dict={DICT}",
        f"-artifact_prefix={artifacts}/",
        "-print_final_stats=1",
        work,
        timeout=CAMPAIGN_SECONDS + 240,
    )
    assert "stat::number_of_executed_units" in out
    assert not list(artifacts.iterdir()), out[-4000:]
