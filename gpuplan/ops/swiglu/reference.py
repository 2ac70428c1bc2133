"""float64 reference of the swiglu family from the definitions, with the logistic function
written through tanh (sigmoid(g) = (1 + tanh(g / 2)) / 2): independent of the host SKU's
1 / (1 + exp(-g))."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = ["swiglu_reference", "swiglu_backward_reference"]


def _sigmoid(g: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * g))


def swiglu_reference(gate: Any, up: Any) -> np.ndarray:
    """silu(gate) * up = gate * sigmoid(gate) * up in float64."""
    g = f64(gate)
    return g * _sigmoid(g) * f64(up)


def swiglu_backward_reference(gate: Any, up: Any, dy: Any) -> tuple[np.ndarray, np.ndarray]:
    """(dgate, dup) in float64: d/dg [g sigmoid(g)] = sigmoid(g) + g sigmoid'(g), with
    sigmoid' = sigmoid (1 - sigmoid); d/du = silu(g)."""
    g, u, d = f64(gate), f64(up), f64(dy)
    s = _sigmoid(g)
    dsilu = s + g * s * (1.0 - s)
    return d * u * dsilu, d * g * s
