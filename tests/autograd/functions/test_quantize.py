"""Per-token quantize/dequantize with straight-through gradients.

Rounding has zero derivative almost everywhere, so central differences cannot check these
Functions; the test checks the contract's straight-through rule instead (d_x = d_q,
d_q = scale * d_y, so d_x = scale[n] * d_y[n, :]) against a float64 reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from autograd.nn import functional as F
from gpuplan.ops.quantize.reference import quantize_reference64, scale_reference64
from gpuplan.testing import assert_close, f64
from tests.helpers import DTYPES


def _x(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-2, 2, shape)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_and_straight_through(device, dtype):
    x = _x(5, 33).astype(dtype)
    t = ag.tensor(x, requires_grad=True, device=device)
    q, scale = F.quantize_per_token(t)
    assert q.dtype == np.int8 and scale.dtype == np.float32
    assert q.requires_grad and not scale.requires_grad
    ref_q, ref_scale = quantize_reference64(x)
    np.testing.assert_allclose(f64(scale.data), ref_scale, rtol=1e-6)
    assert np.abs(f64(q.data) - ref_q).max() <= 1  # ties may round the other way
    y = F.dequantize_per_token(q, scale, dtype)
    assert y.dtype == dtype
    # round-to-nearest: |y - x| <= scale / 2 (plus y's own rounding to dtype)
    bound = f64(scale.data)[:, None] / 2 + np.abs(f64(x)) * 2 * gp.dtypes.eps(dtype)
    assert np.all(np.abs(f64(y.data) - f64(x)) <= bound)
    dy = _x(5, 33, seed=1).astype(dtype)
    y.backward(dy)
    assert t.grad.dtype == dtype and t.grad.shape == (5, 33)
    assert_close(t.grad.data, scale_reference64(scale.data)[:, None] * f64(dy), dtype, scale=2)


def test_zero_row_and_errors(device):
    x = np.zeros((2, 4))
    x[1] = [1.0, -2.0, 0.5, 0.0]
    t = ag.tensor(x, requires_grad=True, device=device)
    q, scale = F.quantize_per_token(t)
    assert scale.numpy()[0] == 0 and not q.numpy()[0].any()
    F.dequantize_per_token(q, scale, np.float64).backward(np.ones((2, 4)))
    np.testing.assert_allclose(t.grad.numpy(), np.repeat(scale.numpy()[:, None], 4, 1))
    with pytest.raises(ValueError, match="N, D"):
        F.quantize_per_token(ag.tensor(np.zeros(3), device=device))


def test_empty(device):
    t = ag.tensor(np.zeros((0, 4)), requires_grad=True, device=device)
    q, scale = F.quantize_per_token(t)
    F.dequantize_per_token(q, scale, np.float64).backward(np.zeros((0, 4)))
    assert t.grad.shape == (0, 4)
