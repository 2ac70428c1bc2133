"""ProcessMesh: rank order (tp fastest), group membership under MPI, and size errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dist
import gpuplan as gp
from dist.mesh import mesh_coordinates, mesh_rank


def factorizations(n: int) -> list[tuple[int, int, int]]:
    return [(d, p, t) for d in range(1, n + 1) for p in range(1, n + 1) for t in range(1, n + 1)
            if d * p * t == n]


@pytest.mark.parametrize("dp,pp,tp", [(1, 1, 1), (2, 2, 2), (3, 1, 2), (1, 4, 3), (2, 3, 1)])
def test_coordinates_round_trip_with_tp_fastest(dp, pp, tp):
    coords = [mesh_coordinates(r, dp, pp, tp) for r in range(dp * pp * tp)]
    # Lexicographic (dp, pp, tp) order is rank order: tp varies fastest, then pp, then dp.
    assert coords == list(itertools.product(range(dp), range(pp), range(tp)))
    for r, (d, p, t) in enumerate(coords):
        assert mesh_rank(d, p, t, pp, tp) == r == (d * pp + p) * tp + t


def test_documented_example_dp2_pp2_tp2():
    table = [tuple(mesh_coordinates(r, 2, 2, 2)) for r in range(8)]
    assert [c[0] for c in table] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [c[1] for c in table] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [c[2] for c in table] == [0, 1, 0, 1, 0, 1, 0, 1]


def test_world_size_mismatch_is_a_clear_error():
    world = dist.init()
    with pytest.raises(gp.InvalidProblem, match=rf"world size {world.size}.*dp=2 \* pp=3 "
                                                rf"\* tp={world.size} = {6 * world.size}"):
        dist.ProcessMesh(dp=2, pp=3, tp=world.size)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(gp.InvalidProblem, match="positive int"):
            dist.ProcessMesh(dp=1, pp=bad, tp=1)
    with pytest.raises(gp.InvalidProblem, match="rank"):
        mesh_coordinates(8, 2, 2, 2)


def test_single_process_mesh():
    world = dist.init()
    if world.size != 1:
        pytest.skip("runs outside mpiexec")
    mesh = dist.ProcessMesh()
    assert (mesh.tp.size, mesh.pp.size, mesh.dp.size) == (1, 1, 1)
    assert mesh.coords == (0, 0, 0)


@pytest.mark.mpi
def test_every_factorization_of_the_world_builds_the_right_groups():
    world = dist.init()
    for dp, pp, tp in factorizations(world.size):
        mesh = dist.ProcessMesh(dp=dp, pp=pp, tp=tp, world=world)
        d, p, t = mesh.coords
        assert mesh.coords == mesh_coordinates(world.rank, dp, pp, tp)
        assert (mesh.dp_rank, mesh.pp_rank, mesh.tp_rank) == (d, p, t)
        expected = {
            "tp": [mesh.rank_of(d, p, i) for i in range(tp)],
            "pp": [mesh.rank_of(d, i, t) for i in range(pp)],
            "dp": [mesh.rank_of(i, p, t) for i in range(dp)],
        }
        for axis, members in expected.items():
            comm = getattr(mesh, axis)
            assert comm.size == len(members)
            assert comm.rank == getattr(mesh.coords, axis)
            assert comm.all_gather_object(world.rank) == members, (dp, pp, tp, axis)
            total = comm.all_reduce(np.array([world.rank], np.int64))
            assert int(total[0]) == sum(members)
