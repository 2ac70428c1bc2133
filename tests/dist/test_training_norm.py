"""dist.grad_norm over tensor- and pipeline-parallel groups is overflow- and underflow-safe:
per-rank norms are combined as a scaled L2 norm, never as a sum of squares."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import autograd as ag
import dist
from autograd.nn import Parameter


def model_on(world, value: float, nan_rank: int | None = None):
    """A model shaped like ParallelGPT for grad_norm: every parameter tensor-parallel, its
    gradient `value * (rank + 1)`; with 4 ranks, tp=2 x pp=2 groups."""
    r = world.rank
    if world.size == 4:
        tp, pp = world.split(r // 2), world.split(r % 2)
    else:
        tp, pp = world, None
    params = []
    for i, n in enumerate((3, 7)):
        p = Parameter(np.zeros(n))
        g = np.full(n, value * (r + 1) * (i + 1))
        if r == nan_rank and i == 1:
            g[2] = np.nan
        p.grad = ag.tensor(g)
        p.shard_spec = SimpleNamespace(duplicate=False, tensor_parallel=True)
        params.append(p)
    return SimpleNamespace(parameters=lambda: params, tp_comm=tp, pp_comm=pp)


@pytest.mark.mpi
@pytest.mark.parametrize("value", [1e200, 1e-200, 0.5])
def test_grad_norm_across_ranks_is_scaled(world, value):
    """(1e200 * sqrt(n))^2 overflowed to inf when the ranks summed squared norms, and
    (1e-200)^2 underflowed to 0; the result is the same float on every rank."""
    got = dist.grad_norm(model_on(world, value))
    want = math.hypot(*(value * (r + 1) * (i + 1) for r in range(world.size)
                        for i, n in enumerate((3, 7)) for _ in range(n)))
    assert got == pytest.approx(want, rel=1e-13, abs=0)
    assert len(set(world.all_gather_object(got))) == 1


@pytest.mark.mpi
def test_grad_norm_propagates_a_nan_from_any_rank(world):
    got = dist.grad_norm(model_on(world, 1e200, nan_rank=world.size - 1))
    assert math.isnan(got)
