"""The reduction op family: sum, mean, max, min and norms over axes, and the global L2 norm over
many arrays."""

from gpuplan.ops.reduction.plans import (
    GlobalNormArgs,
    GlobalNormDescriptor,
    GlobalNormPlan,
    ReduceArgs,
    ReduceDescriptor,
    ReducePlan,
    global_l2_norm,
    reduce,
)

__all__ = [
    "ReduceDescriptor",
    "ReduceArgs",
    "ReducePlan",
    "GlobalNormDescriptor",
    "GlobalNormArgs",
    "GlobalNormPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "reduce",
    "global_l2_norm",
]
