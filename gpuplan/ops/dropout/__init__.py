"""The dropout op family: Philox dropout: masks, forward and backward."""

from gpuplan.ops.dropout.plans import (
    DropoutArgs,
    DropoutBackwardArgs,
    DropoutBackwardDescriptor,
    DropoutBackwardPlan,
    DropoutDescriptor,
    DropoutMaskArgs,
    DropoutMaskDescriptor,
    DropoutMaskPlan,
    DropoutPlan,
    dropout,
    dropout_backward,
    dropout_mask,
)

__all__ = [
    "DropoutDescriptor",
    "DropoutArgs",
    "DropoutPlan",
    "DropoutBackwardDescriptor",
    "DropoutBackwardArgs",
    "DropoutBackwardPlan",
    "DropoutMaskDescriptor",
    "DropoutMaskArgs",
    "DropoutMaskPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "dropout",
    "dropout_backward",
    "dropout_mask",
]
