"""F.rope: gradcheck in float64 in both layouts, values against the float64 reference, the
dtype sweep, rope feeding attention, and argument errors."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.functions.attention import split_heads
from autograd.functions.rope import rope_split_heads
from autograd.nn import functional as F
from gpuplan.ops.rope.reference import rope_reference
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _x(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, shape)


@pytest.mark.parametrize("seq_dim,shape", [(-2, (2, 3, 5, 8)), (1, (2, 5, 3, 6))])
def test_gradcheck(device, seq_dim, shape):
    gradcheck_on(device, lambda x: F.rope(x, theta=500.0, offset=3, seq_dim=seq_dim),
                 _x(*shape))


def test_values(device):
    x = _x(2, 5, 3, 8, seed=1)  # [B, T, H, D]
    y = F.rope(ag.tensor(x, device=device), theta=10000.0, offset=17, seq_dim=1)
    np.testing.assert_allclose(y.numpy(), rope_reference(x, 10000.0, 17), rtol=1e-13,
                               atol=1e-13)
    bhtd = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    y2 = F.rope(ag.tensor(bhtd, device=device), theta=10000.0, offset=17)
    np.testing.assert_array_equal(y2.numpy(), y.numpy().transpose(0, 2, 1, 3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    check_dtypes(lambda x: F.rope(x, theta=10000.0, offset=100), [_x(2, 3, 7, 16, seed=2)],
                 device, [dtype], scale=2)


def test_rope_into_attention(device):
    """Gradients flow through rope on q and k into the fused attention."""
    q, k, v = (_x(1, 2, 4, 8, seed=s) for s in (3, 4, 5))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(F.rope(q, offset=2), F.rope(k, offset=2), v,
                                              is_causal=True)

    gradcheck_on(device, fn, q, k, v)


@pytest.mark.parametrize("kw,error,words", [
    (dict(offset=-1), ValueError, "rope: offset must be an int >= 0, given -1"),
    (dict(offset=2.0), ValueError, "rope: offset must be an int >= 0, given 2.0"),
    (dict(theta=0.0), ValueError, "rope: argument 'theta': expected a finite number > 0"),
    (dict(seq_dim=-1), ValueError, "rope: argument 'seq_dim'"),
])
def test_errors(kw, error, words):
    with pytest.raises(error) as err:
        F.rope(ag.tensor(_x(2, 3, 4)), **kw)
    assert words in str(err.value), str(err.value)
    with pytest.raises(ValueError, match="rope: argument 'x': expected .* head_dim even"):
        F.rope(ag.tensor(_x(2, 3, 5)))


def test_rope_split_heads_gradcheck_and_equality(device):
    """One pass equal to split_heads then rope, values and gradients."""
    gradcheck_on(device, lambda x: rope_split_heads(x, 3, theta=50.0, offset=4), _x(2, 5, 12))
    x = _x(2, 5, 12, seed=7)
    cot = _x(2, 3, 5, 4, seed=8)
    outs = []
    for fn in (lambda t: rope_split_heads(t, 3, offset=4),
               lambda t: F.rope(split_heads(t, 1, 3)[0], offset=4)):
        t = ag.tensor(x, requires_grad=True, device=device)
        y = fn(t)
        y.backward(cot)
        outs.append((y.numpy(), t.grad.numpy()))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-15, atol=1e-15)
    with pytest.raises(ValueError, match="rope_split_heads: offset must be an int >= 0"):
        rope_split_heads(ag.tensor(x), 3, offset=-2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_split_heads_dtypes(device, dtype):
    check_dtypes(lambda x: rope_split_heads(x, 2, offset=9), [_x(2, 7, 16, seed=2)], device,
                 [dtype], scale=2)
