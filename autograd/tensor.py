"""Tensor: an array (NumPy or CuPy) plus the autograd state (grad, requires_grad, tape node)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import gpuplan as gp
from autograd import grad_mode as _grad_mode
from gpuplan.dtypes import as_dtype


class Tensor:
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
        if isinstance(data, Tensor):
            data = data.data
        elif not isinstance(data, np.ndarray) and not gp.is_device_array(data):
            data = np.asarray(data)
        self.data = data
        self.grad: Tensor | None = None
        self.requires_grad = bool(requires_grad)
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

    @property
    def T(self) -> Tensor:  # noqa: N802 - array convention
        return self.transpose()

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

    def detach(self) -> Tensor:
        """The same array, cut from the tape (requires_grad=False)."""
        return Tensor(self.data)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if requires_grad and self._inference and not _grad_mode._inference:
            raise RuntimeError("requires_grad_(): an inference tensor (made under "
                               "autograd.inference_mode()) cannot require grad; clone() it")
        self.requires_grad = bool(requires_grad)
        return self

    def is_inference(self) -> bool:
        return self._inference

    def to(self, device: Any = None, dtype: Any = None) -> Tensor:
        """Move and/or cast (differentiable: the gradient comes back moved and cast);
        ``t.to(np.float16)`` casts, as torch's ``t.to(dtype)``."""
        if device is not None and not isinstance(device, str):
            device, dtype = None, device
        out = self
        if device is not None and device != self.device:
            out = _shape.ToDevice.apply(out, device=device)
        if dtype is not None and as_dtype(dtype) != out.dtype:
            out = _shape.Cast.apply(out, dtype=as_dtype(dtype))
        return out

    def cpu(self) -> Tensor:
        return self.to(device="cpu")

    def cuda(self) -> Tensor:
        return self.to(device="cuda")

    def float(self) -> Tensor:
        return self.to(dtype=np.float32)

    def double(self) -> Tensor:
        return self.to(dtype=np.float64)

    def half(self) -> Tensor:
        return self.to(dtype=np.float16)

    def bfloat16(self) -> Tensor:
        return self.to(dtype="bfloat16")

    def clone(self) -> Tensor:
        return _write.clone(self)

    def contiguous(self) -> Tensor:
        """Self (every array an op makes is C-contiguous), or a contiguous copy."""
        return self if self.data.flags.c_contiguous else _write.clone(self)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return _interop.array(self, dtype, copy)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return _interop.dlpack(self, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return _interop.dlpack_device(self)

    @property
    def __cuda_array_interface__(self) -> dict:  # AttributeError unless on a CUDA device
        return _interop.cuda_array_interface(self)

    # -- in-place (autograd.functions.write: recorded, version-counted) ------------------------

    def __setitem__(self, index: Any, value: Any) -> None:
        _write.setitem(self, index, value)

    def add_(self, other: Any, alpha: float = 1) -> Tensor:
        return _write.binary_(self, "add", other if alpha == 1 else other * alpha,
                              "Tensor.add_()")

    def mul_(self, other: Any) -> Tensor:
        return _write.binary_(self, "mul", other, "Tensor.mul_()")

    def copy_(self, src: Any) -> Tensor:
        return _write.copy_(self, src)

    def fill_(self, value: Any) -> Tensor:
        return _write.fill_(self, value)

    def zero_(self) -> Tensor:
        return _write.zero_(self)

    def backward(self, grad: Any = None, retain: bool = False) -> None:
        """Back-propagate through the tape that recorded this tensor (see Tape.backward)."""
        if self._node is None:
            from autograd.tape import run_backward

            run_backward([(self, grad)], retain=retain)
            return
        self._node.tape.backward(self, grad, retain=retain)

    # -- arithmetic --------------------------------------------------------------------------

    def __add__(self, other: Any) -> Tensor:
        return _arith.add(self, other)

    def __radd__(self, other: Any) -> Tensor:
        return _arith.add(other, self)

    def __sub__(self, other: Any) -> Tensor:
        return _arith.sub(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return _arith.sub(other, self)

    def __mul__(self, other: Any) -> Tensor:
        return _arith.mul(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return _arith.mul(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return _arith.div(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return _arith.div(other, self)

    def __floordiv__(self, other: Any) -> Tensor:
        return _arith.floor_divide(self, other)

    def __rfloordiv__(self, other: Any) -> Tensor:
        return _arith.floor_divide(other, self)

    def __mod__(self, other: Any) -> Tensor:
        return _arith.remainder(self, other)

    def __rmod__(self, other: Any) -> Tensor:
        return _arith.remainder(other, self)

    def __neg__(self) -> Tensor:
        return _arith.neg(self)

    def __matmul__(self, other: Tensor) -> Tensor:
        return _matmul.matmul(self, other)

    def __rmatmul__(self, other: Tensor) -> Tensor:
        return _matmul.matmul(other, self)

    def exp(self) -> Tensor:
        return _act.unary("exp", self)

    def tanh(self) -> Tensor:
        return _act.unary("tanh", self)

    def relu(self) -> Tensor:
        return _act.unary("relu", self)

    def __pow__(self, exponent: Any) -> Tensor:
        return _arith.pow(self, exponent)

    def __rpow__(self, base: Any) -> Tensor:
        return _arith.pow(base, self)

    pow = __pow__

    # Comparisons give bool tensors off the tape (torch). Defining __eq__ would drop the
    # inherited __hash__: tensors stay hashable by identity, as torch's, for dicts and sets.
    __hash__ = object.__hash__

    def _comparison(name: str) -> Any:  # noqa: N805 - a method factory, run in the class body
        def compare(self: Tensor, other: Any) -> Tensor:
            if not (isinstance(other, (Tensor, int, float, np.ndarray, np.number, np.bool_))
                    or gp.is_device_array(other)):  # a CuPy array is no np.ndarray
                return NotImplemented
            return _arith.compare(name, self, other)
        return compare

    def _elementwise(name: str) -> Any:  # noqa: N805 - as _comparison
        def apply(self: Tensor) -> Tensor:
            return _act.unary(name, self)
        apply.__name__ = apply.__qualname__ = name
        return apply

    __lt__, __le__, __gt__, __ge__, __eq__, __ne__ = map(  # type: ignore[assignment]
        _comparison, ("lt", "le", "gt", "ge", "eq", "ne"))
    lt, le, gt, ge, eq, ne = __lt__, __le__, __gt__, __ge__, __eq__, __ne__
    abs, log, sqrt, rsqrt, sigmoid, silu = map(  # noqa: A003
        _elementwise, ("abs", "log", "sqrt", "rsqrt", "sigmoid", "silu"))
    __abs__ = abs
    del _comparison, _elementwise

    def __bool__(self) -> bool:
        """The truth of a one-element tensor (`if loss < 1.0:`); ambiguous otherwise."""
        if self.numel() != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self.numel()} values is "
                               f"ambiguous (shape {self.shape})")
        return bool(self.item())

    def clamp(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
        return _act.clamp(self, min, max)

    clip = clamp

    def maximum(self, other: Tensor) -> Tensor:
        return _arith.maximum(self, other)

    def minimum(self, other: Tensor) -> Tensor:
        return _arith.minimum(self, other)

    def masked_fill(self, mask: Tensor, value: Any) -> Tensor:
        return _select.masked_fill(self, mask, value)

    def where(self, condition: Tensor, other: Any) -> Tensor:
        """self where condition, else other (torch's Tensor.where)."""
        return _select.where(condition, self, other)

    def tril(self, diagonal: int = 0) -> Tensor:
        return _select.tril(self, diagonal)

    def triu(self, diagonal: int = 0) -> Tensor:
        return _select.triu(self, diagonal)

    # -- reductions and indexing: bound below from autograd.functions.reduce / .indexing
    # (x.sum(1) is autograd.sum(x, 1): torch's dim/keepdim, NumPy's axis/keepdims aliases)

    # -- shape -------------------------------------------------------------------------------

    def reshape(self, *shape: Any) -> Tensor:
        return _shape.reshape(self, *shape)

    view = reshape

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        return _shape.flatten(self, start_dim, end_dim)

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        return _shape.squeeze(self, dim)

    def unsqueeze(self, dim: int) -> Tensor:
        return _shape.unsqueeze(self, dim)

    def expand(self, *sizes: Any) -> Tensor:
        """torch expand: -1 keeps a dim, size-1 dims grow, new dims go in front."""
        return _shape.expand(self, *sizes)

    def repeat(self, *sizes: Any) -> Tensor:
        return _shape.repeat(self, *sizes)

    def transpose(self, *axes: int) -> Tensor:
        """No axes: reverse all; two axes: swap them (PyTorch); else a full permutation."""
        return _shape.transpose(self, *axes)

    def permute(self, *axes: int) -> Tensor:
        return _shape.permute(self, *axes)

    def broadcast_to(self, shape: Sequence[int]) -> Tensor:
        return _shape.broadcast_to(self, shape)

    def __getitem__(self, index: Any) -> Tensor:
        return _shape.getitem(self, index)


# Op modules import Tensor from here, so they are bound after the class exists.
from autograd import interop as _interop  # noqa: E402
from autograd.functions import activation as _act  # noqa: E402
from autograd.functions import arithmetic as _arith  # noqa: E402
from autograd.functions import indexing as _indexing  # noqa: E402
from autograd.functions import logical as _logical  # noqa: E402
from autograd.functions import matmul as _matmul  # noqa: E402
from autograd.functions import reduce as _reduce  # noqa: E402
from autograd.functions import select as _select  # noqa: E402
from autograd.functions import shape as _shape  # noqa: E402
from autograd.functions import write as _write  # noqa: E402

# Methods that are the module functions themselves (one definition, one docstring).
for _module, _names in ((_reduce, ("sum", "mean", "prod", "max", "min", "amax", "amin", "argmax",
                                   "argmin", "topk", "var", "std")),
                        (_indexing, ("gather", "scatter_add", "index_select")),
                        (_arith, ("remainder", "floor_divide")),
                        (_logical, ("logical_and", "logical_or", "logical_xor", "logical_not",
                                    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
                                    "any", "all"))):
    for _name in _names:
        setattr(Tensor, _name, getattr(_module, _name))
# & | ^ commute elementwise, so one function serves both sides; ~ is bitwise_not.
for _name in ("and", "or", "xor"):
    for _side in ("", "r"):
        setattr(Tensor, f"__{_side}{_name}__", getattr(_logical, f"bitwise_{_name}"))
Tensor.__invert__ = _logical.bitwise_not
del _module, _names, _name, _side
