"""where, masked_fill, tril, triu: gradcheck, broadcasting, dtypes, errors, torch."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _r(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def _mask(*shape, seed=0, device="cpu"):
    return ag.tensor(_r(*shape, seed=seed) > 0, device=device)


def test_where_gradcheck_with_broadcasting(device):
    cond = _mask(3, 1, 5, seed=1, device=device)
    gradcheck_on(device, lambda a, b: ag.where(cond, a, b), _r(4, 1), _r(3, 4, 5, seed=2))
    gradcheck_on(device, lambda a: a.where(cond, 0.5), _r(3, 4, 5, seed=3))  # Tensor.where
    gradcheck_on(device, lambda b: ag.where(cond, -1.0, b), _r(5, seed=4))
    a, b = _r(4, 1), _r(3, 4, 5, seed=2)
    got = ag.where(cond, ag.tensor(a, device=device), ag.tensor(b, device=device))
    np.testing.assert_array_equal(got.numpy(), np.where(cond.numpy(), a, b))


def test_masked_fill(device):
    x = _r(2, 3, 4)
    mask = _mask(3, 1, seed=5, device=device)
    gradcheck_on(device, lambda t: t.masked_fill(mask, -1e9), x)
    got = ag.tensor(x, device=device).masked_fill(mask, float("-inf"))
    np.testing.assert_array_equal(got.numpy(), np.where(mask.numpy(), -np.inf, x))
    v = ag.tensor(np.array(2.0), requires_grad=True, device=device)  # a 0-d tensor value
    t = ag.tensor(x, requires_grad=True, device=device)
    ag.masked_fill(t, mask, v).sum().backward()
    assert v.grad.item() == np.broadcast_to(mask.numpy(), x.shape).sum()
    np.testing.assert_array_equal(t.grad.numpy(), np.where(mask.numpy(), 0.0, 1.0) + 0 * x)


def test_causal_mask_idiom(device):
    """torch's habits: triu(1) of a bool ones matrix masked_fill'ed, or where(tril(...))."""
    ones = ag.tensor(np.ones((4, 4), bool), device=device)
    scores = ag.tensor(_r(2, 4, 4), requires_grad=True, device=device)
    ref = np.where(np.tril(np.ones((4, 4), bool)), scores.numpy(), -np.inf)
    out = scores.masked_fill(ones.triu(1), float("-inf"))
    np.testing.assert_array_equal(out.numpy(), ref)
    np.testing.assert_array_equal(ag.where(ones.tril(), scores, float("-inf")).numpy(), ref)


@pytest.mark.parametrize("k", [0, 1, -2, 9])
def test_tril_triu_gradcheck(device, k):
    x = _r(2, 3, 4, 5)
    gradcheck_on(device, lambda t: t.tril(k), x)
    gradcheck_on(device, lambda t: ag.triu(t, diagonal=k), x)
    np.testing.assert_array_equal(ag.tril(ag.tensor(x, device=device), k).numpy(), np.tril(x, k))
    np.testing.assert_array_equal(ag.tensor(x, device=device).triu(k).numpy(), np.triu(x, k))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    cond = _mask(4, 1, seed=3, device=device)
    check_dtypes(lambda a, b: ag.where(cond, a, b).tril(-1), [_r(4, 6, seed=1), _r(6, seed=2)],
                 device, [dtype])


def test_errors_name_the_op():
    x = ag.tensor(_r(3, 4))
    with pytest.raises(TypeError, match="masked_fill\\(\\): argument 'mask' must be a bool "
                                        "Tensor, given dtype float64"):
        x.masked_fill(ag.tensor(np.ones((3, 4))), 0.0)
    with pytest.raises(ValueError, match="masked_fill\\(\\): mask of shape \\(2, 4\\) does not "
                                         "broadcast to the input's shape \\(3, 4\\)"):
        x.masked_fill(ag.tensor(np.ones((2, 4), bool)), 0.0)
    with pytest.raises(ValueError, match="where\\(\\): shapes do not broadcast: condition "
                                         "\\(3, 4\\), input \\(3, 4\\), other \\(2,\\)"):
        ag.where(x > 0, x, ag.tensor(np.ones(2)))
    with pytest.raises(TypeError, match="where\\(\\): argument 'condition' must be a bool"):
        ag.where(x, x, x)
    with pytest.raises(TypeError, match="'input' and 'other' must have one dtype"):
        ag.where(x > 0, x, ag.tensor(np.ones(4, np.float32)))
    with pytest.raises(ValueError, match="tril\\(\\): input must have at least 2 dims"):
        ag.tril(ag.tensor(np.ones(3)))
    with pytest.raises(TypeError, match="triu\\(\\): 'diagonal' must be an int"):
        x.triu(0.5)


def test_against_torch():
    torch = pytest.importorskip("torch")
    x, m = _r(3, 4), _r(4) > 0
    t = torch.tensor(x, requires_grad=True)
    (torch.where(torch.tensor(m), t, -t).tril(1) * 3).sum().backward()
    a = ag.tensor(x, requires_grad=True)
    (ag.where(ag.tensor(m), a, -a).tril(1) * 3).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), t.grad.numpy())
