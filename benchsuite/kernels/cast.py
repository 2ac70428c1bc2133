"""Cast benchmarks: f32 <-> bf16 over 8192*8192 elements (smoke: 100003, a vector tail), in
GB/s against a CuPy copy."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from benchsuite.kernels.common import (
    Case,
    empty,
    plan_state,
    random_device,
    run_plan_state,
    size,
)

N = size(8192 * 8192, 100_003)


def _size(dtype) -> int:
    return np.dtype(dtype).itemsize


def _cast(src, dst) -> Case:
    def setup() -> dict:
        x = random_device((N,), src)
        y = empty(N, dst)
        return plan_state(gp.CastPlan, gp.CastDescriptor(N, src, dst), gp.CastArgs(x, y),
                          x=x, y=y)

    def baseline(s: dict) -> None:
        s["y"][...] = s["x"]

    return Case(f"cast_{gp.dtypes.short_name(src)}_to_{gp.dtypes.short_name(dst)}_{N}", setup,
                run_plan_state, bytes_moved=N * (_size(src) + _size(dst)), baseline=baseline,
                baseline_name="cupy astype copy")


CASES = [_cast(np.float32, gp.bfloat16), _cast(gp.bfloat16, np.float32)]
