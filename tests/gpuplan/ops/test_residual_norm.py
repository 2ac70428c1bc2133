"""Residual add + LayerNorm plans against the family's float64 reference
(gpuplan.ops.residual_norm.reference), host and device; the declared operands' checks; the
fused op against the composed one."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.dtypes import accumulator
from gpuplan.host_pool import block_rows
from gpuplan.ops.normalization.reference import layer_norm_reference
from gpuplan.ops.residual_norm.reference import (
    residual_layer_norm_backward_reference,
    residual_layer_norm_reference,
)
from gpuplan.testing import assert_close, check_plan, f64, on, random
from tests.helpers import DTYPES

# (rows, dim): one element, odd, a warp row, and a row for a whole block (dim > 1024).
SHAPES = [(1, 1), (7, 33), (5, 1023), (3, 1500)]
AFFINE = [pytest.param(True, True, id="w+b"), pytest.param(False, False, id="plain")]
EPS = 1e-5


def _inputs(rows, dim, dtype, has_w, has_b):
    x = random((rows, dim), dtype, seed=1, low=-2.0, high=3.0)
    r = random((rows, dim), dtype, seed=2)
    w = random((dim,), dtype, seed=3, low=0.5, high=1.5) if has_w else None
    b = random((dim,), dtype, seed=4) if has_b else None
    return x, r, w, b


def forward_reference(x, residual, weight=None, bias=None, **_):
    """float64 s, y, mean, rstd (from the unrounded s: rounding s is the op's error)."""
    s, y, mean, rstd = residual_layer_norm_reference(x, residual, weight, bias, EPS)
    return {"s": s, "y": y, "mean": mean, "rstd": rstd}


def backward_reference(dy, s, weight=None, ds=None, **_):
    dx, dw, db = residual_layer_norm_backward_reference(dy, s, weight, ds, EPS)
    out = {"dx": dx, "dbias": db}
    if weight is not None:
        out["dweight"] = dw
    return out


def _given(**arrays):
    """check_plan's inputs: the operands that are passed (None means absent)."""
    return {k: v for k, v in arrays.items() if v is not None}


def _saved_stats(s, dtype):
    """The forward's mean and rstd of s, as it stores them (the accumulator dtype)."""
    _, mean, rstd = layer_norm_reference(s, eps=EPS)
    acc = accumulator(dtype)
    return mean.astype(acc), rstd.astype(acc)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", SHAPES)
@pytest.mark.parametrize("has_w,has_b", AFFINE)
def test_forward(device, dtype, rows, dim, has_w, has_b):
    x, r, w, b = _inputs(rows, dim, dtype, has_w, has_b)
    desc = gp.ResidualLayerNormDescriptor(rows, dim, EPS, has_w, has_b, dtype)
    check_plan(gp.ResidualLayerNormPlan, desc, _given(x=x, residual=r, weight=w, bias=b),
               forward_reference, device=device, scale=4, bad_inputs=rows == 7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", SHAPES)
@pytest.mark.parametrize("has_w,has_b", AFFINE)
@pytest.mark.parametrize("with_ds", [True, False], ids=["ds", "no-ds"])
def test_backward(device, dtype, rows, dim, has_w, has_b, with_ds):
    s, _, w, _ = _inputs(rows, dim, dtype, has_w, False)
    dy = random((rows, dim), dtype, seed=5)
    ds = random((rows, dim), dtype, seed=6) if with_ds else None
    mean, rstd = _saved_stats(s, dtype)
    desc = gp.ResidualLayerNormBackwardDescriptor(rows, dim, has_w, has_b, dtype)
    inputs = _given(dy=dy, s=s, weight=w, mean=mean, rstd=rstd, ds=ds)

    def reference(**kw):
        out = backward_reference(**kw)
        return out if has_b else {k: v for k, v in out.items() if k != "dbias"}

    # Column sums over `rows` terms (dweight, dbias): the error grows with the count.
    check_plan(gp.ResidualLayerNormBackwardPlan, desc, inputs, reference, device=device,
               scale=max(8.0, rows / 4), bad_inputs=rows == 7)


@pytest.mark.parametrize("rows,dim", [(0, 5), (4, 0), (0, 0)])
def test_empty_extents(device, rows, dim):
    x, r, w, b = _inputs(rows, dim, np.float32, True, True)
    s, y, mean, rstd = gp.functional.residual_layer_norm(on(device, x), on(device, r),
                                                         on(device, w), on(device, b))
    assert s.shape == y.shape == (rows, dim) and mean.shape == rstd.shape == (rows,)
    np.testing.assert_allclose(f64(rstd), np.full(rows, 1 / np.sqrt(EPS)), rtol=1e-6)
    dx, dw, db = gp.functional.residual_layer_norm_backward(
        on(device, np.ones((rows, dim), np.float32)), s, on(device, w), mean, rstd, ds=s)
    assert dx.shape == (rows, dim)
    np.testing.assert_array_equal(f64(dw), np.zeros(dim))
    np.testing.assert_array_equal(f64(db), np.zeros(dim) if rows == 0 else np.full(dim, rows))


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="residual_layer_norm: argument 'eps'"):
        gp.ResidualLayerNormPlan.select(s, gp.ResidualLayerNormDescriptor(2, 3, eps=-1.0))
    with pytest.raises(gp.Unsupported, match="argument 'dtype'"):
        gp.ResidualLayerNormPlan.select(s, gp.ResidualLayerNormDescriptor(2, 3,
                                                                          dtype=np.int32))
    with pytest.raises(gp.InvalidProblem, match="argument 'rows'"):
        gp.ResidualLayerNormBackwardPlan.select(
            s, gp.ResidualLayerNormBackwardDescriptor(-1, 3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_functional_api(device, dtype):
    x, r, w, b = _inputs(6, 40, dtype, True, True)
    x3, r3 = x.reshape(2, 3, 40), r.reshape(2, 3, 40)
    s, y, mean, rstd = gp.functional.residual_layer_norm(on(device, x3), on(device, r3),
                                                         on(device, w), on(device, b))
    ref = forward_reference(x, r, w, b)
    assert s.shape == y.shape == (2, 3, 40) and mean.shape == rstd.shape == (2, 3)
    assert gp.device_of(y) == device and y.dtype == dtype and rstd.dtype == accumulator(dtype)
    assert_close(s.reshape(6, 40), ref["s"], dtype)
    assert_close(y.reshape(6, 40), ref["y"], dtype, scale=4)
    dy = random((2, 3, 40), dtype, seed=7)
    dx, dw, db = gp.functional.residual_layer_norm_backward(on(device, dy), s, on(device, w),
                                                            mean, rstd, ds=on(device, dy))
    want = backward_reference(dy.reshape(6, 40), s.reshape(6, 40), w, ds=dy.reshape(6, 40))
    assert dx.shape == (2, 3, 40)
    assert_close(dx.reshape(6, 40), want["dx"], dtype, scale=8)
    assert_close(dw, want["dweight"], dtype, scale=8)
    assert_close(db, want["dbias"], dtype, scale=8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_host_fused_equals_composed_bitwise(dtype):
    """On the host, s and y are those of binary add then layer_norm, bit for bit, and dx is
    layer_norm_backward's dx plus ds (rows spanning several host blocks)."""
    F = gp.functional
    rows, dim = 3 * block_rows(70) + 5, 70
    x, r, w, b = _inputs(rows, dim, dtype, True, True)
    s, y, mean, rstd = F.residual_layer_norm(x, r, w, b)
    s2 = F.binary("add", x, r)
    y2, mean2, rstd2 = F.layer_norm(s2, w, b)
    for got, want in ((s, s2), (y, y2), (mean, mean2), (rstd, rstd2)):
        np.testing.assert_array_equal(got, want)
    dy, ds = random((rows, dim), dtype, seed=8), random((rows, dim), dtype, seed=9)
    dx, dw, db = F.residual_layer_norm_backward(dy, s, w, mean, rstd, ds=ds)
    dx2, dw2, db2 = F.layer_norm_backward(dy, s2, w, mean2, rstd2)
    np.testing.assert_array_equal(dx, F.binary("add", dx2, ds))
    np.testing.assert_array_equal(dw, dw2)
    np.testing.assert_array_equal(db, db2)
