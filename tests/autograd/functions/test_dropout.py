"""dropout: mask from (seed, offset), regenerated in backward; default-generator streams."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan.functional as GF
from autograd.nn import functional as F
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _x(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def test_gradcheck_and_mask(device):
    x = _x(4, 9)
    gradcheck_on(device, lambda t: F.dropout(t, p=0.3, seed=123, offset=5), x)
    t = ag.tensor(x, requires_grad=True, device=device)
    y = F.dropout(t, p=0.3, seed=123, offset=5)
    mask = np.asarray(GF.dropout_mask((4, 9), 0.3, 123, 5))
    np.testing.assert_allclose(y.numpy(), x * mask / 0.7, rtol=1e-12)
    y.backward(np.ones((4, 9)))
    np.testing.assert_allclose(t.grad.numpy(), mask / 0.7, rtol=1e-12)


def test_identity_when_not_training_or_p_zero(device):
    t = ag.tensor(_x(3, 3), requires_grad=True, device=device)
    assert F.dropout(t, 0.5, training=False) is t
    assert F.dropout(t, 0.0) is t
    with pytest.raises(ValueError, match="p must be"):
        F.dropout(t, 1.5)


def test_default_generator_gives_fresh_reproducible_masks(device):
    t = ag.tensor(np.ones((8, 16)), device=device)
    ag.manual_seed(7)
    a, b = F.dropout(t, 0.5).numpy(), F.dropout(t, 0.5).numpy()
    assert not np.array_equal(a, b)
    ag.manual_seed(7)
    np.testing.assert_array_equal(F.dropout(t, 0.5).numpy(), a)
    np.testing.assert_array_equal(F.dropout(t, 0.5).numpy(), b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    check_dtypes(lambda t: F.dropout(t, 0.25, seed=9), [_x(5, 33)], device, [dtype])


def test_empty(device):
    t = ag.tensor(np.zeros((0, 3)), requires_grad=True, device=device)
    F.dropout(t, 0.5, seed=1).backward(np.zeros((0, 3)))
    assert t.grad.shape == (0, 3)
