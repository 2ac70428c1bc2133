"""add/sub/mul/div (broadcasting), scalar operands, neg: gradcheck and dtype sweep."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from tests.autograd.functions.helpers import check_dtypes, gradcheck_on
from tests.plan_testing import DTYPES


def _r(*shape, seed=0, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, shape)


OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}


@pytest.mark.parametrize("name", list(OPS))
def test_binary_gradcheck_with_broadcasting(device, name):
    a, b = _r(3, 1, seed=1), _r(4, seed=2, low=0.5, high=1.5)
    gradcheck_on(device, OPS[name], a, b)
    gradcheck_on(device, OPS[name], _r(2, 3, seed=3), _r(2, 3, seed=4, low=0.5, high=1.5))


@pytest.mark.parametrize("name", list(OPS))
def test_broadcast_grads_reduce_to_input_shape(device, name):
    a = ag.tensor(_r(2, 1, 3), requires_grad=True, device=device)
    b = ag.tensor(_r(4, 1, low=0.5, high=1.5), requires_grad=True, device=device)
    OPS[name](a, b).backward(np.ones((2, 4, 3)))
    assert a.grad.shape == (2, 1, 3) and b.grad.shape == (4, 1)


def test_scalar_operands(device):
    x = _r(2, 3, low=0.5, high=1.5)
    for fn in (lambda t: t * 2.5, lambda t: 3 * t, lambda t: t / 4, lambda t: 1 - t,
               lambda t: t + 1, lambda t: -t, lambda t: 2.0 / t, lambda t: t - 0.5):
        gradcheck_on(device, fn, x)
    t = ag.tensor(x, device=device)
    np.testing.assert_allclose((1 - t).numpy(), 1 - x)
    np.testing.assert_allclose((2.0 / t).numpy(), 2.0 / x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    a, b = _r(5, 7, seed=5), _r(7, seed=6, low=0.5, high=1.5)
    check_dtypes(lambda p, q: (p * q + p) / q - 2 * p, [a, b], device, [dtype], scale=4)


def test_empty(device):
    a = ag.tensor(np.zeros((0, 3)), requires_grad=True, device=device)
    b = ag.tensor(np.ones(3), requires_grad=True, device=device)
    (a * b).backward(np.zeros((0, 3)))
    assert a.grad.shape == (0, 3)
    np.testing.assert_array_equal(b.grad.numpy(), np.zeros(3))
