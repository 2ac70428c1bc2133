"""The select op family: `where` and triangular masks."""

from gpuplan.ops.select.plans import (
    TriangleArgs,
    TriangleDescriptor,
    TrianglePlan,
    WhereArgs,
    WhereDescriptor,
    WherePlan,
    triangle,
    where,
)

__all__ = [
    "WhereDescriptor",
    "WhereArgs",
    "WherePlan",
    "TriangleDescriptor",
    "TriangleArgs",
    "TrianglePlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "where",
    "triangle",
]
