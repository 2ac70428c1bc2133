"""GPTConfig: the shape and options of a GPT model (nn.GPT, dist.ParallelGPT)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan.dtypes import as_dtype, is_float

#: GPTConfig.activation -> nn.functional.gelu's `approximate`.
ACTIVATION_APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}


@dataclass(frozen=True)
class GPTConfig:
    """Model shape and options. ``n_embd`` must be divisible by ``n_head``."""

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    #: dropout of the attention probabilities; None: ``dropout`` (nanoGPT's rule)
    attn_dropout: float | None = None
    bias: bool = True
    tie_weights: bool = True
    dtype: Any = np.float32
    seed: int = 0
    activation: str = "gelu"  # "gelu" (exact, erf) or "gelu_tanh" (GPT-2's tanh form)
    #: the MLP's GELU in its first Linear's GEMM epilogue (dense and tensor-parallel alike)
    fused_mlp: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            _check_int(name, getattr(self, name), 1, MAX_EXTENT)
        _check_int("seed", self.seed, 0, 2**64)
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd ({self.n_embd}) must be divisible by n_head "
                             f"({self.n_head})")
        for name in ("dropout", "attn_dropout"):
            p = getattr(self, name)
            if p is None and name == "attn_dropout":
                continue
            if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
                raise ValueError(f"GPTConfig: {name} must be a number in [0, 1], given "
                                 f"{_short(p)}")
        for name in ("bias", "tie_weights", "fused_mlp"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"GPTConfig: {name} must be True or False, given "
                                 f"{_short(getattr(self, name))}")
        if not isinstance(self.activation, str) or \
                self.activation not in ACTIVATION_APPROXIMATE:
            raise ValueError(f"GPTConfig: activation must be one of "
                             f"{sorted(ACTIVATION_APPROXIMATE)}, given {_short(self.activation)}")
        try:
            dtype = as_dtype(self.dtype)
        except (TypeError, ValueError):
            dtype = None
        if dtype is None or not is_float(dtype):
            raise ValueError(f"GPTConfig: dtype must be a float dtype (float32, float64, "
                             f"float16, bfloat16), given {_short(self.dtype)}")
        if self.num_parameters() > MAX_PARAMETERS:
            raise ValueError(f"GPTConfig: vocab_size {self.vocab_size}, block_size "
                             f"{self.block_size}, n_layer {self.n_layer}, n_embd {self.n_embd} "
                             f"give {self.num_parameters():.3g} parameters, more than "
                             f"{MAX_PARAMETERS:.3g} (2**40: {4 * MAX_PARAMETERS / 2**40:.0f} "
                             f"TiB as float32)")

    def num_parameters(self) -> int:
        """How many parameters nn.GPT(self) has (computed, nothing allocated)."""
        C, V, b = self.n_embd, self.vocab_size, int(bool(self.bias))
        block = 12 * C * C + 2 * C + 11 * C * b  # 2 norms, qkv, proj, fc, proj (+ biases)
        head = 0 if self.tie_weights else C * V
        return V * C + self.block_size * C + self.n_layer * block + C * (1 + b) + head


#: The largest extent (vocabulary, context, layers, heads, width): kernels index in int32.
MAX_EXTENT = 2**31 - 1
#: The most parameters a GPTConfig may describe (4 TiB as float32: no machine holds more).
MAX_PARAMETERS = 2**40


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) \
            or not low <= value <= high:
        raise ValueError(f"GPTConfig: {name} must be an integer in [{low}, {high}], given "
                         f"{_short(value)}")
