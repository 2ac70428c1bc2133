"""The cast op family: dtype conversion between the float dtypes."""

from gpuplan.ops.cast.plans import (
    CastArgs,
    CastDescriptor,
    CastPlan,
    cast,
)

__all__ = [
    "CastDescriptor",
    "CastArgs",
    "CastPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "cast",
]
