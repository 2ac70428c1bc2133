"""Indexing Functions along one dim: gather, scatter_add, index_select (torch's semantics).

Each one's gradient is its partner from the gather plan family: gather <-> scatter_add,
index_select -> index_add. Indices are int tensors (int32 or int64, no gradient); bounds
are checked by the plans' functional API (negative indices are rejected, as torch does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor_base import TensorBase, new_tensor

if TYPE_CHECKING:
    from autograd.tensor import Tensor


def _index_data(op: str, index: Any) -> Any:
    data = index.data if isinstance(index, TensorBase) else gp.asarray(index)
    if data.dtype.kind not in "iu":
        raise TypeError(f"{op}(): index must be an integer tensor, given dtype {data.dtype}")
    return data


def _zeros(like: Any, shape: tuple) -> Any:
    return gp.array_namespace(like).zeros(shape, dtype=like.dtype)


class Gather(Function):
    """out = x.gather(dim, index); dx = zeros(x).scatter_add(dim, index, dout)."""

    @staticmethod
    def forward(ctx, x, dim, index):
        ctx.shape, ctx.dim, ctx.index = x.shape, dim, index
        return F.gather(x, dim, index)

    @staticmethod
    def backward(ctx, dy):
        return F.scatter_add(_zeros(dy, ctx.shape), ctx.dim, ctx.index, dy)


class ScatterAdd(Function):
    """out = x with src added at index along dim (out of place); dx = dout,
    dsrc = dout.gather(dim, index) (zeros where src extends past index)."""

    @staticmethod
    def forward(ctx, x, src, dim, index):
        ctx.src_shape, ctx.dim, ctx.index = src.shape, dim, index
        return F.scatter_add(x, dim, index, src)

    @staticmethod
    def backward(ctx, dy):
        need_x, need_src = ctx.needs_input_grad
        dsrc = None
        if need_src:
            part = F.gather(dy, ctx.dim, ctx.index)
            if part.shape == ctx.src_shape:
                dsrc = part
            else:
                dsrc = _zeros(dy, ctx.src_shape)
                dsrc[tuple(slice(0, e) for e in part.shape)] = part
        return (dy if need_x else None), dsrc


class IndexSelect(Function):
    """out = x.index_select(dim, index); dx = zeros(x).index_add(dim, index, dout)."""

    @staticmethod
    def forward(ctx, x, dim, index):
        ctx.shape, ctx.dim, ctx.index = x.shape, dim, index
        return F.index_select(x, dim, index)

    @staticmethod
    def backward(ctx, dy):
        return F.index_add(_zeros(dy, ctx.shape), ctx.dim, ctx.index, dy)


def _same_device(op: str, x: Tensor, index: Any) -> Any:
    data = _index_data(op, index)
    if gp.device_of(data) != x.device:
        raise ValueError(f"{op}(): index is on {gp.device_of(data)!r}, the tensor on "
                         f"{x.device!r}")
    return data


def gather(x: Tensor, dim: int, index: Any) -> Tensor:
    """torch.gather: out[i][j][k] = x[i][index[i][j][k]][k] for dim == 1 (any rank)."""
    return Gather.apply(x, dim=dim, index=_same_device("gather", x, index))


def scatter_add(x: Tensor, dim: int, index: Any, src: Tensor) -> Tensor:
    """torch.Tensor.scatter_add (out of place): x with src[i][j][k] added at
    [i][index[i][j][k]][k] for dim == 1. Deterministic (no atomics)."""
    if not isinstance(src, TensorBase):
        src = new_tensor(gp.asarray(src, dtype=x.dtype, device=x.device))
    return ScatterAdd.apply(x, src, dim=dim, index=_same_device("scatter_add", x, index))


def index_select(x: Tensor, dim: int, index: Any) -> Tensor:
    """torch.index_select: the slices of x at `index` (1-D) along dim."""
    return IndexSelect.apply(x, dim=dim, index=_same_device("index_select", x, index))
