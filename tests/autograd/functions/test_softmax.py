"""softmax (any dim, scaled, causal) and log_softmax: gradcheck, references, dtype sweep."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.functions.softmax import softmax as scaled_softmax
from autograd.nn import functional as F
from tests.gpuplan.ops.test_softmax import ref_softmax
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _x(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, shape)


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax_gradcheck_and_values(device, dim):
    gradcheck_on(device, lambda t: F.softmax(t, dim=dim), _x(3, 4, 5))
    x = _x(2, 3, 6, seed=1)
    np.testing.assert_allclose(F.softmax(ag.tensor(x, device=device), dim=dim).numpy(),
                               ref_softmax(x, axis=dim), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dim", [-1, 1])
def test_log_softmax_gradcheck_and_values(device, dim):
    gradcheck_on(device, lambda t: F.log_softmax(t, dim=dim), _x(3, 4, 5))
    x = _x(4, 7, seed=2)
    np.testing.assert_allclose(F.log_softmax(ag.tensor(x, device=device), dim=dim).numpy(),
                               ref_softmax(x, log=True, axis=dim), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("lq,lk", [(4, 4), (3, 5)])
def test_scaled_causal_softmax(device, lq, lk):
    gradcheck_on(device, lambda t: scaled_softmax(t, scale=0.7, causal=True), _x(2, lq, lk))
    x = _x(2, lq, lk, seed=3)
    mask = np.arange(lk)[None, :] > np.arange(lq)[:, None] + (lk - lq)
    y = scaled_softmax(ag.tensor(x, device=device), scale=0.7, causal=True)
    np.testing.assert_allclose(y.numpy(), ref_softmax(x, 0.7, mask), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="causal"):
        scaled_softmax(ag.tensor(x), dim=0, causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    x = _x(5, 67, seed=4)
    check_dtypes(lambda t: F.softmax(t, dim=-1), [x], device, [dtype], scale=4)
    check_dtypes(lambda t: F.log_softmax(t, dim=0), [x], device, [dtype], scale=8)


def test_empty(device):
    x = ag.tensor(np.zeros((0, 5)), requires_grad=True, device=device)
    F.softmax(x).backward(np.zeros((0, 5)))
    assert x.grad.shape == (0, 5)
