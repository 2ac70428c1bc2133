"""Where arrays live: host (NumPy), a CUDA device (CuPy), or the emulated device.

The array-level entry points (empty, asarray, to_host, device_of, ...) over the devices of
gpuplan.devices, which answer for their arrays. Importing it never touches CUDA, and CuPy is
imported only when a CUDA device is asked for and a CUDA driver is installed (importing it
costs ~165 MiB per rank); the emulator is loaded only when the emulated device is asked for.

Device names: "cpu", "cuda", "emulated". With ``GPUPLAN_DEVICE=emulated`` the emulated device
is *the* device: ``device="cuda"`` resolves to it and `device_available()` is true.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from gpuplan import devices
from gpuplan.devices import _cuda_driver_present, cuda_available, cupy_module  # noqa: F401
from gpuplan.dtypes import as_dtype
from gpuplan.errors import Unsupported

DEVICES = tuple(devices.PLUGINS)


def emulated_default() -> bool:
    """True when GPUPLAN_DEVICE=emulated makes the emulated device the default device."""
    return os.environ.get("GPUPLAN_DEVICE", "").lower() == "emulated"


def device_count() -> int:
    """Number of CUDA devices this process sees (0 without a usable CUDA device)."""
    return int(cupy_module().cuda.runtime.getDeviceCount()) if cuda_available() else 0


def use_device(index: int) -> int | None:
    """Make CUDA device ``index`` current for this process (CuPy arrays, streams and kernels
    then go there); returns ``index``, or None (nothing changes) without a CUDA device.
    Multi-process jobs pass one index per local rank (``dist.init`` does)."""
    count = device_count()
    if count == 0:
        return None
    if not 0 <= index < count:
        raise ValueError(f"use_device: index must lie in [0, {count}), given {index}")
    cupy_module().cuda.Device(index).use()
    return index


def device_available() -> bool:
    """True when there is a device to run on: a CUDA GPU, or the emulated device when
    GPUPLAN_DEVICE=emulated."""
    return emulated_default() or cuda_available()


def resolve_device(device: str) -> str:
    """The device a name means here: "cuda" is the emulated device under
    GPUPLAN_DEVICE=emulated; "cpu" and "emulated" mean themselves."""
    if device == "cuda" and emulated_default():
        return "emulated"
    if device not in DEVICES:  # a GpuPlanError as every rejected argument, not a bare one
        raise Unsupported(f"device: expected one of {DEVICES}, given {device!r}")
    return device


def default_device() -> str:
    """"emulated" under GPUPLAN_DEVICE=emulated, else "cuda" with a GPU, else "cpu"."""
    if emulated_default():
        return "emulated"
    return "cuda" if cuda_available() else "cpu"


def _cupy_if_imported() -> Any | None:
    return sys.modules.get("cupy")


def is_device_array(a: object) -> bool:
    """True for an array of a device (CuPy, emulated); never imports CuPy or the emulator."""
    if type(a) is np.ndarray or a is None:
        return False
    return devices.of_array(a).name != "cpu"


def array_namespace(a: object) -> Any:
    """numpy for host arrays, cupy for CUDA arrays, the emulated namespace for emulated ones."""
    if type(a) is np.ndarray:
        return np
    return devices.of_array(a).namespace()


def device_of(a: object) -> str:
    """'cpu', 'cuda' or 'emulated' for an array."""
    if type(a) is np.ndarray:
        return "cpu"
    return devices.of_array(a).name


def data_ptr(a: Any) -> int:
    """Address of the first element of a host, emulated or CUDA array."""
    if isinstance(a, np.ndarray):
        return a.ctypes.data
    return a.data.ptr


def _namespace_for(device: str) -> Any:
    return devices.get(resolve_device(device)).namespace()


def empty(shape: Any, dtype: Any, device: str = "cpu") -> Any:
    return _namespace_for(device).empty(shape, dtype=as_dtype(dtype))


def zeros(shape: Any, dtype: Any, device: str = "cpu") -> Any:
    return _namespace_for(device).zeros(shape, dtype=as_dtype(dtype))


def full(shape: Any, value: float, dtype: Any, device: str = "cpu") -> Any:
    return _namespace_for(device).full(shape, value, dtype=as_dtype(dtype))


def asarray(a: Any, dtype: Any = None, device: str | None = None) -> Any:
    """Convert to an array on `device` (default: where `a` already lives, host for lists)."""
    device = device_of(a) if device is None else resolve_device(device)
    dt = None if dtype is None else as_dtype(dtype)
    if device == "cpu":
        return np.asarray(to_host(a), dtype=dt)
    if device_of(a) not in ("cpu", device):  # from one device to another: through the host
        a = to_host(a)
    return _namespace_for(device).asarray(a, dtype=dt)


def to_host(a: Any) -> np.ndarray:
    """A NumPy copy (or view, for host arrays) of `a`."""
    if type(a) is np.ndarray:
        return a
    return devices.of_array(a).to_host(a)


def to_device(a: Any, device: str) -> Any:
    """Move `a` to 'cpu', 'cuda' or 'emulated' (no copy when it is already there)."""
    device = resolve_device(device)
    if device == device_of(a):
        return a
    return asarray(a, device=device)


def ascontiguous(a: Any) -> Any:
    """C-contiguous `a` with its shape (ascontiguousarray alone turns a 0-d array into (1,))."""
    out = array_namespace(a).ascontiguousarray(a)
    return out.reshape(()) if a.ndim == 0 else out


def concatenate(arrays: list[Any], axis: int = 0) -> Any:
    return array_namespace(arrays[0]).concatenate(arrays, axis=axis)


def stack(arrays: list[Any], axis: int = 0) -> Any:
    return array_namespace(arrays[0]).stack(arrays, axis=axis)


def synchronize(a: Any = None) -> None:
    """Wait for the current CUDA stream (no-op on host and on the emulated device, whose
    launches complete before they return)."""
    if a is None:
        if _cupy_if_imported() is not None and cuda_available():
            cupy_module().cuda.get_current_stream().synchronize()
    elif device_of(a) == "cuda":
        cupy_module().cuda.get_current_stream().synchronize()


def copy_into(dst: Any, src: Any, stream: Any = None) -> None:
    """dst[...] = src for two arrays on the same device (stream-ordered on a GPU)."""
    if device_of(dst) == "cuda":
        dst.data.copy_from_device_async(src.data, src.nbytes, stream)
    else:
        np.copyto(dst, src)
