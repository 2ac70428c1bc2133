"""Selection Functions via the select plans: where(cond, a, b), masked_fill, tril, triu."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.functions.shape import sum_to_shape
from autograd.tensor_base import TensorBase

if TYPE_CHECKING:
    from autograd.tensor import Tensor


class Where(Function):
    """out = cond ? a : b (broadcasting); da = sum_to(cond ? dout : 0, a.shape), db the
    other way round (the where plan routes dout, a sum over broadcast dims follows)."""

    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.save_for_backward(cond)
        ctx.shapes = (a.shape, b.shape)
        return F.where(cond, a, b)

    @staticmethod
    def backward(ctx, dout):
        (cond,) = ctx.saved
        zero = gp.full((), 0.0, dout.dtype, gp.device_of(dout))
        _, need_a, need_b = ctx.needs_input_grad
        da = sum_to_shape(F.where(cond, dout, zero), ctx.shapes[0]) if need_a else None
        db = sum_to_shape(F.where(cond, zero, dout), ctx.shapes[1]) if need_b else None
        return None, da, db


class Triangle(Function):
    """tril / triu over the last two dims; the gradient is the same triangle of dy."""

    @staticmethod
    def forward(ctx, x, part, diagonal):
        ctx.part, ctx.diagonal = part, diagonal
        return F.triangle(part, x, diagonal)

    @staticmethod
    def backward(ctx, dy):
        return F.triangle(ctx.part, dy, ctx.diagonal)


def _operand(v: Any, like: Tensor, op: str, name: str) -> Any:
    """A Tensor as is; a Python number as a 0-d array of `like`'s dtype on its device."""
    if isinstance(v, TensorBase):
        return v
    if isinstance(v, (bool, int, float, np.number)):
        return gp.full((), v, like.dtype, like.device)
    raise TypeError(f"{op}(): argument '{name}' must be a Tensor or a number, given "
                    f"{type(v).__name__}")


def _bool_mask(mask: Any, op: str, name: str) -> Tensor:
    if not isinstance(mask, TensorBase):
        raise TypeError(f"{op}(): argument '{name}' must be a bool Tensor, given "
                        f"{type(mask).__name__}")
    if mask.dtype != np.bool_:
        raise TypeError(f"{op}(): argument '{name}' must be a bool Tensor, given dtype "
                        f"{mask.dtype} (compare first, e.g. mask != 0)")
    return mask


def _check_shapes(op: str, *named: tuple[str, tuple]) -> None:
    try:
        np.broadcast_shapes(*(s for _, s in named))
    except ValueError:
        shapes = ", ".join(f"{n} {tuple(s)}" for n, s in named)
        raise ValueError(f"{op}(): shapes do not broadcast: {shapes}") from None


def where(condition: Tensor, input: Any, other: Any) -> Tensor:  # noqa: A002
    """torch.where(condition, input, other): input where condition, else other, with
    broadcasting; either value may be a Python number (in the other's dtype)."""
    cond = _bool_mask(condition, "where", "condition")
    if not isinstance(input, TensorBase) and not isinstance(other, TensorBase):
        raise TypeError("where(): 'input' or 'other' must be a Tensor")
    like = input if isinstance(input, TensorBase) else other
    a = _operand(input, like, "where", "input")
    b = _operand(other, like, "where", "other")
    if a.dtype != b.dtype:
        raise TypeError(f"where(): 'input' and 'other' must have one dtype, given {a.dtype} "
                        f"and {b.dtype}")
    _check_shapes("where", ("condition", cond.shape), ("input", tuple(a.shape)),
                  ("other", tuple(b.shape)))
    return Where.apply(cond, a, b)


def masked_fill(input: Tensor, mask: Tensor, value: Any) -> Tensor:  # noqa: A002
    """input with `value` where mask (bool, broadcast to input's shape) is True. A 0-d
    Tensor value gets its gradient (the sum over the filled places), as in torch."""
    m = _bool_mask(mask, "masked_fill", "mask")
    if isinstance(value, TensorBase) and value.ndim != 0:
        raise ValueError(f"masked_fill(): 'value' must be a number or a 0-d tensor, given "
                         f"shape {value.shape}")
    if not _broadcasts(m.shape, input.shape) or \
            np.broadcast_shapes(m.shape, input.shape) != input.shape:
        raise ValueError(f"masked_fill(): mask of shape {m.shape} does not broadcast to "
                         f"the input's shape {input.shape}")
    v = _operand(value, input, "masked_fill", "value")
    if v.dtype != input.dtype:
        v = v.to(dtype=input.dtype)
    return Where.apply(m, v, input)


def _broadcasts(a: tuple, b: tuple) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def _triangle(part: str, input: Tensor, diagonal: int) -> Tensor:  # noqa: A002
    op = "tril" if part == "lower" else "triu"
    if input.ndim < 2:
        raise ValueError(f"{op}(): input must have at least 2 dims, given shape {input.shape}")
    if isinstance(diagonal, bool) or not isinstance(diagonal, (int, np.integer)):
        raise TypeError(f"{op}(): 'diagonal' must be an int, given "
                        f"{type(diagonal).__name__}")
    return Triangle.apply(input, part=part, diagonal=int(diagonal))


def tril(input: Tensor, diagonal: int = 0) -> Tensor:  # noqa: A002
    """The lower triangle (j - i <= diagonal) of the last two dims, zeros elsewhere."""
    return _triangle("lower", input, diagonal)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:  # noqa: A002
    """The upper triangle (j - i >= diagonal) of the last two dims, zeros elsewhere."""
    return _triangle("upper", input, diagonal)
