"""Optimizer-step benchmarks: AdamW (single and multi-tensor) and SGD over 124M f32 params."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from scripts.benchmarks.common import Case

N_PARAMS = 124_439_808  # GPT-2 small
# GPT-2 small's parameter tensors: embeddings, then 12 blocks, then the final LayerNorm.
_BLOCK = [768, 768, 768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072, 3072 * 768, 768]
GPT2_SIZES = tuple([50257 * 768, 1024 * 768] + _BLOCK * 12 + [768, 768])
HP = dict(lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def _flat_setup(grad_dtype, lowp=None, bytes_per_param=28) -> dict:
    import cupy as cp

    n = N_PARAMS
    rng = cp.random.default_rng(0)
    s = {"p": rng.standard_normal(n, dtype=cp.float32), "m": cp.zeros(n, cp.float32),
         "v": cp.zeros(n, cp.float32), "buf": cp.zeros(n, cp.float32),
         "g": rng.standard_normal(n, dtype=cp.float32).astype(grad_dtype),
         "low": None if lowp is None else cp.empty(n, dtype=lowp),
         "stream": gp.Stream.current(),
         # the copy baseline reads and writes as many bytes as the step moves
         "scratch": cp.empty(n * bytes_per_param // 2, cp.uint8)}
    s["adamw"] = gp.AdamWPlan.select(s["stream"], gp.AdamWDescriptor(n, np.float32, grad_dtype,
                                                                      lowp))
    s["sgd"] = gp.SGDPlan.select(s["stream"], gp.SGDDescriptor(n, np.float32, grad_dtype, lowp))
    s["scratch2"] = cp.empty_like(s["scratch"])
    return s


def _adamw(s: dict) -> None:
    s["adamw"].run(s["stream"], None, gp.AdamWArgs(s["p"], s["g"], s["m"], s["v"], step=10,
                                                   param_lowp=s["low"], **HP))


def _sgd(s: dict) -> None:
    s["sgd"].run(s["stream"], None, gp.SGDArgs(s["p"], s["g"], s["buf"], lr=0.01, momentum=0.9,
                                               weight_decay=1e-4, param_lowp=s["low"]))


def _copy(s: dict) -> None:
    s["scratch2"][...] = s["scratch"]


def _multi_setup() -> dict:
    import cupy as cp

    assert sum(GPT2_SIZES) == N_PARAMS
    rng = cp.random.default_rng(0)
    stream = gp.Stream.current()
    plan = gp.AdamWMultiTensorPlan.select(stream, gp.AdamWMultiTensorDescriptor(GPT2_SIZES))
    return {"ps": [rng.standard_normal(k, dtype=cp.float32) for k in GPT2_SIZES],
            "gs": [rng.standard_normal(k, dtype=cp.float32) for k in GPT2_SIZES],
            "ms": [cp.zeros(k, cp.float32) for k in GPT2_SIZES],
            "vs": [cp.zeros(k, cp.float32) for k in GPT2_SIZES],
            "plan": plan, "stream": stream,
            "ws": gp.Workspace.allocate(stream, plan.workspace_size())}


def _multi(s: dict) -> None:
    s["plan"].run(s["stream"], s["ws"], gp.AdamWMultiTensorArgs(
        s["ps"], s["gs"], s["ms"], s["vs"], step=10, **HP))


def _per_tensor_setup() -> dict:
    s = _multi_setup()
    s["plans"] = [gp.AdamWPlan.select(s["stream"], gp.AdamWDescriptor(k)) for k in GPT2_SIZES]
    return s


def _per_tensor(s: dict) -> None:
    for k, plan in enumerate(s["plans"]):
        plan.run(s["stream"], None, gp.AdamWArgs(s["ps"][k], s["gs"][k], s["ms"][k], s["vs"][k],
                                                 None, step=10, **HP))


# bytes per parameter: AdamW reads p, g, m, v and writes p, m, v (f32: 28 B; bf16 grad: 26 B,
# +2 B for a bf16 weight copy); SGD with momentum reads p, g, buf and writes p, buf (20 B).
CASES = [
    Case("adamw_124M_f32", lambda: _flat_setup(np.float32), _adamw, bytes_moved=28 * N_PARAMS,
         flops=14 * N_PARAMS, baseline=_copy, baseline_name="cupy D2D copy, same bytes"),
    Case("adamw_124M_bf16grad_bf16copy", lambda: _flat_setup(gp.bfloat16, gp.bfloat16), _adamw,
         bytes_moved=28 * N_PARAMS, flops=14 * N_PARAMS, baseline=_copy,
         baseline_name="cupy D2D copy, same bytes"),
    Case("adamw_gpt2_multi_tensor", _multi_setup, _multi, bytes_moved=28 * N_PARAMS,
         flops=14 * N_PARAMS, baseline=_per_tensor, baseline_name="one AdamWPlan per tensor"),
    Case("sgd_momentum_124M_f32", lambda: _flat_setup(np.float32, bytes_per_param=20), _sgd,
         bytes_moved=20 * N_PARAMS, flops=6 * N_PARAMS, baseline=_copy,
         baseline_name="cupy D2D copy, same bytes"),
]
