"""RMSNorm as Llama computes it: statistics and normalisation in float32 for f16/bf16 inputs
(float64 for f64), on the host and the device, through nn.RMSNorm."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd import nn
from gpuplan.dtypes import bfloat16, float16
from gpuplan.testing import f64

HALVES = [pytest.param(bfloat16, id="bf16"), pytest.param(float16, id="f16")]


@pytest.mark.parametrize("dtype", HALVES)
def test_half_statistics_are_float32(device, dtype):
    """4096 ones: a half-precision running sum of squares stalls at 256 (bf16) or 2048 (f16)
    and would give y = 4 (or sqrt(2)); float32 statistics give exactly 1."""
    norm = nn.RMSNorm(4096, eps=1e-5, dtype=dtype).to(device=device)
    y = norm(ag.tensor(np.ones((3, 4096), dtype), device=device))
    assert y.dtype == dtype
    np.testing.assert_allclose(f64(y.data), 1.0 / np.sqrt(1.0 + 1e-5), rtol=2 ** -8)


@pytest.mark.parametrize("dtype", HALVES)
def test_half_matches_the_float32_formula(device, dtype):
    """y = weight * x * rsqrt(mean(x^2) + eps) evaluated in float32 from the rounded half
    inputs, then rounded once to the dtype: equal up to that one rounding (and the order
    of the float32 sum)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 1000)) * np.exp(rng.uniform(-3, 3, (5, 1)))).astype(dtype)
    w = rng.uniform(0.5, 1.5, 1000).astype(dtype)
    norm = nn.RMSNorm(1000, eps=1e-6, dtype=dtype).to(device=device)
    norm.weight.data[...] = ag.tensor(w, device=device).data
    y = f64(norm(ag.tensor(x, device=device)).data)
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    want = x32 * (1 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(1e-6)))
    want = (want * w32).astype(np.float64)
    ulp = 2.0 ** (-8 if dtype == bfloat16 else -11)
    np.testing.assert_allclose(y, want, rtol=ulp, atol=0)


def test_float64_stays_float64(device):
    x = np.random.default_rng(1).standard_normal((4, 333)) * 1e3
    norm = nn.RMSNorm(333, eps=1e-5, dtype=np.float64).to(device=device)
    y = norm(ag.tensor(x, device=device))
    assert y.dtype == np.float64
    want = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-14, atol=0)
