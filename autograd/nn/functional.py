"""PyTorch-named functional ops on Tensors (autograd.nn.functional, usually imported as F)."""

from __future__ import annotations

from typing import Any

import gpuplan as gp
from autograd.functions.activation import unary
from autograd.functions.attention import scaled_dot_product_attention
from autograd.functions.dropout import dropout
from autograd.functions.embedding import embedding
from autograd.functions.loss import REDUCTIONS, cross_entropy, nll_loss
from autograd.functions.matmul import linear, linear_gelu
from autograd.functions.normalization import layer_norm, residual_layer_norm, rms_norm
from autograd.functions.padding import pad
from autograd.functions.quantize import dequantize_per_token, quantize_per_token
from autograd.functions.rope import rope
from autograd.functions.softmax import log_softmax, softmax
from autograd.functions.swiglu import swiglu
from autograd.tensor import Tensor

__all__ = [
    "linear", "linear_gelu", "relu", "gelu", "silu", "sigmoid", "tanh", "softmax",
    "log_softmax", "layer_norm", "residual_layer_norm", "rms_norm", "embedding", "dropout",
    "cross_entropy", "nll_loss", "mse_loss", "one_hot", "pad", "scaled_dot_product_attention",
    "quantize_per_token", "dequantize_per_token", "rope", "swiglu",
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


def sigmoid(x: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))``."""
    return unary("sigmoid", x)


def tanh(x: Tensor) -> Tensor:
    return unary("tanh", x)


def one_hot(tensor: Any, num_classes: int = -1) -> Tensor:
    """int64 ``[..., num_classes]`` with a 1 at each index of ``tensor`` (integers >= 0);
    ``num_classes=-1`` takes ``max + 1``. Index bookkeeping on the index array's device
    (a scatter of ones into zeros): no gradient flows, as in torch."""
    t = tensor.data if isinstance(tensor, Tensor) else gp.asarray(tensor)
    if t.dtype.kind not in "iu":
        raise ValueError(f"one_hot: tensor must hold integer class indices, given dtype "
                         f"{t.dtype}")
    flat = t.reshape(-1).astype(gp.dtypes.int64)
    if flat.size and int(flat.min()) < 0:
        raise ValueError(f"one_hot: class values must be >= 0, given {int(flat.min())}")
    if num_classes == -1:
        if not flat.size:
            raise ValueError("one_hot: num_classes=-1 needs a non-empty tensor to infer it")
        num_classes = int(flat.max()) + 1
    elif num_classes < 1 or flat.size and int(flat.max()) >= num_classes:
        raise ValueError(f"one_hot: class values must be < num_classes={num_classes}, given "
                         f"max {int(flat.max()) if flat.size else None}")
    out = gp.zeros((flat.size, int(num_classes)), gp.dtypes.int64, gp.device_of(t))
    out[gp.array_namespace(flat).arange(flat.size), flat] = 1
    return Tensor(out.reshape(tuple(t.shape) + (int(num_classes),)))


def mse_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:  # noqa: A002
    """mean (or sum, or none) of (input - target)^2 (broadcast), composed from primitive
    Functions (sub, mul, reduction plans)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"mse_loss: reduction must be one of {REDUCTIONS}, given "
                         f"{reduction!r}")
    diff = input - target
    sq = diff * diff
    if reduction == "none":
        return sq
    return sq.mean() if reduction == "mean" else sq.sum()
