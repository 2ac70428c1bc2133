"""The gather op family: gather, scatter_add, index_select and index_add along one axis."""

from gpuplan.ops.gather.plans import (
    GatherArgs,
    GatherDescriptor,
    GatherPlan,
    ScatterAddArgs,
    ScatterAddDescriptor,
    ScatterAddPlan,
    gather,
    index_add,
    index_select,
    scatter_add,
)

__all__ = [
    "GatherDescriptor",
    "GatherArgs",
    "GatherPlan",
    "ScatterAddDescriptor",
    "ScatterAddArgs",
    "ScatterAddPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "gather",
    "scatter_add",
    "index_select",
    "index_add",
]
