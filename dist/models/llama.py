"""A tensor- and pipeline-parallel Llama: the parts of `nn.Llama` with parallel layers
substituted, run by the same forward (`nn.llama.LlamaLayers`).

Layout, for a tensor-parallel group of size ``t`` and ``p`` stages (what is not Llama's own
is `dist.models.parallel`'s, shared with `dist.ParallelGPT`):

* attention: ``q_proj`` is a ColumnParallelLinear, rank r holding query heads
  ``[r H/t, (r+1) H/t)``; ``k_proj`` and ``v_proj`` are column-parallel too. With
  ``n_kv_head >= t`` rank r holds K/V heads ``[r Hkv/t, (r+1) Hkv/t)``: exactly those its
  query heads read (head h reads ``h // (H/Hkv)``). With ``n_kv_head < t`` (``t`` a multiple
  of it) each K/V head is replicated over the ``t / Hkv`` ranks whose query heads read it:
  the dense columns are ordered so that rank r's block is K/V head ``r // (t/Hkv)``
  (`kv_column_order`), and after each backward those ranks' gradients of the copy are
  summed (each saw the gradient from its own query heads only). nn.Llama's attention reads
  its head counts from the shards' widths and runs on the local heads with no
  communication; ``o_proj`` is a RowParallelLinear (one all-reduce);
* MLP: ``gate_proj`` and ``up_proj`` column-parallel, SwiGLU on the local hidden block,
  ``down_proj`` row-parallel;
* ``embed_tokens`` vocabulary-parallel, ``lm_head`` a `VocabParallelHead` (tied or not),
  every RMSNorm replicated; pipeline stage ``s`` holds ``layers.{i}`` for
  ``i`` in ``[s L/p, (s+1) L/p)``, the first stage the embedding, the last ``norm`` and the
  head (a tied head's copy summed with the embedding's gradient, as ParallelGPT does).

Llama's only dropout is on the attention probabilities; each TP rank's attention draws, for
its query heads (``first_head``), the bits one process draws for them, from the default
generator that `dist.model_parallel_seed` seeds alike across the group: the masks agree.
With ``sequence_parallel=True`` the RMSNorms and residual adds run on this rank's sequence
shard (`dist.models.parallel.ParallelModel`); the attention sees whole sequences.
"""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from autograd.nn import Llama, LlamaConfig, Module, Parameter
from autograd.nn.llama import LlamaLayers
from dist.communicator import Communicator
from dist.context_parallel_layers import RingLlamaAttention
from dist.models.parallel import ParallelModel, divisible
from dist.models.sharding import ShardSpec
from dist.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from gpuplan.errors import InvalidProblem, describe


def kv_column_order(n_kv_head: int, head_dim: int, tp: int) -> np.ndarray:
    """Dense ``k_proj``/``v_proj`` columns whose contiguous block r (of ``tp``) holds the K/V
    heads that rank r's query heads read: the identity when ``tp`` divides ``n_kv_head``;
    otherwise head ``r // (tp / n_kv_head)`` for block r, each head repeated
    ``tp / n_kv_head`` times."""
    if n_kv_head % tp == 0:
        return np.arange(n_kv_head * head_dim)
    copies = tp // n_kv_head
    return np.concatenate([np.arange((r // copies) * head_dim, (r // copies + 1) * head_dim)
                           for r in range(tp)])


class ParallelLlama(LlamaLayers, ParallelModel):
    """The parts of `nn.Llama` with tensor-parallel layers substituted (query and K/V heads
    sharded, K/V heads replicated over the ranks that share one when ``n_kv_head < tp``),
    its blocks split into pipeline stages, data-parallel on top; run by nn.Llama's own
    forward (`LlamaLayers`). The protocol is `dist.ParallelGPT`'s
    (`dist.models.parallel.ParallelModel`): ``ParallelLlama(config, mesh,
    num_micro_batches=..., schedule=..., device=..., dtype=..., sequence_parallel=...)``,
    ``train_step``, ``forward``, ``parameters``, ``shard_specs``; `dist.clip_grad_norm_`,
    `dist.evaluate`, `dist.gather_dense_state_dict` take it. Parameter names are nn.Llama's."""

    embedding_name, blocks_name, head_name = "embed_tokens", "layers", "lm_head"

    def dense_model(self, config: LlamaConfig) -> Llama:
        return Llama(config)

    def check_layout(self, config: LlamaConfig, tp: int, pp: int) -> None:
        divisible("ParallelLlama", "n_head", config.n_head, tp, "tensor-parallel size")
        kv = config.kv_heads
        if kv % tp and tp % kv:
            raise InvalidProblem(describe(
                "ParallelLlama", "n_kv_head",
                f"a multiple or a divisor of the tensor-parallel size {tp}", kv))
        divisible("ParallelLlama", "ffn_hidden", config.hidden, tp, "tensor-parallel size")
        super().check_layout(config, tp, pp)

    @property
    def kv_copies(self) -> int:
        """Tensor-parallel ranks holding each K/V head (1 unless ``n_kv_head < tp``)."""
        return max(1, self.tp_config.size // self.config.kv_heads)

    def _shard_block(self, block: Module) -> None:
        """Substitute a block's Linears (in place) by this rank's tensor-parallel shards."""
        tp, attn, mlp = self.tp_config, block.self_attn, block.mlp
        order = kv_column_order(self.config.kv_heads, self.config.head_dim, tp.size)
        for proj in (attn.k_proj, attn.v_proj):  # this rank's block: the heads it reads
            proj.weight.data = np.ascontiguousarray(gp.to_host(proj.weight.data)[:, order])
            proj.out_features = len(order)
        attn.q_proj, attn.k_proj, attn.v_proj = (
            ColumnParallelLinear.from_dense(lin, config=tp, gather_output=False)
            for lin in (attn.q_proj, attn.k_proj, attn.v_proj))
        attn.o_proj = RowParallelLinear.from_dense(attn.o_proj, config=tp,
                                                   input_is_parallel=True)
        # This rank's query heads in the full model's order: its attention dropout draws
        # their bits (head_sharded_attention), so it drops what one process drops there.
        attn.first_head = tp.rank * (self.config.n_head // tp.size)
        mlp.gate_proj, mlp.up_proj = (
            ColumnParallelLinear.from_dense(lin, config=tp, gather_output=False)
            for lin in (mlp.gate_proj, mlp.up_proj))
        mlp.down_proj = RowParallelLinear.from_dense(mlp.down_proj, config=tp,
                                                     input_is_parallel=True)

    def _shard_context(self) -> None:
        """Context parallelism: each layer's attention on this rank's slice of the sequences
        (RoPE from each chunk's global offset), ring attention over cp
        (`RingLlamaAttention`); no dropout (refused with cp)."""
        super()._shard_context()
        for block in self.layers:
            block.self_attn = RingLlamaAttention(block.self_attn, self.cp_comm)

    def dense_columns(self, name: str, owner: ColumnParallelLinear) -> np.ndarray:
        cols = super().dense_columns(name, owner)
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            cols = kv_column_order(self.config.kv_heads, self.config.head_dim,
                                   owner.world_size)[cols]
        return cols

    def _shard_spec(self, name: str, owner: Module) -> ShardSpec:
        spec = super()._shard_spec(name, owner)
        if self.kv_copies > 1 and name.endswith(("self_attn.k_proj.weight",
                                                 "self_attn.v_proj.weight")):
            # One copy per K/V head is counted (gradient norm); the others are duplicates.
            duplicate = self.tp_config.rank % self.kv_copies != 0
            spec = ShardSpec(spec.name, spec.axis, spec.index, True, duplicate=duplicate)
        return spec

    def _replica_groups(self) -> list[tuple[list[Parameter], Communicator]]:
        """The tied embedding's copies (ParallelModel's), and with ``n_kv_head < tp`` the
        K/V projections, summed over the ranks holding the same K/V heads."""
        groups = super()._replica_groups()
        if self.kv_copies > 1:
            comm = self.tp_comm.split(self.tp_config.rank // self.kv_copies)
            kv = [p for block in self.layers for p in (block.self_attn.k_proj.weight,
                                                       block.self_attn.v_proj.weight)]
            groups.append((kv, comm))
        return groups


__all__ = ["ParallelLlama", "kv_column_order"]
