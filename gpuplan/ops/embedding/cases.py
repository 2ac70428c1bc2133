"""Embedding forward and backward (atomic and deterministic segment SKUs) on the emulated
device against the family's float64 references (gpuplan.testing), every instance with a
whole table (index_offset 0) and a shifted block (a vocab shard: indices - index_offset,
padding_idx in the unshifted space)."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.embedding.reference import embedding_backward_reference, embedding_reference
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, random, run_emulated

V, D, N = 23, 70, 57  # D not a multiple of the block: partial rows of threads
#: index_offset per index dtype: none, a shard's start, a negative one, and for int64 one at
#: the top of the range (an int64 difference would wrap INT64_MIN into the block).
OFFSETS = {np.int32: (0, 40, -9), np.int64: (0, 40, -9, np.iinfo(np.int64).max - V)}


def _indices(index_dtype, offset: int) -> np.ndarray:
    rng = np.random.default_rng(3)
    idx = rng.integers(0, V, N) + offset
    idx[::9] = offset  # the padding row (padding_idx = offset, global)
    idx[5], idx[11] = offset - 2, offset + V  # outside the block: skipped
    if offset:
        idx[13] = 2  # the unshifted index of a row: not padding, out of (or another) row
    if index_dtype is np.int64:
        idx[17] = np.iinfo(np.int64).min
    return idx.astype(index_dtype)


def forward(dtype, index_dtype) -> None:
    w = random((V, D), dtype, seed=1)
    for offset in OFFSETS[index_dtype]:
        idx = _indices(index_dtype, offset)  # out-of-block rows read nothing, write zeros
        out = emu(np.full((N, D), 7, dtype))
        run_emulated(gp.EmbeddingPlan, gp.EmbeddingDescriptor(V, D, N, dtype, int(offset)),
                     gp.EmbeddingArgs(emu(w), emu(idx), out))
        check(out, embedding_reference(w, idx, int(offset)), dtype,
              f"embedding forward offset {offset}")


def backward(dtype, index_dtype, deterministic: bool) -> None:
    dout = random((N, D), dtype, seed=2)
    for offset in OFFSETS[index_dtype]:
        offset = int(offset)
        idx = _indices(index_dtype, offset)
        ref = embedding_backward_reference(dout, idx, V, padding_idx=offset, index_offset=offset)
        dw = emu(np.zeros((V, D), dtype))
        plan = run_emulated(gp.EmbeddingBackwardPlan,
                            gp.EmbeddingBackwardDescriptor(V, D, N, offset, dtype, offset),
                            gp.EmbeddingBackwardArgs(emu(dout), emu(idx), dw),
                            gp.PlanPreference(deterministic=deterministic,
                                              backend=gp.BackendKind.NVRTC))
        assert plan.sku().variant == ("segment" if deterministic else "atomic"), plan.sku()
        check(dw, ref, dtype, f"embedding backward {plan.sku().variant} offset {offset}",
              scale=4.0)


CASES = (
    [Case(f"forward[{dtype_id(t)},{np.dtype(i).name}]", lambda t=t, i=i: forward(t, i))
     for t in DTYPES for i in (np.int32, np.int64)]
    + [Case(f"backward atomic[{dtype_id(t)},{np.dtype(i).name}]",
            lambda t=t, i=i: backward(t, i, False))
       for t in (np.float32, np.float64) for i in (np.int32, np.int64)]
    + [Case(f"backward segment[{dtype_id(t)},{np.dtype(i).name}]",
            lambda t=t, i=i: backward(t, i, True))
       for t in DTYPES for i in (np.int32, np.int64)]
)
