"""`make install` into a temporary prefix, then an out-of-tree program built
with nothing but `pkg-config rekindle`: it must start (the shared library
is found without LD_LIBRARY_PATH) and restart warm."""

import json
import os
import shutil
import subprocess

import pytest

from conftest import BUILD, ROOT

PROGRAM = r"""
#include <rekindle.h>
#include <stdio.h>
#include <stdint.h>

static volatile int *volatile nowhere;

int main(int argc, char **argv)
{
	if (rk_init(argc, argv, NULL) < 0)
		return 3;
	rk_arena *a = rk_arena_open("counter", 1 << 20);
	if (!a)
		return 4;
	uint64_t *n = rk_root_get(a, "n");
	int warm = rk_is_recovery();
	if (warm) {
		rk_mark(a, n);
		rk_finish_recovery(true, NULL);
	} else {
		n = rk_calloc(a, 1, sizeof *n);
		rk_root_set(a, "n", n);
	}
	rk_unsafe_begin(a);
	++*n;
	rk_unsafe_end(a);
	printf("{\"kind\":\"%s\",\"n\":%llu}\n", warm ? "warm" : "first", (unsigned long long)*n);
	fflush(stdout);
	if (*n == 1)
		*nowhere = 1; /* the first incarnation faults: the second finds n */
	return 0;
}
"""


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("prefix")
    p = subprocess.run(
        ["make", "-C", str(ROOT), "install", f"PREFIX={prefix}", f"BUILD={BUILD}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return prefix


def test_install_puts_library_headers_pkgconfig_binary_and_man_pages(prefix):
    for f in [
        "lib/librekindle.a",
        "lib/librekindle.so.0",
        "lib/librekindle.so",
        "lib/pkgconfig/rekindle.pc",
        "include/rekindle.h",
        "bin/rekindle",
        "share/man/man1/rekindle.1",
        "share/man/man1/rekindle-run.1",
    ]:
        assert (prefix / f).exists(), f
    rekindle = str(prefix / "bin/rekindle")
    v = subprocess.run([rekindle, "--version"], capture_output=True, text=True, check=True)
    assert v.stdout.startswith("rekindle ")
    page = (prefix / "share/man/man1/rekindle-run.1").read_text()
    assert r"\-\-hang\-timeout" in page and ".TH rekindle-run 1" in page
    pc = (prefix / "lib/pkgconfig/rekindle.pc").read_text()
    assert f"prefix={prefix}" in pc and str(ROOT) not in pc, "the installed .pc names the prefix only"


def test_out_of_tree_program_built_with_pkg_config_runs_and_restarts_warm(prefix, tmp_path):
    if not shutil.which("pkg-config"):
        pytest.fail("pkg-config missing: scripts/deps.sh installs it")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REKINDLE_", "LD_LIBRARY_PATH"))}
    env["PKG_CONFIG_PATH"] = str(prefix / "lib/pkgconfig")
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "rekindle"], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    src = tmp_path / "counter.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "counter"
    subprocess.run(["cc", "-std=c11", "-O2", str(src), "-o", str(exe), *flags], check=True, env=env)
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, check=True).stdout
    assert str(prefix / "lib/librekindle.so.0") in ldd, ldd
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert run.returncode == 0, run.stderr
    states = [json.loads(line) for line in run.stdout.splitlines()]
    assert states == [{"kind": "first", "n": 1}, {"kind": "warm", "n": 2}], run.stderr
