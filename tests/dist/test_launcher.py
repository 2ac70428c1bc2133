"""dist.launcher (launcher variables, mismatch, oversubscription, BLAS threads) and
dist.mpi_wait (how blocking MPI calls wait), with simulated environments."""

from __future__ import annotations

import time

import pytest

from dist import launcher, mpi_wait
from gpuplan.errors import Unsupported

HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "PMIX_RANK": "2"}
SRUN = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "6", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "4,2", "SLURM_CPUS_PER_TASK": "3",
        "SLURM_NTASKS": "6"}


@pytest.mark.parametrize("env,expected", [
    ({}, ("none", 0, None, None, None)),
    (HYDRA, ("Hydra (MPICH)", 1, 4, 1, 4)),
    (OPEN_MPI, ("Open MPI", 2, 8, 0, 4)),
    (SRUN, ("Slurm srun", 5, 6, 1, 2)),
    ({"PMIX_RANK": "3"}, ("PMIx", 3, None, None, None)),
    # A batch script's own shell: the allocation's size, but one process, no launch.
    ({"SLURM_NTASKS": "6", "SLURM_PROCID": "0"}, ("none", 0, None, None, None)),
    # mpiexec inside an allocation: the MPI launcher's variables win.
    ({**SRUN, **HYDRA}, ("Hydra (MPICH)", 1, 4, 1, 4)),
])
def test_detect(env, expected):
    got = launcher.detect(env)
    assert (got.launcher, got.rank, got.size, got.local_rank, got.local_size) == expected
    assert launcher.env_rank(env) == expected[1]


@pytest.mark.parametrize("spec,node,expected", [
    ("2(x3),1", 0, 2), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1), ("4", 0, 4), ("4", 1, None),
    ("bad", 0, None)])
def test_slurm_tasks_per_node(spec, node, expected):
    env = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "7", "SLURM_NODEID": str(node),
           "SLURM_STEP_TASKS_PER_NODE": spec}
    assert launcher.detect(env).local_size == expected


def test_mismatch_names_the_launcher_and_mpi4py_library():
    line = launcher.mismatch(1, OPEN_MPI, library="MPICH Version: 5.0.2")
    assert line is not None and "\n" not in line
    assert "Open MPI: OMPI_COMM_WORLD_SIZE=8" in line and "MPICH Version: 5.0.2" in line
    assert "started 8 processes" in line
    # The real library name when none is given (mpi4py's own).
    assert launcher.mpi_library() in launcher.mismatch(1, HYDRA)
    assert launcher.mismatch(4, HYDRA) is None          # launcher and MPI agree
    assert launcher.mismatch(1, {}) is None             # no launcher: one process
    assert launcher.mismatch(1, {"PMI_SIZE": "1"}) is None
    assert launcher.mismatch(1, {"PMIX_RANK": "1"}) is None  # no size to compare


def test_oversubscription_note_and_blas_threads():
    assert launcher.oversubscribed(HYDRA, cores=2) and not launcher.oversubscribed(HYDRA, cores=4)
    note = launcher.oversubscription_note(HYDRA, cores=2)
    assert note.startswith("note: 4 ranks share 2 cores") and "2.0x" in note
    assert launcher.oversubscription_note(HYDRA, cores=8) is None
    assert launcher.oversubscription_note({}, cores=1) is None
    assert launcher.blas_threads(HYDRA, cores=16) == 4
    assert launcher.blas_threads(HYDRA, cores=2) == 1    # at least one
    assert launcher.blas_threads({}, cores=6) == 6
    assert launcher.blas_threads(SRUN, cores=64) == 3   # srun --cpus-per-task
    assert launcher.blas_threads({"SLURM_CPUS_PER_TASK": "3"}, cores=8) == 8  # no launch


def test_resolve_wait(monkeypatch):
    monkeypatch.delenv(mpi_wait.ENV_WAIT, raising=False)
    for mode in ("spin", "yield", "sleep"):
        assert mpi_wait.resolve_wait(mode) == mode
    for name in ("MPI_LOCALNRANKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    assert mpi_wait.resolve_wait() == "spin"  # one process
    monkeypatch.setenv("MPI_LOCALNRANKS", str(launcher.usable_cores() + 1))
    assert mpi_wait.resolve_wait() == "yield"
    monkeypatch.setenv(mpi_wait.ENV_WAIT, "spin")
    assert mpi_wait.resolve_wait() == "spin"
    monkeypatch.setenv(mpi_wait.ENV_WAIT, "nap")
    with pytest.raises(Unsupported, match="GPUPLAN_MPI_WAIT"):
        mpi_wait.resolve_wait()


@pytest.mark.parametrize("mode", ["yield", "sleep"])
def test_poll_until_returns_the_first_true_result(monkeypatch, mode):
    results = iter([False, None, 0, "done"])
    calls, yields = [], []
    real_yield = mpi_wait.os.sched_yield
    monkeypatch.setattr(mpi_wait.os, "sched_yield", lambda: (yields.append(1), real_yield()))

    def test():
        calls.append(time.perf_counter())
        return next(results)

    assert mpi_wait.poll_until(test, mode) == "done"
    gaps = [b - a for a, b in zip(calls, calls[1:], strict=False)]
    assert len(gaps) == 3
    if mode == "yield":
        assert len(yields) == 3
    else:
        assert not yields and min(gaps) >= mpi_wait._FIRST_PAUSE
