"""The activation op family: elementwise unary ops (GELU exact and tanh, SiLU, ReLU, ...) and
their gradients."""

from gpuplan.ops.activation.plans import (
    UnaryArgs,
    UnaryBackwardArgs,
    UnaryBackwardDescriptor,
    UnaryBackwardPlan,
    UnaryDescriptor,
    UnaryPlan,
    unary,
    unary_backward,
)

__all__ = [
    "UnaryDescriptor",
    "UnaryArgs",
    "UnaryPlan",
    "UnaryBackwardDescriptor",
    "UnaryBackwardArgs",
    "UnaryBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "unary",
    "unary_backward",
]
