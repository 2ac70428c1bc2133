"""TensorBase: the array and autograd state every Tensor holds, and `new_tensor`, through
which the tape, Functions and interop make their result tensors.

The ops of a Tensor (operators, methods) are the functions of autograd.functions, which in
turn make tensors: autograd.tensor defines `Tensor(TensorBase)` with those methods and
registers it here (`set_tensor_class`), so the modules below it build Tensors without
importing autograd.tensor (no import cycle), as PyTorch's C++ core makes instances of the
Python class torch.Tensor registered with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import gpuplan as gp
from autograd import grad_mode as _grad_mode


class TensorBase:
    """A NumPy (device "cpu") or CuPy (device "cuda") array with autograd state.

    ``grad`` is a Tensor or None; ``_node`` is the tape entry that produced this tensor
    (None for leaves) and ``_out_index`` which of that entry's outputs it is.

    ``_version`` counts the in-place operations the API made on this tensor (``zero_()``,
    optimizer steps, ...). Each is also stamped on the array's memory, and backward
    refuses an array saved for it that was written after forward (autograd.inplace).
    ``data`` is an escape hatch, as in PyTorch: a write into it (``t.data[...] = v``) is
    invisible to that check; assigning a new array (``t.data = a``) rebinds the tensor
    and leaves saved arrays, hence gradients, as they were.
    """

    # ndarray <op> Tensor returns NotImplemented, so Tensor's reflected operator runs.
    __array_ufunc__ = None
    _version = 0
    _inference = False  # made under autograd.inference_mode()

    def __init__(self, data: Any, requires_grad: bool = False) -> None:
        if type(data) is not np.ndarray:  # (every op's result: tested first)
            if isinstance(data, TensorBase):
                data = data.data
            elif not isinstance(data, np.ndarray) and not gp.is_device_array(data):
                data = np.asarray(data)
        self.data = data
        self.grad: TensorBase | None = None
        self.requires_grad = True if requires_grad else False
        self._node = None
        self._out_index = 0
        if _grad_mode._inference:
            self._inference = True

    # -- properties --------------------------------------------------------------------------

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def device(self) -> str:
        return gp.device_of(self.data)

    @property
    def is_leaf(self) -> bool:
        return self._node is None

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return int(self.data.size)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (f"Tensor(shape={self.shape}, dtype={self.dtype}, device={self.device!r}"
                f"{grad})")

    # -- conversion --------------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """A host NumPy array with this tensor's values (a copy for device tensors)."""
        return gp.to_host(self.data)

    def item(self) -> float:
        if self.data.size != 1:
            raise ValueError(f"item(): needs a one-element tensor, given shape {self.shape}")
        return gp.to_host(self.data).reshape(-1)[0].item()

    def tolist(self) -> Any:
        return gp.to_host(self.data).tolist()

    def requires_grad_(self, requires_grad: bool = True) -> TensorBase:
        if requires_grad and self._inference and not _grad_mode._inference:
            raise RuntimeError("requires_grad_(): an inference tensor (made under "
                               "autograd.inference_mode()) cannot require grad; clone() it")
        self.requires_grad = bool(requires_grad)
        return self

    def is_inference(self) -> bool:
        return self._inference


#: The registered Tensor class (autograd.tensor sets it at import). Hot paths call it as
#: ``tensor_base.TENSOR_CLASS(data)``: one Python call less per tensor than `new_tensor`.
TENSOR_CLASS: type[TensorBase] = TensorBase


def set_tensor_class(cls: type[TensorBase]) -> None:
    """Make `new_tensor` build instances of `cls` (autograd.tensor registers Tensor)."""
    global TENSOR_CLASS
    TENSOR_CLASS = cls


def new_tensor(data: Any, requires_grad: bool = False) -> Any:
    """A Tensor (the registered class) holding `data` (an array, or a tensor's array)."""
    return TENSOR_CLASS(data, requires_grad)
