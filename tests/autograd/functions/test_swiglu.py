"""F.swiglu: gradcheck in float64, values and gradients against silu(gate) * up composed from
other Functions, the dtype sweep, and argument errors."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from gpuplan.ops.swiglu.reference import swiglu_reference
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _x(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-4, 4, shape)


def test_gradcheck(device):
    gradcheck_on(device, F.swiglu, _x(3, 7), _x(3, 7, seed=1))


def test_values_and_grads_equal_the_composition(device):
    g, u = _x(4, 9, seed=2), _x(4, 9, seed=3)
    cot = _x(4, 9, seed=4)
    results = []
    for fn in (F.swiglu, lambda a, b: F.silu(a) * b):
        a, b = (ag.tensor(v, requires_grad=True, device=device) for v in (g, u))
        y = fn(a, b)
        y.backward(cot)
        results.append((y.numpy(), a.grad.numpy(), b.grad.numpy()))
    for fused, composed in zip(*results, strict=True):
        np.testing.assert_allclose(fused, composed, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(results[0][0], swiglu_reference(g, u), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    check_dtypes(F.swiglu, [_x(3, 37, seed=5), _x(3, 37, seed=6)], device, [dtype], scale=4)


def test_only_needed_grads(device):
    g = ag.tensor(_x(2, 3), requires_grad=True, device=device)
    u = ag.tensor(_x(2, 3, seed=1), device=device)
    F.swiglu(g, u).sum().backward()
    assert g.grad is not None and u.grad is None


@pytest.mark.parametrize("up_shape,dtype", [((2, 4), np.float64), ((2, 3), np.float32)])
def test_errors(up_shape, dtype):
    with pytest.raises(ValueError, match="swiglu: gate and up must have one shape and dtype"):
        F.swiglu(ag.tensor(_x(2, 3)), ag.tensor(_x(*up_shape).astype(dtype)))
