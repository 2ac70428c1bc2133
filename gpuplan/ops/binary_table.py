"""The binary ops' table: one row per op, its host math and gradient terms.

PyTorch semantics: pow follows C pow (0**0 = 1, x**0 = 1 even for NaN x, 1**y = 1, a negative
base with a non-integer exponent is NaN); its gradients are torch's: d/da is 0 where b == 0,
d/db is 0 where a == 0 and b >= 0. maximum/minimum propagate NaN; on a tie each side gets
half of dc (torch's rule), and where one side is NaN both get dc (that rule read literally).
Comparisons (lt, le, gt, ge, eq, ne) give bool and have no gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class BinaryOp:
    """One op: name, host math in the accumulator dtype (forward: a ufunc; the gradient term
    ``(which, a, b, dc)`` of operand `which` before the sum over broadcast dims, None for a
    comparison: bool result, no gradient), and whether that term reads a and b."""

    name: str
    forward: Callable[..., np.ndarray]
    grad: Callable[[int, Any, Any, np.ndarray], np.ndarray] | None
    reads_operands: bool = False

    @property
    def compare(self) -> bool:
        return self.grad is None


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


BINARY_OPS: tuple[BinaryOp, ...] = (
    BinaryOp("add", np.add, lambda w, a, b, dc: dc),
    BinaryOp("sub", np.subtract, lambda w, a, b, dc: dc if w == 0 else -dc),
    BinaryOp("mul", np.multiply, lambda w, a, b, dc: dc * (b if w == 0 else a), True),
    BinaryOp("div", np.divide, lambda w, a, b, dc: dc / b if w == 0 else -dc * a / (b * b),
             True),
    BinaryOp("pow", np.power, _pow_grad, True),
    BinaryOp("maximum", np.maximum, _extremum_grad(np.less), True),
    BinaryOp("minimum", np.minimum, _extremum_grad(np.greater), True),
    *(BinaryOp(n, f, None) for n, f in (("lt", np.less), ("le", np.less_equal),
                                        ("gt", np.greater), ("ge", np.greater_equal),
                                        ("eq", np.equal), ("ne", np.not_equal))),
)
BINARY_OP_NAMES: tuple[str, ...] = tuple(op.name for op in BINARY_OPS)
#: the ops with a gradient (binary_backward's ops): every one but the comparisons.
DIFFERENTIABLE_OPS: tuple[str, ...] = tuple(op.name for op in BINARY_OPS if not op.compare)
