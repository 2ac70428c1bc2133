"""Shared checks of parallel models against their dense single-process model (float64)."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import dist
from autograd import nn

RTOL, ATOL = 1e-10, 1e-13

# (dp, pp, tp) as factors of the world size N; mixed layouts need N = 4.
LAYOUTS = {
    "tp": lambda n: (1, 1, n), "pp": lambda n: (1, n, 1), "dp": lambda n: (n, 1, 1),
    "pp2xtp2": lambda n: (1, 2, 2), "dp2xtp2": lambda n: (2, 1, 2),
    "dp2xpp2": lambda n: (2, 2, 1),
}


def layout_mesh(world, layout: str) -> tuple[dist.ProcessMesh, int]:
    """(mesh, dp) of `layout` over `world`; skips the test when the world cannot hold it."""
    dp, pp, tp = LAYOUTS[layout](world.size)
    if dp * pp * tp != world.size:
        pytest.skip(f"{layout} needs 4 ranks")
    return dist.ProcessMesh(dp=dp, pp=pp, tp=tp, world=world), dp


def check_against_dense(model: nn.Module, dense: nn.Module, what: str = "grad",
                        rtol: float = RTOL, atol: float = ATOL) -> int:
    """Every local parameter's gradient (or value) equals its shard of the dense model's;
    returns how many were compared."""
    ref = dict(dense.named_parameters())
    checked = 0
    for name, p in model.named_parameters():
        spec = p.shard_spec
        want = spec.take((ref[spec.name].grad if what == "grad" else ref[spec.name]).numpy())
        got = (p.grad if what == "grad" else p).numpy()
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{name} {what}")
        checked += 1
    return checked


def rows_of(a, mesh_dp_rank: int, dp: int):
    """This data-parallel rank's rows of a global batch."""
    n = a.shape[0] // dp
    return a[mesh_dp_rank * n:(mesh_dp_rank + 1) * n]


def assert_recompute_keeps_bits(make_model, mode: str, x, y, seed: int) -> None:
    """One train_step of `make_model()` without and with `set_recompute(mode)`, each from
    the default generator seeded with `seed` (so dropout draws alike): the same loss and
    every gradient the same bits. The caller's generator state is put back."""
    saved = ag.random.default_generator.get_state()
    try:
        runs = []
        for recompute in ("none", mode):
            ag.random.manual_seed(seed)
            model = make_model()
            model.set_recompute(recompute)
            runs.append((model.train_step(x, y), dict(model.named_parameters())))
        (loss, plain), (again, recomputed) = runs
        assert again == loss
        for name, p in recomputed.items():
            np.testing.assert_array_equal(p.grad.numpy(), plain[name].grad.numpy(), name)
    finally:
        ag.random.default_generator.set_state(saved)
