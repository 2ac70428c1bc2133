"""The binary ops' table: one row per op, its dtype kinds, host math and gradient terms.

PyTorch semantics: pow follows C pow (0**0 = 1, x**0 = 1 even for NaN x, 1**y = 1, a negative
base with a non-integer exponent is NaN); its gradients are torch's: d/da is 0 where b == 0,
d/db is 0 where a == 0 and b >= 0. maximum/minimum propagate NaN; on a tie each side gets
half of dc (torch's rule), and where one side is NaN both get dc (that rule read literally).
Comparisons (lt, le, gt, ge, eq, ne) give bool and have no gradient.

Integers (int32, int64): add/sub/mul wrap around on overflow (two's complement, as torch and
NumPy); floor_divide and remainder round toward -inf (Python's // and %); an integer
division by zero gives 0 (NumPy's result: torch raises on the CPU, a kernel cannot), and
INT_MIN // -1 wraps to INT_MIN. Floats: remainder is torch's (fmod, moved to the divisor's
sign), floor_divide is torch's (floor of the exact quotient; x // 0 is x / 0). remainder's
gradient is torch's (dc, and -dc * floor_divide(a, b)); floor_divide has none. The bitwise
ops take integers and bool (on bool they are logical and/or/xor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan.dtypes import FLOAT_DTYPES, as_dtype, cuda_name, int32, int64

#: dtype kinds of a row: "f" float, "i" int32/int64, "b" bool.
FLOAT, INT, BOOL = "f", "i", "b"
KIND_NAMES = {FLOAT: "float", INT: "int32/int64", BOOL: "bool"}
BOOL_DTYPE = np.dtype(np.bool_)
#: Every dtype some op takes; each row of the table says which kinds it takes.
BINARY_DTYPES: tuple[np.dtype, ...] = FLOAT_DTYPES + (int32, int64, BOOL_DTYPE)


def dtype_kind(dtype: Any) -> str:
    """FLOAT, INT or BOOL: the kind of one of BINARY_DTYPES."""
    d = as_dtype(dtype)
    return FLOAT if d in FLOAT_DTYPES else BOOL if d == BOOL_DTYPE else INT


def ctype(dtype: Any) -> str:
    """The CUDA C element type of one of BINARY_DTYPES."""
    return "bool" if as_dtype(dtype) == BOOL_DTYPE else cuda_name(dtype)


@dataclass(frozen=True)
class BinaryOp:
    """One op: name, host math (forward: a ufunc-like ``f(a, b, out=None)`` in the
    accumulator dtype; the gradient term ``(which, a, b, dc)`` of operand `which` before the
    sum over broadcast dims, None for an op without gradient), whether that term reads a
    and b, the dtype kinds it takes and whether it is a comparison (bool result)."""

    name: str
    forward: Callable[..., np.ndarray]
    grad: Callable[[int, Any, Any, np.ndarray], np.ndarray] | None
    reads_operands: bool = False
    kinds: str = FLOAT
    compare: bool = False


def _pow_grad(w: int, a: Any, b: Any, dc: np.ndarray) -> np.ndarray:
    if w == 0:  # torch: 0 where the exponent is 0 (even where a ** (b - 1) is inf or NaN)
        return np.where(b == 0, 0, dc * b * np.power(a, b - 1))
    return np.where((a == 0) & (b >= 0), 0, dc * np.power(a, b) * np.log(a))


def _extremum_grad(loses: Callable) -> Callable:
    """torch's maximum/minimum gradient: dc / 2 on a tie, 0 where this side loses."""
    def grad(w: int, a: Any, b: Any, dc: np.ndarray) -> np.ndarray:
        x, y = (a, b) if w == 0 else (b, a)
        return np.where(x == y, dc * 0.5, np.where(loses(x, y), 0, dc))
    return grad


def _out(r: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return r
    out[...] = r
    return out


def floor_divide(a: Any, b: Any, out: np.ndarray | None = None) -> np.ndarray:
    """a // b: NumPy's for integers; torch's (and CPython's) floor of the quotient for floats,
    computed as binary.cu does (exact: the quotient of a - fmod(a, b) by b)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iub":
        return np.floor_divide(a, b, out=out)
    mod = np.fmod(a, b)
    div = (a - mod) / b
    div = np.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    fl = np.floor(div)
    fl = np.where(div - fl > 0.5, fl + 1, fl)
    r = np.where(div != 0, fl, np.copysign(np.zeros_like(div), a / b))
    return _out(np.where(b == 0, a / b, r).astype(a.dtype, copy=False), out)


def remainder(a: Any, b: Any, out: np.ndarray | None = None) -> np.ndarray:
    """a % b with the divisor's sign: NumPy's for integers (x % 0 = 0), torch's for floats
    (fmod, plus b where the signs differ; a zero keeps fmod's sign)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iub":
        return np.remainder(a, b, out=out)
    m = np.fmod(a, b)
    return _out(np.where((m != 0) & ((b < 0) != (m < 0)), m + b, m).astype(a.dtype,
                                                                          copy=False), out)


def _remainder_grad(w: int, a: Any, b: Any, dc: np.ndarray) -> np.ndarray:
    return dc if w == 0 else -dc * floor_divide(a, b)


BINARY_OPS: tuple[BinaryOp, ...] = (
    BinaryOp("add", np.add, lambda w, a, b, dc: dc, kinds=FLOAT + INT),
    BinaryOp("sub", np.subtract, lambda w, a, b, dc: dc if w == 0 else -dc, kinds=FLOAT + INT),
    BinaryOp("mul", np.multiply, lambda w, a, b, dc: dc * (b if w == 0 else a), True,
             kinds=FLOAT + INT),
    BinaryOp("div", np.divide, lambda w, a, b, dc: dc / b if w == 0 else -dc * a / (b * b),
             True),
    BinaryOp("pow", np.power, _pow_grad, True),
    BinaryOp("maximum", np.maximum, _extremum_grad(np.less), True, kinds=FLOAT + INT),
    BinaryOp("minimum", np.minimum, _extremum_grad(np.greater), True, kinds=FLOAT + INT),
    BinaryOp("remainder", remainder, _remainder_grad, True, kinds=FLOAT + INT),
    BinaryOp("floor_divide", floor_divide, None, kinds=FLOAT + INT),
    *(BinaryOp(n, f, None, kinds=FLOAT + INT + BOOL, compare=True)
      for n, f in (("lt", np.less), ("le", np.less_equal), ("gt", np.greater),
                   ("ge", np.greater_equal), ("eq", np.equal), ("ne", np.not_equal))),
    *(BinaryOp(n, f, None, kinds=INT + BOOL)
      for n, f in (("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or),
                   ("bitwise_xor", np.bitwise_xor))),
)
BINARY_OP_NAMES: tuple[str, ...] = tuple(op.name for op in BINARY_OPS)
#: the ops with a gradient (binary_backward's ops).
DIFFERENTIABLE_OPS: tuple[str, ...] = tuple(op.name for op in BINARY_OPS if op.grad is not None)
#: the comparisons: a bool result.
COMPARE_OPS: tuple[str, ...] = tuple(op.name for op in BINARY_OPS if op.compare)
