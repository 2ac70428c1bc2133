"""The binary op family: broadcasting elementwise binary ops, their gradients and the bias add."""

from gpuplan.ops.binary.plans import (
    BiasAddArgs,
    BiasAddDescriptor,
    BiasAddPlan,
    BinaryArgs,
    BinaryBackwardArgs,
    BinaryBackwardDescriptor,
    BinaryBackwardPlan,
    BinaryDescriptor,
    BinaryPlan,
    bias_add,
    binary,
    binary_backward,
)

__all__ = [
    "BinaryDescriptor",
    "BinaryArgs",
    "BinaryPlan",
    "BinaryBackwardDescriptor",
    "BinaryBackwardArgs",
    "BinaryBackwardPlan",
    "BiasAddDescriptor",
    "BiasAddArgs",
    "BiasAddPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "binary",
    "binary_backward",
    "bias_add",
]
