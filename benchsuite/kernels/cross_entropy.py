"""Cross-entropy benchmarks on [8192, 50257] logits (a GPT-2 vocabulary) vs CuPy ops; every
17th target is the ignore index. Smoke: [128, 503] (a vocabulary no block size divides)."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from benchsuite.kernels.common import (
    Case,
    device_array,
    empty,
    plan_state,
    random_device,
    run_plan_state,
    size,
)
from gpuplan.dtypes import accumulator

N, V = size((8192, 50257), (128, 503))


def _inputs(dt) -> tuple:
    logits = random_device((N, V), dt, scale=2.0)
    t = np.random.default_rng(1).integers(0, V, N)
    t[::17] = -100
    return logits, device_array(t.astype(np.int64))


def _forward_setup(dt):
    def setup() -> dict:
        acc = accumulator(dt)
        logits, target = _inputs(dt)
        loss = empty((), acc)
        lse = empty((N,), acc)
        desc = gp.CrossEntropyDescriptor(N, V, -100, "mean", 0.1, dt)
        return plan_state(gp.CrossEntropyPlan, desc,
                          gp.CrossEntropyArgs(logits, target, loss, lse),
                          logits=logits, target=target)
    return setup


def _forward_baseline(st: dict) -> None:
    import cupy as cp

    with st["stream"].cuda_stream:
        x = st["logits"].astype(cp.float32)
        t = st["target"]
        keep = t != -100
        m = x.max(axis=1, keepdims=True)
        lse = (m + cp.log(cp.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]
        xt = cp.take_along_axis(x, cp.where(keep, t, 0)[:, None], axis=1)[:, 0]
        rows = 0.9 * (lse - xt) + 0.1 * (lse - x.mean(axis=1))
        st["baseline_loss"] = cp.where(keep, rows, 0).sum() / keep.sum()


def _backward_setup(dt):
    def setup() -> dict:
        acc = accumulator(dt)
        logits, target = _inputs(dt)
        _, lse = gp.functional.cross_entropy(logits, target, label_smoothing=0.1)
        dloss = device_array(np.ones((), acc))
        dlogits = empty((N, V), dt)
        desc = gp.CrossEntropyBackwardDescriptor(N, V, -100, "mean", 0.1, dt)
        return plan_state(gp.CrossEntropyBackwardPlan, desc,
                          gp.CrossEntropyBackwardArgs(logits, target, lse, dloss, dlogits),
                          logits=logits, target=target, lse=lse)
    return setup


def _backward_baseline(st: dict) -> None:
    import cupy as cp

    with st["stream"].cuda_stream:
        x, t = st["logits"].astype(cp.float32), st["target"]
        keep = t != -100
        g = cp.exp(x - st["lse"][:, None]) - 0.1 / V
        rows = cp.nonzero(keep)[0]
        g[rows, t[rows]] -= 0.9
        (g * (keep[:, None] / keep.sum())).astype(st["logits"].dtype)


CASES: list[Case] = []
for _dt in (gp.bfloat16, np.dtype(np.float32)):
    _nv = N * V * _dt.itemsize
    _tag = gp.dtypes.short_name(_dt)
    CASES += [
        Case(f"cross_entropy_{_tag}_{N}x{V}", _forward_setup(_dt), run_plan_state,
             _nv + N * 16, baseline=_forward_baseline, baseline_name="cupy ops"),
        Case(f"cross_entropy_bwd_{_tag}_{N}x{V}", _backward_setup(_dt), run_plan_state,
             2 * _nv + N * 16, baseline=_backward_baseline, baseline_name="cupy ops"),
    ]
