"""The clip_grad op family: multi-tensor gradient clipping by the global L2 norm."""

from gpuplan.ops.clip_grad.plans import (
    ClipGradNormArgs,
    ClipGradNormDescriptor,
    ClipGradNormPlan,
    clip_grad_norm_,
)

__all__ = [
    "ClipGradNormDescriptor",
    "ClipGradNormArgs",
    "ClipGradNormPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "clip_grad_norm_",
]
