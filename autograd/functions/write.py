"""In-place writes as tape ops: __setitem__, copy_, fill_, zero_, add_, mul_, and clone.

Each writes the tensor's own array (views share it, as in PyTorch), stamps it with
`autograd.inplace.record_write` (so backward through an op that saved the old values
raises instead of computing a wrong gradient) and, when recorded, rebinds the tensor to
the new tape node: gradients flow to the written value and to the untouched rest.

Data paths. Values are cast to the tensor's dtype by the cast plan. A write into a
C-contiguous destination (the whole tensor, or a contiguous slab such as ``x[2:5]`` or
``x[0]``) is a same-dtype run of the cast plan with the destination as its output (the
copy kernel on a device). A write into a strided view (``x[:, 1:3]``) or through advanced
indices, and a fill with a scalar, is done by the array library (NumPy on the host and on
the emulated device's memory, CuPy's copy/fill kernels on CUDA); that is data movement
only, as for the views of autograd.functions.shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gpuplan as gp
import gpuplan.functional as F
from autograd import grad_mode, inplace
from autograd.function import Function
from autograd.functions.shape import Cast, Reshape, _is_basic, device_index, sum_to_shape
from autograd.tensor_base import TensorBase
from gpuplan import backend
from gpuplan.execute import call
from gpuplan.ops.cast.plans import CastDescriptor, CastPlan

if TYPE_CHECKING:
    from autograd.tensor import Tensor


def write_array(dest: Any, src: Any) -> None:
    """dest[...] = src (src cast to dest's dtype, broadcast to dest's shape)."""
    if dest.size == 0:
        return
    if src.ndim == 0 and src.dtype == dest.dtype:
        dest.fill(src.item())
        return
    if src.dtype != dest.dtype or inplace.storage_of(src) is inplace.storage_of(dest):
        src = F.cast(src, dest.dtype)  # a fresh array: no overlap with dest either
    if tuple(src.shape) != tuple(dest.shape):
        src = gp.array_namespace(src).broadcast_to(src, dest.shape)
    if _c_contiguous(dest):
        flat = backend.ascontiguous(src).reshape(-1)
        call(CastPlan, CastDescriptor(flat.size, flat.dtype, dest.dtype), like=dest,
             x=flat, y=dest.reshape(-1))
    else:
        dest[...] = src


def _c_contiguous(a: Any) -> bool:
    return bool(a.flags.c_contiguous)


class Clone(Function):
    """y = a copy of x (the cast plan, same dtype); dy passes through."""

    @staticmethod
    def forward(ctx, x):
        return F.cast(x, x.dtype)

    @staticmethod
    def backward(ctx, dy):
        return dy


class SetItem(Function):
    """x[index] = v, in x's array; the output *is* x's array. dx = dy with the written
    region zeroed; dv = dy[index] summed back to v's (broadcast) shape."""

    @staticmethod
    def forward(ctx, x, v, index):
        ctx.index, ctx.v_shape = index, v.shape
        if index is Ellipsis:
            write_array(x, v)
        elif _is_basic(index):
            items = index if isinstance(index, tuple) else (index,)
            if Ellipsis not in items:
                items += (Ellipsis,)  # so that x[0] of a 1-d x is a 0-d view, not a scalar
            write_array(x[items], v)
        else:
            x[index] = v  # advanced index: the array library scatters (v has x's dtype)
        return x

    @staticmethod
    def backward(ctx, dy):
        need_x, need_v = ctx.needs_input_grad
        dx = dv = None
        if need_x:
            dx = F.cast(dy, dy.dtype)
            dx[ctx.index] = 0
        if need_v:
            g = backend.ascontiguous(dy[ctx.index])
            dv = sum_to_shape(g, ctx.v_shape)
        return dx, dv


class InplaceBinary(Function):
    """a <op>= b for op in add/mul; the output *is* a's array. Gradients as Binary's, with
    the old a kept (a copy) when mul needs it for db."""

    @staticmethod
    def forward(ctx, a, b, name):
        ctx.name = name
        need_b = ctx.needs_input_grad[1]
        ctx.a_old = F.cast(a, a.dtype) if name == "mul" and need_b else None
        ctx.save_for_backward(b)
        write_array(a, F.binary(name, a, b))
        return a

    @staticmethod
    def backward(ctx, dc):
        (b,) = ctx.saved
        a = ctx.a_old if ctx.a_old is not None else dc  # add reads only a's shape
        da, db = F.binary_backward(ctx.name, a, b, dc)
        need_a, need_b = ctx.needs_input_grad
        return (da if need_a else None), (db if need_b else None)


# -- Tensor methods ---------------------------------------------------------------------------


def check_inplace(x: Tensor, what: str) -> None:
    """Refuse what PyTorch refuses: writing a leaf that requires grad while recording, or an
    inference tensor outside inference_mode."""
    if x._inference and not grad_mode._inference:
        raise RuntimeError(f"{what}: in-place update to an inference tensor (created under "
                           f"autograd.inference_mode()) outside inference mode is not "
                           f"allowed; make a copy with .clone() first")
    if x.requires_grad and x._node is None and grad_mode._enabled:
        raise RuntimeError(f"{what}: a leaf tensor that requires grad (shape {x.shape}) is "
                           f"used in an in-place operation; do it under autograd.no_grad() "
                           f"(as an optimizer update or an initializer does) or on a copy")


def _rebind(x: Tensor, out: Tensor, what: str) -> Tensor:
    """x takes out's tape entry (out wraps x's own array) and records the write."""
    inplace.record_write(x, what)
    if out.requires_grad:
        x._node, x._out_index, x.requires_grad = out._node, out._out_index, True
    return x


def _value(v: Any, x: Tensor, what: str) -> Any:
    """A Tensor value on x's device with x's dtype (differentiably), or an array of x's dtype."""
    if not isinstance(v, TensorBase):
        if isinstance(v, bool) or not hasattr(v, "shape") and not isinstance(v, (int, float)) \
                and not isinstance(v, (list, tuple)):
            raise TypeError(f"{what}: value must be a Tensor, an array or a number, given "
                            f"{type(v).__name__}")
        return gp.asarray(v, dtype=x.dtype, device=x.device)
    if v.device != x.device:
        v = v.to(device=x.device)
    if v.dtype != x.dtype:
        v = Cast.apply(v, dtype=x.dtype)
    return v


def _fit(v: Any, shape: tuple, what: str) -> Any:
    """v broadcastable to `shape` (leading size-1 dims beyond it dropped, as torch allows)."""
    vs = tuple(v.shape)
    while len(vs) > len(shape) and vs[0] == 1:
        vs = vs[1:]
    ok = len(vs) <= len(shape) and all(
        a in (1, b) for a, b in zip(vs[::-1], shape[::-1], strict=False))
    if not ok:
        raise ValueError(f"{what}: a value of shape {tuple(v.shape)} cannot be broadcast to "
                         f"the written shape {shape}")
    if vs == tuple(v.shape):
        return v
    return Reshape.apply(v, shape=vs) if isinstance(v, TensorBase) else v.reshape(vs)


def setitem(x: Tensor, index: Any, value: Any, what: str = "Tensor.__setitem__") -> Tensor:
    """x[index] = value in place (recorded when x or value requires grad)."""
    check_inplace(x, what)
    index = device_index(index, x.device)
    v = _value(value, x, what)
    if index is Ellipsis or _is_basic(index):
        target = tuple(x.data[index].shape)  # a view: nothing copied
    else:
        target = tuple(gp.array_namespace(x.data).empty(x.shape, dtype=bool)[index].shape)
    v = _fit(v, target, what)
    return _rebind(x, SetItem.apply(x, v, index=index), what)


def copy_(x: Tensor, src: Any) -> Tensor:
    return setitem(x, Ellipsis, src, "Tensor.copy_()")


def fill_(x: Tensor, value: Any) -> Tensor:
    if isinstance(value, TensorBase) and value.ndim != 0:
        raise ValueError(f"Tensor.fill_(): value must be a number or a 0-d tensor, given "
                         f"shape {value.shape}")
    return setitem(x, Ellipsis, value, "Tensor.fill_()")


def zero_(x: Tensor) -> Tensor:
    return setitem(x, Ellipsis, 0, "Tensor.zero_()")


def binary_(x: Tensor, name: str, other: Any, what: str) -> Tensor:
    """x <name>= other in place (other broadcast to x's shape; computed in x's dtype)."""
    check_inplace(x, what)
    v = _fit(_value(other, x, what), x.shape, what)
    if isinstance(v, TensorBase) and inplace.storage_of(v.data) is inplace.storage_of(x.data):
        v = Clone.apply(v)  # x.mul_(x): the op must keep reading the old values
    return _rebind(x, InplaceBinary.apply(x, v, name=name), what)


def clone(x: Tensor) -> Tensor:
    return Clone.apply(x)
