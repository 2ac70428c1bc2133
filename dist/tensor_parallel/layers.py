"""Tensor-parallel linear layers: ColumnParallelLinear and RowParallelLinear (Megatron-LM)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import autograd.nn.functional as F
from autograd.function import Function
from autograd.functions.matmul import Linear as LinearFunction
from autograd.functions.matmul import LinearGelu
from autograd.nn import Linear, Module, Parameter
from autograd.tensor import Tensor
from dist.communicator import Communicator
from dist.tensor_parallel.mappings import (
    copy_to_tensor_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)
from gpuplan import backend
from gpuplan.errors import InvalidProblem, describe


@dataclass(frozen=True)
class TensorParallelConfig:
    """How TP layers communicate.

    comm: the tensor-parallel Communicator (mesh.tp); None means one process.
    reduce_output: RowParallelLinear all-reduces its output (else it returns the partial
      sum X_t @ W_t, with the bias added on TP rank 0 only, so the outputs sum to Y).
    reduce_scatter_output: sequence parallelism. RowParallelLinear reduce-scatters its
      output along `sequence_axis` instead of all-reducing it, ColumnParallelLinear
      expects its input sharded the same way and all-gathers it (and so do
      VocabParallelEmbedding's output and the models' vocabulary-parallel head's input).
    sequence_axis: the axis sequence parallelism shards: 0 (rows, Megatron's [T, B, C]);
      the models' activations [B, T, C] use 1.
    """

    comm: Communicator | None = None
    reduce_output: bool = True
    reduce_scatter_output: bool = False
    sequence_axis: int = 0

    @property
    def size(self) -> int:
        return 1 if self.comm is None else self.comm.size

    @property
    def rank(self) -> int:
        return 0 if self.comm is None else self.comm.rank


def shared_seed(config: TensorParallelConfig, seed: int | None) -> int | None:
    """A seed every TP rank agrees on (rank 0 draws one when `seed` is None)."""
    if seed is not None or config.size == 1:
        return seed
    drawn = int(np.random.SeedSequence().generate_state(1)[0])
    return config.comm.bcast_object(drawn, root=0)


class _GatheredLinear(Function):
    """``inner`` (autograd's Linear or LinearGelu Function) on ``X = AllGather_axis(X_t)``,
    keeping the shard ``X_t`` for backward instead of the gathered ``X``, which backward
    all-gathers again (Megatron-LM's sequence-parallel linear): the layer keeps 1/p of its
    input at the cost of one more all-gather; ``dX_t`` is the reduce-scatter of inner's dX."""

    @staticmethod
    def forward(ctx, x, w, bias, comm, axis, inner, options):
        ctx.comm, ctx.axis, ctx.inner = comm, axis, inner
        gathered = comm.all_gather(x, axis=axis)
        y = inner.forward(ctx, gathered, w, bias, **options)
        ctx.gathered_at = [i for i, a in enumerate(ctx.saved) if a is gathered]
        ctx.saved = tuple(x if a is gathered else a for a in ctx.saved)
        return y

    @staticmethod
    def backward(ctx, dy):
        saved = list(ctx.saved)
        if ctx.gathered_at:
            gathered = ctx.comm.all_gather(backend.ascontiguous(saved[ctx.gathered_at[0]]),
                                           axis=ctx.axis)
            for i in ctx.gathered_at:
                saved[i] = gathered
        ctx.saved = tuple(saved)
        dx, dw, db = ctx.inner.backward(ctx, dy)
        if dx is not None:
            dx = ctx.comm.reduce_scatter(dx, axis=ctx.axis)
        return dx, dw, db


def _param(a: Any) -> Parameter:
    return Parameter(backend.ascontiguous(a).copy())


def _divisible(op: str, arg: str, value: int, size: int) -> int:
    if value % size:
        raise InvalidProblem(describe(op, arg, f"divisible by the tensor-parallel size {size}",
                                      value))
    return value // size


class _ParallelLinear(Module):
    """Shared construction: build (or take) the dense Linear, keep this rank's shard."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 config: TensorParallelConfig | None = None, dtype: Any = np.float32,
                 seed: int | None = None, device: str = "cpu", **options: Any) -> None:
        config = config or TensorParallelConfig()
        dense = Linear(in_features, out_features, bias=bias, dtype=dtype,
                       seed=shared_seed(config, seed), device="cpu")
        self._build(dense, config, device=device, **options)

    @classmethod
    def from_dense(cls, layer: Linear, config: TensorParallelConfig | None = None,
                   **options: Any) -> _ParallelLinear:
        """This rank's shard of a dense nn.Linear (same dtype and device); the layer is kept
        unchanged. Every TP rank must pass the same dense layer."""
        self = cls.__new__(cls)
        self._build(layer, config or TensorParallelConfig(),
                    device=backend.device_of(layer.weight.data), **options)
        return self

    def _build(self, dense: Linear, config: TensorParallelConfig, device: str,
               **options: Any) -> None:
        Module.__init__(self)
        self.config = config
        self.comm = config.comm
        self.rank, self.world_size = config.rank, config.size
        self.in_features, self.out_features = dense.in_features, dense.out_features
        self._configure(**options)
        weight, bias = self._shard(dense.weight.data, dense.bias)
        self.weight = _param(backend.to_device(weight, device))
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = _param(backend.to_device(bias, device))

    def _configure(self, **options: Any) -> None:
        raise NotImplementedError

    def _shard(self, weight: Any, bias: Tensor | None) -> tuple[Any, Any]:
        raise NotImplementedError


class ColumnParallelLinear(_ParallelLinear):
    """Y = X A + b with A = [A_1, ..., A_p] split along the output (N) axis.

    Rank t holds weight A_t [in, out/p] and bias b_t [out/p] (exact column blocks of the
    dense layer with the same seed) and computes Y_t = X A_t + b_t with no forward
    collective; backward all-reduces dX over the TP group. gather_output=True all-gathers
    Y = [Y_1, ..., Y_p] along the last axis. With config.reduce_scatter_output (sequence
    parallel) the input is sharded along config.sequence_axis and all-gathered first; only
    the shard is kept for backward, which gathers it again and reduce-scatters dX.
    Shapes: x [..., in] -> [..., out/p] (or [..., out] when gathered).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gather_output: bool = False, config: TensorParallelConfig | None = None,
                 dtype: Any = np.float32, seed: int | None = None, device: str = "cpu") -> None:
        super().__init__(in_features, out_features, bias, config, dtype, seed, device,
                         gather_output=gather_output)

    def _configure(self, gather_output: bool = False) -> None:
        self.gather_output = bool(gather_output)
        self.out_features_per_rank = _divisible("ColumnParallelLinear", "out_features",
                                                self.out_features, self.world_size)

    def _shard(self, weight: Any, bias: Tensor | None) -> tuple[Any, Any]:
        cols = slice(self.rank * self.out_features_per_rank,
                     (self.rank + 1) * self.out_features_per_rank)
        return weight[:, cols], None if bias is None else bias.data[cols]

    def forward(self, x: Tensor) -> Tensor:
        if self._sequence_parallel:
            return self._leave(self._gathered(x, LinearFunction, {}))
        y = F.linear(self._enter(x), self.weight, self.bias)
        return self._leave(y)

    def forward_gelu(self, x: Tensor, approximate: str = "none") -> Tensor:
        """``gelu(self(x), approximate)`` with the activation in the GEMM's epilogue on this
        rank's column block (GELU is elementwise: it commutes with the split and the gather)."""
        if self._sequence_parallel:
            if approximate not in ("none", "tanh"):
                raise ValueError(f"ColumnParallelLinear.forward_gelu: approximate must be "
                                 f"'none' or 'tanh', given {approximate!r}")
            name = "gelu" if approximate == "none" else "gelu_tanh"
            return self._leave(self._gathered(x, LinearGelu, {"name": name}))
        y = F.linear_gelu(self._enter(x), self.weight, self.bias, approximate=approximate)
        return self._leave(y)

    @property
    def _sequence_parallel(self) -> bool:
        return self.config.reduce_scatter_output and self.world_size > 1

    def _gathered(self, x: Tensor, inner: type, options: dict) -> Tensor:
        """Sequence parallel: `inner` on the all-gathered input, keeping only this rank's
        shard of it for backward (`_GatheredLinear`)."""
        return _GatheredLinear.apply(x, self.weight, self.bias, comm=self.comm,
                                     axis=self.config.sequence_axis % x.ndim, inner=inner,
                                     options=options)

    def _enter(self, x: Tensor) -> Tensor:
        """The input as this rank's GEMM takes it (not sequence parallel): the identity whose
        backward all-reduces dX."""
        return copy_to_tensor_parallel_region(x, self.comm)

    def _leave(self, y: Tensor) -> Tensor:
        return gather_from_tensor_parallel_region(y, self.comm) if self.gather_output else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"rank={self.rank}/{self.world_size}, gather_output={self.gather_output}")


class RowParallelLinear(_ParallelLinear):
    """Y = X A + b with A = [A_1; ...; A_p] split along the input (K) axis.

    Rank t holds weight A_t [in/p, out] (row block t of the dense weight) and the whole
    bias b [out]. Forward: Y = AllReduce(X_t A_t) + b, the bias added once, after the
    reduce, on every rank; backward dX_t = dY A_t^T with no collective.
    input_is_parallel=False scatters a full X [..., in] to X_t first. With
    config.reduce_scatter_output the sum is reduce-scattered along config.sequence_axis
    (each rank keeps rows [t*n/p, (t+1)*n/p) of it) and the bias gradient is all-reduced
    so every rank holds the dense gradient; with config.reduce_output=False see
    TensorParallelConfig.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 input_is_parallel: bool = True, config: TensorParallelConfig | None = None,
                 dtype: Any = np.float32, seed: int | None = None, device: str = "cpu") -> None:
        super().__init__(in_features, out_features, bias, config, dtype, seed, device,
                         input_is_parallel=input_is_parallel)

    def _configure(self, input_is_parallel: bool = True) -> None:
        self.input_is_parallel = bool(input_is_parallel)
        self.in_features_per_rank = _divisible("RowParallelLinear", "in_features",
                                               self.in_features, self.world_size)

    def _shard(self, weight: Any, bias: Tensor | None) -> tuple[Any, Any]:
        rows = slice(self.rank * self.in_features_per_rank,
                     (self.rank + 1) * self.in_features_per_rank)
        return weight[rows, :], None if bias is None else bias.data

    def forward(self, x: Tensor) -> Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x, self.comm, axis=-1)
        partial = F.linear(x, self.weight)
        if self.config.reduce_scatter_output:
            y = reduce_scatter_to_sequence_parallel_region(partial, self.comm,
                                                           self.config.sequence_axis)
            bias = (None if self.bias is None
                    else copy_to_tensor_parallel_region(self.bias, self.comm))
        elif self.config.reduce_output:
            y, bias = reduce_from_tensor_parallel_region(partial, self.comm), self.bias
        else:
            y, bias = partial, self.bias if self.rank == 0 else None
        return y if bias is None else y + bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"rank={self.rank}/{self.world_size}, "
                f"input_is_parallel={self.input_is_parallel}")
