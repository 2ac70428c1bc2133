"""References of the per-token quantize family: float64 math, and the documented bit-exact
definition written row by row (independently of the plans' code)."""

from __future__ import annotations

from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import as_dtype, float64
from gpuplan.testing import f64

__all__ = [
    "FLT_MIN",
    "flush_f32",
    "quantize_reference64",
    "quantize_reference_exact",
    "scale_reference64",
    "scaled_reference_exact",
]


FLT_MIN = np.float32(np.finfo(np.float32).tiny)


def flush_f32(a: Any) -> np.ndarray:
    """f32 copy with every |value| < FLT_MIN a zero of the same sign (the quantize family's
    flush to zero, written independently of gpuplan.ops.quantize.plans)."""
    a = np.array(gp.to_host(a), dtype=np.float32)
    mask = np.abs(a) < FLT_MIN
    a[mask] = np.where(np.signbit(a[mask]), np.float32(-0.0), np.float32(0.0))
    return a


def quantize_reference64(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-token quantization in float64 math: (q, scale) with scale = max|x_n| / 127 (NaN
    ignored) and q = round(x / scale) (0 for a zero row or NaN; ties may differ by one from
    the bit-exact definition)."""
    x = f64(x)
    scale = np.fmax.reduce(np.abs(x), axis=1, initial=0.0) / 127.0
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(scale[:, None] > 0, np.round(x / scale[:, None]), 0.0)
    return np.nan_to_num(q, nan=0.0), scale


def quantize_reference_exact(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documented bit-exact per-token quantization (gpuplan.ops.quantize.plans), row by row:
    (q int8, scale f32)."""
    wide = x.dtype == np.float64
    n, d = x.shape
    q = np.zeros((n, d), np.int8)
    scale = np.zeros(n, np.float32)
    for i in range(n):
        row = x[i].astype(np.float64) if wide else flush_f32(x[i].astype(np.float32))
        finite = row[~np.isnan(row)]
        amax = np.abs(finite).max() if finite.size else row.dtype.type(0)
        with np.errstate(over="ignore"):
            s = amax / row.dtype.type(127)
            scale[i] = 0.0 if s < FLT_MIN else np.float32(s)
        if scale[i] == 0:
            continue
        with np.errstate(invalid="ignore"):
            r = np.round(row / row.dtype.type(scale[i]))  # one division in C, half to even
        r[np.isnan(r)] = 0
        q[i] = np.minimum(np.maximum(r, -127), 127).astype(np.int8)
    return q, scale


def scale_reference64(scale: Any) -> np.ndarray:
    """A per-token scale as the family reads it, in float64 (subnormals flushed to 0)."""
    return f64(flush_f32(scale))


def scaled_reference_exact(scale: Any, v: Any, dtype: Any) -> np.ndarray:
    """dtype(C(scale[n]) * C(v[n, d])), C = f32 (flushed) or f64: the bit-exact dequantize
    (v = q) and dequantize backward (v = d_output)."""
    s, v = flush_f32(scale), gp.to_host(v)
    if as_dtype(dtype) == float64:
        return (s.astype(np.float64)[:, None] * v.astype(np.float64)).astype(dtype)
    return flush_f32(s[:, None] * flush_f32(v.astype(np.float32))).astype(dtype)
