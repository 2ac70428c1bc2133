"""Factories in torch's spelling: arange, *_like, rand, randint, eye; dtypes, devices, seeds."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag


@pytest.mark.parametrize("args,want", [
    ((5,), np.arange(5)),
    ((2, 9, 3), np.arange(2, 9, 3)),
    ((5, 0, -2), np.arange(5, 0, -2)),
    ((3, 3), np.arange(0)),
    ((0.0, 1.0, 0.25), np.arange(0, 1, 0.25)),
    ((1, 2.5), np.arange(1, 2.5)),
    ((0, 1, 0.1), np.arange(0, 1, 0.1)),
])
def test_arange_values_and_default_dtype(device, args, want):
    got = ag.arange(*args, device=device)
    ints = all(isinstance(a, int) for a in args)
    assert got.dtype == (np.int64 if ints else np.float32)   # torch's defaults
    assert got.device == ag.zeros(1, device=device).device
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    assert ag.arange(*args, dtype=np.float64).dtype == np.float64


def test_like_factories_follow_the_tensor(device):
    t = ag.tensor(np.ones((2, 3), dtype=np.float64), device=device)
    for f, v in ((ag.zeros_like, 0.0), (ag.ones_like, 1.0)):
        r = f(t)
        assert (r.shape, r.dtype, r.device, r.requires_grad) == (t.shape, t.dtype, t.device,
                                                                 False)
        assert np.all(r.numpy() == v)
    r = ag.full_like(t, 2.5, dtype=np.float16, device="cpu", requires_grad=True)
    assert (r.dtype, r.device, r.requires_grad) == (np.float16, "cpu", True)
    assert np.all(r.numpy() == 2.5)


def test_eye(device):
    np.testing.assert_array_equal(ag.eye(3, device=device).numpy(), np.eye(3))
    e = ag.eye(2, 4, dtype=np.float64, requires_grad=True)
    assert e.dtype == np.float64 and e.requires_grad
    np.testing.assert_array_equal(e.numpy(), np.eye(2, 4))


def test_random_factories_are_seeded_by_manual_seed(device):
    ag.manual_seed(5)
    a = (ag.rand(3, 4, device=device).numpy(), ag.randint(2, 9, (50,), device=device).numpy(),
         ag.randn(3, device=device).numpy())
    ag.manual_seed(5)
    b = (ag.rand((3, 4)).numpy(), ag.randint(2, 9, size=(50,)).numpy(), ag.randn(3).numpy())
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert a[0].dtype == np.float32 and 0 <= a[0].min() and a[0].max() < 1
    assert a[1].dtype == np.int64 and a[1].min() >= 2 and a[1].max() <= 8
    assert ag.randint(4, (1000,)).numpy().max() == 3          # randint(high, size)
    assert ag.rand(2, seed=1).numpy().tolist() == ag.rand(2, seed=1).numpy().tolist()
    assert ag.rand(2, dtype=np.float16, requires_grad=True).requires_grad


def test_rand_stays_below_one_in_half_precision():
    r = ag.rand(200_000, dtype=np.float16, seed=0).numpy()
    assert r.max() < 1.0


@pytest.mark.parametrize("call,match", [
    (lambda: ag.arange(0, 5, 0), r"arange: step must be nonzero"),
    (lambda: ag.arange(5, requires_grad=True), r"arange: only floating-point tensors can "
                                               r"require grad, given dtype int64"),
    (lambda: ag.randint(5, 5, (2,)), r"randint: needs low < high, given low=5, high=5"),
    (lambda: ag.rand(2, dtype=np.int32), r"rand: dtype must be a float type, given int32"),
    (lambda: ag.eye(-1), r"eye: sizes must be >= 0"),
])
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
    with pytest.raises(TypeError, match=r"_like: expected a Tensor, given ndarray"):
        ag.zeros_like(np.zeros(2))


def test_against_torch():
    torch = pytest.importorskip("torch")
    for args in ((5,), (0.0, 1.0, 0.1), (1, 2.5), (5, 0, -2)):
        want = torch.arange(*args)
        got = ag.arange(*args)
        assert str(want.dtype).split(".")[1] == str(got.dtype)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-7)
    np.testing.assert_array_equal(ag.eye(2, 3).numpy(), torch.eye(2, 3).numpy())
