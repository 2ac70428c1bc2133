"""Padding Functions (PyTorch F.pad): constant padding by copies, reflect/replicate/circular
padding as a gather along each padded dim (its backward a scatter-add through the plans)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import gpuplan as gp
from autograd.function import Function
from autograd.functions.shape import getitem
from gpuplan import backend

if TYPE_CHECKING:
    from autograd.tensor import Tensor

MODES = ("constant", "reflect", "replicate", "circular")


def _pairs(pad: Sequence[int], ndim: int) -> list[tuple[int, int]]:
    """(before, after) per dim of the input, from torch's last-dim-first flat list."""
    pairs = [(0, 0)] * ndim
    for i in range(len(pad) // 2):
        pairs[ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return pairs


def _windows(shape: tuple[int, ...], pairs: list[tuple[int, int]]) -> tuple[tuple, tuple]:
    """Slices of the input and of the output that hold the same elements (negative pads
    crop the input)."""
    src, dst = [], []
    for n, (lo, hi) in zip(shape, pairs, strict=True):
        src.append(slice(max(-lo, 0), n - max(-hi, 0)))
        dst.append(slice(max(lo, 0), max(lo, 0) + n - max(-lo, 0) - max(-hi, 0)))
    return tuple(src), tuple(dst)


class ConstantPad(Function):
    """y = value outside the input's window, y[window] = x[window'] (pure data movement);
    dx = dy's window placed into zeros (cropped elements get no gradient)."""

    @staticmethod
    def forward(ctx, x, pairs, value):
        out_shape = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, pairs, strict=True))
        src, dst = _windows(x.shape, pairs)
        ctx.windows, ctx.shape = (src, dst), x.shape
        y = gp.full(out_shape, value, x.dtype, gp.device_of(x))
        y[dst] = x[src]
        return y

    @staticmethod
    def backward(ctx, dy):
        src, dst = ctx.windows
        dx = gp.zeros(ctx.shape, dy.dtype, gp.device_of(dy))
        dx[src] = dy[dst]
        return dx


def _source_index(n: int, lo: int, hi: int, mode: str) -> list[int]:
    """For each output position along a dim of extent n, the input position it copies."""
    out = []
    for j in range(-lo, n + hi):
        if mode == "replicate":
            i = min(max(j, 0), n - 1)
        elif mode == "circular":
            i = j % n
        else:  # reflect about the edge elements (not repeating them), as torch
            period = 2 * (n - 1)
            i = j % period if period else 0
            i = period - i if i >= n else i
        out.append(i)
    return out


def pad(input: Tensor, pad: Sequence[int], mode: str = "constant",  # noqa: A002
        value: float | None = None) -> Tensor:
    """PyTorch F.pad: ``pad = (last_lo, last_hi, prev_lo, prev_hi, ...)`` pads the last
    len(pad)//2 dims. ``constant`` (any dims; negative pads crop; fill ``value``, default
    0) is a copy into a filled array; ``reflect``, ``replicate`` and ``circular`` gather
    along each padded dim (indices built on the host) so that their backward adds the
    duplicated elements' gradients through the embedding-backward plan."""
    if mode not in MODES:
        raise ValueError(f"pad: mode must be one of {MODES}, given {mode!r}")
    pad = [int(p) for p in pad]
    if len(pad) % 2 or len(pad) > 2 * input.ndim:
        raise ValueError(f"pad: pad must have an even length <= 2 * input.dim() = "
                         f"{2 * input.ndim}, given {len(pad)} values {tuple(pad)}")
    pairs = _pairs(pad, input.ndim)
    for d, (n, (lo, hi)) in enumerate(zip(input.shape, pairs, strict=True)):
        if n + lo + hi < 0:
            raise ValueError(f"pad: dim {d} of extent {n} padded by ({lo}, {hi}) would have a "
                             f"negative size {n + lo + hi}")
    if mode == "constant":
        return ConstantPad.apply(input, pairs=pairs, value=0.0 if value is None else
                                 float(value))
    if value not in (None, 0, 0.0):
        raise ValueError(f"pad: value applies to mode='constant' only, given value={value} "
                         f"with mode={mode!r}")
    out = input
    for d, (n, (lo, hi)) in enumerate(zip(input.shape, pairs, strict=True)):
        if lo == hi == 0:
            continue
        if lo < 0 or hi < 0:
            raise ValueError(f"pad: mode={mode!r} takes pads >= 0, given ({lo}, {hi}) for dim {d}")
        limit = n - 1 if mode == "reflect" else n
        if (mode != "replicate" and (lo > limit or hi > limit)) or n == 0:
            raise ValueError(f"pad: mode={mode!r} needs pads <= {limit} for dim {d} of extent "
                             f"{n}, given ({lo}, {hi})")
        index = backend.asarray(_source_index(n, lo, hi, mode), dtype=gp.dtypes.int64)
        out = getitem(out, (slice(None),) * d + (index,))
    return out

