"""Rotary embedding benchmarks: q-sized [B*H, T, D] = [8*32, 2048, 128] forward and backward
in bf16 and f32 (smoke: [2*2, 16, 8]), in GB/s; the f32 forward against CuPy doing what
transformers does: cached cos/sin tables [T, D], then x * cos + rotate_half(x) * sin as
separate ops."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from benchsuite.kernels.common import Case, empty, plan_state, random_device, run_plan_state, size

BATCH, SEQ, DIM = size((8 * 32, 2048, 128), (4, 16, 8))
THETA = 10000.0


def _rope(dtype, backward: bool) -> Case:
    tag = (f"rope_{'bwd' if backward else 'fwd'}_{gp.dtypes.short_name(dtype)}_"
           f"{BATCH}x{SEQ}x{DIM}")
    shape = (BATCH, SEQ, 1, DIM)

    def setup() -> dict:
        x, y = random_device(shape, dtype), empty(shape, dtype)
        desc = gp.RopeDescriptor(BATCH, SEQ, 1, DIM, THETA, dtype)
        if backward:
            return plan_state(gp.RopeBackwardPlan, desc, gp.RopeBackwardArgs(x, y), x=x)
        return plan_state(gp.RopePlan, desc, gp.RopeArgs(x, y), x=x)

    def baseline(s: dict) -> None:
        import cupy as cp

        if "cos" not in s:  # the tables, built once (as a model caches them), in float32
            inv = 1.0 / THETA ** (cp.arange(0, DIM, 2, dtype=cp.float32) / DIM)
            emb = cp.concatenate([cp.outer(cp.arange(SEQ, dtype=cp.float32), inv)] * 2, -1)
            s["cos"], s["sin"] = cp.cos(emb).astype(dtype), cp.sin(emb).astype(dtype)
        x = s["x"].reshape(BATCH, SEQ, DIM)
        rotated = cp.concatenate([-x[..., DIM // 2:], x[..., :DIM // 2]], axis=-1)
        s["out"] = x * s["cos"] + rotated * s["sin"]

    moved = 2 * BATCH * SEQ * DIM * gp.dtypes.as_dtype(dtype).itemsize
    return Case(tag, setup, run_plan_state, bytes_moved=moved,
                baseline=None if backward or dtype != np.float32 else baseline,
                baseline_name="cupy x * cos + rotate_half(x) * sin")


CASES = [_rope(dtype, bw) for dtype in (gp.bfloat16, np.float32) for bw in (False, True)]
