"""GPTConfig: the shape and options of a GPT model (nn.GPT, dist.ParallelGPT)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

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
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"GPTConfig: {name} must be > 0, given {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd ({self.n_embd}) must be divisible by n_head "
                             f"({self.n_head})")
        for name in ("dropout", "attn_dropout"):
            p = getattr(self, name)
            if p is not None and not 0.0 <= p <= 1.0:
                raise ValueError(f"GPTConfig: {name} must lie in [0, 1], given {p}")
        if self.activation not in ACTIVATION_APPROXIMATE:
            raise ValueError(f"GPTConfig: activation must be one of "
                             f"{sorted(ACTIVATION_APPROXIMATE)}, given {self.activation!r}")
