"""Communicator: collectives and point-to-point against float64 references, and errors.

The mpi-marked tests run under `mpiexec -n 2` and `-n 4` (every rank runs them); the
others run in a plain process, where the world has one rank.
"""

from __future__ import annotations

import numpy as np
import pytest

import dist
import gpuplan as gp
from dist.communicator import resolve_backend
from dist.staging import PinnedBufferCache
from gpuplan.testing import assert_close, f64, on, random
from tests.helpers import DTYPES

mpi = pytest.mark.mpi


def rank_data(rank: int, shape, dtype, salt: int = 0) -> np.ndarray:
    """The array rank `rank` contributes: reproducible, so every rank can build the reference."""
    return random(shape, dtype, seed=1000 * salt + rank)


def all_ranks(world, shape, dtype, salt=0) -> list[np.ndarray]:
    return [f64(rank_data(r, shape, dtype, salt)) for r in range(world.size)]


# ---- collectives -------------------------------------------------------------------------


@mpi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "max", "mean"])
@pytest.mark.parametrize("shape", [(7,), (33, 5), (0, 4)])
def test_all_reduce(world, device, dtype, op, shape):
    x = on(device, rank_data(world.rank, shape, dtype))
    before = f64(x)
    y = world.all_reduce(x, op)
    stacked = np.stack(all_ranks(world, shape, dtype))
    expected = {"sum": stacked.sum(0), "max": stacked.max(0), "mean": stacked.mean(0)}[op]
    assert y.shape == x.shape and y.dtype == x.dtype and gp.device_of(y) == device
    assert_close(y, expected, dtype)
    np.testing.assert_array_equal(f64(x), before)  # the input is left alone


@mpi
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_in_place_and_into_strided_out(world, device, dtype):
    x = on(device, rank_data(world.rank, (6, 9), dtype))
    expected = np.sum(all_ranks(world, (6, 9), dtype), axis=0)
    assert world.all_reduce(x, "sum", out=x) is x
    assert_close(x, expected, dtype)
    out = on(device, np.zeros((9, 6), dtype)).T  # not C-contiguous
    src = on(device, rank_data(world.rank, (6, 9), dtype))
    assert world.all_reduce(src, "sum", out=out) is out
    assert_close(out, expected, dtype)


@mpi
def test_all_reduce_integers_and_non_contiguous_input(world, device):
    x = on(device, np.arange(12, dtype=np.int64).reshape(3, 4) * (world.rank + 1))
    y = world.all_reduce(x.T, "max")
    np.testing.assert_array_equal(gp.to_host(y), np.arange(12).reshape(3, 4).T * world.size)


@mpi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", [((3, 5), 0), ((3, 5), 1), ((2, 3, 4), -1), ((), 0),
                                        ((0, 3), 1)])
def test_all_gather(world, device, dtype, shape, axis):
    x = on(device, rank_data(world.rank, shape, dtype, salt=1))
    y = world.all_gather(x, axis=axis)
    parts = [p.reshape(shape or (1,)) for p in all_ranks(world, shape, dtype, salt=1)]
    np.testing.assert_array_equal(f64(y), np.concatenate(parts, axis=axis))  # exact copy
    assert y.dtype == x.dtype and gp.device_of(y) == device


@mpi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "max", "mean"])
@pytest.mark.parametrize("axis", [0, 1])
def test_reduce_scatter(world, device, dtype, op, axis):
    shape = (2 * world.size, 3) if axis == 0 else (5, 3 * world.size)
    x = on(device, rank_data(world.rank, shape, dtype, salt=2))
    y = world.reduce_scatter(x, op, axis=axis)
    stacked = np.stack(all_ranks(world, shape, dtype, salt=2))
    full = {"sum": stacked.sum(0), "max": stacked.max(0), "mean": stacked.mean(0)}[op]
    expected = np.split(full, world.size, axis=axis)[world.rank]
    assert y.shape == expected.shape and y.dtype == x.dtype
    assert_close(y, expected, dtype)


@mpi
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_from_last_rank_in_place(world, device, dtype):
    root = world.size - 1
    x = on(device, rank_data(world.rank, (4, 7), dtype, salt=3))
    assert world.broadcast(x, root=root) is x
    np.testing.assert_array_equal(f64(x), all_ranks(world, (4, 7), dtype, salt=3)[root])
    strided = on(device, rank_data(world.rank, (7, 4), dtype, salt=4)).T
    world.broadcast(strided, root=0)
    np.testing.assert_array_equal(f64(strided), all_ranks(world, (7, 4), dtype, salt=4)[0].T)


@mpi
@pytest.mark.parametrize("dtype", DTYPES)
def test_send_recv_ring(world, device, dtype):
    right, left = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    x = on(device, rank_data(world.rank, (5, 3), dtype, salt=5))
    pending = world.isend(x, right, tag=7)
    x[...] = 0  # isend copied the data already
    out = world.recv(on(device, np.zeros((5, 3), dtype)), left, tag=7)
    pending.wait()
    np.testing.assert_array_equal(f64(out), all_ranks(world, (5, 3), dtype, salt=5)[left])


@mpi
def test_blocking_send_recv_and_array_headers(world, device):
    if world.rank == 0:
        world.send(on(device, np.arange(6.0).reshape(2, 3)), dest=world.size - 1, tag=3)
        world.send_array(on(device, np.ones((3, 2), gp.bfloat16)), dest=world.size - 1, tag=4)
    if world.rank == world.size - 1:
        got = world.recv(on(device, np.zeros((2, 3))), source=0, tag=3)
        np.testing.assert_array_equal(gp.to_host(got), np.arange(6.0).reshape(2, 3))
        arr = world.recv_array(source=0, tag=4)
        assert arr.shape == (3, 2) and arr.dtype == gp.bfloat16 and gp.device_of(arr) == device
        np.testing.assert_array_equal(f64(arr), np.ones((3, 2)))
    world.barrier()


@mpi
def test_reduce_scatter_rejects_indivisible_axis(world):
    x = np.zeros((world.size + 1, 2), np.float32)
    with pytest.raises(gp.InvalidProblem, match=r"reduce_scatter.*'x'.*divisible.*given"):
        world.reduce_scatter(x)


@mpi
def test_objects(world):
    assert world.all_gather_object(world.rank * 10) == [10 * r for r in range(world.size)]
    assert world.bcast_object({"r": world.rank}, root=world.size - 1) == {"r": world.size - 1}


# ---- single process: errors, backend choice, staging cache ----------------------------


def test_world_of_one_process(world):
    if world.size != 1:
        pytest.skip("runs outside mpiexec")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(world.all_reduce(x, "mean"), x)
    np.testing.assert_array_equal(world.all_gather(x, axis=1), x)
    np.testing.assert_array_equal(world.reduce_scatter(x, axis=1), x)
    assert world.broadcast(x) is x
    assert world.backend == ("mpi-host" if not gp.device_available() else world.backend)
    assert dist.init() is world


def test_errors_name_the_op_argument_and_value(world):
    x = np.zeros(4, np.float32)
    with pytest.raises(gp.Unsupported, match=r"all_reduce: argument 'op'.*given 'prod'"):
        world.all_reduce(x, "prod")
    with pytest.raises(gp.Unsupported, match=r"all_reduce: argument 'x'.*float dtype.*int32"):
        world.all_reduce(np.zeros(4, np.int32), "mean")
    with pytest.raises(gp.InvalidProblem, match=r"all_reduce: argument 'out'.*shape \(4,\)"):
        world.all_reduce(x, out=np.zeros(5, np.float32))
    with pytest.raises(gp.InvalidProblem, match=r"all_gather: argument 'out'.*dtype float32"):
        world.all_gather(x, out=np.zeros(4 * world.size, np.float64))
    with pytest.raises(gp.InvalidProblem, match=r"all_gather: argument 'axis'.*given 2"):
        world.all_gather(x, axis=2)
    with pytest.raises(gp.InvalidProblem, match=r"reduce_scatter: argument 'x'.*0-d"):
        world.reduce_scatter(np.zeros((), np.float32))
    with pytest.raises(gp.InvalidProblem, match=r"send: argument 'dest'.*given -1"):
        world.send(x, -1)
    with pytest.raises(gp.InvalidProblem, match=r"broadcast: argument 'root'"):
        world.broadcast(x, root=world.size)
    with pytest.raises(gp.Unsupported, match=r"Communicator: argument 'backend'.*'gloo'"):
        dist.Communicator(backend="gloo")


def test_backend_resolution(monkeypatch):
    monkeypatch.delenv("GPUPLAN_DIST_BACKEND", raising=False)
    auto = resolve_backend(None)
    if not gp.device_available():
        assert auto == "mpi-host"
    else:
        assert auto in ("mpi-cuda-aware", "mpi-host-staged")
    monkeypatch.setenv("GPUPLAN_DIST_BACKEND", "mpi-host-staged")
    assert resolve_backend(None) == "mpi-host-staged"
    assert resolve_backend("mpi-host") == "mpi-host"


def test_cuda_aware_detection_override(monkeypatch):
    from dist import cuda_aware

    try:
        for value, expected in (("1", True), ("0", False)):
            monkeypatch.setenv(cuda_aware.ENV_OVERRIDE, value)
            cuda_aware.cuda_aware_mpi.cache_clear()
            assert cuda_aware.cuda_aware_mpi() == (expected, cuda_aware.ENV_OVERRIDE)
        monkeypatch.setenv(cuda_aware.ENV_OVERRIDE, "yes")
        cuda_aware.cuda_aware_mpi.cache_clear()
        with pytest.raises(ValueError, match="expected '0' or '1'"):
            cuda_aware.cuda_aware_mpi()
        monkeypatch.delenv(cuda_aware.ENV_OVERRIDE)
        for var in ("MPICH_GPU_SUPPORT_ENABLED", "MV2_USE_CUDA", "OMPI_MCA_opal_cuda_support"):
            monkeypatch.delenv(var, raising=False)
        cuda_aware.cuda_aware_mpi.cache_clear()
        # The PyPI mpich wheel is not CUDA-aware: every check must say so.
        aware, reason = cuda_aware.cuda_aware_mpi()
        assert cuda_aware.loaded_mpi_libraries(), "libmpi should be mapped once MPI is up"
        assert (aware, reason) == (False, "no CUDA support reported")
        monkeypatch.setenv("MV2_USE_CUDA", "1")
        cuda_aware.cuda_aware_mpi.cache_clear()
        assert cuda_aware.cuda_aware_mpi() == (True, "vendor environment")
    finally:
        cuda_aware.cuda_aware_mpi.cache_clear()


def test_pinned_buffer_cache_reuses_by_slot_and_size_and_evicts():
    cache = PinnedBufferCache(max_entries=2)
    a = cache.get(100, "send")
    assert a.dtype == np.uint8 and a.nbytes == 100
    b = cache.get(3000, "send")  # same 4 KiB bucket: same memory
    assert np.shares_memory(a, b)
    c = cache.get(100, "recv")
    assert not np.shares_memory(a, c)
    cache.get(10000, "send")  # third entry evicts the least recently used ("send", 4 KiB)
    assert len(cache) == 2
    assert not np.shares_memory(cache.get(100, "send"), a)


@pytest.mark.gpu
def test_staged_device_path_round_trips_through_pinned_memory(world, accelerator):
    # On one GPU with a host-only MPI the device path is staging; with one rank the
    # collectives short-circuit, so exercise the staging helpers directly.
    from dist.staging import stage_to_device, stage_to_host

    cache = PinnedBufferCache()
    x = gp.asarray(np.arange(1000, dtype=np.float32), device=accelerator)
    host = stage_to_host(x, cache, "send")
    np.testing.assert_array_equal(host.view(np.float32), np.arange(1000, dtype=np.float32))
    host.view(np.float32)[:] *= 2
    y = gp.zeros(1000, np.float32, device=accelerator)
    stage_to_device(host, y)
    np.testing.assert_array_equal(y.get(), 2 * np.arange(1000, dtype=np.float32))
