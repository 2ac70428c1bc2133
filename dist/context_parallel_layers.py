"""The layers a decoder's context-parallel slice substitutes (`dist.context_parallel`'s
layout: rank i of the cp group holds chunks i and 2cp - 1 - i of every sequence).

What depends on a token's place in the sequence must follow its global position, not its
place in the local slice: causal attention runs as ring attention over the cp group
(`RingSelfAttention` for GPT, `RingLlamaAttention` for Llama, whose RoPE rotates each
chunk by its global offset), GPT's learned positions are looked up at the global positions
(`ContextParallelPositions`), and dropout draws each token's entries of the whole tensor's
mask (`PositionDropout`), so a run drops the same entries at any cp (and tp, sp).

Each substitute holds the dense module's own sub-modules under the same names, so parameter
names, shard specs and tensor-parallel shards are unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import autograd as ag
import autograd.nn.functional as F
from autograd.functions.attention import split_heads
from autograd.functions.rope import rope_split_heads
from autograd.nn import Module, Parameter
from autograd.tensor import Tensor
from dist.communicator import Communicator
from dist.context_parallel import chunk_indices, local_positions, ring_attention
from gpuplan import backend
from gpuplan.errors import InvalidProblem, describe

_SIZE_ONE = (1, 0)


def _group(comm: Communicator | None) -> tuple[int, int]:
    return _SIZE_ONE if comm is None else (comm.size, comm.rank)


def held_positions(local_length: int, cp: Communicator | None,
                   sp: Communicator | None = None) -> tuple[np.ndarray, int]:
    """(global positions of the tokens this rank holds, the whole sequence length) for a
    tensor of `local_length` tokens along the sequence: its cp slice (chunks i and
    2cp - 1 - i), and with sequence parallelism over `sp` the sp rank's equal part of it."""
    (n, r), (t, s) = _group(cp), _group(sp)
    whole = local_length * n * t
    positions = local_positions(whole, n, r)
    return positions[s * local_length:(s + 1) * local_length], whole


class ContextParallelPositions(Module):
    """``weight[global positions]``: a learned position table (GPT's ``wpe``, shared with the
    dense layer: same Parameter and name) looked up for the tokens this rank holds. Called
    as `nn.GPT.embed` calls ``wpe``, with ``arange(T_local)`` (the cp-local length; with
    sequence parallelism the sp part of it is looked up). Its gradient covers those rows
    only: the model sums it over the groups."""

    def __init__(self, weight: Parameter, cp: Communicator | None,
                 sp: Communicator | None = None) -> None:
        super().__init__()
        self.weight, self.cp, self.sp = weight, cp, sp

    def forward(self, ids: Any) -> Tensor:
        ids = ids.data if isinstance(ids, Tensor) else ids
        t = _group(self.sp)[0]
        positions, _ = held_positions(ids.shape[-1] // t, self.cp, self.sp)
        return F.embedding(backend.asarray(positions, device=backend.device_of(ids)),
                           self.weight)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, cp={_group(self.cp)[0]}"


class PositionDropout(Module):
    """``dropout(x_whole, p)[held]`` for ``x [B, T_held, ...]``, the tokens this rank holds
    (`held_positions`) along axis 1 of the whole ``x_whole [B, T, ...]``: each entry's mask is
    the one `nn.Dropout` draws for its place in the whole tensor, and the default generator
    advances by the whole tensor's count, so masks agree with one process. The held rows are
    placed in a zero whole tensor (a gather from ``x`` and a zero row), dropped by the same
    plan, and gathered back: a transient whole-tensor buffer per call."""

    def __init__(self, p: float, cp: Communicator | None,
                 sp: Communicator | None = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"PositionDropout: p must lie in [0, 1), given {p}")
        self.p, self.cp, self.sp = float(p), cp, sp

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        held, whole = held_positions(x.shape[1], self.cp, self.sp)
        source = np.full(whole, len(held), np.int64)  # row len(held): the zero row
        source[held] = np.arange(len(held))
        zero = ag.zeros((x.shape[0], 1) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
        padded = ag.cat([x, zero], 1)[:, backend.asarray(source, device=x.device)]
        dropped = F.dropout(padded, self.p, training=True)
        return dropped[:, backend.asarray(held, device=x.device)]

    def extra_repr(self) -> str:
        return f"p={self.p}, cp={_group(self.cp)[0]}"


def _no_cache(cache: Any, op: str) -> None:
    if cache is not None:
        raise InvalidProblem(describe(op, "cache", "None (context parallelism runs whole "
                                      "sequences; generate with the dense model)", "a cache"))


class RingSelfAttention(Module):
    """GPT's `CausalSelfAttention` (``qkv``, ``proj``, ``resid_drop``, possibly
    tensor-parallel shards) with its causal attention run as `ring_attention` over the cp
    group on this rank's slice of the sequences."""

    def __init__(self, dense: Module, cp: Communicator) -> None:
        super().__init__()
        if dense.attn_dropout > 0.0:
            raise InvalidProblem(describe("ParallelGPT", "attn_dropout", "0 with context "
                                          f"parallelism (cp={cp.size})", dense.attn_dropout))
        self.cp, self.head_dim = cp, dense.head_dim
        self.qkv, self.proj, self.resid_drop = dense.qkv, dense.proj, dense.resid_drop

    def forward(self, x: Tensor, cache: Any = None) -> Tensor:
        _no_cache(cache, "RingSelfAttention")
        qkv = self.qkv(x)
        B, T = qkv.shape[:2]
        width = qkv.shape[-1] // 3
        q, k, v = split_heads(qkv, 3, width // self.head_dim)
        y = ring_attention(q, k, v, self.cp)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(B, T, width)))


class RingLlamaAttention(Module):
    """Llama's `LlamaAttention` (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, possibly
    tensor-parallel shards; grouped-query attention) on this rank's slice of the sequences:
    RoPE rotates each of its two chunks from the chunk's global offset, and attention is
    `ring_attention` over the cp group."""

    def __init__(self, dense: Module, cp: Communicator) -> None:
        super().__init__()
        if dense.attn_dropout > 0.0:
            raise InvalidProblem(describe("ParallelLlama", "dropout", "0 with context "
                                          f"parallelism (cp={cp.size})", dense.attn_dropout))
        self.cp, self.head_dim, self.rope_theta = cp, dense.head_dim, dense.rope_theta
        self.q_proj, self.k_proj = dense.q_proj, dense.k_proj
        self.v_proj, self.o_proj = dense.v_proj, dense.o_proj

    def _rope(self, x: Tensor, heads: int) -> Tensor:
        """``x [B, T_local, H Dh]`` -> ``[B, H, T_local, Dh]``, each chunk rotated from its
        global offset."""
        c = x.shape[1] // 2
        chunks = chunk_indices(self.cp.size, self.cp.rank)
        parts = [rope_split_heads(x[:, j * c:(j + 1) * c], heads, theta=self.rope_theta,
                                  offset=int(chunk * c)) for j, chunk in enumerate(chunks)]
        return ag.cat(parts, 2)

    def forward(self, x: Tensor, offset: int = 0, cache: Any = None) -> Tensor:
        _no_cache(cache, "RingLlamaAttention")
        if offset:
            raise InvalidProblem(describe("RingLlamaAttention", "offset", "0 (the chunks' "
                                          "global offsets are the layout's)", offset))
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        B, T = q.shape[:2]
        H, Hkv = q.shape[-1] // self.head_dim, k.shape[-1] // self.head_dim
        (v,) = split_heads(v, 1, Hkv)
        y = ring_attention(self._rope(q, H), self._rope(k, Hkv), v, self.cp)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * self.head_dim))


__all__ = ["ContextParallelPositions", "PositionDropout", "RingLlamaAttention",
           "RingSelfAttention", "held_positions"]
