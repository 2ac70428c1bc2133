"""The float32 host GELU (gpuplan.host_math.normal_cdf_f32 and the f32 SKUs of 'gelu')
against float64 references built on the C library's erf."""

from __future__ import annotations

import math

import numpy as np

import gpuplan as gp
from gpuplan.host_math import normal_cdf_f32

_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _phi64(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _ERF(x.astype(np.float64) / math.sqrt(2.0)))


def _grid() -> np.ndarray:
    """A dense grid over [-10, 10], the clip points' neighbours, huge values, random normals."""
    edge = np.float32(5.7)
    near = np.array([edge, np.nextafter(edge, 0), np.nextafter(edge, np.inf)], np.float32)
    rng = np.random.default_rng(0)
    pos = np.concatenate([np.linspace(0, 10, 200_001, dtype=np.float32), near,
                          np.array([20, 1e4, 1e30], np.float32),
                          np.abs(rng.standard_normal(50_000)).astype(np.float32) * 3])
    return np.concatenate([pos, -pos])


def _cdf(x: np.ndarray) -> np.ndarray:
    out, s1, s2 = (np.empty_like(x) for _ in range(3))
    return normal_cdf_f32(x, out, s1, s2)


def test_normal_cdf_f32_is_within_its_stated_error_and_in_range():
    x = _grid()
    got = _cdf(x)
    assert got.dtype == np.float32
    assert np.abs(got - _phi64(x)).max() < 3e-7
    assert got.min() >= 0 and got.max() <= 1
    beyond = np.abs(x) > 5.7
    assert (got[beyond] == (x[beyond] > 0)).all()  # exactly 0 and 1 in the tails
    # As good as float32 allows near the middle, where Phi is not close to 0 or 1.
    mid = np.abs(x) < 1
    assert np.abs(got[mid] - _phi64(x[mid])).max() < 2e-7


def test_normal_cdf_f32_special_values():
    got = _cdf(np.array([0.0, -0.0, np.inf, -np.inf, np.nan], np.float32))
    assert got[:4].tolist() == [0.5, 0.5, 1.0, 0.0]
    assert np.isnan(got[4])


def test_gelu_f32_plans_match_float64_to_a_few_units_of_2_to_the_minus_24():
    x = _grid()
    dy = np.random.default_rng(1).uniform(-2, 2, x.size).astype(np.float32)
    xd, phi = x.astype(np.float64), _phi64(x)
    y = gp.functional.unary("gelu", x)
    assert y.dtype == np.float32
    # |y - x Phi(x)| <= |x| |dPhi| + rounding: relative to max(1, |x|).
    assert (np.abs(y - xd * phi) / np.maximum(1.0, np.abs(xd))).max() < 3e-7
    assert (y[x < -5.7] == 0).all() and (y[x > 5.7] == x[x > 5.7]).all()
    dx = gp.functional.unary_backward("gelu", x, dy)
    with np.errstate(over="ignore"):
        want = dy * (phi + xd * np.exp(-xd * xd / 2) / math.sqrt(2 * math.pi))
    assert (np.abs(dx - want) / np.maximum(1.0, np.abs(dy))).max() < 4e-7


def test_gelu_half_types_round_the_f32_result():
    """bf16 and f16 run the f32 block math on converted blocks: their result is the f32
    result rounded once."""
    x32 = np.random.default_rng(2).uniform(-6, 6, 100_003).astype(np.float32)
    for dtype in (gp.bfloat16, np.float16):
        x = x32.astype(dtype)
        want = gp.functional.unary("gelu", x.astype(np.float32)).astype(dtype)
        np.testing.assert_array_equal(gp.functional.unary("gelu", x), want)
        dy = x[::-1].copy()
        want = gp.functional.unary_backward("gelu", x.astype(np.float32),
                                            dy.astype(np.float32)).astype(dtype)
        np.testing.assert_array_equal(gp.functional.unary_backward("gelu", x, dy), want)


def test_the_table_rows_give_the_plans_bits_on_float32_arrays():
    """The 'gelu' row's forward/backward on float32 arrays (what the host GEMM epilogue
    calls) run the same float32 block math as the plans."""
    from gpuplan.ops.activation.plans import ACTIVATIONS
    row = next(a for a in ACTIVATIONS if a.name == "gelu")
    rng = np.random.default_rng(3)
    x = rng.uniform(-7, 7, (300, 257)).astype(np.float32)
    dy = rng.uniform(-1, 1, (300, 257)).astype(np.float32)
    y = row.forward(x, None)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_array_equal(y, gp.functional.unary("gelu", x))
    np.testing.assert_array_equal(row.backward(x, dy, None),
                                  gp.functional.unary_backward("gelu", x, dy))
    np.testing.assert_array_equal(row.forward(x.T, None), y.T)  # a strided view
