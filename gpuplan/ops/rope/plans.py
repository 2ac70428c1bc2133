"""Rotary position embedding (RoPE) in Hugging Face's rotate-half convention, and its gradient.

x is laid out [batch, seq, heads, head_dim] (C order); the row at sequence index t has
position p = offset + t. With half = head_dim / 2, column i < half and
angle(p, i) = p * theta^(-2 i / head_dim):

    y = x * cos(angle) + rotate_half(x) * sin(angle),   rotate_half(x) = [-x2, x1]

(x1, x2 the two halves of the head dim; cos and sin repeated over both halves). The backward
is the rotation by -angle: dx = dy * cos - rotate_half(dy) * sin.

`heads` lets one plan serve both layouts attention code meets: [B, H, T, D] (what the fused
attention plans take: batch = B * H, heads = 1, no copy before attention) and [B, T, H, D]
(a projection's output viewed per head: batch = B, heads = H). With `split_heads` the
forward also moves the heads out: x [batch, seq, heads, D] (a projection's output) gives
y [batch, heads, seq, D] (attention's layout) in the same pass, and the backward reads dy
[batch, heads, seq, D] and writes dx [batch, seq, heads, D]. `theta` is fixed per model (a
descriptor field); `offset` changes per call (a KV cache's length: a run scalar).

cos and sin are evaluated in float64 for every dtype (the angle reaches thousands of radians,
where a float32 angle is off by ~1e-4), never from a table stored in a lower precision; the
rotation runs in float32 for f16/bf16 and in the dtype itself for f32/f64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.host_pool import for_blocks
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import DType, Extent, Flag, In, OpSpec, Out, Real, Scalar
from gpuplan.stream import Stream, Workspace

__all__ = [
    "RopeDescriptor", "RopeArgs", "RopePlan",
    "RopeBackwardDescriptor", "RopeBackwardArgs", "RopeBackwardPlan",
]
__functional__ = ["rope", "rope_backward", "rope_split_heads", "rope_split_heads_backward"]

_BOOL = ("false", "true")
_MODULE = CudaModule(__file__, "rope.cu", [f"rope_rotate<{cuda_name(t)}, {inv}>"
                                           for t in FLOAT_DTYPES for inv in _BOOL])
_THREADS = 256
_MAX_GRID_X = 1 << 16
#: blocks a launch aims for: the y dimension (rows) grows until there are about this many.
_TARGET_BLOCKS = 4096
_MAX_GRID_Y = 65535
#: the largest position offset: positions are exact in float64 far beyond it.
MAX_OFFSET = 2**31 - 1

_FIELDS = (Extent("batch"), Extent("seq"), Extent("heads"), Extent("head_dim"),
           Real("theta", default=10000.0), DType("dtype", FLOAT_DTYPES, default=np.float32),
           Flag("split_heads", default=False))
_X = ("batch", "seq", "heads", "head_dim")


def _split(desc: Any) -> tuple[int, int, int, int]:
    """The rotated side's shape: [batch, heads, seq, head_dim] with split_heads, else x's."""
    if desc.split_heads:
        return desc.batch, desc.heads, desc.seq, desc.head_dim
    return desc.batch, desc.seq, desc.heads, desc.head_dim


_OFFSET = (Scalar("offset", 0, "int", lo=0, hi=MAX_OFFSET),)
FORWARD = OpSpec("rope", fields=_FIELDS, operands=(In("x", _X), Out("y", _split)),
                 scalars=_OFFSET)
BACKWARD = OpSpec("rope_backward", fields=_FIELDS, operands=(In("dy", _split), Out("dx", _X)),
                  scalars=_OFFSET)

RopeDescriptor = FORWARD.descriptor(
    "RopeDescriptor", "Rotary embedding of x [batch, seq, heads, head_dim] (head_dim even) with "
                      "base theta, written [batch, heads, seq, head_dim] with split_heads; "
                      "forward and backward share it.")
#: forward and backward share the descriptor (same fields).
RopeBackwardDescriptor = RopeDescriptor
BACKWARD.descriptor_cls = RopeDescriptor
RopeArgs = FORWARD.args("RopeArgs", "x [batch, seq, heads, head_dim], y like x ([batch, heads, "
                                    "seq, head_dim] with split_heads); offset: the position "
                                    "of sequence index 0 (an int >= 0).")
RopeBackwardArgs = BACKWARD.args("RopeBackwardArgs", "dy like the forward's y, dx like its x; "
                                                     "offset as in the forward.")


class _RopePlan(Plan):
    category = "elementwise"
    _inverse = False

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        if desc.head_dim % 2:
            raise InvalidProblem(describe(cls.op, "head_dim", "an even extent (two halves "
                                                              "rotate together)", desc.head_dim))
        if desc.theta <= 0:
            raise InvalidProblem(describe(cls.op, "theta", "a finite number > 0", desc.theta))

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        return [Candidate("rotate", BackendKind.NVRTC, True, True, sn(d), sn(accumulator(d)))]

    def _prepare(self) -> None:
        d = self.desc
        self._kernel = f"rope_rotate<{cuda_name(d.dtype)}, {_BOOL[self._inverse]}>"
        rows, pairs = d.batch * d.heads, d.seq * (d.head_dim // 2)
        gx = max(1, min(cdiv(pairs, _THREADS), _MAX_GRID_X))
        gy = max(1, min(rows, _MAX_GRID_Y, cdiv(_TARGET_BLOCKS, gx)))
        self._grid = (gx, gy)
        self._extents = (np.int64(rows), np.int64(d.seq), np.int64(d.heads),
                         np.int64(d.head_dim))
        # element strides of (b, t, h): [batch, seq, heads, D], and the split side's
        # [batch, heads, seq, D]; the forward reads the first, the backward writes it.
        dim, h, t = d.head_dim, d.heads, d.seq
        plain = (t * h * dim, h * dim, dim)
        split = (h * t * dim, dim, t * dim) if d.split_heads else plain
        src, dst = (split, plain) if self._inverse else (plain, split)
        self._strides = tuple(np.int64(v) for v in (*src, *dst))

    def _rotate_host(self, src: np.ndarray, dst: np.ndarray, offset: int) -> None:
        d = self.desc
        acc, half = accumulator(d.dtype), d.head_dim // 2
        inv_freq = 1.0 / np.power(float(d.theta),
                                  np.arange(0, d.head_dim, 2, dtype=np.float64) / d.head_dim)
        angle = np.outer(np.arange(d.seq, dtype=np.float64) + offset, inv_freq)
        cos = np.cos(angle).astype(acc)[:, None, :]  # [seq, 1, half]
        sin = np.sin(angle).astype(acc)[:, None, :]
        if self._inverse:
            sin = -sin

        def view(a: np.ndarray, split: bool) -> np.ndarray:
            """a as [batch, seq, heads, D] (a [batch, heads, seq, D] one swapped)."""
            if split:
                return a.reshape(_split(d)).swapaxes(1, 2)
            return a.reshape(d.batch, d.seq, d.heads, d.head_dim)

        x = view(src, d.split_heads and self._inverse)
        y = view(dst, d.split_heads and not self._inverse)

        def block(lo: int, hi: int) -> None:
            x1 = x[lo:hi, ..., :half].astype(acc)
            x2 = x[lo:hi, ..., half:].astype(acc)
            y[lo:hi, ..., :half] = x1 * cos - x2 * sin
            y[lo:hi, ..., half:] = x2 * cos + x1 * sin

        for_blocks(d.batch, block, d.seq * d.heads * d.head_dim)

    def _rotate_device(self, stream: Stream, src: Any, dst: Any, offset: int) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, self._grid, _THREADS,
               (src, dst, *self._extents, np.int64(offset), np.float64(self.desc.theta),
                *self._strides))


class RopePlan(_RopePlan):
    """y = x cos + rotate_half(x) sin (see the module docstring)."""

    op = "rope"
    spec = FORWARD

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        self._rotate_host(args.x, args.y, int(args.offset))

    def _run_rotate(self, stream: Stream, ws: Workspace, args: Any) -> None:
        self._rotate_device(stream, args.x, args.y, int(args.offset))


class RopeBackwardPlan(_RopePlan):
    """dx = dy cos - rotate_half(dy) sin: the rotation by -angle."""

    op = "rope_backward"
    spec = BACKWARD
    _inverse = True

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        self._rotate_host(args.dy, args.dx, int(args.offset))

    def _run_rotate(self, stream: Stream, ws: Workspace, args: Any) -> None:
        self._rotate_device(stream, args.dy, args.dx, int(args.offset))


# -- functional API ------------------------------------------------------------------------


def _layout(op: str, name: str, x: Any, seq_dim: int) -> tuple[int, int, int, int]:
    """(batch, seq, heads, head_dim) of x with positions along axis `seq_dim`: the axes
    before it fold into batch, those between it and the last into heads."""
    nd = x.ndim
    if nd < 2:
        raise InvalidProblem(describe(op, name, "an array [..., seq, ..., head_dim] of at "
                                               "least 2 dims", f"shape {tuple(x.shape)}"))
    if isinstance(seq_dim, bool) or not isinstance(seq_dim, (int, np.integer)) or \
            not -nd <= seq_dim < nd or int(seq_dim) % nd == nd - 1:
        raise InvalidProblem(describe(op, "seq_dim", f"an axis of {name} before its last, head_dim "
                                                     f"(x has {nd} dims)", repr(seq_dim)))
    axis = int(seq_dim) % nd
    shape = tuple(x.shape)
    if shape[-1] % 2:
        raise InvalidProblem(describe(op, name, "[..., head_dim] with head_dim even (two "
                                                "halves rotate together)", f"shape {shape}"))
    batch = int(np.prod(shape[:axis], dtype=np.int64))
    heads = int(np.prod(shape[axis + 1:-1], dtype=np.int64))
    return batch, shape[axis], heads, shape[-1]


def rope(x: Any, theta: float = 10000.0, offset: int = 0, seq_dim: int = -2) -> Any:
    """The rotary embedding of x (positions offset + index along axis `seq_dim`, the last
    axis the even head dim), same shape and dtype: seq_dim=-2 for [B, H, T, D], 1 for
    [B, T, H, D]."""
    batch, seq, heads, dim = _layout("rope", "x", x, seq_dim)
    flat = backend.ascontiguous(x).reshape(batch, seq, heads, dim)
    y = call(RopePlan, RopeDescriptor(batch, seq, heads, dim, theta, x.dtype), like=x,
             x=flat, offset=offset)
    return y.reshape(x.shape)


def rope_backward(dy: Any, theta: float = 10000.0, offset: int = 0, seq_dim: int = -2) -> Any:
    """The gradient of `rope` with respect to x: dy rotated by -angle (same layout)."""
    batch, seq, heads, dim = _layout("rope_backward", "dy", dy, seq_dim)
    flat = backend.ascontiguous(dy).reshape(batch, seq, heads, dim)
    dx = call(RopeBackwardPlan, RopeDescriptor(batch, seq, heads, dim, theta, dy.dtype),
              like=dy, dy=flat, offset=offset)
    return dx.reshape(dy.shape)


def rope_split_heads(x: Any, heads: int, theta: float = 10000.0, offset: int = 0) -> Any:
    """x [..., T, heads * D] (a q or k projection's output) -> its heads rotated and laid out
    [..., heads, T, D] (attention's layout) in one pass: equal to splitting the heads out
    (reshape, transpose, copy) and then `rope` of that."""
    if x.ndim < 2 or isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or \
            heads < 1 or x.shape[-1] % heads or (x.shape[-1] // heads) % 2:
        raise InvalidProblem(describe("rope_split_heads", "x", f"[..., T, heads * D] with "
                                                               f"heads={heads!r} and D even",
                                      f"shape {tuple(x.shape)}"))
    *lead, seq, width = x.shape
    batch, dim = int(np.prod(lead, dtype=np.int64)), width // int(heads)
    flat = backend.ascontiguous(x).reshape(batch, seq, int(heads), dim)
    y = call(RopePlan, RopeDescriptor(batch, seq, int(heads), dim, theta, x.dtype, True),
             like=x, x=flat, offset=offset)
    return y.reshape(*lead, int(heads), seq, dim)


def rope_split_heads_backward(dy: Any, theta: float = 10000.0, offset: int = 0) -> Any:
    """The gradient of `rope_split_heads`: dy [..., heads, T, D] -> dx [..., T, heads * D]."""
    if dy.ndim < 3 or dy.shape[-1] % 2:
        raise InvalidProblem(describe("rope_split_heads_backward", "dy", "[..., heads, T, D] "
                                                                         "with D even",
                                      f"shape {tuple(dy.shape)}"))
    *lead, heads, seq, dim = dy.shape
    batch = int(np.prod(lead, dtype=np.int64))
    flat = backend.ascontiguous(dy).reshape(batch, heads, seq, dim)
    dx = call(RopeBackwardPlan, RopeDescriptor(batch, seq, heads, dim, theta, dy.dtype, True),
              like=dy, dy=flat, offset=offset)
    return dx.reshape(*lead, seq, heads * dim)
