"""Standard layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout and activations."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.nn import functional as F
from autograd.nn.module import Module, Parameter


def host_parameter(values: np.ndarray, dtype: Any, device: str = "cpu") -> Parameter:
    """A Parameter from host float64 values: rounded to ``dtype`` once, then moved, so the
    same seed gives bit-identical parameters on every device."""
    arr = np.ascontiguousarray(np.asarray(values, dtype=np.float64).astype(gp.dtypes.as_dtype(
        dtype)))
    return Parameter(gp.to_device(arr, device))


def _shape_tuple(shape: int | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


class Linear(Module):
    """``Y = X @ W + b`` with ``W`` stored ``[in_features, out_features]``, ``b [out]``.

    PyTorch's default init: ``W, b ~ U(-1/sqrt(in), 1/sqrt(in))`` drawn (W first) from
    ``np.random.default_rng(seed)`` on the host.

    Layout: PyTorch stores ``weight`` as [out_features, in_features]; ours is its transpose.
    A torch checkpoint loads with ``module.load_state_dict(sd, layout="torch")`` (which
    transposes every Linear's weight) and ``state_dict(layout="torch")`` exports one; a
    plain load of a square torch weight would otherwise be taken as [in, out] silently.
    """

    _torch_transposed = ("weight",)

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: Any = np.float32, seed: int | None = None, device: str = "cpu") -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        rng = np.random.default_rng(seed)
        bound = 1.0 / math.sqrt(in_features) if in_features > 0 else 0.0
        self.weight = host_parameter(
            rng.uniform(-bound, bound, (self.in_features, self.out_features)), dtype, device)
        self.weight._in_out_layout = True  # nn.init reads torch's fans off the transpose
        if bias:
            self.bias = host_parameter(rng.uniform(-bound, bound, (self.out_features,)), dtype,
                                       device)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: Any) -> Any:
        return F.linear(x, self.weight, self.bias)

    def forward_gelu(self, x: Any, approximate: str = "none") -> Any:
        """``gelu(self(x), approximate)`` with the activation in the GEMM's epilogue."""
        return F.linear_gelu(x, self.weight, self.bias, approximate=approximate)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """``out[..., :] = weight[input[...], :]``; ``weight [num_embeddings, embedding_dim]``
    initialised N(0, 1) (PyTorch), the ``padding_idx`` row zero and never updated."""

    _torch_transposed = ()  # same [num_embeddings, embedding_dim] as torch

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 dtype: Any = np.float32, seed: int | None = None, device: str = "cpu") -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx must lie in [-{num_embeddings}, "
                                 f"{num_embeddings}), given {padding_idx}")
            padding_idx = padding_idx % num_embeddings
        self.padding_idx = padding_idx
        values = np.random.default_rng(seed).standard_normal((num_embeddings, embedding_dim))
        if padding_idx is not None:
            values[padding_idx] = 0.0
        self.weight = host_parameter(values, dtype, device)

    def forward(self, input: Any) -> Any:
        return F.embedding(input, self.weight, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}"


class LayerNorm(Module):
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the trailing
    ``normalized_shape`` axes; weight ones, bias zeros."""

    _torch_transposed = ()

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, dtype: Any = np.float32,
                 device: str = "cpu") -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps = float(eps)
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = host_parameter(np.ones(self.normalized_shape), dtype, device)
            if bias:
                self.bias = host_parameter(np.zeros(self.normalized_shape), dtype, device)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: Any) -> Any:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def forward_residual(self, x: Any, residual: Any) -> tuple[Any, Any]:
        """``(s, self(s))`` with ``s = x + residual``, in one plan (`F.residual_layer_norm`)."""
        return F.residual_layer_norm(x, residual, self.normalized_shape, self.weight,
                                     self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(Module):
    """``y = x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape``
    axes; weight ones; ``eps=None`` means the functional default."""

    _torch_transposed = ()

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float | None = None,
                 elementwise_affine: bool = True, dtype: Any = np.float32,
                 device: str = "cpu") -> None:
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps = eps
        if elementwise_affine:
            self.weight = host_parameter(np.ones(self.normalized_shape), dtype, device)
        else:
            self.register_parameter("weight", None)

    def forward(self, x: Any) -> Any:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class Dropout(Module):
    """Zeroes each element with probability ``p`` and scales the rest by ``1/(1-p)`` in
    training mode; the identity in eval mode or when ``p == 0``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must lie in [0, 1), given {p}")
        self.p = float(p)

    def forward(self, x: Any) -> Any:
        if not self.training or self.p == 0.0:
            return x
        return F.dropout(x, self.p, training=True)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class GELU(Module):
    """``x * Phi(x)`` (exact, erf) or its tanh approximation (``approximate="tanh"``)."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', given {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Any) -> Any:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class ReLU(Module):
    """``max(x, 0)``."""

    def forward(self, x: Any) -> Any:
        return F.relu(x)


class SiLU(Module):
    """``x * sigmoid(x)``."""

    def forward(self, x: Any) -> Any:
        return F.silu(x)


class Sigmoid(Module):
    """``1 / (1 + exp(-x))``."""

    def forward(self, x: Any) -> Any:
        return F.sigmoid(x)


class Tanh(Module):
    """``tanh(x)``."""

    def forward(self, x: Any) -> Any:
        return F.tanh(x)


class Identity(Module):
    """Returns its input unchanged (constructor arguments are ignored, as in torch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x
