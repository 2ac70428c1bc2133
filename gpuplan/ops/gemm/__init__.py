"""The gemm op family: batched matrix multiply with bias and activation epilogues (our tiled
kernels and cuBLAS)."""

from gpuplan.ops.gemm.plans import (
    GemmArgs,
    GemmDescriptor,
    GemmPlan,
    matmul,
)

__all__ = [
    "GemmDescriptor",
    "GemmArgs",
    "GemmPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "matmul",
]
