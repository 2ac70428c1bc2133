"""ProcessMesh: the world split into data-, pipeline-, context- and tensor-parallel
communicators."""

from __future__ import annotations

from typing import NamedTuple

from dist.communicator import Communicator
from gpuplan.errors import InvalidProblem, describe


class MeshCoordinates(NamedTuple):
    dp: int
    pp: int
    cp: int
    tp: int


def mesh_coordinates(rank: int, dp: int, pp: int, tp: int, cp: int = 1) -> MeshCoordinates:
    """(dp_i, pp_i, cp_i, tp_i) of a world rank; inverse of mesh_rank (tp varies fastest,
    then cp, then pp)."""
    size = dp * pp * cp * tp
    if not 0 <= rank < size:
        raise InvalidProblem(describe("ProcessMesh", "rank", f"in [0, {size})", rank))
    return MeshCoordinates(rank // (pp * cp * tp), (rank // (cp * tp)) % pp, (rank // tp) % cp,
                           rank % tp)


def mesh_rank(dp_i: int, pp_i: int, tp_i: int, pp: int, tp: int, cp_i: int = 0,
              cp: int = 1) -> int:
    """World rank of mesh position (dp_i, pp_i, cp_i, tp_i):
    ``((dp_i * pp + pp_i) * cp + cp_i) * tp + tp_i``."""
    return ((dp_i * pp + pp_i) * cp + cp_i) * tp + tp_i


class ProcessMesh:
    """A dp x pp x cp x tp grid of ranks, tensor-parallel fastest (as in Megatron-LM), then
    context-parallel.

    World rank = ((dp_i * pp + pp_i) * cp + cp_i) * tp + tp_i, so a tensor-parallel group is
    `tp` consecutive ranks (they should share a node: TP traffic is the heaviest), a
    context-parallel group strides by `tp` (ring attention's K/V blocks are the next
    heaviest), a pipeline group by `cp * tp` and a data-parallel group by `pp * cp * tp`.
    Example, dp=2, pp=2, tp=2 (cp=1)::

        rank:   0  1  2  3  4  5  6  7
        dp_i:   0  0  0  0  1  1  1  1
        pp_i:   0  0  1  1  0  0  1  1
        tp_i:   0  1  0  1  0  1  0  1

    `mesh.tp`, `mesh.cp`, `mesh.pp`, `mesh.dp` are the Communicators of this rank's four
    groups; within each, a rank's position is its coordinate (mesh.tp.rank ==
    mesh.coords.tp). `cp` is a keyword (default 1), so ``ProcessMesh(dp, pp, tp)`` is the
    three-dimensional mesh it always was. The cp ranks of a group hold different tokens of
    the same sequences: a parameter's gradient is summed over `mesh.cp` (and averaged over
    `mesh.dp`), which `dist.ParallelGPT`/`dist.ParallelLlama` do.
    """

    def __init__(self, dp: int = 1, pp: int = 1, tp: int = 1,
                 world: Communicator | None = None, *, cp: int = 1) -> None:
        for name, value in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidProblem(describe("ProcessMesh", name, "a positive int", value))
        if world is None:
            from dist.runtime import world as default_world

            world = default_world()
        if dp * pp * cp * tp != world.size:
            raise InvalidProblem(describe(
                "ProcessMesh", "dp*pp*cp*tp", f"the world size {world.size}",
                f"dp={dp} * pp={pp} * cp={cp} * tp={tp} = {dp * pp * cp * tp}"))
        self.shape = MeshCoordinates(dp, pp, cp, tp)
        self.world = world
        self.coords = mesh_coordinates(world.rank, dp, pp, tp, cp)
        d, p, c, t = self.coords
        self.tp = world.split(color=(d * pp + p) * cp + c, key=t)
        self.cp = world.split(color=(d * pp + p) * tp + t, key=c)
        self.pp = world.split(color=(d * cp + c) * tp + t, key=p)
        self.dp = world.split(color=(p * cp + c) * tp + t, key=d)

    @property
    def dp_rank(self) -> int:
        return self.coords.dp

    @property
    def pp_rank(self) -> int:
        return self.coords.pp

    @property
    def cp_rank(self) -> int:
        return self.coords.cp

    @property
    def tp_rank(self) -> int:
        return self.coords.tp

    def rank_of(self, dp_i: int, pp_i: int, tp_i: int, cp_i: int = 0) -> int:
        return mesh_rank(dp_i, pp_i, tp_i, self.shape.pp, self.shape.tp, cp_i, self.shape.cp)

    def __repr__(self) -> str:
        dp, pp, cp, tp = self.shape
        return (f"ProcessMesh(dp={dp}, pp={pp}, cp={cp}, tp={tp}, "
                f"coords={tuple(self.coords)})")
