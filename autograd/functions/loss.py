"""Loss Functions (PyTorch semantics) via the plans: cross entropy over class logits (fused
plan), nll_loss (a gather, a product and reductions: composed Functions)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gpuplan as gp
import gpuplan.functional as F
from autograd.function import Function
from autograd.functions.arithmetic import neg
from autograd.functions.shape import getitem
from autograd.functions.softmax import log_softmax
from autograd.tensor_base import TensorBase, new_tensor
from gpuplan import backend

if TYPE_CHECKING:
    from autograd.tensor import Tensor

REDUCTIONS = ("mean", "sum", "none")


class CrossEntropy(Function):
    """loss over logits [N, V] and int targets [N]; lse [N] saved for backward.

    loss_n = lse_n - (1 - s) * x[n, t_n] - s / V * sum_v x[n, v] (s = label_smoothing);
    rows with t_n == ignore_index count 0 and are left out of the mean.
    """

    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction, label_smoothing):
        ctx.opts = dict(ignore_index=ignore_index, reduction=reduction,
                        label_smoothing=label_smoothing)
        loss, lse = F.cross_entropy(logits, target, **ctx.opts)
        ctx.save_for_backward(logits, target, lse)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        logits, target, lse = ctx.saved
        return F.cross_entropy_backward(logits, target, lse, dloss, **ctx.opts), None


def _int_target(op: str, target: Any, device: str) -> Any:
    t = target.data if isinstance(target, TensorBase) else gp.asarray(target, device=device)
    if t.dtype.kind not in "iu":
        raise ValueError(f"{op}: target must hold integer class indices, given dtype {t.dtype}")
    return t


def _check_reduction(op: str, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, given {reduction!r}")


def cross_entropy(input: Tensor, target: Any, ignore_index: int = -100,  # noqa: A002
                  reduction: str = "mean", label_smoothing: float = 0.0, *,
                  weight: Any = None) -> Tensor:
    """PyTorch cross_entropy: input [N, C] (or [C], or [N, C, d1, ...] with classes on dim
    1), target of integer class indices with input's shape minus the class dim. Without
    ``weight`` one fused plan; with a per-class ``weight [C]``, nll_loss(log_softmax(input))
    (torch's weighted mean: divided by the summed weights of the counted rows)."""
    _check_reduction("cross_entropy", reduction)
    t = _int_target("cross_entropy", target, input.device)
    expected = input.shape[:1] + input.shape[2:] if input.ndim > 1 else ()
    if tuple(t.shape) != tuple(expected):  # (a [N, 1] target for [N, C] was flattened)
        raise gp.InvalidProblem(gp.errors.describe(
            "cross_entropy", "target", f"shape {tuple(expected)} for input of shape "
            f"{tuple(input.shape)}", f"shape {tuple(t.shape)}"))
    if weight is not None:
        if label_smoothing != 0.0:
            raise ValueError("cross_entropy: weight together with label_smoothing > 0 is not "
                             f"supported, given label_smoothing={label_smoothing}")
        return nll_loss(log_softmax(input, dim=1 if input.ndim > 1 else 0), t, weight=weight,
                        ignore_index=ignore_index, reduction=reduction)
    opts = dict(ignore_index=int(ignore_index), reduction=reduction,
                label_smoothing=float(label_smoothing))
    if input.ndim == 1:
        out = CrossEntropy.apply(input.reshape(1, -1), t.reshape(1), **opts)
        return out.reshape(()) if reduction == "none" else out
    if input.ndim == 2:
        return CrossEntropy.apply(input, t.reshape(-1), **opts)
    # [N, C, d1, ...] -> [N * d1 * ..., C]
    perm = (0,) + tuple(range(2, input.ndim)) + (1,)
    flat = input.permute(*perm).reshape(-1, input.shape[1])
    out = CrossEntropy.apply(flat, backend.ascontiguous(t).reshape(-1), **opts)
    return out.reshape(t.shape) if reduction == "none" else out


def _rows(op: str, input: Tensor, t: Any) -> tuple[Tensor, Any]:
    """(input as [N, C] rows, target as [N]) for input [C], [N, C] or [N, C, d1, ...]."""
    expected = input.shape[:1] + input.shape[2:] if input.ndim > 1 else ()
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{op}: target must have shape {tuple(expected)} for input of shape "
                         f"{tuple(input.shape)}, given {tuple(t.shape)}")
    if input.ndim <= 2:
        return input.reshape(-1, input.shape[-1]), t.reshape(-1)
    perm = (0,) + tuple(range(2, input.ndim)) + (1,)
    return (input.permute(*perm).reshape(-1, input.shape[1]),
            backend.ascontiguous(t).reshape(-1))


def nll_loss(input: Tensor, target: Any, weight: Any = None,  # noqa: A002
             ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """PyTorch nll_loss over log-probabilities: ``loss_n = -w[t_n] * input[n, t_n]``
    (``w`` ones without ``weight [C]``), 0 where ``t_n == ignore_index``; ``mean`` divides
    the sum by the summed ``w[t_n]`` of the counted rows (NaN when none counts, as torch).

    Index bookkeeping (ignored rows, class range, the weight gather) is done on the target
    array; the numerics are Functions over plans: a gather of ``input[n, t_n]`` (its
    backward a scatter-add), a product, a negation and sum reductions.
    """
    _check_reduction("nll_loss", reduction)
    t = _int_target("nll_loss", target, input.device)
    x2, t1 = _rows("nll_loss", input, t)
    n, c = x2.shape
    xp = gp.array_namespace(t1)
    ignored = t1 == ignore_index
    bad = ~ignored & ((t1 < 0) | (t1 >= c))
    if bool(bad.any()):
        raise ValueError(f"nll_loss: target values must lie in [0, {c}) or equal ignore_index="
                         f"{ignore_index}, given {int(t1[bad][0])}")
    safe = xp.where(ignored, 0, t1).astype(gp.dtypes.int64)
    if weight is None:
        coef = gp.full((n,), 1.0, x2.dtype, x2.device)
    else:
        w = weight.data if isinstance(weight, TensorBase) else gp.asarray(weight, device=x2.device)
        if tuple(w.shape) != (c,):
            raise ValueError(f"nll_loss: weight must have shape ({c},) (one per class), given "
                             f"{tuple(w.shape)}")
        coef = backend.ascontiguous(gp.to_device(w, x2.device)[safe])
        coef = coef if coef.dtype == x2.dtype else F.cast(coef, x2.dtype)
    coef[ignored] = 0  # ignored rows neither count nor weigh
    picked = getitem(x2, (xp.arange(n), safe))
    losses = neg(picked * new_tensor(coef))
    if reduction == "none":
        return losses.reshape(t.shape)
    total = losses.sum()
    if reduction == "sum":
        return total
    return total / new_tensor(coef).sum()
