"""Dropout benchmarks: forward, backward and keep-mask throughput on 8192x8192 (smoke:
192x1000) against a D2D copy."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from benchsuite.kernels.common import (
    Case,
    empty,
    random_device,
    size,
)

ROWS, COLS = size((8192, 8192), (192, 1000))
P = 0.1


def _setup(dtype) -> dict:
    x = random_device((ROWS, COLS), dtype)
    n = ROWS * COLS
    stream = gp.Stream.current()
    desc = gp.DropoutDescriptor(n, P, dtype)  # forward and backward share it
    plan = gp.DropoutPlan.select(stream, desc)
    bplan = gp.DropoutBackwardPlan.select(stream, desc)
    mplan = gp.DropoutMaskPlan.select(stream, gp.DropoutMaskDescriptor(n, P))
    return {"x": x.reshape(-1), "y": empty(n, dtype), "mask": empty(n, np.bool_),
            "plan": plan, "bplan": bplan, "mplan": mplan, "stream": stream}


def _forward(s: dict) -> None:
    s["plan"].run(s["stream"], None, gp.DropoutArgs(s["x"], s["y"], seed=1234, offset=0))


def _backward(s: dict) -> None:
    s["bplan"].run(s["stream"], None, gp.DropoutBackwardArgs(s["x"], s["y"], seed=1234, offset=0))


def _mask(s: dict) -> None:
    s["mplan"].run(s["stream"], None, gp.DropoutMaskArgs(s["mask"], seed=1234, offset=0))


def _copy(s: dict) -> None:
    s["y"][...] = s["x"]


def _cases() -> list[Case]:
    cases = []
    for dtype in (gp.bfloat16, np.float32):
        tag = gp.dtypes.short_name(dtype)
        nbytes = 2 * ROWS * COLS * np.dtype(dtype).itemsize  # read x, write y
        cases.append(Case(f"dropout_fwd_{tag}_{ROWS}x{COLS}", lambda d=dtype: _setup(d), _forward,
                          bytes_moved=nbytes, baseline=_copy, baseline_name="cupy D2D copy"))
    cases.append(Case(f"dropout_bwd_bf16_{ROWS}x{COLS}", lambda: _setup(gp.bfloat16), _backward,
                      bytes_moved=2 * ROWS * COLS * 2, baseline=_copy,
                      baseline_name="cupy D2D copy"))
    cases.append(Case(f"dropout_mask_{ROWS}x{COLS}", lambda: _setup(gp.bfloat16), _mask,
                      bytes_moved=ROWS * COLS))
    return cases


CASES = _cases()
