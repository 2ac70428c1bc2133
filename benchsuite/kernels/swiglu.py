"""SwiGLU benchmarks: silu(gate) * up forward and backward on Llama-7B MLP activations
[8*2048, 11008] in bf16 and f32 (smoke: [16, 40]), in GB/s; f32 forward against CuPy's composed
gate / (1 + exp(-gate)) * up."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from benchsuite.kernels.common import Case, empty, plan_state, random_device, run_plan_state, size

ROWS, COLS = size((8 * 2048, 11008), (16, 40))
N = ROWS * COLS


def _swiglu(dtype, backward: bool) -> Case:
    tag = f"swiglu_{'bwd' if backward else 'fwd'}_{gp.dtypes.short_name(dtype)}_{ROWS}x{COLS}"
    itemsize = gp.dtypes.as_dtype(dtype).itemsize

    def setup() -> dict:
        gate, up = random_device((N,), dtype), random_device((N,), dtype, seed=1)
        desc = gp.SwigluDescriptor(N, dtype)
        if backward:
            dy = random_device((N,), dtype, seed=2)
            return plan_state(gp.SwigluBackwardPlan, desc,
                              gp.SwigluBackwardArgs(gate, up, dy, empty(N, dtype),
                                                    empty(N, dtype)), gate=gate, up=up)
        return plan_state(gp.SwigluPlan, desc, gp.SwigluArgs(gate, up, empty(N, dtype)),
                          gate=gate, up=up)

    def baseline(s: dict) -> None:
        import cupy as cp

        g = s["gate"]
        s["out"] = g / (1 + cp.exp(-g)) * s["up"]

    return Case(tag, setup, run_plan_state, bytes_moved=(5 if backward else 3) * N * itemsize,
                baseline=None if backward or dtype != np.float32 else baseline,
                baseline_name="cupy gate / (1 + exp(-gate)) * up")


CASES = [_swiglu(dtype, bw) for dtype in (gp.bfloat16, np.float32) for bw in (False, True)]
