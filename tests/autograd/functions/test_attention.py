"""scaled_dot_product_attention: gradcheck (causal, Lq != Lk, scale), float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from gpuplan.testing_attention import attention_reference
from tests.autograd.functions.helpers import check_dtypes, gradcheck_on
from tests.plan_testing import DTYPES, assert_close, f64


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


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(3, 3), (2, 5), (5, 2)])
def test_fused_gradcheck_and_values(device, causal, lq, lk):
    """Dv == Dh: the fused plans (lq > lk causal: queries that see no key give 0)."""
    q, k, v = _x(2, 1, lq, 3, seed=11), _x(2, 1, lk, 3, seed=12), _x(2, 1, lk, 3, seed=13)
    fn = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal)  # noqa: E731
    gradcheck_on(device, fn, q, k, v)
    out = fn(*[ag.tensor(a, device=device) for a in (q, k, v)])
    ref, _ = attention_reference(*(a.reshape(2, -1, 3) for a in (q, k, v)), 1 / np.sqrt(3),
                                 causal)
    np.testing.assert_allclose(out.numpy(), ref.reshape(out.shape), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_matches_composed(device, dtype):
    """The fused plans and the composed ops agree on values and gradients (head_dim 64:
    the tensor-core kernels for f16/bf16 on a device)."""
    from autograd.functions.attention import ComposedAttention, ScaledDotProductAttention

    arrays = [_x(1, 2, n, 64, seed=20 + i).astype(dtype) for i, n in enumerate((19, 23, 23))]
    results = []
    for fn in (ScaledDotProductAttention, ComposedAttention):
        ts = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
        out = fn.apply(*ts, scale=0.125, causal=True)
        out.backward(ag.tensor(np.ones(out.shape, dtype), device=device))
        results.append([out.numpy()] + [t.grad.numpy() for t in ts])
    for fused, composed in zip(*results, strict=True):
        assert_close(fused, f64(composed), dtype, scale=8)
