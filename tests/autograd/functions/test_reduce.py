"""sum / mean / max over axes (with keepdims and ties): gradcheck and dtype sweep."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from tests.autograd.functions.helpers import check_dtypes, gradcheck_on
from tests.plan_testing import DTYPES


def _r(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


@pytest.mark.parametrize("name", ["sum", "mean", "max"])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (1, False), ((0, 2), True),
                                           (-1, True)])
def test_gradcheck(device, name, axis, keepdims):
    gradcheck_on(device, lambda t: getattr(t, name)(axis=axis, keepdims=keepdims),
                 _r(2, 3, 4))


def test_values_and_shapes(device):
    x = _r(3, 5)
    t = ag.tensor(x, device=device)
    np.testing.assert_allclose(t.sum(axis=0).numpy(), x.sum(0))
    np.testing.assert_allclose(t.mean(axis=1, keepdims=True).numpy(), x.mean(1, keepdims=True))
    np.testing.assert_allclose(ag.max(t).numpy(), x.max())
    with pytest.raises(ValueError, match="out of range"):
        t.sum(axis=2)


def test_max_shares_gradient_between_ties(device):
    x = ag.tensor(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]]), requires_grad=True,
                  device=device)
    x.max(axis=1).backward(np.array([1.0, 2.0]))
    np.testing.assert_allclose(x.grad.numpy(), [[0.0, 0.5, 0.5], [2.0, 0.0, 0.0]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    check_dtypes(lambda t: t.sum(axis=1) + t.mean(axis=1) + t.max(axis=1), [_r(6, 33)],
                 device, [dtype], scale=8)


def test_empty(device):
    x = ag.tensor(np.zeros((0, 3)), requires_grad=True, device=device)
    y = x.sum(axis=0)
    np.testing.assert_array_equal(y.numpy(), np.zeros(3))
    y.backward(np.ones(3))
    assert x.grad.shape == (0, 3)
