"""scripts/check_kernels.py's command line: --arch takes 90 or sm_90 and refuses anything
else with one usage error (the compile itself runs in the test command's compile check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_kernels.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_arch_accepts_the_sm_prefix():
    pytest.importorskip("cupy")
    res = _run("--arch", "sm_90", "80", "--module", "dropout", "--quiet")
    assert res.returncode == 0, res.stderr
    assert "arch sm_90 sm_80, 0 failures" in res.stdout


def test_bad_arch_is_one_usage_error():
    res = _run("--arch", "sm_x", "--module", "dropout")
    assert res.returncode == 2
    assert "--arch: compute capabilities such as 80 or sm_90, given x" in res.stderr


def _rows(stdout: str) -> list[str]:
    """The per-kernel lines and the summary: everything but the per-module timings."""
    return [ln for ln in stdout.splitlines() if " kernels in " not in ln]


def test_jobs_compiles_the_same_instances_as_one_process():
    pytest.importorskip("cupy")
    args = ("--arch", "80", "90", "--module", "dropout", "--module", "embedding")
    one = _run(*args, "--jobs", "1")
    two = _run(*args, "--jobs", "2")
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    assert "kernel instances, arch sm_80 sm_90, 0 failures" in two.stdout
    rows = _rows(one.stdout)
    assert any("regs=" in ln for ln in rows)
    assert _rows(two.stdout) == rows
    order = [ln.split(":")[0] + ln.split(" ")[1] for ln in one.stdout.splitlines()
             if " kernels in " in ln]
    assert order == [ln.split(":")[0] + ln.split(" ")[1] for ln in two.stdout.splitlines()
                     if " kernels in " in ln]


def test_bad_jobs_is_one_usage_error():
    res = _run("--jobs", "0", "--module", "dropout")
    assert res.returncode == 2
    assert "--jobs: a number of processes >= 1, given 0" in res.stderr
