"""Tensor shape methods in torch's spelling: squeeze, unsqueeze, flatten, expand, repeat,
contiguous, casts; gradcheck on host and device."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag

RNG = np.random.default_rng(7)
A = RNG.standard_normal((2, 1, 3))


def leaf(a, device="cpu"):
    return ag.tensor(np.asarray(a, dtype=np.float64), requires_grad=True, device=device)


@pytest.mark.parametrize("call,ref", [
    (lambda t: t.squeeze(), lambda a: a.squeeze()),
    (lambda t: t.squeeze(1), lambda a: a.squeeze(1)),
    (lambda t: t.squeeze(0), lambda a: a),              # a non-1 dim is left, as torch
    (lambda t: t.squeeze((0, 1)), lambda a: a.squeeze(1)),
    (lambda t: t.unsqueeze(-1), lambda a: a[..., None]),
    (lambda t: t.unsqueeze(0), lambda a: a[None]),
    (lambda t: t.flatten(), lambda a: a.reshape(-1)),
    (lambda t: t.flatten(1), lambda a: a.reshape(2, 3)),
    (lambda t: t.flatten(0, 1), lambda a: a.reshape(2, 3)),
    (lambda t: t.expand(2, 4, 3), lambda a: np.broadcast_to(a, (2, 4, 3))),
    (lambda t: t.expand(5, -1, 2, -1), lambda a: np.broadcast_to(a, (5, 2, 2, 3))),
    (lambda t: t.repeat(2, 3, 1), lambda a: np.tile(a, (2, 3, 1))),
    (lambda t: t.repeat(2, 1, 2, 2), lambda a: np.tile(a, (2, 1, 2, 2))),
    (lambda t: t.repeat(1, 1, 1), lambda a: a),
    (lambda t: t.repeat((3, 2, 1)), lambda a: np.tile(a, (3, 2, 1))),
    (lambda t: t.contiguous(), lambda a: a),
])
def test_values_and_gradcheck(device, call, ref):
    x = leaf(A, device)
    np.testing.assert_array_equal(call(x).numpy(), ref(A))
    assert ag.gradcheck(call, [leaf(A, device)])


def test_repeat_backward_sums_the_tiles():
    x = leaf([[1.0, 2.0]])
    x.repeat(3, 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[6.0, 6.0]])


def test_repeat_zero_count_gives_an_empty_tensor_and_zero_grad():
    x = leaf([[1.0, 2.0]])
    y = x.repeat(0, 2)
    assert y.shape == (0, 4)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0.0, 0.0]])


def test_zero_d_cases():
    s = ag.tensor(np.float64(2.0))
    assert s.flatten().shape == (1,) and s.unsqueeze(0).shape == (1,)
    assert s.squeeze().shape == () and s.repeat(2, 3).shape == (2, 3)


def test_contiguous_returns_self_or_a_copy():
    x = ag.tensor(A)
    assert x.contiguous() is x
    base = np.arange(12.0).reshape(3, 4)
    y = ag.Tensor(base.T)                # a non-contiguous array given by the user
    c = y.contiguous()
    assert c is not y and c.data.flags.c_contiguous and not np.shares_memory(c.data, base)
    np.testing.assert_array_equal(c.numpy(), base.T)


@pytest.mark.parametrize("method,dtype", [("half", np.float16), ("float", np.float32),
                                          ("double", np.float64), ("bfloat16", "bfloat16")])
def test_casts(device, method, dtype):
    x = leaf(A, device)
    y = getattr(x, method)()
    assert y.dtype == np.dtype(ag.tensor(np.zeros(1), dtype=dtype).dtype)
    assert y.device == x.device
    y.float().sum().backward()
    assert x.grad.dtype == np.float64 and x.grad.shape == A.shape
    assert x.to(np.float32).dtype == np.float32   # to(dtype) positional, as torch


@pytest.mark.parametrize("call,match", [
    (lambda t: t.expand(2, 3), r"expand: the number of sizes \(2\) must be >= .*\(2, 1, 3\)"),
    (lambda t: t.expand(3, 4, 3), r"expand: size 3 at dim 0 does not match .* size 2"),
    (lambda t: t.expand(-1, 2, -1, -1), r"expand: -1 is not allowed for a new leading dim"),
    (lambda t: t.repeat(2, 2), r"repeat: needs at least 3 repeat counts .*given 2"),
    (lambda t: t.repeat(1, -1, 1), r"repeat: repeat counts must be >= 0"),
    (lambda t: t.unsqueeze(4), r"unsqueeze: dim 4 out of range for a 4-d tensor"),
    (lambda t: t.squeeze(3), r"squeeze: dim 3 out of range"),
    (lambda t: t.flatten(2, 1), r"flatten: start_dim 2 comes after end_dim 1"),
])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call(ag.tensor(A))


def test_against_torch():
    torch = pytest.importorskip("torch")
    a = torch.tensor(A, requires_grad=True)
    x = leaf(A)
    for f in (lambda t: t.repeat(2, 1, 2, 1), lambda t: t.expand(4, -1, 2, -1),
              lambda t: t.squeeze(1).unsqueeze(0).flatten(0, 1)):
        a.grad, x.grad = None, None
        (f(a) ** 2).sum().backward()
        (f(x) * f(x)).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), a.grad.numpy(), rtol=1e-12)
