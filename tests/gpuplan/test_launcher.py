"""gpuplan.launcher (launcher variables, mismatch, oversubscription, BLAS threads), with
simulated environments."""

from __future__ import annotations

import pytest

from gpuplan import launcher

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
