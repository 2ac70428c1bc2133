"""Softmax / log-softmax benchmarks on 16384 x 4096 rows (bf16 and f32) vs CuPy ops (smoke:
1024 x 256; the causal cases stay 4 batches of [D, D] scores)."""

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

N, D = size((16384, 4096), (1024, 256))


def _forward_setup(dt, plan_cls, causal: bool = False):
    def setup() -> dict:
        x = random_device((N, D), dt, scale=3.0)
        y = empty((N, D), dt)
        # causal: [N / D, D, D] attention scores (Lq = Lk = D)
        desc = gp.SoftmaxDescriptor(N, D, 0.125, causal, D if causal else 0, dt)
        return plan_state(plan_cls, desc, gp.SoftmaxArgs(x, y), x=x)
    return setup


def _forward_baseline(log: bool):
    def baseline(st: dict) -> None:
        import cupy as cp

        with st["stream"].cuda_stream:
            z = st["x"].astype(cp.float32)
            z = z - z.max(axis=1, keepdims=True)
            if log:
                y = z - cp.log(cp.exp(z).sum(axis=1, keepdims=True))
            else:
                e = cp.exp(z)
                y = e / e.sum(axis=1, keepdims=True)
            y.astype(st["x"].dtype)
    return baseline


def _backward_setup(dt):
    def setup() -> dict:
        x = random_device((N, D), dt, scale=3.0)
        y = gp.functional.softmax(x)
        dy = random_device((N, D), dt, seed=1)
        dx = empty((N, D), dt)
        desc = gp.SoftmaxBackwardDescriptor(N, D, 1.0, dtype=dt)
        return plan_state(gp.SoftmaxBackwardPlan, desc, gp.SoftmaxBackwardArgs(y, dy, dx),
                          y=y, dy=dy)
    return setup


def _backward_baseline(st: dict) -> None:
    import cupy as cp

    with st["stream"].cuda_stream:
        y, dy = st["y"].astype(cp.float32), st["dy"].astype(cp.float32)
        (y * (dy - (dy * y).sum(axis=1, keepdims=True))).astype(st["y"].dtype)


CASES: list[Case] = []
for _dt in (gp.bfloat16, np.dtype(np.float32)):
    _nd = N * D * _dt.itemsize
    _tag = gp.dtypes.short_name(_dt)
    CASES += [
        Case(f"softmax_{_tag}_{N}x{D}", _forward_setup(_dt, gp.SoftmaxPlan), run_plan_state,
             2 * _nd, baseline=_forward_baseline(False), baseline_name="cupy ops"),
        Case(f"softmax_causal_{_tag}_{N}x{D}", _forward_setup(_dt, gp.SoftmaxPlan, True),
             run_plan_state, 2 * _nd),
        Case(f"log_softmax_{_tag}_{N}x{D}", _forward_setup(_dt, gp.LogSoftmaxPlan),
             run_plan_state, 2 * _nd, baseline=_forward_baseline(True), baseline_name="cupy ops"),
        Case(f"softmax_bwd_{_tag}_{N}x{D}", _backward_setup(_dt), run_plan_state, 3 * _nd,
             baseline=_backward_baseline, baseline_name="cupy ops"),
    ]
