"""Tape semantics: accumulation, several tapes, grad modes, given grads, freeing, checks."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import autograd as ag
from autograd.function import Function
from autograd.tape import current_tape


class Times(Function):
    """y = k * x, written with array operators so these tests need no plan."""

    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, dy):
        return dy * ctx.k


class Product(Function):
    """y = a * b (same shapes); saves both inputs."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved
        return dy * b, dy * a


class PassBoth(Function):
    """y = a + b returning the very same gradient array for both inputs."""

    @staticmethod
    def forward(ctx, a, b):
        return a + b

    @staticmethod
    def backward(ctx, dy):
        return dy, dy


def leaf(values, device="cpu"):
    return ag.tensor(np.asarray(values, dtype=np.float64), requires_grad=True, device=device)


def test_tensor_used_twice_accumulates(device):
    x = leaf([1.0, 2.0, 3.0], device)
    with ag.Tape() as tape:
        y = Product.apply(x, x)          # x^2: both inputs route to x
        z = Product.apply(y, Times.apply(x, k=3.0))  # 3 x^3
    tape.backward(z, grad=np.ones(3))
    np.testing.assert_allclose(x.grad.numpy(), 9 * np.array([1.0, 4.0, 9.0]))


def test_intermediate_used_twice_accumulates(device):
    x = leaf([0.5, -1.0], device)
    with ag.Tape():
        y = Times.apply(x, k=2.0)
        z = Product.apply(y, y)          # 4 x^2
    z.backward(np.ones(2))
    np.testing.assert_allclose(x.grad.numpy(), 8 * np.array([0.5, -1.0]))


def test_leaf_grad_accumulates_across_backwards(device):
    x = leaf([1.0, 2.0], device)
    for _ in range(3):
        with ag.Tape():
            y = Times.apply(x, k=2.0)
        y.backward(np.ones(2))
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 6.0])


def test_several_tapes_alive_at_once(device):
    w = leaf([1.0, 2.0], device)
    tapes, outs = [], []
    for k in (1.0, 10.0, 100.0):  # three "micro-batches" recorded before any backward
        with ag.Tape() as t:
            outs.append(Times.apply(w, k=k))
        tapes.append(t)
    assert [len(t) for t in tapes] == [1, 1, 1]
    tapes[1].backward(outs[1], np.ones(2))
    np.testing.assert_allclose(w.grad.numpy(), [10.0, 10.0])
    assert tapes[1].freed and not tapes[0].freed and not tapes[2].freed
    outs[2].backward(np.ones(2))
    outs[0].backward(np.ones(2))
    np.testing.assert_allclose(w.grad.numpy(), [111.0, 111.0])


def test_shared_node_from_other_tape_feeds_every_micro_batch(device):
    w = leaf([1.0, 2.0], device)
    with ag.Tape() as outer:
        w2 = Times.apply(w, k=2.0)       # e.g. a weight cast once per step
    micro = []
    for k in (1.0, 3.0):
        with ag.Tape() as t:
            y = Times.apply(w2, k=k)
        micro.append((t, y))
    for t, y in micro:
        t.backward(y, np.ones(2))
    np.testing.assert_allclose(w.grad.numpy(), [8.0, 8.0])
    assert not outer.freed and len(outer) == 1


def test_nested_tapes_innermost_records(device):
    x = leaf([1.0], device)
    with ag.Tape() as outer:
        assert current_tape() is outer
        with ag.Tape() as inner:
            assert current_tape() is inner
            y = Times.apply(x, k=2.0)
        z = Times.apply(x, k=3.0)
    assert len(inner) == 1 and len(outer) == 1
    assert y._node.tape is inner and z._node.tape is outer
    with pytest.raises(RuntimeError, match="recorded on"):
        outer.backward(y, np.ones(1))


def test_default_tape_records_when_none_open(device):
    x = leaf([1.0, 2.0], device)
    y = Times.apply(x, k=4.0)
    assert y.requires_grad and not y.is_leaf
    y.backward(np.ones(2))
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0])


def test_no_grad_and_enable_grad(device):
    x = leaf([1.0], device)
    with ag.no_grad():
        assert not ag.is_grad_enabled()
        y = Times.apply(x, k=2.0)
        with ag.enable_grad():
            z = Times.apply(x, k=2.0)
    assert ag.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf
    assert z.requires_grad

    @ag.no_grad()
    def frozen(t):
        return Times.apply(t, k=2.0)

    assert not frozen(x).requires_grad and ag.is_grad_enabled()
    with ag.set_grad_enabled(False):
        assert not Times.apply(x, k=1.0).requires_grad
    assert ag.is_grad_enabled()


def test_nothing_recorded_without_requires_grad(device):
    x = ag.tensor(np.ones(2), device=device)
    with ag.Tape() as tape:
        y = Times.apply(x, k=2.0)
    assert len(tape) == 0 and not y.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.backward(np.ones(2))


def test_backward_with_given_grad_for_non_scalar(device):
    x = leaf([[1.0, 2.0], [3.0, 4.0]], device)
    with ag.Tape() as tape:
        y = Product.apply(x, x)
    with pytest.raises(RuntimeError, match="one-element"):
        tape.backward(y)
    g = np.array([[1.0, 0.0], [0.5, 2.0]])
    tape.backward(y, grad=g)
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy() * g)


def test_given_grad_of_wrong_shape_is_rejected(device):
    x = leaf([1.0, 2.0], device)
    with ag.Tape() as tape:
        y = Times.apply(x, k=2.0)
    with pytest.raises(RuntimeError, match=r"shape \(2,\)"):
        tape.backward(y, grad=np.ones(3))


def test_scalar_loss_gets_implicit_one(device):
    x = leaf([3.0], device)
    with ag.Tape() as tape:
        y = Product.apply(x, x).reshape(())
    tape.backward(y)
    np.testing.assert_allclose(x.grad.numpy(), [6.0])


def test_second_backward_on_freed_tape_errors_and_retain_allows_it(device):
    x = leaf([1.0, 2.0], device)
    with ag.Tape() as tape:
        y = Product.apply(x, x)
    tape.backward(y, np.ones(2), retain=True)
    tape.backward(y, np.ones(2))
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 8.0])
    with pytest.raises(RuntimeError, match="freed"):
        tape.backward(y, np.ones(2))
    with pytest.raises(RuntimeError, match="freed"):
        y.backward(np.ones(2))


def test_graph_reaching_freed_node_errors(device):
    x = leaf([1.0], device)
    with ag.Tape() as first:
        y = Times.apply(x, k=2.0)
    with ag.Tape():
        z = Times.apply(y, k=2.0)
    first.backward(y, np.ones(1))
    with pytest.raises(RuntimeError, match="freed"):
        z.backward(np.ones(1))


def test_freed_tape_records_again_when_reentered(device):
    x = leaf([1.0], device)
    tape = ag.Tape()
    with tape:
        y = Times.apply(x, k=2.0)
    tape.backward(y, np.ones(1))
    with tape:
        y = Times.apply(x, k=5.0)
    tape.backward(y, np.ones(1))
    np.testing.assert_allclose(x.grad.numpy(), [7.0])


def test_saved_arrays_freed_after_backward():
    x = leaf([1.0, 2.0])
    with ag.Tape() as tape:
        a = Times.apply(x, k=2.0)
        y = Product.apply(a, a)
    ref = weakref.ref(a.data)
    node = y._node
    del a
    gc.collect()
    assert ref() is not None          # saved by Product for backward
    tape.backward(y, np.ones(2))
    gc.collect()
    assert ref() is None
    assert node.freed and node.ctx is None and len(tape) == 0


def test_default_tape_keeps_no_dead_graphs():
    x = leaf([1.0, 2.0])
    a = Times.apply(x, k=2.0)
    y = Product.apply(a, a)
    ref = weakref.ref(a.data)
    del a, y
    gc.collect()
    assert ref() is None


def test_wrong_shaped_grad_from_function_names_it(device):
    class BadShape(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, dy):
            return dy[:1]

    x = leaf([1.0, 2.0], device)
    y = BadShape.apply(x)
    with pytest.raises(RuntimeError, match=r"BadShape.backward .* shape \(1,\) .*\(2,\)"):
        y.backward(np.ones(2))


def test_wrong_dtyped_grad_from_function_names_it(device):
    class BadDtype(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, dy):
            return dy.astype(np.float32)

    x = leaf([1.0, 2.0], device)
    with pytest.raises(RuntimeError, match="BadDtype.backward .* dtype float32"):
        BadDtype.apply(x).backward(np.ones(2))


def test_wrong_number_of_grads_names_function(device):
    class TooMany(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, dy):
            return dy, dy

    with pytest.raises(RuntimeError, match="TooMany.backward returned 2 gradients"):
        TooMany.apply(leaf([1.0], device)).backward(np.ones(1))


def test_needs_input_grad_and_non_tensor_inputs(device):
    seen = {}

    class Probe(Function):
        @staticmethod
        def forward(ctx, a, b, c):
            seen["needs"] = ctx.needs_input_grad
            return a * b

        @staticmethod
        def backward(ctx, dy):
            return dy, None, None

    a = leaf([1.0], device)
    b = ag.tensor(np.array([2.0]), device=device)
    Probe.apply(a, b, 3.0).backward(np.ones(1))
    assert seen["needs"] == (True, False, False)
    np.testing.assert_allclose(a.grad.numpy(), [1.0])
    with ag.no_grad():
        Probe.apply(a, b, 3.0)
    assert seen["needs"] == (False, False, False)


def test_leaf_grads_never_alias(device):
    a, b = leaf([1.0, 2.0], device), leaf([3.0, 4.0], device)
    y = PassBoth.apply(a, b)
    g = np.ones(2)
    y.backward(g)
    a.grad.data[...] = 0.0  # an in-place update (clip_grad_norm_) must not touch b.grad
    np.testing.assert_allclose(b.grad.numpy(), [1.0, 1.0])
    np.testing.assert_allclose(g, [1.0, 1.0])


def test_multi_output_function_materializes_missing_grads(device):
    x = leaf([1.0, 2.0, 3.0, 4.0], device)
    first, second = ag.split(x, 2)  # pieces of 2
    Times.apply(second, k=5.0).backward(np.ones(2))
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0, 5.0, 5.0])


def test_backward_on_leaf_accumulates_grad(device):
    x = leaf([1.0, 2.0], device)
    x.backward(np.array([3.0, 4.0]))
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 4.0])


def test_non_differentiable_outputs(device):
    class WithIndex(Function):
        @staticmethod
        def forward(ctx, x):
            idx = x.argmax(keepdims=True)
            ctx.mark_non_differentiable(idx)
            return x * 1, idx

        @staticmethod
        def backward(ctx, dy, didx):
            return dy

    y, idx = WithIndex.apply(leaf([1.0, 5.0], device))
    assert y.requires_grad and not idx.requires_grad
