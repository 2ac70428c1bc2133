"""float64 references of the embedding family: row lookup and its scatter-add gradient, with
Python-int index math."""

from __future__ import annotations

from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.testing import f64

__all__ = ["embedding_reference", "embedding_backward_reference"]


def embedding_reference(weight: Any, indices: Any, index_offset: int = 0) -> np.ndarray:
    """out[..., :] = weight[indices[...] - index_offset, :] in float64 (Python-int index
    math), a zero row where that row is outside [0, V): shape indices.shape + (D,)."""
    w = f64(weight)
    idx = gp.to_host(indices)
    out = np.zeros((idx.size, w.shape[1]))
    for n, v in enumerate(idx.reshape(-1).tolist()):
        if 0 <= v - index_offset < w.shape[0]:
            out[n] = w[v - index_offset]
    return out.reshape(idx.shape + (w.shape[1],))


def embedding_backward_reference(dout: Any, indices: Any, num_embeddings: int,
                                 padding_idx: int | None = None,
                                 index_offset: int = 0) -> np.ndarray:
    """dweight [V, D] from zeros in float64: dweight[i - index_offset] += dout[n] for every n
    whose index i is not padding_idx (compared unshifted) and whose row i - index_offset is
    in [0, V) (dout [..., D], indices [...])."""
    d = f64(dout)
    d = d.reshape(-1, d.shape[-1])
    dw = np.zeros((num_embeddings, d.shape[1]))
    for n, i in enumerate(gp.to_host(indices).reshape(-1).tolist()):
        if 0 <= i - index_offset < num_embeddings and i != padding_idx:
            dw[i - index_offset] += d[n]
    return dw
