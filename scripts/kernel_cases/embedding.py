"""Embedding forward and backward (atomic and deterministic segment SKUs) on the emulated
device against the family's float64 references (gpuplan.testing)."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.testing import embedding_backward_reference, embedding_reference
from kernel_cases.common import DTYPES, Case, check, dtype_id, emu, random, run_emulated

V, D, N = 23, 70, 57  # D not a multiple of the block: partial rows of threads


def _indices(index_dtype) -> np.ndarray:
    rng = np.random.default_rng(3)
    idx = rng.integers(0, V, N).astype(index_dtype)
    idx[::9] = 0  # the padding row
    idx[5], idx[11] = -2, V + 3  # out of range: skipped
    return idx


def forward(dtype, index_dtype) -> None:
    w = random((V, D), dtype, seed=1)
    idx = _indices(index_dtype)  # out-of-range rows read nothing and write zeros
    out = emu(np.full((N, D), 7, dtype))
    run_emulated(gp.EmbeddingPlan, gp.EmbeddingDescriptor(V, D, N, dtype),
                 gp.EmbeddingArgs(emu(w), emu(idx), out))
    check(out, embedding_reference(w, idx), dtype, "embedding forward")


def backward(dtype, index_dtype, deterministic: bool) -> None:
    dout = random((N, D), dtype, seed=2)
    idx = _indices(index_dtype)
    ref = embedding_backward_reference(dout, idx, V, padding_idx=0)
    dw = emu(np.zeros((V, D), dtype))
    plan = run_emulated(gp.EmbeddingBackwardPlan,
                        gp.EmbeddingBackwardDescriptor(V, D, N, 0, dtype),
                        gp.EmbeddingBackwardArgs(emu(dout), emu(idx), dw),
                        gp.PlanPreference(deterministic=deterministic,
                                          backend=gp.BackendKind.NVRTC))
    assert plan.sku().variant == ("segment" if deterministic else "atomic"), plan.sku()
    check(dw, ref, dtype, f"embedding backward {plan.sku().variant}", scale=4.0)


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
