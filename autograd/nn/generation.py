"""Autoregressive generation for the decoder models (nn.GPT, nn.Llama): a key/value cache
(the prompt runs once, then one token per step), and sampling with temperature, top-k and
top-p (nucleus) on the host.

A model takes part through ``config.block_size``, ``n_layer`` and
``forward_cached(idx, cache) -> logits [B, V]``: the logits of the last of the tokens
``idx [B, T]``, which sit at positions ``cache.length .. cache.length + T - 1`` after those
the cache holds; every attention layer appends its keys and values to its `LayerKV` and
attends over all of them (causal masks align to the last key: query i sees keys
``j <= i + cache.length``).

The window never slides inside the cache: once the sequence fills ``block_size``, each
further step re-runs the last ``block_size`` tokens from position 0 in a fresh cache, which
is exactly what re-running the whole cropped window each step computes.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

import autograd as ag
import gpuplan as gp
from autograd.tensor import Tensor


class LayerKV:
    """One attention layer's keys and values so far, ``[B, Hkv, L, Dh]`` each (None before
    the first call)."""

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new positions' ``k, v [B, Hkv, T, Dh]``; returns all keys and values
        ``[B, Hkv, L + T, Dh]``."""
        if self.k is not None:
            k, v = ag.cat([self.k, k], dim=-2), ag.cat([self.v, v], dim=-2)
        self.k, self.v = k, v
        return k, v


class KVCache:
    """The `LayerKV` of every layer of a model; ``length`` positions seen so far."""

    def __init__(self, n_layer: int) -> None:
        self.layers = [LayerKV() for _ in range(int(n_layer))]

    @property
    def length(self) -> int:
        k = self.layers[0].k if self.layers else None
        return 0 if k is None else int(k.shape[-2])


class CachedDecoder(Protocol):
    config: Any
    training: bool

    def forward_cached(self, idx: Any, cache: KVCache) -> Tensor: ...

    def forward(self, idx: Any) -> Tensor: ...

    def eval(self) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """ValueError naming the argument unless temperature >= 0, top_k >= 1 (or None) and
    0 < top_p <= 1 (or None)."""
    if not float(temperature) >= 0.0:
        raise ValueError(f"generate: temperature must be >= 0 (0 is greedy), given "
                         f"{temperature}")
    if top_k is not None and int(top_k) < 1:
        raise ValueError(f"generate: top_k must be >= 1 or None, given {top_k}")
    if top_p is not None and not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"generate: top_p must lie in (0, 1] or be None, given {top_p}")


def nucleus_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Boolean ``[B, V]``: the smallest set of most probable tokens per row whose
    probabilities add up to at least ``top_p`` (the most probable token always; ties in
    probability taken in token order)."""
    order = np.argsort(-probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, axis=-1)
    before = np.cumsum(ranked, axis=-1) - ranked  # mass of the tokens ranked above
    keep_ranked = before < top_p * ranked.sum(axis=-1, keepdims=True)
    keep_ranked[:, 0] = True
    keep = np.zeros_like(keep_ranked)
    np.put_along_axis(keep, order, keep_ranked, axis=-1)
    return keep


def sample(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
           rng: np.random.Generator) -> np.ndarray:
    """One token per row of ``logits [B, V]`` (float64, host) -> ``[B, 1]`` int64: argmax
    when ``temperature`` is 0; else softmax(logits / temperature) restricted to the ``top_k``
    largest, then to the nucleus of mass ``top_p`` (`nucleus_mask`), one uniform draw of
    `rng` per row."""
    if temperature == 0.0:
        return logits.argmax(axis=-1)[:, None]
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = np.sort(logits, axis=-1)[:, -int(top_k)][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        probs = np.where(nucleus_mask(probs, float(top_p)), probs, 0.0)
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random((logits.shape[0], 1))
    choice = (cdf < u * cdf[:, -1:]).sum(axis=-1)
    # a draw in a zero-probability tail (rounding at the cdf's top) goes to the last kept
    last_kept = logits.shape[-1] - 1 - np.argmax((probs > 0)[:, ::-1], axis=-1)
    return np.minimum(choice, last_kept)[:, None].astype(np.int64)


def _last_logits(model: CachedDecoder, out: np.ndarray, cache: KVCache | None,
                 device: str, use_cache: bool) -> tuple[np.ndarray, KVCache | None]:
    """float64 host logits ``[B, V]`` of the next token after ``out``, and the cache to use
    for the step after (None without the cache)."""
    window = model.config.block_size
    if not use_cache:
        cond = gp.to_device(np.ascontiguousarray(out[:, -window:]), device)
        return gp.to_host(model.forward(cond).data[:, -1, :]).astype(np.float64), None
    if cache is None or cache.length >= window:  # prefill (again, once the window is full)
        cache = KVCache(model.config.n_layer)
        new = out[:, -window:]
    else:
        new = out[:, -1:]
    logits = model.forward_cached(gp.to_device(np.ascontiguousarray(new), device), cache)
    return gp.to_host(logits.data).astype(np.float64), cache


def generate(model: CachedDecoder, idx: Any, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             use_cache: bool = True) -> Any:
    """``idx [B, T]`` followed by ``max_new_tokens`` tokens, each `sample`d from the
    model's next-token logits (same array kind, dtype and device as ``idx``). The model
    sees the last ``block_size`` tokens; with ``use_cache`` the prompt runs once and each
    step feeds one token through the cache, without it each step re-runs the window. Runs
    in eval mode without gradients, then restores the model's mode."""
    check_sampling(temperature, top_k, top_p)
    if int(max_new_tokens) < 0:
        raise ValueError(f"generate: max_new_tokens must be >= 0, given {max_new_tokens}")
    data = idx.data if isinstance(idx, Tensor) else idx
    if data.ndim != 2 or data.shape[1] == 0:
        raise ValueError(f"generate: idx must be [B, T] token ids with T >= 1, given shape "
                         f"{tuple(data.shape)}")
    device = gp.device_of(data)
    host = gp.to_host(data)
    out = host.astype(np.int64)
    rng = np.random.default_rng(seed)
    was_training = model.training
    model.eval()
    cache = None
    try:
        with ag.no_grad():
            for _ in range(int(max_new_tokens)):
                logits, cache = _last_logits(model, out, cache, device, use_cache)
                token = sample(logits, float(temperature), top_k, top_p, rng)
                out = np.concatenate([out, token], axis=1)
    finally:
        model.train(was_training)
    result = gp.to_device(out.astype(host.dtype), device)
    return ag.tensor(result) if isinstance(idx, Tensor) else result


__all__ = ["KVCache", "LayerKV", "check_sampling", "generate", "nucleus_mask", "sample"]
