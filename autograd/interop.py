"""Zero-copy exchange with NumPy, CuPy and PyTorch: __array__, DLPack, __cuda_array_interface__.

Host tensors share memory with NumPy both ways (``np.asarray(t)``, ``np.from_dlpack(t)``,
``autograd.from_dlpack(a)``; bfloat16, which NumPy's DLPack lacks, through
autograd.dlpack_bf16). CUDA tensors are CuPy arrays: DLPack and
``__cuda_array_interface__`` hand out their device pointer, and ``from_dlpack`` wraps a
CUDA producer through CuPy. The emulated device has no DLPack device type and no CUDA
pointer (its memory is host memory posing as a device's), so it exports neither: a
consumer would otherwise take device data for host data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import gpuplan as gp
from autograd import dlpack_bf16
from autograd.tensor_base import TensorBase, new_tensor

if TYPE_CHECKING:
    from autograd.tensor import Tensor

#: DLPack device types (dlpack.h DLDeviceType).
KDL_CPU, KDL_CUDA = 1, 2


def array(t: Tensor, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    """``np.asarray(t)``: the host array itself (no copy unless `dtype` or ``copy=True``
    asks for one; ``copy=False`` with a dtype change raises, NumPy 2's rule). Device
    tensors raise TypeError, as PyTorch's CUDA tensors do: copy with .cpu() or .numpy()."""
    if t.device != "cpu":
        raise TypeError(f"Tensor.__array__: can't convert a {t.device!r} device tensor to a "
                        f"NumPy array implicitly; use Tensor.cpu() or Tensor.numpy() to copy "
                        f"it to host memory first")
    a = t.data
    if dtype is not None and np.dtype(dtype) != a.dtype:
        if copy is False:
            raise ValueError(f"Tensor.__array__: converting {a.dtype} to {np.dtype(dtype)} "
                             f"needs a copy, but copy=False was given")
        return a.astype(dtype)
    return a.copy() if copy else a


def dlpack_device(t: Tensor) -> tuple[int, int]:
    """(device type, device id): (1, 0) for host tensors, (2, id) for CUDA ones."""
    device = t.device
    if device == "cpu":
        return KDL_CPU, 0
    if device == "cuda":
        return KDL_CUDA, int(t.data.device.id)
    raise BufferError("Tensor.__dlpack_device__: the emulated device has no DLPack device "
                      "type; copy the tensor to the host with .cpu() first")


def dlpack(t: Tensor, **kwargs: Any) -> Any:
    """The DLPack capsule of t's array (keyword arguments of the array API passed on); host
    bfloat16, which NumPy cannot export, through autograd.dlpack_bf16."""
    dlpack_device(t)  # refuses the emulated device
    if dlpack_bf16.is_bfloat16(t.data):
        return dlpack_bf16.export(t.data, **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return t.data.__dlpack__(**kwargs)


def cuda_array_interface(t: Tensor) -> dict:
    """CuPy's / Numba's ``__cuda_array_interface__`` of a CUDA tensor. Host and emulated
    tensors raise AttributeError, so ``hasattr(t, "__cuda_array_interface__")`` is False
    for them (consumers probe with hasattr)."""
    if t.device != "cuda":
        raise AttributeError(f"__cuda_array_interface__: only CUDA tensors have one; this "
                             f"tensor is on {t.device!r}")
    return t.data.__cuda_array_interface__


def from_dlpack(obj: Any) -> Tensor:
    """A Tensor sharing memory with `obj`: any object with ``__dlpack__`` and
    ``__dlpack_device__`` (a NumPy or CuPy array, a torch tensor, another Tensor)."""
    if isinstance(obj, TensorBase):
        return new_tensor(obj.data)
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise TypeError(f"from_dlpack: expected an object with __dlpack__ and "
                        f"__dlpack_device__ (a NumPy/CuPy array, a torch tensor), given "
                        f"{type(obj).__name__}")
    kind, _ = obj.__dlpack_device__()
    if kind == KDL_CPU:
        try:
            return new_tensor(np.from_dlpack(obj))
        except (BufferError, RuntimeError, TypeError, ValueError):
            # NumPy reads no bfloat16: read the capsule here (None: not bfloat16 either)
            host = dlpack_bf16.import_capsule(obj.__dlpack__())
            if host is None:
                raise
            return new_tensor(host)
    if kind == KDL_CUDA:
        cp = gp.backend.cupy_module() if gp.backend.cuda_available() else None
        if cp is None:
            raise RuntimeError("from_dlpack: the object lives on a CUDA device, but CuPy or a "
                               "usable CUDA device is missing here")
        return new_tensor(cp.from_dlpack(obj))
    raise BufferError(f"from_dlpack: DLPack device type {kind} is not supported (expected "
                      f"{KDL_CPU}: CPU or {KDL_CUDA}: CUDA)")
