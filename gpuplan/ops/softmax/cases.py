"""Softmax / log-softmax forward and backward (scale, causal mask) on the emulated device,
warp-per-row (dim <= 1024) and block-per-row variants, against the family's float64
reference (gpuplan.ops.softmax.reference) on the same rounded inputs."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.softmax.reference import (
    causal_mask,
    softmax_backward_reference,
    softmax_reference,
)
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, f64, random, run_emulated

# (rows, dim, causal q_len or 0, variant): plain and causal rows of both variants; (2, 6, 3)
# has queries with every key masked (Lq > Lk: all 0 / all -inf rows).
FORWARD = [(1, 1, 0, "warp_row"), (7, 33, 0, "warp_row"), (12, 3, 6, "warp_row"),
           (15, 9, 5, "warp_row"), (2, 1024, 0, "warp_row"), (2, 1025, 0, "block_row"),
           (4, 1030, 2, "block_row"), (2, 50257, 0, "block_row")]
# (rows, dim, causal q_len or 0, variant)
BACKWARD = [(1, 1, 0, "warp_row"), (7, 33, 0, "warp_row"), (15, 9, 5, "warp_row"),
            (2, 1024, 0, "warp_row"), (2, 1025, 0, "block_row"), (4, 1030, 2, "block_row"),
            (2, 50257, 0, "block_row")]


def forward(dtype, rows, dim, q_len, variant, log: bool) -> None:
    x = random((rows, dim), dtype, seed=1, low=-8, high=8)
    plan_cls = gp.LogSoftmaxPlan if log else gp.SoftmaxPlan
    causal = q_len > 0
    y = emu(np.full((rows, dim), 7, dtype))
    plan = run_emulated(plan_cls, gp.SoftmaxDescriptor(rows, dim, 0.7, causal, q_len, dtype),
                        gp.SoftmaxArgs(emu(x), y))
    assert plan.sku().variant == variant, plan.sku()
    ref = softmax_reference(x, 0.7, causal_mask(rows, q_len, dim) if causal else None, log)
    # Masked positions (and fully masked rows) must be exactly 0 / -inf: assert_allclose
    # requires infinities at the same places with the same sign.
    masked = np.isneginf(ref) if log else ref == 0
    np.testing.assert_array_equal(f64(y)[masked], ref[masked],
                                  err_msg=f"{plan_cls.op} masked [{dtype_id(dtype)}]")
    # log-softmax values reach ~ -15: the tests scale atol with them.
    check(y, ref, dtype, f"{plan_cls.op} {'causal ' if causal else ''}y",
          scale=16.0 if log else 2.0)


def backward(dtype, rows, dim, q_len, variant, log: bool) -> None:
    x = random((rows, dim), dtype, seed=3, low=-3, high=3)
    dy = random((rows, dim), dtype, seed=4)
    mask = causal_mask(rows, q_len, dim) if q_len else None
    # The forward output as a caller holds it: the kernel and the reference get these bits.
    y = softmax_reference(x, 0.5, mask, log).astype(dtype)
    plan_cls = gp.LogSoftmaxBackwardPlan if log else gp.SoftmaxBackwardPlan
    dx = emu(np.full((rows, dim), 7, dtype))
    desc = gp.SoftmaxDescriptor(rows, dim, 0.5, q_len > 0, q_len, dtype)
    plan = run_emulated(plan_cls, desc, gp.SoftmaxBackwardArgs(emu(y), emu(dy), dx))
    assert plan.sku().variant == variant, plan.sku()
    ref = softmax_backward_reference(y, dy, 0.5, log, mask)
    if q_len:  # masked positions (j > i + dim - q_len for query i) get exactly 0
        np.testing.assert_array_equal(f64(dx)[mask], 0.0,
                                      err_msg=f"{plan_cls.op} masked [{dtype_id(dtype)}]")
    check(dx, ref, dtype, f"{plan_cls.op} {'causal ' if q_len else ''}dx",
          scale=8.0 if log else 4.0)


CASES = (
    [Case(f"{'log_' if log else ''}softmax {rows}x{dim}{f' causal q={q}' if q else ''} "
          f"[{dtype_id(t)}]",
          lambda t=t, r=rows, d=dim, q=q, v=v, log=log: forward(t, r, d, q, v, log))
     for t in DTYPES for rows, dim, q, v in FORWARD for log in (False, True)]
    + [Case(f"{'log_' if log else ''}softmax_backward {rows}x{dim}"
            f"{f' causal q={q}' if q else ''} [{dtype_id(t)}]",
            lambda t=t, r=rows, d=dim, q=q, v=v, log=log: backward(t, r, d, q, v, log))
       for t in DTYPES for rows, dim, q, v in BACKWARD for log in (False, True)]
)
