"""Integer and bool tensors as users type them: comparisons with numbers, int arithmetic
(wrap-around, true division to float32, // and %), torch's type promotion, logical and
bitwise ops, any / all; against NumPy and Python references (and torch where installed)."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from tests.helpers import gradcheck_on


def t(a, device, **kw):
    return ag.tensor(np.asarray(a), device=device, **kw)


def test_mask_and_index_habits(device):
    labels = t(np.array([3, -100, 0, 7]), device)
    mask = t(np.array([1, 0, 2, 0], np.int32), device)
    np.testing.assert_array_equal((labels != -100).numpy(), [True, False, True, True])
    np.testing.assert_array_equal((mask == 0).numpy(), [False, True, False, True])
    np.testing.assert_array_equal((labels >= 3).numpy(), [True, False, False, True])
    np.testing.assert_array_equal((0 < mask).numpy(), [True, False, True, False])  # reflected
    np.testing.assert_array_equal((mask >= 1.5).numpy(), [False, False, True, False])
    for op in ("lt", "le", "gt", "ge", "eq", "ne"):
        got = getattr(labels, op)(mask)  # int64 with int32: compared as int64
        want = getattr(np, {"lt": "less", "le": "less_equal", "gt": "greater",
                            "ge": "greater_equal", "eq": "equal", "ne": "not_equal"}[op])(
            labels.numpy(), mask.numpy())
        np.testing.assert_array_equal(got.numpy(), want, err_msg=op)
        assert got.dtype == np.bool_ and not got.requires_grad


def test_int_arithmetic_dtypes_and_wrap(device):
    i32 = np.iinfo(np.int32)
    a = t(np.array([i32.max, i32.min, -7, 7], np.int32), device)
    b = t(np.array([1, -1, 2, -2], np.int32), device)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal((a + b).numpy(), a.numpy() + b.numpy())  # wraps
        np.testing.assert_array_equal((a - b).numpy(), a.numpy() - b.numpy())
        np.testing.assert_array_equal((a * 3).numpy(), a.numpy() * np.int32(3))
    assert (a + b).dtype == np.int32 and (a * 3).dtype == np.int32 and (a + 2).dtype == np.int32
    np.testing.assert_array_equal((a // b).numpy(), [i32.max, i32.min, -4, -4])
    np.testing.assert_array_equal((a % b).numpy(), [0, 0, 1, -1])
    np.testing.assert_array_equal((-7 // b).numpy(), [-7, 7, -4, 3])
    np.testing.assert_array_equal((t([5, -5], device) % 0).numpy(), [0, 0])  # NumPy's x % 0
    q = t([7, -7, 1], device) / t([2, 2, 3], device)  # true division, float32 (torch)
    assert q.dtype == np.float32
    np.testing.assert_allclose(q.numpy(), [3.5, -3.5, 1 / 3], rtol=1e-7)
    np.testing.assert_array_equal(ag.maximum(b, 0).numpy(), [1, 0, 2, 0])
    np.testing.assert_array_equal(ag.minimum(a, b).numpy(), [1, i32.min, -7, -2])
    np.testing.assert_array_equal((-b).numpy(), [-1, 1, -2, 2])
    assert not (a + b).requires_grad


def test_type_promotion_follows_torch():
    f16 = ag.tensor(np.ones(2, np.float16))
    i32, i64 = ag.tensor(np.ones(2, np.int32)), ag.tensor(np.ones(2, np.int64))
    m = ag.tensor(np.array([True, False]))
    zero_d64 = ag.tensor(np.array(2.0))
    cases = [((f16, 2.5), np.float16), ((i32, 2.5), np.float32), ((i64, 2), np.int64),
             ((i32, i64), np.int64), ((m, 1), np.int64), ((m, True), np.bool_),
             ((m, 1.5), np.float32), ((f16, zero_d64), np.float16), ((i32, zero_d64), np.float64),
             ((f16, ag.tensor(np.ones(2, gp.bfloat16))),
              np.float32), ((f16, i64), np.float16)]
    for (a, b), want in cases:
        assert ag.result_type(a, b) == np.dtype(want), (a, b)
    assert (m + 1).dtype == np.int64 and ((m + 1).numpy() == [2, 1]).all()
    assert (f16 * i64).dtype == np.float16
    with pytest.raises(TypeError, match=r"pow\(\): not implemented for int32"):
        _ = i32 ** 2
    with pytest.raises(RuntimeError, match="cannot be converted to type int32 without overflow"):
        _ = i32 == 2**40


def test_float_operand_promotion_keeps_gradients(device):
    """float32 * float64 is float64 and both get gradients back in their own dtype."""
    x = t(np.array([1.0, 2.0], np.float32), device, requires_grad=True)
    y = t(np.array([3.0, 4.0]), device, requires_grad=True)
    z = x * y
    assert z.dtype == np.float64
    z.backward(np.ones(2))
    assert x.grad.dtype == np.float32 and y.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 4.0])
    k = t(np.array([2, 3]), device)
    w = (x * k).sum()  # int64 tensor with a float32 one: float32, k gets none
    w.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 7.0])


def test_remainder_floor_divide_gradients(device):
    a = np.array([[1.3, -2.7, 0.4]])
    b = np.array([[0.7], [-1.1]])
    gradcheck_on(device, lambda p, q: p % q, a, b)
    gradcheck_on(device, lambda p, q: ag.remainder(p, q) * q, a, b)
    x = t(a, device, requires_grad=True)
    (x // 0.5).sum().backward()  # torch: floor_divide's gradient is zero
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros_like(a))
    np.testing.assert_allclose((x % 1.0).numpy(), a % 1.0, rtol=1e-12)
    np.testing.assert_allclose((x // -0.5).numpy(), a // -0.5)


def test_logical_and_bitwise_ops(device):
    p = t([True, True, False, False], device)
    q = t([True, False, True, False], device)
    np.testing.assert_array_equal((p & q).numpy(), [True, False, False, False])
    np.testing.assert_array_equal((p | q).numpy(), [True, True, True, False])
    np.testing.assert_array_equal((p ^ q).numpy(), [False, True, True, False])
    np.testing.assert_array_equal((~p).numpy(), [False, False, True, True])
    np.testing.assert_array_equal((True & q).numpy(), q.numpy())
    assert (p & q).dtype == np.bool_
    n = t(np.array([0, 5, -3], np.int32), device)
    np.testing.assert_array_equal((~n).numpy(), [-1, -6, 2])
    np.testing.assert_array_equal((n & 6).numpy(), np.array([0, 5, -3]) & 6)
    np.testing.assert_array_equal((n | 8).numpy(), np.array([0, 5, -3]) | 8)
    np.testing.assert_array_equal(n.bitwise_xor(3).numpy(), np.array([0, 5, -3]) ^ 3)
    f = t([0.0, 2.5, -1.0], device)
    np.testing.assert_array_equal(ag.logical_and(f, n).numpy(), [False, True, True])
    np.testing.assert_array_equal(ag.logical_or(f, n).numpy(), [False, True, True])
    np.testing.assert_array_equal(f.logical_xor(p[:3]).numpy(), [True, False, True])
    np.testing.assert_array_equal(ag.logical_not(n).numpy(), [True, False, False])
    np.testing.assert_array_equal(f.logical_not().numpy(), [True, False, False])
    with pytest.raises(TypeError, match=r"bitwise_not\(\): not implemented for float64"):
        _ = ~f
    with pytest.raises(TypeError, match=r"bitwise_or\(\): not implemented for float64 and bool"):
        _ = f | p[:3]
    with pytest.raises(TypeError, match="negation of a bool tensor"):
        _ = -p


@pytest.mark.parametrize("shape,dim,keepdim", [((3, 4), None, False), ((3, 4), 1, False),
                                               ((3, 4), 0, True), ((2, 3, 4), (0, 2), False),
                                               ((2, 3, 4), -1, True), ((), None, False),
                                               ((0, 3), 0, False), ((0, 3), 1, True)])
def test_any_all_match_numpy(device, shape, dim, keepdim):
    rng = np.random.default_rng(3)
    m = rng.uniform(size=shape) < 0.3
    m2 = m.copy()
    if m2.ndim == 2 and m2.size:
        m2[0] = True  # an all-True row
    x = t(m2, device)
    kw = {} if dim is None else {"dim": dim, "keepdim": keepdim}
    axis = None if dim is None else dim
    for op in ("any", "all"):
        got = getattr(x, op)(**kw)
        want = getattr(np, op)(m2, axis=axis, keepdims=keepdim if dim is not None else False)
        assert got.dtype == np.bool_ and got.shape == np.shape(want), (op, got.shape)
        np.testing.assert_array_equal(got.numpy(), want, err_msg=op)
    ints = t((m2 * 3).astype(np.int32), device)
    np.testing.assert_array_equal(ag.any(ints, **kw).numpy(),
                                  np.any(m2, axis=axis, keepdims=keepdim if dim is not None
                                         else False))


def test_any_all_dim_errors():
    x = ag.tensor(np.ones((2, 3), bool))
    with pytest.raises(IndexError, match=r"any\(\): dimension out of range"):
        x.any(2)
    with pytest.raises(ValueError, match="twice"):
        x.all((1, -1))


def test_against_torch():
    torch = pytest.importorskip("torch")
    a = np.array([7, -7, 0, 13, -13], np.int64)
    b = np.array([2, 2, 3, -4, -4], np.int64)
    x, y = ag.tensor(a), ag.tensor(b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for got, want in (((x // y), ta // tb), (x % y, ta % tb), (x / y, ta / tb),
                      (x * 2.5, ta * 2.5), (~x, ~ta), (x & y, ta & tb), (x >= 2.5, ta >= 2.5),
                      ((x > 0).any(), (ta > 0).any()), ((x > 0).all(0), (ta > 0).all(0))):
        assert got.dtype == np.dtype(str(want.dtype).replace("torch.", "")), (got, want)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    for lhs, rhs in ((np.ones(2, np.float16), 2.5), (np.ones(2, np.int32), 2.5),
                     (np.array([True]), 1), (np.ones(2, np.int32), np.array(2.0))):
        assert ag.result_type(ag.tensor(lhs), ag.tensor(rhs) if isinstance(rhs, np.ndarray)
                              else rhs) == np.dtype(str(torch.result_type(
                                  torch.from_numpy(lhs), torch.from_numpy(rhs)
                                  if isinstance(rhs, np.ndarray) else rhs)).replace("torch.", ""))
