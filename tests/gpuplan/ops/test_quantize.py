"""Per-token quantize/dequantize plans and backwards against float64 and exact references."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.dtypes import FLOAT_DTYPES
from gpuplan.ops.quantize.reference import (
    flush_f32,
    quantize_reference64,
    quantize_reference_exact,
    scale_reference64,
    scaled_reference_exact,
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

SHAPES = [(1, 1), (7, 5), (33, 257), (129, 1000)]


# -- inputs ------------------------------------------------------------------------------------


def special_rows(dtype) -> np.ndarray:
    """Ties, a zero row, subnormal and underflowing rows, huge values, NaN and inf."""
    rows = [
        [127, 0.5, 1.5, 2.5, -0.5, -2.5, 126.5, -126.5],
        [0, 0, 0, 0, -0.0, 0, 0, 0],
        [1e-39, -2e-39, 0, 0, 1e-40, 0, 0, 0],
        [1e-37, -5e-38, 3e-38, 0, 0, 0, 0, 0],
        [3e38, -1e38, 1, 0, 0, 0, 0, 0],
        [1e300, -1, 1, 0, 0, 0, 0, 0],
        [np.nan, 1, -2, 3, 0.25, 0, 0, 0],
        [np.inf, 1, -2, 3, 0.25, 0, 0, 0],
    ]
    with np.errstate(over="ignore"):
        special = np.array(rows, np.float64).astype(dtype)
    return np.concatenate([special, random((9, 8), dtype, seed=11, low=-3, high=3)])


def _bits(a) -> np.ndarray:
    return gp.to_host(a).view(np.uint8)


def quantize(x: np.ndarray, device: str):
    n, d = x.shape
    q = on(device, np.full((n, d), 99, np.int8))
    scale = on(device, np.full((n,), 5, np.float32))
    plan = run_plan(gp.QuantizePerTokenPlan, gp.QuantizePerTokenDescriptor(n, d, x.dtype),
                    gp.QuantizePerTokenArgs(on(device, x), q, scale), device)
    return gp.to_host(q), gp.to_host(scale), plan


# -- quantize ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", SHAPES)
def test_quantize_matches_reference(device, dtype, n, d):
    x = random((n, d), dtype, seed=n + d, low=-4, high=4)
    q, scale, plan = quantize(x, device)
    q64, s64 = quantize_reference64(x)
    np.testing.assert_allclose(scale, s64, rtol=2e-7, atol=0)
    assert np.abs(q.astype(np.int64) - q64).max(initial=0) <= 1
    assert np.mean(q == q64) > 0.99
    err = np.abs(f64(x) - scale.astype(np.float64)[:, None] * q)
    assert np.all(err <= scale.astype(np.float64)[:, None] * (0.5 + 1e-5))
    eq, es = quantize_reference_exact(x)
    np.testing.assert_array_equal(q, eq)
    np.testing.assert_array_equal(scale.view(np.uint32), es.view(np.uint32))
    g = plan.precision_guarantee()
    assert g.deterministic and g.bit_stable


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_special_rows_are_bit_exact(device, dtype):
    x = special_rows(dtype)
    q, scale = quantize(x, device)[:2]
    eq, es = quantize_reference_exact(x)
    np.testing.assert_array_equal(q, eq)
    np.testing.assert_array_equal(scale.view(np.uint32), es.view(np.uint32))
    # The documented cases, by hand: ties to even, zero row, flushed and underflowing rows.
    assert scale[0] == 1.0 and q[0].tolist() == [127, 0, 2, 2, 0, -2, 126, -126]
    assert scale[1] == 0 and scale[2] == 0 and scale[3] == 0
    assert not q[1:4].any()
    assert q[6, 0] == 0 and q[6, 3] != 0  # NaN quantizes to 0, the rest of its row does not
    # A second host run and the device run give the same bits as the first host run. Exact
    # equality is legitimate on a GPU too: the kernel flushes f32 subnormals itself (so
    # NVRTC's -ftz=true changes nothing) and has no multiply feeding an add that FMA
    # contraction could fuse (x / scale, then a rounding; s * q alone).
    hq, hs = quantize(x, "cpu")[:2]
    np.testing.assert_array_equal(q, hq)
    np.testing.assert_array_equal(_bits(scale), _bits(hs))


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_near_ties_are_bit_exact(device, dtype):
    """x/scale within an ulp of k + 0.5: division vs reciprocal or f32 vs f64 math differ here."""
    rng = np.random.default_rng(8)
    s = rng.uniform(0.01, 10, 64)
    x = (rng.integers(-126, 126, (64, 64)) + 0.5) * s[:, None]
    x[:, 0] = 127 * s
    x = x.astype(dtype)
    q, scale = quantize(x, device)[:2]
    eq, es = quantize_reference_exact(x)
    np.testing.assert_array_equal(q, eq)
    np.testing.assert_array_equal(scale.view(np.uint32), es.view(np.uint32))


@pytest.mark.parametrize("n,d", [(0, 5), (5, 0), (0, 0)])
def test_quantize_empty_extents(device, n, d):
    q, scale = quantize(np.zeros((n, d), np.float32), device)[:2]
    assert q.shape == (n, d) and np.all(scale == 0)  # D == 0: every row is a zero row


# -- quantize backward (straight-through) ------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("grad_dtype", DTYPES)
def test_quantize_backward_is_straight_through(device, dtype, grad_dtype):
    n, d = 13, 300
    d_q = random((n, d), grad_dtype, seed=2, low=-50, high=50)
    d_q[0, :2] = np.array([1e-39, -1e-39]).astype(grad_dtype)  # f32 subnormals: flushed
    d_x = on(device, np.full((n, d), 3, dtype))
    desc = gp.QuantizePerTokenBackwardDescriptor(n, d, dtype)  # d_q's dtype: the array's
    plan = run_plan(gp.QuantizePerTokenBackwardPlan, desc,
                    gp.QuantizePerTokenBackwardArgs(on(device, d_q), d_x), device)
    if np.dtype(dtype) == np.dtype(grad_dtype):
        np.testing.assert_array_equal(_bits(d_x), d_q.view(np.uint8))
    else:
        assert_close(d_x, f64(d_q), dtype)
        expect = flush_f32(d_q).astype(dtype)
        np.testing.assert_array_equal(_bits(d_x), expect.view(np.uint8))
    assert plan.precision_guarantee().bit_stable


@pytest.mark.parametrize("n,d", [(0, 4), (4, 0)])
def test_quantize_backward_empty(device, n, d):
    d_x = on(device, np.full((n, d), 3, np.float32))
    plan = run_plan(gp.QuantizePerTokenBackwardPlan, gp.QuantizePerTokenBackwardDescriptor(n, d),
                    gp.QuantizePerTokenBackwardArgs(on(device, np.zeros((n, d), gp.bfloat16)),
                                                    d_x), device)
    assert plan.sku().dtype == "f32"
    out = gp.functional.quantize_per_token_backward(on(device, np.zeros((n, d), np.float16)),
                                                    dtype=np.float64)
    assert out.shape == (n, d) and out.dtype == np.float64


# -- dequantize and its backward ---------------------------------------------------------------


def _q_and_scale(n: int, d: int, seed: int = 4):
    rng = np.random.default_rng(seed)
    q = rng.integers(-127, 128, size=(n, d)).astype(np.int8)
    scale = rng.uniform(1e-3, 2.0, size=n).astype(np.float32)
    if n > 2:
        scale[1] = 0.0
        scale[2] = np.float32(1e-39)  # subnormal scale: flushed to zero
    return q, scale


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", SHAPES)
def test_dequantize_matches_reference(device, dtype, n, d):
    q, scale = _q_and_scale(n, d)
    y = on(device, np.full((n, d), 7, dtype))
    plan = run_plan(gp.DequantizePerTokenPlan, gp.DequantizePerTokenDescriptor(n, d, dtype),
                    gp.DequantizePerTokenArgs(on(device, q), on(device, scale), y), device)
    assert_close(y, scale_reference64(scale)[:, None] * q, dtype)
    np.testing.assert_array_equal(_bits(y), scaled_reference_exact(scale, q, dtype).view(np.uint8))
    assert plan.precision_guarantee().deterministic


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", SHAPES)
def test_dequantize_backward_matches_reference(device, dtype, n, d):
    _, scale = _q_and_scale(n, d)
    d_out = random((n, d), dtype, seed=6, low=-10, high=10)
    if n > 3:
        d_out[3, 0] = np.asarray(1e-39).astype(dtype)  # a subnormal gradient (0 in f16)
    d_in = on(device, np.full((n, d), 7, dtype))
    plan = run_plan(gp.DequantizePerTokenBackwardPlan,
                    gp.DequantizePerTokenBackwardDescriptor(n, d, dtype),
                    gp.DequantizePerTokenBackwardArgs(on(device, scale), on(device, d_out), d_in),
                    device)
    g64 = f64(d_out) if np.dtype(dtype) == np.float64 else f64(flush_f32(d_out))
    expect64 = scale_reference64(scale)[:, None] * g64
    assert_close(d_in, expect64, dtype)
    np.testing.assert_array_equal(_bits(d_in),
                                  scaled_reference_exact(scale, d_out, dtype).view(np.uint8))
    g = plan.precision_guarantee()
    assert g.deterministic and g.bit_stable


@pytest.mark.parametrize("n,d", [(0, 5), (5, 0)])
def test_dequantize_empty_extents_touch_nothing(device, n, d):
    y = on(device, np.full((n, d), 7, np.float32))
    run_plan(gp.DequantizePerTokenPlan, gp.DequantizePerTokenDescriptor(n, d),
             gp.DequantizePerTokenArgs(on(device, np.zeros((n, d), np.int8)),
                                       on(device, np.ones(n, np.float32)), y), device)
    gi = on(device, np.full((n, d), 7, np.float32))
    run_plan(gp.DequantizePerTokenBackwardPlan, gp.DequantizePerTokenBackwardDescriptor(n, d),
             gp.DequantizePerTokenBackwardArgs(on(device, np.ones(n, np.float32)),
                                               on(device, np.ones((n, d), np.float32)), gi),
             device)
    assert np.all(gp.to_host(y) == 7) and np.all(gp.to_host(gi) == 7)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_error_is_half_a_step(device, dtype):
    x = random((17, 130), dtype, seed=9, low=-8, high=8)
    q, scale = gp.functional.quantize_per_token(on(device, x))
    y = gp.functional.dequantize_per_token(q, scale, np.float64)
    step = f64(scale)[:, None]
    assert np.all(np.abs(f64(y) - f64(x)) <= step * (0.5 + 1e-5))


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("plan_cls,desc_cls", [
    (gp.QuantizePerTokenPlan, gp.QuantizePerTokenDescriptor),
    (gp.QuantizePerTokenBackwardPlan, gp.QuantizePerTokenBackwardDescriptor),
    (gp.DequantizePerTokenPlan, gp.DequantizePerTokenDescriptor),
    (gp.DequantizePerTokenBackwardPlan, gp.DequantizePerTokenBackwardDescriptor),
])
def test_descriptor_errors(plan_cls, desc_cls):
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match=f"{plan_cls.op}: argument 'n'"):
        plan_cls.select(s, desc_cls(-1, 4))
    with pytest.raises(gp.InvalidProblem, match="'d'.*>= 0.*-3"):
        plan_cls.select(s, desc_cls(2, -3))
    with pytest.raises(gp.Unsupported, match="'dtype'.*i32"):
        plan_cls.select(s, desc_cls(2, 4, np.int32))
    with pytest.raises(gp.Unsupported, match="nvrtc requested"):
        plan_cls.select(s, desc_cls(2, 4), gp.PlanPreference(backend=gp.BackendKind.NVRTC))
    assert plan_cls.select(s, desc_cls(2, 4), gp.PlanPreference(deterministic=True))


def test_quantize_backward_rejects_bad_grad_dtype(device):
    s = stream_for(device)
    plan = gp.QuantizePerTokenBackwardPlan.select(s, gp.QuantizePerTokenBackwardDescriptor(2, 4))
    d_x = on(device, np.full((2, 4), 9, np.float32))
    for bad in (np.int8, np.int32):
        assert_rejected(lambda bad=bad: plan.run(s, None, gp.QuantizePerTokenBackwardArgs(
            on(device, np.ones((2, 4), bad)), d_x)), gp.Unsupported, [d_x],
            "quantize_per_token_backward", "'d_q'", "f32 or f64 or f16 or bf16")


def test_quantize_argument_errors_leave_outputs_untouched(device):
    n, d = 5, 6
    s = stream_for(device)
    x = on(device, random((n, d), np.float32))
    q = on(device, np.full((n, d), 9, np.int8))
    scale = on(device, np.full((n,), 9, np.float32))
    plan = gp.QuantizePerTokenPlan.select(s, gp.QuantizePerTokenDescriptor(n, d, np.float32))

    def run(**kw):
        a = dict(x=x, q=q, scale=scale) | kw
        return lambda: plan.run(s, gp.Workspace.none(), gp.QuantizePerTokenArgs(**a))

    outs = [q, scale]
    assert_rejected(run(x=x.astype(np.float16)), gp.Unsupported, outs,
                    "quantize_per_token", "'x'", "f32", "f16")
    assert_rejected(run(q=on(device, np.zeros((n, d), np.int16))), gp.Unsupported, outs,
                    "'q'", "i8")
    assert_rejected(run(scale=on(device, np.zeros(n, np.float64))), gp.Unsupported, outs,
                    "'scale'", "f32", "f64")
    assert_rejected(run(scale=on(device, np.zeros(n - 1, np.float32))), gp.BufferTooSmall,
                    outs, "'scale'", "5", "4")
    assert_rejected(run(x=x.reshape(d, n)), gp.InvalidProblem, outs, "'x'", "(5, 6)", "(6, 5)")
    assert_rejected(run(q=on(device, np.zeros((n, 2 * d), np.int8))[:, ::2]), gp.InvalidProblem,
                    outs, "'q'", "contiguous")
    alias = on(device, np.zeros((n, d), np.float32))
    assert_rejected(run(x=alias, scale=alias[0, :n]), gp.InvalidProblem, [q, alias], "'scale'",
                    "distinct")
    if device == "cuda":
        assert_rejected(run(x=gp.to_host(x)), gp.InvalidProblem, outs, "'x'", "host")


def test_dequantize_argument_errors_leave_outputs_untouched(device):
    n, d = 4, 3
    s = stream_for(device)
    q = on(device, np.ones((n, d), np.int8))
    scale = on(device, np.ones(n, np.float32))
    y = on(device, np.full((n, d), 9, gp.bfloat16))
    plan = gp.DequantizePerTokenPlan.select(s, gp.DequantizePerTokenDescriptor(n, d, gp.bfloat16))

    def run(**kw):
        a = dict(q=q, scale=scale, y=y) | kw
        return lambda: plan.run(s, None, gp.DequantizePerTokenArgs(**a))

    assert_rejected(run(q=q.astype(np.uint8)), gp.Unsupported, [y], "dequantize_per_token",
                    "'q'", "i8", "uint8")
    assert_rejected(run(y=on(device, np.zeros((n, d), np.float16))), gp.Unsupported, [y], "'y'",
                    "bf16", "f16")
    assert_rejected(run(y=on(device, np.zeros((n, d - 1), gp.bfloat16))), gp.BufferTooSmall,
                    [y], "'y'", "12", "8")
    assert_rejected(run(scale=on(device, np.ones((n, 1), np.float32))), gp.InvalidProblem, [y],
                    "'scale'", "(4,)", "(4, 1)")


def test_backward_argument_errors_leave_outputs_untouched(device):
    n, d = 4, 3
    s = stream_for(device)
    scale = on(device, np.ones(n, np.float32))
    g = on(device, random((n, d), np.float64))
    d_in = on(device, np.full((n, d), 9, np.float64))
    plan = gp.DequantizePerTokenBackwardPlan.select(
        s, gp.DequantizePerTokenBackwardDescriptor(n, d, np.float64))
    args = gp.DequantizePerTokenBackwardArgs
    assert_rejected(lambda: plan.run(s, None, args(scale, g.astype(np.float32), d_in)),
                    gp.Unsupported, [d_in], "dequantize_per_token_backward", "'d_output'")
    assert_rejected(lambda: plan.run(s, None, args(scale, g, d_in[:, :2])), gp.BufferTooSmall,
                    [d_in], "'d_input'")
    assert_rejected(lambda: plan.run(s, None, args(scale, d_in, d_in)), gp.InvalidProblem,
                    [d_in], "'d_input'", "distinct")
    qb = gp.QuantizePerTokenBackwardPlan.select(
        s, gp.QuantizePerTokenBackwardDescriptor(n, d, np.float64))
    qargs = gp.QuantizePerTokenBackwardArgs
    f32_out = on(device, np.full((n, d), 9, np.float32))
    assert_rejected(lambda: qb.run(s, None, qargs(g, f32_out)), gp.Unsupported, [f32_out],
                    "quantize_per_token_backward", "'d_x'", "f64", "f32")
    assert_rejected(lambda: qb.run(s, None, qargs(d_in, d_in)), gp.InvalidProblem, [d_in],
                    "'d_x'", "distinct")
    assert_rejected(lambda: qb.run(s, None, qargs(g.astype(np.float32).T, d_in)),
                    gp.InvalidProblem, [d_in], "'d_q'", "(4, 3)")


@pytest.mark.parametrize("dtype", DTYPES)
def test_plans_through_check_plan(device, dtype):
    """Results against the references, then every malformed operand the specs imply."""
    n, d = 6, 40
    x = random((n, d), dtype, seed=1, low=-3, high=3)
    q, scale = _q_and_scale(n, d)
    g = random((n, d), dtype, seed=2)
    check_plan(gp.QuantizePerTokenPlan, gp.QuantizePerTokenDescriptor(n, d, dtype), {"x": x},
               lambda **_: dict(zip(("q", "scale"), quantize_reference_exact(x),
                                    strict=True)), device=device)
    check_plan(gp.QuantizePerTokenBackwardPlan, gp.QuantizePerTokenBackwardDescriptor(n, d, dtype),
               {"d_q": g}, lambda d_q, d_x: d_q, device=device)
    check_plan(gp.DequantizePerTokenPlan, gp.DequantizePerTokenDescriptor(n, d, dtype),
               {"q": q, "scale": scale},
               lambda q, scale, y: scale_reference64(scale)[:, None] * q, device=device)
    check_plan(gp.DequantizePerTokenBackwardPlan,
               gp.DequantizePerTokenBackwardDescriptor(n, d, dtype),
               {"scale": scale, "d_output": g},
               lambda scale, d_output, d_input: scale_reference64(scale)[:, None] * d_output,
               device=device)


# -- functional API and SKUs -------------------------------------------------------------------


def test_functional_api():
    x = random((6, 10), gp.bfloat16, seed=1)
    q, scale = gp.functional.quantize_per_token(x)
    assert (q.dtype, q.shape, scale.dtype, scale.shape) == (np.int8, (6, 10), np.float32, (6,))
    eq, es = quantize_reference_exact(x)
    np.testing.assert_array_equal(q, eq)
    np.testing.assert_array_equal(scale, es)
    xt = random((10, 6), np.float32).T  # a strided view is made contiguous first
    np.testing.assert_array_equal(gp.functional.quantize_per_token(xt)[0],
                                  quantize_reference_exact(np.ascontiguousarray(xt))[0])
    y = gp.functional.dequantize_per_token(q, scale, np.float16)
    assert y.dtype == np.float16 and y.shape == (6, 10)
    d = random((6, 10), np.float32, seed=3)
    np.testing.assert_array_equal(gp.functional.quantize_per_token_backward(d), d)
    dx = gp.functional.quantize_per_token_backward(d, dtype=gp.bfloat16)
    assert dx.dtype == gp.bfloat16
    di = gp.functional.dequantize_per_token_backward(scale, d)
    np.testing.assert_array_equal(di, scaled_reference_exact(scale, d, np.float32))
    with pytest.raises(gp.InvalidProblem, match="quantize_per_token: argument 'x'.*rank-2"):
        gp.functional.quantize_per_token(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(gp.Unsupported, match="dtype"):
        gp.functional.quantize_per_token(np.zeros((2, 3), np.int32))


def test_host_skus():
    s = gp.Stream.host()
    for dtype in FLOAT_DTYPES:
        plan = gp.QuantizePerTokenPlan.select(s, gp.QuantizePerTokenDescriptor(3, 4, dtype))
        sku = plan.sku()
        assert (sku.op, sku.backend, sku.arch, sku.variant) == (
            "quantize_per_token", gp.BackendKind.NUMPY, "host", "numpy")
        assert sku.dtype == gp.dtypes.short_name(dtype) and sku.index_dtype is None
        g = plan.precision_guarantee()
        assert g.accumulator == ("f64" if dtype == np.float64 else "f32")
        assert plan.workspace_size() == 0


@pytest.mark.gpu
def test_device_skus():
    s = gp.Stream.current()
    for plan_cls, desc in [(gp.QuantizePerTokenPlan, gp.QuantizePerTokenDescriptor(3, 4)),
                           (gp.DequantizePerTokenPlan, gp.DequantizePerTokenDescriptor(3, 4)),
                           (gp.DequantizePerTokenBackwardPlan,
                            gp.DequantizePerTokenBackwardDescriptor(3, 4))]:
        plan = plan_cls.select(s, desc, gp.PlanPreference(deterministic=True))
        assert plan.sku().variant == "row" and plan.sku().backend is gp.BackendKind.NVRTC
        assert plan.precision_guarantee().bit_stable
    # One SKU copies d_q, or converts it when its dtype (taken from the array) differs.
    qb = gp.QuantizePerTokenBackwardPlan.select(s, gp.QuantizePerTokenBackwardDescriptor(3, 4,
                                                                                       gp.bfloat16))
    assert qb.sku().variant == "copy" and qb.sku().dtype == "bf16"
    d_q = random((3, 4), np.float32, seed=1)
    for g in (d_q.astype(gp.bfloat16), d_q):
        d_x = on("cuda", np.zeros((3, 4), gp.bfloat16))
        qb.run(s, None, gp.QuantizePerTokenBackwardArgs(on("cuda", g), d_x))
        np.testing.assert_array_equal(_bits(d_x), d_q.astype(gp.bfloat16).view(np.uint8))
    with pytest.raises(gp.Unsupported, match="cublas requested"):
        gp.QuantizePerTokenPlan.select(s, gp.QuantizePerTokenDescriptor(3, 4),
                                       gp.PlanPreference(backend=gp.BackendKind.CUBLAS))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,d", [(524288 + 37, 3), (3, 5000), (1000, 4096)])
def test_device_bit_identical_to_host_on_large_shapes(dtype, n, d, monkeypatch):
    """More rows than the grid (grid-stride), rows longer than the block, a realistic size.
    Bits equal to the host's: FTZ is explicit in the kernel and there is nothing to contract
    into an FMA (see test_quantize_special_rows_are_bit_exact). On the emulated device the
    grid cap is lowered to 64 blocks and the shapes shrunk (the same grid-stride loops, in
    seconds instead of minutes); a GPU runs the real sizes."""
    if gp.backend.resolve_device("cuda") == "emulated":
        from gpuplan.ops.quantize import plans as quantize_plans

        monkeypatch.setattr(quantize_plans, "_MAX_GRID", 64)
        n, d = min(n, 64 * 3 + 37), min(d, 1100)
    x = random((n, d), dtype, seed=n, low=-6, high=6)
    hq, hs = quantize(x, "cpu")[:2]
    dq, ds = quantize(x, "cuda")[:2]
    np.testing.assert_array_equal(dq, hq)
    np.testing.assert_array_equal(_bits(ds), _bits(hs))
    y_host = gp.functional.dequantize_per_token(hq, hs, dtype)
    y_dev = gp.functional.dequantize_per_token(on("cuda", hq), on("cuda", hs), dtype)
    np.testing.assert_array_equal(_bits(y_dev), _bits(y_host))
    g_host = gp.functional.dequantize_per_token_backward(hs, x)
    g_dev = gp.functional.dequantize_per_token_backward(on("cuda", hs), on("cuda", x))
    np.testing.assert_array_equal(_bits(g_dev), _bits(g_host))
