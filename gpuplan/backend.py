"""Where arrays live: lazy CuPy import, device detection and host/device array helpers.

This module is the only place in the project that decides between NumPy and CuPy.
Importing it never touches CUDA; the first question about a device does, once.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from gpuplan.dtypes import as_dtype


@functools.lru_cache(maxsize=1)
def cupy_module() -> Any | None:
    """The cupy module, or None when CuPy is not installed."""
    if os.environ.get("GPUPLAN_DISABLE_CUDA") == "1":
        return None
    try:
        import cupy
    except Exception:  # noqa: BLE001 - any import failure means "no CuPy here"
        return None
    return cupy


@functools.lru_cache(maxsize=1)
def device_available() -> bool:
    """True when CuPy is importable and a CUDA device answers (driver present)."""
    cp = cupy_module()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver / no device
        return False


def is_device_array(a: object) -> bool:
    """True for a CuPy ndarray (checked without importing CuPy for host arrays)."""
    if isinstance(a, np.ndarray) or a is None:
        return False
    cp = cupy_module()
    return cp is not None and isinstance(a, cp.ndarray)


def is_host_array(a: object) -> bool:
    return isinstance(a, np.ndarray)


def array_namespace(a: object) -> Any:
    """numpy for host arrays, cupy for device arrays."""
    return cupy_module() if is_device_array(a) else np


def device_of(a: object) -> str:
    """'cuda' or 'cpu' for an array."""
    return "cuda" if is_device_array(a) else "cpu"


def _namespace_for(device: str) -> Any:
    if device == "cpu":
        return np
    if device == "cuda":
        if not device_available():
            raise RuntimeError("device='cuda' requested but no usable CUDA device is present")
        return cupy_module()
    raise ValueError(f"device: expected 'cpu' or 'cuda', given {device!r}")


def empty(shape: Any, dtype: Any, device: str = "cpu") -> Any:
    return _namespace_for(device).empty(shape, dtype=as_dtype(dtype))


def zeros(shape: Any, dtype: Any, device: str = "cpu") -> Any:
    return _namespace_for(device).zeros(shape, dtype=as_dtype(dtype))


def full(shape: Any, value: float, dtype: Any, device: str = "cpu") -> Any:
    return _namespace_for(device).full(shape, value, dtype=as_dtype(dtype))


def asarray(a: Any, dtype: Any = None, device: str | None = None) -> Any:
    """Convert to an array on `device` (default: where `a` already lives, host for lists)."""
    if device is None:
        device = device_of(a)
    dt = None if dtype is None else as_dtype(dtype)
    if device == "cpu":
        return np.asarray(to_host(a), dtype=dt)
    return _namespace_for(device).asarray(a, dtype=dt)


def to_host(a: Any) -> np.ndarray:
    """A NumPy copy (or view, for host arrays) of `a`."""
    if is_device_array(a):
        return a.get()
    return np.asarray(a)


def to_device(a: Any, device: str) -> Any:
    """Move `a` to 'cpu' or 'cuda' (no copy when it is already there)."""
    if device == device_of(a):
        return a
    return asarray(a, device=device)


def ascontiguous(a: Any) -> Any:
    return array_namespace(a).ascontiguousarray(a)


def concatenate(arrays: list[Any], axis: int = 0) -> Any:
    return array_namespace(arrays[0]).concatenate(arrays, axis=axis)


def stack(arrays: list[Any], axis: int = 0) -> Any:
    return array_namespace(arrays[0]).stack(arrays, axis=axis)


def synchronize(a: Any = None) -> None:
    """Wait for the current CUDA stream (no-op on host)."""
    if device_available() and (a is None or is_device_array(a)):
        cupy_module().cuda.get_current_stream().synchronize()
