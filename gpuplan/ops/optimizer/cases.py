"""Fused optimizer steps on the emulated device over several steps: AdamW (one tensor, and many
tensors in one launch), SGD (plain, weight decay, momentum with dampening, Nesterov), every
(param, grad) dtype pair and low-precision copy, against the families' float64 references
(gpuplan.testing.adamw_reference / sgd_reference) from the same rounded initial state and
gradients. Every output is compared: params, both moments / the momentum buffer, and the
f16/bf16 weight copies."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import bfloat16, float16, float32, float64
from gpuplan.ops.optimizer.reference import adamw_reference, sgd_reference
from gpuplan.testing import Case, check, dtype_id, emu, f64, host, random, run_emulated

PAIRS = [(float32, float32), (float32, float16), (float32, bfloat16), (float64, float64)]
# lowp None runs the <.., __nv_bfloat16> instance with write_lowp = 0.
LOWP = (None, float16, bfloat16)
HP = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
N = 1000  # 4 blocks of 256 threads
STEPS = 3


def _state(n, dtype, seed=0):
    p = random((n,), dtype, seed=seed)
    m = random((n,), dtype, seed=seed + 1, low=-0.1, high=0.1)
    v = random((n,), dtype, seed=seed + 2, low=0.0, high=0.01)
    return p, m, v


def _check_lowp(low, p_emu, ref_p, lowp, pdt, what: str) -> None:
    check(low, ref_p, lowp, f"{what} param_lowp")
    # The copy is the updated weights rounded to nearest even (f64 weights: rounded once,
    # as NumPy / ml_dtypes round f64 directly).
    np.testing.assert_array_equal(
        host(low).view(np.uint16), host(p_emu).astype(lowp).view(np.uint16),
        err_msg=f"{what} param_lowp bits [{dtype_id(pdt)}->{dtype_id(lowp)}]")


def adamw(pdt, gdt, lowp) -> None:
    p, m, v = _state(N, pdt)
    dp, dm, dv = emu(p), emu(m), emu(v)
    rp, rm, rv = f64(p), f64(m), f64(v)
    dl = None if lowp is None else emu(np.zeros((N,), lowp))
    desc = gp.AdamWDescriptor(N, pdt, gdt, lowp)
    for step in range(1, STEPS + 1):
        g = random((N,), gdt, seed=10 + step)
        plan = run_emulated(gp.AdamWPlan, desc,
                            gp.AdamWArgs(dp, emu(g), dm, dv, step=step, param_lowp=dl, **HP))
        rp, rm, rv = adamw_reference(rp, g, rm, rv, step=step, **HP)
    assert plan.sku().variant == "fused", plan.sku()
    check(dp, rp, pdt, "adamw param", scale=4.0)
    check(dm, rm, pdt, "adamw exp_avg", scale=4.0)
    check(dv, rv, pdt, "adamw exp_avg_sq", scale=4.0)
    if lowp is not None:
        _check_lowp(dl, dp, rp, lowp, pdt, "adamw")


def adamw_multi(pdt, gdt, lowp) -> None:
    # empty, tiny, one full 16384-element chunk and one crossing into a second chunk
    sizes = (0, 1, 5, 16384, 16390, 3000)
    states = [_state(n, pdt, seed=3 * k) for k, n in enumerate(sizes)]
    dev = [tuple(emu(a) for a in s) for s in states]
    refs = [tuple(f64(a) for a in s) for s in states]
    lows = None if lowp is None else [emu(np.zeros((n,), lowp)) for n in sizes]
    desc = gp.AdamWMultiTensorDescriptor(sizes, pdt, gdt, lowp)
    for step in range(1, STEPS + 1):
        grads = [random((n,), gdt, seed=100 * step + k) for k, n in enumerate(sizes)]
        run_emulated(gp.AdamWMultiTensorPlan, desc, gp.AdamWMultiTensorArgs(
            [d[0] for d in dev], [emu(g) for g in grads], [d[1] for d in dev],
            [d[2] for d in dev], step=step, params_lowp=lows, **HP))
        refs = [adamw_reference(r[0], g, r[1], r[2], step=step, **HP)
                for r, g in zip(refs, grads, strict=True)]
    for k, (d, r) in enumerate(zip(dev, refs, strict=True)):
        for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), d, r, strict=True):
            check(a, b, pdt, f"adamw_multi_tensor tensor {k} ({sizes[k]}) {name}", scale=4.0)
        if lows is not None:
            _check_lowp(lows[k], d[0], r[0], lowp, pdt, f"adamw_multi_tensor tensor {k}")


SGD_HP = [
    dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    dict(momentum=0.0, dampening=0.0, weight_decay=0.05, nesterov=False),
    dict(momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False),
    dict(momentum=0.8, dampening=0.0, weight_decay=0.05, nesterov=True),
]


def sgd(pdt, gdt, lowp, hp) -> None:
    p = random((N,), pdt, seed=1)
    buf0 = random((N,), pdt, seed=2)  # garbage: the first step must overwrite it
    dp, rp = emu(p), f64(p)
    dbuf, rbuf = (emu(buf0), f64(buf0)) if hp["momentum"] else (None, None)
    dl = None if lowp is None else emu(np.zeros((N,), lowp))
    desc = gp.SGDDescriptor(N, pdt, gdt, lowp)
    for step in range(1, STEPS + 1):
        g = random((N,), gdt, seed=20 + step)
        run_emulated(gp.SGDPlan, desc, gp.SGDArgs(dp, emu(g), dbuf, lr=0.05,
                                                  first_step=step == 1, param_lowp=dl, **hp))
        rp, rbuf = sgd_reference(rp, g, rbuf, lr=0.05, first_step=step == 1, **hp)
    check(dp, rp, pdt, "sgd param", scale=4.0)
    if hp["momentum"]:
        check(dbuf, rbuf, pdt, "sgd momentum_buf", scale=4.0)
    if lowp is not None:
        _check_lowp(dl, dp, rp, lowp, pdt, "sgd")


def _hp_id(hp) -> str:
    if hp["nesterov"]:
        return "nesterov"
    return "momentum" if hp["momentum"] else ("wd" if hp["weight_decay"] else "plain")


CASES = (
    [Case(f"adamw [{dtype_id(p)},{dtype_id(g)},lowp={low and dtype_id(low)}]",
          lambda p=p, g=g, low=low: adamw(p, g, low)) for p, g in PAIRS for low in LOWP]
    + [Case(f"adamw_multi_tensor [{dtype_id(p)},{dtype_id(g)},lowp={low and dtype_id(low)}]",
            lambda p=p, g=g, low=low: adamw_multi(p, g, low)) for p, g in PAIRS for low in LOWP]
    # every SGD variant on every pair; the low-precision copy cycles through None/f16/bf16
    + [Case(f"sgd {_hp_id(hp)} [{dtype_id(p)},{dtype_id(g)},lowp={low and dtype_id(low)}]",
            lambda p=p, g=g, low=low, hp=hp: sgd(p, g, low, hp))
       for p, g in PAIRS for k, hp in enumerate(SGD_HP) for low in (LOWP[k % 3],)]
)
