"""Residual add + LayerNorm on the emulated device: forward (s = x + residual, y, mean,
rstd) and backward (dx with and without the residual gradient ds, and the two-pass
dweight / dbias), warp-per-row and block-per-row, against the family's float64 reference
(gpuplan.ops.residual_norm.reference, on the normalization family's)."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import accumulator
from gpuplan.ops.normalization.reference import layer_norm_reference
from gpuplan.ops.residual_norm.reference import (
    residual_layer_norm_backward_reference,
    residual_layer_norm_reference,
)
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, random, run_emulated

# (rows, dim, variant): a warp per row up to dim 1024, a block per row beyond.
SHAPES = [(7, 33, "warp_row"), (40, 257, "warp_row"), (2, 1025, "block_row")]
EPS = 1e-5


def _inputs(rows: int, dim: int, dtype, has_w: bool, has_b: bool):
    x = random((rows, dim), dtype, seed=1, low=-2.0, high=3.0)
    r = random((rows, dim), dtype, seed=2)
    w = random((dim,), dtype, seed=3, low=0.5, high=1.5) if has_w else None
    b = random((dim,), dtype, seed=4) if has_b else None
    return x, r, w, b


def forward(dtype, rows: int, dim: int, variant: str, has_w: bool, has_b: bool) -> None:
    x, r, w, b = _inputs(rows, dim, dtype, has_w, has_b)
    acc = accumulator(dtype)
    s, y = emu(np.full((rows, dim), 7, dtype)), emu(np.full((rows, dim), 7, dtype))
    mean, rstd = emu(np.zeros(rows, acc)), emu(np.zeros(rows, acc))
    plan = run_emulated(gp.ResidualLayerNormPlan,
                        gp.ResidualLayerNormDescriptor(rows, dim, EPS, has_w, has_b, dtype),
                        gp.ResidualLayerNormArgs(emu(x), emu(r), emu(w), emu(b), s, y, mean,
                                                 rstd))
    assert plan.sku().variant == variant, plan.sku()
    s64, ry, rmean, rrstd = residual_layer_norm_reference(x, r, w, b, EPS)
    check(s, s64, dtype, "residual_layer_norm s")
    check(y, ry, dtype, "residual_layer_norm y", scale=4.0)
    check(mean, rmean, dtype, "residual_layer_norm mean", scale=4.0)
    check(rstd, rrstd, dtype, "residual_layer_norm rstd", scale=4.0)


def backward(dtype, rows: int, dim: int, variant: str, has_w: bool, has_b: bool,
             with_ds: bool) -> None:
    s, _, w, _ = _inputs(rows, dim, dtype, has_w, False)
    dy = random((rows, dim), dtype, seed=5)
    ds = random((rows, dim), dtype, seed=6) if with_ds else None
    acc = accumulator(dtype)
    _, mean, rstd = layer_norm_reference(s, eps=EPS)  # the forward's statistics, in acc
    dx = emu(np.full((rows, dim), 7, dtype))
    dw = emu(np.full(dim, 7, dtype)) if has_w else None
    db = emu(np.full(dim, 7, dtype)) if has_b else None
    plan = run_emulated(gp.ResidualLayerNormBackwardPlan,
                        gp.ResidualLayerNormBackwardDescriptor(rows, dim, has_w, has_b, dtype),
                        gp.ResidualLayerNormBackwardArgs(
                            emu(dy), emu(s), emu(w), emu(mean.astype(acc)),
                            emu(rstd.astype(acc)), emu(ds), dx, dw, db))
    assert plan.sku().variant == variant, plan.sku()
    rdx, rdw, rdb = residual_layer_norm_backward_reference(dy, s, w, ds, EPS)
    check(dx, rdx, dtype, "residual_layer_norm_backward dx", scale=8.0)
    # Column sums over `rows` terms: the error grows with the count.
    if has_w:
        check(dw, rdw, dtype, "residual_layer_norm_backward dweight", scale=max(4.0, rows / 4))
    if has_b:
        check(db, rdb, dtype, "residual_layer_norm_backward dbias", scale=max(4.0, rows / 4))


def _cases() -> list[Case]:
    cases = []
    for t in DTYPES:
        for i, (rows, dim, v) in enumerate(SHAPES):
            aff = (True, True) if i else (False, False)  # no weight/bias on the small shape
            cases.append(Case(f"forward {rows}x{dim} affine={aff[0]} [{dtype_id(t)}]",
                              lambda t=t, r=rows, d=dim, v=v, a=aff: forward(t, r, d, v, *a)))
            for with_ds in (True, False):
                cases.append(Case(
                    f"backward {rows}x{dim} affine={aff[0]} ds={with_ds} [{dtype_id(t)}]",
                    lambda t=t, r=rows, d=dim, v=v, a=aff, ds=with_ds:
                        backward(t, r, d, v, *a, ds)))
    return cases


CASES = _cases()
