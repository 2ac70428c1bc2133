"""A Llama-style decoder-only transformer (transformers' LlamaForCausalLM numerics): pre-norm
blocks with RMSNorm, rotary position embeddings, grouped-query causal attention and a SwiGLU
MLP, no biases."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.functions.attention import head_sharded_attention, split_heads
from autograd.functions.rope import rope_split_heads
from autograd.nn import functional as F
from autograd.nn import generation, llama_io
from autograd.nn.layers import Embedding, Linear, RMSNorm
from autograd.nn.llama_config import LlamaConfig
from autograd.nn.module import Module, ModuleList
from autograd.nn.recompute import RecomputeLayers, recomputed
from autograd.tensor import Tensor


class LlamaAttention(Module):
    """``o_proj(concat_h softmax(q_h k_g(h)^T / sqrt(Dh) + causal mask) v_g(h))`` with
    ``q = rope(x @ Wq)`` (n_head heads), ``k = rope(x @ Wk)``, ``v = x @ Wv`` (n_kv_head
    heads each), query head h reading K/V head ``g(h) = h // (n_head / n_kv_head)``. The
    weights are ``[C, H Dh]``, ``[C, Hkv Dh]``, ``[C, Hkv Dh]`` and ``[H Dh, C]``; the
    number of heads is read from their widths, so a shard holding whole heads runs as is.

    RoPE runs while the heads are split out of the projections' ``[B, T, H Dh]`` into
    ``[B, H, T, Dh]`` (one pass, `rope_split_heads`: the layout the fused attention takes);
    positions start at ``offset``. The fused attention reads each query head's K/V head in
    place (grouped-query attention, ``enable_gqa``): K/V are never repeated per query
    head, and their gradients are summed over each group in the plans. A tensor-parallel shard
    (``first_head`` set by the sharding) drops, in training, the attention entries one
    process drops for its heads (`head_sharded_attention`), so the layouts agree."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.head_dim, self.rope_theta = cfg.head_dim, float(cfg.rope_theta)
        self.attn_dropout = float(cfg.dropout)
        self.n_head = cfg.n_head
        self.first_head = 0  # of the query heads this layer holds (a tensor-parallel shard's)
        kv = cfg.kv_heads * cfg.head_dim
        self.q_proj = Linear(cfg.n_embd, cfg.n_embd, bias=False, dtype=cfg.dtype, seed=0)
        self.k_proj = Linear(cfg.n_embd, kv, bias=False, dtype=cfg.dtype, seed=0)
        self.v_proj = Linear(cfg.n_embd, kv, bias=False, dtype=cfg.dtype, seed=0)
        self.o_proj = Linear(cfg.n_embd, cfg.n_embd, bias=False, dtype=cfg.dtype, seed=0)

    def forward(self, x: Tensor, offset: int = 0,
                cache: generation.LayerKV | None = None) -> Tensor:
        """``x [B, T, C]`` at positions ``offset ..`` -> ``[B, T, C]``. With ``cache``
        (generation: ``offset`` is its length), the keys and values of the earlier positions
        come from it, these are appended to it (``Hkv`` heads)."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        B, T = q.shape[:2]  # a sequence-parallel q_proj's output spans the whole sequence
        H, Hkv = q.shape[-1] // self.head_dim, k.shape[-1] // self.head_dim
        q = rope_split_heads(q, H, theta=self.rope_theta, offset=offset)  # [B, H, T, Dh]
        k = rope_split_heads(k, Hkv, theta=self.rope_theta, offset=offset)
        (v,) = split_heads(v, 1, Hkv)
        if cache is not None:
            k, v = cache.update(k, v)  # causal masks align to the last key
        # Grouped-query attention in the fused plans: query head h reads K/V head
        # h // (H / Hkv) in place, K/V are never repeated per query head.
        p = self.attn_dropout if self.training else 0.0
        if p > 0.0 and H != self.n_head:
            y = head_sharded_attention(q, k, v, dropout_p=p, is_causal=True,
                                       total_heads=self.n_head, first_head=self.first_head)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                               enable_gqa=Hkv != H)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * self.head_dim))


class LlamaMLP(Module):
    """``down_proj(silu(x @ W_gate) * (x @ W_up))``, the product fused (`F.swiglu`);
    ``W_gate, W_up [C, F]``, ``W_down [F, C]``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(cfg.n_embd, cfg.hidden, bias=False, dtype=cfg.dtype, seed=0)
        self.up_proj = Linear(cfg.n_embd, cfg.hidden, bias=False, dtype=cfg.dtype, seed=0)
        self.down_proj = Linear(cfg.hidden, cfg.n_embd, bias=False, dtype=cfg.dtype, seed=0)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.swiglu(self.gate_proj(x), self.up_proj(x)))


class LlamaBlock(Module):
    """``h = x + self_attn(input_layernorm(x))``, then ``h + mlp(post_attention_layernorm(h))``;
    with ``recompute_attention`` (set_recompute("attention")) the attention sub-layer is
    recomputed in backward (not when a generation cache is given: it appends to the cache)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.n_embd, eps=cfg.norm_eps, dtype=cfg.dtype)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.n_embd, eps=cfg.norm_eps, dtype=cfg.dtype)
        self.mlp = LlamaMLP(cfg)
        self.recompute_attention = False  # set_recompute("attention") (RecomputeLayers)

    def forward(self, x: Tensor, offset: int = 0,
                cache: generation.LayerKV | None = None) -> Tensor:
        h = self.input_layernorm(x)
        if cache is None:
            a = recomputed(self.recompute_attention, self.self_attn, h, offset)
        else:
            a = self.self_attn(h, offset, cache)
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaLayers(RecomputeLayers):
    """The forward pass over a Llama's parts, for every model built of them: `nn.Llama`, and
    `dist.ParallelLlama` (the same parts with parallel layers substituted, a pipeline stage's
    share of them). It reads ``config``, ``embed_tokens``, ``layers``, ``norm`` and
    ``lm_head``; a stage without the first (last) layers never runs `embed` (`logits`).
    Activation recomputation (`set_recompute`: "none", "attention", "block") is
    `RecomputeLayers`', as GPT's."""

    config: LlamaConfig
    blocks_name = "layers"

    def embed(self, idx: Any) -> Tensor:
        """``embed_tokens[idx]`` ``[B, T, C]`` for token ids ``idx [B, T]`` (int32 or int64,
        array or Tensor)."""
        idx = idx.data if isinstance(idx, Tensor) else idx
        if idx.ndim != 2:
            raise ValueError(f"Llama: idx must be [B, T] token ids, given shape "
                             f"{tuple(idx.shape)}")
        if idx.shape[1] > self.config.block_size:
            raise ValueError(f"Llama: sequence length {idx.shape[1]} exceeds block_size "
                             f"{self.config.block_size}")
        return self.embed_tokens(idx)

    def logits(self, x: Tensor) -> Tensor:
        """``norm(x)`` projected on the vocabulary: ``[B, T, C]`` -> ``[B, T, V]``."""
        x = self.norm(x)
        return x @ self.embed_tokens.weight.T if self.lm_head is None else self.lm_head(x)

    def forward_stage(self, x: Any, first: bool = True, last: bool = True) -> Tensor:
        """A contiguous part of the forward pass: `embed` first when ``first`` (``x`` is then
        the token ids), every block of ``layers`` in order (each recomputed in backward in
        "block" mode), `logits` last when ``last``. ``forward_stage(idx)`` is the logits of
        ``forward(idx)``."""
        if first:
            x = self.embed(x)
        for block in self.layers:
            x = self.run_block(block, x)
        return self.logits(x) if last else x


class Llama(LlamaLayers, Module):
    """``logits[B, T, V] = lm_head(norm(layers(embed_tokens[idx])))``.

    Parameters (transformers' LlamaForCausalLM names without its ``model.`` prefix, Linear
    weights stored ``[in, out]``): ``embed_tokens.weight [V, C]``,
    ``layers.{i}.input_layernorm.weight [C]``,
    ``layers.{i}.self_attn.{q,k,v,o}_proj.weight`` (``[C, H Dh]``, ``[C, Hkv Dh]`` twice,
    ``[H Dh, C]``), ``layers.{i}.post_attention_layernorm.weight [C]``,
    ``layers.{i}.mlp.{gate,up}_proj.weight [C, F]``, ``layers.{i}.mlp.down_proj.weight
    [F, C]``, ``norm.weight [C]`` and, untied only, ``lm_head.weight [C, V]`` (tied:
    ``logits = x @ embed_tokens.weight^T`` and ``lm_head`` is None).

    Init (transformers' Llama): matrices and the embedding N(0, 0.02), norms 1; drawn in
    ``named_parameters`` order from ``np.random.default_rng(config.seed)`` in float64 on the
    host, so the same seed gives the same model on any device. Norms and RoPE compute in
    float32 at least (float64 for a float64 model)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        cfg = self.config = config
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.n_embd, dtype=cfg.dtype, seed=0)
        self.layers = ModuleList([LlamaBlock(cfg) for _ in range(cfg.n_layer)])
        self.norm = RMSNorm(cfg.n_embd, eps=cfg.norm_eps, dtype=cfg.dtype)
        self.lm_head = (None if cfg.tie_weights else
                        Linear(cfg.n_embd, cfg.vocab_size, bias=False, dtype=cfg.dtype, seed=0))
        self._init_weights()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: Any = np.float32,
                        **overrides: Any) -> Llama:
        """The model of a Hugging Face LlamaForCausalLM folder (``config.json`` and
        ``model.safetensors`` or the shards of ``model.safetensors.index.json``; float32,
        float16 or bfloat16 tensors, cast to `dtype`). ``overrides`` (``block_size``,
        ``dropout``, ``seed``) replace config fields. Options nn.Llama does not implement
        (rope_scaling, biases, sliding windows, ...) and tensors that do not match the config
        raise ``llama_io.LlamaFormatError`` naming them. Returned in eval mode (as
        transformers' from_pretrained): call ``train()`` to train."""
        config, state = llama_io.load_llama(path, dtype=dtype, **overrides)
        model = cls(config)
        model.load_state_dict(state)
        return model.eval()

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """Write this model as a Hugging Face folder (``config.json`` with model_type llama
        + ``model.safetensors`` in the model's dtype, no ``lm_head.weight`` when tied) that
        ``transformers.LlamaForCausalLM.from_pretrained`` loads; returns the folder."""
        return llama_io.save_llama(self, path)

    def _init_weights(self) -> None:
        rng = np.random.default_rng(self.config.seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                values = np.ones(p.shape)
            else:
                values = rng.normal(0.0, 0.02, p.shape)
            p.data[...] = gp.to_device(values.astype(p.dtype), p.device)

    def forward(self, idx: Any, targets: Any = None) -> Tensor | tuple[Tensor, Tensor]:
        """``idx [B, T]`` -> logits ``[B, T, V]``; with ``targets [B, T]``, returns
        ``(logits, mean cross-entropy over B*T)`` (targets of -100 ignored)."""
        logits = self.forward_stage(idx)
        if targets is None:
            return logits
        B, T, V = logits.shape
        targets = targets.data if isinstance(targets, Tensor) else targets
        return logits, F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))

    def loss(self, idx: Any, targets: Any) -> Tensor:
        """Mean next-token cross-entropy of ``forward(idx)`` against ``targets [B, T]``."""
        return self.forward(idx, targets)[1]

    def forward_cached(self, idx: Any, cache: generation.KVCache) -> Tensor:
        """Logits ``[B, V]`` of the last of the tokens ``idx [B, T]`` placed at positions
        ``cache.length ..`` (RoPE from there) after the tokens whose keys and values ``cache``
        holds; each layer appends its keys and values to its entry."""
        x = self.embed(idx)
        B, T, _ = x.shape
        start = cache.length
        if start + T > self.config.block_size:
            raise ValueError(f"Llama.forward_cached: positions {start}..{start + T - 1} "
                             f"exceed block_size {self.config.block_size}")
        for block, kv in zip(self.layers, cache.layers, strict=True):
            x = block(x, start, kv)
        return self.logits(x[:, T - 1:]).reshape(B, self.config.vocab_size)

    def generate(self, idx: Any, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, use_cache: bool = True) -> Any:
        """Append ``max_new_tokens`` sampled tokens to ``idx [B, T]`` (``[B, T+n]``, same
        array kind and device), as `nn.GPT.generate`: the last ``block_size`` tokens seen,
        ``temperature`` 0 greedy, ``top_k``, ``top_p`` (nucleus), ``seed``; with
        ``use_cache`` a KV cache (RoPE continuing at the cached length), else each step
        re-runs the window."""
        return generation.generate(self, idx, max_new_tokens, temperature, top_k, top_p, seed,
                                   use_cache)
