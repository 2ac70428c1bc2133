"""Embedding lookup Function: out = weight[indices]; backward scatter-adds into dweight."""

from __future__ import annotations

from typing import Any

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor import Tensor


class Embedding(Function):
    """out[..., :] = weight[indices[...], :] (indices int32/int64 of any shape).

    dweight[indices[n]] += dout[n], skipping padding_idx (its row gets no gradient).
    """

    @staticmethod
    def forward(ctx, indices, weight, padding_idx, deterministic):
        ctx.num_embeddings = weight.shape[0]
        ctx.padding_idx, ctx.deterministic = padding_idx, deterministic
        ctx.save_for_backward(indices)
        return F.embedding(weight, indices)

    @staticmethod
    def backward(ctx, dout):
        (indices,) = ctx.saved
        dweight = F.embedding_backward(dout, indices, ctx.num_embeddings,
                                       padding_idx=ctx.padding_idx,
                                       deterministic=ctx.deterministic)
        return None, dweight


def embedding(input: Any, weight: Tensor, padding_idx: int | None = None,  # noqa: A002
              deterministic: bool = False) -> Tensor:
    """PyTorch embedding(input, weight, padding_idx); a negative padding_idx counts from V."""
    idx = input.data if isinstance(input, Tensor) else gp.asarray(input, device=weight.device)
    if idx.dtype not in (gp.dtypes.int32, gp.dtypes.int64):
        idx = idx.astype(gp.dtypes.int64)
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    return Embedding.apply(idx, weight, padding_idx=padding_idx, deterministic=deterministic)
