"""layer_norm and rms_norm over trailing dims: gradcheck, float64 references, dtype sweep."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from gpuplan.ops.normalization.reference import layer_norm_reference
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _x(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def _ref_norm(x, w, b, nd, eps, rms=False):
    """The float64 reference over the trailing `nd` dims of x."""
    d = int(np.prod(x.shape[x.ndim - nd:]))
    flat = [None if a is None else a.reshape(d) for a in (w, b)]
    return layer_norm_reference(x.reshape(-1, d), *flat, eps, rms=rms)[0].reshape(x.shape)


@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_layer_norm(device, affine):
    x, w, b = _x(3, 6, seed=1), _x(6, seed=2) + 1.5, _x(6, seed=3)
    use_w, use_b = affine in ("both", "weight"), affine in ("both", "bias")
    args = [x] + ([w] if use_w else []) + ([b] if use_b else [])

    def fn(t, *p):
        p = list(p)
        weight = p.pop(0) if use_w else None
        bias = p.pop(0) if use_b else None
        return F.layer_norm(t, (6,), weight, bias, eps=1e-5)

    gradcheck_on(device, fn, *args)
    y = fn(*[ag.tensor(a, device=device) for a in args])
    np.testing.assert_allclose(y.numpy(), _ref_norm(x, w if use_w else None,
                                                    b if use_b else None, 1, 1e-5),
                               rtol=1e-10, atol=1e-10)


def test_layer_norm_two_trailing_dims(device):
    x, w, b = _x(2, 3, 4, seed=4), _x(3, 4, seed=5) + 1.5, _x(3, 4, seed=6)
    gradcheck_on(device, lambda t, p, q: F.layer_norm(t, (3, 4), p, q), x, w, b)
    y = F.layer_norm(ag.tensor(x, device=device), (3, 4), ag.tensor(w, device=device),
                     ag.tensor(b, device=device))
    np.testing.assert_allclose(y.numpy(), _ref_norm(x, w, b, 2, 1e-5), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(device, with_weight):
    x, w = _x(4, 5, seed=7), _x(5, seed=8) + 1.5
    if with_weight:
        gradcheck_on(device, lambda t, p: F.rms_norm(t, 5, p, eps=1e-6), x, w)
    else:
        gradcheck_on(device, lambda t: F.rms_norm(t, [5]), x)
    y = F.rms_norm(ag.tensor(x, device=device), 5,
                   ag.tensor(w, device=device) if with_weight else None, eps=1e-6)
    ref = _ref_norm(x, w if with_weight else None, None, 1, 1e-6, rms=True)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-10, atol=1e-10)


def test_shape_errors(device):
    x = ag.tensor(_x(2, 4), device=device)
    with pytest.raises(ValueError, match="normalized_shape"):
        F.layer_norm(x, (3,))
    with pytest.raises(ValueError, match="weight"):
        F.layer_norm(x, 4, ag.tensor(_x(3), device=device))
    with pytest.raises(ValueError, match="normalized_shape"):
        F.rms_norm(x, (2, 2, 4))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    x, w, b = _x(5, 65, seed=9), _x(65, seed=10) + 1.5, _x(65, seed=11)
    check_dtypes(lambda t, p, q: F.layer_norm(t, 65, p, q), [x, w, b], device, [dtype],
                 scale=8, grad_scale=32)
    check_dtypes(lambda t, p: F.rms_norm(t, 65, p, eps=1e-6), [x, w], device, [dtype],
                 scale=8, grad_scale=32)


def test_empty(device):
    x = ag.tensor(np.zeros((0, 4)), requires_grad=True, device=device)
    w = ag.tensor(np.ones(4), requires_grad=True, device=device)
    F.layer_norm(x, 4, w).backward(np.zeros((0, 4)))
    assert x.grad.shape == (0, 4)
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros(4))


# -- residual_layer_norm: s = x + r and layer_norm(s) in one plan -----------------------------

@pytest.mark.parametrize("affine", [True, False])
def test_residual_layer_norm(device, affine):
    x, r, w, b = _x(2, 3, 6, seed=12), _x(2, 3, 6, seed=13), _x(6, seed=14) + 1.5, _x(6, seed=15)
    args = [x, r] + ([w, b] if affine else [])
    gradcheck_on(device, lambda *t: F.residual_layer_norm(*t[:2], 6, *t[2:], eps=1e-5), *args)
    # s feeding a later add as well (the pre-LN block's shape): both gradients reach x, r.
    gradcheck_on(device, lambda *t: (lambda s, y: s * y)(*F.residual_layer_norm(
        *t[:2], 6, *t[2:])), *args)
    ts = [ag.tensor(a, device=device) for a in args]
    s, y = F.residual_layer_norm(*ts[:2], 6, *ts[2:])
    np.testing.assert_array_equal(s.numpy(), x + r)
    np.testing.assert_allclose(y.numpy(), _ref_norm(x + r, w if affine else None,
                                                    b if affine else None, 1, 1e-5),
                               rtol=1e-10, atol=1e-10)


def test_residual_layer_norm_two_trailing_dims_and_dtypes(device):
    x, r, w, b = _x(2, 3, 4, seed=16), _x(2, 3, 4, seed=17), _x(3, 4, seed=18), _x(3, 4, seed=19)
    gradcheck_on(device, lambda t, u, p, q: F.residual_layer_norm(t, u, (3, 4), p, q)[1],
                 x, r, w, b)
    for dtype in DTYPES:
        check_dtypes(lambda t, u, p, q: (lambda s, y: s * y)(*F.residual_layer_norm(
            t, u, 65, p, q)), [_x(5, 65, seed=20), _x(5, 65, seed=21), _x(65, seed=22) + 1.5,
                               _x(65, seed=23)], device, [dtype.values[0]], scale=8,
                     grad_scale=32)


def test_residual_layer_norm_errors(device):
    x = ag.tensor(_x(2, 4), device=device)
    with pytest.raises(ValueError, match="residual_layer_norm: residual must have"):
        F.residual_layer_norm(x, ag.tensor(_x(4, 2), device=device), 2)
    with pytest.raises(ValueError, match="normalized_shape"):
        F.residual_layer_norm(x, x, (3,))
    with pytest.raises(ValueError, match="weight"):
        F.residual_layer_norm(x, x, 4, ag.tensor(_x(3), device=device))
