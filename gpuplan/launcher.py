"""What the process launcher says: rank and size, ranks per node, cores (stdlib only: the host
backend sizes its thread pools by the ranks that share a node; dist.runtime compares the
launch with the world MPI sees).

Launchers tell each process its place through environment variables, before MPI starts:

- MPICH's Hydra (mpiexec) and Intel MPI: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
  MPI_LOCALNRANKS;
- Open MPI (mpirun, prterun): OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
  (PMIx launchers also set PMIX_RANK);
- Slurm (srun): SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE,
  SLURM_NODEID, SLURM_CPUS_PER_TASK. A batch script's own environment has SLURM_NTASKS (the
  allocation) but is one process: only srun's step variables count as a launch.

An MPI launcher's variables win over Slurm's (mpiexec run inside an allocation). These are
read without MPI, so they work before MPI_Init (--help printed once) and they catch
the mismatch MPI cannot see: a launcher of one MPI library starting N copies of a program
whose mpi4py is built on another, where every copy is rank 0 of a world of 1.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    """This process's place as the launcher gave it (None where the launcher is silent)."""

    launcher: str          # "Hydra (MPICH)", "Open MPI", "Slurm srun", "PMIx" or "none"
    size_var: str | None   # the variable that gave `size`, for messages
    rank: int
    size: int | None
    local_rank: int | None
    local_size: int | None


def _int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def _slurm_tasks_on_node(env: Mapping[str, str]) -> int | None:
    """Tasks of this srun step on this node, from SLURM_STEP_TASKS_PER_NODE ("2(x3),1")."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    node = _int(env, "SLURM_NODEID") or 0
    if not spec:
        return None
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if node < len(counts) else None


def detect(env: Mapping[str, str] | None = None) -> Launch:
    """The launcher that started this process and what it says (see the module docstring)."""
    env = os.environ if env is None else env
    if "OMPI_COMM_WORLD_SIZE" in env:
        return Launch("Open MPI", "OMPI_COMM_WORLD_SIZE", _int(env, "OMPI_COMM_WORLD_RANK") or 0,
                      _int(env, "OMPI_COMM_WORLD_SIZE"), _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
                      _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"))
    if "PMI_SIZE" in env or "MPI_LOCALNRANKS" in env:
        return Launch("Hydra (MPICH)" if "MPI_LOCALNRANKS" in env else "PMI", "PMI_SIZE",
                      _int(env, "PMI_RANK") or 0, _int(env, "PMI_SIZE"),
                      _int(env, "MPI_LOCALRANKID") if "MPI_LOCALRANKID" in env
                      else _int(env, "SLURM_LOCALID"),
                      _int(env, "MPI_LOCALNRANKS") or _slurm_tasks_on_node(env))
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:
        return Launch("Slurm srun", "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_PROCID") or 0,
                      _int(env, "SLURM_STEP_NUM_TASKS"), _int(env, "SLURM_LOCALID"),
                      _slurm_tasks_on_node(env))
    if "PMIX_RANK" in env:  # PMIx gives no size variable; the rank still picks who prints
        return Launch("PMIx", None, _int(env, "PMIX_RANK") or 0, None, None, None)
    return Launch("none", None, 0, None, None, None)


def env_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank as the launcher says (0 without one): usable before MPI_Init."""
    return detect(env).rank


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which Slurm and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def local_ranks(env: Mapping[str, str] | None = None) -> int:
    """Processes of this job on this node (1 when no launcher says)."""
    return detect(env).local_size or 1


def oversubscribed(env: Mapping[str, str] | None = None, cores: int | None = None) -> bool:
    """True when more ranks of this job share the node than this process has cores."""
    return local_ranks(env) > (usable_cores() if cores is None else cores)


def blas_threads(env: Mapping[str, str] | None = None, cores: int | None = None) -> int:
    """BLAS threads for one rank: SLURM_CPUS_PER_TASK under srun, else cores // local ranks
    (at least 1), so the ranks of a node never run more BLAS threads than it has cores."""
    env = os.environ if env is None else env
    per_task = _int(env, "SLURM_CPUS_PER_TASK")
    if per_task and detect(env).launcher != "none":
        return max(1, per_task)
    cores = usable_cores() if cores is None else cores
    return max(1, cores // local_ranks(env))


def oversubscription_note(env: Mapping[str, str] | None = None,
                          cores: int | None = None) -> str | None:
    """One line saying that ranks outnumber cores (None when they do not)."""
    n, cores = local_ranks(env), usable_cores() if cores is None else cores
    if n <= cores:
        return None
    return (f"note: {n} ranks share {cores} core{'s' if cores != 1 else ''} on this node "
            f"({n / cores:.1f}x oversubscribed): ranks yield the core while they wait for MPI "
            f"(GPUPLAN_MPI_WAIT=auto), each runs 1 BLAS thread; one rank per core runs faster")
