"""A GPT-2-style decoder-only transformer (pre-LN blocks, causal attention, tied head)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.functions.attention import head_sharded_attention, split_heads
from autograd.nn import functional as F
from autograd.nn import generation, gpt2_io
from autograd.nn.gpt_config import ACTIVATION_APPROXIMATE, GPTConfig
from autograd.nn.layers import GELU, Dropout, Embedding, LayerNorm, Linear
from autograd.nn.module import Module, ModuleList
from autograd.nn.recompute import RecomputeLayers, recomputed
from autograd.tensor import Tensor


class CausalSelfAttention(Module):
    """``qkv = x @ W_qkv + b`` with ``W_qkv [C, 3C]`` whose columns are
    ``[q heads | k heads | v heads]`` (head h of q = columns ``h*Dh:(h+1)*Dh``), so a
    tensor-parallel split over heads is a column slice of each third;
    ``y = proj(concat_h softmax(q_h k_h^T / sqrt(Dh) + causal mask) v_h)``. In training,
    ``config.attn_dropout`` drops attention probabilities (inside the fused attention plans)
    and ``config.dropout`` the block's output. A tensor-parallel shard (``first_head`` set by
    the sharding) drops the entries one process drops for its heads, so the layouts agree.

    The number of heads is read from the width of ``qkv``'s output (``3 H Dh``), so a
    ``qkv``/``proj`` pair holding whole heads only (a tensor-parallel shard whose columns are
    ``[q | k | v]`` of its heads, and the matching rows of ``proj``) runs unchanged."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.attn_dropout = cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout
        self.first_head = 0  # of the heads this layer holds (a tensor-parallel shard's)
        self.qkv = Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype, seed=0)
        self.proj = Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype, seed=0)
        self.resid_drop = Dropout(cfg.dropout)

    def forward(self, x: Tensor, cache: generation.LayerKV | None = None) -> Tensor:
        """``x [B, T, C]`` -> ``[B, T, C]``. With ``cache`` (generation), the keys and values
        of the positions before these are prepended from it (and these appended to it)."""
        qkv = self.qkv(x)
        B, T = qkv.shape[:2]  # a sequence-parallel qkv's output spans the whole sequence
        width = qkv.shape[-1] // 3  # H * Dh for the heads this layer holds
        H = width // self.head_dim
        q, k, v = split_heads(qkv, 3, H)  # [B, H, T, Dh] each
        if cache is not None:
            k, v = cache.update(k, v)  # causal masks align to the last key
        p = self.attn_dropout if self.training else 0.0
        if p > 0.0 and H != self.n_head:
            y = head_sharded_attention(q, k, v, dropout_p=p, is_causal=True,
                                       total_heads=self.n_head, first_head=self.first_head)
        else:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, width)
        return self.resid_drop(self.proj(y))


class MLP(Module):
    """``proj(gelu(x @ W_fc + b_fc))`` with hidden width ``4 C`` (exact GELU, or its tanh form
    with ``config.activation == "gelu_tanh"``). With ``config.fused_mlp`` the GELU runs in
    fc's GEMM epilogue (``fc.forward_gelu``: `nn.Linear`'s, or a column-parallel layer's on
    its shard); without it, or for an fc that has no fused form, fc then act."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype, seed=0)
        self.act = GELU(approximate=ACTIVATION_APPROXIMATE[cfg.activation])
        self.proj = Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype, seed=0)
        self.drop = Dropout(cfg.dropout)
        self.fused = bool(cfg.fused_mlp)

    def forward(self, x: Tensor) -> Tensor:
        fused = getattr(self.fc, "forward_gelu", None) if self.fused else None
        h = fused(x, self.act.approximate) if fused is not None else self.act(self.fc(x))
        return self.drop(self.proj(h))


def add_norm(x: Tensor, residual: Tensor, norm: Module) -> tuple[Tensor, Tensor]:
    """``(s, norm(s))`` with ``s = x + residual``: the norm's own fused form
    (``forward_residual``: `nn.LayerNorm`'s is one plan, `F.residual_layer_norm`) where it has
    one, the two ops otherwise."""
    fused = getattr(norm, "forward_residual", None)
    if fused is not None:
        return fused(x, residual)
    s = x + residual
    return s, norm(s)


class Block(Module):
    """Pre-LN transformer block: ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``; the first
    residual add and ln_2 run as one op (`add_norm`), and in a chain of blocks
    (`GPT.forward_stage`) the previous block's output add runs with ln_1 likewise."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype)
        self.mlp = MLP(cfg)
        self.recompute_attention = False  # set_recompute("attention") (RecomputeLayers)

    def forward(self, x: Tensor) -> Tensor:
        s, m = self.residual_branches(x)
        return s + m

    def residual_branches(self, x: Tensor, residual: Tensor | None = None
                          ) -> tuple[Tensor, Tensor]:
        """``(s, m)``, the block's output being ``s + m``: ``s = x + attn(ln_1(x))`` and
        ``m = mlp(ln_2(s))`` (a caller that normalizes the output fuses that last add). With
        ``residual``, the block's input is ``x + residual``, added with ln_1 (`add_norm`):
        the ``(s, m)`` of the block before, whose output add is then never run alone."""
        if residual is None:
            h = self.ln_1(x)
        else:
            x, h = add_norm(x, residual, self.ln_1)
        a = recomputed(self.recompute_attention, self.attn, h)
        s, h = add_norm(x, a, self.ln_2)
        return s, self.mlp(h)

    def forward_cached(self, x: Tensor, cache: generation.LayerKV) -> Tensor:
        """`forward` of the positions after those in ``cache`` (see `GPT.forward_cached`)."""
        s, h = add_norm(x, self.attn(self.ln_1(x), cache), self.ln_2)
        return s + self.mlp(h)


_POSITIONS: dict[tuple[int, str], Any] = {}


def _positions(T: int, device: str) -> Any:
    """``arange(T)`` on `device`, made once (read only): no host-to-device copy per forward,
    which a captured CUDA graph could not contain (gpuplan.graphs)."""
    pos = _POSITIONS.get((T, device))
    if pos is None:
        pos = _POSITIONS[(T, device)] = gp.asarray(np.arange(T, dtype=np.int64), device=device)
    return pos


class GPTLayers(RecomputeLayers):
    """The forward pass over a GPT's parts, for every model built of them: `nn.GPT`, and
    `dist.ParallelGPT` (the same parts with parallel layers substituted, a pipeline stage's
    share of them). It reads ``config``, ``wte``, ``wpe``, ``drop``, ``blocks``, ``ln_f`` and
    ``head``; a stage without the first (last) layers never runs `embed` (`logits`).
    Activation recomputation (`set_recompute`) is `RecomputeLayers`'.
    """

    config: GPTConfig
    blocks_name = "blocks"

    def embed(self, idx: Any) -> Tensor:
        """``drop(wte[idx] + wpe[0:T])`` ``[B, T, C]`` for token ids ``idx [B, T]`` (int32 or
        int64, array or Tensor)."""
        idx = idx.data if isinstance(idx, Tensor) else idx
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"GPT: sequence length {T} exceeds block_size "
                             f"{self.config.block_size}")
        return self.drop(self.wte(idx) + self.wpe(_positions(T, gp.device_of(idx))))

    def logits(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """``ln_f(x)`` projected on the vocabulary: ``head(ln_f(x))``, or with tied weights
        (``head`` None) ``ln_f(x) @ wte.weight^T``; ``[B, T, C]`` -> ``[B, T, V]``. With
        ``residual``, of ``x + residual`` (the add fused with ln_f, `add_norm`)."""
        x = self.ln_f(x) if residual is None else add_norm(x, residual, self.ln_f)[1]
        return x @ self.wte.weight.T if self.head is None else self.head(x)

    def forward_stage(self, x: Any, first: bool = True, last: bool = True) -> Tensor:
        """A contiguous part of the forward pass: `embed` first when ``first`` (``x`` is then
        the token ids), every module of ``blocks`` in order, `logits` last when ``last``
        (then the last block's output add runs with ln_f: ``logits(s, m)`` of its
        `Block.residual_branches`). ``forward_stage(idx)`` is ``forward(idx)``.

        Each block's output add ``s + m`` runs with the next block's ln_1 (or ln_f), one
        `add_norm` (`F.residual_layer_norm`: the composed ops' bits in one pass, and one
        gradient for both addends in backward); only a stage's last output is added alone.
        A module of ``blocks`` without `Block.residual_branches` runs as ``block(x)``."""
        if first:
            x = self.embed(x)
        pending = None  # m of the last block run: its output is x + pending, not yet added
        for block in self.blocks:
            if hasattr(block, "residual_branches"):
                x, pending = self.run_block(block.residual_branches, x, pending)
                continue
            if pending is not None:
                x, pending = x + pending, None
            x = self.run_block(block, x)
        if last:
            return self.logits(x, pending)
        return x if pending is None else x + pending


class GPT(GPTLayers, Module):
    """``logits[B, T, V] = head(ln_f(blocks(wte[idx] + wpe[0:T])))``.

    Parameters (names Megatron-friendly): ``wte.weight [V, C]``, ``wpe.weight [block, C]``,
    ``blocks.{i}.ln_1.*``, ``blocks.{i}.attn.qkv.weight [C, 3C]``,
    ``blocks.{i}.attn.proj.weight [C, C]``, ``blocks.{i}.ln_2.*``,
    ``blocks.{i}.mlp.fc.weight [C, 4C]``, ``blocks.{i}.mlp.proj.weight [4C, C]``,
    ``ln_f.*`` and, untied only, ``head.weight [C, V]`` (tied: ``logits = x @ wte.weight^T``,
    and ``head`` is None).

    ``forward`` is ``embed``, every module of ``blocks``, then ``logits``; `forward_stage` runs
    a contiguous part of that chain, which is how a pipeline stage runs its share. A parallel
    model is this module with layers substituted (``blocks`` holding a stage's blocks, ``wte``
    and ``head`` vocabulary-parallel, ...): these methods run it unchanged.

    Init (GPT-2): matrices and embeddings N(0, 0.02), the residual projections
    (``attn.proj``, ``mlp.proj``) N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm 1/0; drawn
    in ``named_parameters`` order from ``np.random.default_rng(config.seed)`` in float64 on the
    host, so the same seed gives the same model on any device or parallel layout.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        cfg = self.config = config
        self.wte = Embedding(cfg.vocab_size, cfg.n_embd, dtype=cfg.dtype, seed=0)
        self.wpe = Embedding(cfg.block_size, cfg.n_embd, dtype=cfg.dtype, seed=0)
        self.drop = Dropout(cfg.dropout)
        self.blocks = ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = LayerNorm(cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype)
        self.head = (None if cfg.tie_weights else
                     Linear(cfg.n_embd, cfg.vocab_size, bias=False, dtype=cfg.dtype, seed=0))
        self._init_weights()

    @classmethod
    def from_pretrained_gpt2(cls, path: str | os.PathLike, block_size: int | None = None,
                             **overrides: Any) -> GPT:
        """The model of a Hugging Face GPT-2 folder (``config.json`` + ``model.safetensors``,
        as ``save_pretrained`` writes it): the config's shape and activation ("gelu_new" is
        ``activation="gelu_tanh"``), its weights. ``block_size`` (at most ``n_positions``)
        keeps the first rows of ``wpe``; ``overrides`` (``dropout``, ``dtype``, ``seed``)
        replace config fields. Options nn.GPT lacks raise ``gpt2_io.GPT2FormatError``.
        Returned in eval mode (as transformers' from_pretrained): call ``train()`` to train."""
        config, state = gpt2_io.load_gpt2(path, block_size, **overrides)
        model = cls(config)
        model.load_state_dict(state)
        return model.eval()

    def save_pretrained_gpt2(self, path: str | os.PathLike) -> Path:
        """Write this model as a Hugging Face GPT-2 folder (``config.json`` with model_type
        gpt2 + ``model.safetensors``) that ``transformers.GPT2LMHeadModel.from_pretrained``
        loads; returns the folder. ``bias=False`` models raise (GPT-2 has biases)."""
        return gpt2_io.save_gpt2(self, path)

    def _init_weights(self) -> None:
        rng = np.random.default_rng(self.config.seed)
        resid_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 2)
            if ".ln_" in f".{name}" and leaf[-1] == "weight":
                values = np.ones(p.shape)
            elif leaf[-1] == "bias":
                values = np.zeros(p.shape)
            elif name.endswith(("attn.proj.weight", "mlp.proj.weight")):
                values = rng.normal(0.0, resid_std, p.shape)
            else:
                values = rng.normal(0.0, 0.02, p.shape)
            p.data[...] = gp.to_device(values.astype(p.dtype), p.device)

    def forward(self, idx: Any, targets: Any = None) -> Tensor | tuple[Tensor, Tensor]:
        """``idx [B, T]`` int32/int64 (array or Tensor) -> logits ``[B, T, V]``; with
        ``targets [B, T]``, returns ``(logits, mean cross-entropy over B*T)``."""
        logits = self.forward_stage(idx)
        if targets is None:
            return logits
        B, T, V = logits.shape
        targets = targets.data if isinstance(targets, Tensor) else targets
        loss = F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))
        return logits, loss

    def loss(self, idx: Any, targets: Any) -> Tensor:
        """Mean next-token cross-entropy of ``forward(idx)`` against ``targets [B, T]``."""
        return self.forward(idx, targets)[1]

    def forward_cached(self, idx: Any, cache: generation.KVCache) -> Tensor:
        """Logits ``[B, V]`` of the last of the tokens ``idx [B, T]`` placed at positions
        ``cache.length ..`` (``wpe`` rows from there) after the tokens whose keys and values
        ``cache`` holds; each block appends its keys and values to its layer's entry."""
        idx = idx.data if isinstance(idx, Tensor) else idx
        B, T = idx.shape
        start = cache.length
        if start + T > self.config.block_size:
            raise ValueError(f"GPT.forward_cached: positions {start}..{start + T - 1} exceed "
                             f"block_size {self.config.block_size}")
        x = self.drop(self.wte(idx) +
                      self.wpe(_positions(start + T, gp.device_of(idx))[start:]))
        for block, kv in zip(self.blocks, cache.layers, strict=True):
            x = block.forward_cached(x, kv)
        return self.logits(x[:, T - 1:]).reshape(B, self.config.vocab_size)

    def generate(self, idx: Any, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 seed: int | None = None, use_cache: bool = True) -> Any:
        """Append ``max_new_tokens`` sampled tokens to ``idx [B, T]`` (returns ``[B, T+n]``,
        same array kind and device as ``idx``). The model sees the last ``block_size``
        tokens (a longer prompt is cropped, a longer output slides the window); the last
        logits are scaled by ``1/temperature`` (0 means greedy argmax), cut to the ``top_k``
        largest and the ``top_p`` nucleus, and sampled with ``np.random.default_rng(seed)``
        on the host. With ``use_cache`` (a KV cache, `generation`) the prompt runs once and
        each step feeds one token; without, each step re-runs the window: the same tokens."""
        return generation.generate(self, idx, max_new_tokens, temperature, top_k, top_p, seed,
                                   use_cache)

