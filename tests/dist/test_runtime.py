"""dist.init(): local rank, and an uncaught exception on one rank aborts the whole job."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import dist
from dist import runtime

REPO = Path(__file__).resolve().parents[2]


def test_init_is_idempotent_and_sets_local_rank():
    world = dist.init()
    assert dist.init() is world is dist.world()
    assert dist.is_initialized()
    assert 0 <= dist.local_rank() < world.size


def test_init_makes_the_local_rank_device_current_through_gpuplan():
    from gpuplan import backend as gpb

    dist.init()
    count = gpb.device_count()
    if count == 0:
        assert gpb.use_device(0) is None  # no CUDA device: nothing to select
        return
    index = dist.local_rank() % count
    assert gpb.cupy_module().cuda.Device().id == index
    assert gpb.use_device(index) == index
    with pytest.raises(ValueError, match="use_device"):
        gpb.use_device(count)


def _clean_env() -> dict[str, str]:
    """This process's environment minus any MPI launcher variables (no nested-job confusion)."""
    prefixes = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_", "I_MPI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def test_exception_on_one_rank_aborts_the_job_instead_of_hanging(tmp_path):
    mpiexec = Path(sys.executable).with_name("mpiexec")
    if not mpiexec.exists():
        pytest.skip("no mpiexec next to this Python")
    script = tmp_path / "boom.py"
    script.write_text(textwrap.dedent("""
        import dist
        world = dist.init()
        if world.rank == 1:
            raise RuntimeError("boom on purpose")
        world.barrier()  # rank 0 would wait here forever without MPI_Abort
        print("rank 0 passed the barrier")
    """))
    start = time.monotonic()
    proc = subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=120, env=_clean_env(),
                          cwd=tmp_path)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "[rank 1/2] uncaught RuntimeError; aborting the MPI job" in proc.stderr
    assert "boom on purpose" in proc.stderr
    assert "passed the barrier" not in proc.stdout
    assert elapsed < 30, f"abort took {elapsed:.1f} s"


# -- the launch against the world MPI sees (simulated launcher environments) ---------------

_HYDRA = {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}
_OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "8",
             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
             "PMIX_RANK": "2"}


def test_mismatch_names_the_launcher_and_mpi4py_library():
    line = runtime.launcher_mismatch(1, _OPEN_MPI, library="MPICH Version: 5.0.2")
    assert line is not None and "\n" not in line
    assert "Open MPI: OMPI_COMM_WORLD_SIZE=8" in line and "MPICH Version: 5.0.2" in line
    assert "started 8 processes" in line
    # The real library name when none is given (mpi4py's own).
    assert runtime.mpi_library() in runtime.launcher_mismatch(1, _HYDRA)
    assert runtime.launcher_mismatch(4, _HYDRA) is None          # launcher and MPI agree
    assert runtime.launcher_mismatch(1, {}) is None             # no launcher: one process
    assert runtime.launcher_mismatch(1, {"PMI_SIZE": "1"}) is None
    assert runtime.launcher_mismatch(1, {"PMIX_RANK": "1"}) is None  # no size to compare
