"""The residual_norm op family: the fused residual add + LayerNorm, forward and backward."""

from gpuplan.ops.residual_norm.plans import (
    ResidualLayerNormArgs,
    ResidualLayerNormBackwardArgs,
    ResidualLayerNormBackwardDescriptor,
    ResidualLayerNormBackwardPlan,
    ResidualLayerNormDescriptor,
    ResidualLayerNormPlan,
    residual_layer_norm,
    residual_layer_norm_backward,
)

__all__ = [
    "ResidualLayerNormDescriptor",
    "ResidualLayerNormArgs",
    "ResidualLayerNormPlan",
    "ResidualLayerNormBackwardDescriptor",
    "ResidualLayerNormBackwardArgs",
    "ResidualLayerNormBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "residual_layer_norm",
    "residual_layer_norm_backward",
]
