"""The reduce_dim op family: reductions that keep an index or need a second pass: arg_select,
topk, variance, prod's backward."""

from gpuplan.ops.reduce_dim.plans import (
    ArgSelectArgs,
    ArgSelectDescriptor,
    ArgSelectPlan,
    ProdBackwardArgs,
    ProdBackwardDescriptor,
    ProdBackwardPlan,
    TopkArgs,
    TopkDescriptor,
    TopkPlan,
    VarianceArgs,
    VarianceDescriptor,
    VariancePlan,
    arg_select,
    prod_backward,
    topk,
    variance,
)

__all__ = [
    "ArgSelectDescriptor",
    "ArgSelectArgs",
    "ArgSelectPlan",
    "TopkDescriptor",
    "TopkArgs",
    "TopkPlan",
    "VarianceDescriptor",
    "VarianceArgs",
    "VariancePlan",
    "ProdBackwardDescriptor",
    "ProdBackwardArgs",
    "ProdBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "arg_select",
    "topk",
    "variance",
    "prod_backward",
]
