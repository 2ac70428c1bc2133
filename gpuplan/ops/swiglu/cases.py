"""SwiGLU kernels on the device under test, forward and backward in every dtype, against the
float64 reference: odd sizes (16-byte packs then the scalar tail), one-element-off views (the
scalar path alone), large |gate| (exp overflowing to inf) and an empty array."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.swiglu.reference import swiglu_backward_reference, swiglu_reference
from gpuplan.testing import DTYPES, Case, check, dtype_id, place, random, run_emulated

SIZES = (0, 1, 37, 1000)


def _inputs(dtype, n: int):
    gate = random((n,), dtype, seed=n, low=-6.0, high=6.0)
    if n >= 4:  # exp(-g) overflows: silu(g) -> 0 for g << 0, -> g for g >> 0
        gate[:4] = np.array([-100.0, 100.0, -30.0, 30.0]).astype(dtype)
    return gate, random((n,), dtype, seed=n + 1, low=-2.0, high=2.0), random((n,), dtype,
                                                                              seed=n + 2)


def forward(dtype, n: int, misaligned: bool) -> None:
    gate, up, _ = _inputs(dtype, n)
    y = place(np.full((n,), 7, dtype), misaligned)
    run_emulated(gp.SwigluPlan, gp.SwigluDescriptor(n, dtype),
                 gp.SwigluArgs(place(gate, misaligned), place(up, misaligned), y))
    check(y, swiglu_reference(gate, up), dtype, f"swiglu n={n}", scale=4)


def backward(dtype, n: int, misaligned: bool) -> None:
    gate, up, dy = _inputs(dtype, n)
    dgate, dup = (place(np.full((n,), 7, dtype), misaligned) for _ in range(2))
    run_emulated(gp.SwigluBackwardPlan, gp.SwigluDescriptor(n, dtype),
                 gp.SwigluBackwardArgs(*(place(a, misaligned) for a in (gate, up, dy)),
                                       dgate, dup))
    rg, ru = swiglu_backward_reference(gate, up, dy)
    check(dgate, rg, dtype, f"swiglu backward dgate n={n}", scale=4)
    check(dup, ru, dtype, f"swiglu backward dup n={n}", scale=4)


CASES = [Case(f"swiglu {fn.__name__}{' misaligned' if mis else ''}[{dtype_id(t)}-{n}]",
              lambda fn=fn, t=t, n=n, mis=mis: fn(t, n, mis))
         for fn in (forward, backward) for t in DTYPES for n in SIZES
         for mis in ((False, True) if n == 37 else (False,))]
