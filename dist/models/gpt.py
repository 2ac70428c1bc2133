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
across TP ranks as they must. With ``sequence_parallel=True`` those activations are split
along the sequence instead (`dist.models.parallel.ParallelModel`): each rank drops its
tokens' entries of the whole tensor's mask, and ``wpe`` looks up its shard's positions.
Every parameter records its dense name and the indices it holds (``p.shard_spec``,
`ParallelGPT.shard_specs`), which drives gradient clipping, checkpoint consolidation and
`scripts/generate.py` (see `dist.training`). What is not GPT's own (stages, head,
pipeline, gradient sums, shard specs) is `dist.models.parallel`'s.
"""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from autograd.nn import GPT, GPTConfig, Module
from autograd.nn.gpt import GPTLayers
from dist.context_parallel_layers import ContextParallelPositions, RingSelfAttention
from dist.models.parallel import ModelStage, ParallelModel, VocabParallelHead, divisible
from dist.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from dist.tensor_parallel.sequence import SequenceShardEmbedding

#: The pipeline stage module (one name for every parallel model's stages).
GPTStage = ModelStage


def qkv_column_order(n_embd: int, n_head: int, tp: int) -> np.ndarray:
    """Dense qkv column order whose contiguous block r is ``[q | k | v]`` of rank r's heads."""
    per_rank = (n_head // tp) * (n_embd // n_head)
    return np.concatenate([np.arange(part * n_embd + r * per_rank,
                                     part * n_embd + (r + 1) * per_rank)
                           for r in range(tp) for part in range(3)])


class ParallelGPT(GPTLayers, ParallelModel):
    """The parts of `nn.GPT` with tensor-parallel layers substituted and its blocks split into
    pipeline stages, data-parallel on top; run by nn.GPT's own forward (`GPTLayers`).

    ``ParallelGPT(config, mesh, num_micro_batches=..., schedule=..., device=..., dtype=...,
    sequence_parallel=...)`` (or ``tp=``/``pp=``/``dp=`` communicators; None = size 1)
    builds the dense `nn.GPT` from ``config.seed`` on the host and holds this rank's stage
    of its parts, with this rank's parallel layers (exact shards) substituted, so any
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

    Context parallelism (``mesh.cp`` or ``cp=``, size > 1) is `ParallelModel`'s: each cp
    rank runs its chunks of the whole sequences it is given, with ring attention over cp.

    Clipping, evaluation and consolidation are `dist.clip_grad_norm_`, `dist.evaluate` and
    `dist.gather_dense_state_dict` (dist/training.py).
    """

    embedding_name, blocks_name, head_name = "wte", "blocks", "head"

    def dense_model(self, config: GPTConfig) -> GPT:
        return GPT(config)

    def check_layout(self, config: GPTConfig, tp: int, pp: int) -> None:
        divisible("ParallelGPT", "n_head", config.n_head, tp, "tensor-parallel size")
        super().check_layout(config, tp, pp)

    def _shard_block(self, block: Module) -> None:
        """Substitute a block's Linears (in place) by this rank's tensor-parallel shards."""
        config, tp = self.config, self.tp_config
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

    def _shard_sequence(self) -> None:
        """Sequence parallelism: dropouts on shards (ParallelModel's), and ``wpe`` looks up
        the positions of this rank's sequence shard only, to add to the embedding's
        reduce-scattered output (its gradient then summed over TP: `_replica_groups`)."""
        super()._shard_sequence()
        if self.is_first_stage:
            self.wpe = SequenceShardEmbedding.from_dense(self.wpe, self.tp_comm)

    def _shard_context(self) -> None:
        """Context parallelism: dropouts by global position (ParallelModel's), each block's
        attention as ring attention over cp (`RingSelfAttention`), and ``wpe`` looked up at
        the global positions of this rank's tokens (its gradient then summed over cp, and
        over TP with sequence parallelism: `_replica_groups`)."""
        super()._shard_context()
        for block in self.blocks:
            block.attn = RingSelfAttention(block.attn, self.cp_comm)
        if self.is_first_stage:
            sp = self.tp_comm if self.sequence_parallel else None
            self.wpe = ContextParallelPositions(self.wpe.weight, self.cp_comm, sp)

    def dense_columns(self, name: str, owner: ColumnParallelLinear) -> np.ndarray:
        cols = super().dense_columns(name, owner)
        if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            cols = qkv_column_order(self.config.n_embd, self.config.n_head,
                                    owner.world_size)[cols]
        return cols


__all__ = ["GPTStage", "ParallelGPT", "VocabParallelHead", "qkv_column_order"]
