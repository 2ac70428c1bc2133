"""scripts/setup.sh chooses what to install: on a machine with no NVIDIA GPU, CuPy and NVRTC
only (before: the whole CUDA 12 toolkit, 2.5 GB of wheels that only a GPU uses)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(cuda: str | None) -> subprocess.CompletedProcess:
    if not (ROOT / ".venv" / "bin" / "python").exists() or shutil.which("bash") is None:
        pytest.skip("needs bash and the project's .venv (scripts/setup.sh makes it)")
    env = {k: v for k, v in os.environ.items() if k != "GPUPLAN_CUDA"}
    if cuda is not None:
        env["GPUPLAN_CUDA"] = cuda
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--dry-run"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)


def _has_gpu() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir()


def test_without_a_gpu_only_cupy_and_nvrtc_are_installed():
    res = _dry_run(None)
    assert res.returncode == 0, res.stderr
    if _has_gpu() or "keeping the installed CuPy" in res.stdout or "cuda13" in res.stdout:
        pytest.skip("a GPU machine, or a .venv with another CuPy: the toolkit extra is kept")
    assert res.stdout.endswith('setup.sh: pip install -e ".[test,data,nvrtc12]"\n'), res.stdout
    assert "no NVIDIA GPU here: CuPy and NVRTC only" in res.stdout


def test_an_explicit_choice_is_followed_and_a_bad_one_refused():
    res = _dry_run("none")
    assert res.returncode == 0 and res.stdout.endswith('pip install -e ".[test,data]"\n')
    res = _dry_run("bogus")
    assert res.returncode == 2
    assert res.stderr == "setup.sh: GPUPLAN_CUDA must be 12, 13 or none, given 'bogus'\n"


def test_the_lean_extra_is_declared():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["nvrtc12"] == ["cupy-cuda12x>=14.2", "nvidia-cuda-nvrtc-cu12"]
    assert "nvidia-cuda-runtime-cu12" in extras["test"]  # the headers the emulator includes
