"""add/sub/mul/div (broadcasting), scalar operands, neg: gradcheck and dtype sweep."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _r(*shape, seed=0, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, shape)


OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}


@pytest.mark.parametrize("name", list(OPS))
def test_binary_gradcheck_with_broadcasting(device, name):
    a, b = _r(3, 1, seed=1), _r(4, seed=2, low=0.5, high=1.5)
    gradcheck_on(device, OPS[name], a, b)
    gradcheck_on(device, OPS[name], _r(2, 3, seed=3), _r(2, 3, seed=4, low=0.5, high=1.5))


@pytest.mark.parametrize("name", list(OPS))
def test_broadcast_grads_reduce_to_input_shape(device, name):
    a = ag.tensor(_r(2, 1, 3), requires_grad=True, device=device)
    b = ag.tensor(_r(4, 1, low=0.5, high=1.5), requires_grad=True, device=device)
    OPS[name](a, b).backward(np.ones((2, 4, 3)))
    assert a.grad.shape == (2, 1, 3) and b.grad.shape == (4, 1)


def test_scalar_operands(device):
    x = _r(2, 3, low=0.5, high=1.5)
    for fn in (lambda t: t * 2.5, lambda t: 3 * t, lambda t: t / 4, lambda t: 1 - t,
               lambda t: t + 1, lambda t: -t, lambda t: 2.0 / t, lambda t: t - 0.5):
        gradcheck_on(device, fn, x)
    t = ag.tensor(x, device=device)
    np.testing.assert_allclose((1 - t).numpy(), 1 - x)
    np.testing.assert_allclose((2.0 / t).numpy(), 2.0 / x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    a, b = _r(5, 7, seed=5), _r(7, seed=6, low=0.5, high=1.5)
    check_dtypes(lambda p, q: (p * q + p) / q - 2 * p, [a, b], device, [dtype], scale=4)


def test_empty(device):
    a = ag.tensor(np.zeros((0, 3)), requires_grad=True, device=device)
    b = ag.tensor(np.ones(3), requires_grad=True, device=device)
    (a * b).backward(np.zeros((0, 3)))
    assert a.grad.shape == (0, 3)
    np.testing.assert_array_equal(b.grad.numpy(), np.zeros(3))


# -- pow, maximum, minimum, comparisons ----------------------------------------------------


def test_pow_gradcheck_all_forms(device):
    base, exp = _r(3, 1, seed=5, low=0.5, high=2.0), _r(4, seed=6)
    gradcheck_on(device, lambda a, b: a ** b, base, exp)           # tensor ** tensor
    gradcheck_on(device, lambda a: a ** 3, _r(2, 3, seed=7))       # tensor ** int
    gradcheck_on(device, lambda a: a ** 0.5, base)                 # tensor ** float
    gradcheck_on(device, lambda b: 2.5 ** b, exp)                  # scalar ** tensor
    gradcheck_on(device, lambda a, b: ag.pow(a, b), base, exp)
    x = ag.tensor(np.array([2.0, 3.0]), device=device)
    np.testing.assert_allclose((x ** 2).numpy(), [4.0, 9.0])
    np.testing.assert_allclose((2 ** x).numpy(), [4.0, 8.0])
    np.testing.assert_allclose(x.pow(x).numpy(), [4.0, 27.0])


def test_pow_special_values_and_masked_gradients():
    a = ag.tensor(np.array([0.0, 0.0, np.nan, 1.0, -8.0]), requires_grad=True)
    b = ag.tensor(np.array([0.0, 2.0, 0.0, np.nan, 1 / 3]), requires_grad=True)
    c = a ** b
    np.testing.assert_array_equal(c.numpy()[:4], [1.0, 0.0, 1.0, 1.0])
    assert np.isnan(c.numpy()[4])
    c.backward(np.ones(5))
    np.testing.assert_array_equal(a.grad.numpy()[[0, 1, 2]], [0.0, 0.0, 0.0])  # b == 0 -> 0
    np.testing.assert_array_equal(b.grad.numpy()[[0, 1]], [0.0, 0.0])  # a == 0, b >= 0 -> 0


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum(device, name):
    fn = getattr(ag, name)
    a, b = _r(3, 4, seed=8), _r(4, seed=9)
    gradcheck_on(device, fn, a, b)
    x = ag.tensor(np.array([1.0, 2.0, np.nan, 3.0]), requires_grad=True, device=device)
    y = ag.tensor(np.array([1.0, 5.0, 0.0, np.nan]), requires_grad=True, device=device)
    out = getattr(x, name)(y)
    want = np.maximum if name == "maximum" else np.minimum
    np.testing.assert_array_equal(out.numpy(), want(x.numpy(), y.numpy()))  # NaN propagates
    out.backward(np.full(4, 2.0))
    win_x = 1.0 if name == "minimum" else 0.0  # x = 2 < 5: x wins min, loses max
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 2.0 * win_x, 2.0, 2.0])  # tie: half
    np.testing.assert_array_equal(y.grad.numpy(), [1.0, 2.0 * (1 - win_x), 2.0, 2.0])


@pytest.mark.parametrize("name", ["pow", "maximum"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_new_binary_dtypes(device, name, dtype):
    fn = (lambda a, b: a ** b) if name == "pow" else ag.maximum
    check_dtypes(fn, [_r(3, 37, seed=1, low=0.5, high=2.0), _r(37, seed=2)], device, [dtype],
                 scale=8)


def test_comparisons_give_bool_tensors_with_broadcasting(device):
    a, b = np.array([[1.0, 2.0, np.nan]]), np.array([[2.0], [1.0], [np.nan]])
    x, y = (ag.tensor(v, requires_grad=True, device=device) for v in (a, b))
    for op, ref in (("lt", np.less), ("le", np.less_equal), ("gt", np.greater),
                    ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal)):
        got = getattr(x, f"__{op}__")(y)
        assert got.dtype == np.bool_ and got.shape == (3, 3) and not got.requires_grad
        np.testing.assert_array_equal(got.numpy(), ref(a, b), err_msg=op)
        assert getattr(x, op)(y).numpy().tolist() == ref(a, b).tolist()
    np.testing.assert_array_equal((x > 1).numpy(), a > 1)
    np.testing.assert_array_equal((1.5 < x).numpy(), a > 1.5)  # reflected
    np.testing.assert_array_equal((x == 2).numpy(), a == 2)


def test_tensors_stay_hashable_and_bool_is_torch_like():
    x, y = ag.tensor(np.ones(3)), ag.tensor(np.ones(3))
    assert {x: 1, y: 2}[y] == 2 and len({x, y}) == 2
    assert x in [x] and (x == None) is False and (x != "a") is True  # noqa: E711
    assert bool(ag.tensor(np.array([3.0])) > 2) and not (ag.tensor(np.array(1.0)) > 2)
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(x > 0)
    assert (x < ag.tensor(np.full(3, 2, np.float32))).numpy().all()  # promoted to float64
    with pytest.raises(TypeError, match="lt\\(\\): not implemented for float64 and int8"):
        _ = x < ag.tensor(np.ones(3, np.int8))


def test_against_torch():
    torch = pytest.importorskip("torch")
    a, b = _r(3, 4, seed=1, low=0.5, high=2), _r(4, seed=2)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    (ta ** tb).sum().backward()
    x, y = ag.tensor(a, requires_grad=True), ag.tensor(b, requires_grad=True)
    (x ** y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), ta.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(y.grad.numpy(), tb.grad.numpy(), rtol=1e-12)
    np.testing.assert_array_equal((x > y).numpy(), (ta > tb).numpy())
