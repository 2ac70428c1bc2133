"""Gradient clipping by the global L2 norm over all parameters: norm and scaling of every
gradient in one multi-tensor plan call (gp.functional.clip_grad_norm_)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import gpuplan as gp
from autograd.inplace import record_writes
from autograd.tensor import Tensor


def _as_list(parameters: Iterable[Any] | Any) -> list[Any]:
    if hasattr(parameters, "data") and hasattr(parameters, "grad"):
        return [parameters]
    return list(parameters)


def get_total_norm(tensors: Iterable[Any]) -> float:
    """``sqrt(sum over tensors of sum(t**2))`` as a Python float, 0.0 for none
    (``gp.functional.global_l2_norm``: scaled float64 sums, so huge or tiny gradients
    neither overflow nor underflow; f32, f64 for f64 tensors; NaN/inf propagate). Takes
    Tensors (e.g. the gradients) or arrays, like PyTorch's ``get_total_norm``."""
    arrays = [t.data if isinstance(t, Tensor) else t for t in tensors]
    if not arrays:
        return 0.0
    return float(gp.to_host(gp.functional.global_l2_norm(arrays)))


def clip_grads_with_norm_(parameters: Iterable[Any] | Any, max_norm: float,
                          total_norm: float, eps: float = 1e-6) -> None:
    """Scale every ``p.grad`` in place by ``max_norm / (total_norm + eps)`` when that is
    below 1 (PyTorch's ``clip_grads_with_norm_``); ``total_norm`` may come from anywhere,
    e.g. a norm summed over the ranks of a model-parallel group."""
    coef = float(max_norm) / (float(total_norm) + eps)
    if coef >= 1.0:
        return
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    if grads:  # one launch for all: each element as unary("scale", g, coef)
        gp.functional.clip_grad_norm_([g.data for g in grads], max_norm, eps=eps,
                                      total_norm=float(total_norm))
    record_writes(grads, "clip_grads_with_norm_")


def clip_grad_norm_(parameters: Iterable[Any] | Any, max_norm: float,
                    eps: float = 1e-6) -> float:
    """Scale every ``p.grad`` in place by ``max_norm / (total + eps)`` when that is below 1.

    ``total = sqrt(sum over parameters of sum(grad**2))``; returns ``total`` as a Python
    float (before clipping). PyTorch's ``clip_grad_norm_`` returns a device tensor instead;
    the float costs one device-to-host read (a sync) per call on a GPU, and is what tells
    the in-place version tracking whether the gradients were scaled. A step that must not
    sync (a captured CUDA graph, see dist/trainer/graph_step.py) calls
    ``gp.functional.clip_grad_norm_`` on the gradient arrays, which keeps the norm on the
    device. Parameters without a gradient are skipped; with none at all the norm is 0.0.
    One plan call computes the norm and scales (on a GPU the scaling reads the norm on the
    device); the result is bit for bit `get_total_norm` then `clip_grads_with_norm_`.
    """
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    if not grads:
        return 0.0
    norm = gp.functional.clip_grad_norm_([g.data for g in grads], max_norm, eps=eps)
    total = float(gp.to_host(norm))
    if not float(max_norm) / (total + eps) >= 1.0:  # scaled (a NaN norm scales as well)
        record_writes(grads, "clip_grad_norm_")
    return total
