"""Data-movement Functions: reshape, transpose, indexing, cat/split/stack, broadcast, cast, move.

Outputs are C-contiguous (plans take contiguous operands): views that are not are copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.tensor_base import TensorBase
from gpuplan import backend

if TYPE_CHECKING:
    from autograd.tensor import Tensor


def _axis(axis: int, ndim: int, op: str) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"{op}: dim {axis} out of range for a {ndim}-d tensor")
    return axis % ndim


def sum_to_shape(g: Any, shape: tuple[int, ...]) -> Any:
    """Sum a broadcast gradient back to `shape` (NumPy broadcasting rules)."""
    if tuple(g.shape) == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1)
    return F.reduce("sum", g, axes=axes, keepdims=False).reshape(shape)


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x.shape
        return backend.ascontiguous(x).reshape(shape)

    @staticmethod
    def backward(ctx, dy):
        return dy.reshape(ctx.in_shape)


class Permute(Function):
    @staticmethod
    def forward(ctx, x, axes):
        ctx.inverse = tuple(sorted(range(len(axes)), key=lambda i: axes[i]))
        return backend.ascontiguous(x.transpose(axes))

    @staticmethod
    def backward(ctx, dy):
        return backend.ascontiguous(dy.transpose(ctx.inverse))


def _is_basic(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)


class GetItem(Function):
    """y = x[index]; backward scatters dy into zeros, adding the duplicates of advanced
    indices (through the embedding-backward plan: halves accumulate in f32)."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.index, ctx.shape = index, x.shape
        return backend.ascontiguous(x[index])

    @staticmethod
    def backward(ctx, dy):
        shape, index = ctx.shape, ctx.index
        if _is_basic(index):
            dx = gp.zeros(shape, dy.dtype, gp.device_of(dy))
            dx[index] = dy
            return dx
        if hasattr(index, "dtype") and index.dtype.kind in "iu" and len(shape) >= 1:
            # x[rows]: scatter-add whole rows (negative rows count from the end).
            n = shape[0]
            rows = index.reshape(-1).astype(gp.dtypes.int64)
            rows = rows + (rows < 0) * n
            width = _prod(shape[1:])
            return F.embedding_backward(dy.reshape(-1, width), rows, n).reshape(shape)
        size = _prod(shape)
        positions = gp.array_namespace(dy).arange(size, dtype=gp.dtypes.int64)
        flat = positions.reshape(shape)[index].reshape(-1)
        return F.embedding_backward(dy.reshape(-1, 1), flat, size).reshape(shape)


def _prod(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class Cat(Function):
    @staticmethod
    def forward(ctx, *xs, dim):
        ctx.dim, ctx.sizes = dim, [x.shape[dim] for x in xs]
        return backend.concatenate(list(xs), axis=dim)

    @staticmethod
    def backward(ctx, dy):
        out, start = [], 0
        for n in ctx.sizes:
            sl = (slice(None),) * ctx.dim + (slice(start, start + n),)
            out.append(backend.ascontiguous(dy[sl]))
            start += n
        return tuple(out)


class Split(Function):
    @staticmethod
    def forward(ctx, x, sizes, dim):
        ctx.dim = dim
        out, start = [], 0
        for n in sizes:
            sl = (slice(None),) * dim + (slice(start, start + n),)
            out.append(backend.ascontiguous(x[sl]))
            start += n
        return tuple(out)

    @staticmethod
    def backward(ctx, *dys):
        return backend.concatenate(list(dys), axis=ctx.dim)


class Stack(Function):
    @staticmethod
    def forward(ctx, *xs, dim):
        ctx.dim, ctx.count = dim, len(xs)
        return backend.stack(list(xs), axis=dim)

    @staticmethod
    def backward(ctx, dy):
        pre = (slice(None),) * ctx.dim
        return tuple(backend.ascontiguous(dy[pre + (i,)]) for i in range(ctx.count))


class BroadcastTo(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x.shape
        return backend.ascontiguous(gp.array_namespace(x).broadcast_to(x, shape))

    @staticmethod
    def backward(ctx, dy):
        return sum_to_shape(dy, ctx.in_shape)


class Cast(Function):
    @staticmethod
    def forward(ctx, x, dtype):
        ctx.in_dtype = x.dtype
        return F.cast(x, dtype)

    @staticmethod
    def backward(ctx, dy):
        return F.cast(dy, ctx.in_dtype)


class ToDevice(Function):
    @staticmethod
    def forward(ctx, x, device):
        ctx.src = gp.device_of(x)
        return gp.to_device(x, device)

    @staticmethod
    def backward(ctx, dy):
        return gp.to_device(dy, ctx.src)


# -- public helpers ---------------------------------------------------------------------------


def reshape(x: Tensor, *shape: Any) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return Reshape.apply(x, shape=tuple(int(s) for s in shape))


def permute(x: Tensor, *axes: int) -> Tensor:
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    if sorted(a % x.ndim for a in axes) != list(range(x.ndim)):
        raise ValueError(f"permute: axes {axes} are not a permutation of {x.ndim} dims")
    return Permute.apply(x, axes=tuple(a % x.ndim for a in axes))


def transpose(x: Tensor, *axes: int) -> Tensor:
    """No axes: reverse all dims; two axes: swap them; otherwise a full permutation."""
    if not axes:
        return Permute.apply(x, axes=tuple(reversed(range(x.ndim))))
    if len(axes) == 2:
        a, b = (_axis(axes[0], x.ndim, "transpose"), _axis(axes[1], x.ndim, "transpose"))
        perm = list(range(x.ndim))
        perm[a], perm[b] = perm[b], perm[a]
        return Permute.apply(x, axes=tuple(perm))
    return permute(x, *axes)


def getitem(x: Tensor, index: Any) -> Tensor:
    """x[index]: basic (ints, slices, None, ...) or advanced (integer / bool arrays, lists,
    Tensors; moved to x's device)."""
    return GetItem.apply(x, index=device_index(index, x.device))


def device_index(index: Any, device: str) -> Any:
    """An index with its arrays (lists, Tensors, host arrays) as arrays on `device`."""

    def convert(i: Any) -> Any:
        if isinstance(i, TensorBase):
            i = i.data
        if isinstance(i, list) or hasattr(i, "shape") and getattr(i, "ndim", 0) > 0:
            return gp.to_device(gp.asarray(i), device)
        return i

    return tuple(convert(i) for i in index) if isinstance(index, tuple) else convert(index)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along `dim` (every tensor has the same shape elsewhere)."""
    tensors = list(tensors)
    return Cat.apply(*tensors, dim=_axis(dim, tensors[0].ndim, "cat"))


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    tensors = list(tensors)
    return Stack.apply(*tensors, dim=_axis(dim, tensors[0].ndim + 1, "stack"))


def split(x: Tensor, split_size_or_sections: int | Sequence[int], dim: int = 0
          ) -> tuple[Tensor, ...]:
    """PyTorch split: an int is the size of every piece (the last may be smaller); a list
    gives each piece's size (summing to the extent)."""
    dim = _axis(dim, x.ndim, "split")
    extent = x.shape[dim]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if step <= 0:
            raise ValueError(f"split: split size must be positive, given {step}")
        sizes = [min(step, extent - s) for s in range(0, extent, step)] or [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if sum(sizes) != extent or any(s < 0 for s in sizes):
            raise ValueError(f"split: sizes {sizes} must be >= 0 and sum to {extent} "
                             f"(dim {dim})")
    out = Split.apply(x, sizes=tuple(sizes), dim=dim)
    return out if isinstance(out, tuple) else (out,)


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """PyTorch chunk: pieces of ceil(n / chunks) (the last smaller; fewer pieces if needed)."""
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, given {chunks}")
    dim = _axis(dim, x.ndim, "chunk")
    extent = x.shape[dim]
    step = max(1, -(-extent // chunks))
    sizes = [min(step, extent - s) for s in range(0, extent, step)] or [0]
    return split(x, sizes, dim)


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    return BroadcastTo.apply(x, shape=tuple(int(s) for s in shape))


class Repeat(Function):
    """y = x tiled `reps` times per dim (torch ``repeat``): x is viewed as
    (1, s0, 1, s1, ...), broadcast to (r0, s0, r1, s1, ...) and made contiguous; backward
    sums the tiles, dx = sum over the r axes of dy viewed that way (the reduce plan)."""

    @staticmethod
    def forward(ctx, x, reps):
        lead = len(reps) - x.ndim
        shape = (1,) * lead + tuple(x.shape)
        ctx.in_shape, ctx.reps, ctx.shape = x.shape, reps, shape
        pairs = tuple(v for s in shape for v in (1, s))
        tiled = tuple(v for r, s in zip(reps, shape, strict=True) for v in (r, s))
        xp = gp.array_namespace(x)
        y = backend.ascontiguous(xp.broadcast_to(x.reshape(pairs), tiled))
        return y.reshape(tuple(r * s for r, s in zip(reps, shape, strict=True)))

    @staticmethod
    def backward(ctx, dy):
        axes = tuple(2 * i for i, r in enumerate(ctx.reps) if r != 1)
        if not axes:
            return backend.ascontiguous(dy).reshape(ctx.in_shape)
        tiled = tuple(v for r, s in zip(ctx.reps, ctx.shape, strict=True) for v in (r, s))
        return F.reduce("sum", dy.reshape(tiled), axes=axes, keepdims=False) \
            .reshape(ctx.in_shape)


def repeat(x: Tensor, *sizes: Any) -> Tensor:
    """torch ``Tensor.repeat``: tile x sizes[i] times along dim i (len(sizes) >= x.ndim;
    extra sizes add leading dims)."""
    reps = _sizes_arg(sizes)
    if len(reps) < x.ndim:
        raise ValueError(f"repeat: needs at least {x.ndim} repeat counts (one per dim of "
                         f"the tensor), given {len(reps)}: {reps}")
    if any(r < 0 for r in reps):
        raise ValueError(f"repeat: repeat counts must be >= 0, given {reps}")
    return Repeat.apply(x, reps=reps)


def expand(x: Tensor, *sizes: Any) -> Tensor:
    """torch ``Tensor.expand``: -1 keeps a dim's size; a size-1 dim may grow; new dims go
    in front (and may not be -1). Returns a contiguous copy (a broadcast), not a view."""
    sizes = _sizes_arg(sizes)
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ValueError(f"expand: the number of sizes ({len(sizes)}) must be >= the number "
                         f"of dims ({x.ndim}); given {sizes} for shape {x.shape}")
    shape = []
    for i, s in enumerate(sizes):
        have = x.shape[i - lead] if i >= lead else None
        if s == -1:
            if have is None:
                raise ValueError(f"expand: -1 is not allowed for a new leading dim "
                                 f"(dim {i}); given {sizes}")
            s = have
        elif s < 0 or have not in (None, 1, s):
            raise ValueError(f"expand: size {s} at dim {i} does not match the tensor's "
                             f"size {have} there (only size-1 dims expand); given {sizes} "
                             f"for shape {x.shape}")
        shape.append(s)
    return BroadcastTo.apply(x, shape=tuple(shape))


def squeeze(x: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
    """Drop size-1 dims: all of them, or those among `dim` (others are left, as torch)."""
    if dim is None:
        dims = {i for i, s in enumerate(x.shape) if s == 1}
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        dims = {d for d in (_axis(int(a), max(x.ndim, 1), "squeeze") for a in dims)
                if d < x.ndim and x.shape[d] == 1}
    shape = tuple(s for i, s in enumerate(x.shape) if i not in dims)
    return Reshape.apply(x, shape=shape)


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dim at `dim` (in [-ndim - 1, ndim], as torch)."""
    d = _axis(int(dim), x.ndim + 1, "unsqueeze")
    return Reshape.apply(x, shape=x.shape[:d] + (1,) + x.shape[d:])


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims start_dim..end_dim into one (a 0-d tensor becomes shape (1,))."""
    if x.ndim == 0:
        return Reshape.apply(x, shape=(1,))
    a, b = _axis(start_dim, x.ndim, "flatten"), _axis(end_dim, x.ndim, "flatten")
    if a > b:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} "
                         f"for a {x.ndim}-d tensor")
    return Reshape.apply(x, shape=x.shape[:a] + (_prod(x.shape[a:b + 1]),) + x.shape[b + 1:])


def _sizes_arg(sizes: tuple) -> tuple[int, ...]:
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    return tuple(int(s) for s in sizes)
