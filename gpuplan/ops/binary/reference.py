"""References of the binary family from PyTorch's definitions: float ops in float64 (C pow,
NaN-propagating maximum/minimum, torch's remainder and floor_divide), integer and bool ops
exactly with Python ints, the gradients reduced to the operands' shapes, and bias add."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.testing import f64

__all__ = ["bias_add_reference", "binary_backward_reference", "binary_reference",
           "floor_divide_float", "remainder_float", "sum_to_shape"]

_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "lt": lambda x, y: x < y, "le": lambda x, y: x <= y, "gt": lambda x, y: x > y,
    "ge": lambda x, y: x >= y, "eq": lambda x, y: x == y, "ne": lambda x, y: x != y,
}


def remainder_float(x: float, y: float) -> float:
    """torch.remainder of two floats: fmod(x, y) moved to the divisor's sign (plus y where the
    signs differ), a zero result keeping fmod's sign; x % 0, inf % y and NaN give NaN."""
    if y == 0 or math.isnan(x) or math.isnan(y) or math.isinf(x):
        return math.nan
    m = x if math.isinf(y) else math.fmod(x, y)  # fmod(x, +-inf) = x for finite x
    return m + y if m != 0 and (m < 0) != (y < 0) else m


def floor_divide_float(x: float, y: float) -> float:
    """torch.floor_divide of two floats: the floor of the exact quotient x / y, rounded to
    float64 (a zero result has the sign of x / y); x // 0 = x / 0, NaN and inf // y give NaN,
    a finite x // +-inf is 0 or -1 (the floor of an infinitesimal)."""
    if y == 0:  # x / 0 as IEEE divides
        if x == 0 or math.isnan(x):
            return math.nan
        return math.copysign(math.inf, x) * math.copysign(1.0, y)
    if math.isnan(x) or math.isnan(y) or math.isinf(x):
        return math.nan
    negative = (math.copysign(1.0, x) < 0) != (math.copysign(1.0, y) < 0)
    if math.isinf(y):
        q = -1 if negative and x != 0 else 0
    else:
        q = math.floor(Fraction(x) / Fraction(y))
    return float(q) if q != 0 else (-0.0 if negative else 0.0)


def _wrap(v: int, bits: int) -> int:
    """v in `bits`-bit two's complement."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


#: Integer ops on Python ints (bool as 0/1), before wrapping to the width: torch's
#: wrap-around arithmetic, Python's floor division and modulo, x // 0 == x % 0 == 0.
_INT: dict[str, Callable[[int, int], int]] = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "maximum": max, "minimum": min,
    "remainder": lambda x, y: 0 if y == 0 else x % y,
    "floor_divide": lambda x, y: 0 if y == 0 else x // y,
    "bitwise_and": lambda x, y: x & y, "bitwise_or": lambda x, y: x | y,
    "bitwise_xor": lambda x, y: x ^ y,
}


def _exact(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An integer or bool op element by element with Python ints, wrapped to a's width
    (bool ops give bool; comparisons give bool)."""
    is_bool = a.dtype == np.bool_
    bits = 1 if is_bool else 8 * a.dtype.itemsize
    x, y = np.broadcast_arrays(a, b)
    pairs = zip(x.reshape(-1).tolist(), y.reshape(-1).tolist(), strict=True)
    if op in _COMPARE:
        return np.array([_COMPARE[op](int(p), int(q)) for p, q in pairs],
                        np.bool_).reshape(x.shape)
    vals = [_INT[op](int(p), int(q)) for p, q in pairs]
    vals = [bool(v) for v in vals] if is_bool else [_wrap(v, bits) for v in vals]
    return np.array(vals, a.dtype).reshape(x.shape)


def _elementwise(fn: Callable[[float, float], float], a: np.ndarray,
                 b: np.ndarray) -> np.ndarray:
    x, y = np.broadcast_arrays(a, b)
    return np.array([fn(p, q) for p, q in zip(x.reshape(-1).tolist(), y.reshape(-1).tolist(),
                                               strict=True)], np.float64).reshape(x.shape)


def binary_reference(op: str, a: Any, b: Any) -> np.ndarray:
    """c = a op b over the broadcast shape. Float operands: float64 math (bool for a
    comparison; NaN compares unequal): pow is C's pow (0**0 = nan**0 = 1**nan = 1, a
    negative base with a non-integer exponent NaN), maximum/minimum propagate NaN, remainder
    and floor_divide are `remainder_float` / `floor_divide_float`. int32/int64/bool operands:
    exact, in their dtype (module `_INT`; comparisons bool)."""
    ha, hb = np.asarray(gp.to_host(a)), np.asarray(gp.to_host(b))
    if ha.dtype.kind in "iub":
        return _exact(op, ha, hb.astype(ha.dtype))
    x, y = f64(ha), f64(hb)
    if op in _COMPARE:
        return np.asarray(_COMPARE[op](x, y))
    if op == "remainder":
        return _elementwise(remainder_float, x, y)
    if op == "floor_divide":
        return _elementwise(floor_divide_float, x, y)
    with np.errstate(all="ignore"):
        return np.asarray({
            "add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
            "div": lambda: x / y, "pow": lambda: np.power(x, y),
            "maximum": lambda: np.where(np.isnan(x) | np.isnan(y), np.nan,
                                        np.where(x >= y, x, y)),
            "minimum": lambda: np.where(np.isnan(x) | np.isnan(y), np.nan,
                                        np.where(x <= y, x, y)),
        }[op]())


def sum_to_shape(g: np.ndarray, shape: tuple) -> np.ndarray:
    """g (of the broadcast shape) summed over the dims `shape` was broadcast along: the
    leading dims it lacks and its size-1 dims, in float64."""
    g = np.asarray(g, np.float64)
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, e in enumerate(shape)
                                      if e == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes).reshape(shape)


def _extremum_grad(x: np.ndarray, y: np.ndarray, dc: np.ndarray, loses: Callable) -> np.ndarray:
    """torch's maximum/minimum gradient to the side x: dc / 2 on a tie, 0 where x loses,
    dc otherwise (so both sides get dc where one is NaN)."""
    return np.where(x == y, dc / 2, np.where(loses(x, y), 0.0, dc))


def binary_backward_reference(op: str, a: Any, b: Any, dc: Any) -> tuple[np.ndarray, np.ndarray]:
    """(da, db) of c = a op b in float64, each per-element term summed to its operand's shape
    (`sum_to_shape`): add (dc, dc), sub (dc, -dc), mul (dc b, dc a), div (dc / b,
    -dc a / b^2), pow torch's (dc b a^(b-1), 0 where b == 0; dc a^b log a, 0 where a == 0 and
    b >= 0), maximum/minimum torch's (`_extremum_grad`), remainder torch's (dc,
    -dc floor_divide(a, b))."""
    x, y, g = f64(a), f64(b), f64(dc)
    shape = np.broadcast_shapes(x.shape, y.shape)
    x, y = np.broadcast_to(x, shape), np.broadcast_to(y, shape)
    with np.errstate(all="ignore"):
        ga, gb = {
            "add": lambda: (g, g), "sub": lambda: (g, -g),
            "mul": lambda: (g * y, g * x), "div": lambda: (g / y, -g * x / (y * y)),
            "pow": lambda: (np.where(y == 0, 0.0, g * y * np.power(x, y - 1)),
                            np.where((x == 0) & (y >= 0), 0.0, g * np.power(x, y) * np.log(x))),
            "maximum": lambda: (_extremum_grad(x, y, g, np.less),
                                _extremum_grad(y, x, g, np.less)),
            "minimum": lambda: (_extremum_grad(x, y, g, np.greater),
                                _extremum_grad(y, x, g, np.greater)),
            "remainder": lambda: (g, -g * _elementwise(floor_divide_float, x, y)),
        }[op]()
    return (sum_to_shape(np.broadcast_to(ga, shape), np.shape(a)),
            sum_to_shape(np.broadcast_to(gb, shape), np.shape(b)))


def bias_add_reference(x: Any, bias: Any) -> np.ndarray:
    """y[r, j] = x[r, j] + bias[j] in float64."""
    return f64(x) + f64(bias)
