"""Logical and bitwise ops on bool and integer tensors (&, |, ^, ~, logical_*) and the any /
all reductions, through the binary, select and reduction plans. None has a gradient.

On bool tensors the bitwise ops are the logical ones; ``~`` is bitwise not (logical not on
bool). The logical_* functions take any dtype (nonzero is True) and give bool, as torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import gpuplan as gp
import gpuplan.functional as F
from autograd.functions.arithmetic import promote
from autograd.tensor_base import TensorBase, new_tensor
from gpuplan.dtypes import float32

if TYPE_CHECKING:
    from autograd.tensor import Tensor

_BOOL = np.dtype(np.bool_)


def _bitwise(name: str, a: Any, b: Any) -> Tensor:
    a, b = promote(name, a, b)  # a float operand is a TypeError naming the op
    return new_tensor(F.binary(name, *(v.data if isinstance(v, TensorBase) else v for v in (a, b))))


def bitwise_and(input: Any, other: Any) -> Tensor:  # noqa: A002
    """input & other: bool and integer tensors (logical and on bool)."""
    return _bitwise("bitwise_and", input, other)


def bitwise_or(input: Any, other: Any) -> Tensor:  # noqa: A002
    """input | other: bool and integer tensors (logical or on bool)."""
    return _bitwise("bitwise_or", input, other)


def bitwise_xor(input: Any, other: Any) -> Tensor:  # noqa: A002
    """input ^ other: bool and integer tensors (logical xor on bool)."""
    return _bitwise("bitwise_xor", input, other)


def bitwise_not(input: Tensor) -> Tensor:  # noqa: A002
    """~input: logical not on bool, two's complement not (-x - 1) on integers."""
    if not isinstance(input, TensorBase):
        raise TypeError(f"bitwise_not(): argument 'input' must be a Tensor, given "
                        f"{type(input).__name__}")
    if input.dtype.kind not in "biu":
        raise TypeError(f"bitwise_not(): not implemented for {input.dtype}; it takes bool or "
                        f"int32/int64 tensors")
    return _bitwise("bitwise_xor", input, True if input.dtype == _BOOL else -1)


def _as_bool(v: Any, op: str, name: str) -> Tensor:
    """A bool Tensor as is; any other Tensor compared with zero (nonzero is True)."""
    if not isinstance(v, TensorBase):
        raise TypeError(f"{op}(): argument '{name}' must be a Tensor, given "
                        f"{type(v).__name__}")
    return v if v.dtype == _BOOL else v != 0


def logical_and(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    return bitwise_and(_as_bool(input, "logical_and", "input"),
                       _as_bool(other, "logical_and", "other"))


def logical_or(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    return bitwise_or(_as_bool(input, "logical_or", "input"),
                      _as_bool(other, "logical_or", "other"))


def logical_xor(input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    return bitwise_xor(_as_bool(input, "logical_xor", "input"),
                       _as_bool(other, "logical_xor", "other"))


def logical_not(input: Tensor) -> Tensor:  # noqa: A002
    """A bool tensor, True where input is zero (False)."""
    return bitwise_not(_as_bool(input, "logical_not", "input"))


def _dims(op: str, dim: int | Sequence[int] | None, ndim: int) -> tuple[int, ...] | None:
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    span = max(ndim, 1)  # a 0-d tensor takes dim 0 / -1, as torch
    out = []
    for d in dims:
        if not -span <= int(d) < span:
            raise IndexError(f"{op}(): dimension out of range (expected to be in range of "
                             f"[{-span}, {span - 1}], but got {d})")
        out.append(int(d) % span)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}(): dim {dim} names a dimension twice")
    return tuple(out) if ndim else ()


def _reduce(op: str, input: Tensor, dim: Any, keepdim: bool) -> Tensor:  # noqa: A002
    """any: the count of True is > 0; all: the count of False is 0. Counts are float32 sums
    of 0/1 from the where plan (the reduce plan takes floats): a positive sum never rounds to
    0, so the answer is exact at any size; an empty reduction gives False / True."""
    m = _as_bool(input, op, "input")
    axes = _dims(op, dim, m.ndim)
    one, zero = (gp.full((), v, float32, m.device) for v in (1.0, 0.0))
    hits = F.where(m.data, one, zero) if op == "any" else F.where(m.data, zero, one)
    counts = F.reduce("sum", hits, axes, bool(keepdim)) if axes != () else hits
    return new_tensor(F.binary("gt" if op == "any" else "eq", counts, zero))


def any(input: Tensor, dim: int | Sequence[int] | None = None,  # noqa: A001, A002
        keepdim: bool = False) -> Tensor:
    """True where some element (over `dim`, all dims if None) is nonzero; bool result."""
    return _reduce("any", input, dim, keepdim)


def all(input: Tensor, dim: int | Sequence[int] | None = None,  # noqa: A001, A002
        keepdim: bool = False) -> Tensor:
    """True where every element (over `dim`, all dims if None) is nonzero; bool result."""
    return _reduce("all", input, dim, keepdim)
