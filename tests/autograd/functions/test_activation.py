"""relu, gelu (erf and tanh), silu, tanh, exp: gradcheck, reference values, dtype sweep."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from tests.helpers import DTYPES, check_dtypes, gradcheck_on

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


# -- log, sqrt, rsqrt, sigmoid, abs, clamp (autograd.functions.activation) ------------------

from autograd.functions import activation as A  # noqa: E402

UNARY = {
    "log": (A.log, np.log), "sqrt": (A.sqrt, np.sqrt),
    "rsqrt": (A.rsqrt, lambda x: 1 / np.sqrt(x)),
    "sigmoid": (A.sigmoid, lambda x: 1 / (1 + np.exp(-x))), "abs": (A.abs, np.abs),
    "clamp": (lambda t: A.clamp(t, -0.5, 1.0), lambda x: np.clip(x, -0.5, 1.0)),
    "clamp_min": (lambda t: A.clamp(t, min=-0.5), lambda x: np.maximum(x, -0.5)),
    "clamp_max": (lambda t: A.clamp(t, max=1.0), lambda x: np.minimum(x, 1.0)),
}


def _domain(name, *shape, seed=0):
    x = _x(*shape, seed=seed)
    if name in ("log", "sqrt", "rsqrt"):
        return np.abs(x) + 0.1
    return np.where(np.abs(np.abs(x) - 0.75) < 0.26, 0.2, x)  # off clamp's bounds


@pytest.mark.parametrize("name", list(UNARY))
def test_new_unary_gradcheck_and_values(device, name):
    fn, ref = UNARY[name]
    gradcheck_on(device, fn, _domain(name, 3, 5))
    x = _domain(name, 4, 7, seed=1)
    np.testing.assert_allclose(fn(ag.tensor(x, device=device)).numpy(), ref(x), rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("name", ["log", "sigmoid", "abs", "clamp"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_new_unary_dtypes(device, name, dtype):
    check_dtypes(UNARY[name][0], [_domain(name, 3, 37, seed=2)], device, [dtype], scale=4)


def test_unary_against_torch():
    torch = pytest.importorskip("torch")
    x = _domain("clamp", 5, 6)
    xs = np.concatenate([x.ravel(), [0.0, np.nan, -np.inf]])
    for name, ours, theirs in [
            ("abs", A.abs, torch.abs), ("sigmoid", A.sigmoid, torch.sigmoid),
            ("log", A.log, torch.log), ("sqrt", A.sqrt, torch.sqrt),
            ("rsqrt", A.rsqrt, torch.rsqrt),
            ("clamp", lambda t: A.clamp(t, -0.5, 1.0), lambda t: torch.clamp(t, -0.5, 1.0)),
            ("clamp_swapped", lambda t: A.clamp(t, 1.0, -0.5),
             lambda t: torch.clamp(t, 1.0, -0.5))]:
        t = ag.tensor(xs.copy(), requires_grad=True)
        ours(t).sum().backward()
        tt = torch.tensor(xs.copy(), requires_grad=True)
        theirs(tt).sum().backward()
        np.testing.assert_allclose(ours(ag.tensor(xs)).numpy(), theirs(tt).detach().numpy(),
                                   rtol=1e-12, err_msg=name)
        finite = np.isfinite(xs) & (xs != 0)
        np.testing.assert_allclose(t.grad.numpy()[finite], tt.grad.numpy()[finite],
                                   rtol=1e-12, err_msg=name)


def test_clamp_semantics_and_errors():
    x = ag.tensor(np.array([-2.0, -0.5, 0.0, 1.0, 3.0, np.nan]), requires_grad=True)
    y = A.clamp(x, -0.5, 1.0)
    np.testing.assert_array_equal(y.numpy(), [-0.5, -0.5, 0.0, 1.0, 1.0, np.nan])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0, 1, 1, 1, 0, 0])  # bounds included
    np.testing.assert_array_equal(A.clamp(x, 1.0, -0.5).numpy()[:5], [-0.5] * 5)
    assert A.clip is A.clamp
    with pytest.raises(ValueError, match="clamp\\(\\): at least one of 'min' or 'max'"):
        A.clamp(x)
    with pytest.raises(ValueError, match="'min' must not be NaN"):
        A.clamp(x, float("nan"))
    with pytest.raises(TypeError, match="'max' must be a number or None, given str"):
        A.clamp(x, max="1")
    with pytest.raises(ValueError, match="unknown activation 'softplus'"):
        A.unary("softplus", x)


# -- clamp with tensor bounds (torch's clamp.Tensor) ---------------------------------------


def _ref_clamp_grads(x, lo, hi, dy):
    """torch's clamp_backward / clamp_backward_min_max, summed to each operand's shape."""
    x, lo, hi = np.broadcast_arrays(x, lo, hi)
    gx = np.where((x >= lo) & (x <= hi), dy, 0.0)
    glo = np.where((x < lo) & (lo < hi), dy, 0.0)
    ghi = np.where((x > hi) | (hi < lo), dy, 0.0)
    return gx, glo, ghi


def _sum_to(g, shape):
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, e in enumerate(shape)
                                      if e == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape)


def test_clamp_tensor_bounds_gradcheck(device):
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (3, 4))
    lo = rng.uniform(-0.8, -0.1, (4,))
    hi = rng.uniform(0.1, 0.8, (3, 1))
    gradcheck_on(device, lambda a, b, c: a.clamp(b, c), x, lo, hi)
    gradcheck_on(device, lambda a, b: A.clamp(a, min=b), x, lo)
    gradcheck_on(device, lambda a, c: A.clamp(a, max=c), x, hi)
    gradcheck_on(device, lambda a, c: A.clamp(a, -0.5, c), x, hi)  # a number and a tensor


def test_clamp_tensor_bounds_values_ties_and_crossed_bounds(device):
    """Ties at a bound route to x; where lo > hi the result is hi and hi gets dy."""
    x = np.array([[-2.0, 0.5, 3.0, 1.0, 0.0, np.nan]])
    lo = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    hi = np.array([[1.0], [0.5]])
    dy = np.arange(12.0).reshape(2, 6) + 1
    tx, tlo, thi = (ag.tensor(v, requires_grad=True, device=device) for v in (x, lo, hi))
    y = ag.clamp(tx, min=tlo, max=thi)
    want = np.minimum(np.maximum(x, lo), hi)
    np.testing.assert_array_equal(y.numpy(), want)
    assert y.shape == (2, 6)
    y.backward(dy)
    gx, glo, ghi = _ref_clamp_grads(x, lo, hi, dy)
    np.testing.assert_array_equal(tx.grad.numpy(), _sum_to(gx, x.shape))
    np.testing.assert_array_equal(tlo.grad.numpy(), _sum_to(glo, lo.shape))
    np.testing.assert_array_equal(thi.grad.numpy(), _sum_to(ghi, hi.shape))


def test_clamp_tensor_bounds_dtypes_and_ints(device):
    x = ag.tensor(np.array([1, 7, -3], np.int32), device=device)
    y = x.clamp(min=ag.tensor(np.array([0, 0, 0], np.int32), device=device), max=5)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y.numpy(), [1, 5, 0])
    f = ag.tensor(np.array([0.25, 2.0], np.float16), device=device)
    z = f.clamp(max=ag.tensor(np.array(1.0), device=device))  # a 0-d bound keeps float16
    assert z.dtype == np.float16 and z.numpy().tolist() == [0.25, 1.0]
    with pytest.raises(TypeError, match="clamp"):
        ag.tensor(np.array([True])).clamp(min=ag.tensor(np.array([False])))


def test_clamp_tensor_bounds_against_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x, lo, hi = rng.uniform(-1, 1, (3, 4)), rng.uniform(-1, 0.5, (4,)), rng.uniform(-0.5, 1, (3, 1))
    tt = [torch.tensor(v, requires_grad=True) for v in (x, lo, hi)]
    torch.clamp(tt[0], tt[1], tt[2]).backward(torch.ones(3, 4, dtype=torch.float64))
    ours = [ag.tensor(v, requires_grad=True) for v in (x, lo, hi)]
    ag.clamp(*ours).backward(np.ones((3, 4)))
    for o, ref in zip(ours, tt, strict=True):
        np.testing.assert_allclose(o.grad.numpy(), ref.grad.numpy(), rtol=1e-12)
