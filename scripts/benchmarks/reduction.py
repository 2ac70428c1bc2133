"""Reduction benchmarks: sums and max over last/leading/all/strided axes of 8192x8192 bf16
and f32, and the one-launch global L2 norm of a GPT-sized parameter list, against CuPy."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from scripts.benchmarks.common import Case, device_array, plan_state, random_host, run_plan_state

ROWS, COLS = 8192, 8192


def _reduce(op: str, dtype, shape: tuple, axes, label: str) -> Case:
    desc = gp.ReduceDescriptor(op, shape, axes, False, dtype)

    def setup() -> dict:
        import cupy as cp

        x = device_array(random_host(shape, dtype))
        y = cp.empty(desc.out_shape(), dtype=dtype)
        return plan_state(gp.ReducePlan, desc, gp.ReduceArgs(x, y), x=x, y=y, axes=axes)

    def baseline(s: dict) -> None:
        import cupy as cp

        fn = {"sum": cp.sum, "mean": cp.mean, "max": cp.max}[op]
        fn(s["x"], axis=s["axes"], out=s["y"])

    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return Case(f"{op}_{label}_{gp.dtypes.short_name(dtype)}_{'x'.join(map(str, shape))}",
                setup, run_plan_state, bytes_moved=nbytes, baseline=baseline,
                baseline_name=f"cupy.{op}")


# A 350M-parameter-like list: per layer two [1024, 4096] and two [1024, 1024] matrices
# plus vectors, 24 layers, and an embedding.
_NORM_SHAPES = [(50304, 1024)] + [s for _ in range(24) for s in
                                  ((1024, 4096), (4096, 1024), (1024, 3072), (1024, 1024),
                                   (4096,), (1024,), (1024,), (1024,))]


def _global_norm(dtype) -> Case:
    def setup() -> dict:
        import cupy as cp

        arrays = tuple(device_array(random_host(s, dtype, seed=i))
                       for i, s in enumerate(_NORM_SHAPES))
        acc = np.float64 if np.dtype(dtype) == np.float64 else np.float32
        out = cp.empty((), dtype=acc)
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
            _reduce("mean", dtype, (64, 128, 1024), (0, 2), "strided"),
            _reduce("sum", dtype, (256, 32, COLS), 1, "middle"),
        ]
        cases.append(_global_norm(dtype))
    return cases


CASES = _cases()
