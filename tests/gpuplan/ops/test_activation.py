"""Activation plans (unary forward and backward) against float64 NumPy references, on host
and device."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from gpuplan.host_math import erf
from gpuplan.ops.activation.plans import UNARY_OPS
from gpuplan.ops.activation.reference import (
    REFERENCE_OPS,
    unary_backward_reference,
    unary_derivative_reference,
    unary_reference,
)
from gpuplan.testing import assert_close, assert_rejected, f64, on, random, run_plan, stream_for
from tests.helpers import DTYPES, compile_with_enums

SIZES = [1, 37, 4099]  # odd sizes: scalar tails after the 16-byte packs
_ERF = np.vectorize(math.erf)


def _alpha(op):
    return -1.75 if op == "scale" else None


#: run-time scalars per op (clamp: both bounds; the one-sided forms are tested below).
def _scalars(op):
    return {"scale": {"alpha": -1.75}, "clamp": {"alpha": -1.25, "beta": 0.75}}.get(op, {})


#: inputs drawn from [low, 3]: the ops defined for positive inputs only stay off 0.
def _low(op):
    return 0.25 if op in ("log", "sqrt", "rsqrt") else -3


class _ReferenceUnary(ag.Function):
    """The float64 references as an autograd Function: forward unary_reference, backward
    dy * unary_derivative_reference, so that ag.gradcheck can check one against the other."""

    @staticmethod
    def forward(ctx, x, op, scalars):
        ctx.saved = (x, op, scalars)
        return unary_reference(op, x, **scalars)

    @staticmethod
    def backward(ctx, dy):
        x, op, scalars = ctx.saved
        return dy * unary_derivative_reference(op, x, **scalars)


@pytest.mark.parametrize("op", UNARY_OPS)
def test_reference_derivative_passes_gradcheck(op):
    # relu's and abs's kink (0) and clamp's bounds stay off the stencil
    x = ag.tensor(np.linspace(_low(op), 3, 101) + 0.013, requires_grad=True)
    assert ag.gradcheck(lambda x: _ReferenceUnary.apply(x, op=op, scalars=_scalars(op)), [x],
                        rtol=1e-6, atol=1e-7)


# -- the float64 references themselves: against the math, and against the host SKU ------

_E = math.e
#: (op, scalars, x, f(x), f'(x)) worked out by hand or to 30 digits (mpmath), rounded to
#: float64: Phi(1) = 0.84134474606854293, phi(1) = 0.24197072451914337,
#: gelu_tanh(1) = (1 + tanh(sqrt(2/pi) * 1.044715)) / 2, sigmoid(1) = 1 / (1 + 1/e), ...
HAND_VALUES = [
    ("relu", {}, -1.0, 0.0, 0.0), ("relu", {}, 2.0, 2.0, 1.0),
    ("gelu", {}, 0.0, 0.0, 0.5),
    ("gelu", {}, 1.0, 0.8413447460685429, 1.0833154705876864),
    ("gelu", {}, -1.0, -0.15865525393145705, -0.0833154705876863),
    ("gelu_tanh", {}, 0.0, 0.0, 0.5),
    ("gelu_tanh", {}, 1.0, 0.8411919906082767, 1.0829640838457826),
    ("silu", {}, 0.0, 0.0, 0.5), ("silu", {}, 1.0, 0.7310585786300049, 0.9276705118714867),
    ("tanh", {}, 0.0, 0.0, 1.0), ("tanh", {}, 1.0, 0.7615941559557649, 0.4199743416140261),
    ("exp", {}, 0.0, 1.0, 1.0), ("exp", {}, 1.0, _E, _E),
    ("neg", {}, 2.0, -2.0, -1.0),
    ("scale", {"alpha": -1.75}, 2.0, -3.5, -1.75),
    ("log", {}, 1.0, 0.0, 1.0), ("log", {}, _E, 1.0, 1 / _E),
    ("sqrt", {}, 4.0, 2.0, 0.25),
    ("rsqrt", {}, 4.0, 0.5, -1 / 16),
    ("sigmoid", {}, 0.0, 0.5, 0.25),
    ("sigmoid", {}, 2.0, 0.8807970779778824, 0.10499358540350652),
    ("abs", {}, -3.0, 3.0, -1.0), ("abs", {}, 0.0, 0.0, 0.0),
    ("clamp", {"alpha": -1.25, "beta": 0.75}, -2.0, -1.25, 0.0),
    ("clamp", {"alpha": -1.25, "beta": 0.75}, 0.75, 0.75, 1.0),
    ("clamp", {"alpha": -1.25, "beta": 0.75}, 1.0, 0.75, 0.0),
    ("clamp", {"alpha": None, "beta": 0.75}, -9.0, -9.0, 1.0),
    ("clamp", {"alpha": 1.0, "beta": -1.0}, 0.0, -1.0, 0.0),  # min > max gives max
]


def test_the_reference_defines_every_op():
    assert REFERENCE_OPS == UNARY_OPS
    assert {op for op, *_ in HAND_VALUES} == set(UNARY_OPS)  # each checked by hand below
    with pytest.raises(KeyError, match="softplus"):
        unary_reference("softplus", np.zeros(1))


@pytest.mark.parametrize("op,scalars,x,y,dydx", HAND_VALUES,
                         ids=[f"{v[0]}({v[2]:g})" for v in HAND_VALUES])
def test_reference_hand_values(op, scalars, x, y, dydx):
    xs = np.array([x])
    np.testing.assert_allclose(unary_reference(op, xs, **scalars), [y], rtol=1e-14, atol=0)
    np.testing.assert_allclose(unary_derivative_reference(op, xs, **scalars), [dydx],
                               rtol=1e-14, atol=0)
    np.testing.assert_allclose(unary_backward_reference(op, xs, np.array([-3.0]), **scalars),
                               [-3.0 * dydx], rtol=1e-14, atol=0)


#: wide inputs and the edge values whose conventions the family declares (signed zeros,
#: infinities, NaN, tiny and huge magnitudes).
_WIDE = np.concatenate([np.linspace(-40, 40, 2001), [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-300,
                                                      -1e-300, 700.0, -700.0, 1e5, -1e5]])


@pytest.mark.parametrize("op", UNARY_OPS)
def test_reference_matches_the_host_sku_in_float64(op):
    """Two independent codes for one definition: the host SKU run in float64 and the
    reference agree to ~1e-12 everywhere, edge values (NaN and infinities placed alike)
    included, forward and backward; so a wrong formula in either shows here."""
    n, sc = _WIDE.size, _scalars(op)
    dy = random((n,), np.float64, seed=3, low=-2, high=2)
    y, dx = np.full(n, 7.0), np.full(n, 7.0)
    run_plan(gp.UnaryPlan, gp.UnaryDescriptor(op, n, np.float64), gp.UnaryArgs(_WIDE, y, **sc),
             "cpu")
    run_plan(gp.UnaryBackwardPlan, gp.UnaryDescriptor(op, n, np.float64),
             gp.UnaryBackwardArgs(_WIDE, dy, dx, **sc), "cpu")
    # atol: where the host cancels (1 + erf, 1 - tanh^2 in the tails) the reference does not
    np.testing.assert_allclose(y, unary_reference(op, _WIDE, **sc), rtol=1e-12, atol=1e-13,
                               err_msg=op)
    np.testing.assert_allclose(dx, unary_backward_reference(op, _WIDE, dy, **sc), rtol=1e-12,
                               atol=1e-13, err_msg=op)


def test_reference_masking_gradients_ignore_dy():
    """relu, abs and clamp pass no dy where their derivative is 0, even a NaN or inf dy (as
    the kernels' selects do); a smooth op's 0 * inf stays NaN."""
    dy = np.array([np.nan, np.inf, -np.inf])
    for op, sc, x in (("relu", {}, [-1.0, 0.0, np.nan]), ("abs", {}, [0.0, np.nan, -0.0]),
                      ("clamp", {"alpha": 1.0, "beta": 2.0}, [0.0, 3.0, np.nan])):
        np.testing.assert_array_equal(unary_backward_reference(op, np.array(x), dy, **sc), 0.0,
                                      err_msg=op)
    assert np.isnan(unary_backward_reference("exp", np.array([-1e4]), np.array([np.inf]))[0])


def test_host_erf_is_accurate():
    x = np.concatenate([np.linspace(-7, 7, 3001), [0.0, 2.999999, 3.0, 3.000001, 1e-300]])
    np.testing.assert_allclose(erf(x), _ERF(x), rtol=1e-14, atol=2e-15)
    assert erf(np.array([np.inf, -np.inf])).tolist() == [1.0, -1.0]
    assert np.isnan(erf(np.array([np.nan])))[0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", UNARY_OPS)
@pytest.mark.parametrize("n", SIZES)
def test_unary_forward_and_backward(device, dtype, op, n):
    x = random((n,), dtype, low=_low(op), high=3)
    dy = random((n,), dtype, seed=1)
    sc = _scalars(op)
    y = on(device, np.full((n,), 7, dtype))
    plan = run_plan(gp.UnaryPlan, gp.UnaryDescriptor(op, n, dtype),
                    gp.UnaryArgs(on(device, x), y, **sc), device)
    assert_close(y, unary_reference(op, x, **sc), dtype, scale=4, err_msg=op)
    assert plan.precision_guarantee().bit_stable
    dx = on(device, np.full((n,), 7, dtype))
    run_plan(gp.UnaryBackwardPlan, gp.UnaryBackwardDescriptor(op, n, dtype),
             gp.UnaryBackwardArgs(on(device, x), on(device, dy), dx, **sc), device)
    assert_close(dx, unary_backward_reference(op, x, dy, **sc), dtype, scale=4, err_msg=op)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_gelu_backward_given_the_forward_output(device, dtype, n):
    """With y = gelu(x) given, the host f32 SKU takes Phi = y / x (no erf); every SKU meets
    the float64 reference as without y, also at x = +-0, tiny and large |x|."""
    x = random((n,), dtype, low=-7, high=7)
    x[: min(n, 6)] = np.array([0.0, -0.0, 1e-30, -1e-30, -30.0, 30.0])[: min(n, 6)]
    dy = random((n,), dtype, seed=1)
    y = gp.functional.unary("gelu", on(device, x))
    dx = on(device, np.full((n,), 7, dtype))
    run_plan(gp.UnaryBackwardPlan, gp.UnaryBackwardDescriptor("gelu", n, dtype),
             gp.UnaryBackwardArgs(on(device, x), on(device, dy), dx, y), device)
    assert_close(dx, unary_backward_reference("gelu", x, dy), dtype, scale=4)
    if n:  # Phi(0) = 1/2 exactly, not 0 / 0
        assert gp.to_host(dx)[0] == (dy[0] * np.asarray(0.5, dtype)).astype(dtype)


def test_gelu_backward_refuses_a_misshaped_output():
    x = np.ones((4, 3), np.float32)
    with pytest.raises(gp.InvalidProblem, match="unary_backward.*'y'"):
        gp.functional.unary_backward("gelu", x, x, y=np.ones((3, 4), np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_unaligned_views_match_aligned(device, dtype):
    """Offset views take the scalar path on the GPU; results equal the packed path's."""
    n = 1000
    buf = random((n + 1,), dtype, low=-3, high=3)
    dev = on(device, buf)
    outs = []
    for x in (dev[:n], dev[1:]):
        outs.append(gp.to_host(gp.functional.unary("gelu", x)))
    np.testing.assert_array_equal(outs[0][1:], gp.to_host(gp.functional.unary("gelu", dev[1:n])))
    np.testing.assert_array_equal(outs[1], gp.to_host(gp.functional.unary("gelu", dev[1:])))
    assert_close(outs[1], unary_reference("gelu", buf[1:]), dtype, scale=4)




def test_descriptor_and_scalar_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.Unsupported, match="unary: argument 'op'"):
        gp.UnaryPlan.select(s, gp.UnaryDescriptor("softplus", 3))
    with pytest.raises(gp.InvalidProblem, match="'numel'"):
        gp.UnaryPlan.select(s, gp.UnaryDescriptor("relu", -1))
    with pytest.raises(gp.Unsupported, match="dtype"):
        gp.UnaryPlan.select(s, gp.UnaryDescriptor("relu", 3, np.int32))
    x, y = np.ones(3, np.float32), np.full(3, 7, np.float32)
    scale = gp.UnaryPlan.select(s, gp.UnaryDescriptor("scale", 3))
    with pytest.raises(gp.InvalidProblem, match="unary: argument 'alpha'"):
        scale.run(s, None, gp.UnaryArgs(x, y))  # 'scale' needs its factor
    relu = gp.UnaryBackwardPlan.select(s, gp.UnaryBackwardDescriptor("relu", 3))
    with pytest.raises(gp.InvalidProblem, match="unary_backward: argument 'alpha'"):
        relu.run(s, None, gp.UnaryBackwardArgs(x, x, y, alpha=2.0))
    assert (y == 7).all()  # rejected calls wrote nothing


def test_empty_extents(device, monkeypatch):
    """numel 0: `run` returns before any kernel or NumPy body (both replaced by a failure)."""
    def launched(*_):
        raise AssertionError("an empty unary problem launched")

    for plan_cls in (gp.UnaryPlan, gp.UnaryBackwardPlan):
        for name in dir(plan_cls):
            if name.startswith("_run_"):
                monkeypatch.setattr(plan_cls, name, launched)
    z = on(device, np.zeros((0,), np.float32))
    run_plan(gp.UnaryPlan, gp.UnaryDescriptor("relu", 0), gp.UnaryArgs(z, z.copy()), device)
    run_plan(gp.UnaryBackwardPlan, gp.UnaryDescriptor("gelu", 0),
             gp.UnaryBackwardArgs(z, z.copy(), z.copy()), device)


def test_argument_errors_leave_outputs_untouched(device):
    s = stream_for(device)
    x = on(device, random((8,), np.float32))
    y = on(device, np.full((8,), 9, np.float32))
    unary = gp.UnaryPlan.select(s, gp.UnaryDescriptor("silu", 8))
    none = gp.Workspace.none()

    def run_unary(**kw):
        a = dict(x=x, y=y) | kw
        return lambda: unary.run(s, none, gp.UnaryArgs(**a))

    assert_rejected(run_unary(x=x.astype(np.float16)), gp.Unsupported, [y], "unary", "'x'",
                    "f32", "f16")
    assert_rejected(run_unary(y=on(device, np.zeros(7, np.float32))), gp.BufferTooSmall, [y],
                    "'y'", "8", "7")
    assert_rejected(run_unary(x=x.reshape(2, 4)), gp.InvalidProblem, [y], "'x'", "(8,)")
    assert_rejected(run_unary(y=x), gp.InvalidProblem, [x], "'y'", "distinct")
    if device == "cuda":
        assert_rejected(run_unary(x=gp.to_host(x)), gp.InvalidProblem, [y], "'x'")


def test_alpha_is_a_run_argument_not_a_new_plan():
    """A new clip factor every step must reuse one plan (runtime scalars are args)."""
    from gpuplan.execute import _PLANS
    x = random((5,), np.float32)
    before = len(_PLANS)
    for alpha in (0.5, 0.25, 3.0):
        np.testing.assert_array_equal(gp.functional.unary("scale", x, alpha=alpha),
                                      np.float32(alpha) * x)
    assert len(_PLANS) - before <= 1


def test_functional_api(device):
    x = on(device, random((3, 5, 7), gp.bfloat16))
    F = gp.functional
    y = F.unary("scale", x, alpha=2.0)
    assert y.shape == (3, 5, 7) and y.dtype == gp.bfloat16
    np.testing.assert_array_equal(f64(y), 2.0 * f64(x))  # exact: a power of two
    np.testing.assert_array_equal(f64(F.unary("neg", x)), -f64(x))
    assert_close(F.unary_backward("tanh", x, x), unary_backward_reference("tanh", x, x),
                 gp.bfloat16, scale=4)


def _compile_activation(names: tuple[str, ...]) -> None:
    """activation.cu's forward and backward for the last row of `names`, compiled."""
    from gpuplan.ops.activation import plans as activation
    last = len(names) - 1
    compile_with_enums(activation._MODULE.path,
                       [f"unary_forward<float, {last}>", f"unary_backward<float, {last}>"],
                       {"Activation": names})


def test_the_cuda_enum_is_generated_from_the_table():
    """The table as it is compiles; a row with no CUDA branch is a compile error."""
    _compile_activation(UNARY_OPS)
    with pytest.raises(Exception, match="activation without CUDA forward math"):
        _compile_activation(UNARY_OPS + ("softplus",))


def test_functional_rejects_what_flat_views_would_hide():
    """dy of a transposed shape has the same size: it used to pass through the flat views
    silently; a NaN clip factor used to scale every gradient to NaN."""
    x = np.ones((3, 4), np.float32)
    with pytest.raises(gp.InvalidProblem, match="unary_backward: argument 'dy': expected "
                                                r"shape \(3, 4\)"):
        gp.functional.unary_backward("gelu", x, np.ones((4, 3), np.float32))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(gp.InvalidProblem, match="unary: argument 'alpha': expected a "
                                                    "finite number"):
            gp.functional.unary("scale", x, alpha=bad)


def test_relu_propagates_nan_like_pytorch(device):
    """relu(nan) was 0 (x > 0 is False for NaN); torch.relu keeps NaN. Its gradient at NaN
    stays 0, as torch's threshold_backward gives."""
    x = on(device, np.array([np.nan, -1.0, 2.0, -np.inf, np.inf], np.float32))
    y = gp.to_host(gp.functional.unary("relu", x))
    np.testing.assert_array_equal(y, [np.nan, 0.0, 2.0, 0.0, np.inf])
    dx = gp.to_host(gp.functional.unary_backward("relu", x, on(device, np.ones(5, np.float32))))
    np.testing.assert_array_equal(dx, [0.0, 0.0, 1.0, 0.0, 1.0])


def test_edge_values_follow_pytorch(device):
    """log(0) = -inf, log/sqrt/rsqrt of a negative = NaN, rsqrt(0) = inf, NaN stays NaN;
    sqrt'(0) = inf as torch's grad / (2 sqrt x); abs'(0) = 0."""
    x = on(device, np.array([0.0, -1.0, np.nan, np.inf, 4.0], np.float32))
    ones = on(device, np.ones(5, np.float32))
    F = gp.functional
    want = {"log": [-np.inf, np.nan, np.nan, np.inf, np.log(4.0)],
            "sqrt": [0.0, np.nan, np.nan, np.inf, 2.0],
            "rsqrt": [np.inf, np.nan, np.nan, 0.0, 0.5],
            "abs": [0.0, 1.0, np.nan, np.inf, 4.0],
            "sigmoid": [0.5, 1 / (1 + np.e), np.nan, 1.0, 1 / (1 + np.exp(-4.0))]}
    for op, values in want.items():
        np.testing.assert_allclose(gp.to_host(F.unary(op, x)), values, rtol=1e-6, err_msg=op)
    np.testing.assert_allclose(gp.to_host(F.unary_backward("sqrt", x, ones))[[0, 4]],
                               [np.inf, 0.25])
    np.testing.assert_array_equal(gp.to_host(F.unary_backward("abs", x, ones))[[0, 1, 4]],
                                  [0.0, -1.0, 1.0])


def test_clamp_bounds_are_optional_run_arguments(device):
    """min only, max only, both, neither; min > max gives max (torch); NaN propagates and
    gets no gradient; the gradient passes where min <= x <= max (bounds included)."""
    from gpuplan.execute import _PLANS
    x = on(device, np.array([-2.0, -1.0, 0.0, 1.0, 2.0, np.nan], np.float64))
    F = gp.functional
    cases = [((-1.0, None), [-1, -1, 0, 1, 2, np.nan], [0, 1, 1, 1, 1, 0]),
             ((None, 1.0), [-2, -1, 0, 1, 1, np.nan], [1, 1, 1, 1, 0, 0]),
             ((-1.0, 1.0), [-1, -1, 0, 1, 1, np.nan], [0, 1, 1, 1, 0, 0]),
             ((None, None), [-2, -1, 0, 1, 2, np.nan], [1, 1, 1, 1, 1, 0]),
             ((1.0, -1.0), [-1, -1, -1, -1, -1, np.nan], [0, 0, 0, 0, 0, 0])]
    before = len(_PLANS)
    for (lo, hi), y, g in cases:
        np.testing.assert_array_equal(gp.to_host(F.unary("clamp", x, alpha=lo, beta=hi)), y)
        dx = F.unary_backward("clamp", x, gp.full((6,), 3.0, np.float64, device), alpha=lo,
                              beta=hi)
        np.testing.assert_array_equal(gp.to_host(dx), 3.0 * np.array(g, np.float64))
    assert len(_PLANS) - before <= 2  # one forward, one backward plan for every bound
    for bad in (float("nan"), "1", True):
        with pytest.raises(gp.InvalidProblem, match="unary: argument 'beta': expected None "
                                                    "or a number"):
            F.unary("clamp", x, beta=bad)
    with pytest.raises(gp.InvalidProblem, match="unary: argument 'beta': expected None "
                                                "\\('log' takes no beta\\)"):
        F.unary("log", x, beta=1.0)
