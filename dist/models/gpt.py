"""A tensor- and pipeline-parallel GPT: the parts of `nn.GPT` with parallel layers substituted,
run by the same forward (`nn.gpt.GPTLayers`).

Layout (Megatron-LM style), for a tensor-parallel group of size ``t`` and ``p`` stages:

* attention: ``qkv`` is a ColumnParallelLinear built from the dense layer with its
  ``[q | k | v]`` columns permuted so that rank r's block is ``[q | k | v]`` of heads
  ``[r*H/t, (r+1)*H/t)``; nn.GPT's attention reads its head count from that width and runs
  on the local heads with no communication; ``proj`` is a RowParallelLinear (one
  all-reduce, bias after it);
* MLP: ``fc`` column-parallel, GELU on the local hidden block, ``proj`` row-parallel;
* token embedding: a VocabParallelEmbedding (rows of ``wte`` split by `vocab_range`);
  position embedding and every LayerNorm are replicated;
* head: a `VocabParallelHead`, ``logits_r = ln_f(x) @ W_r`` -- this rank's vocabulary
  columns, fed to `vocab_parallel_cross_entropy` so the ``[N, V]`` logits are never gathered;
* pipeline: stage ``s`` keeps blocks ``[s*L/p, (s+1)*L/p)`` under their dense names
  ``blocks.{i}``, the first stage also the embeddings, the last also ``ln_f`` and the head,
  and runs them with `GPTLayers.forward_stage`. With tied weights and ``p > 1`` the last
  stage's head holds a copy of the ``wte`` shard; after each backward the two copies'
  gradients are summed by an all-reduce over {first, last} stage, so both see the dense
  gradient and stay equal.

Dropout acts only on replicated activations (embedding output, attention and MLP outputs
after the row-parallel reduce), drawn from the default generator, which
`dist.model_parallel_seed` seeds identically across a tensor-parallel group: the masks agree
across TP ranks as they must. Every parameter records its dense name and the indices it
holds (``p.shard_spec``, `ParallelGPT.shard_specs`), which drives gradient clipping,
checkpoint consolidation and `scripts/generate.py` (see `dist.training`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.nn import GPT, GPTConfig, Linear, Module, ModuleList, Parameter
from autograd.nn import functional as F
from autograd.nn.gpt import Block, GPTLayers
from autograd.tape import Tape
from autograd.tensor import Tensor
from dist.communicator import Communicator
from dist.data_parallel import allreduce_gradients, average_over
from dist.models.sharding import ShardSpec
from dist.pipeline.runner import PipelineParallel, split_rows
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


def _divisible(arg: str, value: int, size: int, what: str) -> int:
    if value % size:
        raise InvalidProblem(describe("ParallelGPT", arg, f"divisible by the {what} {size}",
                                      value))
    return value // size


def qkv_column_order(n_embd: int, n_head: int, tp: int) -> np.ndarray:
    """Dense qkv column order whose contiguous block r is ``[q | k | v]`` of rank r's heads."""
    per_rank = (n_head // tp) * (n_embd // n_head)
    return np.concatenate([np.arange(part * n_embd + r * per_rank,
                                     part * n_embd + (r + 1) * per_rank)
                           for r in range(tp) for part in range(3)])


class VocabParallelHead(Module):
    """``logits_t = X W_t``: the output projection onto this rank's vocabulary block.

    ``W [C, V]`` is split by columns into `vocab_range` blocks (those of
    VocabParallelEmbedding and vocab_parallel_cross_entropy); ``X`` enters through
    copy_to_tensor_parallel_region (identity forward, all-reduce of dX backward). Untied
    (`from_dense`): ``weight = W_t [C, V_t]``, ``Y_t = linear(X, W_t)``. Tied (`tied_to`):
    ``weight = E_t [V_t, C]``, this rank's rows of the token embedding, ``Y_t = X @ E_t^T``.
    """

    def __init__(self, weight: Parameter, vocab_start: int, vocab_end: int, tied: bool,
                 config: TensorParallelConfig) -> None:
        super().__init__()
        self.vocab_start, self.vocab_end, self.tied, self.config = (vocab_start, vocab_end,
                                                                   tied, config)
        self.weight = weight

    @classmethod
    def from_dense(cls, layer: Linear, config: TensorParallelConfig) -> VocabParallelHead:
        """This rank's columns of a bias-free dense ``nn.Linear(C, V)``."""
        if layer.bias is not None:
            raise InvalidProblem(describe("VocabParallelHead.from_dense", "layer",
                                          "a Linear without bias", "a bias"))
        start, stop = vocab_range(layer.out_features, config.rank, config.size)
        cols = gp.backend.ascontiguous(layer.weight.data[:, start:stop]).copy()
        return cls(Parameter(cols), start, stop, tied=False, config=config)

    @classmethod
    def tied_to(cls, embedding: VocabParallelEmbedding, share: bool = True) -> VocabParallelHead:
        """The head tied to `embedding`: its own Parameter (``share``), or a copy for a head
        in another process (whose gradient the caller then keeps summed with the original's)."""
        weight = embedding.weight if share else \
            Parameter(gp.backend.ascontiguous(embedding.weight.data).copy())
        return cls(weight, embedding.vocab_start, embedding.vocab_end, tied=True,
                   config=embedding.config)

    def forward(self, x: Tensor) -> Tensor:
        h = copy_to_tensor_parallel_region(x, self.config.comm)
        return h @ self.weight.T if self.tied else F.linear(h, self.weight)

    def extra_repr(self) -> str:
        return (f"vocab=[{self.vocab_start}, {self.vocab_end}), tied={self.tied}, "
                f"rank={self.config.rank}/{self.config.size}")


class GPTStage(Module):
    """A pipeline stage that runs `run` (a part of a model's forward, e.g.
    `nn.GPT.forward_stage`); it owns no parameters: the model does."""

    def __init__(self, run: Callable[[Any], Tensor]) -> None:
        super().__init__()
        self.run = run

    def forward(self, x: Any) -> Tensor:
        return self.run(x)


def _shard_block(block: Block, config: GPTConfig, tp: TensorParallelConfig) -> None:
    """Substitute a block's Linears (in place) by this rank's tensor-parallel shards."""
    attn, mlp = block.attn, block.mlp
    order = qkv_column_order(config.n_embd, config.n_head, tp.size)
    for p in attn.qkv.parameters():  # whole heads per rank: a contiguous column block
        p.data = np.ascontiguousarray(gp.to_host(p.data)[..., order])
    attn.qkv = ColumnParallelLinear.from_dense(attn.qkv, config=tp, gather_output=False)
    attn.proj = RowParallelLinear.from_dense(attn.proj, config=tp, input_is_parallel=True)
    # This rank's heads in the full model's order: its attention dropout draws their bits.
    attn.first_head = tp.rank * (config.n_head // tp.size)
    mlp.fc = ColumnParallelLinear.from_dense(mlp.fc, config=tp, gather_output=False)
    mlp.proj = RowParallelLinear.from_dense(mlp.proj, config=tp, input_is_parallel=True)


def _shard_spec(name: str, owner: Module, config: GPTConfig) -> ShardSpec:
    """Where parameter `name` (held by module `owner`) sits in the dense nn.GPT."""
    leaf = name.rsplit(".", 1)[-1]
    if isinstance(owner, ColumnParallelLinear):
        w = owner.out_features_per_rank
        cols = np.arange(owner.rank * w, (owner.rank + 1) * w)
        if name.endswith(f"attn.qkv.{leaf}"):
            cols = qkv_column_order(config.n_embd, config.n_head, owner.world_size)[cols]
        return ShardSpec(name, 1 if leaf == "weight" else 0, tuple(int(c) for c in cols), True)
    if isinstance(owner, RowParallelLinear) and leaf == "weight":
        rows = range(owner.rank * owner.in_features_per_rank,
                     (owner.rank + 1) * owner.in_features_per_rank)
        return ShardSpec(name, 0, tuple(rows), True)
    if isinstance(owner, (VocabParallelEmbedding, VocabParallelHead)):
        tied = isinstance(owner, VocabParallelEmbedding) or owner.tied
        vocab = tuple(range(owner.vocab_start, owner.vocab_end))
        split = owner.config.size > 1
        if not tied:
            return ShardSpec(name, 1, vocab, split)
        # A head's tied weight registered under its own name is the last stage's copy.
        return ShardSpec("wte.weight", 0, vocab, split, duplicate=name != "wte.weight")
    return ShardSpec(name)


class ParallelGPT(GPTLayers, Module):
    """The parts of `nn.GPT` with tensor-parallel layers substituted and its blocks split into
    pipeline stages, data-parallel on top; run by nn.GPT's own forward (`GPTLayers`).

    ``ParallelGPT(config, mesh)`` (or ``tp=``/``pp=``/``dp=`` communicators; None = size
    1) builds the dense `nn.GPT` from ``config.seed`` on the host and holds this rank's
    stage of its parts, with this rank's parallel layers (exact shards) substituted, so any
    layout holds exactly the single-process model's weights. Parameter names are the dense
    ones (the last stage's copy of a tied embedding is ``head.weight``); each parameter's
    ``shard_spec`` says where it sits in the dense model.

    * ``forward(idx)``: logits ``[B, T, V_r]`` (this TP rank's vocabulary block) on the last
      stage's ranks, None on the others.
    * ``train_step(idx, targets) -> float``: forward and backward of the mean next-token
      loss over ``idx [B, T]`` (this data-parallel rank's batch) in ``num_micro_batches``
      micro-batches with the pipeline ``schedule``; leaves in ``.grad`` the gradient of
      the global-batch mean loss (tied copies summed, averaged over ``dp``) and returns
      the global-batch loss on every rank.
    * ``shard_specs()``: local parameter name -> `ShardSpec`.

    Clipping, evaluation and consolidation are `dist.clip_grad_norm_`, `dist.evaluate` and
    `dist.gather_dense_state_dict` (dist/training.py).
    """

    def __init__(self, config: GPTConfig, mesh: Any = None, *, tp: Communicator | None = None,
                 pp: Communicator | None = None, dp: Communicator | None = None,
                 num_micro_batches: int = 1, schedule: str = "1f1b",
                 device: str = "cpu", dtype: Any = None) -> None:
        if mesh is not None:
            tp, pp, dp = mesh.tp, mesh.pp, mesh.dp
        tp, pp, dp = (c if c is not None and c.size > 1 else None for c in (tp, pp, dp))
        num_stages = 1 if pp is None else pp.size
        _divisible("n_head", config.n_head, 1 if tp is None else tp.size,
                   "tensor-parallel size")
        _divisible("n_layer", config.n_layer, num_stages, "pipeline size")
        super().__init__()
        self.config = config
        self.tp_comm, self.pp_comm, self.dp_comm = tp, pp, dp
        self.tp_config = TensorParallelConfig(comm=tp)
        self.device = device
        self.num_stages = num_stages
        self.stage_index = 0 if pp is None else pp.rank
        self._hold_stage(GPT(config))  # the dense model, drawn from config.seed on the host
        self.tied_comm = self._tied_group()
        modules = dict(self.named_modules())
        for name, p in self.named_parameters():
            p.shard_spec = _shard_spec(name, modules[name.rpartition(".")[0]], config)
        stage = GPTStage(partial(self.forward_stage, first=self.is_first_stage,
                                 last=self.is_last_stage))
        self.pipe = PipelineParallel(
            [stage if s == self.stage_index else _unbuilt for s in range(num_stages)],
            num_micro_batches=num_micro_batches, schedule=schedule, comm=pp)
        if device != "cpu" or dtype is not None:
            self.to(device=device, dtype=dtype)  # in place: the shard specs stay

    def _hold_stage(self, dense: GPT) -> None:
        """Hold this rank's stage of `dense`'s parts under their dense names (in the dense
        order), its layers sharded for this TP rank."""
        cfg, tp = self.config, self.tp_config
        first, last = self.is_first_stage, self.is_last_stage
        wte = (VocabParallelEmbedding.from_dense(dense.wte, config=tp)
               if first or (last and cfg.tie_weights) else None)
        if first:
            self.wte, self.wpe, self.drop = wte, dense.wpe, dense.drop
        per = cfg.n_layer // self.num_stages
        blocks = ModuleList()
        for i in range(self.stage_index * per, (self.stage_index + 1) * per):
            _shard_block(dense.blocks[i], cfg, tp)
            blocks.add_module(str(i), dense.blocks[i])  # keeps the dense name blocks.{i}
        self.blocks = blocks
        if last:
            self.ln_f = dense.ln_f
            self.head = (VocabParallelHead.tied_to(wte, share=first) if cfg.tie_weights
                         else VocabParallelHead.from_dense(dense.head, tp))

    def _tied_group(self) -> Communicator | None:
        """The {first, last} stage group that sums the tied embedding copies' gradients
        (None on other stages, and when there is one copy only)."""
        if not self.config.tie_weights or self.num_stages == 1:
            return None
        ends = self.is_first_stage or self.is_last_stage
        group = self.pp_comm if self.num_stages == 2 else self.pp_comm.split(0 if ends else 1)
        return group if ends else None

    # -- layout ---------------------------------------------------------------------------

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
        """Mean cross-entropy of this TP rank's logits block ``[B, T, V_r]`` against the
        token ids ``targets [B, T]`` (host or device), identical on every TP rank."""
        return vocab_parallel_cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                            self.input_array(targets).reshape(-1),
                                            self.tp_config)

    def train_step(self, idx: Any, targets: Any) -> float:
        idx, targets = self.input_array(idx), self.input_array(targets)
        if self.num_stages == 1:
            loss = self._accumulate_micro_batches(idx, targets)
        else:
            loss = self.pipe.train_step(idx, targets, self.loss_fn)
        self.finish_gradients()
        return average_over(self.dp_comm, loss)

    def _accumulate_micro_batches(self, idx: Any, targets: Any) -> float:
        """One stage: forward and backward of each micro-batch in turn (what the pipeline
        runner's schedules do with one stage, without its machinery); ``.grad`` accumulates
        the gradient of the mean micro-batch loss, which is returned."""
        n = self.pipe.num_micro_batches
        losses = []
        for x, y in zip(split_rows(idx, n, "x"), split_rows(targets, n, "target"),
                        strict=True):
            with Tape() as tape:
                loss = self.loss_fn(self.forward_stage(x), y)
                losses.append(float(loss.item()))
                scaled = loss * (1.0 / n)
            if scaled._node is not None:
                tape.backward(scaled)
        return float(np.mean(losses))

    def finish_gradients(self) -> None:
        """Sum the tied embedding copies' gradients, then average over data parallel."""
        if self.tied_comm is not None:
            tied = self.wte.weight if self.is_first_stage else self.head.weight
            allreduce_gradients([tied], self.tied_comm, average=False)
        allreduce_gradients(self.parameters(), self.dp_comm, average=True)

    def forward(self, idx: Any) -> Tensor | None:
        """Logits ``[B, T, V_r]`` (this TP rank's vocabulary block) on the last stage's ranks,
        None on the others."""
        return self.pipe.forward(self.input_array(idx))

    def input_array(self, x: Any) -> Any:
        """Token ids (host or device array, or Tensor) as an array on the model's device."""
        return gp.to_device(x.data if isinstance(x, Tensor) else x, self.device)


def _unbuilt() -> Module:  # pragma: no cover - never called: other ranks' stages
    raise AssertionError("a stage owned by another pipeline rank was built")


__all__ = ["GPTStage", "ParallelGPT", "VocabParallelHead", "qkv_column_order"]
