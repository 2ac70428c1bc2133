"""Polling communicators (GPUPLAN_MPI_WAIT=yield|sleep) give what spinning ones give.

Run under mpiexec -n 2 and -n 4 (mpi-marked): every call of the Communicator, once with
each wait mode, on the same data.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from dist import mpi_wait
from dist.communicator import Communicator
from gpuplan import launcher
from gpuplan.errors import Unsupported

mpi = pytest.mark.mpi


def _exercise(comm: Communicator) -> list:
    """Results of every blocking path (collectives, p2p around a ring, objects)."""
    r, n = comm.rank, comm.size
    x = np.arange(12, dtype=np.float32) * (r + 1)
    out = [comm.all_reduce(x, "sum"), comm.all_reduce(x.copy(), "max"),
           comm.all_gather(x[:3]), comm.reduce_scatter(np.tile(x[:2], n))]
    b = x.copy() if r == 0 else np.zeros_like(x)
    out.append(comm.broadcast(b, root=0))
    right, left = (r + 1) % n, (r - 1) % n
    pending = comm.isend(x, right, tag=3)
    out.append(comm.recv(np.empty_like(x), left, tag=3))
    pending.wait()
    if r % 2 == 0:  # blocking send/recv pairs, even ranks first to avoid a cycle
        comm.send(x, right, tag=4)
        out.append(comm.recv(np.empty_like(x), left, tag=4))
    else:
        out.append(comm.recv(np.empty_like(x), left, tag=4))
        comm.send(x, right, tag=4)
    sent = comm.isend_array(x.reshape(3, 4) + r, right, tag=5)
    out.append(comm.recv_array(left, tag=5))
    sent.wait()
    out += [comm.bcast_object({"r": r, "x": [1, 2]} if r == 0 else None, root=0),
            comm.all_gather_object(("rank", r)), comm.gather_object(r * r, root=0)]
    comm.barrier()
    return out


@mpi
@pytest.mark.parametrize("mode", ["yield", "sleep"])
def test_polling_waits_match_spin_wait(world, mode):
    if world.size < 2:
        pytest.skip("needs mpiexec -n 2 or more")
    spin, polled = Communicator(world.mpi_comm), Communicator(world.mpi_comm)
    spin.wait_mode, polled.wait_mode = "spin", mode
    a, b = _exercise(spin), _exercise(polled)
    assert len(a) == len(b)
    for got, want in zip(b, a, strict=True):
        if isinstance(want, np.ndarray):
            np.testing.assert_array_equal(got, want)
        else:
            assert got == want
    left = (world.rank - 1) % world.size
    np.testing.assert_array_equal(b[7], np.arange(12, dtype=np.float32).reshape(3, 4)
                                  * (left + 1) + left)


# -- how a blocking call waits (one process, simulated environments) -----------------------


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
