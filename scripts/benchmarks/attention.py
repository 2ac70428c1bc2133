"""Fused causal attention benchmarks (forward and backward; GPT-2-small heads: batch 8 x
12 heads, T = 1024, head_dim 64, and head_dim 128) vs the composed CuPy path (matmul,
masked softmax, matmul, materialising the [T, T] scores). Written without a GPU: no
results yet (the kernels' correctness was checked on the emulated device only)."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from scripts.benchmarks.common import Case, device_array, plan_state, random_host, run_plan_state

B, T = 8 * 12, 1024


def _operands(dt, dim: int, n: int = 4) -> list:
    return [device_array(random_host((B, T, dim), dt, seed=i)) for i in range(n)]


def _forward_setup(dt, dim: int):
    def setup() -> dict:
        q, k, v = _operands(dt, dim, 3)
        lse_t = np.float64 if dt == np.float64 else np.float32
        o, lse = gp.empty((B, T, dim), dt, device="cuda"), gp.empty((B, T), lse_t, device="cuda")
        desc = gp.AttentionDescriptor(B, T, T, dim, dim ** -0.5, True, dt)
        return plan_state(gp.AttentionPlan, desc, gp.AttentionArgs(q, k, v, o, lse),
                          q=q, k=k, v=v, dim=dim)
    return setup


def _backward_setup(dt, dim: int):
    def setup() -> dict:
        q, k, v, dout = _operands(dt, dim)
        o, lse = gp.functional.attention(q, k, v, scale=dim ** -0.5, causal=True)
        grads = [gp.empty((B, T, dim), dt, device="cuda") for _ in range(3)]
        desc = gp.AttentionDescriptor(B, T, T, dim, dim ** -0.5, True, dt)
        return plan_state(gp.AttentionBackwardPlan, desc,
                          gp.AttentionBackwardArgs(q, k, v, o, lse, dout, *grads),
                          q=q, k=k, v=v, dim=dim)
    return setup


def _composed_forward(st: dict) -> None:
    """softmax(scale * q k^T + causal mask) v with CuPy (f32 softmax)."""
    import cupy as cp

    with st["stream"].cuda_stream:
        s = cp.matmul(st["q"], st["k"].transpose(0, 2, 1)).astype(cp.float32)
        s *= st["dim"] ** -0.5
        s = cp.where(cp.tri(T, dtype=bool)[None], s, -cp.inf)
        s = cp.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        cp.matmul(s.astype(st["q"].dtype), st["v"])


def _flops(passes: float):
    """passes x 2 flops x B x T x T x D, halved for the causal mask."""
    return lambda st: int(passes * 2 * B * T * T * st["dim"] / 2)


CASES: list[Case] = []
for _dt, _dims in ((gp.bfloat16, (64, 128)), (np.dtype(np.float16), (64,)),
                   (np.dtype(np.float32), (64,))):
    _tag = gp.dtypes.short_name(_dt)
    for _d in _dims:
        CASES += [
            Case(f"attention_causal_{_tag}_{B}x{T}x{_d}", _forward_setup(_dt, _d),
                 run_plan_state, flops=_flops(2), baseline=_composed_forward,
                 baseline_name="cupy composed"),
            # backward: S and dP recomputed, then dV, dK (dk/dv pass) and S, dP, dQ (dq pass)
            Case(f"attention_causal_bwd_{_tag}_{B}x{T}x{_d}", _backward_setup(_dt, _d),
                 run_plan_state, flops=_flops(7)),
        ]
