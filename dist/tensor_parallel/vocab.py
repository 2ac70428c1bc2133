"""Vocabulary-parallel embedding and cross entropy: each TP rank owns a block of the vocab."""

from __future__ import annotations

from typing import Any

import numpy as np

import autograd.nn.functional as F
import gpuplan.functional as GF
from autograd.function import Function
from autograd.nn import Embedding, Module, Parameter
from autograd.tensor import Tensor
from dist.communicator import Communicator
from dist.tensor_parallel.layers import TensorParallelConfig, shared_seed
from dist.tensor_parallel.mappings import (
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)
from gpuplan import backend
from gpuplan.errors import InvalidProblem, describe


def vocab_range(num_embeddings: int, rank: int, size: int) -> tuple[int, int]:
    """[start, end) of rank's rows: balanced blocks, the first V % size ranks one row more."""
    base, extra = divmod(num_embeddings, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class VocabParallelEmbedding(Module):
    """out[..., :] = weight[input[...], :] with weight [V, D] split into row blocks.

    Rank t holds rows [start_t, end_t) (see vocab_range; exact rows of the dense
    nn.Embedding with the same seed), looks up the indices that fall in its block (zero
    rows for the others: the embedding plans' index_offset=start_t) and all-reduces:
    out = AllReduce_t(lookup_t). Backward needs no collective: each rank scatters dout
    into its own rows only. With config.reduce_scatter_output (sequence parallelism) the
    sum is reduce-scattered along config.sequence_axis instead (this rank's sequence shard;
    backward all-gathers dout).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 config: TensorParallelConfig | None = None, dtype: Any = np.float32,
                 seed: int | None = None, device: str = "cpu") -> None:
        config = config or TensorParallelConfig()
        dense = Embedding(num_embeddings, embedding_dim, padding_idx=padding_idx, dtype=dtype,
                          seed=shared_seed(config, seed), device="cpu")
        self._build(dense, config, device)

    @classmethod
    def from_dense(cls, layer: Embedding,
                   config: TensorParallelConfig | None = None) -> VocabParallelEmbedding:
        self = cls.__new__(cls)
        self._build(layer, config or TensorParallelConfig(), backend.device_of(layer.weight.data))
        return self

    def _build(self, dense: Embedding, config: TensorParallelConfig, device: str) -> None:
        Module.__init__(self)
        self.config, self.comm = config, config.comm
        self.rank, self.world_size = config.rank, config.size
        self.num_embeddings, self.embedding_dim = dense.num_embeddings, dense.embedding_dim
        self.padding_idx = dense.padding_idx
        self.vocab_start, self.vocab_end = vocab_range(self.num_embeddings, self.rank,
                                                       self.world_size)
        rows = backend.ascontiguous(dense.weight.data[self.vocab_start:self.vocab_end]).copy()
        self.weight = Parameter(backend.to_device(rows, device))

    def forward(self, input: Any) -> Tensor:  # noqa: A002 - PyTorch's name
        idx = input.data if isinstance(input, Tensor) else backend.asarray(
            input, device=self.weight.device)
        if idx.dtype.kind not in "iu":
            raise InvalidProblem(describe("VocabParallelEmbedding", "input", "integer indices",
                                          idx.dtype))
        # The plans shift global indices into this block (index_offset): the others give
        # zero rows forward and are skipped backward; padding_idx stays global.
        out = F.embedding(idx, self.weight, padding_idx=self.padding_idx,
                          index_offset=self.vocab_start)
        if self.config.reduce_scatter_output:
            return reduce_scatter_to_sequence_parallel_region(out, self.comm,
                                                              self.config.sequence_axis)
        return reduce_from_tensor_parallel_region(out, self.comm)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, rows=[{self.vocab_start}, "
                f"{self.vocab_end}), rank={self.rank}/{self.world_size}")


class _VocabParallelCrossEntropy(Function):
    """loss_n = lse_n - x[n, t_n] over logits [N, V] split by columns across the TP group.

    lse_n = m_n + log sum_v exp(x[n, v] - m_n), m_n = max_v x[n, v]: the local row maxima
    all-reduced (max), then [local sum of exps; local target logit] all-reduced (sum); the
    math is gpuplan's cross_entropy_partial stages. Backward: dx[n, v] = g_n (softmax(x)[n, v]
    - [v == t_n]) on the local block, no collective.
    """

    @staticmethod
    def forward(ctx, logits, target, comm, vocab_start, vocab_total, ignore_index, reduction):
        block = dict(vocab_start=vocab_start, vocab_total=vocab_total)
        row_max = _all_reduce(comm, GF.cross_entropy_partial_max(logits), "max")
        stats = _all_reduce(comm, GF.cross_entropy_partial(logits, target, row_max,
                                                           ignore_index=ignore_index, **block),
                            "sum")
        ctx.opts = dict(block, ignore_index=ignore_index, reduction=reduction)
        loss, lse = GF.cross_entropy_finish(target, row_max, stats, vocab_total=vocab_total,
                                            ignore_index=ignore_index, reduction=reduction)
        ctx.save_for_backward(logits, target, lse)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        logits, target, lse = ctx.saved
        return GF.cross_entropy_partial_backward(logits, target, lse, dloss, **ctx.opts), None


def _all_reduce(comm: Communicator | None, x: Any, op: str) -> Any:
    return x if comm is None else comm.all_reduce(x, op, out=x)


REDUCTIONS = ("mean", "sum", "none")


def vocab_parallel_cross_entropy(logits: Tensor, target: Any,
                                 config: TensorParallelConfig | Communicator | None = None,
                                 ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """Cross entropy of logits [N, V_t] whose columns are this rank's vocab block.

    The blocks are those of vocab_range over the TP group (e.g. the output of a
    ColumnParallelLinear with gather_output=False, or a VocabParallelEmbedding's rows).
    Returns what F.cross_entropy(full_logits, target) returns (PyTorch semantics for
    ignore_index and reduction), identical on every TP rank; accumulates in f32 for
    f16/bf16 logits. The full [N, V] logits are never gathered.
    """
    comm = config.comm if isinstance(config, TensorParallelConfig) else config
    if reduction not in REDUCTIONS:
        raise InvalidProblem(describe("vocab_parallel_cross_entropy", "reduction",
                                      f"one of {REDUCTIONS}", repr(reduction)))
    if logits.ndim != 2:
        raise InvalidProblem(describe("vocab_parallel_cross_entropy", "logits", "[N, V_t]",
                                      tuple(logits.shape)))
    t = target.data if isinstance(target, Tensor) else backend.asarray(target,
                                                                        device=logits.device)
    if t.dtype.kind not in "iu" or tuple(t.shape) != (logits.shape[0],):
        raise InvalidProblem(describe("vocab_parallel_cross_entropy", "target",
                                      f"integer [{logits.shape[0]}]", f"{t.dtype} {t.shape}"))
    size = 1 if comm is None else comm.size
    widths = [logits.shape[1]] if comm is None else comm.all_gather_object(logits.shape[1])
    rank = 0 if comm is None else comm.rank
    total = sum(widths)
    if widths != [b - a for a, b in (vocab_range(total, r, size) for r in range(size))]:
        raise InvalidProblem(describe("vocab_parallel_cross_entropy", "logits",
                                      "vocab blocks of vocab_range over the group", widths))
    if t.dtype not in (np.int32, np.int64):
        t = t.astype(np.int64)
    comm = None if size == 1 else comm
    return _VocabParallelCrossEntropy.apply(logits, t, comm=comm,
                                            vocab_start=sum(widths[:rank]), vocab_total=total,
                                            ignore_index=int(ignore_index),
                                            reduction=reduction)
