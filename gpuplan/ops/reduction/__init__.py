"""The reduction op family: sum, mean, max, min, prod and norms over axes, the global L2 norm over
many arrays, the variance (and std) over axes, and the gradient of prod along one dim."""

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
from gpuplan.ops.reduction.prod_backward import (
    ProdBackwardArgs,
    ProdBackwardDescriptor,
    ProdBackwardPlan,
    prod_backward,
)
from gpuplan.ops.reduction.variance import (
    VarianceArgs,
    VarianceDescriptor,
    VariancePlan,
    variance,
)

__all__ = [
    "ReduceDescriptor",
    "ReduceArgs",
    "ReducePlan",
    "GlobalNormDescriptor",
    "GlobalNormArgs",
    "GlobalNormPlan",
    "VarianceDescriptor",
    "VarianceArgs",
    "VariancePlan",
    "ProdBackwardDescriptor",
    "ProdBackwardArgs",
    "ProdBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "reduce",
    "global_l2_norm",
    "variance",
    "prod_backward",
]
