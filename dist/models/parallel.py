"""What every model-parallel decoder shares (`dist.ParallelGPT`, `dist.ParallelLlama`): the
dense model's parts held for this rank's pipeline stage with tensor-parallel layers
substituted, the vocabulary-parallel head, the pipeline and micro-batch loop, the gradient
sums over replicated copies and over data parallel, and each parameter's `ShardSpec`.

A subclass names its dense model (`dense_model`), its embedding and head attributes, and
substitutes the parallel layers of its blocks (`_shard_block`); its forward over the parts is
the dense model's own (``GPTLayers``, ``LlamaLayers``: ``forward_stage``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.nn import Dropout, Linear, Module, ModuleList, Parameter
from autograd.nn import functional as F
from autograd.tape import Tape
from autograd.tensor import Tensor
from dist import trace
from dist.communicator import Communicator
from dist.context_parallel import check_length, gather_sequence, take_local
from dist.context_parallel_layers import PositionDropout
from dist.data_parallel import (
    DEFAULT_BUCKET_BYTES,
    OverlappedGradReducer,
    allreduce_gradients,
    average_over,
)
from dist.models.sharding import ShardSpec
from dist.pipeline.runner import PipelineParallel, split_rows
from dist.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelConfig,
)
from dist.tensor_parallel.mappings import (
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
)
from dist.tensor_parallel.sequence import SequenceParallelDropout, sequence_chunk
from dist.tensor_parallel.vocab import (
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
    vocab_range,
)
from gpuplan.errors import InvalidProblem, describe


def divisible(model: str, arg: str, value: int, size: int, what: str) -> int:
    """``value // size``; InvalidProblem naming `model` and `arg` unless `size` divides it."""
    if value % size:
        raise InvalidProblem(describe(model, arg, f"divisible by the {what} {size}", value))
    return value // size


class VocabParallelHead(Module):
    """``logits_t = X W_t``: the output projection onto this rank's vocabulary block.

    ``W [C, V]`` is split by columns into `vocab_range` blocks (those of
    VocabParallelEmbedding and vocab_parallel_cross_entropy); ``X`` enters through
    copy_to_tensor_parallel_region (identity forward, all-reduce of dX backward). Untied
    (`from_dense`): ``weight = W_t [C, V_t]``, ``Y_t = linear(X, W_t)``. Tied (`tied_to`):
    ``weight = E_t [V_t, C]``, this rank's rows of the token embedding, ``Y_t = X @ E_t^T``.
    With sequence parallelism (``config.reduce_scatter_output``) ``X`` is this rank's
    sequence shard and enters through gather_from_sequence_parallel_region instead
    (all-gather forward, reduce-scatter of dX backward): the logits cover whole sequences.
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
        if self.config.reduce_scatter_output:
            h = gather_from_sequence_parallel_region(x, self.config.comm,
                                                     self.config.sequence_axis)
        else:
            h = copy_to_tensor_parallel_region(x, self.config.comm)
        return h @ self.weight.T if self.tied else F.linear(h, self.weight)

    def extra_repr(self) -> str:
        return (f"vocab=[{self.vocab_start}, {self.vocab_end}), tied={self.tied}, "
                f"rank={self.config.rank}/{self.config.size}")


class ModelStage(Module):
    """A pipeline stage that runs `run` (a part of a model's forward, e.g.
    `nn.GPT.forward_stage`); it owns no parameters: the model does."""

    def __init__(self, run: Callable[[Any], Tensor]) -> None:
        super().__init__()
        self.run = run

    def forward(self, x: Any) -> Tensor:
        return self.run(x)


class ParallelModel(Module):
    """A dense decoder's parts for this rank: tensor-parallel layers substituted, its blocks
    split into pipeline stages, data-parallel on top; run by the dense model's own
    ``forward_stage`` (the subclass's other base).

    ``Model(config, mesh)`` (or ``tp=``/``pp=``/``dp=`` communicators; None = size 1)
    builds the dense model from ``config.seed`` on the host and holds this rank's stage of
    its parts, with this rank's parallel layers (exact shards) substituted, so any layout
    holds exactly the single-process model's weights. Parameter names are the dense ones
    (the last stage's copy of a tied embedding is the head's); each parameter's
    ``shard_spec`` says where it sits in the dense model.

    * ``forward(idx)``: logits ``[B, T, V_r]`` (this TP rank's vocabulary block) on the last
      stage's ranks, None on the others.
    * ``train_step(idx, targets) -> float``: forward and backward of the mean next-token
      loss over ``idx [B, T]`` (this data-parallel rank's batch) in ``num_micro_batches``
      micro-batches with the pipeline ``schedule``; leaves in ``.grad`` the gradient of
      the global-batch mean loss (replicated copies summed, averaged over ``dp``) and
      returns the global-batch loss on every rank. With data parallelism the average
      starts during the last micro-batch's backward, bucket by bucket as gradients become
      final (``overlap_grad_reduce=True``, the default; False: after the backward), with
      the same result bit for bit at dp=2.
    * ``shard_specs()``: local parameter name -> `ShardSpec`.

    ``sequence_parallel=True`` (Megatron-LM's sequence parallelism, with ``tp > 1``): between
    tensor-parallel regions the activations ``[B, T, C]`` are split along ``T`` over the TP
    ranks (``T`` divisible by ``tp``), so norms, dropout and residual adds run on ``T/tp``
    tokens: the embedding's output is reduce-scattered along ``T``, each column-parallel
    layer all-gathers its input along ``T``, each row-parallel layer reduce-scatters its
    output instead of all-reducing it, and the head all-gathers ``T`` back, so the logits
    (and the vocabulary-parallel loss) cover whole sequences as without it. Dropout draws
    the masks of its tokens' global positions (`SequenceParallelDropout`); the replicated
    parameters that see a shard of the tokens (norms, GPT's position embedding) get their
    gradients summed over TP after each backward (`_replica_groups`).

    Context parallelism (``mesh.cp`` or ``cp=``, size > 1): every rank of a cp group is
    given its data-parallel rank's whole sequences (``T`` divisible by ``2 cp``) and runs
    chunks ``i`` and ``2cp - 1 - i`` of them (`dist.context_parallel`): attention is ring
    attention over cp, positions (GPT's learned ones, Llama's RoPE) and dropout masks follow
    the global token index (`dist.context_parallel_layers`), each rank's loss is its tokens'
    share of the whole batch's mean (`context_loss_fn`) and every gradient is summed over cp
    (a replica group) before the data-parallel average. ``forward`` gathers the logits back
    into sequence order. Attention dropout and KV-cache generation are refused at cp > 1.

    Clipping, evaluation and consolidation are `dist.clip_grad_norm_`, `dist.evaluate` and
    `dist.gather_dense_state_dict` (dist/training.py).
    """

    #: attribute names of the dense model's token embedding, its list of blocks and its head
    embedding_name = "wte"
    blocks_name = "blocks"
    head_name = "head"

    def __init__(self, config: Any, mesh: Any = None, *, tp: Communicator | None = None,
                 pp: Communicator | None = None, dp: Communicator | None = None,
                 num_micro_batches: int = 1, schedule: str = "1f1b",
                 device: str = "cpu", dtype: Any = None,
                 sequence_parallel: bool = False, overlap_grad_reduce: bool = True,
                 cp: Communicator | None = None) -> None:
        if mesh is not None:
            tp, pp, dp, cp = mesh.tp, mesh.pp, mesh.dp, getattr(mesh, "cp", None)
        tp, pp, dp, cp = (c if c is not None and c.size > 1 else None
                          for c in (tp, pp, dp, cp))
        num_stages = 1 if pp is None else pp.size
        self.check_layout(config, 1 if tp is None else tp.size, num_stages)
        super().__init__()
        self.config = config
        self.tp_comm, self.pp_comm, self.dp_comm, self.cp_comm = tp, pp, dp, cp
        # With one TP rank there is no sequence to split: the option changes nothing.
        self.sequence_parallel = bool(sequence_parallel) and tp is not None
        self.tp_config = TensorParallelConfig(comm=tp,
                                              reduce_scatter_output=self.sequence_parallel,
                                              sequence_axis=1)
        self.device = device
        self.num_stages = num_stages
        self.stage_index = 0 if pp is None else pp.rank
        self._hold_stage(self.dense_model(config))  # drawn from config.seed on the host
        if self.sequence_parallel:
            self._shard_sequence()
        if cp is not None:
            self._shard_context()
        modules = dict(self.named_modules())
        for name, p in self.named_parameters():
            p.shard_spec = self._shard_spec(name, modules[name.rpartition(".")[0]])
        self.replica_groups = self._replica_groups()
        #: Start the data-parallel gradient reduction during the last micro-batch's backward
        #: (`dist.OverlappedGradReducer`; the same result as after it, bit for bit at dp=2).
        self.overlap_grad_reduce = bool(overlap_grad_reduce)
        self.grad_bucket_bytes = DEFAULT_BUCKET_BYTES  # read when the reducer is made
        self._grad_reducer = None
        stage = ModelStage(partial(self.forward_stage, first=self.is_first_stage,
                                   last=self.is_last_stage))
        self.pipe = PipelineParallel(
            [stage if s == self.stage_index else _unbuilt for s in range(num_stages)],
            num_micro_batches=num_micro_batches, schedule=schedule, comm=pp)
        if device != "cpu" or dtype is not None:
            self.to(device=device, dtype=dtype)  # in place: the shard specs stay

    # -- what a model defines ---------------------------------------------------------------

    def dense_model(self, config: Any) -> Module:
        """The single-process model of `config` (its weights drawn from ``config.seed``)."""
        raise NotImplementedError

    def _shard_block(self, block: Module) -> None:
        """Substitute a block's Linears (in place) by this rank's tensor-parallel shards."""
        raise NotImplementedError

    def check_layout(self, config: Any, tp: int, pp: int) -> None:
        """InvalidProblem naming the config field a layout of `tp` x `pp` cannot split."""
        divisible(type(self).__name__, "n_layer", config.n_layer, pp, "pipeline size")

    def dense_columns(self, name: str, owner: ColumnParallelLinear) -> np.ndarray:
        """The dense output columns that column-parallel `owner` (parameter `name`) holds:
        this rank's contiguous block, unless the model permuted the dense columns first."""
        w = owner.out_features_per_rank
        return np.arange(owner.rank * w, (owner.rank + 1) * w)

    def _shard_sequence(self) -> None:
        """Sequence parallelism's substitutions beyond the TP layers (which follow
        ``tp_config``): every dropout acts on sequence shards, so each `nn.Dropout` becomes a
        `SequenceParallelDropout` (the dense masks of its tokens). A model adds its own
        (GPT: the position embedding of the shard's positions)."""
        for module in list(self.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, Dropout):
                    setattr(module, name, SequenceParallelDropout(child.p, self.tp_comm))

    def _shard_context(self) -> None:
        """Context parallelism's substitutions (`dist.context_parallel_layers`): every
        dropout draws its tokens' entries of the whole tensor's mask (`PositionDropout`,
        in place of sequence parallelism's if any). A model adds its own: its attention as
        ring attention over ``cp_comm`` (GPT also its position embedding)."""
        sp = self.tp_comm if self.sequence_parallel else None
        for module in list(self.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, (Dropout, SequenceParallelDropout)):
                    setattr(module, name, PositionDropout(child.p, self.cp_comm, sp))

    # -- layout ---------------------------------------------------------------------------

    def _hold_stage(self, dense: Module) -> None:
        """Hold this rank's stage of `dense`'s parts under their dense names (in the dense
        order), its blocks sharded for this TP rank: the first stage the vocabulary-parallel
        embedding and the parts before the blocks (GPT's position embedding, dropout), the
        last the parts after them (the final norm) and a vocabulary-parallel head (tied: the
        embedding's shard, shared, or its copy on another stage)."""
        cfg, tp = self.config, self.tp_config
        first, last = self.is_first_stage, self.is_last_stage
        emb = getattr(dense, self.embedding_name)
        wte = (VocabParallelEmbedding.from_dense(emb, config=tp)
               if first or (last and cfg.tie_weights) else None)
        children = list(dense.named_children())
        blocks_at = [name for name, _ in children].index(self.blocks_name)
        for i, (name, module) in enumerate(children):
            if name == self.blocks_name:
                self._hold_blocks(module)
            elif name == self.embedding_name:
                if first:
                    setattr(self, name, wte)
            elif name != self.head_name and ((first and i < blocks_at)
                                             or (last and i > blocks_at)):
                setattr(self, name, module)
        if last:
            setattr(self, self.head_name, VocabParallelHead.tied_to(wte, share=first)
                    if cfg.tie_weights else
                    VocabParallelHead.from_dense(getattr(dense, self.head_name), tp))

    def _hold_blocks(self, dense_blocks: ModuleList) -> None:
        per = self.config.n_layer // self.num_stages
        blocks = ModuleList()
        for i in range(self.stage_index * per, (self.stage_index + 1) * per):
            self._shard_block(dense_blocks[i])
            blocks.add_module(str(i), dense_blocks[i])  # keeps the dense name blocks.{i}
        setattr(self, self.blocks_name, blocks)

    def _replica_groups(self) -> list[tuple[list[Parameter], Communicator]]:
        """(parameters, group) pairs whose gradients are summed over the group after each
        backward, because each of the group's ranks holds a copy of the same dense values
        and sees part of their gradient: here the tied embedding's copies on the first and
        last stage, and with sequence parallelism the replicated parameters (norms,
        position embedding: unsplit, not a row-parallel bias, whose layer sums it) over TP,
        each rank having seen its sequence shard's tokens only."""
        groups = []
        if self.sequence_parallel:
            modules = dict(self.named_modules())
            seen = [p for name, p in self.named_parameters()
                    if not p.shard_spec.tensor_parallel
                    and not isinstance(modules[name.rpartition(".")[0]], RowParallelLinear)]
            groups.append((seen, self.tp_comm))
        if self.cp_comm is not None:
            # The cp ranks see different tokens of the same sequences: each holds its
            # tokens' part of every parameter's gradient (its loss: their share of the mean).
            groups.append((list(self.parameters()), self.cp_comm))
        return groups + self._tied_copy_groups()

    def _tied_copy_groups(self) -> list[tuple[list[Parameter], Communicator]]:
        """The tied embedding's copies on the first and last stage, summed over the two."""
        if not self.config.tie_weights or self.num_stages == 1:
            return []
        ends = self.is_first_stage or self.is_last_stage
        group = self.pp_comm if self.num_stages == 2 else self.pp_comm.split(0 if ends else 1)
        if not ends:
            return []
        owner = getattr(self, self.embedding_name if self.is_first_stage else self.head_name)
        return [([owner.weight], group)]

    def _shard_spec(self, name: str, owner: Module) -> ShardSpec:
        """Where parameter `name` (held by module `owner`) sits in the dense model."""
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(owner, ColumnParallelLinear):
            cols = self.dense_columns(name, owner)
            return ShardSpec(name, 1 if leaf == "weight" else 0, tuple(int(c) for c in cols),
                             True)
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
            embedding = f"{self.embedding_name}.weight"
            return ShardSpec(embedding, 0, vocab, split, duplicate=name != embedding)
        return ShardSpec(name)

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
        token ids ``targets [B, T]`` (host or device), identical on every TP rank. With
        context parallelism, logits of this cp rank's slice of the sequences (what
        `train_step` runs) give its share of that mean (`context_loss_fn`)."""
        if self.cp_comm is not None and logits.shape[1] != targets.shape[1]:
            return self.context_loss_fn(logits, targets)
        return vocab_parallel_cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                            self.input_array(targets).reshape(-1),
                                            self.tp_config)

    def context_loss_fn(self, logits: Tensor, targets: Any) -> Tensor:
        """This cp rank's share of the mean cross-entropy of whole sequences: the sum over
        its tokens' logits ``[B, T_local, V_r]`` against their targets (taken from the whole
        ``targets [B, T]``), over the count of the whole batch's targets (those not -100);
        the shares of the cp group sum to `loss_fn` of the whole sequences."""
        targets = self.input_array(targets)
        xp = gp.backend.array_namespace(targets)
        count = max(1, int(xp.count_nonzero(targets != -100)))
        mine = take_local(targets, self.cp_comm, op=f"{type(self).__name__}.train_step",
                          arg="targets")
        total = vocab_parallel_cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             mine.reshape(-1), self.tp_config,
                                             reduction="sum")
        return total * (1.0 / count)

    def train_step(self, idx: Any, targets: Any) -> float:
        idx, targets = self.input_array(idx), self.input_array(targets)
        self._check_sequence(idx, "train_step")
        # Context parallelism: each cp rank runs its slice (loss_fn: its share of the mean).
        idx = take_local(idx, self.cp_comm)
        reducer = self.grad_reducer()
        if reducer is None and not self.reduce_data_parallel:
            reducer = self.external_grad_reducer
        arm = None if reducer is None else reducer.arm
        if self.num_stages == 1:
            loss = self._accumulate_micro_batches(idx, targets, arm)
        else:
            loss = self.pipe.train_step(idx, targets, self.loss_fn, before_last_backward=arm)
        self.finish_gradients()
        if self.cp_comm is not None:
            loss = float(self.cp_comm.all_reduce(np.array([loss], np.float64))[0])
        return average_over(self.dp_comm, loss)

    def grad_reducer(self) -> OverlappedGradReducer | None:
        """The reducer that overlaps the data-parallel gradient average with the last
        backward (made at first use): None without data parallelism, with
        ``overlap_grad_reduce`` False or with ``reduce_data_parallel`` False (then the hooks
        come off the parameters). Replicated copies (`_replica_groups`) are left out: their
        sums over their groups come first, then their average, the blocking way."""
        wanted = (self.overlap_grad_reduce and self.dp_comm is not None
                  and getattr(self, "reduce_data_parallel", True))
        if not wanted:
            if self._grad_reducer is not None:
                self._grad_reducer.remove()
                self._grad_reducer = None
            return None
        if self._grad_reducer is None:
            replicas = {id(p) for params, _ in self.replica_groups for p in params}
            self._grad_reducer = OverlappedGradReducer(
                [p for p in self.parameters() if id(p) not in replicas], self.dp_comm,
                bucket_bytes=self.grad_bucket_bytes)
        return self._grad_reducer

    def _accumulate_micro_batches(self, idx: Any, targets: Any,
                                  before_last_backward: Callable[[], Any] | None = None
                                  ) -> float:
        """One stage: forward and backward of each micro-batch in turn (what the pipeline
        runner's schedules do with one stage, without its machinery); ``.grad`` accumulates
        the gradient of the mean micro-batch loss, which is returned. `before_last_backward`
        runs before the last micro-batch's backward (the reducer's arm)."""
        n = self.pipe.num_micro_batches
        losses = []
        for m, (x, y) in enumerate(zip(split_rows(idx, n, "x"),
                                       split_rows(targets, n, "target"), strict=True)):
            with trace.span("forward", stage=0, micro_batch=m), Tape() as tape:
                loss = self.loss_fn(self.forward_stage(x), y)
                losses.append(float(loss.item()))
                scaled = loss * (1.0 / n)
            if scaled._node is not None:
                if m == n - 1 and before_last_backward is not None:
                    before_last_backward()
                with trace.span("backward", stage=0, micro_batch=m):
                    tape.backward(scaled)
        return float(np.mean(losses))

    #: False leaves the average over data parallel to the caller: ZeRO's reduce-scatter of
    #: the gradients into the optimizer's slices (`ZeroRedundancyOptimizer.reduce_gradients`).
    reduce_data_parallel = True
    #: With reduce_data_parallel False: what train_step arms before the last backward
    #: instead of its own reducer (ZeRO's, `ZeroRedundancyOptimizer.overlap_with`).
    external_grad_reducer: Any = None

    def finish_gradients(self) -> None:
        """Sum the gradients of replicated copies over their groups (`_replica_groups`),
        then average every gradient over data parallel (unless `reduce_data_parallel` is
        False: then the caller reduces them, after these sums)."""
        for params, group in self.replica_groups:
            allreduce_gradients(params, group, average=False)
        if self.reduce_data_parallel:
            allreduce_gradients(self.parameters(), self.dp_comm, average=True)

    def forward(self, idx: Any) -> Tensor | None:
        """Logits ``[B, T, V_r]`` (this TP rank's vocabulary block) on the last stage's ranks,
        None on the others. With context parallelism each cp rank runs its slice of ``idx``
        and the logits are gathered over cp back into sequence order (not differentiable:
        for evaluation and generation; `train_step` trains)."""
        idx = self.input_array(idx)
        self._check_sequence(idx, "forward")
        if self.cp_comm is None:
            return self.pipe.forward(idx)
        logits = self.pipe.forward(take_local(idx, self.cp_comm))
        return None if logits is None else Tensor(gather_sequence(logits.data, self.cp_comm))

    def _check_sequence(self, idx: Any, op: str) -> None:
        """With sequence parallelism, InvalidProblem unless TP divides the sequence length
        (of each cp rank's slice); with context parallelism, unless ``2 cp`` divides it."""
        if idx.ndim != 2:
            return
        length = idx.shape[1]
        if self.cp_comm is not None:
            length = 2 * check_length(length, self.cp_comm.size,
                                      f"{type(self).__name__}.{op}", "idx")
        if self.sequence_parallel:
            sequence_chunk(length, self.tp_comm, f"{type(self).__name__}.{op}", "idx")

    def input_array(self, x: Any) -> Any:
        """Token ids (host or device array, or Tensor) as an array on the model's device."""
        return gp.to_device(x.data if isinstance(x, Tensor) else x, self.device)


def _unbuilt() -> Module:  # pragma: no cover - never called: other ranks' stages
    raise AssertionError("a stage owned by another pipeline rank was built")


__all__ = ["ModelStage", "ParallelModel", "VocabParallelHead", "divisible"]
