"""gather / scatter_add / index_select: values against NumPy (and torch where installed),
gradcheck, dtypes and bad indices."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _r(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def _idx(shape, high, seed=1):
    return np.random.default_rng(seed).integers(0, high, shape)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(device, dim):
    x = _r(3, 4, 5)
    shape = list(x.shape)
    shape[dim] = 6
    index = _idx(tuple(shape), x.shape[dim])
    t = ag.tensor(x, device=device)
    got = t.gather(dim, ag.tensor(index, device=device))
    np.testing.assert_array_equal(got.numpy(), np.take_along_axis(x, index, dim))
    gradcheck_on(device, lambda p: ag.gather(p, dim, ag.tensor(index, device=device)), x)


def _scatter_ref(x, dim, index, src):
    out = x.copy()
    for pos in np.ndindex(index.shape):
        target = list(pos)
        target[dim] = index[pos]
        out[tuple(target)] += src[pos]
    return out


@pytest.mark.parametrize("dim,index_shape,src_shape", [(0, (4, 3, 5), (4, 3, 5)),
                                                     (2, (2, 3, 5), (3, 4, 6))])
def test_scatter_add(device, dim, index_shape, src_shape):
    """index smaller than x outside dim, src larger than index (only its corner is read)."""
    x, src = _r(3, 4, 5, seed=2), _r(*src_shape, seed=3)
    index = _idx(index_shape, x.shape[dim], seed=4)
    idx = ag.tensor(index, device=device)
    got = ag.tensor(x, device=device).scatter_add(dim, idx, ag.tensor(src, device=device))
    corner = src[tuple(slice(0, e) for e in index_shape)]
    np.testing.assert_allclose(got.numpy(), _scatter_ref(x, dim, index, corner), rtol=1e-14,
                               atol=1e-14)
    gradcheck_on(device, lambda p, q: ag.scatter_add(p, dim, idx, q), x, src)


def test_scatter_add_values(device):
    x, src = _r(3, 4, seed=6), _r(3, 5, seed=7)
    index = _idx((3, 5), 4, seed=8)
    got = ag.tensor(x, device=device).scatter_add(1, ag.tensor(index, device=device),
                                                  ag.tensor(src, device=device))
    np.testing.assert_allclose(got.numpy(), _scatter_ref(x, 1, index, src), rtol=1e-14)


@pytest.mark.parametrize("dim", [0, 1])
def test_index_select(device, dim):
    x = _r(4, 5, seed=9)
    index = np.array([3, 0, 3, 1])
    got = ag.tensor(x, device=device).index_select(dim, ag.tensor(index, device=device))
    np.testing.assert_array_equal(got.numpy(), np.take(x, index, axis=dim))
    gradcheck_on(device, lambda p: ag.index_select(p, dim, ag.tensor(index, device=device)), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    index = _idx((4, 3), 5, seed=10)
    sel = np.array([1, 1, 0])
    check_dtypes(lambda t, s: t.gather(1, ag.tensor(index, device=device)).scatter_add(
        0, ag.tensor(index[:, :3] % 4, device=device), s).index_select(1, ag.tensor(
            sel, device=device)), [_r(4, 5, seed=11), _r(4, 3, seed=12)], device, [dtype],
        scale=4)


def test_bad_index(device):
    t = ag.tensor(_r(3, 4), device=device)
    with pytest.raises(ValueError, match="gather: argument 'index'.*\\[0, 4\\).*-1"):
        t.gather(1, ag.tensor(np.array([[0], [-1], [2]]), device=device))
    with pytest.raises(ValueError, match="index_select: argument 'index'.*\\[0, 3\\).*3"):
        t.index_select(0, ag.tensor(np.array([3]), device=device))
    with pytest.raises(TypeError, match="gather\\(\\): index must be an integer tensor"):
        t.gather(1, ag.tensor(np.zeros((3, 1))))
    with pytest.raises(ValueError, match="gather: argument 'dim'"):
        t.gather(2, ag.tensor(np.zeros((3, 1), np.int64), device=device))


def test_against_torch():
    torch = pytest.importorskip("torch")
    x, src = _r(3, 4, seed=13), _r(3, 4, seed=14)
    index = _idx((3, 4), 4, seed=15)
    for fn in (lambda m, s, i: m.gather(1, i).sum(),
               lambda m, s, i: (m.scatter_add(1, i, s) ** 2).sum(),
               lambda m, s, i: m.index_select(0, i[0] % 3).sum()):
        ours = [ag.tensor(a, requires_grad=True) for a in (x, src)]
        fn(*ours, ag.tensor(index)).backward()
        theirs = [torch.tensor(a, requires_grad=True) for a in (x, src)]
        fn(*theirs, torch.tensor(index)).backward()
        for o, t in zip(ours, theirs, strict=True):
            if t.grad is not None:
                np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-12)
