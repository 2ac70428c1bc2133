"""Data parallelism: bucketed, averaged gradient all-reduce, blocking (`allreduce_gradients`)
or overlapped with backward (`OverlappedGradReducer`), and a DataParallel wrapper."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np

from autograd.inplace import record_writes
from autograd.nn import Module, Parameter
from autograd.tensor import Tensor
from dist.communicator import Communicator
from dist.grad_schedule import FinalGradientSchedule
from gpuplan import backend
from gpuplan.dtypes import as_dtype

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024
#: The overlapped reducer's first bucket (the last layers' gradients, final first): small, so
#: that the first reduction starts early in backward (PyTorch DDP caps its first at 1 MiB too).
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024


def _buckets(params: list[Parameter], bucket_bytes: int,
             first_bytes: int | None = None) -> list[list[Parameter]]:
    """Consecutive runs of parameters with one dtype and device, each <= bucket_bytes
    (the first <= first_bytes when given; a single larger parameter gets a bucket of its
    own)."""
    buckets: list[list[Parameter]] = []
    size = 0
    for p in params:
        current = buckets[-1] if buckets else None
        cap = first_bytes if first_bytes is not None and len(buckets) == 1 else bucket_bytes
        fits = current is not None and size + p.data.nbytes <= cap
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

    Parameters whose reduction an `OverlappedGradReducer` over `comm` has started (during
    the last backward) are finished by it (waited, written back); the others go the
    blocking way.
    """
    params = [p for p in parameters if p.requires_grad]
    if comm is None or comm.size == 1 or not params:
        return
    params = _finish_overlapped(params, comm)
    if not params:
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


class OverlappedGradReducer(FinalGradientSchedule):
    """The gradient all-reduce of `allreduce_gradients`, started during backward.

    The parameters are put in buckets of about `bucket_bytes` in reverse order (one dtype
    and device each; the first of about `first_bucket_bytes`), the order in which backward
    finishes their gradients. Each parameter gets a post-accumulate gradient hook
    (`Tensor.register_post_accumulate_grad_hook`); after `arm()`, the backward that follows
    starts a bucket's non-blocking all-reduce (`Communicator.iall_reduce`) as soon as the
    gradients of all its parameters are final and every earlier bucket has started, so all
    ranks post the same buckets in the same order. `finish()` (which `allreduce_gradients`
    over the same communicator calls) starts the buckets the backward left, waits for all of
    them and writes the results into ``.grad``. Arm it only before the backward of the last
    micro-batch of a step: a later change to a gradient that has been sent is lost.

    The result is `allreduce_gradients`'s, bit for bit at two ranks (each element is the
    same sum of the same values, f16/bf16 in float32, then the same division; with more
    ranks MPI may add the ranks' values in another order for another message size): a
    parameter with a gradient on some rank only counts as zero on the others, and one with
    none on any rank keeps ``.grad`` None (one small all-reduce of flags in `finish`).
    """

    def __init__(self, parameters: Iterable[Parameter], comm: Communicator,
                 average: bool = True, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES) -> None:
        seen: set[int] = set()
        self.params = [p for p in parameters if p.requires_grad
                       and not (id(p) in seen or seen.add(id(p)))]
        self.comm, self.average = comm, average
        self.buckets = _buckets(self.params[::-1], bucket_bytes,
                                min(first_bucket_bytes, bucket_bytes))
        self._schedule(self.params, [[id(p) for p in b] for b in self.buckets])
        self._had: list[list[bool]] = []  # per started bucket: which had a .grad here
        _REDUCERS.add(self)

    def started_buckets(self) -> int:
        """How many buckets have been started since `arm()` (or the last `finish`)."""
        return len(self._requests)

    def arm(self) -> None:
        """Start buckets from the hooks of the next backward (a second call before
        `finish` does nothing; so does a reducer without parameters, e.g. a model whose
        parameters are all replicated copies reduced apart)."""
        if self._arm("finish() (or allreduce_gradients)"):
            self._had = []

    def _start(self, i: int) -> Any:
        bucket = self.buckets[i]
        xp = backend.array_namespace(bucket[0].data)
        dtype = as_dtype(bucket[0].dtype)
        self._had.append([p.grad is not None for p in bucket])
        flat = xp.concatenate([
            (p.grad.data if p.grad is not None else xp.zeros(p.shape, dtype)).reshape(-1)
            .astype(dtype, copy=False) for p in bucket])
        return self.comm.iall_reduce(flat, "mean" if self.average else "sum", out=flat)

    def finish(self) -> None:
        """Start the buckets not started yet, wait for all and write ``.grad``."""
        requests = self._start_rest()
        had, self._had = self._had, []
        flags = np.array([h for bucket_had in had for h in bucket_had], np.int32)
        flags = self.comm.all_reduce(flags, "max")
        written = []
        k = 0
        for bucket, request in zip(self.buckets, requests, strict=True):
            flat = request.wait()
            offset = 0
            for p in bucket:
                n = int(np.prod(p.shape, dtype=np.int64))
                if flags[k]:
                    values = flat[offset:offset + n].reshape(p.shape)
                    if p.grad is None:
                        p.grad = Tensor(values.copy())
                    else:
                        p.grad.data[...] = values
                        written.append(p.grad)
                offset += n
                k += 1
        record_writes(written, "dist.allreduce_gradients")

    def remove(self) -> None:
        """Finish what is pending, then take the hooks off the parameters."""
        if self.pending:
            self.finish()
        self._remove_hooks()
        _REDUCERS.discard(self)


_REDUCERS: weakref.WeakSet[OverlappedGradReducer] = weakref.WeakSet()


def _finish_overlapped(params: list[Parameter], comm: Communicator) -> list[Parameter]:
    """Finish every pending reducer over `comm` that holds some of `params`; the params
    left for the blocking path."""
    ids = {id(p) for p in params}
    done: set[int] = set()
    for reducer in list(_REDUCERS):
        if reducer.comm is comm and reducer.pending and any(id(p) in ids
                                                            for p in reducer.params):
            reducer.finish()
            done.update(id(p) for p in reducer.params)
    return [p for p in params if id(p) not in done] if done else params


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
