"""SwiGLU plans against the float64 reference on host and device: dtypes, odd and empty sizes,
saturated gates, the fused result against silu then multiply, and bad input named by op,
argument, expectation and value (every malformed operand the spec implies)."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.swiglu.reference import swiglu_backward_reference, swiglu_reference
from gpuplan.testing import check_plan, f64, on, random
from tests.helpers import DTYPES

F = gp.functional
SIZES = [1, 7, 37, 4099]


def _inputs(n, dtype):
    gate = random((n,), dtype, seed=n, low=-8.0, high=8.0)
    return gate, random((n,), dtype, seed=n + 1, low=-2.0, high=2.0), random((n,), dtype,
                                                                              seed=n + 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_forward(device, dtype, n):
    gate, up, _ = _inputs(n, dtype)
    check_plan(gp.SwigluPlan, gp.SwigluDescriptor(n, dtype), {"gate": gate, "up": up},
               lambda gate, up, **_: swiglu_reference(gate, up), device=device, scale=4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_backward(device, dtype, n):
    gate, up, dy = _inputs(n, dtype)

    def reference(gate, up, dy, **_):
        dg, du = swiglu_backward_reference(gate, up, dy)
        return {"dgate": dg, "dup": du}

    check_plan(gp.SwigluBackwardPlan, gp.SwigluDescriptor(n, dtype),
               {"gate": gate, "up": up, "dy": dy}, reference, device=device, scale=4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_and_shapes(device, dtype):
    for shape in [(0,), (3, 0), (2, 3, 5)]:
        gate, up = (on(device, random(shape, dtype, seed=s)) for s in (1, 2))
        y = F.swiglu(gate, up)
        dg, du = F.swiglu_backward(gate, up, y)
        assert y.shape == dg.shape == du.shape == shape and y.dtype == dtype


def test_saturated_gates_stay_finite(device):
    """exp(-g) overflows to inf for g << 0: silu -> -0, its gradient -> 0, never NaN."""
    gate = np.array([-1e4, -100.0, 100.0, 1e4], np.float32)
    up, dy = np.full(4, 2.0, np.float32), np.ones(4, np.float32)
    y = f64(F.swiglu(on(device, gate), on(device, up)))
    dg, du = (f64(a) for a in F.swiglu_backward(on(device, gate), on(device, up),
                                                on(device, dy)))
    np.testing.assert_allclose(y, [0.0, 0.0, 200.0, 2e4], atol=1e-30)
    np.testing.assert_allclose(dg, [0.0, 0.0, 2.0, 2.0], atol=1e-30)
    np.testing.assert_allclose(du, [0.0, 0.0, 100.0, 1e4], atol=1e-30)


def test_f32_equals_silu_then_multiply(device):
    """In float32 the fused op gives the composed activation and binary plans' bits."""
    gate, up, _ = _inputs(1000, np.float32)
    g, u = on(device, gate), on(device, up)
    fused = f64(F.swiglu(g, u))
    composed = f64(F.binary("mul", F.unary("silu", g), u))
    np.testing.assert_array_equal(fused, composed)


@pytest.mark.parametrize("call,arg", [
    (lambda g, u: F.swiglu(g, u[:-1]), "argument 'up': expected shape (6,) like 'gate'"),
    (lambda g, u: F.swiglu_backward(g, u, u.reshape(2, 3)),
     "argument 'dy': expected shape (6,) like 'gate', given shape (2, 3)"),
    (lambda g, u: F.swiglu(g, u.astype(np.float64)),
     "swiglu: argument 'up': expected dtype f32"),
    (lambda g, u: F.swiglu(g.astype(np.int32), u.astype(np.int32)),
     "swiglu: argument 'dtype': expected dtype in"),
])
def test_bad_functional_input(call, arg):
    g, u = random((6,), np.float32, seed=1), random((6,), np.float32, seed=2)
    with pytest.raises(gp.GpuPlanError) as err:
        call(g, u)
    assert arg in str(err.value), str(err.value)
