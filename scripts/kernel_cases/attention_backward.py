"""Fused attention backward on the emulated device, SIMT kernels (attention_backward.cu:
delta, dk/dv and dq for every dtype and head-dim chunk count) against the float64 chain
rule (gpuplan.testing_attention.attention_backward_reference) on the same rounded inputs,
with and without dropout.
o and lse are the float64 forward rounded as a caller holds them."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.testing import f64, tol
from gpuplan.testing_attention import attention_backward_reference, attention_reference
from kernel_cases.attention import (
    DROP_OFFSET,
    DROP_SEED,
    SCALE,
    SIMT,
    SIMT_DROP,
    _name,
    drop_name,
    drop_of,
    operands,
    place,
    variant_of,
)
from kernel_cases.common import DTYPES, Case, emu, run_emulated


def check_grad(got, ref: np.ndarray, dtype, what: str) -> None:
    """Elementwise at 8x the dtype's tolerance, atol relative to the largest |gradient|: an
    entry is a sum of up to L terms as large as the largest entries (rounded in the input
    dtype where the tensor cores take P and dS), so its error scales with them."""
    rtol, atol = tol(dtype, 8.0)
    atol *= max(1.0, float(np.abs(ref).max(initial=0.0)))
    np.testing.assert_allclose(f64(got), ref, rtol=rtol, atol=atol, err_msg=what)


def backward(dtype, b: int, lq: int, lk: int, dim: int, causal: bool,
             aligned: bool = True, p: float = 0.0) -> None:
    q, k, v, dout = operands(b, lq, lk, dim, dtype, seed=5)
    drop = drop_of(b, lq, lk, p)
    ref_o, ref_lse = attention_reference(q, k, v, SCALE, causal, drop)
    o = ref_o.astype(dtype)
    lse = ref_lse.astype(np.float64 if dtype == np.float64 else np.float32)
    desc = gp.AttentionDescriptor(b, lq, lk, dim, SCALE, causal, dtype, p)
    grads = [emu(np.full(a.shape, 7, dtype)) for a in (q, k, v)]
    inputs = [place(a, aligned) for a in (q, k, v, o)] + [emu(lse), place(dout, aligned)]
    plan = run_emulated(gp.AttentionBackwardPlan, desc,
                        gp.AttentionBackwardArgs(*inputs, *grads, DROP_SEED, DROP_OFFSET),
                        gp.PlanPreference(deterministic=True, backend=gp.BackendKind.NVRTC))
    assert plan.sku().variant == variant_of(dim, dtype), plan.sku()
    refs = attention_backward_reference(q, k, v, dout, SCALE, causal, drop)
    what = f"attention_backward {b}x{lq}x{lk}x{dim}{' causal' if causal else ''} p={p}"
    for name, got, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        check_grad(got, ref, dtype, f"{what} {name}")


def drop_case(dtype, b, lq, lk, dim, causal, p) -> None:
    backward(dtype, b, lq, lk, dim, causal, True, p)


CASES = ([Case(_name("attention_backward", t, *shape), lambda t=t, s=shape: backward(t, *s))
          for t in DTYPES for shape in SIMT]
         + [Case(drop_name("attention_backward", t, *shape),
                 lambda t=t, s=shape: drop_case(t, *s)) for t in DTYPES for shape in SIMT_DROP])
