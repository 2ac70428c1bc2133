"""scripts/train.py as users run it: metrics.jsonl kept after a kill and after --resume,
the matplotlib plot, --help once under mpiexec, a launcher/MPI mismatch refused, the
oversubscription line, and the console entry points."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.scripts.test_train import _mpiexec, run_here

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train.py"
TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "8", "--max-bytes", "200000", "--eval-batches", "1",
        "--sample-tokens", "8", "--warmup", "2", "--progress", "plain"]
LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "MPI_LOCALRANKID", "PMIX_RANK",
                 "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                 "SLURM_STEP_NUM_TASKS", "SLURM_PROCID")
ENV = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS},
       "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def train(*args: str, env: dict | None = None, timeout: int = 120):
    return subprocess.run([sys.executable, str(SCRIPT), *TINY, *args], capture_output=True,
                          text=True, timeout=timeout, env={**ENV, **(env or {})}, cwd=ROOT)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_jsonl_survives_a_stop_and_a_resume_and_the_plot_is_drawn(tmp_path):
    out = tmp_path / "run"
    first = run_here(*TINY, "--steps", "8", "--eval-interval", "2", "--stop-after", "4",
                     "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert [r["step"] for r in records(out / "metrics.jsonl")] == [1, 2, 4]
    assert "| eta " in first.stdout  # the evaluation lines say how long is left
    # As if a run had gone on past its last checkpoint (step 4) and died mid-line:
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 6, "train_loss": 9.9}) + '\n{"step": 8, "trai')
    second = run_here(*TINY, "--steps", "8", "--eval-interval", "2", "--resume", "--out",
                      str(out))
    assert second.returncode == 0, second.stderr
    recs = records(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 4, 6, 8]
    assert recs[3]["train_loss"] != 9.9  # the dead run's step-6 record was replaced
    final = json.loads((out / "metrics.json").read_text())["history"]
    assert [h["step"] for h in final] == [1, 2, 4, 6, 8]
    png = (out / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and b"Software\x00Matplotlib" in png


def test_a_killed_run_keeps_its_metrics(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *TINY, "--steps", "500",
                             "--eval-interval", "1", "--keep", "1", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
    path = out / "metrics.jsonl"
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if path.exists() and path.read_text().count("\n") >= 3:
                break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err
    steps = [r["step"] for r in records(path)[:3]]  # whole lines, whatever the kill cut
    assert steps == [1, 2, 3]


def test_help_is_printed_once_under_mpiexec():
    res = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(SCRIPT),
                          "--help"], capture_output=True, text=True, timeout=60, env=ENV,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("usage: train.py") == 1
    assert "(default: 300)" in res.stdout and "--config TOML" in res.stdout


@pytest.mark.parametrize("launch_env", [
    {"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "{rank}"},
    {"SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "{rank}"},
], ids=["open-mpi", "srun"])
def test_launcher_of_another_mpi_is_refused(tmp_path, launch_env):
    """N copies that each see a world of one rank: exit 2 in every copy, one line in the
    launcher's rank 0, nothing trained or written."""
    results = {}
    for rank in (0, 1):
        env = {k: v.format(rank=rank) for k, v in launch_env.items()}
        results[rank] = train("--steps", "2", "--out", str(tmp_path / "run"), env=env)
    assert results[0].returncode == results[1].returncode == 2
    lines = results[0].stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: the launcher (")
    assert "started 3 processes" in lines[0] and "mpi4py's MPI (MPICH Version: " in lines[0]
    assert results[1].stderr.strip() == "" and results[1].stdout.strip() == ""
    assert not (tmp_path / "run").exists()


def test_oversubscription_is_said_once_at_start(tmp_path, monkeypatch):
    for name in LAUNCHER_VARS:  # as ENV: this process's launcher (if any) says nothing
        monkeypatch.delenv(name, raising=False)
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("MPI_LOCALNRANKS", str(2 * cores))
    res = run_here(*TINY, "--steps", "2", "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    notes = [line for line in res.stdout.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: {2 * cores} ranks share {cores} core{'s' if cores > 1 else ''} "
                     f"on this node (2.0x oversubscribed): ranks yield the core while they wait "
                     f"for MPI (GPUPLAN_MPI_WAIT=auto), each runs 1 BLAS thread; one rank per "
                     f"core runs faster"]
    monkeypatch.delenv("MPI_LOCALNRANKS")
    plain = run_here(*TINY, "--steps", "2", "--out", str(tmp_path / "run2"))
    assert not [line for line in plain.stdout.splitlines() if line.startswith("note: ")]


@pytest.mark.parametrize("name", ["gpuplan-train", "gpuplan-generate", "gpuplan-export"])
def test_console_entry_points(name):
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert name in found, f"{name} is not installed: run bash scripts/setup.sh"
    assert callable(found[name].load())
    exe = shutil.which(name, path=str(Path(sys.executable).parent))
    assert exe is not None, f"no {name} beside {sys.executable}"
    res = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60, env=ENV)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: {name}")


def test_without_matplotlib_the_run_ends_well_and_says_how_to_plot(tmp_path):
    """A `pip install --no-deps` machine (the GPU check's) may lack matplotlib: the run must
    not fail at its very end."""
    blocker = tmp_path / "blocked" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('blocked', name='matplotlib')\n")
    res = train("--steps", "2", "--out", str(tmp_path / "run"),
                env={"PYTHONPATH": f"{blocker.parent}{os.pathsep}{ROOT}"})
    assert res.returncode == 0, res.stderr
    assert ("no loss.png (matplotlib is not installed; python -m dist.trainer.plotting "
            in res.stdout)
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "loss.png").exists()
