"""The reduce_dim op family: reductions along one dim that keep positions, max/min with their
indices (arg_select) and the k largest or smallest (topk)."""

from gpuplan.ops.reduce_dim.plans import (
    ArgSelectArgs,
    ArgSelectDescriptor,
    ArgSelectPlan,
    TopkArgs,
    TopkDescriptor,
    TopkPlan,
    arg_select,
    topk,
)

__all__ = [
    "ArgSelectDescriptor",
    "ArgSelectArgs",
    "ArgSelectPlan",
    "TopkDescriptor",
    "TopkArgs",
    "TopkPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "arg_select",
    "topk",
]
