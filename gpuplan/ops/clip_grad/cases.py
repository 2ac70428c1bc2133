"""Gradient clipping on the emulated device (clip_grad.cu's clip_grad_scale after
reduction.cu's global_l2_norm, and with a given total norm) against the family's float64
reference (gpuplan.ops.clip_grad.reference; the norm's is the reduction family's): the norm,
and every gradient scaled by max_norm / (norm + eps) when that is below 1, unchanged
otherwise. Lists mix dtypes (a float64 gradient makes the norm f64: the double instance)
and span several NORM_CHUNK chunks. The norm's extremes: values whose squares overflow or
underflow their dtype (global_l2_norm's scaled sums), and NaN/inf that must propagate."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import bfloat16, float16
from gpuplan.ops.clip_grad.reference import clip_grad_norm_reference
from gpuplan.ops.reduction.launch import NORM_CHUNK
from gpuplan.ops.reduction.reference import global_l2_norm_reference
from gpuplan.testing import Case, check, emu, host, random, stream

MIXED32 = ((np.float32, 37), (float16, NORM_CHUNK + 5), (bfloat16, 300), (np.float32, 1))
MIXED64 = ((np.float64, 2 * NORM_CHUNK + 3), (np.float32, 50), (bfloat16, 7))


def clip(specs: tuple, max_norm: float, given: float | None) -> None:
    grads = [random((n,), t, seed=i, low=-2, high=2) for i, (t, n) in enumerate(specs)]
    total, want, coef = clip_grad_norm_reference(grads, max_norm, total_norm=given)
    dev = [emu(g.copy()) for g in grads]
    out = gp.functional.clip_grad_norm_(dev, max_norm, total_norm=given)
    stream().synchronize()
    norm_dtype = np.float64 if any(t == np.float64 for t, _ in specs) else np.float32
    assert out.dtype == norm_dtype, out.dtype
    check(out, np.float64(total), norm_dtype, "clip_grad_norm norm", scale=4)
    for g, d, w, (t, _) in zip(grads, dev, want, specs, strict=True):
        if coef == 1:
            np.testing.assert_array_equal(host(d), g)
        else:
            check(d, w, t, f"clip_grad_norm scaled [{np.dtype(t).name}]", scale=2)


CASES = [
    Case(f"clip {name} max_norm={m} given={given}",
         lambda specs=specs, m=m, given=given: clip(specs, m, given))
    for name, specs in (("mixed32", MIXED32), ("mixed64", MIXED64))
    for m, given in ((1.0, None), (1e6, None), (2.5, 40.0), (2.5, 1.0))
]


def extreme_norm(name: str) -> None:
    n = NORM_CHUNK + 9
    arrays = {
        "f32 1e20": [np.full(n, 1e20, np.float32), np.full(5, -3e19, np.float32)],
        "f32 1e-30": [np.full(n, 1e-30, np.float32), np.full(3, 1e-41, np.float32)],
        "f64 1e250 + 1e-300": [np.array([1e200, -3e250, 1e-300, 2.0, 1e-200] * 9000)],
        "f64 tiny only": [np.array([1e-300, -3e-310, 1e-200] * 7000)],
    }[name]
    norm_dtype = np.float64 if any(a.dtype == np.float64 for a in arrays) else np.float32
    want = global_l2_norm_reference(arrays)  # scaled, float64
    out = gp.functional.global_l2_norm([emu(a) for a in arrays])
    stream().synchronize()
    check(out, np.float64(want), norm_dtype, f"global_l2_norm {name}", scale=4)


def nonfinite_norm(dtype: type, bad: float) -> None:
    a = np.full(NORM_CHUNK + 3, 1e20, dtype)
    a[NORM_CHUNK + 1] = bad
    small = np.full(4, 1e-30, dtype)
    got = float(host(gp.functional.global_l2_norm([emu(small), emu(a)])))
    want = global_l2_norm_reference([small, a])
    assert (np.isnan(got) if np.isnan(want) else got == want), (dtype, bad, got)


CASES += [Case(f"global_l2_norm extreme {name}", lambda name=name: extreme_norm(name))
          for name in ("f32 1e20", "f32 1e-30", "f64 1e250 + 1e-300", "f64 tiny only")]
CASES += [Case(f"global_l2_norm {bad} [{np.dtype(t).name}]",
               lambda t=t, bad=bad: nonfinite_norm(t, bad))
          for t in (np.float32, np.float64) for bad in (np.nan, np.inf)]
