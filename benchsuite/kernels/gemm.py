"""GEMM benchmarks: 4096^3 in bf16, f16 and f32 through the cuBLAS and tiled SKUs vs cupy.matmul.

Smoke: 160^3 (one full 128-wide tensor-core tile and an edge tile per side; k spans more
k-tiles than the pipeline has stages). cuBLAS does not run on the emulated device: there a
cuBLAS case runs the tiled SKU on its own operands, and its row says so (``note``).
"""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from benchsuite.kernels.common import (
    Case,
    empty,
    emulated,
    plan_state,
    random_device,
    run_plan_state,
    size,
)

SIZE = size(4096, 160)
EMULATED_CUBLAS_NOTE = "tiled SKU: cuBLAS does not run on the emulated device"


def _setup(dtype, backend: gp.BackendKind, m: int = SIZE, n: int = SIZE, k: int = SIZE,
           trans_a: bool = False, trans_b: bool = False):
    def setup() -> dict:
        desc = gp.GemmDescriptor(m, n, k, trans_a=trans_a, trans_b=trans_b,
                                 broadcast_a=True, broadcast_b=True, dtype=dtype)
        # Unit-variance inputs scaled by 1/sqrt(k) keep the f16 outputs far from overflow.
        a = random_device(desc.a_shape(), dtype, seed=1, scale=k ** -0.5)
        b = random_device(desc.b_shape(), dtype, seed=2)
        c = empty(desc.c_shape(), dtype)
        extra = {}
        sku = backend
        if backend is gp.BackendKind.CUBLAS and emulated():
            sku, extra["note"] = gp.BackendKind.NVRTC, EMULATED_CUBLAS_NOTE
        return plan_state(gp.GemmPlan, desc, gp.GemmArgs(a, b, c),
                          gp.PlanPreference(backend=sku), a=a, b=b, c=c,
                          trans_a=trans_a, trans_b=trans_b, **extra)
    return setup


def _cupy_matmul(st: dict) -> None:
    import cupy

    a = st["a"].T if st["trans_a"] else st["a"]
    b = st["b"].T if st["trans_b"] else st["b"]
    with st["stream"].cuda_stream:
        cupy.matmul(a, b, out=st["c"])


def _case(tag: str, dtype, backend: gp.BackendKind, m: int = SIZE, n: int = SIZE,
          k: int = SIZE, trans_a: bool = False, trans_b: bool = False) -> Case:
    flags = ("t" if trans_a else "n") + ("t" if trans_b else "n")
    sku = "cublas" if backend is gp.BackendKind.CUBLAS else "tiled"
    return Case(f"gemm_{sku}_{tag}_{m}x{n}x{k}_{flags}",
                _setup(dtype, backend, m, n, k, trans_a, trans_b), run_plan_state,
                flops=2 * m * n * k, baseline=_cupy_matmul, baseline_name="cupy.matmul")


CASES = [
    _case(tag, dtype, backend)
    for tag, dtype in (("bf16", gp.bfloat16), ("f16", np.float16), ("f32", np.float32))
    for backend in (gp.BackendKind.CUBLAS, gp.BackendKind.NVRTC)
] + [
    # Linear-layer backward shapes: dX = dY @ W^T and dW = X^T @ dY (tiled, bf16).
    _case("bf16", gp.bfloat16, gp.BackendKind.NVRTC, 2 * SIZE, SIZE, SIZE, trans_b=True),
    _case("bf16", gp.bfloat16, gp.BackendKind.NVRTC, SIZE, SIZE, 2 * SIZE, trans_a=True),
]
