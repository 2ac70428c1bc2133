"""Per-token quantization benchmarks on a 16384 x 4096 bf16 activation (128 MiB; smoke:
48 x 4096, the same row length)."""

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
)

N, D = size((16384, 4096), (48, 4096))
DT = gp.bfloat16


def _quantize_setup() -> dict:
    x = random_device((N, D), DT, scale=3.0)
    q = empty((N, D), np.int8)
    scale = empty((N,), np.float32)
    return plan_state(gp.QuantizePerTokenPlan, gp.QuantizePerTokenDescriptor(N, D, DT),
                      gp.QuantizePerTokenArgs(x, q, scale), x=x)


def _quantize_baseline(st: dict) -> None:
    import cupy as cp

    with st["stream"].cuda_stream:
        xf = st["x"].astype(cp.float32)
        s = cp.abs(xf).max(axis=1) / cp.float32(127)
        safe = cp.where(s > 0, s, cp.float32(1))
        cp.clip(cp.rint(xf / safe[:, None]), -127, 127).astype(cp.int8)


def _dequantize_setup() -> dict:
    rng = np.random.default_rng(3)
    q = device_array(rng.integers(-127, 128, (N, D)).astype(np.int8))
    scale = device_array(rng.uniform(0.001, 0.1, N).astype(np.float32))
    y = empty((N, D), DT)
    return plan_state(gp.DequantizePerTokenPlan, gp.DequantizePerTokenDescriptor(N, D, DT),
                      gp.DequantizePerTokenArgs(q, scale, y), q=q, scale=scale)


def _dequantize_baseline(st: dict) -> None:
    import cupy as cp

    with st["stream"].cuda_stream:
        (st["scale"][:, None] * st["q"].astype(cp.float32)).astype(DT)


def _dequantize_backward_setup() -> dict:
    scale = device_array(np.random.default_rng(4).uniform(0.001, 0.1, N).astype(np.float32))
    d_out = random_device((N, D), DT, seed=5)
    d_in = empty((N, D), DT)
    desc = gp.DequantizePerTokenBackwardDescriptor(N, D, DT)
    return plan_state(gp.DequantizePerTokenBackwardPlan, desc,
                      gp.DequantizePerTokenBackwardArgs(scale, d_out, d_in),
                      scale=scale, d_out=d_out)


def _dequantize_backward_baseline(st: dict) -> None:
    import cupy as cp

    with st["stream"].cuda_stream:
        (st["scale"][:, None] * st["d_out"].astype(cp.float32)).astype(DT)


def _quantize_backward_setup() -> dict:
    d_q = random_device((N, D), np.float32, seed=6)
    d_x = empty((N, D), DT)
    desc = gp.QuantizePerTokenBackwardDescriptor(N, D, DT)  # d_q's dtype (f32): the array's
    return plan_state(gp.QuantizePerTokenBackwardPlan, desc,
                      gp.QuantizePerTokenBackwardArgs(d_q, d_x), d_q=d_q)


def _quantize_backward_baseline(st: dict) -> None:
    with st["stream"].cuda_stream:
        st["d_q"].astype(DT)


ND = N * D
CASES = [
    Case(f"quantize_per_token_bf16_{N}x{D}", _quantize_setup, run_plan_state,
         ND * 2 + ND + N * 4, baseline=_quantize_baseline, baseline_name="cupy ops"),
    Case(f"dequantize_per_token_bf16_{N}x{D}", _dequantize_setup, run_plan_state,
         ND + N * 4 + ND * 2, baseline=_dequantize_baseline, baseline_name="cupy ops"),
    Case(f"dequantize_per_token_bwd_bf16_{N}x{D}", _dequantize_backward_setup,
         run_plan_state, N * 4 + 2 * ND * 2, baseline=_dequantize_backward_baseline,
         baseline_name="cupy ops"),
    Case(f"quantize_per_token_bwd_f32_to_bf16_{N}x{D}", _quantize_backward_setup,
         run_plan_state, ND * 4 + ND * 2, baseline=_quantize_backward_baseline,
         baseline_name="cupy astype"),
]
