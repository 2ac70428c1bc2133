"""Softmax / log-softmax plans (scale, causal mask) against float64 references."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from gpuplan.ops.softmax.reference import (
    causal_mask,
    softmax_backward_reference,
    softmax_reference,
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

# (rows, dim): tiny, odd, around the warp/block threshold, a GPT-2 vocabulary row.
SHAPES = [(1, 1), (7, 33), (5, 1024), (6, 1025), (2, 50257)]


# The family's float64 reference under the names other tests import.
ref_softmax = softmax_reference


def ref_backward(x, dy, scale=1.0, log=False, mask=None):
    """Vector-Jacobian product of ref_softmax at x [rows, dim] (checked by gradcheck below):
    the reference backward from the exact forward output."""
    return softmax_backward_reference(ref_softmax(x, scale, mask, log), dy, scale, log, mask)


class _Reference(ag.Function):
    """ref_softmax with ref_backward as its gradient, for ag.gradcheck (masked log-softmax
    outputs, the constant -inf, read 0 so that gradcheck's loss stays finite)."""

    @staticmethod
    def forward(ctx, x, scale, log, mask):
        ctx.args = (x, scale, log, mask)
        y = ref_softmax(x, scale, mask, log)
        return y if mask is None else np.where(mask, 0.0, y)

    @staticmethod
    def backward(ctx, dy):
        x, scale, log, mask = ctx.args
        return ref_backward(x, dy, scale, log, mask)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_backward_is_the_gradient(log, causal):
    x = np.random.default_rng(0).normal(size=(6, 5))
    mask = causal_mask(6, 3, 5) if causal else None
    t = ag.tensor(x, requires_grad=True)
    assert ag.gradcheck(lambda v: _Reference.apply(v, scale=0.5, log=log, mask=mask), [t])


def _softmax_args(device, x, dtype):
    return gp.SoftmaxArgs(on(device, x), on(device, np.full(x.shape, 7, dtype)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", SHAPES)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_forward(device, dtype, rows, dim, log):
    x = random((rows, dim), dtype, seed=1, low=-8, high=8)
    plan_cls = gp.LogSoftmaxPlan if log else gp.SoftmaxPlan
    args = _softmax_args(device, x, dtype)
    plan = run_plan(plan_cls, gp.SoftmaxDescriptor(rows, dim, 0.7, dtype=dtype), args, device)
    # log-softmax values reach ~ -15: scale atol with them.
    assert_close(args.y, ref_softmax(x, 0.7, log=log), dtype, scale=16 if log else 2)
    assert plan.precision_guarantee().deterministic
    if not log:
        np.testing.assert_allclose(f64(args.y).sum(axis=1), 1.0, rtol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,q_len,k_len", [(1, 1, 1), (2, 5, 5), (3, 4, 9), (2, 6, 3),
                                               (1, 7, 1100)])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_causal_forward(device, dtype, batch, q_len, k_len, log):
    rows = batch * q_len
    x = random((rows, k_len), dtype, seed=2, low=-4, high=4)
    mask = causal_mask(rows, q_len, k_len)
    plan_cls = gp.LogSoftmaxPlan if log else gp.SoftmaxPlan
    args = _softmax_args(device, x, dtype)
    run_plan(plan_cls, gp.SoftmaxDescriptor(rows, k_len, 1.3, True, q_len, dtype), args, device)
    y, ref = f64(args.y), ref_softmax(x, 1.3, mask, log)
    # Masked (and fully masked, Lq > Lk) positions are exactly 0 / -inf.
    np.testing.assert_array_equal(y[mask], -np.inf if log else 0.0)
    assert_close(y[~mask], ref[~mask], dtype, scale=16 if log else 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", SHAPES)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_backward(device, dtype, rows, dim, log):
    x = random((rows, dim), dtype, seed=3, low=-3, high=3)
    dy = random((rows, dim), dtype, seed=4)
    scale = 0.5
    # The plan takes the forward output, rounded to dtype as a caller would hold it.
    y = ref_softmax(x, scale, log=log).astype(dtype)
    dx = on(device, np.full((rows, dim), 7, dtype))
    plan_cls = gp.LogSoftmaxBackwardPlan if log else gp.SoftmaxBackwardPlan
    run_plan(plan_cls, gp.SoftmaxBackwardDescriptor(rows, dim, scale, dtype=dtype),
             gp.SoftmaxBackwardArgs(on(device, y), on(device, dy), dx), device)
    # The reference uses exact probabilities; the plan the rounded y: allow that rounding.
    assert_close(dx, ref_backward(x, dy, scale, log), dtype, scale=8 if log else 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,q_len,k_len", [(2, 5, 5), (3, 4, 9), (2, 6, 3), (1, 7, 1100)])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_causal_backward(device, dtype, batch, q_len, k_len, log):
    """Masked positions take no part in the row sums and get dx = 0, whatever dy holds."""
    rows = batch * q_len
    x = random((rows, k_len), dtype, seed=5, low=-3, high=3)
    dy = random((rows, k_len), dtype, seed=6)
    mask = causal_mask(rows, q_len, k_len)
    y = ref_softmax(x, 1.3, mask, log).astype(dtype)
    dx = on(device, np.full((rows, k_len), 7, dtype))
    plan_cls = gp.LogSoftmaxBackwardPlan if log else gp.SoftmaxBackwardPlan
    run_plan(plan_cls, gp.SoftmaxDescriptor(rows, k_len, 1.3, True, q_len, dtype),
             gp.SoftmaxBackwardArgs(on(device, y), on(device, dy), dx), device)
    got = f64(dx)
    np.testing.assert_array_equal(got[mask], 0.0)
    assert_close(got, ref_backward(x, dy, 1.3, log, mask), dtype, scale=8 if log else 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_plans_through_check_plan(device, dtype, log):
    """Results and every malformed operand the declaration implies, all four plans."""
    rows, q_len, dim = 6, 3, 5
    desc = gp.SoftmaxDescriptor(rows, dim, 0.7, True, q_len, dtype)
    x = random((rows, dim), dtype, seed=7, low=-3, high=3)
    mask = causal_mask(rows, q_len, dim)
    fwd = gp.LogSoftmaxPlan if log else gp.SoftmaxPlan
    bwd = gp.LogSoftmaxBackwardPlan if log else gp.SoftmaxBackwardPlan
    ref = ref_softmax(x, 0.7, mask, log)
    # (masked log-softmax outputs are -inf on both sides: assert_allclose accepts that)
    check_plan(fwd, desc, {"x": x}, lambda x, y: ref, device=device, scale=16 if log else 2)
    y = ref.astype(dtype)
    dy = random((rows, dim), dtype, seed=8)
    check_plan(bwd, desc, {"y": y, "dy": dy},
               lambda y, dy, dx: ref_backward(x, dy, 0.7, log, mask), device=device,
               scale=8 if log else 4)


def test_extreme_inputs_host():
    # -inf inputs contribute nothing, large inputs do not overflow.
    x = np.array([[0.0, -np.inf, 1000.0, 999.0], [-np.inf, 3.0, -np.inf, -np.inf]], np.float32)
    y = gp.functional.softmax(x)
    np.testing.assert_allclose(y, ref_softmax(x), rtol=1e-6, atol=1e-30)
    lg = gp.functional.log_softmax(x)
    assert np.isneginf(lg[0, 1]) and lg[1, 1] == 0


@pytest.mark.parametrize("rows,dim", [(0, 5), (5, 0)])
def test_empty_extents(device, rows, dim):
    x = on(device, np.zeros((rows, dim), np.float32))
    y = on(device, np.zeros((rows, dim), np.float32))
    run_plan(gp.SoftmaxPlan, gp.SoftmaxDescriptor(rows, dim), gp.SoftmaxArgs(x, y), device)
    run_plan(gp.LogSoftmaxBackwardPlan, gp.SoftmaxBackwardDescriptor(rows, dim),
             gp.SoftmaxBackwardArgs(x, x, y), device)
    assert gp.functional.softmax(x).shape == (rows, dim)


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="softmax: argument 'dim'"):
        gp.SoftmaxPlan.select(s, gp.SoftmaxDescriptor(2, -3))
    with pytest.raises(gp.InvalidProblem, match="softmax: argument 'q_len'"):
        gp.SoftmaxPlan.select(s, gp.SoftmaxDescriptor(10, 4, causal=True, q_len=3))
    with pytest.raises(gp.InvalidProblem, match="log_softmax: argument 'q_len'"):
        gp.LogSoftmaxPlan.select(s, gp.SoftmaxDescriptor(10, 4, causal=True, q_len=0))
    with pytest.raises(gp.InvalidProblem, match="'scale'"):
        gp.SoftmaxBackwardPlan.select(s, gp.SoftmaxBackwardDescriptor(2, 3, float("nan")))
    with pytest.raises(gp.Unsupported, match="dtype"):
        gp.SoftmaxPlan.select(s, gp.SoftmaxDescriptor(2, 3, dtype=np.int64))
    with pytest.raises(gp.Unsupported, match="cublas requested"):
        gp.SoftmaxPlan.select(s, gp.SoftmaxDescriptor(2, 3),
                              gp.PlanPreference(backend=gp.BackendKind.CUBLAS))
    with pytest.raises(gp.InvalidProblem, match="rank >= 2"):
        gp.functional.softmax(np.zeros(3, np.float32), causal=True)


def test_argument_errors_leave_outputs_untouched(device):
    rows, dim = 4, 9
    s = stream_for(device)
    x = on(device, random((rows, dim), np.float32))
    y = on(device, np.full((rows, dim), 9, np.float32))
    plan = gp.SoftmaxPlan.select(s, gp.SoftmaxDescriptor(rows, dim))
    run = lambda **kw: lambda: plan.run(s, None, gp.SoftmaxArgs(**(dict(x=x, y=y) | kw)))  # noqa: E731
    assert_rejected(run(x=x.astype(gp.bfloat16)), gp.Unsupported, [y], "softmax", "'x'", "f32",
                    "bf16")
    assert_rejected(run(x=x[:-1]), gp.BufferTooSmall, [y], "'x'", "36", "27")
    assert_rejected(run(x=x.reshape(dim, rows)), gp.InvalidProblem, [y], "'x'", "(4, 9)")
    assert_rejected(run(y=x), gp.InvalidProblem, [y], "'y'", "distinct")
    bwd = gp.SoftmaxBackwardPlan.select(s, gp.SoftmaxBackwardDescriptor(rows, dim))
    assert_rejected(lambda: bwd.run(s, None, gp.SoftmaxBackwardArgs(x, x[:, :4], y)),
                    gp.BufferTooSmall, [y], "softmax_backward", "'dy'")
    if device == "cuda":
        assert_rejected(run(x=gp.to_host(x)), gp.InvalidProblem, [y], "'x'")


@pytest.mark.parametrize("dtype", DTYPES)
def test_functional_api(device, dtype):
    x = on(device, random((2, 3, 5, 8), dtype, seed=5, low=-2, high=2))
    y = gp.functional.softmax(x, scale=0.5, causal=True)
    assert y.shape == x.shape and y.dtype == dtype
    mask = causal_mask(30, 5, 8)
    assert_close(y.reshape(30, 8), ref_softmax(f64(x).reshape(30, 8), 0.5, mask), dtype, scale=2)
    dy = on(device, random(x.shape, dtype, seed=6))
    dx = gp.functional.softmax_backward(y, dy, scale=0.5)
    yd, dyd = f64(y), f64(dy)
    assert_close(dx, softmax_backward_reference(yd, dyd, 0.5), dtype, scale=4)
    assert np.all(f64(dx).reshape(30, 8)[mask] == 0)
    cdx = gp.functional.softmax_backward(y, dy, scale=0.5, causal=True)
    assert_close(cdx, f64(dx), dtype, scale=4)  # masked y = 0: the mask changes nothing
    ly = gp.functional.log_softmax(x)
    assert_close(ly.reshape(30, 8), ref_softmax(f64(x).reshape(30, 8), log=True), dtype, scale=4)
    ldx = gp.functional.log_softmax_backward(ly, dy)
    assert_close(ldx, softmax_backward_reference(ly, dyd, log=True), dtype, scale=4)


@pytest.mark.gpu
def test_device_skus():
    s = gp.Stream.current()
    assert gp.SoftmaxPlan.select(s, gp.SoftmaxDescriptor(4, 1024)).sku().variant == "warp_row"
    plan = gp.SoftmaxBackwardPlan.select(s, gp.SoftmaxBackwardDescriptor(4, 50257),
                                         gp.PlanPreference(deterministic=True))
    assert plan.sku().variant == "block_row" and not plan.precision_guarantee().bit_stable


# -- the compiled kernels of small host inputs (gpuplan.ops.softmax.host_kernels) -------------

_SMALL_SHAPES = [(1, 1), (8, 8), (7, 33), (3, 1365), (64, 64)]  # up to SMALL elements


def _small_kernels():
    pytest.importorskip("numba")
    import os

    from gpuplan import host_jit
    from gpuplan.ops.softmax import plans

    if os.environ.get("GPUPLAN_HOST_JIT", "").strip().lower() in host_jit._OFF:
        pytest.skip("GPUPLAN_HOST_JIT turns the compiled kernels off")
    k = host_jit.extra(plans._HOST_KERNELS)
    assert k is not None, "numba is installed: the softmax kernels must load"
    return k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,dim", _SMALL_SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_small_host_inputs_run_the_kernels_against_float64(dtype, rows, dim, causal, log):
    """Inputs of up to SMALL elements take the compiled kernels (one float64 evaluation
    rounded once): within a few units of the dtype's rounding of the float64 reference."""
    from gpuplan.ops.softmax.plans import SMALL

    _small_kernels()
    assert rows * dim <= SMALL
    q_len = rows if causal else 0
    desc = gp.SoftmaxDescriptor(rows, dim, 0.7, causal, q_len, dtype)
    fwd = gp.LogSoftmaxPlan if log else gp.SoftmaxPlan
    plan = fwd.select(gp.Stream.host(), desc)
    assert plan._kernels() is not None
    x = random((rows, dim), dtype, seed=11, low=-6, high=6)
    mask = causal_mask(rows, q_len, dim) if causal else None
    y = np.full((rows, dim), 7, dtype)
    plan.run(gp.Stream.host(), None, gp.SoftmaxArgs(x, y))
    ref = ref_softmax(x, 0.7, mask, log)
    eps = np.finfo(dtype).eps
    if mask is not None:
        np.testing.assert_array_equal(y[mask], -np.inf if log else 0.0)
    keep = np.isfinite(ref)
    np.testing.assert_allclose(y[keep], ref[keep], rtol=4 * eps, atol=(64 if log else 2) * eps)
    dy = random((rows, dim), dtype, seed=12)
    yr = ref.astype(dtype)
    dx = np.full((rows, dim), 7, dtype)
    bwd = gp.LogSoftmaxBackwardPlan if log else gp.SoftmaxBackwardPlan
    bwd.select(gp.Stream.host(), desc).run(gp.Stream.host(), None,
                                            gp.SoftmaxBackwardArgs(yr, dy, dx))
    want = softmax_backward_reference(yr, dy, 0.7, log, mask)
    np.testing.assert_allclose(dx, want, rtol=8 * eps, atol=8 * eps * np.abs(want).max())
    if mask is not None:
        np.testing.assert_array_equal(dx[mask], 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_small_kernels_give_the_numpy_path_special_rows(dtype, causal):
    """NaN, +-inf, all -inf and fully masked rows come out as from the NumPy passes."""
    from gpuplan import host_jit

    _small_kernels()
    inf, nan = np.inf, np.nan
    x = np.array([[0, -inf, 1000, 999], [-inf, 3, -inf, -inf], [-inf] * 4, [1, nan, 2, 3],
                  [1, inf, 2, 3], [inf, inf, 1, 2], [-inf, -inf, -inf, 5], [1, 2, 3, 4]], dtype)
    q_len = 8 if causal else 0  # with 4 keys, the first 3 queries see none (fully masked)
    desc = gp.SoftmaxDescriptor(8, 4, 1.0, causal, q_len, dtype)
    dy = random((8, 4), dtype, seed=13)
    for fwd, bwd in ((gp.SoftmaxPlan, gp.SoftmaxBackwardPlan),
                     (gp.LogSoftmaxPlan, gp.LogSoftmaxBackwardPlan)):
        def run(plan_cls, args):
            return gp.execute(plan_cls, desc, args, like=x)

        with warnings.catch_warnings():  # neither path may warn
            warnings.simplefilter("error")
            y = np.empty_like(x)
            run(fwd, gp.SoftmaxArgs(x, y))
            dx = np.empty_like(x)
            run(bwd, gp.SoftmaxBackwardArgs(np.nan_to_num(y, neginf=-30), dy, dx))
        with host_jit.numpy_only(), warnings.catch_warnings():
            warnings.simplefilter("error")
            y_np, dx_np = np.empty_like(x), np.empty_like(x)
            run(fwd, gp.SoftmaxArgs(x, y_np))
            run(bwd, gp.SoftmaxBackwardArgs(np.nan_to_num(y_np, neginf=-30), dy, dx_np))
        for got, want in ((y, y_np), (dx, dx_np)):
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
            fin = np.isfinite(want)
            np.testing.assert_allclose(got[fin], want[fin], rtol=1e-6, atol=1e-6)


def test_large_inputs_keep_the_numpy_passes():
    from gpuplan.ops.softmax.plans import SMALL

    big = gp.SoftmaxPlan.select(gp.Stream.host(), gp.SoftmaxDescriptor(2, SMALL // 2 + 1))
    half = gp.SoftmaxPlan.select(gp.Stream.host(), gp.SoftmaxDescriptor(
        2, 8, dtype=gp.bfloat16))
    assert big._small is None and half._small is None
