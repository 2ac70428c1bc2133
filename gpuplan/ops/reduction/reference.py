"""float64 references of the reduction family from the definitions: sum, mean, max, min and
prod over axes (NumPy's axes and keepdims), the L2 norm of a list of tensors, the corrected
variance (and std) over axes, and the gradient of a product along one dim."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = ["global_l2_norm_reference", "prod_backward_reference", "reduce_reference",
           "reduced_axes", "variance_reference"]


def reduced_axes(ndim: int, axes: Any) -> tuple[int, ...]:
    """NumPy's axes argument as sorted non-negative axes: None is every axis, an int one."""
    if axes is None:
        return tuple(range(ndim))
    raw = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
    return tuple(sorted(int(a) % ndim for a in raw))


def _combine(op: str, row: np.ndarray) -> float:
    """One reduced row: sum (math.fsum, correctly rounded; non-finite values by IEEE rules),
    mean (sum / count, NaN for none), max/min (NaN if any is NaN), prod (left to right)."""
    finite = bool(np.isfinite(row).all())
    if op in ("sum", "mean"):
        s = math.fsum(row.tolist()) if finite else float(np.sum(row))
        if op == "sum":
            return s
        return s / row.size if row.size else math.nan
    if op in ("max", "min"):
        if row.size == 0:
            raise ValueError(f"{op} of an empty reduction has no value")
        if np.isnan(row).any():
            return math.nan
        return float(row.max() if op == "max" else row.min())
    if op == "prod":
        return math.prod(row.tolist(), start=1.0)
    raise ValueError(f"unknown reduction {op!r}")


def reduce_reference(op: str, x: Any, axes: Any = None, keepdims: bool = False) -> np.ndarray:
    """y = op(x) over `axes` (int, tuple or None: all) in float64, op in sum, mean, max,
    min, prod; the kept axes in order, the reduced ones dropped (kept with extent 1 when
    `keepdims`). Empty reductions: sum 0, mean NaN, prod 1 (max and min raise)."""
    x = f64(x)
    red = reduced_axes(x.ndim, axes)
    kept = tuple(a for a in range(x.ndim) if a not in red)
    kept_shape = tuple(x.shape[a] for a in kept)
    rows = np.transpose(x, kept + red).reshape(math.prod(kept_shape),
                                                math.prod(x.shape[a] for a in red))
    y = np.array([_combine(op, r) for r in rows], np.float64).reshape(kept_shape)
    if keepdims:
        y = y.reshape(tuple(1 if a in red else e for a, e in enumerate(x.shape)))
    return y


def global_l2_norm_reference(arrays: Sequence[Any]) -> float:
    """sqrt(sum_i sum_j x_i[j]^2) over every element of every array, in float64 without
    overflow or underflow (math.hypot scales); NaN if any element is NaN, else inf if any is
    infinite; 0 for no elements."""
    values = [v for a in arrays for v in f64(a).ravel().tolist()]
    if any(math.isnan(v) for v in values):
        return math.nan
    if any(math.isinf(v) for v in values):
        return math.inf
    return math.hypot(*values)


def variance_reference(x: Any, axes: Any = None, keepdims: bool = False,
                       correction: float = 1.0, std: bool = False) -> np.ndarray:
    """sum((x - mean)^2) / max(0, n - correction) over `axes` (n elements each; axes and
    keepdims as in reduce_reference) in float64, two passes; with `std` its square root.
    n - correction <= 0 divides by 0 (inf, or NaN for 0 / 0), as torch."""
    x = f64(x)
    red = reduced_axes(x.ndim, axes)
    n = math.prod(x.shape[a] for a in red)
    mean = reduce_reference("mean", x, red, keepdims=True)
    squares = reduce_reference("sum", (x - mean) ** 2, red, keepdims)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = squares / np.float64(max(0.0, n - correction))
    return np.sqrt(v) if std else v


def prod_backward_reference(x: Any, dy: Any) -> np.ndarray:
    """dx [outer, length, inner] of y = prod(x, dim 1) for x [outer, length, inner]:
    dx[o, r, i] = dy[o, i] * prod_{r' != r} x[o, r', i], the product of the others taken
    literally (no division: exact where x has zeros)."""
    x, dy = f64(x), f64(dy)
    dx = np.zeros(x.shape)
    for o, r, i in np.ndindex(x.shape):
        others = [x[o, q, i] for q in range(x.shape[1]) if q != r]
        dx[o, r, i] = dy[o, i] * math.prod(others, start=1.0)
    return dx
