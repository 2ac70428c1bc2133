"""Fused causal attention benchmarks (forward and backward; GPT-2-small heads: batch 8 x
12 heads, T = 1024, head_dim 64, and head_dim 128) vs the composed CuPy path (matmul,
masked softmax, matmul, materialising the [T, T] scores), and vs PyTorch's
scaled_dot_product_attention on the same buffers and stream (FlashAttention backend for
f16/bf16, torch's choice for f32) where torch with CUDA is importable. Written without a GPU:
no results yet (the kernels' correctness was checked on the emulated device only). Smoke:
1 x 2 heads, T = 80 (a partial key/query tile), the same head dims."""

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

# (batch, heads): torch sees [batch, heads, T, D], our kernels [batch * heads, T, D]
HEADS = size((8, 12), (1, 2))
B, T = HEADS[0] * HEADS[1], size(1024, 80)


def _operands(dt, dim: int, n: int = 4) -> list:
    return [random_device((B, T, dim), dt, seed=i) for i in range(n)]


def _forward_setup(dt, dim: int):
    def setup() -> dict:
        q, k, v = _operands(dt, dim, 3)
        lse_t = np.float64 if dt == np.float64 else np.float32
        o, lse = empty((B, T, dim), dt), empty((B, T), lse_t)
        desc = gp.AttentionDescriptor(B, T, T, dim, dim ** -0.5, True, dt)
        return plan_state(gp.AttentionPlan, desc, gp.AttentionArgs(q, k, v, o, lse),
                          q=q, k=k, v=v, dim=dim)
    return setup


def _backward_setup(dt, dim: int):
    def setup() -> dict:
        q, k, v, dout = _operands(dt, dim)
        o, lse = gp.functional.attention(q, k, v, scale=dim ** -0.5, causal=True)
        grads = [empty((B, T, dim), dt) for _ in range(3)]
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


def _torch_views(st: dict) -> tuple:
    """(torch, q, k, v as [*HEADS, T, D] torch tensors sharing the CuPy buffers, the SDPA
    backends to allow), made once per state; bf16 crosses DLPack as uint16."""
    if "torch_qkv" not in st:
        import torch
        from torch.nn.attention import SDPBackend

        def view(a):
            if a.dtype == gp.bfloat16:
                return torch.from_dlpack(a.view(np.uint16)).view(torch.bfloat16)
            return torch.from_dlpack(a)

        qkv = [view(st[n]).reshape(*HEADS, T, st["dim"]) for n in ("q", "k", "v")]
        half = st["q"].dtype != np.float32
        backends = [SDPBackend.FLASH_ATTENTION] if half else [
            SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        st["torch_qkv"] = (torch, *qkv, backends)
    return st["torch_qkv"]


def _torch_forward(st: dict) -> None:
    """torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) on the
    current CuPy stream."""
    import cupy as cp

    torch, q, k, v, backends = _torch_views(st)
    from torch.nn.attention import sdpa_kernel

    with torch.cuda.ExternalStream(cp.cuda.get_current_stream().ptr), sdpa_kernel(backends):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def _torch_backward(st: dict) -> None:
    """torch SDPA's backward only: the forward graph is built once (kept), each call
    backpropagates a fixed dout into fresh gradients."""
    import cupy as cp

    torch, q, k, v, backends = _torch_views(st)
    from torch.nn.attention import sdpa_kernel

    with torch.cuda.ExternalStream(cp.cuda.get_current_stream().ptr), sdpa_kernel(backends):
        if "torch_out" not in st:
            for t in (q, k, v):
                t.requires_grad_(True)
            st["torch_out"] = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True)
            st["torch_dout"] = torch.ones_like(st["torch_out"])
        for t in (q, k, v):
            t.grad = None
        st["torch_out"].backward(st["torch_dout"], retain_graph=True)


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
            Case(f"attention_causal_{_tag}_{B}x{T}x{_d}_vs_torch", _forward_setup(_dt, _d),
                 run_plan_state, flops=_flops(2), baseline=_torch_forward,
                 baseline_name="torch sdpa"),
            # backward: S and dP recomputed, then dV, dK (dk/dv pass) and S, dP, dQ (dq pass)
            Case(f"attention_causal_bwd_{_tag}_{B}x{T}x{_d}", _backward_setup(_dt, _d),
                 run_plan_state, flops=_flops(7), baseline=_torch_backward,
                 baseline_name="torch sdpa backward"),
        ]
