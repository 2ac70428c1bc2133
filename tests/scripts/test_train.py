"""scripts/train.py: layout rule, option checks, and end-to-end runs under mpiexec -n 4."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train.py"
TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "8", "--max-bytes", "200000", "--eval-batches", "1",
        "--sample-tokens", "8", "--warmup", "2", "--progress", "plain"]


def _load():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("train_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train = _load()


def _mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec")
    return found


def run(n: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(SCRIPT), *args] if n == 1 else \
        [_mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", str(SCRIPT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


@pytest.mark.parametrize("n,given,expected", [
    (1, (None, None, None), (1, 1, 1)), (2, (None, None, None), (1, 1, 2)),
    (4, (None, None, None), (1, 2, 2)), (8, (None, None, None), (2, 2, 2)),
    (3, (None, None, None), (3, 1, 1)), (4, (None, 4, None), (1, 4, 1)),
    (4, (2, None, None), (2, 1, 2)),  # (tp, pp, dp) given -> (dp, pp, tp)
    (8, (None, None, 2), (2, 4, 1)),
])
def test_default_layout_rule(n, given, expected):
    tp, pp, dp = given
    assert train.derive_layout(n, tp, pp, dp) == expected


@pytest.mark.parametrize("args,world,message", [
    (["--tp", "3"], 4, "does not match the 4 MPI ranks"),
    (["--tp", "2", "--pp", "2", "--dp", "2"], 4, "= 8 does not match"),
    (["--n-head", "3", "--n-embd", "48", "--tp", "2"], 2, "--n-head 3 is not divisible by --tp 2"),
    (["--n-layer", "3", "--pp", "2"], 2, "--n-layer 3 is not divisible by --pp 2"),
    (["--data", "/no/such/file.txt"], 1, "no such file or folder"),
    (["--batch-size", "6", "--pp", "2", "--micro-batches", "4"], 2, "equal parts"),
    (["--n-embd", "30"], 1, "not divisible by --n-head 4"),
    pytest.param(["--device", "cuda"], 1, "--device cuda: no usable CUDA device",
                 marks=pytest.mark.skipif(__import__("gpuplan").device_available(),
                                          reason="a device is present")),
])
def test_option_errors_are_one_line(args, world, message):
    ns = train.parse_args(args)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")) as e:
        train.validate(ns, world)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("args,message", [
    (["--tp", "3"], "does not match the 4 MPI ranks"),
    (["--data", "/no/such/dir"], "no such file or folder"),
    (["--n-head", "3", "--n-embd", "48", "--tp", "2"], "not divisible by --tp 2"),
    (["--n-layer", "3", "--pp", "2", "--tp", "2"], "not divisible by --pp 2"),
])
def test_bad_options_exit_non_zero_on_every_rank_with_one_line(args, message):
    res = run(4, *args, timeout=120)
    assert res.returncode != 0
    errors = [line for line in res.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(errors) == 1 and message in errors[0], res.stderr  # rank 0 only, one line


def test_tp2_pp2_run_matches_one_process_and_resumes_exactly(tmp_path):
    steps = ["--steps", "6", "--eval-interval", "3"]
    one = run(1, *TINY, *steps, "--out", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    full = run(4, *TINY, *steps, "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr + full.stdout
    assert "mesh: dp=1 pp=2 tp=2" in full.stdout
    for name in ("metrics.json", "loss.png"):
        assert (tmp_path / "full" / name).stat().st_size > 0
    assert len(list((tmp_path / "full" / "checkpoint").glob("rank*-of-00004.npz"))) == 4
    h_one = json.loads((tmp_path / "one" / "metrics.json").read_text())["history"]
    h_full = json.loads((tmp_path / "full" / "metrics.json").read_text())["history"]
    assert [h["step"] for h in h_full] == [1, 3, 6]
    for a, b in zip(h_one, h_full, strict=True):  # same global batches, no dropout
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4)

    # Resume, with dropout so that the RNG state must come back too.
    drop = [*TINY, *steps, "--dropout", "0.1", "--out"]
    ref = run(4, *drop, str(tmp_path / "drop"))
    assert ref.returncode == 0, ref.stderr
    part = run(4, *drop, str(tmp_path / "resumed"), "--stop-after", "3")
    assert part.returncode == 0 and "stopped after step 3" in part.stdout, part.stderr
    rest = run(4, *drop, str(tmp_path / "resumed"), "--resume")
    assert rest.returncode == 0 and "resumed at step 3" in rest.stdout, rest.stderr
    h_ref, h_res = (json.loads((tmp_path / d / "metrics.json").read_text())["history"]
                    for d in ("drop", "resumed"))
    assert [(h["step"], h["train_loss"], h["val_loss"]) for h in h_res] == \
        [(h["step"], h["train_loss"], h["val_loss"]) for h in h_ref]  # bitwise
    assert h_ref[-1]["train_loss"] != h_full[-1]["train_loss"]  # dropout acted

    other = run(4, *drop, str(tmp_path / "resumed"), "--resume", "--dp", "2", "--pp", "1")
    errors = [line for line in other.stderr.splitlines() if "error" in line]
    assert other.returncode != 0 and len(errors) == 1, other.stderr
    assert "layout" in errors[0]

    gen = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate.py"),
                          "--checkpoint", str(tmp_path / "full" / "checkpoint"),
                          "--tokens", "8", "--seed", "1"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert gen.returncode == 0, gen.stderr
    assert gen.stdout.startswith("def ") and "step 6" in gen.stderr


def test_emulated_device_run_matches_the_host_run(tmp_path):
    """The main job on the emulated device (every kernel from its CUDA source, device arrays
    staged through host MPI) gives the host backend's losses, under tp=2."""
    steps = ["--steps", "3", "--eval-interval", "3", "--sample-tokens", "4"]
    host = run(2, *TINY, *steps, "--device", "cpu", "--out", str(tmp_path / "cpu"))
    assert host.returncode == 0, host.stderr
    emu = run(2, *TINY, *steps, "--device", "emulated", "--out", str(tmp_path / "emu"))
    assert emu.returncode == 0, emu.stderr + emu.stdout
    assert "emulated sm_80" in emu.stdout
    h_cpu, h_emu = (json.loads((tmp_path / d / "metrics.json").read_text())["history"]
                    for d in ("cpu", "emu"))
    assert [h["step"] for h in h_emu] == [1, 3]
    for a, b in zip(h_cpu, h_emu, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4)
