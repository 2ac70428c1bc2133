"""Rotary embedding kernels on the device under test, forward and backward in every dtype,
against the complex-rotation float64 reference: odd shapes in both layouts ([B*H, T, 1, D]
as attention takes q/k, [B, T, H, D] with heads inside, and [B, T, H, D] rotated into
[B, H, T, D] with split_heads, and back for the gradient), a large position offset (angles
of thousands of radians), more (batch, head) rows (4100) than the launch's y dimension
(4096 blocks) so blocks loop over rows, and an empty sequence."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.rope.reference import rope_reference
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, random, run_emulated

#: (batch, seq, heads, head_dim, theta, offset); one (t, i) pair per row of the 4100-row case:
#: a grid of 1 x 4096 blocks (plans._TARGET_BLOCKS), so the row loop runs twice in some.
SHAPES = [(3, 5, 1, 8, 10000.0, 0), (2, 7, 3, 6, 500000.0, 11), (1, 3, 2, 2, 10.0, 4093),
          (4100, 1, 1, 4, 10000.0, 3), (2, 0, 3, 8, 10000.0, 0)]


def _heads_first(a: np.ndarray) -> np.ndarray:
    """[batch, seq, heads, D] -> [batch, heads, seq, D]."""
    return np.ascontiguousarray(a.swapaxes(1, 2))


def rotate(dtype, shape, backward: bool, split: bool = False) -> None:
    """x [batch, seq, heads, D] rotated; with `split` the forward writes [batch, heads, seq,
    D] and the backward reads dy so and writes [batch, seq, heads, D]."""
    batch, seq, heads, dim, theta, offset = shape
    x = random((batch, seq, heads, dim), dtype, seed=dim + seq, low=-2.0, high=2.0)
    want = rope_reference(x, theta, offset, inverse=backward)
    src, dst_shape = x, x.shape
    if split:
        src, dst_shape = (_heads_first(x), x.shape) if backward else (x, _heads_first(x).shape)
        want = want if backward else _heads_first(want)
    out = emu(np.full(dst_shape, 7, dtype))
    desc = gp.RopeDescriptor(batch, seq, heads, dim, theta, dtype, split)
    if backward:
        run_emulated(gp.RopeBackwardPlan, desc, gp.RopeBackwardArgs(emu(src), out, offset))
    else:
        run_emulated(gp.RopePlan, desc, gp.RopeArgs(emu(src), out, offset))
    check(out, want, dtype, f"rope {'backward ' if backward else ''}{shape} split={split}",
          scale=2)


CASES = ([Case(f"rope {'backward' if bw else 'forward'}[{dtype_id(t)}-{s}]",
               lambda t=t, s=s, bw=bw: rotate(t, s, bw))
          for t in DTYPES for s in SHAPES for bw in (False, True)]
         + [Case(f"rope {'backward' if bw else 'forward'} split heads[{dtype_id(t)}-{s}]",
                 lambda t=t, s=s, bw=bw: rotate(t, s, bw, True))
            for t in DTYPES for s in SHAPES[1:3] for bw in (False, True)])
