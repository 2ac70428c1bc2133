"""Embedding lookup Function: out = weight[indices]; backward scatter-adds into dweight."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor_base import TensorBase

if TYPE_CHECKING:
    from autograd.tensor import Tensor


class Embedding(Function):
    """out[..., :] = weight[indices[...] - index_offset, :] (indices int32/int64 of any
    shape; zero rows for indices outside the table).

    dweight[indices[n] - index_offset] += dout[n], skipping entries outside the table and
    those equal to padding_idx (its row gets no gradient).
    """

    @staticmethod
    def forward(ctx, indices, weight, padding_idx, deterministic, index_offset):
        ctx.num_embeddings = weight.shape[0]
        ctx.padding_idx, ctx.deterministic = padding_idx, deterministic
        ctx.index_offset = index_offset
        ctx.save_for_backward(indices)
        return F.embedding(weight, indices, index_offset)

    @staticmethod
    def backward(ctx, dout):
        (indices,) = ctx.saved
        dweight = F.embedding_backward(dout, indices, ctx.num_embeddings,
                                       padding_idx=ctx.padding_idx,
                                       deterministic=ctx.deterministic,
                                       index_offset=ctx.index_offset)
        return None, dweight


def embedding(input: Any, weight: Tensor, padding_idx: int | None = None,  # noqa: A002
              deterministic: bool = False, index_offset: int = 0) -> Tensor:
    """PyTorch embedding(input, weight, padding_idx); a negative padding_idx counts from V.

    index_offset: the index of weight's first row in the caller's index space (a shard of
    a larger table): entry n looks up row input[n] - index_offset, zero rows (and no
    gradient) for indices outside [index_offset, index_offset + V). padding_idx is then an
    index of that space, taken as given (the count-from-V rule needs index_offset == 0).
    """
    idx = input.data if isinstance(input, TensorBase) else gp.asarray(input, device=weight.device)
    if idx.dtype.kind not in "iu":  # floats were truncated, bools read as 0/1: as torch, refuse
        raise gp.Unsupported(gp.errors.describe("embedding", "input", "integer indices",
                                                f"dtype {idx.dtype}"))
    if idx.dtype not in (gp.dtypes.int32, gp.dtypes.int64):
        idx = idx.astype(gp.dtypes.int64)
    if padding_idx is not None and padding_idx < 0 and not index_offset:
        padding_idx += weight.shape[0]
    return Embedding.apply(idx, weight, padding_idx=padding_idx, deterministic=deterministic,
                           index_offset=index_offset)
