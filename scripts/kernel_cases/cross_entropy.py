"""Cross-entropy forward (loss per reduction and the saved lse; warp-per-row for vocab <= 1024,
block-per-row beyond, and the fixed-order mean/sum reduction) and backward (dlogits, with the
ignored-row count for "mean") on the emulated device, int32 and int64 targets, against the
family's NumPy implementation run in float64 on the same rounded inputs."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import accumulator
from kernel_cases.common import (
    DTYPES,
    Case,
    check,
    dtype_id,
    emu,
    f64,
    random,
    run_emulated,
    run_reference,
)

IGNORE = -100
F64 = np.float64
# (n, vocab, variant): a warp per row, and a block per row for vocab > 1024.
SHAPES = [(1, 1, "warp_row"), (7, 33, "warp_row"), (5, 1024, "warp_row"), (6, 1025, "block_row"),
          (3, 50257, "block_row")]


def _targets(n, v, index_dtype, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = rng.integers(0, v, size=n)
    t[::3] = IGNORE  # every third row ignored (row 0 included)
    return t.astype(index_dtype)


def forward(dtype, index_dtype, n, v, variant, reduction: str, smoothing: float) -> None:
    logits = random((n, v), dtype, seed=1, low=-6, high=6)
    target = _targets(n, v, index_dtype)
    acc = accumulator(dtype)
    shape = (n,) if reduction == "none" else ()
    loss, lse = emu(np.full(shape, 7, acc)), emu(np.full(n, 7, acc))
    plan = run_emulated(gp.CrossEntropyPlan,
                        gp.CrossEntropyDescriptor(n, v, IGNORE, reduction, smoothing, dtype),
                        gp.CrossEntropyArgs(emu(logits), emu(target), loss, lse))
    assert plan.sku().variant == variant, plan.sku()
    rloss, rlse = np.zeros(shape), np.zeros(n)
    run_reference(gp.CrossEntropyPlan,
                  gp.CrossEntropyDescriptor(n, v, IGNORE, reduction, smoothing, F64),
                  gp.CrossEntropyArgs(f64(logits), target, rloss, rlse))
    check(lse, rlse, acc, "cross_entropy lse", scale=4.0)
    check(loss, rloss, acc, f"cross_entropy loss ({reduction})", scale=8.0)


def backward(dtype, index_dtype, n, v, reduction: str, smoothing: float) -> None:
    logits = random((n, v), dtype, seed=2, low=-4, high=4)
    target = _targets(n, v, index_dtype, seed=1)
    acc = accumulator(dtype)
    # The saved lse as the forward stores it (acc dtype); both runs get these bits.
    rlse = np.zeros(n)
    run_reference(gp.CrossEntropyPlan, gp.CrossEntropyDescriptor(n, v, IGNORE, "none", 0.0, F64),
                  gp.CrossEntropyArgs(f64(logits), target, np.zeros(n), rlse))
    lse = rlse.astype(acc)
    dloss = random((n,), acc, seed=3) if reduction == "none" else np.asarray(1.7, acc)
    dlogits = emu(np.full((n, v), 7, dtype))
    run_emulated(gp.CrossEntropyBackwardPlan,
                 gp.CrossEntropyBackwardDescriptor(n, v, IGNORE, reduction, smoothing, dtype),
                 gp.CrossEntropyBackwardArgs(emu(logits), emu(target), emu(lse), emu(dloss),
                                             dlogits))
    ref = np.zeros((n, v))
    run_reference(gp.CrossEntropyBackwardPlan,
                  gp.CrossEntropyBackwardDescriptor(n, v, IGNORE, reduction, smoothing, F64),
                  gp.CrossEntropyBackwardArgs(f64(logits), target, f64(lse), f64(dloss), ref))
    ignored = target == IGNORE
    np.testing.assert_array_equal(
        f64(dlogits)[ignored], 0.0, err_msg=f"cross_entropy_backward ignored rows "
        f"[{dtype_id(dtype)}]")
    check(dlogits, ref, dtype, f"cross_entropy_backward dlogits ({reduction})", scale=4.0)


def _it(index_dtype) -> str:
    return np.dtype(index_dtype).name


CASES = (
    # Every reduction on both variants; "mean" and "sum" launch ce_reduce<acc, index>.
    [Case(f"forward {n}x{v} {red} ls={ls} [{dtype_id(t)},{_it(i)}]",
          lambda t=t, i=i, n=n, v=v, var=var, red=red, ls=ls: forward(t, i, n, v, var, red, ls))
     for t in DTYPES for i in (np.int32, np.int64) for n, v, var in SHAPES
     for red, ls in (("none", 0.0), ("mean", 0.1), ("sum", 0.0))]
    # "mean" launches ce_count<index> before ce_backward.
    + [Case(f"backward {n}x{v} {red} ls={ls} [{dtype_id(t)},{_it(i)}]",
            lambda t=t, i=i, n=n, v=v, red=red, ls=ls: backward(t, i, n, v, red, ls))
       for t in DTYPES for i in (np.int32, np.int64) for n, v, _ in SHAPES
       for red, ls in (("none", 0.2), ("mean", 0.0), ("sum", 0.2))]
)
