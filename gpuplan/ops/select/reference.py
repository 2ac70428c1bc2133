"""References of the select family from the definitions: where(cond, a, b) over the broadcast
shape and the triangles tril / triu, as exact copies of the selected values (bits included)."""

from __future__ import annotations

from typing import Any

import numpy as np

import gpuplan as gp

__all__ = ["broadcast_shape", "triangle_reference", "where_reference"]


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy's broadcast rule written out: shapes aligned at the right, missing dims 1, and in
    each dim every extent 1 or one common extent (which the result takes)."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(rank):
        extents = {s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0}
        wide = extents - {1}
        if len(wide) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(wide.pop() if wide else 1)
    return tuple(out)


def where_reference(cond: Any, a: Any, b: Any) -> np.ndarray:
    """out[i] = a[i] if cond[i] else b[i] over broadcast_shape(cond, a, b) (a nonzero cond is
    true), in the dtype of a and b: the selected values copied, NaN payloads included."""
    cond, a, b = (np.asarray(gp.to_host(v)) for v in (cond, a, b))
    shape = broadcast_shape(cond.shape, a.shape, b.shape)
    take_a = np.broadcast_to(cond != 0, shape)
    out = np.array(np.broadcast_to(b, shape), dtype=a.dtype)
    out[take_a] = np.broadcast_to(a, shape)[take_a]
    return out


def triangle_reference(part: str, x: Any, diagonal: int = 0) -> np.ndarray:
    """tril (part "lower": keep j - i <= diagonal) or triu ("upper": keep j - i >= diagonal)
    over the last two dims (i the row, j the column) of x, zeros elsewhere, in x's dtype:
    kept values copied bit for bit."""
    x = np.asarray(gp.to_host(x))
    rows, cols = x.shape[-2:]
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    keep = offset <= diagonal if part == "lower" else offset >= diagonal
    out = np.zeros_like(x)
    out[..., keep] = x[..., keep]
    return out
