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
