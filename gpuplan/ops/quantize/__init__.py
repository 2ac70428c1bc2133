"""The quantize op family: int8 per-token quantize and dequantize, with their straight-through
gradients."""

from gpuplan.ops.quantize.plans import (
    DequantizePerTokenArgs,
    DequantizePerTokenBackwardArgs,
    DequantizePerTokenBackwardDescriptor,
    DequantizePerTokenBackwardPlan,
    DequantizePerTokenDescriptor,
    DequantizePerTokenPlan,
    QuantizePerTokenArgs,
    QuantizePerTokenBackwardArgs,
    QuantizePerTokenBackwardDescriptor,
    QuantizePerTokenBackwardPlan,
    QuantizePerTokenDescriptor,
    QuantizePerTokenPlan,
    dequantize_per_token,
    dequantize_per_token_backward,
    quantize_per_token,
    quantize_per_token_backward,
)

__all__ = [
    "QuantizePerTokenDescriptor",
    "QuantizePerTokenArgs",
    "QuantizePerTokenPlan",
    "QuantizePerTokenBackwardDescriptor",
    "QuantizePerTokenBackwardArgs",
    "QuantizePerTokenBackwardPlan",
    "DequantizePerTokenDescriptor",
    "DequantizePerTokenArgs",
    "DequantizePerTokenPlan",
    "DequantizePerTokenBackwardDescriptor",
    "DequantizePerTokenBackwardArgs",
    "DequantizePerTokenBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "quantize_per_token",
    "quantize_per_token_backward",
    "dequantize_per_token",
    "dequantize_per_token_backward",
]
