"""Fixtures for dist tests: the world, and a tensor-parallel config (one process or all)."""

from __future__ import annotations

import pytest

import dist

MODES = ["single", pytest.param("world", marks=pytest.mark.mpi)]


@pytest.fixture(scope="session")
def world():
    return dist.init()


@pytest.fixture(params=MODES)
def tp_config(request, world):
    """TP over one process (comm=None), and, under mpiexec, over the whole world."""
    comm = None if request.param == "single" else world
    return dist.TensorParallelConfig(comm=comm)
