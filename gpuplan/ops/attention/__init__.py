"""The attention op family: fused scaled dot-product attention (causal, dropout) forward and
backward, SIMT and tensor-core kernels."""

from gpuplan.ops.attention.backward import (
    AttentionBackwardArgs,
    AttentionBackwardDescriptor,
    AttentionBackwardPlan,
    attention_backward,
)
from gpuplan.ops.attention.plans import (
    AttentionArgs,
    AttentionDescriptor,
    AttentionPlan,
    attention,
)

__all__ = [
    "AttentionDescriptor",
    "AttentionArgs",
    "AttentionPlan",
    "AttentionBackwardDescriptor",
    "AttentionBackwardArgs",
    "AttentionBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "attention",
    "attention_backward",
]
