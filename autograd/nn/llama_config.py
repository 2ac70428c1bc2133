"""LlamaConfig: the shape and options of a Llama model (nn.Llama), with the names of the
design contract."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Llama's SwiGLU width rule rounds 2/3 of 4 * n_embd up to a multiple of this.
FFN_MULTIPLE_OF = 256


def llama_ffn_hidden(n_embd: int, multiple_of: int = FFN_MULTIPLE_OF) -> int:
    """Meta's rule for the SwiGLU width: ``int(2 * 4 * n_embd / 3)`` rounded up to a
    multiple of ``multiple_of`` (4096 -> 11008, 2048 -> 5632)."""
    hidden = int(2 * 4 * int(n_embd) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class LlamaConfig:
    """Model shape and options. ``n_embd`` divisible by ``n_head`` into an even head
    dim (RoPE rotates pairs), ``n_head`` divisible by ``n_kv_head``."""

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    #: grouped-query attention: K/V heads, each shared by n_head / n_kv_head query heads;
    #: None means n_head (multi-head attention), 1 multi-query attention.
    n_kv_head: int | None = None
    #: SwiGLU width; None: Llama's rule from n_embd (`llama_ffn_hidden`).
    ffn_hidden: int | None = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_weights: bool = False
    #: dropout of the attention probabilities (transformers' attention_dropout); Llama has
    #: no other dropout.
    dropout: float = 0.0
    dtype: Any = np.float32
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"LlamaConfig: {name} must be > 0, given "
                                 f"{getattr(self, name)}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(f"LlamaConfig: n_embd ({self.n_embd}) must be n_head "
                             f"({self.n_head}) times an even head dim")
        if self.n_kv_head is not None and (
                int(self.n_kv_head) <= 0 or self.n_head % int(self.n_kv_head)):
            raise ValueError(f"LlamaConfig: n_kv_head must divide n_head ({self.n_head}), "
                             f"given {self.n_kv_head}")
        if self.ffn_hidden is not None and int(self.ffn_hidden) <= 0:
            raise ValueError(f"LlamaConfig: ffn_hidden must be > 0 or None, given "
                             f"{self.ffn_hidden}")
        if not self.rope_theta > 0 or not np.isfinite(self.rope_theta):
            raise ValueError(f"LlamaConfig: rope_theta must be a finite number > 0, given "
                             f"{self.rope_theta}")
        if not self.norm_eps >= 0:
            raise ValueError(f"LlamaConfig: norm_eps must be >= 0, given {self.norm_eps}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LlamaConfig: dropout must lie in [0, 1), given {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """n_kv_head, or n_head when it is None."""
        return self.n_head if self.n_kv_head is None else int(self.n_kv_head)

    @property
    def hidden(self) -> int:
        """ffn_hidden, or Llama's rule from n_embd when it is None."""
        return llama_ffn_hidden(self.n_embd) if self.ffn_hidden is None else int(self.ffn_hidden)
