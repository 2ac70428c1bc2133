"""Activation benchmarks: unary forward (gelu, tanh) and gelu backward on 8192x8192
bf16/f32 (smoke: 96x1000), in GB/s against CuPy."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from benchsuite.kernels.common import (
    Case,
    empty,
    plan_state,
    random_device,
    run_plan_state,
    size,
)

ROWS, COLS = size((8192, 8192), (96, 1000))
N = ROWS * COLS


def _size(dtype) -> int:
    return np.dtype(dtype).itemsize


def _unary(op: str, dtype, backward: bool = False) -> Case:
    tag = f"{op}_{'bwd' if backward else 'fwd'}_{gp.dtypes.short_name(dtype)}_{ROWS}x{COLS}"

    def setup() -> dict:
        x = random_device((N,), dtype)
        if backward:
            dy = random_device((N,), dtype, seed=1)
            dx = empty(N, dtype)
            return plan_state(gp.UnaryBackwardPlan, gp.UnaryBackwardDescriptor(op, N, dtype),
                              gp.UnaryBackwardArgs(x, dy, dx), x=x, y=dx)
        y = empty(N, dtype)
        return plan_state(gp.UnaryPlan, gp.UnaryDescriptor(op, N, dtype), gp.UnaryArgs(x, y),
                          x=x, y=y)

    def baseline(s: dict) -> None:
        import cupy as cp

        cp.tanh(s["x"], out=s["y"])

    moved = (3 if backward else 2) * N * _size(dtype)
    return Case(tag, setup, run_plan_state, bytes_moved=moved,
                baseline=baseline if op == "tanh" and not backward else None,
                baseline_name="cupy.tanh")


def _cases() -> list[Case]:
    cases: list[Case] = []
    for dtype in (gp.bfloat16, np.float32):
        cases += [_unary("gelu", dtype), _unary("tanh", dtype), _unary("gelu", dtype, True)]
    return cases


CASES = _cases()
