"""A tensor- and pipeline-parallel GPT whose parameters are exact shards of `nn.GPT`.

Layout (Megatron-LM style), for a tensor-parallel group of size ``t`` and ``p`` stages:

* attention: ``qkv`` is a ColumnParallelLinear whose rank-``r`` block holds the q, k and v
  columns of heads ``[r*H/t, (r+1)*H/t)`` (the dense ``[q | k | v]`` columns permuted so
  that each rank owns whole heads), attention runs on the local heads with no
  communication, ``proj`` is a RowParallelLinear (one all-reduce, bias after it);
* MLP: ``fc`` column-parallel, GELU on the local hidden block, ``proj`` row-parallel;
* token embedding: a VocabParallelEmbedding (rows of ``wte`` split by `vocab_range`);
  position embedding and every LayerNorm are replicated;
* head: ``logits_r = ln_f(x) @ wte_r^T`` -- this rank's vocabulary columns, fed to
  `vocab_parallel_cross_entropy` so the ``[N, V]`` logits are never gathered;
* pipeline: stage ``s`` holds blocks ``[s*L/p, (s+1)*L/p)``, the first stage also the
  embeddings, the last also ``ln_f`` and the head. With tied weights and ``p > 1`` the last
  stage keeps a copy of the ``wte`` shard; after each backward the two copies' gradients are
  summed (first <-> last stage), so both see the dense gradient and stay equal.

Dropout acts only on replicated activations (embedding output, attention and MLP outputs
after the row-parallel reduce), drawn from the default generator, which
`dist.model_parallel_seed` seeds identically across a tensor-parallel group: the masks agree
across TP ranks as they must. Every parameter records its dense name and the indices it
holds (`ParallelGPT.shard_specs`), which drives tests, checkpoint consolidation and
`scripts/generate.py`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import autograd as ag
import gpuplan as gp
from autograd.nn import GPT, GPTConfig, Module, ModuleList, Parameter
from autograd.nn import functional as F
from autograd.nn.layers import GELU, Dropout
from autograd.tensor import Tensor
from dist.communicator import Communicator
from dist.models.sharding import ShardSpec, consolidate
from dist.pipeline.runner import PipelineParallel, _data
from dist.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelConfig,
)
from dist.tensor_parallel.mappings import copy_to_tensor_parallel_region
from dist.tensor_parallel.vocab import (
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
    vocab_range,
)
from gpuplan.errors import InvalidProblem, describe

_TIED_TAG = 7919  # pp-group tag of the tied-embedding gradient exchange


def _spec(p: Parameter, spec: ShardSpec) -> Parameter:
    p.shard_spec = spec
    return p


def _cols(start: int, stop: int) -> tuple[int, ...]:
    return tuple(range(start, stop))


def _qkv_order(n_embd: int, n_head: int, tp: int) -> np.ndarray:
    """Dense qkv column order whose contiguous block r is [q | k | v] of rank r's heads."""
    per_rank = (n_head // tp) * (n_embd // n_head)
    return np.concatenate([np.arange(part * n_embd + r * per_rank,
                                     part * n_embd + (r + 1) * per_rank)
                           for r in range(tp) for part in range(3)])


def _divisible(arg: str, value: int, size: int, what: str) -> int:
    if value % size:
        raise InvalidProblem(describe("ParallelGPT", arg, f"divisible by the {what} {size}",
                                      value))
    return value // size


class ParallelSelfAttention(Module):
    """Causal self-attention over this rank's heads (see the module docstring)."""

    def __init__(self, dense: Any, n_head: int, prefix: str, config: TensorParallelConfig,
                 dropout: float) -> None:
        super().__init__()
        t, r = config.size, config.rank
        C = dense.qkv.in_features
        self.local_heads = _divisible("n_head", n_head, t, "tensor-parallel size")
        self.head_dim = C // n_head
        order = _qkv_order(C, n_head, t)
        permuted = _linear_view(dense.qkv, order)
        self.qkv = ColumnParallelLinear.from_dense(permuted, config=config, gather_output=False)
        w = 3 * C // t
        local = tuple(int(i) for i in order[r * w:(r + 1) * w])
        _spec(self.qkv.weight, ShardSpec(f"{prefix}.qkv.weight", 1, local, True))
        if self.qkv.bias is not None:
            _spec(self.qkv.bias, ShardSpec(f"{prefix}.qkv.bias", 0, local, True))
        self.proj = RowParallelLinear.from_dense(dense.proj, config=config,
                                                 input_is_parallel=True)
        rows = _cols(r * C // t, (r + 1) * C // t)
        _spec(self.proj.weight, ShardSpec(f"{prefix}.proj.weight", 0, rows, True))
        if self.proj.bias is not None:
            _spec(self.proj.bias, ShardSpec(f"{prefix}.proj.bias"))
        self.resid_drop = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        H, D = self.local_heads, self.head_dim
        q, k, v = ag.split(self.qkv(x), H * D, dim=-1)
        q, k, v = (a.reshape(B, T, H, D).transpose(1, 2) for a in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, H * D)
        return self.resid_drop(self.proj(y))


class ParallelMLP(Module):
    """``proj(gelu(fc(x)))`` with fc column- and proj row-parallel."""

    def __init__(self, dense: Any, prefix: str, config: TensorParallelConfig,
                 dropout: float) -> None:
        super().__init__()
        t, r = config.size, config.rank
        hidden = dense.fc.out_features
        _divisible("4*n_embd", hidden, t, "tensor-parallel size")
        self.fc = ColumnParallelLinear.from_dense(dense.fc, config=config, gather_output=False)
        block = _cols(r * hidden // t, (r + 1) * hidden // t)
        _spec(self.fc.weight, ShardSpec(f"{prefix}.fc.weight", 1, block, True))
        if self.fc.bias is not None:
            _spec(self.fc.bias, ShardSpec(f"{prefix}.fc.bias", 0, block, True))
        self.act = GELU(dense.act.approximate)
        self.proj = RowParallelLinear.from_dense(dense.proj, config=config,
                                                 input_is_parallel=True)
        _spec(self.proj.weight, ShardSpec(f"{prefix}.proj.weight", 0, block, True))
        if self.proj.bias is not None:
            _spec(self.proj.bias, ShardSpec(f"{prefix}.proj.bias"))
        self.drop = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class ParallelBlock(Module):
    """Pre-LN block ``x + attn(ln_1(x))``, ``x + mlp(ln_2(x))`` with replicated LayerNorms."""

    def __init__(self, dense: Any, n_head: int, prefix: str, config: TensorParallelConfig,
                 dropout: float) -> None:
        super().__init__()
        self.ln_1 = _replicated(dense.ln_1, f"{prefix}.ln_1")
        self.attn = ParallelSelfAttention(dense.attn, n_head, f"{prefix}.attn", config, dropout)
        self.ln_2 = _replicated(dense.ln_2, f"{prefix}.ln_2")
        self.mlp = ParallelMLP(dense.mlp, f"{prefix}.mlp", config, dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPTEmbedding(Module):
    """First-stage prologue: ``drop(wte[idx] + wpe[0:T])`` with a vocab-parallel ``wte``."""

    def __init__(self, dense: GPT, config: TensorParallelConfig) -> None:
        super().__init__()
        self.block_size = dense.config.block_size
        self.wte = VocabParallelEmbedding.from_dense(dense.wte, config=config)
        start, stop = self.wte.vocab_start, self.wte.vocab_end
        _spec(self.wte.weight, ShardSpec("wte.weight", 0, _cols(start, stop),
                                         config.size > 1))
        self.wpe = _replicated(dense.wpe, "wpe")
        self.drop = Dropout(dense.config.dropout)

    def forward(self, idx: Any) -> Tensor:
        idx = idx.data if isinstance(idx, Tensor) else idx
        T = idx.shape[1]
        if T > self.block_size:
            raise InvalidProblem(describe("ParallelGPT", "idx", f"at most block_size="
                                          f"{self.block_size} positions", T))
        pos = gp.asarray(np.arange(T, dtype=np.int64), device=gp.device_of(idx))
        return self.drop(self.wte(idx) + self.wpe(pos))


class GPTHead(Module):
    """Last-stage epilogue: ``ln_f`` then this rank's vocabulary columns of the logits."""

    def __init__(self, dense: GPT, config: TensorParallelConfig,
                 tied_to: GPTEmbedding | None) -> None:
        super().__init__()
        cfg = dense.config
        self.config = config
        self.ln_f = _replicated(dense.ln_f, "ln_f")
        start, stop = vocab_range(cfg.vocab_size, config.rank, config.size)
        rows = _cols(start, stop)
        self.tied = cfg.tie_weights
        # Tied and in the same stage: share the embedding's Parameter (not registered here).
        object.__setattr__(self, "_embedding", tied_to)
        if cfg.tie_weights and tied_to is None:
            w = dense.wte.weight.data[start:stop]
            self.weight = _spec(Parameter(np.ascontiguousarray(w).copy()),
                                ShardSpec("wte.weight", 0, rows, config.size > 1,
                                          duplicate=True))
        elif not cfg.tie_weights:
            w = dense.head.weight.data[:, start:stop]  # [C, V] dense, split by columns
            self.weight = _spec(Parameter(np.ascontiguousarray(w).copy()),
                                ShardSpec("head.weight", 1, rows, config.size > 1))

    def head_weight(self) -> Tensor:
        """``[V_r, C]`` for tied weights, ``[C, V_r]`` untied."""
        return self._embedding.wte.weight if self._embedding is not None else self.weight

    def forward(self, x: Tensor) -> Tensor:
        h = copy_to_tensor_parallel_region(self.ln_f(x), self.config.comm)
        w = self.head_weight()
        return h @ w.T if self.tied else h @ w


class GPTStage(Module):
    """The layers one pipeline rank owns: [embedding] blocks [head]."""

    def __init__(self, dense: GPT, index: int, num_stages: int,
                 config: TensorParallelConfig) -> None:
        super().__init__()
        cfg = dense.config
        self.index, self.num_stages = index, num_stages
        per = cfg.n_layer // num_stages
        self.first_layer = index * per
        self.embedding = GPTEmbedding(dense, config) if index == 0 else None
        self.blocks = ModuleList([
            ParallelBlock(dense.blocks[i], cfg.n_head, f"blocks.{i}", config, cfg.dropout)
            for i in range(index * per, (index + 1) * per)])
        last = index == num_stages - 1
        self.head = GPTHead(dense, config, self.embedding) if last else None

    def forward(self, x: Any) -> Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x


def _replicated(layer: Module, prefix: str) -> Module:
    for name, p in layer.named_parameters():
        _spec(p, ShardSpec(f"{prefix}.{name}"))
    return layer


def _linear_view(layer: Any, order: np.ndarray) -> Any:
    """An nn.Linear-shaped object with the columns of `layer` taken in `order`."""
    from autograd.nn import Linear

    out = Linear.__new__(Linear)
    Module.__init__(out)
    out.in_features, out.out_features = layer.in_features, layer.out_features
    out.weight = Parameter(np.ascontiguousarray(gp.to_host(layer.weight.data)[:, order]))
    if layer.bias is None:
        out.register_parameter("bias", None)
    else:
        out.bias = Parameter(np.ascontiguousarray(gp.to_host(layer.bias.data)[order]))
    return out


class ParallelGPT(Module):
    """`nn.GPT` split over a tensor-parallel group and pipeline stages, data-parallel on top.

    ``ParallelGPT(config, mesh)`` (or ``tp=``/``pp=``/``dp=`` communicators; None = size
    1) builds the dense `nn.GPT` from ``config.seed`` on the host and keeps this rank's
    shard, so any layout holds exactly the single-process model's weights.

    * ``train_step(idx, targets) -> float``: forward and backward of the mean next-token
      loss over ``idx [B, T]`` (this data-parallel rank's batch) in ``num_micro_batches``
      micro-batches with the pipeline ``schedule``; leaves in ``.grad`` the gradient of
      the global-batch mean loss (tied copies summed, averaged over ``dp``) and returns
      the global-batch loss on every rank.
    * ``clip_grad_norm_(max_norm) -> float``: the dense model's global gradient norm
      (sharded parameters summed over TP, replicated ones and the tied copy counted once)
      and the same scaling as `optim.clip_grad_norm_`.
    * ``evaluate(idx, targets) -> float``: the loss without gradients (no dropout).
    * ``shard_specs()``: local parameter name -> `ShardSpec`.
    """

    def __init__(self, config: GPTConfig, mesh: Any = None, *, tp: Communicator | None = None,
                 pp: Communicator | None = None, dp: Communicator | None = None,
                 num_micro_batches: int = 1, schedule: str = "1f1b",
                 device: str = "cpu", dtype: Any = None) -> None:
        super().__init__()
        if mesh is not None:
            tp, pp, dp = mesh.tp, mesh.pp, mesh.dp
        self.config = config
        self.tp_comm, self.pp_comm, self.dp_comm = (c if c is not None and c.size > 1 else None
                                                    for c in (tp, pp, dp))
        t = 1 if self.tp_comm is None else self.tp_comm.size
        p = 1 if self.pp_comm is None else self.pp_comm.size
        _divisible("n_head", config.n_head, t, "tensor-parallel size")
        _divisible("n_layer", config.n_layer, p, "pipeline size")
        self.tp_config = TensorParallelConfig(comm=self.tp_comm)
        self.device = device
        self.num_stages = p
        self.stage_index = 0 if self.pp_comm is None else self.pp_comm.rank
        dense = GPT(config)
        stages = [GPTStage(dense, s, p, self.tp_config)
                  if self.pp_comm is None or s == self.stage_index else _unbuilt
                  for s in range(p)]
        self.pipe = PipelineParallel(stages, num_micro_batches=num_micro_batches,
                                     schedule=schedule, comm=self.pp_comm)
        del dense
        if device != "cpu" or dtype is not None:
            self.to(device=device, dtype=dtype)  # in place: the shard specs stay

    # -- layout ---------------------------------------------------------------------------

    def local_stages(self) -> list[GPTStage]:
        return [self.pipe.stage(i) for i in sorted(self.pipe._local)]

    @property
    def is_first_stage(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def shard_specs(self) -> dict[str, ShardSpec]:
        return {name: p.shard_spec for name, p in self.named_parameters()}

    # -- training ---------------------------------------------------------------------------

    def loss_fn(self, logits: Tensor, targets: Any) -> Tensor:
        return vocab_parallel_cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                            targets.reshape(-1), self.tp_config)

    def train_step(self, idx: Any, targets: Any) -> float:
        loss = self.pipe.train_step(self._input(idx), self._input(targets), self.loss_fn)
        self.finish_gradients()
        return self._dp_mean(loss)

    def finish_gradients(self) -> None:
        """Sum the tied embedding copies' gradients, then average over data parallel."""
        from dist.data_parallel import allreduce_gradients

        self._sync_tied_gradients()
        allreduce_gradients(self.parameters(), self.dp_comm, average=True)

    def _tied_parameter(self) -> Parameter | None:
        """This rank's copy of the tied ``wte`` shard when it lives on two stages."""
        if not self.config.tie_weights or self.num_stages == 1:
            return None
        if self.is_first_stage:
            return self.pipe.stage(0).embedding.wte.weight
        if self.is_last_stage:
            return self.pipe.stage(self.num_stages - 1).head.weight
        return None

    def _sync_tied_gradients(self) -> None:
        p = self._tied_parameter()
        if p is None:
            return
        xp = gp.backend.array_namespace(p.data)
        mine = p.grad.data if p.grad is not None else xp.zeros(p.shape, p.dtype)
        peer = self.num_stages - 1 if self.is_first_stage else 0
        theirs = xp.empty_like(mine)
        pending = self.pp_comm.isend(mine, peer, _TIED_TAG)
        self.pp_comm.recv(theirs, peer, _TIED_TAG)
        pending.wait()
        total = mine + theirs  # a + b == b + a bitwise: both copies get the same gradient
        if p.grad is None:
            p.grad = Tensor(total)
        else:
            p.grad.data[...] = total

    def clip_grad_norm_(self, max_norm: float, eps: float = 1e-6) -> float:
        """Clip by the dense model's global L2 gradient norm; returns it (before clipping)."""
        tp_rank = 0 if self.tp_comm is None else self.tp_comm.rank
        counted = [p.grad.data for p in self.parameters() if p.grad is not None
                   and not p.shard_spec.duplicate and (p.shard_spec.tensor_parallel
                                                       or tp_rank == 0)]
        local = (float(gp.to_host(gp.functional.global_l2_norm(counted))) ** 2
                 if counted else 0.0)
        total = np.array([local], np.float64)
        for comm in (self.tp_comm, self.pp_comm):
            if comm is not None:
                total = comm.all_reduce(total)
        norm = math.sqrt(float(total[0]))
        coef = float(max_norm) / (norm + eps)
        if coef < 1.0:
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.data[...] = gp.functional.unary("scale", p.grad.data, alpha=coef)
        return norm

    def evaluate(self, idx: Any, targets: Any) -> float:
        """Mean loss over the global batch, no gradients, dropout off."""
        was = self.training
        self.eval()
        try:
            with ag.no_grad():
                logits = self.pipe.forward(self._input(idx))
                loss = None
                if logits is not None:
                    loss = float(self.loss_fn(logits, self._input(targets)).item())
        finally:
            self.train(was)
        if self.pp_comm is not None:
            loss = self.pp_comm.bcast_object(loss, root=self.num_stages - 1)
        return self._dp_mean(loss)

    def _dp_mean(self, value: float) -> float:
        if self.dp_comm is None:
            return value
        return float(self.dp_comm.all_reduce(np.array([value], np.float64), "mean")[0])

    def forward(self, idx: Any) -> Tensor | None:
        """Logits ``[B, T, V_r]`` (this TP rank's vocabulary block) on the last stage's ranks,
        None on the others."""
        return self.pipe.forward(self._input(idx))

    def _input(self, x: Any) -> Any:
        """Token arrays (host or device, or Tensors) on the model's device."""
        return None if x is None else gp.to_device(_data(x), self.device)

    # -- consolidation ------------------------------------------------------------------------

    def gather_dense_state(self, world: Communicator | None) -> dict[str, np.ndarray] | None:
        """The dense `nn.GPT` state dict assembled on world rank 0 (None elsewhere). Every
        rank of `world` must call it; data-parallel replicas other than dp rank 0 only
        take part in the collective."""
        dp_rank = 0 if self.dp_comm is None else self.dp_comm.rank
        mine = ([] if dp_rank else
                [(gp.to_host(p.data), p.shard_spec.to_json()) for p in self.parameters()])
        parts = [mine] if world is None or world.size == 1 else \
            world.mpi_comm.gather(mine, root=0)
        if parts is None:
            return None
        return consolidate(self.config, [x for part in parts for x in part])


def _unbuilt() -> Module:  # pragma: no cover - never called: other ranks' stages
    raise AssertionError("a stage owned by another pipeline rank was built")



__all__ = ["GPTEmbedding", "GPTHead", "GPTStage", "ParallelBlock", "ParallelGPT",
           "ParallelMLP", "ParallelSelfAttention", "ShardSpec", "consolidate"]
