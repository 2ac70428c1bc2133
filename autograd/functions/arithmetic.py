"""Arithmetic Functions: add, sub, mul, div, pow, maximum, minimum, remainder, floor_divide
with broadcasting, scale/neg by a constant, and the comparisons (bool results, no gradient).

Operands of different dtypes follow torch's type promotion (`result_type`): categories
bool < integer < float; a dimensioned tensor decides within its category, a 0-d tensor or a
Python number only lifts the category (an int tensor with a float number is float32, torch's
default dtype; a bool tensor with an int number is int64). Integer math wraps on overflow.
`/` is true division: integer operands give float32, as torch. A dtype an op does not take
(pow on integers, anything on int8) is a TypeError naming the op and the dtypes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.functions import shape as _shape
from autograd.tensor_base import TensorBase, new_tensor
from gpuplan.dtypes import FLOAT_DTYPES, as_dtype, bfloat16, float16, float32, int64
from gpuplan.ops.binary import binary as binary_arrays
from gpuplan.ops.binary.table import BINARY_DTYPES, BINARY_OPS, dtype_kind

if TYPE_CHECKING:
    from autograd.tensor import Tensor

_ROWS = {op.name: op for op in BINARY_OPS}
#: (op, dtype) for every dtype each binary op computes in (promote's fast path).
_TAKES = frozenset((op.name, d) for op in BINARY_OPS for d in BINARY_DTYPES
                   if dtype_kind(d) in op.kinds)
_BOOL = np.dtype(np.bool_)
#: the ops whose gradient reads a and b (Binary saves them).
_READS = frozenset(op.name for op in BINARY_OPS if op.reads_operands)


class Binary(Function):
    """c = a <op> b (NumPy broadcasting); grads are summed back to a.shape and b.shape.
    pow, maximum, minimum and remainder follow torch (see gpuplan.ops.binary.table);
    floor_divide's gradient is zero (torch). a and b are saved only when the gradient reads
    them (not for add/sub: torch's rule, which also lets inference tensors be added)."""

    @staticmethod
    def forward(ctx, a, b, name):
        ctx.name = name
        if name in _READS:
            ctx.save_for_backward(a, b)
        else:
            ctx.shapes = (a.shape, b.shape)  # (array shapes are tuples)
        # The family function itself: a and b are tensors' arrays, the inputs the
        # functional API's guard (gpuplan.functional) is there to vet.
        return binary_arrays(name, a, b)

    @staticmethod
    def backward(ctx, dc):
        need_a, need_b = ctx.needs_input_grad
        if _ROWS[ctx.name].grad is None:  # floor_divide: zero gradients (torch)
            return tuple(gp.zeros(s, dc.dtype, gp.device_of(dc)) if n else None
                         for s, n in zip(ctx.shapes, (need_a, need_b), strict=True))
        if ctx.saved:
            da, db = F.binary_backward(ctx.name, *ctx.saved, dc)
        else:
            da, db = F.binary_backward(ctx.name, None, None, dc, shapes=ctx.shapes)
        return (da if need_a else None), (db if need_b else None)


class Scale(Function):
    """y = alpha * x (alpha a Python float)."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return F.unary("scale", x, alpha=alpha)

    @staticmethod
    def backward(ctx, dy):
        return F.unary("scale", dy, alpha=ctx.alpha)


class Neg(Function):
    @staticmethod
    def forward(ctx, x):
        return F.unary("neg", x)

    @staticmethod
    def backward(ctx, dy):
        return F.unary("neg", dy)


def _is_scalar(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# -- type promotion -----------------------------------------------------------------------


def _category(d: np.dtype) -> int:
    return 2 if d in FLOAT_DTYPES or d.kind == "f" else 0 if d == _BOOL else 1


def promote_types(a: Any, b: Any) -> np.dtype:
    """torch.promote_types for two tensor dtypes: the higher category; within one, the wider
    (float16 with bfloat16 is float32)."""
    a, b = as_dtype(a), as_dtype(b)
    if a == b:
        return a
    ca, cb = _category(a), _category(b)
    if ca != cb:
        return a if ca > cb else b
    if {a, b} == {float16, bfloat16}:
        return float32
    return a if a.itemsize >= b.itemsize else b


def _combine(higher: np.dtype | None, lower: np.dtype | None) -> np.dtype | None:
    """torch's combine_categories: the lower-priority operand only lifts the category."""
    if higher is None or lower is None:
        return lower if higher is None else higher
    if _category(higher) == 2:
        return higher
    if higher == _BOOL or _category(lower) == 2:
        return promote_types(higher, lower)
    return higher


def _scalar_dtype(v: Any) -> np.dtype | None:
    if isinstance(v, (bool, np.bool_)):
        return _BOOL
    if isinstance(v, (int, np.integer)):
        return int64
    if isinstance(v, (float, np.floating)):
        return float32  # torch's default dtype
    return None


def result_type(*values: Any) -> np.dtype:
    """The dtype torch computes `values` (Tensors and Python numbers) in: dimensioned
    tensors first, then 0-d tensors, then numbers, each tier only lifting the category."""
    dim = zero = wrapped = None
    for v in values:
        if isinstance(v, TensorBase):
            if v.ndim:
                dim = v.dtype if dim is None else promote_types(dim, v.dtype)
            else:
                zero = v.dtype if zero is None else promote_types(zero, v.dtype)
        elif (d := _scalar_dtype(v)) is not None:
            wrapped = d if wrapped is None else promote_types(wrapped, d)
    out = _combine(dim, _combine(zero, wrapped))
    if out is None:
        raise TypeError("result_type(): needs at least one Tensor or number")
    return out


def convert_operand(v: Any, dtype: np.dtype, device: str, op: str) -> Any:
    """v as `dtype` on `device`: a Tensor cast on the tape (bool through the where plan, as
    the cast plan has no bool), a number as a 0-d array (an integer that does not fit the
    dtype is an error, as torch), any other array-like converted."""
    if isinstance(v, TensorBase):
        if v.dtype == dtype:
            return v
        if v.dtype == _BOOL:
            one, zero = (gp.full((), k, dtype, device) for k in (1, 0))
            return new_tensor(F.where(v.data, one, zero))
        return _shape.Cast.apply(v, dtype=dtype)
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, (bool, int, float)):
        if dtype.kind in "iu" and not isinstance(v, bool):
            info = np.iinfo(dtype)
            if not info.min <= v <= info.max:
                raise RuntimeError(f"{op}(): value {v} cannot be converted to type {dtype} "
                                   f"without overflow")
        return gp.full((), v, dtype, device)
    return gp.asarray(v, dtype=dtype, device=device)


def promote(op: str, a: Any, b: Any, dtype: Any = None) -> tuple[Any, Any]:
    """a and b converted to their result dtype (or `dtype`), checked against op's row."""
    if dtype is None and isinstance(a, TensorBase) and isinstance(b, TensorBase):
        d = a.data.dtype  # the common case, two tensors of one dtype op takes: as they are
        if d == b.data.dtype and (op, d) in _TAKES:
            return a, b
    like = a if isinstance(a, TensorBase) else b
    if not isinstance(like, TensorBase):
        raise TypeError(f"{op}(): one operand must be a Tensor, given {type(a).__name__} and "
                        f"{type(b).__name__}")
    r = as_dtype(dtype) if dtype is not None else result_type(a, b)
    row = _ROWS[op]
    if r not in BINARY_DTYPES or dtype_kind(r) not in row.kinds or any(
            isinstance(v, TensorBase) and v.dtype not in BINARY_DTYPES for v in (a, b)):
        given = " and ".join(str(v.dtype) if isinstance(v, TensorBase) else type(v).__name__
                             for v in (a, b))
        raise TypeError(f"{op}(): not implemented for {given} (computed as {r}); "
                        f"{op} takes {_kinds(row.kinds)}")
    return convert_operand(a, r, like.device, op), convert_operand(b, r, like.device, op)


def _kinds(kinds: str) -> str:
    names = {"f": "float16/bfloat16/float32/float64", "i": "int32/int64", "b": "bool"}
    return " or ".join(names[k] for k in kinds)


def _binary(name: str, a: Any, b: Any) -> Tensor:
    if isinstance(a, TensorBase) and isinstance(b, TensorBase):
        d = a.data.dtype  # promote's common case, in line: two tensors of one dtype op takes
        if d == b.data.dtype and (name, d) in _TAKES:
            return Binary.apply(a, b, name=name)
    a, b = promote(name, a, b)
    return Binary.apply(a, b, name=name)


def _float_tensor(v: Any) -> bool:
    return isinstance(v, TensorBase) and _category(v.dtype) == 2


def add(a: Any, b: Any) -> Tensor:
    return _binary("add", a, b)


def sub(a: Any, b: Any) -> Tensor:
    return _binary("sub", a, b)


def mul(a: Any, b: Any) -> Tensor:
    if _float_tensor(a) and _is_scalar(b):
        return Scale.apply(a, alpha=float(b))
    if _float_tensor(b) and _is_scalar(a):
        return Scale.apply(b, alpha=float(a))
    return _binary("mul", a, b)


def div(a: Any, b: Any) -> Tensor:
    """True division (torch.div): integer and bool operands are divided as float32."""
    if _float_tensor(a) and _is_scalar(b):
        return Scale.apply(a, alpha=1.0 / float(b))
    r = result_type(a, b)
    a, b = promote("div", a, b, r if _category(r) == 2 else float32)
    return Binary.apply(a, b, name="div")


def remainder(a: Any, b: Any) -> Tensor:
    """a % b with the sign of b (torch.remainder, Python's %); integers: x % 0 == 0.
    Gradients: dc to a, -dc * floor_divide(a, b) to b."""
    return _binary("remainder", a, b)


def floor_divide(a: Any, b: Any) -> Tensor:
    """a // b rounded toward -inf (torch.floor_divide, Python's //); integers: x // 0 == 0.
    Its gradient is zero, as torch's."""
    return _binary("floor_divide", a, b)


def neg(x: Tensor) -> Tensor:
    if _category(x.dtype) != 2:  # integers: 0 - x (wraps: -INT_MIN == INT_MIN, as torch)
        if x.dtype == _BOOL:
            raise TypeError("neg(): negation of a bool tensor is not supported (torch), use "
                            "~ or logical_not()")
        return _binary("sub", 0, x)
    return Neg.apply(x)


def pow(a: Any, b: Any) -> Tensor:  # noqa: A001 - torch.pow
    """a ** b: tensor ** tensor, tensor ** scalar or scalar ** tensor (torch semantics:
    0 ** 0 = 1, a negative base with a non-integer exponent is NaN; the gradient of a is 0
    where b == 0, of b where a == 0 and b >= 0). Floats only."""
    return _binary("pow", a, b)


def maximum(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """Elementwise max, NaN propagating; on a tie each side gets half the gradient."""
    return _binary("maximum", input, other)


def minimum(input: Tensor, other: Any) -> Tensor:  # noqa: A002
    """Elementwise min, NaN propagating; on a tie each side gets half the gradient."""
    return _binary("minimum", input, other)


COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


def compare(name: str, a: Any, b: Any) -> Tensor:
    """a <name> b elementwise with broadcasting: a bool Tensor outside the tape (comparisons
    have no gradient, as in torch), computed in the operands' result dtype."""
    if name not in COMPARISONS:
        raise ValueError(f"compare: unknown comparison {name!r}; expected one of "
                         f"{COMPARISONS}")
    a, b = promote(name, a, b)
    return new_tensor(F.binary(name, _array(a), _array(b)))


def _array(v: Any) -> Any:
    return v.data if isinstance(v, TensorBase) else v
