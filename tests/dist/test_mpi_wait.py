"""Polling communicators (GPUPLAN_MPI_WAIT=yield|sleep) give what spinning ones give.

Run under mpiexec -n 2 and -n 4 (mpi-marked): every call of the Communicator, once with
each wait mode, on the same data.
"""

from __future__ import annotations

import numpy as np
import pytest

from dist.communicator import Communicator

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
