"""fp32 gradient accumulation for f16/bf16 leaves (autograd.tape): the sum of several
backward passes is rounded once from float32, not after every addition; an in-place change
or a new gradient tensor restarts the sum from the gradient as it is; zero_grad drops it."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd import nn, optim


def _backward_with(w: nn.Parameter, g: float) -> None:
    """One backward that delivers the gradient `g` (every element) to `w`."""
    with ag.Tape() as tape:
        c = gp.asarray(np.full(w.shape, g, np.float32).astype(w.dtype), device=w.device)
        loss = (w * ag.tensor(c)).sum()
    tape.backward(loss)


@pytest.mark.parametrize("dtype", [gp.bfloat16, np.float16])
def test_three_gradients_are_summed_in_float32_and_rounded_once(device, dtype):
    eps = 2.0 ** -8 if dtype == gp.bfloat16 else 2.0 ** -11  # half an ulp of 1.0
    w = nn.Parameter(gp.asarray(np.ones(4, np.float32).astype(dtype), device=device))
    for g in (1.0, eps, eps):
        _backward_with(w, g)
    got = gp.to_host(w.grad.data).astype(np.float64)
    np.testing.assert_array_equal(got, 1.0 + 2 * eps)  # representable: 1 + one ulp
    # Rounded after each addition (the old behaviour), 1 + eps ties to 1, twice:
    lowp = (np.array(1.0, dtype) + np.array(eps, dtype)).astype(dtype) + np.array(eps, dtype)
    assert float(lowp.astype(dtype)) == 1.0


def test_an_in_place_change_restarts_the_sum_from_the_gradient(device):
    dtype = gp.bfloat16
    w = nn.Parameter(gp.asarray(np.ones(3, np.float32).astype(dtype), device=device))
    _backward_with(w, 1.0)
    _backward_with(w, 1.0)
    w.grad.mul_(0.5)  # e.g. clipping: the float32 sum no longer describes .grad
    _backward_with(w, 0.25)
    np.testing.assert_array_equal(gp.to_host(w.grad.data).astype(np.float64), 1.25)
    w.grad = ag.tensor(gp.asarray(np.full(3, 3.0, np.float32).astype(dtype), device=device))
    _backward_with(w, 1.0)
    np.testing.assert_array_equal(gp.to_host(w.grad.data).astype(np.float64), 4.0)


def test_zero_grad_drops_the_float32_sum():
    w = nn.Parameter(np.ones(2, np.float32).astype(gp.bfloat16))
    opt = optim.AdamW([w], lr=1e-3)
    _backward_with(w, 1.0)
    _backward_with(w, 1.0)
    assert "_grad_acc" in w.__dict__
    opt.zero_grad()
    assert w.grad is None and "_grad_acc" not in w.__dict__
    _backward_with(w, 2.0)
    np.testing.assert_array_equal(gp.to_host(w.grad.data).astype(np.float64), 2.0)


def test_float32_leaves_accumulate_as_before():
    w = nn.Parameter(np.ones(2, np.float32))
    for g in (1.0, 2.0 ** -30):
        _backward_with(w, g)
    np.testing.assert_array_equal(w.grad.numpy(), np.float32(1.0) + np.float32(2.0 ** -30))
    assert "_grad_acc" not in w.__dict__
