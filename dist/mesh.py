"""ProcessMesh: the world split into data-, pipeline- and tensor-parallel communicators."""

from __future__ import annotations

from typing import NamedTuple

from dist.communicator import Communicator
from gpuplan.errors import InvalidProblem, describe


class MeshCoordinates(NamedTuple):
    dp: int
    pp: int
    tp: int


def mesh_coordinates(rank: int, dp: int, pp: int, tp: int) -> MeshCoordinates:
    """(dp_i, pp_i, tp_i) of a world rank; inverse of mesh_rank (tp varies fastest)."""
    if not 0 <= rank < dp * pp * tp:
        raise InvalidProblem(describe("ProcessMesh", "rank", f"in [0, {dp * pp * tp})", rank))
    return MeshCoordinates(rank // (pp * tp), (rank // tp) % pp, rank % tp)


def mesh_rank(dp_i: int, pp_i: int, tp_i: int, pp: int, tp: int) -> int:
    """World rank of mesh position (dp_i, pp_i, tp_i): (dp_i * pp + pp_i) * tp + tp_i."""
    return (dp_i * pp + pp_i) * tp + tp_i


class ProcessMesh:
    """A dp x pp x tp grid of ranks, tensor-parallel fastest (as in Megatron-LM).

    World rank = (dp_i * pp + pp_i) * tp + tp_i, so a tensor-parallel group is `tp`
    consecutive ranks (they should share a node: TP traffic is the heaviest), a pipeline
    group strides by `tp` and a data-parallel group by `pp * tp`. Example, dp=2, pp=2, tp=2::

        rank:   0  1  2  3  4  5  6  7
        dp_i:   0  0  0  0  1  1  1  1
        pp_i:   0  0  1  1  0  0  1  1
        tp_i:   0  1  0  1  0  1  0  1

    `mesh.tp`, `mesh.pp`, `mesh.dp` are the Communicators of this rank's three groups;
    within each, a rank's position is its coordinate (mesh.tp.rank == mesh.coords.tp).
    """

    def __init__(self, dp: int = 1, pp: int = 1, tp: int = 1,
                 world: Communicator | None = None) -> None:
        for name, value in (("dp", dp), ("pp", pp), ("tp", tp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidProblem(describe("ProcessMesh", name, "a positive int", value))
        if world is None:
            from dist.runtime import world as default_world

            world = default_world()
        if dp * pp * tp != world.size:
            raise InvalidProblem(describe(
                "ProcessMesh", "dp*pp*tp", f"the world size {world.size}",
                f"dp={dp} * pp={pp} * tp={tp} = {dp * pp * tp}"))
        self.shape = MeshCoordinates(dp, pp, tp)
        self.world = world
        self.coords = mesh_coordinates(world.rank, dp, pp, tp)
        d, p, t = self.coords
        self.tp = world.split(color=d * pp + p, key=t)
        self.pp = world.split(color=d * tp + t, key=p)
        self.dp = world.split(color=p * tp + t, key=d)

    @property
    def dp_rank(self) -> int:
        return self.coords.dp

    @property
    def pp_rank(self) -> int:
        return self.coords.pp

    @property
    def tp_rank(self) -> int:
        return self.coords.tp

    def rank_of(self, dp_i: int, pp_i: int, tp_i: int) -> int:
        return mesh_rank(dp_i, pp_i, tp_i, self.shape.pp, self.shape.tp)

    def __repr__(self) -> str:
        dp, pp, tp = self.shape
        return f"ProcessMesh(dp={dp}, pp={pp}, tp={tp}, coords={tuple(self.coords)})"
