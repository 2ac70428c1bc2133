"""AdamW's host math on one flat piece of a tensor (gpuplan.ops.optimizer.adamw's host SKUs): the
compiled float32 kernel of gpuplan.host_kernels when gpuplan.host_jit has it (one pass, the
same float32 roundings in the same order, so the same bits), else NumPy passes."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import host_jit


def adamw_host(p: Any, g: Any, m: Any, v: Any, lowp: Any, s: tuple) -> None:
    """One AdamW step in place on p, m, v (and lowp = p rounded, when not None); s holds the
    step's factors in p's dtype: (decay, b1, 1 - b1, b2, 1 - b2, step_size,
    1 / sqrt(1 - b2^t), eps)."""
    if lowp is None and host_jit.takes(p, g, m, v):
        k = host_jit.kernels()
        if k is not None:
            k.adamw(p, g, m, v, *s)
            return
    decay, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps = s
    # In place, rounding exactly like the expressions in the comments (no temporaries
    # beyond two scratch arrays).
    g = g.astype(p.dtype, copy=False)
    t = np.multiply(g, omb1)
    m *= b1
    m += t                        # m = b1 * m + (1 - b1) * g
    np.multiply(g, g, out=t)
    t *= omb2
    v *= b2
    v += t                        # v = b2 * v + (1 - b2) * g * g
    den = np.sqrt(v)
    den *= inv_sqrt_bc2
    den += eps
    np.divide(m, den, out=t)
    t *= step_size
    p *= decay
    p -= t                        # p = p * decay - step_size * (m / (sqrt(v) / sqrt(bc2) + eps))
    if lowp is not None:
        lowp[...] = p.astype(lowp.dtype)
