"""Loss modules (PyTorch names and options) over autograd.nn.functional."""

from __future__ import annotations

from typing import Any

from autograd.functions.loss import REDUCTIONS
from autograd.nn import functional as F
from autograd.nn.module import Module


def _reduction(op: str, reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, given {reduction!r}")
    return reduction


class CrossEntropyLoss(Module):
    """``F.cross_entropy(input, target, ...)``: logits [N, C] (or [C], [N, C, d1, ...]) and
    integer class targets; ``weight [C]`` optional (not with label_smoothing > 0)."""

    def __init__(self, weight: Any = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must lie in [0, 1], given "
                             f"{label_smoothing}")
        self.weight = weight
        self.ignore_index = int(ignore_index)
        self.reduction = _reduction("CrossEntropyLoss", reduction)
        self.label_smoothing = float(label_smoothing)

    def forward(self, input: Any, target: Any) -> Any:  # noqa: A002
        return F.cross_entropy(input, target, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing,
                               weight=self.weight)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}")


class NLLLoss(Module):
    """``F.nll_loss(input, target, ...)`` over log-probabilities."""

    def __init__(self, weight: Any = None, ignore_index: int = -100,
                 reduction: str = "mean") -> None:
        super().__init__()
        self.weight = weight
        self.ignore_index = int(ignore_index)
        self.reduction = _reduction("NLLLoss", reduction)

    def forward(self, input: Any, target: Any) -> Any:  # noqa: A002
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index,
                          reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"


class MSELoss(Module):
    """``F.mse_loss(input, target, reduction)``: mean (sum, none) of squared differences."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _reduction("MSELoss", reduction)

    def forward(self, input: Any, target: Any) -> Any:  # noqa: A002
        return F.mse_loss(input, target, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
