"""Optimizer-step benchmarks: AdamW (single and multi-tensor) and SGD over 124M f32 params
(GPT-2 small's tensors; smoke: the same list for a 2-layer, width-48 GPT-2, 84K params)."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from benchsuite.kernels.common import Case, device_array, empty, size, zeros


def _gpt2_sizes(vocab: int, ctx: int, embd: int, layers: int) -> tuple[int, ...]:
    """GPT-2's parameter tensors: embeddings, then per block ln_1, attn c_attn, attn c_proj,
    ln_2, mlp c_fc and mlp c_proj (weight, bias each), then the final LayerNorm."""
    e = embd
    block = [e, e, e * 3 * e, 3 * e, e * e, e, e, e, e * 4 * e, 4 * e, 4 * e * e, e]
    return tuple([vocab * e, ctx * e] + block * layers + [e, e])


N_PARAMS = size(124_439_808, 83_856)  # GPT-2 small (smoke: vocab 503, ctx 64, width 48, 2 layers)
GPT2_SIZES = _gpt2_sizes(*size((50257, 1024, 768, 12), (503, 64, 48, 2)))
LABEL = f"{N_PARAMS / 1e6:.0f}M" if N_PARAMS >= 1_000_000 else f"{N_PARAMS / 1e3:.0f}K"
HP = dict(lr=3e-4, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def _normal(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n, dtype=np.float32)


def _flat_setup(grad_dtype, lowp=None, bytes_per_param=28) -> dict:
    n = N_PARAMS
    rng = np.random.default_rng(0)
    s = {"p": device_array(_normal(rng, n)), "m": zeros(n, np.float32),
         "v": zeros(n, np.float32), "buf": zeros(n, np.float32),
         "g": device_array(_normal(rng, n).astype(grad_dtype)),
         "low": None if lowp is None else empty(n, lowp),
         "stream": gp.Stream.current(),
         # the copy baseline reads and writes as many bytes as the step moves
         "scratch": empty(n * bytes_per_param // 2, np.uint8)}
    s["adamw"] = gp.AdamWPlan.select(s["stream"], gp.AdamWDescriptor(n, np.float32, grad_dtype,
                                                                      lowp))
    s["sgd"] = gp.SGDPlan.select(s["stream"], gp.SGDDescriptor(n, np.float32, grad_dtype, lowp))
    s["scratch2"] = empty(s["scratch"].shape, np.uint8)
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
    assert sum(GPT2_SIZES) == N_PARAMS
    rng = np.random.default_rng(0)
    stream = gp.Stream.current()
    plan = gp.AdamWMultiTensorPlan.select(stream, gp.AdamWMultiTensorDescriptor(GPT2_SIZES))
    return {"ps": [device_array(_normal(rng, k)) for k in GPT2_SIZES],
            "gs": [device_array(_normal(rng, k)) for k in GPT2_SIZES],
            "ms": [zeros(k, np.float32) for k in GPT2_SIZES],
            "vs": [zeros(k, np.float32) for k in GPT2_SIZES],
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
    Case(f"adamw_{LABEL}_f32", lambda: _flat_setup(np.float32), _adamw, bytes_moved=28 * N_PARAMS,
         flops=14 * N_PARAMS, baseline=_copy, baseline_name="cupy D2D copy, same bytes"),
    Case(f"adamw_{LABEL}_bf16grad_bf16copy", lambda: _flat_setup(gp.bfloat16, gp.bfloat16), _adamw,
         bytes_moved=28 * N_PARAMS, flops=14 * N_PARAMS, baseline=_copy,
         baseline_name="cupy D2D copy, same bytes"),
    Case("adamw_gpt2_multi_tensor", _per_tensor_setup, _multi, bytes_moved=28 * N_PARAMS,
         flops=14 * N_PARAMS, baseline=_per_tensor, baseline_name="one AdamWPlan per tensor",
         baseline_gpu_only=False),
    Case(f"sgd_momentum_{LABEL}_f32", lambda: _flat_setup(np.float32, bytes_per_param=20), _sgd,
         bytes_moved=20 * N_PARAMS, flops=6 * N_PARAMS, baseline=_copy,
         baseline_name="cupy D2D copy, same bytes"),
]
