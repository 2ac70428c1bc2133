"""Rotary position embedding as an autograd Function (the rope plans): Hugging Face's
rotate-half convention, ``theta`` the base, positions ``offset + t``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import gpuplan.functional as F
from autograd.function import Function

if TYPE_CHECKING:
    from autograd.tensor import Tensor


class RotaryEmbedding(Function):
    """y = x cos(angle) + rotate_half(x) sin(angle); the rotation is orthogonal, so the
    gradient is its transpose, the rotation by -angle: dx = dy cos - rotate_half(dy) sin.
    Nothing is saved (the angles are recomputed from theta, offset and the shape)."""

    @staticmethod
    def forward(ctx, x, theta, offset, seq_dim):
        ctx.kw = dict(theta=theta, offset=offset, seq_dim=seq_dim)
        return F.rope(x, **ctx.kw)

    @staticmethod
    def backward(ctx, dy):
        return F.rope_backward(dy, **ctx.kw)


class RotaryEmbeddingSplitHeads(Function):
    """``[..., T, H * D] -> [..., H, T, D]`` rotated, in one pass (the heads split out for
    attention while rotating); backward rotates by -angle and writes ``[..., T, H * D]``."""

    @staticmethod
    def forward(ctx, x, heads, theta, offset):
        ctx.kw = dict(theta=theta, offset=offset)
        return F.rope_split_heads(x, heads, **ctx.kw)

    @staticmethod
    def backward(ctx, dy):
        return F.rope_split_heads_backward(dy, **ctx.kw)


def rope(x: Tensor, theta: float = 10000.0, offset: int = 0, seq_dim: int = -2) -> Tensor:
    """Rotary position embedding of ``x [..., T, ..., D]`` (D even), positions
    ``offset + t`` along axis ``seq_dim``: ``-2`` for ``[B, H, T, D]`` (the layout
    scaled_dot_product_attention takes), ``1`` for ``[B, T, H, D]``. With ``x1, x2`` the two
    halves of the last axis and ``angle = (offset + t) * theta ** (-2 i / D)`` for column
    ``i < D / 2``: ``y = [x1 cos - x2 sin, x2 cos + x1 sin]`` (transformers' Llama
    ``q * cos + rotate_half(q) * sin``). cos and sin come from float64 angles in every dtype;
    ``offset`` is the number of positions already cached (0 without a KV cache)."""
    _check_offset("rope", offset)
    return RotaryEmbedding.apply(x, theta=float(theta), offset=int(offset), seq_dim=seq_dim)


def rope_split_heads(x: Tensor, heads: int, theta: float = 10000.0, offset: int = 0) -> Tensor:
    """``rope(split_heads(x, 1, heads)[0], theta, offset)`` in one pass: ``x [..., T, H * D]``
    (a q or k projection's output) -> ``[..., H, T, D]`` rotated, the layout
    scaled_dot_product_attention takes; the same values, one read and one write less."""
    _check_offset("rope_split_heads", offset)
    return RotaryEmbeddingSplitHeads.apply(x, heads=int(heads), theta=float(theta),
                                           offset=int(offset))


def _check_offset(op: str, offset: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"{op}: offset must be an int >= 0, given {offset!r}")
