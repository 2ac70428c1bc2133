"""Test configuration: the `device` fixture, gpu skipping, and mpi-only collection."""

from __future__ import annotations

import os

import pytest

import gpuplan as gp

UNDER_MPI = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no usable CUDA device")
    for item in items:
        if "gpu" in item.keywords and not gp.device_available():
            item.add_marker(skip_gpu)
        if "mpi" in item.keywords and not UNDER_MPI:
            item.add_marker(pytest.mark.skip(reason="mpi test: run under mpiexec -n 2/4"))


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request):
    """Run a test on the host (NumPy) and, when a GPU is present, on the device (CuPy)."""
    return request.param
