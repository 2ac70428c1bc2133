"""float64 references of the reduce_dim family from torch's definitions: max/min with indices
and top-k in torch's selection order, element by element."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuplan.testing import f64

__all__ = ["arg_select_reference", "selection_order", "topk_reference"]


def selection_order(column: list[float], largest: bool) -> list[int]:
    """Positions of `column` in torch's selection order: NaN first (in index order), then
    the largest (`largest`) or smallest values, equal values by ascending index."""
    def key(j: int) -> tuple:
        v = column[j]
        if math.isnan(v):
            return (0, 0.0, j)
        return (1, -v if largest else v, j)
    return sorted(range(len(column)), key=key)


def topk_reference(x: Any, k: int, largest: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(values float64, indices int64) [outer, k, inner]: the first k of each column
    x[o, :, i] of x [outer, length, inner] in `selection_order`."""
    x = f64(x)
    outer, _, inner = x.shape
    values, indices = np.zeros((outer, k, inner)), np.zeros((outer, k, inner), np.int64)
    for o in range(outer):
        for i in range(inner):
            column = x[o, :, i].tolist()
            first = selection_order(column, largest)[:k]
            indices[o, :, i] = first
            values[o, :, i] = [column[j] for j in first]
    return values, indices


def arg_select_reference(op: str, x: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values float64, indices int64) [outer, inner] of op ("max" or "min") over each
    column of x [outer, length, inner]: the first in `selection_order` (NaN wins for both,
    ties go to the lowest index)."""
    values, indices = topk_reference(x, 1, largest=op == "max")
    return values[:, 0, :], indices[:, 0, :]
