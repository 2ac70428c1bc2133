"""sum / mean / max over axes (with keepdims and ties): gradcheck and dtype sweep."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


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


# -- torch's names: dim/keepdim, (values, indices), argmax/argmin, topk, var/std, prod -----


def test_dim_keepdim_and_numpy_aliases(device):
    x = _r(3, 4, 5)
    t = ag.tensor(x, device=device)
    np.testing.assert_allclose(t.sum(dim=1).numpy(), x.sum(1))
    np.testing.assert_allclose(t.sum(1, keepdim=True).numpy(), x.sum(1, keepdims=True))
    np.testing.assert_allclose(t.mean(dim=(0, 2)).numpy(), x.mean((0, 2)))
    np.testing.assert_allclose(ag.sum(t, axis=0, keepdims=True).numpy(), x.sum(0, keepdims=True))
    with pytest.raises(TypeError, match="both 'dim' and its alias 'axis'"):
        t.sum(dim=1, axis=1)
    with pytest.raises(TypeError, match="both 'keepdim' and its alias 'keepdims'"):
        t.mean(1, keepdim=True, keepdims=True)
    with pytest.raises(ValueError, match="dim 3 out of range"):
        t.sum(dim=3)
    with pytest.raises(TypeError, match="max\\(\\): dim must be an int"):
        t.max(dim=(0, 1))


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_with_dim_return_values_and_indices(device, name):
    x = _r(3, 4, 5, seed=2)
    t = ag.tensor(x, device=device)
    out = getattr(t, name)(dim=1)
    values, indices = out  # unpacks like torch.return_types
    assert type(out).__name__ == name and out.values is values and out.indices is indices
    np.testing.assert_array_equal(values.numpy(), getattr(x, name)(1))
    np.testing.assert_array_equal(indices.numpy(), getattr(x, f"arg{name}")(1))
    assert indices.dtype == np.int64 and not indices.requires_grad
    kept = getattr(ag, name)(t, 2, keepdim=True)
    assert kept.values.shape == kept.indices.shape == (3, 4, 1)
    assert getattr(t, name)().shape == ()  # no dim: the scalar
    np.testing.assert_array_equal(getattr(t, name)(axis=1).numpy(), getattr(x, name)(1))
    gradcheck_on(device, lambda p: getattr(p, name)(dim=1).values, x)
    gradcheck_on(device, lambda p: getattr(p, name)(-1, keepdim=True)[0], x)


def test_ties_and_nan_follow_torch(device):
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, np.nan, 5.0, np.nan]])
    t = ag.tensor(x, requires_grad=True, device=device)
    v, i = t.max(dim=1)
    np.testing.assert_array_equal(i.numpy(), [1, 1])  # first of ties; the first NaN wins
    assert np.isnan(v.numpy()[1])
    np.testing.assert_array_equal(t.argmin(dim=1).numpy(), [3, 1])
    assert int(t.argmax().item()) == 5  # flattened: the first NaN
    v.backward(np.array([1.0, 2.0]))  # the gradient goes to the selected index only
    np.testing.assert_array_equal(t.grad.numpy(), [[0, 1, 0, 0], [0, 2, 0, 0]])


def test_argmax_argmin(device):
    x = _r(4, 6, seed=3)
    t = ag.tensor(x, device=device)
    np.testing.assert_array_equal(t.argmax(dim=1).numpy(), x.argmax(1))
    np.testing.assert_array_equal(ag.argmin(t, 0, keepdim=True).numpy(),
                                  x.argmin(0)[None])
    assert t.argmax().shape == () and int(t.argmax().item()) == x.argmax()
    assert t.argmax(keepdim=True).shape == (1, 1)


@pytest.mark.parametrize("largest", [True, False])
def test_topk(device, largest):
    x = _r(3, 7, seed=4)
    t = ag.tensor(x, device=device)
    values, indices = t.topk(3, dim=1, largest=largest)
    order = np.argsort(-x if largest else x, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(indices.numpy(), order)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(x, order, 1))
    gradcheck_on(device, lambda p: ag.topk(p, 2, dim=0, largest=largest).values, x)
    with pytest.raises(ValueError, match="k \\(8\\) out of range"):
        t.topk(8)


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("dim,keepdim,kw", [(None, False, {}), (1, False, {}),
                                            ((0, 2), True, {"correction": 0}),
                                            (-1, False, {"unbiased": False})])
def test_var_std(device, name, dim, keepdim, kw):
    x = _r(3, 4, 5, seed=5) + 2.0
    t = ag.tensor(x, device=device)
    ddof = 0 if kw else 1
    want = getattr(np, name)(x, axis=dim, ddof=ddof, keepdims=keepdim)
    got = getattr(t, name)(dim, keepdim=keepdim, **kw)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    gradcheck_on(device, lambda p: getattr(p, name)(dim, keepdim=keepdim, **kw), x)
    with pytest.raises(TypeError, match="both 'correction' and its alias 'unbiased'"):
        getattr(t, name)(1, unbiased=True, correction=1)


def test_prod_with_zeros(device):
    x = _r(3, 5, seed=6)
    x[0, 1] = 0.0
    x[2, 0] = x[2, 3] = 0.0
    gradcheck_on(device, lambda p: p.prod(dim=1), x)
    gradcheck_on(device, lambda p: ag.prod(p), x[:1])  # one zero among all elements
    gradcheck_on(device, lambda p: p.prod(0, keepdim=True), _r(4, 3, seed=7))
    np.testing.assert_allclose(ag.tensor(x, device=device).prod(1).numpy(), x.prod(1))
    with pytest.raises(TypeError, match="prod\\(\\): dim must be an int"):
        ag.tensor(x).prod(dim=(0, 1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_new_reductions_dtypes(device, dtype):
    check_dtypes(lambda t: t.max(dim=1).values + t.min(1)[0] + t.topk(2)[0].sum(1)
                 + t.var(1) + t.std(1), [_r(6, 33, seed=8)], device, [dtype], scale=16)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x = _r(4, 6, seed=9)
    x[1, 2] = 0.0
    for fn in (lambda m: m.max(dim=1).values.sum(), lambda m: m.topk(3, dim=0)[0].sum(),
               lambda m: m.var(1).sum(), lambda m: m.std(dim=0, correction=0).sum(),
               lambda m: m.prod(1).sum()):
        ours = ag.tensor(x, requires_grad=True)
        fn(ours).backward()
        theirs = torch.tensor(x, requires_grad=True)
        fn(theirs).backward()
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-10,
                                   atol=1e-12)
