"""The GEMM family's kernels (gemm.cu): tile constants, instance names, the two CUDA modules,
the epilogue table and the cuBLAS loader; `gpuplan.ops.gemm.plans` declares and runs the plans.

Epilogues are rows of the activation family's table (`gpuplan.ops.activation.plans.ACTIVATIONS`):
``epilogue="gelu"`` applies that row's math (NumPy on the host; on a GPU the CUDA math of
gpuplan_activation.cuh, shared with activation.cu) to ``alpha * op(A) @ op(B) + beta * C +
bias`` before its one rounding. The kernels take the row's `Activation` enumerator as the
template argument EPI (-1: none). Plain GEMMs and fused ones are separate modules of the
same source, so a program that never fuses never compiles the fused instances.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, HALF_DTYPES, as_dtype, cuda_name, float64
from gpuplan.nvrtc import CudaModule, on_stream
from gpuplan.ops.activation.plans import ACTIVATIONS, UNARY_OPS, Activation

_BOOLS = ("false", "true")
#: Tensor-core tile (must match gemm.cu tc::): 128x128 block tile, 256 threads, and
#: tc::SMEM_BYTES = STAGES(4) * 2 operands * max(128*40, 32*136) halves * 2 bytes.
TC_TILE, TC_THREADS, TC_SMEM_BYTES = 128, 256, 4 * 2 * 5120 * 2
#: CUDA-core tiles per dtype: (BM, BN, TM, TN) of gemm_fma, 256 threads each.
FMA_TILES = {"float": (128, 128, 8, 8), "double": (64, 64, 4, 4)}

#: Activations a GEMM may apply in its epilogue (rows of ACTIVATIONS, by name).
EPILOGUE_ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_tanh")
#: The `epilogue` choices of GemmDescriptor.
EPILOGUES: tuple[str, ...] = ("none", *EPILOGUE_ACTIVATIONS)
_ROWS: dict[str, Activation] = {a.name: a for a in ACTIVATIONS if a.name in EPILOGUES}
assert set(_ROWS) == set(EPILOGUE_ACTIVATIONS), "an epilogue that is not an activation row"
#: EPI template argument per epilogue: the row's `Activation` enumerator, -1 for none.
EPI_CODES: dict[str, int] = {"none": -1, **{n: UNARY_OPS.index(n) for n in _ROWS}}


def epilogue_activation(name: str) -> Activation | None:
    """The activation row an epilogue applies (its host math), None for "none"."""
    return _ROWS.get(name)


def tc_name(t: str, ta: bool, tb: bool, vec: bool, epi: str = "none") -> str:
    return (f"gemm::gemm_tc<{t}, {_BOOLS[ta]}, {_BOOLS[tb]}, {_BOOLS[vec]}, "
            f"{EPI_CODES[epi]}>")


def fma_name(t: str, ta: bool, tb: bool, epi: str = "none") -> str:
    bm, bn, tm, tn = FMA_TILES[t]
    return (f"gemm::gemm_fma<{t}, {_BOOLS[ta]}, {_BOOLS[tb]}, {bm}, {bn}, {tm}, {tn}, "
            f"{EPI_CODES[epi]}>")


def activation_name(t: str, epi: str) -> str:
    """The cuBLAS SKU's separate activation pass."""
    return f"gemm::gemm_activation<{t}, {EPI_CODES[epi]}>"


def _instances(epis: tuple[str, ...]) -> list[str]:
    """Every tiled kernel with these epilogues, and the cuBLAS SKU's bias pass."""
    flags = [(ta, tb) for ta in (False, True) for tb in (False, True)]
    return ([tc_name(cuda_name(t), ta, tb, v, e) for e in epis for t in HALF_DTYPES
             for ta, tb in flags for v in (False, True)]
            + [fma_name(t, ta, tb, e) for e in epis for t in FMA_TILES for ta, tb in flags]
            + [f"gemm::gemm_scale_bias<{cuda_name(t)}>" for t in FLOAT_DTYPES])


_ENUMS = {"Activation": UNARY_OPS}
#: Plain GEMMs (and the cuBLAS SKU's bias pass).
MODULE = CudaModule(
    __file__, "gemm.cu",
    _instances(("none",)), enums=_ENUMS)
#: GEMMs with an activation epilogue (and the cuBLAS SKU's activation pass).
EPILOGUE_MODULE = CudaModule(
    __file__, "gemm.cu",
    _instances(EPILOGUE_ACTIVATIONS)
    + [activation_name(cuda_name(t), e) for e in EPILOGUE_ACTIVATIONS for t in FLOAT_DTYPES],
    enums=_ENUMS)


@functools.lru_cache(maxsize=1)
def cublas() -> Any | None:
    """CuPy's low-level cuBLAS bindings, or None where libcublas cannot be loaded."""
    try:
        from cupy_backends.cuda.libs import cublas
    except Exception:  # noqa: BLE001 - missing libcublas: no cuBLAS SKU
        return None
    return cublas


@dataclass(frozen=True)
class CublasGemm:
    """The constant arguments of the cuBLAS SKU's cublasGemmStridedBatchedEx for one
    descriptor (derived once per plan): a row-major C = op(A) op(B) is the column-major
    C^T = op(B)^T op(A)^T, so B goes first."""

    m: int
    n: int
    k: int
    batch: int
    ops: tuple       # (op of B, op of A)
    lds: tuple       # (ld of B, ld of A)
    strides: tuple   # (stride of B, stride of A)
    data_type: int
    compute: int
    scalar: type     # host type of alpha and beta

    @classmethod
    def of(cls, d: Any, stride_a: int, stride_b: int) -> CublasGemm:
        from cupy_backends.cuda.api import runtime

        lib, dt = cublas(), as_dtype(d.dtype)
        data_type = {np.dtype(np.float32): runtime.CUDA_R_32F,
                     np.dtype(np.float64): runtime.CUDA_R_64F,
                     np.dtype(np.float16): runtime.CUDA_R_16F}.get(dt, runtime.CUDA_R_16BF)
        if dt == float64:
            compute = lib.CUBLAS_COMPUTE_64F
        elif dt in HALF_DTYPES:
            compute = lib.CUBLAS_COMPUTE_32F
        else:  # f32: PEDANTIC forbids TF32 even if CUPY_TF32 set the handle's math mode
            compute = lib.CUBLAS_COMPUTE_32F_PEDANTIC
        ops = (lib.CUBLAS_OP_T if d.trans_b else lib.CUBLAS_OP_N,
               lib.CUBLAS_OP_T if d.trans_a else lib.CUBLAS_OP_N)
        return cls(d.m, d.n, d.k, d.batch, ops,
                   (d.k if d.trans_b else d.n, d.m if d.trans_a else d.k),
                   (stride_b, stride_a), data_type, compute,
                   np.float64 if dt == float64 else np.float32)

    def run(self, stream: Any, a: Any, b: Any, c: Any, alpha: float, beta: float) -> None:
        """C = alpha * op(A) @ op(B) + beta * C on `stream` (host pointer mode)."""
        cp, lib = backend.cupy_module(), cublas()
        alpha_h = np.array(alpha, dtype=self.scalar)
        beta_h = np.array(beta, dtype=self.scalar)
        (op_b, op_a), (ld_b, ld_a), (st_b, st_a) = self.ops, self.lds, self.strides
        dt = self.data_type
        with on_stream(stream):  # CuPy's cuBLAS calls bind the handle to the current stream
            handle = cp.cuda.device.get_cublas_handle()
            mode = lib.getPointerMode(handle)
            lib.setPointerMode(handle, lib.CUBLAS_POINTER_MODE_HOST)
            try:
                lib.gemmStridedBatchedEx(
                    handle, op_b, op_a, self.n, self.m, self.k, alpha_h.ctypes.data,
                    b.data.ptr, dt, ld_b, st_b, a.data.ptr, dt, ld_a, st_a,
                    beta_h.ctypes.data, c.data.ptr, dt, self.n, self.m * self.n,
                    self.batch, self.compute, lib.CUBLAS_GEMM_DEFAULT)
            finally:
                lib.setPointerMode(handle, mode)
