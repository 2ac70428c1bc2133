"""The swiglu op family: Llama's gated MLP activation silu(gate) * up, forward and backward."""

from gpuplan.ops.swiglu.plans import (
    SwigluArgs,
    SwigluBackwardArgs,
    SwigluBackwardDescriptor,
    SwigluBackwardPlan,
    SwigluDescriptor,
    SwigluPlan,
    swiglu,
    swiglu_backward,
)

__all__ = [
    "SwigluDescriptor",
    "SwigluArgs",
    "SwigluPlan",
    "SwigluBackwardDescriptor",
    "SwigluBackwardArgs",
    "SwigluBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "swiglu",
    "swiglu_backward",
]
