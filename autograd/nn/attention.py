"""nn.MultiheadAttention (PyTorch's names, options and state_dict keys) from Linear-style
projections and scaled_dot_product_attention."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.functions.attention import additive_mask, attention_weights
from autograd.functions.matmul import linear, matmul
from autograd.functions.shape import chunk
from autograd.nn import functional as F
from autograd.nn.layers import Linear, host_parameter
from autograd.nn.module import Module
from autograd.tensor import Tensor


def _not(mask: Any, like: Tensor) -> Any:
    """A bool mask in torch MHA's convention (True = do not attend) in sdpa's (True =
    attend), on `like`'s device: index bookkeeping on the mask array."""
    data = mask.data if isinstance(mask, Tensor) else mask
    if data.dtype != bool:
        return mask
    return Tensor(gp.to_device(~data, gp.device_of(like.data)))


class MultiheadAttention(Module):
    """``out_proj(concat_h softmax(Q_h K_h^T / sqrt(d) + mask) V_h)`` with
    ``[Q|K|V] = [query|key|value] @ in_proj_weight + in_proj_bias`` (per third).

    Parameters as torch: ``in_proj_weight`` (stored [E, 3E], our Linear layout; torch's
    [3E, E] loads with ``load_state_dict(..., layout="torch")``), ``in_proj_bias [3E]``,
    ``out_proj`` (a Linear). Init as torch: xavier-uniform in_proj_weight, zero biases,
    out_proj.weight U(+-1/sqrt(E)). Inputs [L, N, E] (``batch_first=True``: [N, L, E]) or
    unbatched [L, E]. kdim/vdim other than embed_dim, add_bias_kv and add_zero_attn are
    not supported.
    """

    _torch_transposed = ("in_proj_weight",)

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: int | None = None, vdim: int | None = None, batch_first: bool = False,
                 dtype: Any = np.float32, seed: int | None = None, device: str = "cpu") -> None:
        super().__init__()
        e, h = int(embed_dim), int(num_heads)
        if e <= 0 or h <= 0 or e % h:
            raise ValueError(f"MultiheadAttention: embed_dim must be a positive multiple of "
                             f"num_heads, given embed_dim={embed_dim}, num_heads={num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiheadAttention: dropout must lie in [0, 1), given {dropout}")
        if add_bias_kv or add_zero_attn or kdim not in (None, e) or vdim not in (None, e):
            raise ValueError("MultiheadAttention: add_bias_kv, add_zero_attn and kdim/vdim "
                             "other than embed_dim are not supported")
        self.embed_dim, self.num_heads, self.head_dim = e, h, e // h
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        rng = np.random.default_rng(seed)
        bound = math.sqrt(6.0 / (e + 3 * e))  # xavier_uniform_ on torch's [3E, E]
        self.in_proj_weight = host_parameter(rng.uniform(-bound, bound, (e, 3 * e)), dtype,
                                             device)
        self.in_proj_weight._in_out_layout = True
        if bias:
            self.in_proj_bias = host_parameter(np.zeros(3 * e), dtype, device)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(e, e, bias=bias, dtype=dtype, device=device,
                               seed=int(rng.integers(2 ** 63)))
        if bias:
            self.out_proj.bias = host_parameter(np.zeros(e), dtype, device)

    def _project(self, x: Tensor, part: int) -> Tensor:
        e = self.embed_dim
        w = self.in_proj_weight[:, part * e:(part + 1) * e]
        b = None if self.in_proj_bias is None else self.in_proj_bias[part * e:(part + 1) * e]
        return linear(x, w, b)

    def _heads(self, x: Tensor) -> Tensor:
        n, seq = x.shape[0], x.shape[1]
        return x.reshape(n, seq, self.num_heads, self.head_dim).permute(0, 2, 1, 3)

    def _mask(self, attn_mask: Any, key_padding_mask: Any, like: Tensor, lq: int, lk: int
              ) -> Any:
        """One mask for sdpa over [N, H, Lq, Lk] (bool: True = attend, or float additive)."""
        n, masks = like.shape[0], []
        if attn_mask is not None:
            m = _not(attn_mask, like)
            if m.ndim == 3:  # [N * H, Lq, Lk]
                if tuple(m.shape) != (n * self.num_heads, lq, lk):
                    raise ValueError(f"MultiheadAttention: a 3-D attn_mask must have shape "
                                     f"{(n * self.num_heads, lq, lk)}, given {tuple(m.shape)}")
                m = m.reshape(n, self.num_heads, lq, lk)
            elif m.ndim != 2 or tuple(m.shape) != (lq, lk):
                raise ValueError(f"MultiheadAttention: attn_mask must have shape {(lq, lk)} "
                                 f"or {(n * self.num_heads, lq, lk)}, given {tuple(m.shape)}")
            masks.append(m)
        if key_padding_mask is not None:
            k = _not(key_padding_mask, like)
            if tuple(k.shape) != (n, lk):
                raise ValueError(f"MultiheadAttention: key_padding_mask must have shape "
                                 f"{(n, lk)}, given {tuple(k.shape)}")
            masks.append(k.reshape(n, 1, 1, lk))
        if len(masks) < 2:
            return masks[0] if masks else None
        a, b = masks
        if a.dtype == bool and b.dtype == bool:  # both: attend where both allow
            return Tensor(a.data & b.data)
        a, b = (additive_mask(m, like, lq, lk) for m in masks)
        return a + b

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Any = None,
                need_weights: bool = True, attn_mask: Any = None,
                average_attn_weights: bool = True, is_causal: bool = False
                ) -> tuple[Tensor, Tensor | None]:
        """Returns (output like query, weights [N, Lq, Lk] averaged over heads, or
        [N, H, Lq, Lk], or None when ``need_weights=False``). ``attn_mask`` [Lq, Lk] or
        [N*H, Lq, Lk] and ``key_padding_mask`` [N, Lk]: bool with True = masked out (torch's
        MHA rule, the opposite of sdpa's) or float (added). ``is_causal`` without a mask
        applies the causal mask (torch requires the mask as well)."""
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = (t.reshape(1, *t.shape) for t in (query, key, value))
        elif not self.batch_first:
            query, key, value = (t.permute(1, 0, 2) for t in (query, key, value))
        if query.ndim != 3 or query.shape[-1] != self.embed_dim or key.shape != value.shape:
            raise ValueError(f"MultiheadAttention: expected query/key/value [.., .., "
                             f"{self.embed_dim}] with key and value alike, given "
                             f"{query.shape}, {key.shape}, {value.shape}")
        n, lq, lk = query.shape[0], query.shape[1], key.shape[1]
        if key_padding_mask is not None and unbatched:
            key_padding_mask = key_padding_mask.reshape(1, -1)
        mask = self._mask(attn_mask, key_padding_mask, query, lq, lk)
        causal = bool(is_causal) and mask is None
        if query is key and key is value:  # self-attention: one GEMM for Q, K and V
            q, k, v = chunk(F.linear(query, self.in_proj_weight, self.in_proj_bias), 3, dim=-1)
        else:
            q, k, v = (self._project(x, i) for i, x in enumerate((query, key, value)))
        q, k, v = self._heads(q), self._heads(k), self._heads(v)
        p_drop = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            weights = attention_weights(q, k, mask, p_drop, is_causal=causal)
            out = matmul(weights, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p_drop,
                                                 is_causal=causal)
        out = self.out_proj(out.permute(0, 2, 1, 3).reshape(n, lq, self.embed_dim))
        if weights is not None and average_attn_weights:
            weights = weights.mean(1)
        if unbatched:
            out = out.reshape(lq, self.embed_dim)
            weights = None if weights is None else weights.reshape(weights.shape[1:])
        elif not self.batch_first:
            out = out.permute(1, 0, 2)
        return out, weights

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")
