"""Data parallelism: bucketed, averaged gradient all-reduce and a DataParallel wrapper."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from autograd.inplace import record_writes
from autograd.nn import Module, Parameter
from autograd.tensor import Tensor
from dist.communicator import Communicator
from gpuplan import backend
from gpuplan.dtypes import as_dtype

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


def _buckets(params: list[Parameter], bucket_bytes: int) -> list[list[Parameter]]:
    """Consecutive runs of parameters with one dtype and device, each <= bucket_bytes
    (a single larger parameter gets a bucket of its own)."""
    buckets: list[list[Parameter]] = []
    size = 0
    for p in params:
        current = buckets[-1] if buckets else None
        fits = current is not None and size + p.data.nbytes <= bucket_bytes
        same = current is not None and (current[0].dtype, current[0].device) == (p.dtype,
                                                                                 p.device)
        if fits and same:
            current.append(p)
            size += p.data.nbytes
        else:
            buckets.append([p])
            size = p.data.nbytes
    return buckets


def allreduce_gradients(parameters: Iterable[Parameter], comm: Communicator | None,
                        average: bool = True,
                        bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """grad_p <- mean (or sum) over ranks of grad_p, for every parameter, in place.

    Gradients are flattened into buckets of about `bucket_bytes` (one dtype and device
    each) so that many small tensors cost few messages. A parameter whose .grad is None
    on every rank is left alone; one with a .grad on some rank only counts as zero on the
    others (and gets a .grad). Every rank must pass the same parameters in the same order.
    f16/bf16 gradients are reduced in float32.
    """
    params = [p for p in parameters if p.requires_grad]
    if comm is None or comm.size == 1 or not params:
        return
    has_grad = np.array([p.grad is not None for p in params], np.int32)
    has_grad = comm.all_reduce(has_grad, "max")
    params = [p for p, flag in zip(params, has_grad, strict=True) if flag]
    # Gradients overwritten in place: a backward that saved one of them must fail, as for
    # any in-place write (autograd.inplace); new .grad tensors are fresh arrays.
    written = [p.grad for p in params if p.grad is not None]
    for bucket in _buckets(params, bucket_bytes):
        xp = backend.array_namespace(bucket[0].data)
        dtype = as_dtype(bucket[0].dtype)
        flat = xp.concatenate([
            (p.grad.data if p.grad is not None else xp.zeros(p.shape, dtype)).reshape(-1)
            .astype(dtype, copy=False) for p in bucket])
        comm.all_reduce(flat, "mean" if average else "sum", out=flat)
        offset = 0
        for p in bucket:
            n = int(np.prod(p.shape, dtype=np.int64))
            values = flat[offset:offset + n].reshape(p.shape)
            if p.grad is None:
                p.grad = Tensor(values.copy())
            else:
                p.grad.data[...] = values
            offset += n
    record_writes(written, "dist.allreduce_gradients")


def average_over(comm: Communicator | None, value: float) -> float:
    """The mean of a float over the ranks of `comm` (the value itself for None)."""
    if comm is None:
        return value
    return float(comm.all_reduce(np.array([value], np.float64), "mean")[0])


def broadcast_parameters(parameters: Iterable[Parameter], comm: Communicator | None,
                         root: int = 0) -> None:
    """Overwrite every parameter with root's values (in place) so replicas start equal.

    The write is recorded on every rank, root included (autograd.inplace), so that a
    backward through an op that saved a parameter before the broadcast fails alike
    everywhere instead of computing a gradient of replaced weights."""
    if comm is None or comm.size == 1:
        return
    params = list(parameters)
    for p in params:
        comm.broadcast(p.data, root=root)
    record_writes(params, "dist.broadcast_parameters")


class DataParallel(Module):
    """Replicates `module` over the ranks of `comm` (e.g. mesh.dp).

    On construction the parameters are broadcast from rank 0. Each rank runs forward and
    backward on its own shard of the batch; then `allreduce_gradients()` averages the
    gradients, after which every replica holds the gradient of the mean loss over the
    global batch (for equal shards and a mean loss) and an optimizer step keeps them equal.
    """

    def __init__(self, module: Module, comm: Communicator | None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, broadcast: bool = True) -> None:
        super().__init__()
        self.module = module
        self.comm = comm
        self.bucket_bytes = bucket_bytes
        if broadcast:
            broadcast_parameters(module.parameters(), comm)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def allreduce_gradients(self, average: bool = True) -> None:
        allreduce_gradients(self.module.parameters(), self.comm, average=average,
                            bucket_bytes=self.bucket_bytes)
