"""Host backend process settings (gpuplan.host): allocator thresholds and BLAS threads."""

from __future__ import annotations

import platform

import numpy as np
import pytest

import gpuplan as gp
from gpuplan import host

_POLICY_VARS = ("GPUPLAN_HOST_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


@pytest.fixture
def blas_pool(monkeypatch):
    """A clean policy environment; the BLAS pool size is restored afterwards."""
    for v in _POLICY_VARS:
        monkeypatch.delenv(v, raising=False)
    before = host.blas_threads()
    yield before
    if before is not None:
        host.set_blas_threads(before)


def _policy() -> int | None:
    return host.limit_blas_threads.__wrapped__()  # uncached


def test_host_stream_applies_the_settings():
    gp.Stream.host()
    assert host.tune_allocator.cache_info().currsize == 1
    assert host.limit_blas_threads.cache_info().currsize == 1


def test_allocator_opt_out(monkeypatch):
    monkeypatch.setenv("GPUPLAN_HOST_MALLOC", "default")
    assert host.tune_allocator.__wrapped__() is False
    monkeypatch.delenv("GPUPLAN_HOST_MALLOC")
    # glibc has mallopt and accepts both thresholds; elsewhere there is nothing to tune.
    on_glibc = platform.libc_ver()[0] == "glibc"
    assert host.tune_allocator.__wrapped__() is on_glibc


def test_single_process_leaves_blas_alone(blas_pool):
    assert _policy() is None
    assert host.blas_threads() == blas_pool


def test_ranks_sharing_a_node_split_its_cores(blas_pool, monkeypatch):
    if blas_pool is None:
        pytest.skip("NumPy is not linked against OpenBLAS")
    monkeypatch.setenv("MPI_LOCALNRANKS", "64")
    host.set_blas_threads(2)
    assert _policy() == 1 and host.blas_threads() == 1
    # An explicit OpenBLAS/OpenMP setting wins over the automatic limit.
    host.set_blas_threads(2)
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert _policy() is None and host.blas_threads() == 2


def test_explicit_thread_count(blas_pool, monkeypatch):
    if blas_pool is None:
        pytest.skip("NumPy is not linked against OpenBLAS")
    monkeypatch.setenv("GPUPLAN_HOST_THREADS", "1")
    assert _policy() == 1 and host.blas_threads() == 1
    a = np.ones((64, 64), np.float32)
    np.testing.assert_array_equal(gp.functional.matmul(a, a), np.full((64, 64), 64.0))
    monkeypatch.setenv("GPUPLAN_HOST_THREADS", "two")
    with pytest.raises(ValueError, match="GPUPLAN_HOST_THREADS"):
        _policy()


def test_set_blas_threads_rejects_zero():
    with pytest.raises(ValueError, match="n >= 1"):
        host.set_blas_threads(0)
