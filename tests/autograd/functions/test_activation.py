"""relu, gelu (erf and tanh), silu, tanh, exp: gradcheck, reference values, dtype sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from tests.autograd.functions.helpers import check_dtypes, gradcheck_on
from tests.plan_testing import DTYPES

_erf = np.vectorize(math.erf)
REFERENCE = {
    "relu": (F.relu, lambda x: np.maximum(x, 0)),
    "gelu": (F.gelu, lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))),
    "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"),
                  lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))),
    "silu": (F.silu, lambda x: x / (1 + np.exp(-x))),
    "tanh": (F.tanh, np.tanh),
    "exp": (lambda t: t.exp(), np.exp),
}


def _x(*shape, seed=0):
    x = np.random.default_rng(seed).uniform(-2, 2, shape)
    return np.where(np.abs(x) < 1e-2, 0.5, x)  # keep relu's kink away from the stencil


@pytest.mark.parametrize("name", list(REFERENCE))
def test_gradcheck_and_values(device, name):
    fn, ref = REFERENCE[name]
    gradcheck_on(device, fn, _x(3, 5))
    x = _x(4, 7, seed=1)
    np.testing.assert_allclose(fn(ag.tensor(x, device=device)).numpy(), ref(x), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("name", list(REFERENCE))
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, name, dtype):
    check_dtypes(REFERENCE[name][0], [_x(3, 37, seed=2)], device, [dtype], scale=4)


def test_tensor_methods_and_errors(device):
    x = ag.tensor(_x(2, 2), device=device)
    np.testing.assert_allclose(x.relu().numpy(), np.maximum(x.numpy(), 0))
    np.testing.assert_allclose(x.tanh().numpy(), np.tanh(x.numpy()))
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(x, approximate="fast")


def test_empty(device):
    x = ag.tensor(np.zeros((0, 4)), requires_grad=True, device=device)
    F.gelu(x).backward(np.zeros((0, 4)))
    assert x.grad.shape == (0, 4)
