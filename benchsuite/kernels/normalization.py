"""LayerNorm / RMSNorm benchmarks on a 16384 x 4096 activation (bf16 and f32) vs CuPy ops
(smoke: 48 x 4096, the same row length, so the same row kernels)."""

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
from gpuplan.dtypes import accumulator

N, D = size((16384, 4096), (48, 4096))


def _ln_forward_setup(dt, rms: bool):
    def setup() -> dict:
        acc = accumulator(dt)
        x = random_device((N, D), dt, scale=2.0)
        w = random_device((D,), dt, seed=1)
        b = None if rms else random_device((D,), dt, seed=2)
        y = empty((N, D), dt)
        rstd = empty((N,), acc)
        if rms:
            return plan_state(gp.RMSNormPlan, gp.RMSNormDescriptor(N, D, 1e-6, True, dt),
                              gp.RMSNormArgs(x, w, y, rstd), x=x, w=w, b=b)
        mean = empty((N,), acc)
        return plan_state(gp.LayerNormPlan, gp.LayerNormDescriptor(N, D, 1e-5, True, True, dt),
                          gp.LayerNormArgs(x, w, b, y, mean, rstd), x=x, w=w, b=b)
    return setup


def _forward_baseline(rms: bool):
    def baseline(st: dict) -> None:
        import cupy as cp

        with st["stream"].cuda_stream:
            xf = st["x"].astype(cp.float32)
            if rms:
                y = xf * (1 / cp.sqrt((xf * xf).mean(axis=1, keepdims=True) + 1e-6))
                y = y * st["w"].astype(cp.float32)
            else:
                c = xf - xf.mean(axis=1, keepdims=True)
                y = c * (1 / cp.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-5))
                y = y * st["w"].astype(cp.float32) + st["b"].astype(cp.float32)
            y.astype(st["x"].dtype)
    return baseline


def _backward_setup(dt, rms: bool):
    def setup() -> dict:
        x = random_device((N, D), dt, scale=2.0)
        dy = random_device((N, D), dt, seed=3)
        w = random_device((D,), dt, seed=1)
        dx = empty((N, D), dt)
        dw = empty((D,), dt)
        if rms:
            _, rstd = gp.functional.rms_norm(x, w)
            return plan_state(gp.RMSNormBackwardPlan, gp.RMSNormBackwardDescriptor(N, D, True, dt),
                              gp.RMSNormBackwardArgs(dy, x, w, rstd, dx, dw))
        _, mean, rstd = gp.functional.layer_norm(x, w, None)
        db = empty((D,), dt)
        return plan_state(gp.LayerNormBackwardPlan,
                          gp.LayerNormBackwardDescriptor(N, D, True, True, dt),
                          gp.LayerNormBackwardArgs(dy, x, w, mean, rstd, dx, dw, db))
    return setup


CASES: list[Case] = []
for _dt in (gp.bfloat16, np.dtype(np.float32)):
    _it = _dt.itemsize
    _tag = gp.dtypes.short_name(_dt)
    for _rms, _name in ((False, "layer_norm"), (True, "rms_norm")):
        CASES.append(Case(f"{_name}_{_tag}_{N}x{D}", _ln_forward_setup(_dt, _rms), run_plan_state,
                          2 * N * D * _it + N * 8, baseline=_forward_baseline(_rms),
                          baseline_name="cupy ops"))
        CASES.append(Case(f"{_name}_bwd_{_tag}_{N}x{D}", _backward_setup(_dt, _rms),
                          run_plan_state, 3 * N * D * _it + N * 8))
