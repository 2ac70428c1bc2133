"""Test configuration: the `device` fixture, gpu skipping, mpi-only collection, and an MPI
that outlives the train.py jobs tests run in the pytest process.

With GPUPLAN_DEVICE=emulated the `gpu`-marked tests run on the emulated device: the device
fixture's accelerator parameter is "emulated", and "cuda" in a test resolves to it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import gpuplan as gp

UNDER_MPI = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1


#: The tests that launch whole train.py jobs (seconds each, the longest of the suite).
LAUNCHED_JOBS = Path(__file__).resolve().parent / "scripts"


def pytest_collection_modifyitems(config, items):
    # The launched-job tests run first (a stable sort: files and their module fixtures stay
    # together), so that under xdist the short tests fill the end of the run and no worker
    # is left waiting alone on a long one.
    items.sort(key=lambda item: not Path(item.path).is_relative_to(LAUNCHED_JOBS))
    skip_gpu = pytest.mark.skip(reason="no usable CUDA device")
    for item in items:
        if "gpu" in item.keywords and not gp.device_available():
            item.add_marker(skip_gpu)
        if "mpi" in item.keywords and not UNDER_MPI:
            item.add_marker(pytest.mark.skip(reason="mpi test: run under mpiexec -n 2/4"))


#: The accelerator tests run on: "emulated" under GPUPLAN_DEVICE=emulated, else "cuda".
ACCELERATOR = gp.backend.resolve_device("cuda")
DEVICES = ["cpu", pytest.param(ACCELERATOR, marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request):
    """Run a test on the host (NumPy) and, when a device is present, on it (CuPy on a GPU,
    or the emulated device)."""
    return request.param


@pytest.fixture
def accelerator():
    """The device name `gpu`-marked tests run on ("cuda", or "emulated")."""
    return ACCELERATOR


@pytest.fixture(autouse=True, scope="session")
def _mpi_outlives_in_process_jobs():
    """Outside mpiexec, tests call train.py's main() in the pytest process (no interpreter
    start-up per run). main() finalizes MPI when a job ends with an error, as a launched job
    must; in a shared process that would leave the next in-process job an MPI already gone
    (MPICH aborts the process). Here Finalize is left to the process's exit (mpi4py's own).
    The launched runs (subprocess tests, the mpi stages) keep main()'s Finalize."""
    if UNDER_MPI:
        yield
        return
    from mpi4py import MPI  # initializes MPI (a world of one), as dist.init would

    finalize = MPI.Finalize
    MPI.Finalize = lambda: None
    try:
        yield
    finally:
        MPI.Finalize = finalize
