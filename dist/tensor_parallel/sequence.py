"""Sequence parallelism's layers on a sequence shard: dropout and a replicated embedding.

Between tensor-parallel regions (`TensorParallelConfig.reduce_scatter_output`) each TP rank
holds chunk r of the sequence axis: rows ``[r T/t, (r+1) T/t)`` of a ``[B, T, C]`` tensor.
What runs there must act as it would on the whole tensor, restricted to the chunk.
"""

from __future__ import annotations

from typing import Any

import autograd.nn.functional as F
from autograd.nn import Embedding, Module, Parameter
from autograd.tensor import Tensor
from dist.communicator import Communicator
from gpuplan import backend
from gpuplan.errors import InvalidProblem, describe


def sequence_chunk(n: int, comm: Communicator | None, op: str,
                   arg: str = "x") -> tuple[int, int]:
    """``[start, stop)`` of this rank's chunk of a sequence of `n` (equal chunks);
    InvalidProblem naming `op` and `arg` unless the group's size divides `n`."""
    size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
    if n % size:
        raise InvalidProblem(describe(op, arg, f"a sequence length divisible by the "
                                      f"tensor-parallel size {size} (sequence parallel)", n))
    width = n // size
    return rank * width, (rank + 1) * width


class SequenceParallelDropout(Module):
    """``dropout(x_full, p)[chunk]`` for ``x``, this rank's chunk along `axis` of ``x_full``:
    the mask of each element is the one `nn.Dropout` draws for its global position in the
    whole tensor, and the default generator advances as far (by the whole tensor's count),
    so masks agree with and without sequence parallelism.

    The chunk is zero-padded to the whole tensor's shape and dropped by the same plan
    (F.pad, F.dropout, a slice: every op differentiable, no mask kept). This costs one
    transient whole-tensor buffer per call; a dropout plan taking a strided element range
    would avoid it.
    """

    def __init__(self, p: float, comm: Communicator | None, axis: int = 1) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"SequenceParallelDropout: p must lie in [0, 1), given {p}")
        self.p, self.comm, self.axis = float(p), comm, int(axis)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        size = 1 if self.comm is None else self.comm.size
        n = x.shape[self.axis]
        start, _ = sequence_chunk(n * size, self.comm, "SequenceParallelDropout")
        axis = self.axis % x.ndim
        pad = [0] * (2 * (x.ndim - 1 - axis)) + [start, (size - 1) * n - start]
        dropped = F.dropout(F.pad(x, pad), self.p, training=True)
        return dropped[(slice(None),) * axis + (slice(start, start + n),)]

    def extra_repr(self) -> str:
        return f"p={self.p}, axis={self.axis}"


class SequenceShardEmbedding(Module):
    """``weight[ids[chunk]]``: a replicated embedding (``weight [N, C]``, e.g. GPT's position
    table) looked up for this rank's chunk of ``ids`` along `axis`. Each rank's gradient
    covers its chunk's rows only: the caller sums it over the group."""

    def __init__(self, weight: Parameter, comm: Communicator | None, axis: int = 0) -> None:
        super().__init__()
        self.weight, self.comm, self.axis = weight, comm, int(axis)

    @classmethod
    def from_dense(cls, layer: Embedding, comm: Communicator | None,
                   axis: int = 0) -> SequenceShardEmbedding:
        """Share `layer`'s weight Parameter (its name and values stay the dense ones)."""
        return cls(layer.weight, comm, axis)

    def forward(self, ids: Any) -> Tensor:
        ids = ids.data if isinstance(ids, Tensor) else ids
        axis = self.axis % ids.ndim
        start, stop = sequence_chunk(ids.shape[axis], self.comm, "SequenceShardEmbedding",
                                     "ids")
        chunk = backend.ascontiguous(ids[(slice(None),) * axis + (slice(start, stop),)])
        return F.embedding(chunk, self.weight)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, axis={self.axis}"


__all__ = ["SequenceParallelDropout", "SequenceShardEmbedding", "sequence_chunk"]
