"""The cross_entropy op family: cross-entropy over logits rows, and its vocabulary-parallel
stages."""

from gpuplan.ops.cross_entropy.partial import (
    CrossEntropyFinishArgs,
    CrossEntropyFinishPlan,
    CrossEntropyPartialArgs,
    CrossEntropyPartialBackwardArgs,
    CrossEntropyPartialBackwardPlan,
    CrossEntropyPartialDescriptor,
    CrossEntropyPartialMaxArgs,
    CrossEntropyPartialMaxPlan,
    CrossEntropyPartialPlan,
    cross_entropy_finish,
    cross_entropy_partial,
    cross_entropy_partial_backward,
    cross_entropy_partial_max,
)
from gpuplan.ops.cross_entropy.plans import (
    CrossEntropyArgs,
    CrossEntropyBackwardArgs,
    CrossEntropyBackwardDescriptor,
    CrossEntropyBackwardPlan,
    CrossEntropyDescriptor,
    CrossEntropyPlan,
    cross_entropy,
    cross_entropy_backward,
)

__all__ = [
    "CrossEntropyDescriptor",
    "CrossEntropyArgs",
    "CrossEntropyPlan",
    "CrossEntropyBackwardDescriptor",
    "CrossEntropyBackwardArgs",
    "CrossEntropyBackwardPlan",
    "CrossEntropyPartialDescriptor",
    "CrossEntropyPartialMaxArgs",
    "CrossEntropyPartialMaxPlan",
    "CrossEntropyPartialArgs",
    "CrossEntropyPartialPlan",
    "CrossEntropyFinishArgs",
    "CrossEntropyFinishPlan",
    "CrossEntropyPartialBackwardArgs",
    "CrossEntropyPartialBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_partial_max",
    "cross_entropy_partial",
    "cross_entropy_finish",
    "cross_entropy_partial_backward",
]
