"""A rank killed (SIGKILL) at any point of a save leaves a committed checkpoint that loads.

Each case runs checkpoint_crash_driver.py under `mpiexec -n 2`: step 1 committed, then a
rank dies while saving step 2 (or at a random instant of repeated saves). The folder must
then verify, and hold the previous step's exact weights (or the new step's, for a kill after
`latest` moved). The launches run concurrently: they are mostly start-up time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dist
from autograd import nn
from dist.checkpoint import read_manifest, read_shard

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("checkpoint_crash_driver.py")
# (point, killed rank, step that `latest` must name after the kill)
CASES = [("shard-half", 1, 1), ("shard-written", 0, 1), ("manifest-half", 0, 1),
         ("manifest-written", 0, 1), ("latest-half", 0, 1), ("pruning", 0, 2),
         ("random", 1, None), ("random", 0, None)]


def _mpiexec() -> str | None:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """{case index: (checkpoint root, completed process)} for every case, run at once."""
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for key in [k for k in env if k.startswith(("PMI_", "OMPI_", "HYDRA_", "MPIR_"))]:
        del env[key]  # never inherit an enclosing MPI job's wiring
    base = tmp_path_factory.mktemp("crash")
    procs = {}
    for i, (point, rank, _) in enumerate(CASES):
        root = base / f"{i}-{point}" / "checkpoint"
        cmd = [mpiexec, "-n", "2", sys.executable, str(DRIVER), str(root), point, str(rank),
               str(i)]
        procs[i] = (root, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True, env=env,
                                           cwd=ROOT))
    results = {}
    for i, (root, proc) in procs.items():
        try:
            out, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0] + "\n(timed out: a hang)"
        results[i] = (root, proc.returncode, out)
    return results


def _expected(rank: int, step: int) -> dict[str, np.ndarray]:
    return {k: v + (step - 1) for k, v in
            nn.Linear(4, 3, dtype=np.float64, seed=rank).state_dict().items()}


@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=[f"{p}-rank{r}" for p, r, _ in CASES])
def test_a_kill_during_a_save_leaves_the_last_committed_checkpoint(crashed, case):
    root, returncode, out = crashed[case]
    point, _, want_step = CASES[case]
    assert returncode != 0 and "the save of step 2 returned" not in out, out[-2000:]
    assert "timed out" not in out
    step_dir, manifest = dist.verify_checkpoint(root)  # every shard's size and SHA-256
    step = manifest["step"]
    assert step == (want_step if want_step is not None else step), (point, step)
    assert step_dir.name == f"step_{step:06d}"
    for rank in range(2):
        state, header = read_shard(step_dir, manifest, rank)
        for name, value in _expected(rank, step).items():
            np.testing.assert_array_equal(state[name], value)
    # What the crash left (a staging or trash folder) is cleared by the next save, which
    # commits on top of the surviving checkpoint.
    model = nn.Linear(4, 3, dtype=np.float64, seed=0)
    dist.save_checkpoint(root, model, step=step + 1, keep=2)
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]
    assert read_manifest(root / f"step_{step + 1:06d}")["step"] == step + 1
    assert (root / "latest").read_text().strip() == f"step_{step + 1:06d}"
