"""Reduction benchmarks: sums and max over last/leading/all/strided axes of 8192x8192 bf16
and f32, and the one-launch global L2 norm of a GPT-sized parameter list, against CuPy.
Smoke: 192x1000 and a 2-layer list of width 64."""

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
STRIDED = size((64, 128, 1024), (6, 40, 520))  # mean over axes (0, 2)
MIDDLE = size((256, 32, COLS), (12, 16, COLS))  # sum over axis 1


def _reduce(op: str, dtype, shape: tuple, axes, label: str) -> Case:
    desc = gp.ReduceDescriptor(op, shape, axes, False, dtype)

    def setup() -> dict:
        x = random_device(shape, dtype)
        y = empty(desc.out_shape(), dtype)
        return plan_state(gp.ReducePlan, desc, gp.ReduceArgs(x, y), x=x, y=y, axes=axes)

    def baseline(s: dict) -> None:
        import cupy as cp

        fn = {"sum": cp.sum, "mean": cp.mean, "max": cp.max}[op]
        fn(s["x"], axis=s["axes"], out=s["y"])

    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return Case(f"{op}_{label}_{gp.dtypes.short_name(dtype)}_{'x'.join(map(str, shape))}",
                setup, run_plan_state, bytes_moved=nbytes, baseline=baseline,
                baseline_name=f"cupy.{op}")


def _norm_shapes(vocab: int, width: int, layers: int) -> list[tuple]:
    """An embedding, then per layer [w, 4w], [4w, w], [w, 3w] and [w, w] matrices and four
    vectors."""
    w = width
    layer = ((w, 4 * w), (4 * w, w), (w, 3 * w), (w, w), (4 * w,), (w,), (w,), (w,))
    return [(vocab, w)] + [s for _ in range(layers) for s in layer]


# A 350M-parameter-like list: 24 layers of width 1024 (smoke: 2 of width 64).
_NORM_SHAPES = _norm_shapes(*size((50304, 1024, 24), (1000, 64, 2)))


def _global_norm(dtype) -> Case:
    def setup() -> dict:
        arrays = tuple(random_device(s, dtype, seed=i)
                       for i, s in enumerate(_NORM_SHAPES))
        acc = np.float64 if np.dtype(dtype) == np.float64 else np.float32
        out = empty((), acc)
        desc = gp.GlobalNormDescriptor(tuple(a.size for a in arrays),
                                       tuple(np.dtype(a.dtype) for a in arrays))
        return plan_state(gp.GlobalNormPlan, desc, gp.GlobalNormArgs(arrays, out),
                          arrays=arrays)

    def baseline(s: dict) -> None:
        import cupy as cp

        total = cp.zeros((), dtype=cp.float32)
        for a in s["arrays"]:
            af = a.astype(cp.float32, copy=False)
            total += cp.sum(af * af)
        cp.sqrt(total)

    nbytes = sum(int(np.prod(s)) for s in _NORM_SHAPES) * np.dtype(dtype).itemsize
    return Case(f"global_l2_norm_{gp.dtypes.short_name(dtype)}_{len(_NORM_SHAPES)}tensors",
                setup, run_plan_state, bytes_moved=nbytes, baseline=baseline,
                baseline_name="cupy per-tensor sum of squares")


def _cases() -> list[Case]:
    cases: list[Case] = []
    for dtype in (gp.bfloat16, np.float32):
        cases += [
            _reduce("sum", dtype, (ROWS, COLS), 1, "rows"),
            _reduce("sum", dtype, (ROWS, COLS), 0, "cols"),
            _reduce("sum", dtype, (ROWS, COLS), None, "all"),
            _reduce("max", dtype, (ROWS, COLS), 1, "rows"),
            _reduce("mean", dtype, STRIDED, (0, 2), "strided"),
            _reduce("sum", dtype, MIDDLE, 1, "middle"),
        ]
        cases.append(_global_norm(dtype))
    return cases


CASES = _cases()
