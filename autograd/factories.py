"""Tensor factories in PyTorch's spelling: tensor, zeros, ones, full, randn, arange, eye,
*_like, rand, randint.

Random draws are made on the host by autograd.random's generator (as ``randn``), so a
seed gives the same values on every device; the result is then moved to `device`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

import gpuplan as gp
from autograd import random as _random
from autograd.tensor import Tensor
from gpuplan.dtypes import as_dtype, is_float


def tensor(data: Any, requires_grad: bool = False, dtype: Any = None,
           device: str | None = None) -> Tensor:
    """A new leaf Tensor from an array, a list or a scalar (copied; default device cpu)."""
    if isinstance(data, Tensor):
        data = data.data
    if device is None:
        device = gp.device_of(data)
    arr = gp.asarray(data, dtype=dtype, device=device)
    if arr is data:
        arr = arr.copy()
    if dtype is None and arr.dtype == np.float64 and not hasattr(data, "dtype"):
        arr = arr.astype(np.float32)  # Python floats give float32, as in PyTorch
    return Tensor(arr, requires_grad=requires_grad)


def zeros(*shape: Any, dtype: Any = np.float32, device: str = "cpu",
          requires_grad: bool = False) -> Tensor:
    return Tensor(gp.zeros(_shape_arg(shape), dtype, device), requires_grad=requires_grad)


def ones(*shape: Any, dtype: Any = np.float32, device: str = "cpu",
         requires_grad: bool = False) -> Tensor:
    return Tensor(gp.full(_shape_arg(shape), 1.0, dtype, device), requires_grad=requires_grad)


def full(shape: Sequence[int], value: float, dtype: Any = np.float32, device: str = "cpu",
         requires_grad: bool = False) -> Tensor:
    return Tensor(gp.full(tuple(shape), value, dtype, device), requires_grad=requires_grad)


def randn(*shape: Any, dtype: Any = np.float32, device: str = "cpu",
          requires_grad: bool = False, seed: int | None = None) -> Tensor:
    """Standard normal draws made on the host (seeded: identical on every device)."""
    rng = _random.default_generator.host if seed is None else np.random.default_rng(seed)
    host = rng.standard_normal(_shape_arg(shape)).astype(as_dtype(dtype))
    return Tensor(gp.to_device(host, device), requires_grad=requires_grad)


def _shape_arg(shape: tuple) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(int(s) for s in shape[0])
    return tuple(int(s) for s in shape)


def _made(host: np.ndarray, device: str, requires_grad: bool, what: str) -> Tensor:
    if requires_grad and not is_float(host.dtype):
        raise ValueError(f"{what}: only floating-point tensors can require grad, given "
                         f"dtype {host.dtype}")
    return Tensor(gp.to_device(host, device), requires_grad=requires_grad)


def arange(start: float, end: float | None = None, step: float = 1, *, dtype: Any = None,
           device: str = "cpu", requires_grad: bool = False) -> Tensor:
    """[start, end) by step (``arange(n)`` is [0, n)). Default dtype: int64 when start, end
    and step are ints, else float32 (values computed in float64, then cast), as torch."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must be nonzero, given 0")
    ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
               for v in (start, end, step))
    dt = as_dtype(dtype) if dtype is not None else np.dtype(np.int64 if ints else np.float32)
    count = max(0, math.ceil((end - start) / step))
    if ints:
        host = (start + step * np.arange(count, dtype=np.int64)).astype(dt)
    else:
        host = (float(start) + float(step) * np.arange(count, dtype=np.float64)).astype(dt)
    return _made(host, device, requires_grad, "arange")


def _like(t: Tensor, dtype: Any, device: str | None) -> tuple[tuple[int, ...], Any, str]:
    if not isinstance(t, Tensor):
        raise TypeError(f"*_like: expected a Tensor, given {type(t).__name__}")
    return t.shape, (t.dtype if dtype is None else as_dtype(dtype)), device or t.device


def full_like(t: Tensor, fill_value: float, *, dtype: Any = None, device: str | None = None,
              requires_grad: bool = False) -> Tensor:
    """A tensor of t's shape (and dtype and device unless given) filled with fill_value."""
    shape, dt, dev = _like(t, dtype, device)
    return Tensor(gp.full(shape, fill_value, dt, dev), requires_grad=requires_grad)


def zeros_like(t: Tensor, *, dtype: Any = None, device: str | None = None,
               requires_grad: bool = False) -> Tensor:
    shape, dt, dev = _like(t, dtype, device)
    return Tensor(gp.zeros(shape, dt, dev), requires_grad=requires_grad)


def ones_like(t: Tensor, *, dtype: Any = None, device: str | None = None,
              requires_grad: bool = False) -> Tensor:
    return full_like(t, 1, dtype=dtype, device=device, requires_grad=requires_grad)


def rand(*size: Any, dtype: Any = np.float32, device: str = "cpu",
         requires_grad: bool = False, seed: int | None = None) -> Tensor:
    """Uniform draws in [0, 1) (host generator of autograd.random, or `seed`)."""
    rng = _random.default_generator.host if seed is None else np.random.default_rng(seed)
    dt = as_dtype(dtype)
    if not is_float(dt):
        raise ValueError(f"rand: dtype must be a float type, given {dt}")
    host = rng.random(_shape_arg(size)).astype(dt)
    # Rounding to a narrow float can reach 1.0; keep the half-open interval.
    host[host >= 1] = np.nextafter(dt.type(1), dt.type(0))
    return _made(host, device, requires_grad, "rand")


def randint(low: int, high: int | None = None, size: Sequence[int] = (), *,
            dtype: Any = np.int64, device: str = "cpu", seed: int | None = None) -> Tensor:
    """Integers uniform in [low, high): ``randint(high, size)`` or ``randint(low, high,
    size)``, int64 by default, as torch."""
    if high is None or not isinstance(high, (int, np.integer)):
        if high is not None:
            size = high
        low, high = 0, low
    if high <= low:
        raise ValueError(f"randint: needs low < high, given low={low}, high={high}")
    rng = _random.default_generator.host if seed is None else np.random.default_rng(seed)
    host = rng.integers(low, high, _shape_arg((size,))).astype(as_dtype(dtype))
    return _made(host, device, False, "randint")


def eye(n: int, m: int | None = None, *, dtype: Any = np.float32, device: str = "cpu",
        requires_grad: bool = False) -> Tensor:
    """An n x m matrix (m = n by default) with ones on the diagonal."""
    if n < 0 or (m is not None and m < 0):
        raise ValueError(f"eye: sizes must be >= 0, given n={n}, m={m}")
    return _made(np.eye(n, m, dtype=as_dtype(dtype)), device, requires_grad, "eye")
