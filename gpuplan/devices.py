"""The device interface: what the core (backend, streams, kernel modules, graphs, operand
checks) asks of a place where arrays live and kernels run.

Three devices: "cpu" (NumPy on the host), "cuda" (CuPy on a GPU) and "emulated" (the same CUDA
kernels run on the host: gpuplan.emulator). Each is a `Device`; the core asks `get(name)` or
`of_array(a)` and never imports a device's implementation. The emulated device is a plug-in:
gpuplan.emulator.plugin is imported the first time the emulated device is asked for
(``GPUPLAN_DEVICE=emulated``, ``device="emulated"``), not when gpuplan is imported.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: The device id of the emulated device (distinct from every CUDA device id).
EMULATED_DEVICE_ID = -1

#: Device names, and the module:class of each device's plug-in.
PLUGINS = {"cpu": "gpuplan.devices:HostDevice", "cuda": "gpuplan.devices:CudaDevice",
           "emulated": "gpuplan.emulator.plugin:EmulatedDevice"}


# -- CUDA: is there a driver, CuPy, a device (CuPy is imported only when one is asked for) --


@functools.lru_cache(maxsize=1)
def _cuda_driver_present() -> bool:
    """Whether libcuda can be loaded: without it there is no GPU, and no reason to import
    CuPy."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll", "libcuda.dylib"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


@functools.lru_cache(maxsize=1)
def cupy_module() -> Any | None:
    """The cupy module, or None when CuPy is not installed (imported on first call)."""
    if os.environ.get("GPUPLAN_DISABLE_CUDA") == "1":
        return None
    try:
        import cupy
    except Exception:  # noqa: BLE001 - any import failure means "no CuPy here"
        return None
    return cupy


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """True when a CUDA driver is present, CuPy imports and a CUDA device answers."""
    if os.environ.get("GPUPLAN_DISABLE_CUDA") == "1" or not _cuda_driver_present():
        return False
    cp = cupy_module()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver / no device
        return False


class Device:
    """A place where arrays live and plans run. Subclasses answer for their device."""

    #: "cpu", "cuda" or "emulated"
    name: str = ""
    #: whether cuBLAS runs here
    has_cublas: bool = False

    def array_type(self) -> type:
        """The array class of this device."""
        raise NotImplementedError

    def owns(self, a: object) -> bool:
        """Whether `a` is an array of this device."""
        return isinstance(a, self.array_type())

    def namespace(self) -> Any:
        """The NumPy-like module that makes arrays here (empty, zeros, asarray, ...)."""
        raise NotImplementedError

    def to_host(self, a: Any) -> np.ndarray:
        """A NumPy copy of `a` (an array of this device)."""
        return a.get()

    def compute_capability(self, device_id: int | None) -> str:
        """'host', or the compute capability of the kernels' target such as '80'."""
        return "host"

    def capture_active(self, stream: Any) -> Any:
        """The graph capture in progress on `stream` (a gpuplan Stream), or None."""
        return None

    def upload(self, stream: Any, dst: Any, host: np.ndarray) -> None:
        """``dst[...] = host`` ordered on `stream` (capturable; see gpuplan.stream.upload)."""
        raise NotImplementedError

    def load_module(self, path: Path, name_expressions: tuple[str, ...],
                    options: tuple[str, ...], device_id: int) -> Any:
        """`path` (a .cu file) compiled for this device: an object with
        ``get_function(name_expression)``."""
        raise NotImplementedError(f"{self.name}: runs no CUDA kernels")

    def launch(self, stream: Any, kernel: Any, grid: tuple, block: tuple, args: tuple,
               shared_mem: int, reachable: Any) -> None:
        raise NotImplementedError(f"{self.name}: runs no CUDA kernels")

    def allow_dynamic_smem(self, fn: Any, nbytes: int, device_id: int) -> None:
        """Raise kernel `fn`'s dynamic shared-memory cap to `nbytes`."""
        fn.max_dynamic_shared_size_bytes = nbytes

    def alloc_bytes(self, nbytes: int, device_id: int | None) -> Any:
        """An uninitialised uint8 buffer of `nbytes` on this device (a plan workspace)."""
        return self.namespace().empty(nbytes, dtype=np.uint8)


class HostDevice(Device):
    """The host: NumPy arrays, plans run their NumPy implementation."""

    name = "cpu"

    def array_type(self) -> type:
        return np.ndarray

    def owns(self, a: object) -> bool:
        return type(a) is np.ndarray

    def namespace(self) -> Any:
        return np

    def to_host(self, a: Any) -> np.ndarray:
        return np.asarray(a)

    def upload(self, stream: Any, dst: Any, host: np.ndarray) -> None:
        np.copyto(dst, host)


class CudaDevice(Device):
    """A CUDA GPU through CuPy (imported only when a GPU is asked for)."""

    name = "cuda"
    has_cublas = True

    #: graph captures in progress on CUDA streams (Stream.key -> the capture, gpuplan.graphs)
    captures: dict[tuple, Any]

    def __init__(self) -> None:
        self.captures = {}

    def _cupy(self) -> Any:
        return cupy_module()

    def array_type(self) -> type:
        return self._cupy().ndarray

    def owns(self, a: object) -> bool:
        cp = sys.modules.get("cupy")
        return cp is not None and isinstance(a, cp.ndarray)

    def namespace(self) -> Any:
        if not cuda_available():
            raise RuntimeError("device='cuda' requested but no usable CUDA device is present "
                               "(GPUPLAN_DEVICE=emulated runs the kernels on the emulated "
                               "device)")
        return self._cupy()

    def compute_capability(self, device_id: int | None) -> str:
        return _cuda_compute_capability(device_id)

    def capture_active(self, stream: Any) -> Any:
        return self.captures.get(stream.key) if self.captures else None

    def upload(self, stream: Any, dst: Any, host: np.ndarray) -> None:
        cap = stream.capturing
        cuda = stream.cuda_stream
        with self._cupy().cuda.Device(stream.device_id):
            if cap is None:
                dst.set(host, stream=cuda)
                return
            snap = importlib.import_module("cupyx").empty_pinned(host.shape, host.dtype)
            snap[...] = host
            cap.keep.append(snap)
            dst.data.copy_from_host_async(snap.ctypes.data, host.nbytes, cuda)

    def load_module(self, path: Path, name_expressions: tuple[str, ...],
                    options: tuple[str, ...], device_id: int) -> Any:
        cp = self._cupy()
        with cp.cuda.Device(device_id):
            return cp.RawModule(code=path.read_text(), options=options,
                                name_expressions=list(name_expressions))

    def launch(self, stream: Any, kernel: Any, grid: tuple, block: tuple, args: tuple,
               shared_mem: int, reachable: Any) -> None:
        with self._cupy().cuda.Device(stream.device_id), stream.cuda_stream:
            kernel(grid, block, args, shared_mem=shared_mem)

    def allow_dynamic_smem(self, fn: Any, nbytes: int, device_id: int) -> None:
        # A CuPy RawKernel applies the attribute to its function for the current device.
        with self._cupy().cuda.Device(device_id):
            fn.max_dynamic_shared_size_bytes = nbytes

    def alloc_bytes(self, nbytes: int, device_id: int | None) -> Any:
        cp = self._cupy()
        with cp.cuda.Device(device_id):
            return cp.empty(nbytes, dtype=cp.uint8)


@functools.cache
def _cuda_compute_capability(device_id: int | None) -> str:
    if device_id is None:
        return "host"
    return str(cupy_module().cuda.Device(device_id).compute_capability)


_DEVICES: dict[str, Device] = {}


def get(name: str) -> Device:
    """The device called `name` ("cpu", "cuda", "emulated"), its plug-in loaded on first use."""
    device = _DEVICES.get(name)
    if device is None:
        if name not in PLUGINS:
            raise ValueError(f"device: expected one of {tuple(PLUGINS)}, given {name!r}")
        module, cls = PLUGINS[name].split(":")
        device = _DEVICES[name] = getattr(importlib.import_module(module), cls)()
    return device


#: The module that defines each device's array class: until it is imported, no array of that
#: device exists, and asking whether an object is one must not import it.
ARRAY_MODULES = {"emulated": "gpuplan.emulator.array", "cuda": "cupy"}


def for_device_id(device_id: int) -> Device:
    """The device of a kernel module's device id (a CUDA ordinal, or the emulated device's)."""
    return get("emulated") if device_id == EMULATED_DEVICE_ID else get("cuda")


def of_array(a: object) -> Device:
    """The device `a` lives on (the host for anything that is not a device array)."""
    if type(a) is np.ndarray:
        return get("cpu")
    for name, module in ARRAY_MODULES.items():
        if module in sys.modules and get(name).owns(a):
            return get(name)
    return get("cpu")
