"""In-place Tensor methods (__setitem__, add_, mul_, copy_, fill_, zero_): values, gradients
through the tape, the version-counter rule and the leaf / inference-tensor rules."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from gpuplan import backend
from gpuplan.ops.cast.plans import CastPlan

RNG = np.random.default_rng(3)
A = RNG.standard_normal((3, 4))
V = RNG.standard_normal((2,))
MODIFIED = r"modified in place after the op was recorded"


def leaf(a, device="cpu", requires_grad=True):
    return ag.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad,
                     device=device)


def written(index):
    """x * 1 (a non-leaf), then x[index] = value * 2, then a nonlinear read."""
    def fn(x, v):
        y = x * 1.0
        y[index] = v * 2.0
        return y * y
    return fn


@pytest.mark.parametrize("index,vshape", [
    ((0, slice(1, 3)), (2,)),            # a strided view: the array library writes
    (1, (4,)),                           # a contiguous row: the cast plan writes
    ((slice(None), 2), (1,)),            # a broadcast value
    (Ellipsis, (3, 4)),
    (np.array([2, 0]), (2, 4)),          # advanced index: rows
    (np.array([[True, False, True, False]] * 3), (6,)),
])
def test_setitem_values_and_gradcheck(device, index, vshape):
    v = RNG.standard_normal(vshape)
    x = leaf(A, device, requires_grad=False)
    x[index] = leaf(v, device, requires_grad=False)
    want = A.copy()
    want[index] = v
    np.testing.assert_array_equal(x.numpy(), want)
    assert ag.gradcheck(written(index), [leaf(A, device), leaf(v, device)])


def test_setitem_gradients_reach_the_value_and_the_rest():
    x, v = leaf(A), leaf(V)
    y = x * 1.0
    y[0, 1:3] = v
    (y * 3.0).sum().backward()
    want = np.full(A.shape, 3.0)
    want[0, 1:3] = 0
    np.testing.assert_array_equal(x.grad.numpy(), want)
    np.testing.assert_array_equal(v.grad.numpy(), [3.0, 3.0])


def test_setitem_makes_a_tensor_that_needs_no_grad_require_it():
    base, v = leaf(A, requires_grad=False), leaf(V)
    base[2, :2] = v
    assert base.requires_grad and not base.is_leaf
    base.sum().backward()
    np.testing.assert_array_equal(v.grad.numpy(), [1.0, 1.0])


def test_setitem_casts_and_moves_the_value(device):
    x = ag.zeros(2, 3, device=device)
    x[1] = leaf([1.5, 2.5, 3.5])         # float64 on the host into float32 on `device`
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x.numpy(), [[0, 0, 0], [1.5, 2.5, 3.5]])
    x[:, 0] = 7
    x[0, 1:] = [8.0, 9.0]
    np.testing.assert_array_equal(x.numpy(), [[7, 8, 9], [7, 2.5, 3.5]])


@pytest.mark.gpu
def test_contiguous_writes_run_the_cast_plan_on_the_device(accelerator, monkeypatch):
    """The cast kernel itself writes into the tensor's memory (its output pointer is x's)."""
    outputs = []
    run_map = CastPlan._run_map

    def spy(self, stream, ws, args):
        outputs.append(backend.data_ptr(args.y))
        return run_map(self, stream, ws, args)

    monkeypatch.setattr(CastPlan, "_run_map", spy)
    x = ag.zeros(4, 8, device=accelerator)
    x[1:3] = ag.ones(2, 8, dtype=np.float64, device=accelerator)
    assert backend.data_ptr(x.data) + 8 * 4 in outputs
    outputs.clear()
    x.add_(ag.ones(8, device=accelerator))
    assert outputs == [backend.data_ptr(x.data)]
    np.testing.assert_array_equal(x.numpy(), np.r_[np.ones((1, 8)), np.full((2, 8), 2.0),
                                                   np.ones((1, 8))])


def test_overlapping_source_is_read_before_the_write():
    x = ag.tensor(np.arange(6.0))
    x[1:] = x[:-1]
    np.testing.assert_array_equal(x.numpy(), [0, 0, 1, 2, 3, 4])
    y = ag.tensor(np.arange(4.0))
    y.mul_(y)
    np.testing.assert_array_equal(y.numpy(), [0, 1, 4, 9])


@pytest.mark.parametrize("op,ref", [
    (lambda y, v: y.add_(v), lambda a, b: a + b),
    (lambda y, v: y.add_(v, alpha=-0.5), lambda a, b: a - 0.5 * b),
    (lambda y, v: y.mul_(v), lambda a, b: a * b),
    (lambda y, v: y.copy_(v), lambda a, b: np.broadcast_to(b, a.shape)),
    (lambda y, v: y.fill_(v.sum()), lambda a, b: np.full(a.shape, b.sum())),
    (lambda y, v: y.zero_(), lambda a, b: np.zeros(a.shape)),
    (lambda y, v: y.mul_(2.5).add_(1.0), lambda a, b: a * 2.5 + 1.0),
])
def test_inplace_methods_values_and_gradcheck(device, op, ref):
    b = RNG.standard_normal((4,))
    y = leaf(A, device, requires_grad=False)
    assert op(y, leaf(b, device, requires_grad=False)) is y
    np.testing.assert_allclose(y.numpy(), ref(A, b), rtol=1e-14)
    assert y._version >= 1

    def fn(a, v):
        z = F.gelu(a)                    # a non-leaf; gelu saved a, not z
        op(z, v)
        return z * a
    assert ag.gradcheck(fn, [leaf(A, device), leaf(b, device)])


def test_mul_of_itself_uses_the_old_values():
    x = leaf([1.0, 2.0, 3.0])
    y = x * 1.0
    y.mul_(y)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0, 6.0])


def test_inplace_on_a_saved_output_raises_at_backward():
    x = leaf([[1.0, 2.0, 3.0]])
    y = F.softmax(x, dim=-1)             # saves its output
    z = y * 2.0
    y.add_(1.0)
    with pytest.raises(RuntimeError, match=r"Softmax needs saved array 0 .*" + MODIFIED +
                                           r".*Tensor\.add_\(\)"):
        z.sum().backward()
    w = leaf([1.0, 2.0])
    s = w * 1.0
    t = s * w                            # saves s
    s[0] = 5.0
    with pytest.raises(RuntimeError, match=MODIFIED + r".*Tensor\.__setitem__"):
        t.sum().backward()


@pytest.mark.parametrize("op", [
    lambda w: w.zero_(), lambda w: w.fill_(1.0), lambda w: w.add_(1.0),
    lambda w: w.mul_(2.0), lambda w: w.copy_(ag.ones(2)), lambda w: w.__setitem__(0, 1.0),
])
def test_leaf_that_requires_grad_refuses_inplace_unless_no_grad(op):
    w = leaf([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"a leaf tensor that requires grad .* in-place "
                                           r"operation.*autograd\.no_grad\(\)"):
        op(w)
    assert w._version == 0 and w.numpy().tolist() == [1.0, 2.0]   # nothing written
    with ag.no_grad():
        op(w)
    assert w._version == 1 and w.is_leaf and w.requires_grad


@pytest.mark.parametrize("call,err,match", [
    (lambda x: x.add_(ag.ones(3)), ValueError, r"add_\(\): a value of shape \(3,\) cannot "
                                               r"be broadcast to the written shape \(2, 2\)"),
    (lambda x: x.__setitem__(0, [1.0, 2.0, 3.0]), ValueError, r"__setitem__: .*\(3,\).*\(2,\)"),
    (lambda x: x.fill_(ag.ones(2)), ValueError, r"fill_\(\): value must be a number or a 0-d"),
    (lambda x: x.copy_("a"), TypeError, r"copy_\(\): value must be a Tensor, an array or a "
                                        r"number, given str"),
])
def test_bad_values(call, err, match):
    x = ag.zeros(2, 2)
    with pytest.raises(err, match=match):
        call(x)
    assert x._version == 0 and not x.numpy().any()


def test_against_torch():
    torch = pytest.importorskip("torch")
    a, v = torch.tensor(A, requires_grad=True), torch.tensor(V, requires_grad=True)
    y = a * 1.0
    y[0, 1:3] = v
    y.mul_(a)
    y.sum().backward()
    x, w = leaf(A), leaf(V)
    z = x * 1.0
    z[0, 1:3] = w
    z.mul_(x)
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), a.grad.numpy(), rtol=1e-14)
    np.testing.assert_allclose(w.grad.numpy(), v.grad.numpy(), rtol=1e-14)
