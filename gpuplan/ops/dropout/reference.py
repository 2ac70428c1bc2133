"""float64 dropout multipliers keep / (1 - p) for tests of the ops that apply dropout."""

from __future__ import annotations

import numpy as np

__all__ = ["dropout_multipliers"]


def dropout_multipliers(shape: tuple[int, ...], p: float, seed: int, offset: int = 0
                        ) -> np.ndarray:
    """keep / (1 - p) in float64 over `shape` (C order), keep the dropout plan's bits for
    (p, seed, offset); 0 everywhere when p == 1."""
    from gpuplan.ops.dropout.plans import keep_mask_host

    keep = keep_mask_host(int(np.prod(shape)), p, seed, offset).reshape(shape)
    return np.where(keep, 0.0 if p >= 1 else 1.0 / (1.0 - p), 0.0)
