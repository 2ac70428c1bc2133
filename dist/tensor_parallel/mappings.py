"""Differentiable collectives that enter and leave a tensor-parallel region (Megatron pairs).

Each Function pairs a collective with its conjugate in backward:

  copy_to_tensor_parallel_region       forward identity        backward all-reduce
  reduce_from_tensor_parallel_region   forward all-reduce      backward identity
  scatter_to_tensor_parallel_region    forward take own chunk  backward all-gather
  gather_from_tensor_parallel_region   forward all-gather      backward take own chunk
  reduce_scatter_to_sequence_parallel_region  forward reduce-scatter (sequence axis)
                                              backward all-gather (sequence axis)
  gather_from_sequence_parallel_region        forward all-gather (sequence axis)
                                              backward reduce-scatter (sequence axis)

The sequence axis is 0 by default (Megatron's [T, B, C]); the models' [B, T, C] pass 1.

A communicator of size 1 (or None) makes every mapping the identity.
"""

from __future__ import annotations

from typing import Any

from autograd.function import Function
from autograd.tensor import Tensor
from dist.communicator import Communicator
from gpuplan import backend
from gpuplan.errors import InvalidProblem, describe


def _chunk(x: Any, comm: Communicator, axis: int, op: str) -> Any:
    """This rank's contiguous chunk of x along `axis` (equal chunks)."""
    n = x.shape[axis]
    if n % comm.size:
        raise InvalidProblem(describe(op, "x", f"shape[{axis}] divisible by the tensor-"
                                      f"parallel size {comm.size}", tuple(x.shape)))
    width = n // comm.size
    index = [slice(None)] * x.ndim
    index[axis] = slice(comm.rank * width, (comm.rank + 1) * width)
    return backend.ascontiguous(x[tuple(index)])


class _CopyToRegion(Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.copy()

    @staticmethod
    def backward(ctx, dy):
        return ctx.comm.all_reduce(dy), None


class _ReduceFromRegion(Function):
    @staticmethod
    def forward(ctx, x, comm):
        return comm.all_reduce(x)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class _ScatterToRegion(Function):
    @staticmethod
    def forward(ctx, x, comm, axis):
        ctx.comm, ctx.axis = comm, axis
        return _chunk(x, comm, axis, "scatter_to_tensor_parallel_region")

    @staticmethod
    def backward(ctx, dy):
        return ctx.comm.all_gather(backend.ascontiguous(dy), axis=ctx.axis), None, None


class _GatherFromRegion(Function):
    @staticmethod
    def forward(ctx, x, comm, axis):
        ctx.comm, ctx.axis = comm, axis
        return comm.all_gather(x, axis=axis)

    @staticmethod
    def backward(ctx, dy):
        return _chunk(dy, ctx.comm, ctx.axis, "gather_from_tensor_parallel_region"), None, None


class _ReduceScatterToSequence(Function):
    @staticmethod
    def forward(ctx, x, comm, axis):
        ctx.comm, ctx.axis = comm, axis
        return comm.reduce_scatter(x, axis=axis)

    @staticmethod
    def backward(ctx, dy):
        return ctx.comm.all_gather(backend.ascontiguous(dy), axis=ctx.axis), None, None


class _GatherFromSequence(Function):
    @staticmethod
    def forward(ctx, x, comm, axis):
        ctx.comm, ctx.axis = comm, axis
        return comm.all_gather(x, axis=axis)

    @staticmethod
    def backward(ctx, dy):
        return ctx.comm.reduce_scatter(dy, axis=ctx.axis), None, None


def _trivial(comm: Communicator | None) -> bool:
    return comm is None or comm.size == 1


def copy_to_tensor_parallel_region(x: Tensor, comm: Communicator | None) -> Tensor:
    """Identity forward; all-reduce of the gradient backward (input of a column layer)."""
    return x if _trivial(comm) else _CopyToRegion.apply(x, comm)


def reduce_from_tensor_parallel_region(x: Tensor, comm: Communicator | None) -> Tensor:
    """All-reduce (sum) forward; identity backward (output of a row layer)."""
    return x if _trivial(comm) else _ReduceFromRegion.apply(x, comm)


def scatter_to_tensor_parallel_region(x: Tensor, comm: Communicator | None,
                                      axis: int = -1) -> Tensor:
    """Keep this rank's chunk of `axis` forward; all-gather the gradient backward."""
    return x if _trivial(comm) else _ScatterToRegion.apply(x, comm, axis % x.ndim)


def gather_from_tensor_parallel_region(x: Tensor, comm: Communicator | None,
                                       axis: int = -1) -> Tensor:
    """All-gather along `axis` forward; keep this rank's chunk of the gradient backward."""
    return x if _trivial(comm) else _GatherFromRegion.apply(x, comm, axis % x.ndim)


def reduce_scatter_to_sequence_parallel_region(x: Tensor, comm: Communicator | None,
                                               axis: int = 0) -> Tensor:
    """Reduce-scatter along `axis` (rows/sequence) forward; all-gather backward."""
    return x if _trivial(comm) else _ReduceScatterToSequence.apply(x, comm, axis % x.ndim)


def gather_from_sequence_parallel_region(x: Tensor, comm: Communicator | None,
                                         axis: int = 0) -> Tensor:
    """All-gather along `axis` forward; reduce-scatter (sum) of the gradient backward."""
    return x if _trivial(comm) else _GatherFromSequence.apply(x, comm, axis % x.ndim)
