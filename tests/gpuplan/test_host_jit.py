"""The compiled float32 host kernels (gpuplan.host_kernels through gpuplan.host_jit) against
the NumPy passes they replace and against float64 references: GELU forward and backward, the
GEMM's GELU epilogue, LayerNorm / RMSNorm / residual + LayerNorm forward and backward."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import gpuplan as gp
from gpuplan import host_jit
from gpuplan.ops.normalization.reference import layer_norm_reference
from gpuplan.testing import assert_close, random

pytest.importorskip("numba")
F = gp.functional
_ERF = np.vectorize(math.erf, otypes=[np.float64])


@pytest.fixture(scope="module")
def kernels():
    k = host_jit.kernels()
    assert k is not None, "numba is installed: the kernels must load"
    return k


def _both(fn):
    """fn() with the kernels, then with the NumPy passes."""
    jit = fn()
    with host_jit.numpy_only():
        assert host_jit.kernels() is None
        numpy = fn()
    return jit, numpy


def _gelu_inputs():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(200_003) * 3, np.linspace(-12, 12, 40_001),
                        [0.0, -0.0, 5.7, -5.7, 1e-30, -1e-30, 30, -30, 1e30, np.inf, -np.inf,
                         np.nan]]).astype(np.float32)
    dy = rng.uniform(-2, 2, x.size).astype(np.float32)
    return x, dy


def test_import_gpuplan_does_not_import_numba():
    code = "import sys, gpuplan, autograd; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_gpuplan_host_jit_0_keeps_the_numpy_passes():
    code = "from gpuplan import host_jit; print(host_jit.kernels())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**_env(), "GPUPLAN_HOST_JIT": "0"})
    assert out.stdout.strip() == "None"


def _env():
    import os
    return dict(os.environ)


def test_gelu_forward_gives_the_numpy_bits(kernels):
    x, _ = _gelu_inputs()
    jit, numpy = _both(lambda: F.unary("gelu", x))
    np.testing.assert_array_equal(jit, numpy)
    a = random((300, 130), np.float32, seed=1, low=-7, high=7)
    b = random((130, 70), np.float32, seed=2)
    bias = random((70,), np.float32, seed=3)
    jit, numpy = _both(lambda: F.matmul(a, b, bias=bias, epilogue="gelu", save_preact=True))
    for got, want in zip(jit, numpy, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("with_y", [False, True], ids=["from_x", "from_y"])
def test_gelu_backward_matches_float64_and_the_numpy_path(kernels, with_y):
    x, dy = _gelu_inputs()
    y = F.unary("gelu", x) if with_y else None
    jit, numpy = _both(lambda: F.unary_backward("gelu", x, dy, y=y))
    finite = np.isfinite(x)
    xd = x[finite].astype(np.float64)
    phi = 0.5 * (1 + _ERF(xd / math.sqrt(2)))
    want = dy[finite] * (phi + xd * np.exp(-xd * xd / 2) / math.sqrt(2 * math.pi))
    err = np.abs(jit[finite] - want) / np.maximum(1.0, np.abs(dy[finite]))
    assert err.max() < 4e-7
    # The two paths differ where their float32 exp does, by an ulp of x phi(x), carried
    # through the float32 sum Phi + x phi and the product with dy.
    gap = np.abs(jit[finite] - numpy[finite]) / np.maximum(1.0, np.abs(dy[finite]))
    assert gap.max() < 2.5e-7
    np.testing.assert_array_equal(np.isnan(jit), np.isnan(numpy))


def test_exp_is_within_an_ulp_and_keeps_the_special_values(kernels):
    s = np.concatenate([np.linspace(-110, 88, 4001), [0.0, -0.0, 1e-30]]).astype(np.float32)
    got = np.array([kernels._exp_f32(v) for v in s], np.float32)
    ref = np.exp(s.astype(np.float64))
    ulps = np.abs(got - ref) / np.spacing(ref.astype(np.float32))
    assert ulps.max() <= 1.0  # denormals and 0 below -87.3 included
    assert kernels._exp_f32(np.float32(np.inf)) == np.inf
    assert kernels._exp_f32(np.float32(-np.inf)) == 0.0
    assert np.isnan(kernels._exp_f32(np.float32(np.nan)))


_AFFINE = [(True, True), (True, False), (False, True), (False, False)]


@pytest.mark.parametrize("rows, dim", [(1, 1), (37, 7), (600, 96), (3, 1030)])
@pytest.mark.parametrize("has_w, has_b", _AFFINE)
def test_layer_norm_forward_and_backward_against_float64(kernels, rows, dim, has_w, has_b):
    x = random((rows, dim), np.float32, seed=1, low=-2, high=3)
    w = random((dim,), np.float32, seed=2, low=0.5, high=1.5) if has_w else None
    b = random((dim,), np.float32, seed=3) if has_b else None
    dy = random((rows, dim), np.float32, seed=4)
    y_ref, mean_ref, rstd_ref = layer_norm_reference(x, w, b)
    (y, mean, rstd), (y0, mean0, rstd0) = _both(lambda: F.layer_norm(x, w, b))
    for got in ((y, mean, rstd), (y0, mean0, rstd0)):
        assert_close(got[0], y_ref, np.float32, scale=4)
        assert_close(got[1], mean_ref, np.float32)
        assert_close(got[2], rstd_ref, np.float32)
    xd, dyd = x.astype(np.float64), dy.astype(np.float64)
    xhat = (xd - mean_ref[:, None]) * rstd_ref[:, None]
    g = dyd if w is None else dyd * w
    dx_ref = rstd_ref[:, None] * (g - g.mean(axis=1, keepdims=True)
                                  - xhat * (g * xhat).mean(axis=1, keepdims=True))
    jit, numpy = _both(lambda: F.layer_norm_backward(dy, x, w, mean, rstd))
    for dx, dw, db in (jit, numpy):
        assert_close(dx, dx_ref, np.float32, scale=8)
        if w is not None:
            assert_close(dw, (dyd * xhat).sum(axis=0), np.float32, scale=8)
        assert_close(db, dyd.sum(axis=0), np.float32, scale=8)


def test_rms_norm_forward_and_backward_against_float64(kernels):
    x = random((300, 70), np.float32, seed=5, low=-2, high=3)
    w = random((70,), np.float32, seed=6, low=0.5, high=1.5)
    dy = random((300, 70), np.float32, seed=7)
    y_ref, _, rstd_ref = layer_norm_reference(x, w, rms=True, eps=1e-6)
    (y, rstd), (y0, rstd0) = _both(lambda: F.rms_norm(x, w))
    for got_y, got_r in ((y, rstd), (y0, rstd0)):
        assert_close(got_y, y_ref, np.float32, scale=4)
        assert_close(got_r, rstd_ref, np.float32)
    xd, dyd = x.astype(np.float64), dy.astype(np.float64)
    xhat = xd * rstd_ref[:, None]
    g = dyd * w
    dx_ref = rstd_ref[:, None] * (g - xhat * (g * xhat).mean(axis=1, keepdims=True))
    jit, numpy = _both(lambda: F.rms_norm_backward(dy, x, w, rstd))
    for dx, dw in (jit, numpy):
        assert_close(dx, dx_ref, np.float32, scale=8)
        assert_close(dw, (dyd * xhat).sum(axis=0), np.float32, scale=8)


def test_residual_layer_norm_adds_as_the_binary_plan_rounds(kernels):
    x = random((200, 50), np.float32, seed=8, low=-2, high=2)
    r = random((200, 50), np.float32, seed=9, low=-2, high=2)
    w, b = random((50,), np.float32, seed=10), random((50,), np.float32, seed=11)
    s, y, mean, rstd = F.residual_layer_norm(x, r, w, b)
    np.testing.assert_array_equal(s, x + r)
    y_ref, _, _ = layer_norm_reference(s, w, b)
    assert_close(y, y_ref, np.float32, scale=4)
    for got, want in zip((y, mean, rstd), F.layer_norm(s, w, b), strict=True):
        np.testing.assert_array_equal(got, want)  # the fused op gives the composed bits
    dy, ds = random((200, 50), np.float32, seed=12), random((200, 50), np.float32, seed=13)
    dx, dw, db = F.residual_layer_norm_backward(dy, s, w, mean, rstd, ds=ds)
    dx0, dw0, db0 = F.layer_norm_backward(dy, s, w, mean, rstd)
    np.testing.assert_array_equal(dx, dx0 + ds)
    np.testing.assert_array_equal(dw, dw0)
    np.testing.assert_array_equal(db, db0)


def test_adamw_gives_the_numpy_bits(kernels):
    sizes = (70_000, 5, 0, 1003)
    results = []
    for numpy_only in (False, True):
        rng = np.random.default_rng(0)
        params = [rng.standard_normal(k).astype(np.float32) for k in sizes]
        grads = [rng.standard_normal(k).astype(np.float32) for k in sizes]
        m = [np.zeros(k, np.float32) for k in sizes]
        v = [np.zeros(k, np.float32) for k in sizes]
        plan = gp.AdamWMultiTensorPlan.select(gp.Stream.host(),
                                              gp.AdamWMultiTensorDescriptor(sizes, np.float32))
        with host_jit.numpy_only() if numpy_only else _nothing():
            for step in (1, 2, 3):
                plan.run(gp.Stream.host(), None, gp.AdamWMultiTensorArgs(
                    params, grads, m, v, lr=1e-2, step=step, beta1=0.9, beta2=0.95, eps=1e-8,
                    weight_decay=0.1))
            p1 = rng.standard_normal(999).astype(np.float32)
            m1, v1 = np.zeros_like(p1), np.zeros_like(p1)
            F.adamw_step(p1, p1[::-1].copy(), m1, v1, lr=1e-3, beta1=0.8, beta2=0.9, eps=1e-6,
                         weight_decay=0.0, step=4)
        results.append([a.tobytes() for a in params + m + v + [p1, m1, v1]])
    assert results[0] == results[1]


def _nothing():
    import contextlib
    return contextlib.nullcontext()


def test_read_only_inputs_take_the_kernels(kernels):
    x = random((64, 40), np.float32, seed=14)
    w, b = random((40,), np.float32, seed=15), random((40,), np.float32, seed=16)
    dy = random((64, 40), np.float32, seed=17)
    for a in (x, w, b, dy):
        a.flags.writeable = False
    y, mean, rstd = F.layer_norm(x, w, b)
    for a in (mean, rstd):
        a.flags.writeable = False
    dx, dw, db = F.layer_norm_backward(dy, x, w, mean, rstd)
    (y0, _, _), (dx0, dw0, db0) = (
        [f() for f in (lambda: F.layer_norm(x.copy(), w.copy(), b.copy()),
                       lambda: F.layer_norm_backward(dy.copy(), x.copy(), w.copy(),
                                                     mean.copy(), rstd.copy()))])
    for got, want in ((y, y0), (dx, dx0), (dw, dw0), (db, db0)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(F.unary("gelu", x), F.unary("gelu", x.copy()))
    np.testing.assert_array_equal(F.unary_backward("gelu", x, dy),
                                  F.unary_backward("gelu", x.copy(), dy.copy()))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_sums_over_leading_axes_take_the_column_kernel_with_numpys_bits(kernels, threads,
                                                                        monkeypatch):
    """reduce sum / mean of f32 over leading axes (a bias gradient) runs the compiled column
    sums (float32, row by row): NumPy's order, so the NumPy path's bits for any thread count
    and split, -0.0, inf and NaN included, and for no rows at all."""
    from gpuplan import host
    from gpuplan.ops.reduction import launch as reduce_launch

    monkeypatch.setattr(host, "_budget", threads)
    monkeypatch.setattr(reduce_launch, "_COLUMN_GRAIN", 64)  # split even these small shapes
    used = []
    sums = host_jit.extra("host_kernels_sums")
    real = sums.column_sums
    monkeypatch.setattr(sums, "column_sums",
                        lambda *a: used.append(a[2:]) or real(*a), raising=False)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((7, 45, 67)) * np.exp(rng.uniform(-30, 30, (7, 45, 67))))
    x = x.astype(np.float32)
    x[0, 0, :3] = -0.0
    x[:, 0, 3] = -0.0
    x[2, 5, 4], x[3, 6, 5], x[4, 7, 6] = np.inf, np.nan, -np.inf
    for op, axes, keepdims in (("sum", 0, False), ("sum", (0, 1), False), ("mean", 0, True),
                               ("mean", (0, 1), False)):
        used.clear()
        got, want = _both(lambda o=op, a=axes, k=keepdims: F.reduce(o, x, axes=a, keepdims=k))
        assert used, (op, axes)
        if threads > 1:
            assert len(used) == min(threads, -(-67 // 16)), used  # column blocks, 16-aligned
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float32 and got.shape == want.shape
    # Columns of -0.0 sum to +0.0 (NumPy starts from 0); an empty reduction is 0 or NaN.
    zeros = np.full((3, 20), -0.0, np.float32)
    assert not np.signbit(F.reduce("sum", zeros, axes=0)).any()
    empty = np.zeros((0, 5), np.float32)
    np.testing.assert_array_equal(F.reduce("sum", empty, axes=0), np.zeros(5, np.float32))
    assert np.isnan(F.reduce("mean", empty, axes=0)).all()
    # Not over leading axes, or one element kept (NumPy then sums a vector pairwise): the
    # NumPy path, the kernel not called; two kept columns take it.
    tall = x.reshape(-1, 1)
    for a, axes in ((x, 1), (tall, 0), (tall.reshape(7, -1, 1), (0, 1))):
        used.clear()
        got, want = _both(lambda a=a, axes=axes: F.reduce("sum", a, axes=axes))
        np.testing.assert_array_equal(got, want)
        assert not used, (a.shape, axes)
    used.clear()
    two = np.ascontiguousarray(x.reshape(-1, 67)[:, :2])
    got, want = _both(lambda: F.reduce("mean", two, axes=0))
    np.testing.assert_array_equal(got, want)
    assert used


@pytest.mark.parametrize("offset, padding, index_dtype", [(0, None, np.int64), (0, 3, np.int32),
                                                          (5, 7, np.int64)])
def test_embedding_backward_kernel_gives_the_numpy_paths_bits(kernels, offset, padding,
                                                               index_dtype, monkeypatch):
    """The compiled scatter-add (gpuplan.host_kernels_sums) against the NumPy segment sums:
    repeated rows summed from zero in index order then added to the table row once, rows
    outside the table and padding entries skipped, -0.0 and a non-zero table included."""
    from gpuplan.execute import call
    from gpuplan.ops.embedding import plans as emb

    sums = host_jit.extra("host_kernels_sums")
    used = []
    real = sums.embedding_backward
    monkeypatch.setattr(sums, "embedding_backward", lambda *a: used.append(1) or real(*a))
    rng = np.random.default_rng(21)
    n, v, d = 300, 11, 37
    idx = rng.integers(offset - 2, offset + v + 2, n).astype(index_dtype)  # some out of range
    dout = (rng.standard_normal((n, d)) * np.exp(rng.uniform(-12, 12, (n, d))))
    dout = dout.astype(np.float32)
    dout[:5, 0] = -0.0
    start = random((v, d), np.float32, seed=22)
    desc = emb._descriptor(emb.EmbeddingBackwardDescriptor, v, d, n, padding, np.float32,
                           offset)

    def run():
        dweight = start.copy()
        call(emb.EmbeddingBackwardPlan, desc, like=dout, dout=dout, indices=idx,
             dweight=dweight)
        return dweight

    got, want = _both(run)
    assert used == [1]
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, start)
    got, want = _both(lambda: F.embedding_backward(dout, idx, v, padding_idx=padding,
                                                   index_offset=offset))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_a_kernel_module_that_fails_to_load_warns_once_and_leaves_the_numpy_passes(
        kernels, monkeypatch):
    """host_jit.extra: a module whose import raises (a numba error) gives None and one
    RuntimeWarning, remembered; the host op then runs its NumPy passes with their bits."""
    import importlib
    import warnings

    real = importlib.import_module

    def broken(name, *a, **k):
        if name == "gpuplan.host_kernels_sums":
            raise RuntimeError("numba: no")
        return real(name, *a, **k)

    monkeypatch.setattr(host_jit, "_extra", {})
    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.warns(RuntimeWarning, match="host_kernels_sums failed to load"):
        assert host_jit.extra("host_kernels_sums") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert host_jit.extra("host_kernels_sums") is None  # remembered: no second warning
    x = random((64, 40), np.float32, seed=30)
    with host_jit.numpy_only():
        want = F.reduce("sum", x, axes=0)
    np.testing.assert_array_equal(F.reduce("sum", x, axes=0), want)
