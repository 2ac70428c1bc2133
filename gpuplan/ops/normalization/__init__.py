"""The normalization op family: LayerNorm and RMSNorm over the last axis, forward and backward."""

from gpuplan.ops.normalization.plans import (
    LayerNormArgs,
    LayerNormBackwardArgs,
    LayerNormBackwardDescriptor,
    LayerNormBackwardPlan,
    LayerNormDescriptor,
    LayerNormPlan,
    RMSNormArgs,
    RMSNormBackwardArgs,
    RMSNormBackwardDescriptor,
    RMSNormBackwardPlan,
    RMSNormDescriptor,
    RMSNormPlan,
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
)

__all__ = [
    "LayerNormDescriptor",
    "LayerNormArgs",
    "LayerNormPlan",
    "LayerNormBackwardDescriptor",
    "LayerNormBackwardArgs",
    "LayerNormBackwardPlan",
    "RMSNormDescriptor",
    "RMSNormArgs",
    "RMSNormPlan",
    "RMSNormBackwardDescriptor",
    "RMSNormBackwardArgs",
    "RMSNormBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
]
