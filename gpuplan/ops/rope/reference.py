"""float64 reference of the rope family, from the definition as a complex rotation: the pair
(x[i], x[i + D/2]) is the complex number z = x[i] + 1j x[i + D/2], and the rotary embedding
multiplies it by exp(1j * angle), angle = position * theta ** (-2 i / D) (its gradient by
exp(-1j * angle)). Shares nothing with the host SKU (which uses the real rotate-half form)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = ["rope_reference"]


def rope_reference(x: Any, theta: float, offset: int = 0, inverse: bool = False) -> np.ndarray:
    """x [batch, seq, heads, D] (D even) rotated in float64: position offset + t for sequence
    index t; `inverse` rotates by -angle (the gradient)."""
    x = f64(x)
    d = x.shape[-1]
    half = d // 2
    inv_freq = np.array([float(theta) ** (-2.0 * i / d) for i in range(half)])
    positions = float(offset) + np.arange(x.shape[1], dtype=np.float64)
    angle = positions[:, None] * inv_freq[None, :]
    phase = np.exp((-1j if inverse else 1j) * angle)[None, :, None, :]  # [1, seq, 1, half]
    z = (x[..., :half] + 1j * x[..., half:]) * phase
    return np.concatenate([z.real, z.imag], axis=-1)
