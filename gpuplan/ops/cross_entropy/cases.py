"""Cross-entropy forward (loss per reduction and the saved lse; warp-per-row for vocab <= 1024,
block-per-row beyond, and the fixed-order mean/sum reduction) and backward (dlogits, with the
ignored-row count for "mean") on the emulated device, int32 and int64 targets, and the
vocabulary-parallel stages (row max, exp-sum and target logit, finish, block backward) over
column blocks of one logits matrix, all against the float64 references of
gpuplan/ops/cross_entropy/reference.py on the same rounded inputs."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import accumulator
from gpuplan.ops.cross_entropy.reference import (
    cross_entropy_grad_reference,
    cross_entropy_over_blocks,
    cross_entropy_reduce_reference,
    cross_entropy_reference,
)
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, f64, random, run_emulated

IGNORE = -100
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
    rows, rlse = cross_entropy_reference(logits, target, smoothing, IGNORE)
    rloss = cross_entropy_reduce_reference(rows, target, reduction, IGNORE)
    check(lse, rlse, acc, "cross_entropy lse", scale=4.0)
    check(loss, rloss, acc, f"cross_entropy loss ({reduction})", scale=8.0)


def backward(dtype, index_dtype, n, v, reduction: str, smoothing: float) -> None:
    logits = random((n, v), dtype, seed=2, low=-4, high=4)
    target = _targets(n, v, index_dtype, seed=1)
    acc = accumulator(dtype)
    # The saved lse as the forward stores it (acc dtype); the reference recomputes it exactly.
    lse = cross_entropy_reference(logits, target, 0.0, IGNORE)[1].astype(acc)
    dloss = random((n,), acc, seed=3) if reduction == "none" else np.asarray(1.7, acc)
    dlogits = emu(np.full((n, v), 7, dtype))
    run_emulated(gp.CrossEntropyBackwardPlan,
                 gp.CrossEntropyBackwardDescriptor(n, v, IGNORE, reduction, smoothing, dtype),
                 gp.CrossEntropyBackwardArgs(emu(logits), emu(target), emu(lse), emu(dloss),
                                             dlogits))
    ref = cross_entropy_grad_reference(logits, target, smoothing, dloss, reduction, IGNORE)
    ignored = target == IGNORE
    np.testing.assert_array_equal(
        f64(dlogits)[ignored], 0.0, err_msg=f"cross_entropy_backward ignored rows "
        f"[{dtype_id(dtype)}]")
    check(dlogits, ref, dtype, f"cross_entropy_backward dlogits ({reduction})", scale=4.0)


def partial(dtype, index_dtype, n, v, count, reduction: str) -> None:
    """The partial stages over `count` column blocks (the host does the all-reduces)."""
    logits = random((n, v), dtype, seed=7, low=-6, high=6)
    target = _targets(n, v, index_dtype, seed=2)
    acc = accumulator(dtype)
    widths = [len(c) for c in np.array_split(np.arange(v), count)]
    starts = np.cumsum([0] + widths[:-1]).tolist()
    blocks = [emu(np.ascontiguousarray(logits[:, s:s + w]))
              for s, w in zip(starts, widths, strict=True)]
    t = emu(target)
    for b in blocks:  # ce_partial_max: exact
        np.testing.assert_array_equal(f64(gp.functional.cross_entropy_partial_max(b)),
                                      f64(b).max(axis=1) if b.shape[1] else -np.inf)
    loss, lse = cross_entropy_over_blocks(blocks, t, IGNORE, reduction)
    rows, rlse = cross_entropy_reference(logits, target, 0.0, IGNORE)
    check(lse, rlse, acc, "cross_entropy_finish lse", scale=4.0)
    check(loss, cross_entropy_reduce_reference(rows, target, reduction, IGNORE), acc,
          f"cross_entropy_finish loss ({reduction})", scale=8.0)
    dloss = random((n,), acc, seed=3) if reduction == "none" else np.asarray(1.7, acc)
    ref = cross_entropy_grad_reference(logits, target, 0.0, dloss, reduction, IGNORE)
    for b, s in zip(blocks, starts, strict=True):
        dl = gp.functional.cross_entropy_partial_backward(
            b, t, lse, emu(dloss), vocab_start=s, vocab_total=v, ignore_index=IGNORE,
            reduction=reduction)
        check(dl, ref[:, s:s + b.shape[1]], dtype,
              f"cross_entropy_partial_backward block at {s} ({reduction})", scale=4.0)


# (n, vocab, blocks): 3 columns over 4 blocks leave one empty.
PARTS = [(7, 33, 3), (6, 1025, 2), (5, 3, 4)]


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
    # The vocabulary-parallel stages: ce_partial_max, ce_partial, ce_finish (+ ce_reduce)
    # and ce_backward with a block offset.
    + [Case(f"partial {n}x{v}/{k} {red} [{dtype_id(t)},{_it(i)}]",
            lambda t=t, i=i, n=n, v=v, k=k, red=red: partial(t, i, n, v, k, red))
       for t in DTYPES for i in (np.int32, np.int64) for (n, v, k), red in
       zip(PARTS, ("mean", "none", "sum"), strict=True)]
)
