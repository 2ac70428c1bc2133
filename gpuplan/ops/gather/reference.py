"""float64 references of the gather family from torch's definitions, element by element:
gather, index_select, scatter_add and index_add along one dim."""

from __future__ import annotations

from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.testing import f64

__all__ = ["gather_reference", "index_add_reference", "index_select_reference",
           "scatter_add_reference"]


def _indices(index: Any) -> np.ndarray:
    return np.asarray(gp.to_host(index)).astype(np.int64)


def _at(p: tuple[int, ...], dim: int, k: int) -> tuple[int, ...]:
    """Position p with its coordinate along `dim` replaced by k."""
    return p[:dim] + (k,) + p[dim + 1:]


def gather_reference(x: Any, dim: int, index: Any) -> np.ndarray:
    """torch.gather: out[p] = x[p with p[dim] = index[p]] for every position p of index
    (index.shape[k] <= x.shape[k] for k != dim); an index outside [0, x.shape[dim]) gives 0,
    the plans' convention (the functional API rejects it before)."""
    x, index = f64(x), _indices(index)
    out = np.zeros(index.shape)
    for p in np.ndindex(index.shape):
        if 0 <= index[p] < x.shape[dim]:
            out[p] = x[_at(p, dim, index[p])]
    return out


def index_select_reference(x: Any, dim: int, index: Any) -> np.ndarray:
    """torch.index_select: out[p] = x[p with p[dim] = index[p[dim]]], out shaped like x but
    len(index) along dim; an index outside [0, x.shape[dim]) gives 0 (as in gather)."""
    x, index = f64(x), _indices(index)
    out = np.zeros(x.shape[:dim] + index.shape + x.shape[dim + 1:])
    for p in np.ndindex(out.shape):
        k = index[p[dim]]
        if 0 <= k < x.shape[dim]:
            out[p] = x[_at(p, dim, k)]
    return out


def scatter_add_reference(x: Any, dim: int, index: Any, src: Any) -> np.ndarray:
    """torch.Tensor.scatter_add (out of place): a copy of x with src[p] added at x[p with
    p[dim] = index[p]] for every position p of index (index.shape[k] <= src.shape[k], and
    <= x.shape[k] for k != dim), summed in float64; entries whose index lies outside
    [0, x.shape[dim]) are skipped (the plans' convention)."""
    out, index, src = f64(x).copy(), _indices(index), f64(src)
    for p in np.ndindex(index.shape):
        if 0 <= index[p] < out.shape[dim]:
            out[_at(p, dim, index[p])] += src[p]
    return out


def index_add_reference(x: Any, dim: int, index: Any, src: Any) -> np.ndarray:
    """torch.Tensor.index_add (out of place): a copy of x with src[p] added at x[p with
    p[dim] = index[p[dim]]] for every position p of src (shaped like x but len(index) along
    dim), summed in float64; out-of-range indices are skipped (as in scatter_add)."""
    out, index, src = f64(x).copy(), _indices(index), f64(src)
    for p in np.ndindex(src.shape):
        k = index[p[dim]]
        if 0 <= k < out.shape[dim]:
            out[_at(p, dim, k)] += src[p]
    return out
