"""LayerNorm / RMSNorm plans against float64 NumPy references, on host and device."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from gpuplan.dtypes import accumulator
from gpuplan.ops.normalization.reference import (
    layer_norm_backward_reference,
    layer_norm_reference,
    rms_norm_backward_reference,
)
from gpuplan.testing import (
    assert_close,
    assert_rejected,
    check_plan,
    f64,
    on,
    random,
    run_plan,
    stream_for,
)
from tests.helpers import DTYPES

# (rows, dim): one row, odd, around the warp/block threshold (1024), a long row.
SHAPES = [(1, 1), (7, 33), (5, 1023), (9, 1025), (3, 4099)]
AFFINE = [pytest.param(True, True, id="w+b"), pytest.param(True, False, id="w"),
          pytest.param(False, False, id="plain")]


def ref_forward(x, w, b, eps, rms):
    """float64 y, mean, rstd of rows of x."""
    return layer_norm_reference(x, w, b, eps, rms=rms)


def ref_backward(dy, x, w, eps, rms):
    """float64 (dx, dw, db) by the chain rule through the reference forward's formulas,
    written per row as the Jacobian J[k, i] = dy_k / dx_i (independent of the kernels'
    closed form)."""
    x, dy = f64(x), f64(dy)
    wv = np.ones(x.shape[1]) if w is None else f64(w)
    _, mean, rstd = ref_forward(x, None, None, eps, rms)
    n = x.shape[1]
    eye = np.eye(n)
    dx = np.empty_like(x)
    for r in range(x.shape[0]):
        c = x[r] - mean[r]
        dc = eye if rms else eye - 1.0 / n                   # d(x - mean)/dx
        dvar = 2.0 * c @ dc / n                               # d var / dx
        drstd = -0.5 * rstd[r] ** 3 * dvar
        jac = (dc * rstd[r] + np.outer(c, drstd)) * wv[:, None]
        dx[r] = dy[r] @ jac
    xhat = (x - mean[:, None]) * rstd[:, None]
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def _inputs(rows, dim, dtype, has_w, has_b):
    x = random((rows, dim), dtype, seed=1, low=-2.0, high=3.0)
    w = random((dim,), dtype, seed=2, low=0.5, high=1.5) if has_w else None
    b = random((dim,), dtype, seed=3) if has_b else None
    return x, w, b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", SHAPES)
@pytest.mark.parametrize("has_w,has_b", AFFINE)
def test_layer_norm_forward(device, dtype, rows, dim, has_w, has_b):
    x, w, b = _inputs(rows, dim, dtype, has_w, has_b)
    acc = accumulator(dtype)
    y = on(device, np.full((rows, dim), 7, dtype))
    mean, rstd = on(device, np.zeros(rows, acc)), on(device, np.zeros(rows, acc))
    desc = gp.LayerNormDescriptor(rows, dim, 1e-5, has_w, has_b, dtype)
    plan = run_plan(gp.LayerNormPlan, desc,
                    gp.LayerNormArgs(on(device, x), on(device, w), on(device, b), y, mean, rstd),
                    device)
    ry, rmean, rrstd = ref_forward(x, w, b, 1e-5, rms=False)
    assert_close(y, ry, dtype, scale=4)
    assert_close(mean, rmean, acc)
    assert_close(rstd, rrstd, acc, scale=4)
    assert plan.precision_guarantee().deterministic


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", SHAPES)
@pytest.mark.parametrize("has_w", [True, False])
def test_rms_norm_forward(device, dtype, rows, dim, has_w):
    x, w, _ = _inputs(rows, dim, dtype, has_w, False)
    y = on(device, np.full((rows, dim), 7, dtype))
    rstd = on(device, np.zeros(rows, accumulator(dtype)))
    run_plan(gp.RMSNormPlan, gp.RMSNormDescriptor(rows, dim, 1e-6, has_w, dtype),
             gp.RMSNormArgs(on(device, x), on(device, w), y, rstd), device)
    ry, _, rrstd = ref_forward(x, w, None, 1e-6, rms=True)
    assert_close(y, ry, dtype, scale=4)
    assert_close(rstd, rrstd, accumulator(dtype), scale=4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", [(1, 1), (7, 33), (40, 257), (9, 1025)])
@pytest.mark.parametrize("has_w,has_b", AFFINE)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_backward(device, dtype, rows, dim, has_w, has_b, rms):
    x, w, _ = _inputs(rows, dim, dtype, has_w, False)
    dy = random((rows, dim), dtype, seed=4)
    eps = 1e-6 if rms else 1e-5
    acc = accumulator(dtype)
    _, rmean, rrstd = ref_forward(x, None, None, eps, rms)
    dx = on(device, np.full((rows, dim), 7, dtype))
    dw = on(device, np.full(dim, 7, dtype)) if has_w else None
    db = on(device, np.full(dim, 7, dtype)) if has_b and not rms else None
    args_in = (on(device, dy), on(device, x), on(device, w))
    if rms:
        desc = gp.RMSNormBackwardDescriptor(rows, dim, has_w, dtype)
        args = gp.RMSNormBackwardArgs(*args_in, on(device, rrstd.astype(acc)), dx, dw)
        plan_cls = gp.RMSNormBackwardPlan
    else:
        desc = gp.LayerNormBackwardDescriptor(rows, dim, has_w, has_b, dtype)
        args = gp.LayerNormBackwardArgs(*args_in, on(device, rmean.astype(acc)),
                                        on(device, rrstd.astype(acc)), dx, dw, db)
        plan_cls = gp.LayerNormBackwardPlan
    plan = run_plan(plan_cls, desc, args, device)
    rdx, rdw, rdb = ref_backward(dy, x, w, eps, rms)
    assert_close(dx, rdx, dtype, scale=8)
    # Column sums over `rows` terms: the error grows with the count.
    if has_w:
        assert_close(dw, rdw, dtype, scale=max(4.0, rows / 4))
    if db is not None:
        assert_close(db, rdb, dtype, scale=max(4.0, rows / 4))
    assert plan.precision_guarantee().deterministic


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_declared_operands(device, dtype, rms):
    """check_plan on all four plans: results against the references, then every malformed
    operand the declarations imply rejected with nothing written."""
    rows, dim, eps = 5, 33, 1e-5
    acc = accumulator(dtype)
    x, w, b = _inputs(rows, dim, dtype, True, not rms)
    inputs = {"x": x, "weight": w} | ({} if rms else {"bias": b})

    def forward_ref(x, weight, bias=None, **outputs):
        y, mean, rstd = ref_forward(x, weight, bias, eps, rms)
        return {"y": y, "rstd": rstd} | ({} if rms else {"mean": mean})

    fwd, desc = ((gp.RMSNormPlan, gp.RMSNormDescriptor(rows, dim, eps, True, dtype)) if rms else
                 (gp.LayerNormPlan, gp.LayerNormDescriptor(rows, dim, eps, True, True, dtype)))
    check_plan(fwd, desc, inputs, forward_ref, device=device, scale=4)
    _, mean, rstd = ref_forward(x, None, None, eps, rms)
    inputs = {"dy": random((rows, dim), dtype, seed=4), "x": x, "weight": w,
              "rstd": rstd.astype(acc)} | ({} if rms else {"mean": mean.astype(acc)})

    def backward_ref(dy, x, weight, **saved_and_outputs):
        dx, dw, db = ref_backward(dy, x, weight, eps, rms)
        return {"dx": dx, "dweight": dw} | ({} if rms else {"dbias": db})

    bwd, desc = ((gp.RMSNormBackwardPlan, gp.RMSNormBackwardDescriptor(rows, dim, True, dtype))
                 if rms else (gp.LayerNormBackwardPlan,
                              gp.LayerNormBackwardDescriptor(rows, dim, True, True, dtype)))
    check_plan(bwd, desc, inputs, backward_ref, device=device, scale=8)


class _ReferenceNorm(ag.Function):
    """The float64 references as an autograd Function: forward layer_norm_reference,
    backward ref_backward, so that ag.gradcheck can check one against the other."""

    @staticmethod
    def forward(ctx, x, w, b, rms):
        ctx.saved = (x, w, rms)
        return ref_forward(x, w, b, 1e-5, rms)[0]

    @staticmethod
    def backward(ctx, dy):
        x, w, rms = ctx.saved
        dx, dw, db = ref_backward(dy, x, w, 1e-5, rms)
        return dx, dw, (None if rms else db)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_reference_backward_passes_gradcheck(rms):
    rng = np.random.default_rng(0)
    x, w, b = rng.normal(size=(3, 5)), rng.normal(size=5), rng.normal(size=5)
    inputs = [ag.tensor(a, requires_grad=True) for a in (x, w, b)]
    assert ag.gradcheck(lambda x, w, b: _ReferenceNorm.apply(x, w, None if rms else b, rms=rms),
                        inputs, rtol=1e-6, atol=1e-8)


# -- the float64 references themselves: against the math, and against the host SKU ------


def test_references_hand_values():
    """Rows worked out by hand. RMSNorm of (3, 4): mean(x^2) = 12.5, y = x / sqrt(12.5); its
    Jacobian from y_1 = x_1 / sqrt((x_1^2 + x_2^2) / 2) directly: dy_1/dx_1 = sqrt2 x_2^2 / 125,
    dy_1/dx_2 = -sqrt2 x_1 x_2 / 125. LayerNorm of (1, 2, 6): mean 3, var 14/3; of any two
    values: (-1, 1) whatever they are, so its gradient is 0."""
    x, w = np.array([[3.0, 4.0]]), np.array([2.0, 0.5])
    y, mean, rstd = layer_norm_reference(x, w, eps=0.0, rms=True)
    np.testing.assert_allclose(y, [[6 / 12.5**0.5, 2 / 12.5**0.5]], rtol=1e-15)
    np.testing.assert_array_equal(mean, [0.0])
    np.testing.assert_allclose(rstd, [12.5**-0.5], rtol=1e-15)
    dx, dw = rms_norm_backward_reference(np.array([[1.0, 0.0]]), x, eps=0.0)
    np.testing.assert_allclose(dx, [[2**0.5 * 16 / 125, -(2**0.5) * 12 / 125]], rtol=1e-14)
    np.testing.assert_allclose(dw, [3 / 12.5**0.5, 0.0], rtol=1e-15)
    dx, _ = rms_norm_backward_reference(np.array([[1.0, 0.0]]), x, w, eps=0.0)
    np.testing.assert_allclose(dx, [[2 * 2**0.5 * 16 / 125, -2 * 2**0.5 * 12 / 125]],
                               rtol=1e-14)  # weight scales g = dy * w
    y, mean, rstd = layer_norm_reference(np.array([[1.0, 2.0, 6.0]]), bias=np.ones(3), eps=0.0)
    np.testing.assert_allclose(y, [np.array([-2.0, -1.0, 3.0]) * (3 / 14) ** 0.5 + 1],
                               rtol=1e-15)
    np.testing.assert_allclose((mean, rstd), ([3.0], [(3 / 14) ** 0.5]), rtol=1e-15)
    dx, dw, db = layer_norm_backward_reference(np.array([[0.3, -2.0]]), np.array([[5.0, -1.0]]),
                                               np.array([1.5, 0.25]), eps=0.0)
    np.testing.assert_allclose(dx, [[0.0, 0.0]], atol=1e-15)
    np.testing.assert_allclose(dw, [0.3, 2.0], rtol=1e-15)  # xhat = (1, -1)
    np.testing.assert_allclose(db, [0.3, -2.0], rtol=1e-15)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("has_w", [True, False], ids=["w", "plain"])
def test_closed_form_references_equal_the_jacobian_chain_rule(rms, has_w):
    """The references' closed-form gradients equal ref_backward's row-by-row Jacobians."""
    x, w, _ = _inputs(6, 37, np.float64, has_w, False)
    dy = random((6, 37), np.float64, seed=4)
    eps = 1e-6 if rms else 1e-5
    jdx, jdw, jdb = ref_backward(dy, x, w, eps, rms)
    if rms:
        (dx, dw), db = rms_norm_backward_reference(dy, x, w, eps), jdb
    else:
        dx, dw, db = layer_norm_backward_reference(dy, x, w, eps)
    for got, want in ((dx, jdx), (dw, jdw), (db, jdb)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("rows,dim", [(1, 1), (7, 33), (3, 1025)])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_references_match_the_host_sku_in_float64(rows, dim, rms):
    """Two independent codes for one definition: the host SKU in float64 and the references
    agree to ~1e-12 (y, mean, rstd; dx, dweight, dbias from the saved statistics)."""
    x, w, b = _inputs(rows, dim, np.float64, True, not rms)
    dy = random((rows, dim), np.float64, seed=4)
    eps = 1e-6 if rms else 1e-5
    y, mean, rstd = np.full((rows, dim), 7.0), np.full(rows, 7.0), np.full(rows, 7.0)
    dx, dw, db = np.full((rows, dim), 7.0), np.full(dim, 7.0), np.full(dim, 7.0)
    if rms:
        run_plan(gp.RMSNormPlan, gp.RMSNormDescriptor(rows, dim, eps, True, np.float64),
                 gp.RMSNormArgs(x, w, y, rstd), "cpu")
        run_plan(gp.RMSNormBackwardPlan, gp.RMSNormBackwardDescriptor(rows, dim, True, np.float64),
                 gp.RMSNormBackwardArgs(dy, x, w, rstd, dx, dw), "cpu")
        (rdx, rdw), rdb = rms_norm_backward_reference(dy, x, w, eps), None
    else:
        run_plan(gp.LayerNormPlan, gp.LayerNormDescriptor(rows, dim, eps, True, True, np.float64),
                 gp.LayerNormArgs(x, w, b, y, mean, rstd), "cpu")
        run_plan(gp.LayerNormBackwardPlan,
                 gp.LayerNormBackwardDescriptor(rows, dim, True, True, np.float64),
                 gp.LayerNormBackwardArgs(dy, x, w, mean, rstd, dx, dw, db), "cpu")
        rdx, rdw, rdb = layer_norm_backward_reference(dy, x, w, eps)
    ry, rmean, rrstd = layer_norm_reference(x, w, b, eps, rms=rms)
    pairs = [(y, ry), (rstd, rrstd), (dx, rdx), (dw, rdw)] + \
        ([] if rms else [(mean, rmean), (db, rdb)])
    for got, want in pairs:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("rows,dim", [(0, 8), (4, 0), (0, 0)])
def test_empty_extents(device, rows, dim):
    x = on(device, np.zeros((rows, dim), np.float32))
    w, b = on(device, np.ones(dim, np.float32)), on(device, np.zeros(dim, np.float32))
    y = on(device, np.zeros((rows, dim), np.float32))
    mean, rstd = on(device, np.full(rows, 3, np.float32)), on(device, np.full(rows, 3, np.float32))
    run_plan(gp.LayerNormPlan, gp.LayerNormDescriptor(rows, dim, 0.25, dtype=np.float32),
             gp.LayerNormArgs(x, w, b, y, mean, rstd), device)
    # D = 0: mean 0, var 0, rstd = 1/sqrt(eps).
    assert np.all(gp.to_host(mean) == 0) and np.all(gp.to_host(rstd) == 2)
    dx = on(device, np.zeros((rows, dim), np.float32))
    dw, db = on(device, np.full(dim, 5, np.float32)), on(device, np.full(dim, 5, np.float32))
    run_plan(gp.LayerNormBackwardPlan, gp.LayerNormBackwardDescriptor(rows, dim),
             gp.LayerNormBackwardArgs(x, x, w, mean, rstd, dx, dw, db), device)
    assert np.all(gp.to_host(dw) == 0) and np.all(gp.to_host(db) == 0)  # empty sums


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="layer_norm: argument 'rows'"):
        gp.LayerNormPlan.select(s, gp.LayerNormDescriptor(-1, 4))
    with pytest.raises(gp.InvalidProblem, match="rms_norm: argument 'eps'"):
        gp.RMSNormPlan.select(s, gp.RMSNormDescriptor(2, 4, eps=-1.0))
    with pytest.raises(gp.Unsupported, match="dtype"):
        gp.LayerNormBackwardPlan.select(s, gp.LayerNormBackwardDescriptor(2, 4, dtype=np.int32))
    with pytest.raises(gp.Unsupported, match="nvrtc requested"):
        gp.RMSNormBackwardPlan.select(s, gp.RMSNormBackwardDescriptor(2, 4),
                                      gp.PlanPreference(backend=gp.BackendKind.NVRTC))


def test_forward_argument_errors_leave_outputs_untouched(device):
    rows, dim = 6, 10
    s = stream_for(device)
    x = on(device, random((rows, dim), np.float32))
    w, b = on(device, np.ones(dim, np.float32)), on(device, np.zeros(dim, np.float32))
    y = on(device, np.full((rows, dim), 9, np.float32))
    mean, rstd = on(device, np.full(rows, 9, np.float32)), on(device, np.full(rows, 9, np.float32))
    plan = gp.LayerNormPlan.select(s, gp.LayerNormDescriptor(rows, dim))

    def run(**kw):
        a = dict(x=x, weight=w, bias=b, y=y, mean=mean, rstd=rstd) | kw
        return lambda: plan.run(s, None, gp.LayerNormArgs(**a))

    outs = [y, mean, rstd]
    assert_rejected(run(x=x.astype(np.float64)), gp.Unsupported, outs, "layer_norm", "'x'",
                    "f32", "f64")
    assert_rejected(run(mean=mean.astype(np.float16)), gp.Unsupported, outs, "'mean'", "f16")
    assert_rejected(run(weight=w[:-1]), gp.BufferTooSmall, outs, "'weight'", "10", "9")
    assert_rejected(run(y=y.reshape(dim, rows)), gp.InvalidProblem, outs, "'y'", "(6, 10)")
    assert_rejected(run(bias=None), gp.InvalidProblem, outs, "'bias'", "an array")
    assert_rejected(run(y=x), gp.InvalidProblem, outs, "'y'", "distinct")
    assert_rejected(run(x=on(device, np.zeros((rows, 2 * dim), np.float32))[:, ::2]),
                    gp.InvalidProblem, outs, "'x'", "contiguous")
    no_w = gp.RMSNormPlan.select(s, gp.RMSNormDescriptor(rows, dim, has_weight=False))
    assert_rejected(lambda: no_w.run(s, None, gp.RMSNormArgs(x, w, y, rstd)), gp.InvalidProblem,
                    outs, "rms_norm", "'weight'", "None")


def test_backward_argument_errors_leave_outputs_untouched(device):
    rows, dim = 6, 10
    s = stream_for(device)
    x = on(device, random((rows, dim), np.float32))
    w = on(device, np.ones(dim, np.float32))
    st = on(device, np.ones(rows, np.float32))
    dx = on(device, np.full((rows, dim), 9, np.float32))
    dw, db = on(device, np.full(dim, 9, np.float32)), on(device, np.full(dim, 9, np.float32))
    plan = gp.LayerNormBackwardPlan.select(s, gp.LayerNormBackwardDescriptor(rows, dim))
    ws = gp.Workspace.allocate(s, plan.workspace_size())

    def run(ws=ws, **kw):
        a = dict(dy=x, x=x, weight=w, mean=st, rstd=st, dx=dx, dweight=dw, dbias=db) | kw
        return lambda: plan.run(s, ws, gp.LayerNormBackwardArgs(**a))

    outs = [dx, dw, db]
    assert_rejected(run(dy=x.astype(np.float16)), gp.Unsupported, outs, "'dy'", "f16")
    assert_rejected(run(rstd=st[:-1]), gp.BufferTooSmall, outs, "'rstd'", "6", "5")
    assert_rejected(run(dbias=None), gp.InvalidProblem, outs, "'dbias'")
    assert_rejected(run(dweight=dx.reshape(-1)[:dim]), gp.InvalidProblem, outs, "'dweight'",
                    "distinct")
    if device == "cuda":
        assert plan.workspace_size() > 0
        assert_rejected(run(ws=gp.Workspace.none()), gp.WorkspaceTooSmall, outs,
                        "layer_norm_backward", "'ws'")
        assert_rejected(run(x=gp.to_host(x)), gp.InvalidProblem, outs, "'x'")


@pytest.mark.parametrize("dtype", DTYPES)
def test_functional_api(device, dtype):
    x = on(device, random((2, 3, 40), dtype, seed=7))
    w = on(device, random((40,), dtype, seed=8))
    b = on(device, random((40,), dtype, seed=9))
    y, mean, rstd = gp.functional.layer_norm(x, w, b, eps=1e-5)
    assert y.shape == (2, 3, 40) and mean.shape == (2, 3) and rstd.shape == (2, 3)
    assert mean.dtype == accumulator(dtype) and y.dtype == dtype
    ry, _, _ = ref_forward(f64(x).reshape(6, 40), w, b, 1e-5, rms=False)
    assert_close(y.reshape(6, 40), ry, dtype, scale=4)
    dy = on(device, random((2, 3, 40), dtype, seed=10))
    dx, dw, db = gp.functional.layer_norm_backward(dy, x, w, mean, rstd)
    rdx, rdw, rdb = ref_backward(f64(dy).reshape(6, 40), f64(x).reshape(6, 40), w, 1e-5, False)
    assert dx.shape == x.shape
    assert_close(dx.reshape(6, 40), rdx, dtype, scale=8)
    assert_close(dw, rdw, dtype, scale=8)
    assert_close(db, rdb, dtype, scale=8)
    _, dw0, db0 = gp.functional.layer_norm_backward(dy, x, None, mean, rstd)
    assert dw0 is None and db0 is not None
    y, rstd = gp.functional.rms_norm(x, None, eps=1e-6)
    assert_close(y.reshape(6, 40), ref_forward(f64(x).reshape(6, 40), None, None, 1e-6, True)[0],
                 dtype, scale=4)
    dx, dw = gp.functional.rms_norm_backward(dy, x, w, rstd)
    rdx, rdw, _ = ref_backward(f64(dy).reshape(6, 40), f64(x).reshape(6, 40), w, 1e-6, True)
    assert_close(dx.reshape(6, 40), rdx, dtype, scale=8)
    assert_close(dw, rdw, dtype, scale=8)


def test_functional_checks_its_inputs(device):
    x = on(device, random((4, 6), np.float32))
    w = on(device, np.ones(6, np.float32))
    with pytest.raises(gp.BufferTooSmall, match="layer_norm: argument 'weight'"):
        gp.functional.layer_norm(x, w[:-1], None)
    with pytest.raises(gp.Unsupported, match="rms_norm: argument 'weight'"):
        gp.functional.rms_norm(x, w.astype(np.float64))
    _, mean, rstd = gp.functional.layer_norm(x, w, None)
    with pytest.raises(gp.Unsupported, match="layer_norm_backward: argument 'mean'"):
        gp.functional.layer_norm_backward(x, x, w, mean.astype(np.float16), rstd)
    with pytest.raises(gp.InvalidProblem, match="rms_norm: argument 'eps'"):
        gp.functional.rms_norm(x, w, eps=-1.0)


@pytest.mark.gpu
def test_device_skus_and_determinism():
    s = gp.Stream.current()
    small = gp.LayerNormPlan.select(s, gp.LayerNormDescriptor(4, 1024))
    large = gp.LayerNormPlan.select(s, gp.LayerNormDescriptor(4, 1025))
    assert (small.sku().variant, large.sku().variant) == ("warp_row", "block_row")
    bwd = gp.LayerNormBackwardPlan.select(s, gp.LayerNormBackwardDescriptor(300, 700),
                                          gp.PlanPreference(deterministic=True))
    g = bwd.precision_guarantee()
    assert g.deterministic and not g.bit_stable and bwd.workspace_size() > 0
    x = random((300, 700), np.float32, seed=1)
    dy = random((300, 700), np.float32, seed=2)
    w = random((700,), np.float32, seed=3)
    xd, dyd, wd = (on("cuda", a) for a in (x, dy, w))
    _, mean, rstd = gp.functional.layer_norm(xd, wd, None)
    first = gp.functional.layer_norm_backward(dyd, xd, wd, mean, rstd)
    for _ in range(3):
        again = gp.functional.layer_norm_backward(dyd, xd, wd, mean, rstd)
        for a, b in zip(first, again, strict=True):
            np.testing.assert_array_equal(gp.to_host(a), gp.to_host(b))
