"""scaled_dot_product_attention: gradcheck (causal, Lq != Lk, scale), float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from tests.autograd.functions.helpers import check_dtypes, gradcheck_on
from tests.plan_testing import DTYPES


def _x(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def _ref(q, k, v, causal, scale):
    s = np.einsum("...qd,...kd->...qk", q, k) * scale
    lq, lk = s.shape[-2:]
    if causal:
        s = np.where(np.arange(lk)[None, :] > np.arange(lq)[:, None] + (lk - lq), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(3, 3), (2, 4)])
def test_gradcheck_and_values(device, causal, lq, lk):
    q, k, v = _x(1, 2, lq, 3, seed=1), _x(1, 2, lk, 3, seed=2), _x(1, 2, lk, 2, seed=3)
    fn = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal)  # noqa: E731
    gradcheck_on(device, fn, q, k, v)
    out = fn(*[ag.tensor(a, device=device) for a in (q, k, v)])
    assert out.shape == (1, 2, lq, 2)
    np.testing.assert_allclose(out.numpy(), _ref(q, k, v, causal, 1 / np.sqrt(3)),
                               rtol=1e-12, atol=1e-12)


def test_explicit_scale_and_constant_inputs(device):
    q, k, v = _x(2, 3, 4, seed=4), _x(2, 3, 4, seed=5), _x(2, 3, 4, seed=6)
    kt = ag.tensor(k, device=device)  # k does not require grad
    gradcheck_on(device, lambda a, c: F.scaled_dot_product_attention(a, kt, c, scale=0.3),
                 q, v)
    out = F.scaled_dot_product_attention(*[ag.tensor(a, device=device) for a in (q, k, v)],
                                         scale=0.3)
    np.testing.assert_allclose(out.numpy(), _ref(q, k, v, False, 0.3), rtol=1e-12)


def test_shape_errors(device):
    q = ag.tensor(_x(1, 2, 3, 4), device=device)
    with pytest.raises(ValueError, match="rank"):
        F.scaled_dot_product_attention(q.reshape(6, 4), q.reshape(6, 4), q.reshape(6, 4))
    with pytest.raises(ValueError, match="incompatible"):
        F.scaled_dot_product_attention(q, ag.tensor(_x(1, 2, 3, 5)), q)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    q, k, v = _x(2, 2, 9, 16, seed=7), _x(2, 2, 9, 16, seed=8), _x(2, 2, 9, 16, seed=9)
    check_dtypes(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
                 [q, k, v], device, [dtype], scale=16)
