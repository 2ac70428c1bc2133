"""Activation kernels on the emulated device (unary forward and backward of every row of
gpuplan.ops.activation.plans.ACTIVATIONS, every float dtype) against the float64 references
of gpuplan/ops/activation/reference.py (scale 4: the transcendental activations, as in
tests/gpuplan/ops/test_activation.py).

Sizes are small and odd (37): an aligned launch takes the 16-byte pack path and then the
scalar tail; one-element-off views take the scalar path alone.
"""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.activation.plans import UNARY_OPS
from gpuplan.ops.activation.reference import unary_backward_reference, unary_reference
from gpuplan.testing import DTYPES, Case, check, dtype_id, place, random, run_emulated

N = 37


#: run-time scalars per op (others take none), and the ops defined for positive x only.
SCALARS = {"scale": {"alpha": -1.75}, "clamp": {"alpha": -1.25, "beta": 0.75}}
POSITIVE = ("log", "sqrt", "rsqrt")


def unary(dtype, op: str, backward: bool, misaligned: bool = False) -> None:
    sc = SCALARS.get(op, {})
    x = random((N,), dtype, seed=1, low=0.25 if op in POSITIVE else -3, high=3)
    dy = random((N,), dtype, seed=2)
    out = place(np.full((N,), 7, dtype), misaligned)
    if not backward:
        run_emulated(gp.UnaryPlan, gp.UnaryDescriptor(op, N, dtype),
                     gp.UnaryArgs(place(x, misaligned), out, **sc))
        ref = unary_reference(op, x, **sc)
    else:
        run_emulated(gp.UnaryBackwardPlan, gp.UnaryDescriptor(op, N, dtype),
                     gp.UnaryBackwardArgs(place(x, misaligned), place(dy, misaligned), out,
                                          **sc))
        ref = unary_backward_reference(op, x, dy, **sc)
    check(out, ref, dtype, f"unary {'backward ' if backward else ''}{op}", scale=4)


CASES = (
    [Case(f"unary {'backward' if bw else 'forward'} {op}[{dtype_id(t)}]",
          lambda t=t, op=op, bw=bw: unary(t, op, bw))
     for t in DTYPES for op in UNARY_OPS for bw in (False, True)]
    + [Case(f"unary {'backward' if bw else 'forward'} misaligned {op}[{dtype_id(t)}]",
            lambda t=t, op=op, bw=bw: unary(t, op, bw, True))
       for t in DTYPES for op in ("gelu", "silu") for bw in (False, True)]
)
