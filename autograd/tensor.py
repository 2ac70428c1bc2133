"""Tensor: an array (NumPy or CuPy) plus the autograd state (`TensorBase`), with its ops as
methods and operators."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import gpuplan as gp
from autograd import interop as _interop
from autograd.functions import activation as _act
from autograd.functions import arithmetic as _arith
from autograd.functions import indexing as _indexing
from autograd.functions import logical as _logical
from autograd.functions import matmul as _matmul
from autograd.functions import reduce as _reduce
from autograd.functions import select as _select
from autograd.functions import shape as _shape
from autograd.functions import write as _write
from autograd.tape import RemovableHandle, register_post_accumulate_grad_hook, run_backward
from autograd.tensor_base import TensorBase, set_tensor_class
from gpuplan.dtypes import as_dtype


class Tensor(TensorBase):
    """A NumPy (device "cpu") or CuPy (device "cuda") array with autograd state (see
    `TensorBase`) and the ops: operators and methods, each a call of the op's function in
    autograd.functions (recorded on the tape)."""

    @property
    def T(self) -> Tensor:  # noqa: N802 - array convention
        return self.transpose()

    def detach(self) -> Tensor:
        """The same array, cut from the tape (requires_grad=False)."""
        return Tensor(self.data)

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
            run_backward([(self, grad)], retain=retain)
            return
        self._node.tape.backward(self, grad, retain=retain)

    def register_post_accumulate_grad_hook(self, hook: Any) -> RemovableHandle:
        """Run ``hook(self)`` (a leaf that requires grad) at the end of its part of every
        backward that gives it a gradient, when ``.grad`` holds all of that backward's
        contributions (f16/bf16 leaves: the rounded f32 running sum, autograd.tape); returns
        a handle whose ``remove()`` unregisters it. As torch's method of the same name."""
        return register_post_accumulate_grad_hook(self, hook)

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

    # -- methods that are the functions themselves (one definition, one docstring) -----------

    sum = _reduce.sum
    mean = _reduce.mean
    prod = _reduce.prod
    max = _reduce.max
    min = _reduce.min
    amax = _reduce.amax
    amin = _reduce.amin
    argmax = _reduce.argmax
    argmin = _reduce.argmin
    topk = _reduce.topk
    var = _reduce.var
    std = _reduce.std
    gather = _indexing.gather
    scatter_add = _indexing.scatter_add
    index_select = _indexing.index_select
    remainder = _arith.remainder
    floor_divide = _arith.floor_divide
    logical_and = _logical.logical_and
    logical_or = _logical.logical_or
    logical_xor = _logical.logical_xor
    logical_not = _logical.logical_not
    bitwise_and = _logical.bitwise_and
    bitwise_or = _logical.bitwise_or
    bitwise_xor = _logical.bitwise_xor
    bitwise_not = _logical.bitwise_not
    any = _logical.any
    all = _logical.all
    # & | ^ commute elementwise, so one function serves both sides; ~ is bitwise_not.
    __and__ = __rand__ = _logical.bitwise_and
    __or__ = __ror__ = _logical.bitwise_or
    __xor__ = __rxor__ = _logical.bitwise_xor
    __invert__ = _logical.bitwise_not


set_tensor_class(Tensor)
