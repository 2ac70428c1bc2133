"""Embedding benchmarks: GPT-2-sized gather (50257 x 768, 16384 indices) and its backwards
(smoke: 1003 x 96, 512 indices)."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from benchsuite.kernels.common import (
    Case,
    device_array,
    empty,
    plan_state,
    random_device,
    run_plan_state,
    size,
    zeros,
)

V, D, N = size((50257, 768, 16384), (1003, 96, 512))
SHAPE = f"{V}x{D}_n{N}"


def _indices(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, N).astype(np.int64)


def _forward_setup(dtype):
    def setup() -> dict:
        weight = random_device((V, D), dtype)
        idx = device_array(_indices())
        out = empty((N, D), dtype)
        return plan_state(gp.EmbeddingPlan, gp.EmbeddingDescriptor(V, D, N, dtype),
                          gp.EmbeddingArgs(weight, idx, out), weight=weight, idx=idx, out=out)
    return setup


def _forward_baseline(st: dict) -> None:
    import cupy

    with st["stream"].cuda_stream:
        cupy.take(st["weight"], st["idx"], axis=0, out=st["out"])


def _forward_bytes(st: dict) -> int:
    return 2 * N * D * st["out"].dtype.itemsize + N * st["idx"].dtype.itemsize


def _backward_setup(dtype, deterministic: bool):
    def setup() -> dict:
        dout = random_device((N, D), dtype, seed=2)
        host_idx = _indices()
        idx = device_array(host_idx)
        dweight = zeros((V, D), dtype)
        desc = gp.EmbeddingBackwardDescriptor(V, D, N, dtype=dtype)
        return plan_state(gp.EmbeddingBackwardPlan, desc,
                          gp.EmbeddingBackwardArgs(dout, idx, dweight),
                          gp.PlanPreference(deterministic=deterministic), dout=dout, idx=idx,
                          dweight=dweight, unique=int(np.unique(host_idx).size))
    return setup


def _backward_baseline(st: dict) -> None:
    import cupyx

    with st["stream"].cuda_stream:
        cupyx.scatter_add(st["dweight"], st["idx"], st["dout"])


def _backward_bytes(st: dict) -> int:
    # dout and indices read once; every touched dweight row read and written once.
    item = st["dout"].dtype.itemsize
    return N * D * item + N * st["idx"].dtype.itemsize + 2 * st["unique"] * D * item


CASES = [
    Case(f"embedding_fwd_f32_{SHAPE}", _forward_setup(np.float32), run_plan_state,
         _forward_bytes, baseline=_forward_baseline, baseline_name="cupy.take"),
    Case(f"embedding_fwd_bf16_{SHAPE}", _forward_setup(gp.bfloat16), run_plan_state,
         _forward_bytes, baseline=_forward_baseline, baseline_name="cupy.take"),
    Case(f"embedding_bwd_atomic_f32_{SHAPE}", _backward_setup(np.float32, False),
         run_plan_state, _backward_bytes, baseline=_backward_baseline,
         baseline_name="cupyx.scatter_add"),
    Case(f"embedding_bwd_segment_f32_{SHAPE}", _backward_setup(np.float32, True),
         run_plan_state, _backward_bytes, baseline=_backward_baseline,
         baseline_name="cupyx.scatter_add"),
    Case(f"embedding_bwd_segment_bf16_{SHAPE}", _backward_setup(gp.bfloat16, True),
         run_plan_state, _backward_bytes),
]
