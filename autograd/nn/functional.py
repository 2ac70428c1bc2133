"""PyTorch-named functional ops on Tensors (autograd.nn.functional, usually imported as F)."""

from __future__ import annotations

from typing import Any

from autograd.functions.activation import unary
from autograd.functions.attention import scaled_dot_product_attention
from autograd.functions.dropout import dropout
from autograd.functions.embedding import embedding
from autograd.functions.loss import cross_entropy
from autograd.functions.matmul import linear, linear_gelu
from autograd.functions.normalization import layer_norm, residual_layer_norm, rms_norm
from autograd.functions.quantize import dequantize_per_token, quantize_per_token
from autograd.functions.softmax import log_softmax, softmax
from autograd.tensor import Tensor

__all__ = [
    "linear", "linear_gelu", "relu", "gelu", "silu", "tanh", "softmax", "log_softmax",
    "layer_norm", "residual_layer_norm", "rms_norm", "embedding", "dropout", "cross_entropy",
    "mse_loss", "scaled_dot_product_attention", "quantize_per_token", "dequantize_per_token",
]


def relu(x: Tensor) -> Tensor:
    return unary("relu", x)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """approximate="none": x * Phi(x) (erf); "tanh": the tanh approximation."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', given {approximate!r}")
    return unary("gelu" if approximate == "none" else "gelu_tanh", x)


def silu(x: Tensor) -> Tensor:
    return unary("silu", x)


def tanh(x: Tensor) -> Tensor:
    return unary("tanh", x)


def mse_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    """mean (or sum, or none) of (input - target)^2, composed from primitive Functions."""
    diff = input - target
    sq = diff * diff
    if reduction == "none":
        return sq
    if reduction not in ("mean", "sum"):
        raise ValueError(f"mse_loss: reduction must be 'mean', 'sum' or 'none', "
                         f"given {reduction!r}")
    return sq.mean() if reduction == "mean" else sq.sum()
