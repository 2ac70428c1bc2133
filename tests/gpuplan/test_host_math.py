"""Host special functions (gpuplan.host_math) against the C library's erf (math.erf)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuplan.host_math import erf, erf_float32

_REF = np.vectorize(math.erf, otypes=[np.float64])
_TINY = np.finfo(np.float64).tiny


def _points() -> np.ndarray:
    """Dense grids, every magnitude from subnormal to huge, random normals and each range
    boundary (0.46875, 4, 6) with its floating-point neighbours, in both signs."""
    rng = np.random.default_rng(0)
    edges = np.array([0.46875, 4.0, 6.0, 26.5])
    near = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf)])
    pos = np.concatenate([np.linspace(0, 8, 40001), np.geomspace(5e-324, 1e300, 20001), near,
                          np.abs(rng.standard_normal(20000)) * 3])
    return np.concatenate([pos, -pos])


def test_erf_matches_the_c_library_to_a_few_ulps():
    x = _points()
    got, want = erf(x), _REF(x)
    normal = np.abs(want) >= _TINY
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert rel.max() < 1e-15, x[normal][np.argmax(rel)]
    # Subnormal results: a few units of the smallest subnormal.
    assert np.abs(got[~normal] - want[~normal]).max() <= 4 * 5e-324


def test_erf_is_odd_and_saturates():
    x = _points()
    np.testing.assert_array_equal(erf(-x), -erf(x))
    assert erf(np.array([6.0, 1e300, -30.0])).tolist() == [1.0, 1.0, -1.0]


def test_erf_special_values_shapes_and_dtypes():
    got = erf(np.array([0.0, -0.0, np.inf, -np.inf, np.nan]))
    assert got[:4].tolist() == [0.0, 0.0, 1.0, -1.0]
    assert np.signbit(got[:2]).tolist() == [False, True]
    assert np.isnan(got[4])
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    y = erf(x)
    assert y.shape == (3, 4) and y.dtype == np.float64
    np.testing.assert_allclose(y, _REF(x.astype(np.float64)), rtol=1e-15)
    assert erf(np.zeros((0, 3))).shape == (0, 3)
    assert erf(np.float64(0.5)).shape == () and erf(np.float64(0.5)) == erf(np.array([0.5]))[0]
    # Only the small range, only the large range: each path alone.
    np.testing.assert_allclose(erf(np.array([0.1, -0.2])), _REF(np.array([0.1, -0.2])),
                               rtol=1e-15)
    np.testing.assert_allclose(erf(np.array([1.5, -5.0])), _REF(np.array([1.5, -5.0])),
                               rtol=1e-15)


def test_erf_float32_is_within_its_stated_error():
    x = _points()
    inside = np.abs(x) <= 4
    got, want = erf_float32(x), _REF(x)
    normal = inside & (np.abs(want) >= _TINY)
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert rel.max() < 3e-9, x[normal][np.argmax(rel)]
    assert np.abs(got[~inside] - want[~inside]).max() < 2e-8
    assert got.dtype == np.float64 and erf_float32(x.reshape(2, -1)).shape == (2, x.size // 2)
    xf = np.linspace(-6, 6, 1001, dtype=np.float32)
    scaled = erf_float32(xf, scale=1 / math.sqrt(2))  # erf(x / sqrt 2), as GELU uses it
    np.testing.assert_allclose(scaled, _REF(xf.astype(np.float64) / math.sqrt(2)), rtol=3e-9,
                               atol=2e-8)


def test_erf_float32_rounds_to_float32_like_erf():
    x = np.random.default_rng(1).standard_normal(200_000).astype(np.float32) * 2.5
    got = erf_float32(x).astype(np.float32)
    want = _REF(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want))
    assert ulps.max() <= 1
    assert np.mean(got == want) > 0.95


def test_erf_float32_special_values():
    got = erf_float32(np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype=np.float32))
    assert got[:2].tolist() == [0.0, 0.0] and np.signbit(got[:2]).tolist() == [False, True]
    np.testing.assert_allclose(got[2:4], [1.0, -1.0], atol=2e-8)
    assert np.isnan(got[4])
    assert erf_float32(np.zeros(0, np.float32)).shape == (0,)


@pytest.mark.parametrize("n", [1, 1000, 300_000])
def test_erf_paths_agree_after_float32_rounding(n):
    x = np.random.default_rng(n).uniform(-5, 5, n)
    a = erf(x).astype(np.float32).astype(np.float64)
    b = erf_float32(x).astype(np.float32).astype(np.float64)
    assert (np.abs(a - b) <= np.spacing(np.abs(a).astype(np.float32))).all()
