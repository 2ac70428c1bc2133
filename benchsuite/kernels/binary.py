"""Binary benchmarks: add (same shape), mul (broadcast row), mul backward with a broadcast
reduction and bias add on 8192x8192 bf16/f32 (smoke: 192x1000), in GB/s against CuPy."""

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

ROWS, COLS = size((8192, 8192), (192, 1000))
N = ROWS * COLS


def _size(dtype) -> int:
    return np.dtype(dtype).itemsize


def _binary(op: str, dtype, b_shape: tuple) -> Case:
    tag = f"{op}_{gp.dtypes.short_name(dtype)}_{ROWS}x{COLS}_b{'x'.join(map(str, b_shape))}"

    def setup() -> dict:
        a = random_device((ROWS, COLS), dtype)
        b = random_device(b_shape, dtype, seed=1)
        c = empty((ROWS, COLS), dtype)
        return plan_state(gp.BinaryPlan, gp.BinaryDescriptor(op, (ROWS, COLS), b_shape, dtype),
                          gp.BinaryArgs(a, b, c), a=a, b=b, c=c)

    def baseline(s: dict) -> None:
        import cupy as cp

        getattr(cp, {"add": "add", "sub": "subtract", "mul": "multiply",
                     "div": "divide"}[op])(s["a"], s["b"], out=s["c"])

    moved = (2 * N + int(np.prod(b_shape))) * _size(dtype)
    return Case(tag, setup, run_plan_state, bytes_moved=moved, baseline=baseline,
                baseline_name=f"cupy {op}")


def _binary_backward(dtype) -> Case:
    """mul with a broadcast [COLS] operand: da elementwise, db a column reduction."""

    def setup() -> dict:
        a = random_device((ROWS, COLS), dtype)
        b = random_device((COLS,), dtype, seed=1)
        dc = random_device((ROWS, COLS), dtype, seed=2)
        da, db = empty((ROWS, COLS), dtype), empty((COLS,), dtype)
        desc = gp.BinaryBackwardDescriptor("mul", (ROWS, COLS), (COLS,), dtype)
        return plan_state(gp.BinaryBackwardPlan, desc, gp.BinaryBackwardArgs(a, b, dc, da, db),
                          a=a, b=b, dc=dc, da=da, db=db)

    def baseline(s: dict) -> None:
        import cupy as cp

        cp.multiply(s["dc"], s["b"], out=s["da"])
        cp.sum(s["dc"] * s["a"], axis=0, out=s["db"])

    # reads a, dc (twice: once per gradient), writes da, and the f32 temp written+read for db
    moved = 4 * N * _size(dtype) + 2 * N * 4
    return Case(f"mul_bwd_{gp.dtypes.short_name(dtype)}_{ROWS}x{COLS}_b{COLS}", setup,
                run_plan_state, bytes_moved=moved, baseline=baseline,
                baseline_name="cupy multiply + sum(axis=0)")


def _bias_add(dtype) -> Case:
    def setup() -> dict:
        x = random_device((ROWS, COLS), dtype)
        bias = random_device((COLS,), dtype, seed=1)
        y = empty((ROWS, COLS), dtype)
        return plan_state(gp.BiasAddPlan, gp.BiasAddDescriptor(ROWS, COLS, dtype),
                          gp.BiasAddArgs(x, bias, y), x=x, bias=bias, y=y)

    def baseline(s: dict) -> None:
        import cupy as cp

        cp.add(s["x"], s["bias"], out=s["y"])

    return Case(f"bias_add_{gp.dtypes.short_name(dtype)}_{ROWS}x{COLS}", setup, run_plan_state,
                bytes_moved=2 * N * _size(dtype), baseline=baseline, baseline_name="cupy add")


def _cases() -> list[Case]:
    cases: list[Case] = []
    for dtype in (gp.bfloat16, np.float32):
        cases += [_binary("add", dtype, (ROWS, COLS)), _binary("mul", dtype, (COLS,)),
                  _binary_backward(dtype), _bias_add(dtype)]
    return cases


CASES = _cases()
