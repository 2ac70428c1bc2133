"""matmul (2-D, batched, mixed) and linear: values, gradcheck, dtype sweep, shape errors."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _r(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 2)),
                                   ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 2)),
                                   ((2, 2, 3, 4), (2, 2, 4, 3))])
def test_matmul_gradcheck_and_values(device, sa, sb):
    a, b = _r(*sa, seed=1), _r(*sb, seed=2)
    gradcheck_on(device, lambda p, q: p @ q, a, b)
    out = ag.tensor(a, device=device) @ ag.tensor(b, device=device)
    np.testing.assert_allclose(out.numpy(), np.matmul(a, b), rtol=1e-12, atol=1e-12)


def test_matmul_shape_errors(device):
    a = ag.tensor(_r(2, 3), device=device)
    # one clear error, from gp.functional.matmul (no second check in autograd)
    with pytest.raises(ValueError, match="matmul: argument 'b'.*contraction extent of 3"):
        a @ ag.tensor(_r(2, 3), device=device)
    with pytest.raises(ValueError, match="batch axes"):
        ag.tensor(_r(2, 2, 3)) @ ag.tensor(_r(3, 3, 1))
    with pytest.raises(ValueError, match="at least one dimension"):
        a @ ag.tensor(np.float64(2.0), device=device)
    with pytest.raises(ValueError, match=r"batch axes \(2, 1\) and \(3, 2\) do not broadcast"):
        ag.tensor(_r(2, 1, 2, 3)) @ ag.tensor(_r(3, 2, 3, 1))


# torch.matmul's broadcasting: vectors, a batch of one, partial broadcasts (materialized).
BROADCAST = [((1, 7, 3), (3, 3, 5)), ((3,), (3,)), ((3,), (2, 3, 4)), ((2, 5, 3), (3,)),
             ((4, 3), (3,)), ((2, 1, 4, 3), (5, 3, 2)), ((2, 1, 3, 4), (1, 3, 4, 2)),
             ((1, 1, 3, 4), (4, 2)), ((3, 4), (1, 4, 2)), ((1, 3, 4), (1, 4, 2))]


@pytest.mark.parametrize("sa,sb", BROADCAST)
def test_matmul_broadcasts_like_torch(device, sa, sb):
    a, b = _r(*sa, seed=11), _r(*sb, seed=12)
    gradcheck_on(device, lambda p, q: p @ q, a, b)
    out = ag.tensor(a, device=device) @ ag.tensor(b, device=device)
    ref = np.matmul(a, b)  # NumPy's matmul has torch's broadcasting and vector rules
    assert out.shape == ref.shape
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sa,sb", BROADCAST[:3])
def test_matmul_broadcast_against_torch(sa, sb):
    torch = pytest.importorskip("torch")
    a, b = _r(*sa, seed=13), _r(*sb, seed=14)
    pa, pb = ag.tensor(a, requires_grad=True), ag.tensor(b, requires_grad=True)
    (pa @ pb).sum().backward()
    ta = torch.tensor(a, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    (ta @ tb).sum().backward()
    np.testing.assert_allclose(pa.grad.numpy(), ta.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(pb.grad.numpy(), tb.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradcheck(device, bias):
    x, w, b = _r(2, 3, 4, seed=3), _r(4, 5, seed=4), _r(5, seed=5)
    if bias:
        gradcheck_on(device, F.linear, x, w, b)
    else:
        gradcheck_on(device, lambda p, q: F.linear(p, q), x, w)
    y = F.linear(ag.tensor(x, device=device), ag.tensor(w, device=device),
                 ag.tensor(b, device=device) if bias else None)
    np.testing.assert_allclose(y.numpy(), x @ w + (b if bias else 0), rtol=1e-12, atol=1e-12)


def test_linear_shape_errors(device):
    x, w = ag.tensor(_r(2, 4), device=device), ag.tensor(_r(3, 5), device=device)
    with pytest.raises(ValueError, match="contraction extent of 4"):
        F.linear(x, w)
    with pytest.raises(ValueError, match="linear: expected a weight"):
        F.linear(x, ag.tensor(_r(4, 5, 1), device=device))
    with pytest.raises(ValueError, match="argument 'bias'"):
        F.linear(x, ag.tensor(_r(4, 5), device=device), ag.tensor(_r(4), device=device))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    x, w, b = _r(5, 17, seed=6), _r(17, 9, seed=7), _r(9, seed=8)
    check_dtypes(lambda p, q, r: F.linear(p, q, r) @ q.T, [x, w, b], device, [dtype], scale=20)
    check_dtypes(lambda p, q: p @ q, [_r(3, 4, 17, seed=9), _r(3, 17, 5, seed=10)], device,
                 [dtype], scale=10)


def test_empty(device):
    x = ag.tensor(np.zeros((0, 4)), requires_grad=True, device=device)
    w = ag.tensor(_r(4, 3), requires_grad=True, device=device)
    F.linear(x, w).backward(np.zeros((0, 3)))
    assert x.grad.shape == (0, 4)
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros((4, 3)))


# -- linear_gelu: the activation in the GEMM epilogue ---------------------------------------

@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("x_shape,bias", [((2, 3, 4), True), ((3, 4), False), ((4,), True)])
def test_linear_gelu_gradcheck_and_values(device, approximate, x_shape, bias):
    x, w, b = 2 * _r(*x_shape, seed=11), _r(4, 5, seed=12), _r(5, seed=13)
    args = (x, w, b) if bias else (x, w)
    gradcheck_on(device, lambda *t: F.linear_gelu(*t, approximate=approximate), *args)
    ts = [ag.tensor(a, device=device) for a in args]
    fused = F.linear_gelu(*ts, approximate=approximate)
    composed = F.gelu(F.linear(*ts), approximate=approximate)
    assert fused.shape == composed.shape == x_shape[:-1] + (5,)
    np.testing.assert_allclose(fused.numpy(), composed.numpy(), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gelu_dtypes(device, dtype):
    x, w, b = 2 * _r(5, 17, seed=14), _r(17, 9, seed=15), _r(9, seed=16)
    check_dtypes(lambda p, q, r: F.linear_gelu(p, q, r) @ q.T, [x, w, b], device, [dtype],
                 scale=20)


def test_linear_gelu_without_grad_and_errors(device):
    x, w = ag.tensor(_r(3, 4), device=device), ag.tensor(_r(4, 5), device=device)
    with ag.no_grad():
        y = F.linear_gelu(x, w, approximate="tanh")
    assert not y.requires_grad
    np.testing.assert_allclose(y.numpy(), F.gelu(F.linear(x, w), "tanh").numpy(), rtol=1e-14)
    with pytest.raises(ValueError, match="linear_gelu: approximate"):
        F.linear_gelu(x, w, approximate="erf")
    with pytest.raises(ValueError, match="linear_gelu: expected a weight"):
        F.linear_gelu(x, ag.tensor(_r(4, 5, 1), device=device))
    with pytest.raises(ValueError, match="contraction extent of 4"):
        F.linear_gelu(x, ag.tensor(_r(3, 5), device=device))
