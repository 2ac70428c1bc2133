"""Dropout Function on the counter-based RNG: the mask is regenerated in backward, not saved."""

from __future__ import annotations

from typing import TYPE_CHECKING

import gpuplan.functional as F
from autograd import random
from autograd.function import Function

if TYPE_CHECKING:
    from autograd.tensor import Tensor


class Dropout(Function):
    """y = x * mask / (1 - p), mask from (seed, offset); dx = dy * mask / (1 - p)."""

    @staticmethod
    def forward(ctx, x, p, seed, offset):
        ctx.p, ctx.seed, ctx.offset = p, seed, offset
        return F.dropout(x, p, seed, offset)

    @staticmethod
    def backward(ctx, dy):
        return F.dropout_backward(dy, ctx.p, ctx.seed, ctx.offset)


def dropout(x: Tensor, p: float = 0.5, training: bool = True, seed: int | None = None,
            offset: int = 0) -> Tensor:
    """Zero each element with probability p (scaling the rest by 1/(1-p)) when training.

    seed=None draws (seed, offset) from autograd.random's default generator, which then
    advances by x's element count, so successive calls use fresh masks.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], given {p}")
    if not training or p == 0.0:
        return x
    if seed is None:
        seed, offset = random.default_generator.next_seed_offset(x.numel())
    return Dropout.apply(x, p=float(p), seed=int(seed), offset=int(offset))
