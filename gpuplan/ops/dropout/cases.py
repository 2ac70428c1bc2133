"""Dropout forward, backward and keep mask on the emulated device. The mask is compared
exactly with the host Philox implementation (specified bit-identical); forward/backward
values against float64 math at the dtype's tolerance, and bit for bit against the host SKU
(documented identical up to flushed subnormal products, which these inputs cannot make)."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.dropout.plans import keep_mask_host
from gpuplan.testing import (
    DTYPES,
    Case,
    check,
    dtype_id,
    f64,
    host,
    place,
    random,
    run_emulated,
    run_plan,
)

N = 1027  # 256 full vector groups and a partial last group (scalar tail); > one block
P = 0.3
SEED, OFFSET = 0xDEADBEEFCAFEF00D, 2**64 - 100  # counters wrap past 2**64 inside the launch


def _bits_equal(actual, expected: np.ndarray, what: str) -> None:
    a, e = np.ascontiguousarray(host(actual)), np.ascontiguousarray(expected)
    assert a.dtype == e.dtype, (what, a.dtype, e.dtype)
    np.testing.assert_array_equal(a.view(np.uint8), e.view(np.uint8),
                                  err_msg=f"{what}: device bits differ from the host SKU's")


def apply(dtype, backward: bool, misaligned: bool) -> None:
    # forward and backward share the descriptor; (seed, offset) are run arguments
    plan_cls, args_cls = ((gp.DropoutBackwardPlan, gp.DropoutBackwardArgs) if backward
                          else (gp.DropoutPlan, gp.DropoutArgs))
    desc = gp.DropoutDescriptor(N, P, dtype)
    x = random((N,), dtype, seed=1 + backward, low=0.25, high=2.0)  # no zeros: mask readable
    x[1::2] *= -1
    y = place(np.full((N,), 7, dtype), misaligned)
    plan = run_emulated(plan_cls, desc,
                        args_cls(place(x, misaligned), y, seed=SEED, offset=OFFSET))
    assert plan.sku().variant == "philox", plan.sku()
    keep = keep_mask_host(N, P, SEED, OFFSET)
    what = "dropout backward" if backward else "dropout"
    np.testing.assert_array_equal(host(y) != 0, keep, err_msg=f"{what}: keep mask differs")
    check(y, np.where(keep, f64(x) / (1.0 - P), 0.0), dtype, what)
    expect = np.zeros((N,), dtype)
    run_plan(plan_cls, desc, args_cls(x, expect, seed=SEED, offset=OFFSET), "cpu")
    _bits_equal(y, expect, what)


def mask(misaligned: bool) -> None:
    m = place(np.zeros((N,), np.bool_), misaligned)
    plan = run_emulated(gp.DropoutMaskPlan, gp.DropoutMaskDescriptor(N, P),
                        gp.DropoutMaskArgs(m, seed=SEED, offset=OFFSET))
    assert plan.sku().variant == "philox", plan.sku()
    np.testing.assert_array_equal(host(m), keep_mask_host(N, P, SEED, OFFSET),
                                  err_msg="dropout mask differs from the host Philox mask")


def _layout(misaligned: bool) -> str:
    return "misaligned" if misaligned else "aligned"


CASES = (
    [Case(f"{'backward' if b else 'forward'} {_layout(m)}[{dtype_id(t)}]",
          lambda t=t, b=b, m=m: apply(t, b, m))
     for t in DTYPES for b in (False, True) for m in (False, True)]
    + [Case(f"mask {_layout(m)}", lambda m=m: mask(m)) for m in (False, True)]
)
