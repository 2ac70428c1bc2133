"""gradcheck itself: passes correct gradients, reports the worst wrong one, validates input."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.function import Function


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        return 3 * x * x * dy


class WrongCube(Cube):
    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        g = 3 * x * x * dy
        g[1, 2] *= 1.5  # one wrong element
        return g


class Mix(Function):
    """Two inputs, two outputs: (a * b, a - b)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b, a - b

    @staticmethod
    def backward(ctx, d_prod, d_diff):
        a, b = ctx.saved
        return d_prod * b + d_diff, d_prod * a - d_diff


def _x(device, requires_grad=True):
    rng = np.random.default_rng(3)
    return ag.tensor(rng.uniform(-1, 1, (2, 3)), requires_grad=requires_grad, device=device)


def test_correct_gradient_passes(device):
    assert ag.gradcheck(Cube.apply, [_x(device)])


def test_several_inputs_and_outputs(device):
    b = ag.tensor(np.random.default_rng(4).uniform(-1, 1, (2, 3)), requires_grad=True,
                  device=device)
    assert ag.gradcheck(Mix.apply, [_x(device), b])


def test_wrong_gradient_raises_with_worst_element(device):
    with pytest.raises(ag.GradcheckError, match=r"input 0 at \(1, 2\)"):
        ag.gradcheck(WrongCube.apply, [_x(device)])


def test_inputs_not_requiring_grad_are_constants(device):
    b = ag.tensor(np.full((2, 3), 2.0), device=device)
    assert ag.gradcheck(Mix.apply, [_x(device), b])


def test_rejects_non_float64_and_no_grad_inputs(device):
    x32 = ag.tensor(np.ones((2, 2), np.float32), requires_grad=True, device=device)
    with pytest.raises(ValueError, match="float64"):
        ag.gradcheck(Cube.apply, [x32])
    with pytest.raises(ValueError, match="no input requires grad"):
        ag.gradcheck(Cube.apply, [_x(device, requires_grad=False)])


def test_restores_grad_and_values(device):
    x = _x(device)
    before = x.numpy().copy()
    marker = ag.tensor(np.full((2, 3), 7.0), device=device)
    x.grad = marker
    ag.gradcheck(Cube.apply, [x])
    assert x.grad is marker
    np.testing.assert_array_equal(x.numpy(), before)
