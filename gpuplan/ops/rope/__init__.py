"""The rope op family: rotary position embedding (Hugging Face's rotate-half convention),
forward and backward."""

from gpuplan.ops.rope.plans import (
    RopeArgs,
    RopeBackwardArgs,
    RopeBackwardDescriptor,
    RopeBackwardPlan,
    RopeDescriptor,
    RopePlan,
    rope,
    rope_backward,
    rope_split_heads,
    rope_split_heads_backward,
)

__all__ = [
    "RopeDescriptor",
    "RopeArgs",
    "RopePlan",
    "RopeBackwardDescriptor",
    "RopeBackwardArgs",
    "RopeBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "rope",
    "rope_backward",
    "rope_split_heads",
    "rope_split_heads_backward",
]
