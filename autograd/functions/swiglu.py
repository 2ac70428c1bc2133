"""SwiGLU, Llama's gated MLP activation, as one autograd Function (the swiglu plans)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import gpuplan.functional as F
from autograd.function import Function

if TYPE_CHECKING:
    from autograd.tensor import Tensor


class SwiGLU(Function):
    """y = silu(gate) * up; with s = sigmoid(gate): dgate = dy * up * s * (1 + gate (1 - s)),
    dup = dy * silu(gate), both from the saved gate and up in one pass."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.swiglu(gate, up)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved
        need_gate, need_up = ctx.needs_input_grad
        dgate, dup = F.swiglu_backward(gate, up, dy)
        return dgate if need_gate else None, dup if need_up else None


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` elementwise, fused (one read of each input, one rounding); gate
    and up of one shape and dtype (no broadcasting). Llama's MLP is
    ``down(swiglu(gate(x), up(x)))``."""
    if tuple(gate.shape) != tuple(up.shape) or gate.dtype != up.dtype:
        raise ValueError(f"swiglu: gate and up must have one shape and dtype, given "
                         f"{tuple(gate.shape)} {gate.dtype} and {tuple(up.shape)} {up.dtype}")
    return SwiGLU.apply(gate, up)
