"""LayerNorm / RMSNorm forward and backward (dx, and the two-pass deterministic dweight /
dbias) on the emulated device, warp-per-row (dim <= 1024) and block-per-row variants, against
the float64 references of gpuplan/ops/normalization/reference.py on the same rounded inputs."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import accumulator
from gpuplan.ops.normalization.reference import (
    layer_norm_backward_reference,
    layer_norm_reference,
    rms_norm_backward_reference,
)
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, random, run_emulated

# (rows, dim, variant): warp per row, and a block per row for dim > WARP_ROW_MAX_DIM (1024).
SHAPES = [(1, 1, "warp_row"), (7, 33, "warp_row"), (40, 257, "warp_row"),
          (2, 1024, "warp_row"), (2, 1025, "block_row"), (3, 4099, "block_row")]


def _inputs(rows, dim, dtype, has_w, has_b):
    x = random((rows, dim), dtype, seed=1, low=-2.0, high=3.0)
    w = random((dim,), dtype, seed=2, low=0.5, high=1.5) if has_w else None
    b = random((dim,), dtype, seed=3) if has_b else None
    return x, w, b


def forward(dtype, rows, dim, variant, rms: bool, has_w: bool, has_b: bool) -> None:
    has_b = has_b and not rms
    x, w, b = _inputs(rows, dim, dtype, has_w, has_b)
    acc = accumulator(dtype)
    eps = 1e-6 if rms else 1e-5
    y = emu(np.full((rows, dim), 7, dtype))
    rstd = emu(np.zeros(rows, acc))
    ry, rmean, rrstd = layer_norm_reference(x, w, b, eps, rms=rms)
    if rms:
        plan = run_emulated(gp.RMSNormPlan, gp.RMSNormDescriptor(rows, dim, eps, has_w, dtype),
                            gp.RMSNormArgs(emu(x), emu(w), y, rstd))
    else:
        mean = emu(np.zeros(rows, acc))
        plan = run_emulated(gp.LayerNormPlan,
                            gp.LayerNormDescriptor(rows, dim, eps, has_w, has_b, dtype),
                            gp.LayerNormArgs(emu(x), emu(w), emu(b), y, mean, rstd))
        check(mean, rmean, acc, "layer_norm mean")
    assert plan.sku().variant == variant, plan.sku()
    name = "rms_norm" if rms else "layer_norm"
    check(y, ry, dtype, f"{name} y", scale=4.0)
    check(rstd, rrstd, acc, f"{name} rstd", scale=4.0)


def backward(dtype, rows, dim, variant, rms: bool, has_w: bool, has_b: bool) -> None:
    has_b = has_b and not rms
    x, w, _ = _inputs(rows, dim, dtype, has_w, False)
    dy = random((rows, dim), dtype, seed=4)
    acc = accumulator(dtype)
    eps = 1e-6 if rms else 1e-5
    # The saved statistics as the forward stores them (acc dtype); the references recompute
    # them exactly from x.
    _, mean, rstd = layer_norm_reference(x, eps=eps, rms=rms)
    mean, rstd = mean.astype(acc), rstd.astype(acc)
    dx = emu(np.full((rows, dim), 7, dtype))
    dw = emu(np.full(dim, 7, dtype)) if has_w else None
    db = emu(np.full(dim, 7, dtype)) if has_b else None
    if rms:
        plan = run_emulated(gp.RMSNormBackwardPlan,
                            gp.RMSNormBackwardDescriptor(rows, dim, has_w, dtype),
                            gp.RMSNormBackwardArgs(emu(dy), emu(x), emu(w), emu(rstd), dx, dw))
        (rdx, rdw), rdb = rms_norm_backward_reference(dy, x, w, eps), None
    else:
        plan = run_emulated(gp.LayerNormBackwardPlan,
                            gp.LayerNormBackwardDescriptor(rows, dim, has_w, has_b, dtype),
                            gp.LayerNormBackwardArgs(emu(dy), emu(x), emu(w), emu(mean),
                                                     emu(rstd), dx, dw, db))
        rdx, rdw, rdb = layer_norm_backward_reference(dy, x, w, eps)
    assert plan.sku().variant == variant, plan.sku()
    name = "rms_norm_backward" if rms else "layer_norm_backward"
    check(dx, rdx, dtype, f"{name} dx", scale=8.0)
    # Column sums over `rows` terms: the error grows with the count (the tests' scale).
    if has_w:
        check(dw, rdw, dtype, f"{name} dweight", scale=max(4.0, rows / 4))
    if has_b:
        check(db, rdb, dtype, f"{name} dbias", scale=max(4.0, rows / 4))


CASES = [
    Case(f"{'rms' if rms else 'layer'}_norm {kind} {rows}x{dim} {aff} [{dtype_id(t)}]",
         lambda f=f, t=t, r=rows, d=dim, v=v, rms=rms, hw=hw, hb=hb: f(t, r, d, v, rms, hw, hb))
    for t in DTYPES
    for rows, dim, v in SHAPES
    for rms in (False, True)
    for kind, f in (("forward", forward), ("backward", backward))
    # weight and bias everywhere (the parameter-gradient kernels); also no affine on 7x33
    for aff, hw, hb in ((("w+b", True, True), ("plain", False, False)) if dim == 33
                        else (("w+b", True, True),))
]
