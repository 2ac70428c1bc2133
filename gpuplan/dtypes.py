"""The float and index dtypes the kernels support, and their CUDA C names."""

from __future__ import annotations

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int8 = np.dtype(np.int8)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)

FLOAT_DTYPES: tuple[np.dtype, ...] = (float32, float64, float16, bfloat16)
HALF_DTYPES: tuple[np.dtype, ...] = (float16, bfloat16)
INDEX_DTYPES: tuple[np.dtype, ...] = (int32, int64)

_CUDA_NAMES = {
    float32: "float",
    float64: "double",
    float16: "__half",
    bfloat16: "__nv_bfloat16",
    int8: "signed char",
    int32: "int",
    int64: "long long",
}

_SHORT_NAMES = {
    float32: "f32",
    float64: "f64",
    float16: "f16",
    bfloat16: "bf16",
    int8: "i8",
    int32: "i32",
    int64: "i64",
}


def as_dtype(dtype: object) -> np.dtype:
    """Normalise anything NumPy accepts (np.float32, 'float32', ml_dtypes.bfloat16)."""
    if isinstance(dtype, str) and dtype in ("bf16", "bfloat16"):
        return bfloat16
    return np.dtype(dtype)


def cuda_name(dtype: object) -> str:
    """CUDA C type used in kernel templates for this dtype."""
    return _CUDA_NAMES[as_dtype(dtype)]


def short_name(dtype: object) -> str:
    """Short tag such as 'f32' or 'bf16' used in SKU names and reports."""
    d = as_dtype(dtype)
    return _SHORT_NAMES.get(d, d.name)


def accumulator(dtype: object) -> np.dtype:
    """Accumulation dtype: half types accumulate in float32."""
    d = as_dtype(dtype)
    return float32 if d in HALF_DTYPES else d


def is_float(dtype: object) -> bool:
    return as_dtype(dtype) in FLOAT_DTYPES


def eps(dtype: object) -> float:
    """Machine epsilon (unit roundoff * 2) of a float dtype, bf16 included."""
    d = as_dtype(dtype)
    if d == bfloat16:
        return float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps)
    return float(np.finfo(d).eps)
