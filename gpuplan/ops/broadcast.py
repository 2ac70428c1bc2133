"""NumPy broadcasting of k operands as collapsed strided dims, shared by the elementwise
families (binary: a, b; select: cond, a, b) and their kernels' launch arguments."""

from __future__ import annotations

import functools
import math

import numpy as np

from gpuplan.errors import InvalidProblem, describe

#: Collapsed dims a broadcast kernel takes (binary.cu, select.cu: GP_DIMS_PARAMS).
MAX_DIMS = 8


@functools.lru_cache(maxsize=1024)
def broadcast_layout(op: str, names: tuple[str, ...], shapes: tuple[tuple, ...]
                     ) -> tuple[tuple, tuple]:
    """(out_shape, collapsed dims ((extent, stride_0, ..., stride_k-1), ...)) of operands
    with these shapes: element strides, 0 on a broadcast dim; size-1 output dims dropped,
    neighbours merged where every operand stays contiguous across them. A shape that does
    not broadcast with the ones before it is an InvalidProblem naming its field (`names`).
    Cached (shapes are tuples): plans derive it once, in `_prepare`."""
    out: tuple = ()
    for k, shape in enumerate(shapes):
        try:
            out = tuple(int(e) for e in np.broadcast_shapes(out, shape))
        except ValueError:
            before = " and ".join(str(tuple(s)) for s in shapes[:k])
            raise InvalidProblem(describe(op, names[k], f"a shape broadcastable with "
                                                        f"{before}", shape)) from None
    n = len(out)
    strides = []
    for shape in shapes:
        pad = (1,) * (n - len(shape)) + tuple(int(e) for e in shape)
        strides.append([0 if pad[i] == 1 else math.prod(pad[i + 1:]) for i in range(n)])
    merged: list[tuple] = []
    for i in range(n):
        if out[i] == 1:
            continue
        e, ss = out[i], tuple(s[i] for s in strides)
        if merged and all(m == s * e for m, s in zip(merged[-1][1:], ss, strict=True)):
            merged[-1] = (merged[-1][0] * e, *ss)
        else:
            merged.append((e, *ss))
    return out, tuple(merged)


def dims_launch_args(dims: tuple, operands: int) -> tuple:
    """The kernels' (ndim, shape[8], strides of operand 0 [8], ...) launch arguments."""
    full = dims + ((1,) + (0,) * operands,) * (MAX_DIMS - len(dims))
    return (np.int32(len(dims)),) + tuple(np.int64(e[k]) for k in range(operands + 1)
                                          for e in full)
