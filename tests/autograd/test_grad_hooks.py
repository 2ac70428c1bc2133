"""Post-accumulate gradient hooks (Tensor.register_post_accumulate_grad_hook): each runs once
per backward per leaf, after the leaf's last contribution, and sees the final .grad."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import nn
from autograd import tape as tape_mod


def leaf(values, device="cpu", dtype=np.float64):
    return ag.tensor(np.asarray(values, dtype=dtype), requires_grad=True, device=device)


def _recorder(log, name):
    def hook(t):
        log.append((name, gp.to_host(t.grad.data).astype(np.float64).copy()))
    return hook


def test_fires_once_after_every_contribution(device):
    """x is read by three ops (one of them early in forward, so its backward runs last):
    the hook runs once, with the sum of all three contributions."""
    x = leaf([1.0, 2.0], device)
    w = leaf([3.0, 4.0], device)
    log = []
    x.register_post_accumulate_grad_hook(_recorder(log, "x"))
    w.register_post_accumulate_grad_hook(_recorder(log, "w"))
    with ag.Tape() as tape:
        a = x * 2.0            # x's first reader: its backward runs last
        b = (a * w).sum()      # w read once, late
        loss = b + (x * x).sum()
    tape.backward(loss)
    names = [n for n, _ in log]
    assert sorted(names) == ["w", "x"] and names.count("x") == 1
    got = dict(log)
    np.testing.assert_array_equal(got["x"], 2.0 * np.array([3.0, 4.0]) + 2 * np.array([1, 2]))
    np.testing.assert_array_equal(got["w"], [2.0, 4.0])
    # The hook ran after the last contribution: what it saw is the final gradient.
    np.testing.assert_array_equal(got["x"], gp.to_host(x.grad.data))


def test_fires_in_the_order_backward_finishes_the_leaves(device):
    """A chain of layers: the last layer's weight is final first (reverse of forward)."""
    ws = [leaf(np.full(3, 1.0 + i), device) for i in range(4)]
    order = []
    for i, w in enumerate(ws):
        w.register_post_accumulate_grad_hook(lambda t, i=i: order.append(i))
    with ag.Tape() as tape:
        h = leaf([1.0, 1.0, 1.0], device)
        for w in ws:
            h = h * w
        loss = h.sum()
    tape.backward(loss)
    assert order == [3, 2, 1, 0]


def test_fires_at_the_point_its_gradient_is_final_not_at_the_end(device):
    """When w0's hook runs, later leaves (read earlier in forward) have no gradient yet."""
    w0, w1 = leaf([2.0], device), leaf([3.0], device)
    seen = {}
    w1.register_post_accumulate_grad_hook(lambda t: seen.setdefault("w0", w0.grad))
    with ag.Tape() as tape:
        loss = ((w0 * 5.0) * w1).sum()  # w1's reader runs first in backward
    tape.backward(loss)
    assert seen == {"w0": None} and w0.grad is not None


def test_once_per_backward_across_micro_batches_and_with_half_accumulation(device):
    """Three backwards: three calls, each seeing the running f32-accumulated bf16 sum."""
    dtype = gp.bfloat16
    w = nn.Parameter(gp.asarray(np.ones(4, np.float32).astype(dtype), device=device))
    log = []
    w.register_post_accumulate_grad_hook(_recorder(log, "w"))
    eps = 2.0 ** -8
    for g in (1.0, eps, eps):
        with ag.Tape() as tape:
            c = gp.asarray(np.full(4, g, np.float32).astype(dtype), device=device)
            loss = (w * ag.tensor(c)).sum() + (w * ag.tensor(c * 0)).sum()
        tape.backward(loss)
    assert len(log) == 3
    np.testing.assert_array_equal(log[0][1], 1.0)
    np.testing.assert_array_equal(log[2][1], 1.0 + 2 * eps)  # rounded once from f32
    np.testing.assert_array_equal(log[2][1], gp.to_host(w.grad.data).astype(np.float64))


def test_not_called_without_a_gradient_or_when_unreached(device):
    x, y = leaf([1.0], device), leaf([2.0], device)
    calls = []
    x.register_post_accumulate_grad_hook(lambda t: calls.append("x"))
    y.register_post_accumulate_grad_hook(lambda t: calls.append("y"))
    with ag.Tape() as tape:
        loss = (x * 3.0).sum()  # y not used
    tape.backward(loss)
    assert calls == ["x"]


def test_leaf_root_and_remove(device):
    x = leaf([1.0, 2.0], device)
    calls = []
    handle = x.register_post_accumulate_grad_hook(lambda t: calls.append(t))
    x.backward(grad=np.ones(2))
    assert calls == [x]
    handle.remove()
    handle.remove()  # a second remove does nothing
    x.backward(grad=np.ones(2))
    assert calls == [x] and tape_mod.HOOKS_ATTR not in x.__dict__
    assert tape_mod._hooked_leaves >= 0


def test_several_hooks_run_in_registration_order(device):
    x = leaf([1.0], device)
    calls = []
    x.register_post_accumulate_grad_hook(lambda t: calls.append(1))
    h2 = x.register_post_accumulate_grad_hook(lambda t: calls.append(2))
    x.register_post_accumulate_grad_hook(lambda t: calls.append(3))
    with ag.Tape() as tape:
        loss = (x * 2.0).sum()
    tape.backward(loss)
    h2.remove()
    with ag.Tape() as tape:
        loss = (x * 2.0).sum()
    tape.backward(loss)
    assert calls == [1, 2, 3, 1, 3]


def test_bad_registrations_are_refused():
    x = leaf([1.0])
    with pytest.raises(TypeError, match="register_post_accumulate_grad_hook: hook"):
        x.register_post_accumulate_grad_hook(3)
    with pytest.raises(RuntimeError, match="non-leaf"):
        (x * 2.0).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(RuntimeError, match="requires_grad=False"):
        ag.tensor(np.ones(2)).register_post_accumulate_grad_hook(lambda t: None)
