"""The softmax op family: softmax and log-softmax over the last axis, forward and backward."""

from gpuplan.ops.softmax.plans import (
    LogSoftmaxBackwardPlan,
    LogSoftmaxPlan,
    SoftmaxArgs,
    SoftmaxBackwardArgs,
    SoftmaxBackwardDescriptor,
    SoftmaxBackwardPlan,
    SoftmaxDescriptor,
    SoftmaxPlan,
    log_softmax,
    log_softmax_backward,
    softmax,
    softmax_backward,
)

__all__ = [
    "SoftmaxDescriptor",
    "SoftmaxArgs",
    "SoftmaxPlan",
    "LogSoftmaxPlan",
    "SoftmaxBackwardDescriptor",
    "SoftmaxBackwardArgs",
    "SoftmaxBackwardPlan",
    "LogSoftmaxBackwardPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "softmax",
    "softmax_backward",
    "log_softmax",
    "log_softmax_backward",
]
