"""float64 references of the activation family (every op of UNARY_OPS: y = f(x) and
dx = dy * f'(x)), written from each op's definition with NumPy and `math` (`math.erfc` for the
exact GELU, not the erf of gpuplan.host_math that the host SKU evaluates). Nothing is imported
from the family's plans.py or host.py, not even the op list (the tests check that
REFERENCE_OPS equals UNARY_OPS), so a slip in the host math cannot hide here.

Conventions (those of PyTorch, as the family declares them): 'scale' is alpha * x; 'clamp' is
min(max(x, alpha), beta) with a missing bound unbounded, NaN kept and beta winning when
alpha > beta, its gradient passing where alpha <= x <= beta; relu keeps NaN. The masking ops
(relu, abs, clamp) pass no dy where their derivative is 0 (NaN included), even a
non-finite dy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = [
    "REFERENCE_OPS",
    "unary_reference",
    "unary_derivative_reference",
    "unary_backward_reference",
    "gelu_reference",
]

#: erfc elementwise, by the C library (not the host SKU's erf); Phi(x) = erfc(-x / sqrt 2) / 2
#: keeps its relative accuracy in the left tail, where 1 + erf(x / sqrt 2) cancels.
_ERFC = np.vectorize(math.erfc, otypes=[np.float64])
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_CUBIC = 0.044715


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x), with e^-|x| only (no overflow either side)."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * _ERFC(-x / math.sqrt(2.0))


def _normal_pdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _tanh_gelu_arg(x: np.ndarray) -> np.ndarray:
    return _SQRT_2_OVER_PI * (x + _GELU_TANH_CUBIC * x**3)


def _bounds(alpha: Any, beta: Any) -> tuple[float, float]:
    return (-math.inf if alpha is None else float(alpha)), (math.inf if beta is None
                                                           else float(beta))


def _clamp(x: np.ndarray, alpha: Any, beta: Any) -> np.ndarray:
    lo, hi = _bounds(alpha, beta)
    y = np.where(x < lo, lo, x)       # NaN fails the test and stays
    return np.where(y > hi, hi, y)    # hi last: it wins when lo > hi


def _in_bounds(x: np.ndarray, alpha: Any, beta: Any) -> np.ndarray:
    lo, hi = _bounds(alpha, beta)
    return ((x >= lo) & (x <= hi)).astype(np.float64)


def _sign(x: np.ndarray) -> np.ndarray:
    """+1, -1, and 0 at 0 and NaN."""
    return (x > 0).astype(np.float64) - (x < 0).astype(np.float64)


# op -> f(x, alpha, beta) and f'(x, alpha, beta), each from its definition.
_Fn = Callable[[np.ndarray, Any, Any], np.ndarray]
_MATH: dict[str, tuple[_Fn, _Fn]] = {
    "relu": (lambda x, a, b: np.where(x > 0, x, np.where(np.isnan(x), x, 0.0)),
             lambda x, a, b: (x > 0).astype(np.float64)),
    # x Phi(x); Phi(x) + x phi(x)
    "gelu": (lambda x, a, b: x * _normal_cdf(x),
             lambda x, a, b: _normal_cdf(x) + x * _normal_pdf(x)),
    # x (1 + tanh u) / 2, u = sqrt(2/pi) (x + 0.044715 x^3); d/dx by the product rule with
    # tanh' = sech^2
    "gelu_tanh": (lambda x, a, b: 0.5 * x * (1.0 + np.tanh(_tanh_gelu_arg(x))),
                  lambda x, a, b: 0.5 * (1.0 + np.tanh(_tanh_gelu_arg(x)))
                  + 0.5 * x * np.cosh(_tanh_gelu_arg(x)) ** -2.0
                  * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_TANH_CUBIC * x * x)),
    # x sigma(x); sigma + x sigma (1 - sigma)
    "silu": (lambda x, a, b: x * _sigmoid(x),
             lambda x, a, b: _sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x)))),
    "tanh": (lambda x, a, b: np.tanh(x), lambda x, a, b: np.cosh(x) ** -2.0),
    "exp": (lambda x, a, b: np.exp(x), lambda x, a, b: np.exp(x)),
    "neg": (lambda x, a, b: -x, lambda x, a, b: np.full_like(x, -1.0)),
    "scale": (lambda x, a, b: float(a) * x, lambda x, a, b: np.full_like(x, float(a))),
    "log": (lambda x, a, b: np.log(x), lambda x, a, b: 1.0 / x),
    # through sqrt(x) (not x ** -0.5): sqrt(-0) = -0 gives the signed infinities PyTorch
    # gives at -0, and sqrt(-inf) = NaN keeps -inf out of the domain
    "sqrt": (lambda x, a, b: np.sqrt(x), lambda x, a, b: 0.5 / np.sqrt(x)),
    "rsqrt": (lambda x, a, b: 1.0 / np.sqrt(x), lambda x, a, b: -0.5 * (1.0 / np.sqrt(x)) ** 3),
    "sigmoid": (lambda x, a, b: _sigmoid(x),
                lambda x, a, b: _sigmoid(x) * _sigmoid(-x)),
    "abs": (lambda x, a, b: np.abs(x), lambda x, a, b: _sign(x)),
    "clamp": (_clamp, _in_bounds),
}
#: the ops whose gradient masks dy (where f' is 0, dx is 0 whatever dy is).
_MASKING = ("relu", "abs", "clamp")
#: every op this module defines (the test checks it equals UNARY_OPS).
REFERENCE_OPS: tuple[str, ...] = tuple(_MATH)


def _math(op: str) -> tuple[_Fn, _Fn]:
    try:
        return _MATH[op]
    except KeyError:
        raise KeyError(f"no float64 reference for activation {op!r}; "
                       f"known: {', '.join(REFERENCE_OPS)}") from None


def unary_reference(op: str, x: Any, alpha: float | None = None,
                    beta: float | None = None) -> np.ndarray:
    """y = f(x) in float64, same shape as x; alpha: the factor of 'scale'; alpha, beta: the
    bounds of 'clamp' (None: unbounded)."""
    forward, _ = _math(op)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return forward(f64(x), alpha, beta)


def unary_derivative_reference(op: str, x: Any, alpha: float | None = None,
                               beta: float | None = None) -> np.ndarray:
    """f'(x) in float64, same shape as x (scalars as in `unary_reference`)."""
    _, derivative = _math(op)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return derivative(f64(x), alpha, beta)


def unary_backward_reference(op: str, x: Any, dy: Any, alpha: float | None = None,
                             beta: float | None = None) -> np.ndarray:
    """dx = dy * f'(x) in float64, x the forward input; the masking ops (relu, abs, clamp)
    give 0 where f'(x) is 0, whatever dy."""
    d, dy = unary_derivative_reference(op, x, alpha, beta), f64(dy)
    with np.errstate(invalid="ignore"):
        dx = dy * d
    return np.where(d == 0, 0.0, dx) if op in _MASKING else dx


def gelu_reference(x: Any, approximate: str = "none") -> np.ndarray:
    """GELU in float64 from its definition: x * Phi(x) (erf), or the tanh approximation."""
    return unary_reference("gelu_tanh" if approximate == "tanh" else "gelu", x)
