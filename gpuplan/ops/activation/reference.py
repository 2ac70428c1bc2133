"""float64 reference of the activation family, from the definitions (`math.erf` for the exact
GELU: independent of the erf the host SKU evaluates)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = ["gelu_reference"]

#: erf elementwise, correctly rounded in float64 by the C library (not the host SKU's erf).
_ERF = np.vectorize(math.erf, otypes=[np.float64])


def gelu_reference(x: Any, approximate: str = "none") -> np.ndarray:
    """GELU in float64 from its definition: x * Phi(x) (erf), or the tanh approximation."""
    x = f64(x)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)))
