"""ProcessMesh: rank order (tp fastest, then cp), group membership under MPI, and size errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dist
import gpuplan as gp
from dist.mesh import mesh_coordinates, mesh_rank


def factorizations(n: int) -> list[tuple[int, int, int, int]]:
    sizes = range(1, n + 1)
    return [(d, p, c, t) for d, p, c, t in itertools.product(sizes, sizes, sizes, sizes)
            if d * p * c * t == n]


@pytest.mark.parametrize("dp,pp,tp", [(1, 1, 1), (2, 2, 2), (3, 1, 2), (1, 4, 3), (2, 3, 1)])
def test_coordinates_round_trip_with_tp_fastest(dp, pp, tp):
    coords = [mesh_coordinates(r, dp, pp, tp) for r in range(dp * pp * tp)]
    # Lexicographic (dp, pp, cp, tp) order is rank order: tp varies fastest, then pp, then dp.
    assert coords == list(itertools.product(range(dp), range(pp), range(1), range(tp)))
    for r, (d, p, c, t) in enumerate(coords):
        assert c == 0
        assert mesh_rank(d, p, t, pp, tp) == r == (d * pp + p) * tp + t


@pytest.mark.parametrize("dp,pp,cp,tp", [(1, 1, 2, 1), (2, 1, 2, 2), (1, 2, 3, 2), (2, 2, 2, 1)])
def test_coordinates_with_cp_follow_the_contract_order(dp, pp, cp, tp):
    n = dp * pp * cp * tp
    coords = [mesh_coordinates(r, dp, pp, tp, cp=cp) for r in range(n)]
    assert coords == list(itertools.product(range(dp), range(pp), range(cp), range(tp)))
    for r, (d, p, c, t) in enumerate(coords):
        assert mesh_rank(d, p, t, pp, tp, cp_i=c, cp=cp) == r == ((d * pp + p) * cp + c) * tp + t


def test_documented_example_dp2_pp2_tp2():
    table = [tuple(mesh_coordinates(r, 2, 2, 2)) for r in range(8)]
    assert [c[0] for c in table] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [c[1] for c in table] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [c[2] for c in table] == [0] * 8
    assert [c[3] for c in table] == [0, 1, 0, 1, 0, 1, 0, 1]


def test_world_size_mismatch_is_a_clear_error():
    world = dist.init()
    with pytest.raises(gp.InvalidProblem, match=rf"world size {world.size}.*dp=2 \* pp=3 "
                                                rf"\* cp=1 \* tp={world.size} = "
                                                rf"{6 * world.size}"):
        dist.ProcessMesh(dp=2, pp=3, tp=world.size)
    with pytest.raises(gp.InvalidProblem, match=r"dp\*pp\*cp\*tp.*cp=5"):
        dist.ProcessMesh(cp=5 * world.size)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(gp.InvalidProblem, match="positive int"):
            dist.ProcessMesh(dp=1, pp=bad, tp=1)
        with pytest.raises(gp.InvalidProblem, match="'cp'.*positive int"):
            dist.ProcessMesh(cp=bad)
    with pytest.raises(gp.InvalidProblem, match="rank"):
        mesh_coordinates(8, 2, 2, 2)


def test_single_process_mesh():
    world = dist.init()
    if world.size != 1:
        pytest.skip("runs outside mpiexec")
    mesh = dist.ProcessMesh()
    assert (mesh.tp.size, mesh.cp.size, mesh.pp.size, mesh.dp.size) == (1, 1, 1, 1)
    assert mesh.coords == (0, 0, 0, 0) and mesh.cp_rank == 0


@pytest.mark.mpi
def test_every_factorization_of_the_world_builds_the_right_groups():
    world = dist.init()
    for dp, pp, cp, tp in factorizations(world.size):
        mesh = dist.ProcessMesh(dp=dp, pp=pp, cp=cp, tp=tp, world=world)
        d, p, c, t = mesh.coords
        assert mesh.coords == mesh_coordinates(world.rank, dp, pp, tp, cp)
        assert (mesh.dp_rank, mesh.pp_rank, mesh.cp_rank, mesh.tp_rank) == (d, p, c, t)
        assert world.rank == ((d * pp + p) * cp + c) * tp + t
        expected = {
            "tp": [mesh.rank_of(d, p, i, c) for i in range(tp)],
            "cp": [mesh.rank_of(d, p, t, i) for i in range(cp)],
            "pp": [mesh.rank_of(d, i, t, c) for i in range(pp)],
            "dp": [mesh.rank_of(i, p, t, c) for i in range(dp)],
        }
        for axis, members in expected.items():
            comm = getattr(mesh, axis)
            assert comm.size == len(members)
            assert comm.rank == getattr(mesh.coords, axis)
            assert comm.all_gather_object(world.rank) == members, (dp, pp, cp, tp, axis)
            total = comm.all_reduce(np.array([world.rank], np.int64))
            assert int(total[0]) == sum(members)
