"""Arrays of the emulated device: host memory, marked as device memory.

`EmulatedArray` is an ndarray subclass, so NumPy operations work on it and keep it on the
emulated device (as CuPy operations keep arrays on a GPU), while plans see a device array
and run their CUDA path. Like `cupy.ndarray` it has ``.get()`` (a host copy), ``.set()``,
``.device`` and ``.data.ptr``. Allocations made through `namespace` are 256-byte aligned,
as cudaMalloc's are, so the kernels' vectorized paths see the alignment a GPU gives them.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

#: The device id of the emulated device (distinct from every CUDA device id).
DEVICE_ID = -1
_ALIGN = 256


class _Device:
    id = DEVICE_ID

    def __repr__(self) -> str:
        return "<emulated device>"

    def synchronize(self) -> None:
        return None


class _Data:
    """``a.data`` as CuPy has it: ``.ptr`` is the address of the first element."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class EmulatedArray(np.ndarray):
    """An ndarray living on the emulated device."""

    device = _Device()

    @property
    def data(self) -> _Data:  # type: ignore[override]
        return _Data(self.ctypes.data)

    def get(self, stream: Any = None, out: np.ndarray | None = None) -> np.ndarray:
        """A host (NumPy) copy, as cupy.ndarray.get()."""
        host = np.array(self, copy=True, subok=False)
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr: Any, stream: Any = None) -> None:
        """Copy host data in, as cupy.ndarray.set()."""
        self[...] = np.asarray(arr).reshape(self.shape)

    def __repr__(self) -> str:
        return "emulated " + repr(np.asarray(self))

    def __reduce__(self):  # pickles as a host array (as CuPy arrays do not pickle to devices)
        return np.asarray(self).__reduce__()


def empty(shape: Any, dtype: Any = float, order: str = "C") -> EmulatedArray:
    """A 256-byte aligned uninitialized emulated array."""
    dt = np.dtype(dtype)
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + _ALIGN, dtype=np.uint8)
    off = (-raw.ctypes.data) % _ALIGN
    flat = raw[off:off + nbytes].view(dt)
    out = flat.reshape(shape, order=order) if order in ("C", "F") else flat.reshape(shape)
    return out.view(EmulatedArray)


def asarray(a: Any, dtype: Any = None, order: Any = None, copy: bool | None = None) -> Any:
    """`a` on the emulated device (no copy when it already is one of the right dtype)."""
    if isinstance(a, EmulatedArray) and (dtype is None or a.dtype == np.dtype(dtype)) \
            and copy is not True:
        return a
    if hasattr(a, "get") and not isinstance(a, np.ndarray):  # a CuPy array
        a = a.get()
    host = np.asarray(a, dtype=dtype)
    out = empty(host.shape, host.dtype)
    out[...] = host
    return out


class _Namespace:
    """``numpy`` for emulated arrays: array-returning functions return EmulatedArrays."""

    __name__ = "gpuplan.emulator.namespace"
    ndarray = EmulatedArray

    def empty(self, shape: Any, dtype: Any = float, order: str = "C") -> EmulatedArray:
        return empty(shape, dtype, order)

    def zeros(self, shape: Any, dtype: Any = float) -> EmulatedArray:
        out = empty(shape, dtype)
        out.fill(0)
        return out

    def ones(self, shape: Any, dtype: Any = float) -> EmulatedArray:
        return self.full(shape, 1, dtype)

    def full(self, shape: Any, fill_value: Any, dtype: Any = None) -> EmulatedArray:
        dt = np.asarray(fill_value).dtype if dtype is None else dtype
        out = empty(shape, dt)
        out.fill(fill_value)
        return out

    def empty_like(self, a: Any, dtype: Any = None) -> EmulatedArray:
        return empty(np.shape(a), a.dtype if dtype is None else dtype)

    def zeros_like(self, a: Any, dtype: Any = None) -> EmulatedArray:
        return self.zeros(np.shape(a), a.dtype if dtype is None else dtype)

    def full_like(self, a: Any, fill_value: Any, dtype: Any = None) -> EmulatedArray:
        return self.full(np.shape(a), fill_value, a.dtype if dtype is None else dtype)

    def asarray(self, a: Any, dtype: Any = None, order: Any = None) -> Any:
        return asarray(a, dtype)

    def array(self, a: Any, dtype: Any = None, copy: bool = True, order: str = "K") -> Any:
        return asarray(a, dtype, copy=copy)

    def ascontiguousarray(self, a: Any, dtype: Any = None) -> Any:
        if isinstance(a, EmulatedArray) and a.flags.c_contiguous and \
                (dtype is None or a.dtype == np.dtype(dtype)):
            return a
        return asarray(np.ascontiguousarray(np.asarray(a), dtype=dtype))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(np, name)
        if not callable(attr) or isinstance(attr, type):
            return attr
        return _wrap(attr)


def _to_emulated(r: Any) -> Any:
    if isinstance(r, np.ndarray) and not isinstance(r, EmulatedArray):
        return r.view(EmulatedArray)
    if isinstance(r, tuple):
        return tuple(_to_emulated(x) for x in r)
    return r


@functools.cache
def _wrap(fn: Any) -> Any:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return _to_emulated(fn(*args, **kwargs))
    return call


namespace = _Namespace()
