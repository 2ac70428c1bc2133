"""The optimizer op family: multi-tensor AdamW and SGD steps over parameter lists."""

from gpuplan.ops.optimizer.adamw import (
    AdamWArgs,
    AdamWDescriptor,
    AdamWMultiTensorArgs,
    AdamWMultiTensorDescriptor,
    AdamWMultiTensorPlan,
    AdamWPlan,
    adamw_hyper,
    adamw_step,
)
from gpuplan.ops.optimizer.sgd import (
    SGDArgs,
    SGDDescriptor,
    SGDPlan,
    sgd_step,
)

__all__ = [
    "AdamWDescriptor",
    "AdamWArgs",
    "AdamWPlan",
    "AdamWMultiTensorDescriptor",
    "AdamWMultiTensorArgs",
    "AdamWMultiTensorPlan",
    "SGDDescriptor",
    "SGDArgs",
    "SGDPlan",
]
#: Array-level wrappers re-exported by gpuplan.functional.
__functional__ = [
    "adamw_step",
    "adamw_hyper",
    "sgd_step",
]
