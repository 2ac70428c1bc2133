"""Communicator: MPI-named collectives and point-to-point messages on host or device arrays."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from dist import trace
from dist.cuda_aware import cuda_aware_mpi
from dist.mpi_wait import POLLING_MODES, poll_until, resolve_wait
from dist.nccl_backend import NcclTransport
from dist.requests import PendingCollective, PendingRecv, PendingSend, encode_header
from dist.staging import (
    PinnedBufferCache,
    copy_to_device,
    stage_to_device,
    stage_to_host,
    stage_to_new_host,
    sync_current_stream,
)
from dist.watchdog import watched
from gpuplan import backend
from gpuplan.dtypes import HALF_DTYPES, as_dtype, float32
from gpuplan.errors import InvalidProblem, Unsupported, describe

BACKENDS = ("mpi-cuda-aware", "mpi-host-staged", "mpi-host", "nccl")
REDUCE_OPS = ("sum", "max", "mean")
ENV_BACKEND = "GPUPLAN_DIST_BACKEND"


def _mpi() -> Any:
    from mpi4py import MPI

    return MPI


def resolve_backend(requested: str | None = None) -> str:
    """The backend a Communicator uses: the request, else $GPUPLAN_DIST_BACKEND, else auto.

    auto: "mpi-host" without a CUDA device, "mpi-cuda-aware" when the MPI library is
    CUDA-aware (see dist.cuda_aware), "mpi-host-staged" otherwise. NCCL is never automatic.
    """
    choice = requested if requested is not None else os.environ.get(ENV_BACKEND) or "auto"
    if choice == "auto":
        if not backend.device_available():
            return "mpi-host"
        if not backend.cuda_available():  # the emulated device: arrays are staged like a GPU's
            return "mpi-host-staged"
        return "mpi-cuda-aware" if cuda_aware_mpi()[0] else "mpi-host-staged"
    if choice not in BACKENDS:
        raise Unsupported(describe("Communicator", "backend", f"'auto' or one of {BACKENDS}",
                                   repr(choice)))
    return choice


class _ReducePlan:
    """An all-reduce's flat buffers and how its result reaches `out` (finish)."""

    __slots__ = ("out", "send", "recv", "op", "size", "direct", "done")

    def __init__(self, out: Any, send: Any, recv: Any, op: str, size: int, direct: bool,
                 done: bool = False) -> None:
        self.out, self.send, self.recv, self.op = out, send, recv, op
        self.size, self.direct, self.done = size, direct, done

    def finish(self) -> Any:
        """After the exchange: the mean's division, the copy (and cast) into out."""
        if self.done:
            return self.out
        recv = self.recv
        if self.op == "mean":
            recv /= self.size
        return self.out if self.direct else _assign(self.out, recv.reshape(self.out.shape))


class Communicator:
    """A group of processes over an mpi4py communicator; methods follow MPI's names.

    Every method takes NumPy or CuPy arrays. Host arrays go to MPI directly. Device arrays
    go to MPI directly when the library is CUDA-aware ("mpi-cuda-aware"), otherwise
    through cached pinned host buffers ("mpi-host-staged"); with "nccl" the collectives run
    on NCCL (stream-ordered) and point-to-point messages still use MPI. The current CUDA
    stream is synchronized before MPI touches device memory. f16/bf16 reduce in float32.
    Every blocking MPI call runs under the watchdog (dist.watchdog): one that waits longer
    than the timeout aborts the job with a line naming the op, the peer and `label`.
    """

    def __init__(self, mpi_comm: Any = None, backend: str | None = None) -> None:
        self.mpi_comm = _mpi().COMM_WORLD if mpi_comm is None else mpi_comm
        self._requested = backend
        self._backend = resolve_backend(backend)
        #: "spin", "yield" or "sleep": how its blocking calls wait (dist.mpi_wait).
        self.wait_mode = resolve_wait()
        #: World rank of each rank of this communicator, and how messages name it.
        self.world_ranks = _world_ranks(self.mpi_comm)
        self.label = _label(self.world_ranks)
        self._nccl = (watched("nccl init", self, None, NcclTransport, self.mpi_comm)
                      if self._backend == "nccl" else None)
        # How device buffers reach MPI (all of MPI with the MPI backends, p2p with NCCL).
        self._mpi_sees_device = self._backend == "mpi-cuda-aware" or (
            self._backend == "nccl" and cuda_aware_mpi()[0])
        self._pinned = PinnedBufferCache()

    @property
    def rank(self) -> int:
        return self.mpi_comm.Get_rank()

    @property
    def size(self) -> int:
        return self.mpi_comm.Get_size()

    @property
    def backend(self) -> str:
        return self._backend

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, backend={self.backend!r})"

    def split(self, color: int, key: int | None = None) -> Communicator:
        """Sub-communicator of the ranks passing the same `color`, ordered by `key`."""
        sub = watched("split", self, None, self.mpi_comm.Split, color,
                      self.rank if key is None else key)
        return Communicator(sub, backend=self._requested)

    def barrier(self) -> None:
        watched("barrier", self, None, self._wait, self.mpi_comm.Barrier,
                self.mpi_comm.Ibarrier)

    # ---- collectives -------------------------------------------------------------------

    def all_reduce(self, x: Any, op: str = "sum", *, out: Any = None) -> Any:
        """out = op over ranks of x (elementwise); op "sum", "max" or "mean"."""
        plan = self._all_reduce_plan("all_reduce", x, op, out)
        if plan.done:
            return plan.out
        mpi_op = self._mpi_op(op)
        self._exchange("all_reduce", None, plan.send, plan.recv,
                       lambda s, r: self._wait(self.mpi_comm.Allreduce,
                                               self.mpi_comm.Iallreduce, s, r, op=mpi_op),
                       lambda s, r: self._nccl.all_reduce(s, r, _nccl_op(op)))
        return plan.finish()

    def iall_reduce(self, x: Any, op: str = "sum", *, out: Any = None) -> PendingCollective:
        """Start `all_reduce` (MPI_Iallreduce) and return at once; the request's ``wait()``
        finishes it and returns out (`out` is not to be read, nor x written, before).

        Host buffers go to MPI as they are; device buffers are copied to host memory now
        (without CUDA-aware MPI, as the blocking call stages them) and back at ``wait()``;
        with NCCL the collective is enqueued on the current stream (ordered after the work
        that made x, and before what follows ``wait()``: the host does not wait for it).
        The same elements are summed as by `all_reduce`, f16/bf16 in float32 and "mean"
        divided the same way. ``wait()`` runs under the watchdog; a trace span
        ``all_reduce`` (its bytes, ``nonblocking``) covers issue to completion."""
        plan = self._all_reduce_plan("iall_reduce", x, op, out)
        if plan.done:
            return PendingCollective(self, "all_reduce", None, plan.finish)
        return self._start("all_reduce", plan, self.mpi_comm.Iallreduce,
                           lambda s, r: self._nccl.all_reduce(s, r, _nccl_op(op)),
                           op=self._mpi_op(op))

    def _all_reduce_plan(self, name: str, x: Any, op: str, out: Any) -> _ReducePlan:
        """The flat send/recv buffers of an all-reduce of x into out (shared by the blocking
        and the non-blocking call, so both reduce the same elements the same way)."""
        work = self._reduce_dtype(name, x, op)
        out = self._check_out(name, x, out, x.shape)
        if self.size == 1 or x.size == 0:
            return _ReducePlan(_assign(out, x), None, None, op, 1, True, done=True)
        xp = backend.array_namespace(x)
        in_place = out is x and x.dtype == work and x.flags.c_contiguous
        if in_place:
            send = recv = x.reshape(-1)
        else:
            send = xp.ascontiguousarray(x, dtype=work).reshape(-1)
        direct = in_place or (out.dtype == work and out.flags.c_contiguous)
        if not in_place:
            recv = out.reshape(-1) if direct else xp.empty(x.size, dtype=work)
        return _ReducePlan(out, send, recv, op, self.size, direct)

    def _start(self, name: str, plan: _ReducePlan, mpi_start: Callable[..., Any],
               nccl_fn: Callable[[Any, Any], Any], **kwargs: Any) -> PendingCollective:
        """Post a non-blocking collective on plan's flat buffers (see iall_reduce)."""
        send, recv = plan.send, plan.recv
        in_place = send is recv
        t0 = trace.now() if trace.enabled() else None
        nbytes = int(recv.nbytes)
        finish_device = None
        if backend.is_device_array(recv) and self._nccl is not None:
            nccl_fn(send, recv)  # stream-ordered: wait() has nothing left to wait for
            requests, keep = [], []
        else:
            if backend.is_device_array(recv) and self._mpi_sees_device:
                sync_current_stream()  # MPI reads device memory the stream must have made
                host_send, host_recv = send, recv
            elif backend.is_device_array(recv):
                # Host-staged: fresh host copies (the pinned cache serves blocking calls
                # only: a buffer of an outstanding request must not be handed out again).
                host_send = stage_to_new_host(send)
                host_recv = host_send if in_place else np.empty(recv.shape, recv.dtype)
                device_recv = recv

                def finish_device() -> None:
                    copy_to_device(host_recv, device_recv)
            else:
                host_send, host_recv = send, recv
            mpi_send = _mpi().IN_PLACE if in_place else host_send
            requests = [mpi_start(mpi_send, host_recv, **kwargs)]
            keep = [host_send, host_recv]
        return PendingCollective(self, name, None, plan.finish, requests, keep, finish_device,
                                 t0, nbytes)

    def all_gather(self, x: Any, *, axis: int = 0, out: Any = None) -> Any:
        """Concatenation along `axis` of every rank's x (same shape on every rank)."""
        xp = backend.array_namespace(x)
        shape = tuple(x.shape) if x.ndim else (1,)
        axis = _normalize_axis("all_gather", axis, len(shape))
        result_shape = shape[:axis] + (shape[axis] * self.size,) + shape[axis + 1:]
        out = self._check_out("all_gather", x, out, result_shape)
        if self.size == 1 or x.size == 0:
            return _assign(out, x.reshape(result_shape))
        gathered = xp.empty((self.size,) + shape, dtype=x.dtype)
        send = _bytes(xp.ascontiguousarray(x))
        self._exchange("all_gather", None, send, _bytes(gathered),
                       lambda s, r: self._wait(self.mpi_comm.Allgather,
                                               self.mpi_comm.Iallgather, s, r),
                       lambda s, r: self._nccl.all_gather(s, r))
        result = xp.moveaxis(gathered, 0, axis).reshape(result_shape)
        return _assign(out, result)

    def reduce_scatter(self, x: Any, op: str = "sum", *, axis: int = 0, out: Any = None) -> Any:
        """Chunk `rank` (of `size` equal chunks along `axis`) of op over ranks of x."""
        plan = self._reduce_scatter_plan("reduce_scatter", x, op, axis, out)
        if plan.done:
            return plan.out
        mpi_op = self._mpi_op(op)
        self._exchange("reduce_scatter", None, plan.send, plan.recv,
                       lambda s, r: self._wait(self.mpi_comm.Reduce_scatter_block,
                                               self.mpi_comm.Ireduce_scatter_block, s, r,
                                               op=mpi_op),
                       lambda s, r: self._nccl.reduce_scatter(s, r, _nccl_op(op)))
        return plan.finish()

    def ireduce_scatter(self, x: Any, op: str = "sum", *, axis: int = 0,
                        out: Any = None) -> PendingCollective:
        """Start `reduce_scatter` (MPI_Ireduce_scatter_block) and return at once; the
        request's ``wait()`` finishes it and returns out (not to be read, nor x written,
        before). Buffers travel as with `iall_reduce` (host as they are, device host-staged
        through fresh host copies without CUDA-aware MPI, NCCL enqueued on the current
        stream); the same elements are summed as by `reduce_scatter`, f16/bf16 in float32,
        "mean" divided the same way. ``wait()`` runs under the watchdog; a trace span
        ``reduce_scatter`` (bytes, ``nonblocking``) covers issue to completion."""
        plan = self._reduce_scatter_plan("ireduce_scatter", x, op, axis, out)
        if plan.done:
            return PendingCollective(self, "reduce_scatter", None, plan.finish)
        return self._start("reduce_scatter", plan, self.mpi_comm.Ireduce_scatter_block,
                           lambda s, r: self._nccl.reduce_scatter(s, r, _nccl_op(op)),
                           op=self._mpi_op(op))

    def _reduce_scatter_plan(self, name: str, x: Any, op: str, axis: int,
                             out: Any) -> _ReducePlan:
        """The flat send (the chunks laid rank after rank, in the work dtype) and recv
        buffers of a reduce-scatter of x into out (shared by the blocking and the
        non-blocking call)."""
        work = self._reduce_dtype(name, x, op)
        if x.ndim == 0:
            raise InvalidProblem(describe(name, "x", "an array with ndim >= 1", "a 0-d array"))
        axis = _normalize_axis(name, axis, x.ndim)
        n = x.shape[axis]
        if n % self.size:
            raise InvalidProblem(describe(name, "x", f"shape[{axis}] divisible by the "
                                          f"communicator size {self.size}", x.shape))
        chunk_shape = x.shape[:axis] + (n // self.size,) + x.shape[axis + 1:]
        out = self._check_out(name, x, out, chunk_shape)
        if self.size == 1 or x.size == 0:
            return _ReducePlan(_assign(out, x), None, None, op, 1, True, done=True)
        xp = backend.array_namespace(x)
        split = x.reshape(x.shape[:axis] + (self.size, n // self.size) + x.shape[axis + 1:])
        send = xp.ascontiguousarray(xp.moveaxis(split, axis, 0), dtype=work).reshape(-1)
        recv = xp.empty(send.size // self.size, dtype=work)
        return _ReducePlan(out, send, recv, op, self.size, False)

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """Overwrite x on every rank with root's x (in place); returns x."""
        self._check_rank("broadcast", "root", root)
        if self.size == 1 or x.size == 0:
            return x
        buf = x if x.flags.c_contiguous else backend.array_namespace(x).ascontiguousarray(x)
        raw = _bytes(buf)
        self._exchange("broadcast", root, raw, raw, lambda s, r: self._wait(
                       self.mpi_comm.Bcast, self.mpi_comm.Ibcast, r, root=root),
                       lambda s, r: self._nccl.broadcast(r, root))
        return x if buf is x else _assign(x, buf)

    # ---- point to point (always MPI: blocking NCCL p2p would serialize pipelines) ------

    def send(self, x: Any, dest: int, tag: int = 0) -> None:
        """Blocking send of x's elements to `dest` (matched by recv with the same tag)."""
        self._check_rank("send", "dest", dest)
        if x.size:
            buf = _bytes(backend.array_namespace(x).ascontiguousarray(x))
            self._exchange("send", dest, buf, None,
                           lambda s, r: self._wait(self.mpi_comm.Send, self.mpi_comm.Isend, s,
                                                   dest=dest, tag=tag))

    def recv(self, out: Any, source: int, tag: int = 0) -> Any:
        """Blocking receive into `out` (shape and dtype agreed with the sender); returns out."""
        self._check_rank("recv", "source", source)
        if out.size == 0:
            return out
        xp = backend.array_namespace(out)
        buf = out if out.flags.c_contiguous else xp.empty(out.shape, dtype=out.dtype)
        self._exchange("recv", source, None, _bytes(buf),
                       lambda s, r: self._wait(self.mpi_comm.Recv, self.mpi_comm.Irecv, r,
                                               source=source, tag=tag))
        return out if buf is out else _assign(out, buf)

    def isend(self, x: Any, dest: int, tag: int = 0) -> PendingSend:
        """Non-blocking send; the data is copied or pinned now, so x may change at once."""
        self._check_rank("isend", "dest", dest)
        if x.size == 0:
            return PendingSend([], [], self, dest)
        with trace.span("send", "comm", bytes=int(x.nbytes), peer=dest):
            return self._isend_now(x, dest, tag)

    def _isend_now(self, x: Any, dest: int, tag: int) -> PendingSend:
        if backend.is_device_array(x) and not self._mpi_sees_device:
            buf = backend.to_host(x).reshape(-1).view(np.uint8)  # synchronous copy
        else:
            buf = _bytes(backend.array_namespace(x).array(x, order="C", copy=True))
            if backend.is_device_array(x):
                sync_current_stream()  # the copy must be finished before MPI reads it
        return PendingSend([self.mpi_comm.Isend(buf, dest=dest, tag=tag)], [buf], self, dest)

    def isend_array(self, x: Any, dest: int, tag: int = 0) -> PendingSend:
        """isend of a fixed-size header (shape, dtype, device) then the data, for
        recv_array / irecv_array (dist.requests)."""
        self._check_rank("isend_array", "dest", dest)
        header = encode_header(x)
        first = self.mpi_comm.Isend(header, dest=dest, tag=tag)
        data = self.isend(x, dest, tag)
        return PendingSend([first] + data._requests, [header] + data._buffers, self, dest)

    def send_array(self, x: Any, dest: int, tag: int = 0) -> None:
        self.isend_array(x, dest, tag).wait()

    def recv_array(self, source: int, tag: int = 0, device: str | None = None) -> Any:
        """Receive what send_array/isend_array sent, on `device` (default: the sender's)."""
        self._check_rank("recv_array", "source", source)
        return PendingRecv(self, source, tag, device).wait()

    def irecv_array(self, source: int, tag: int = 0, device: str | None = None) -> PendingRecv:
        """Post the receive of what send_array/isend_array sends, before it is needed; the
        request's ``wait()`` returns the array (`recv_array` = ``irecv_array().wait()``).
        Its data's receive is posted once the header is in: call ``progress()`` now and
        then (the pipeline runner does between actions)."""
        self._check_rank("irecv_array", "source", source)
        return PendingRecv(self, source, tag, device)

    # ---- small Python objects ----------------------------------------------------------

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        self._arrive("bcast_object", root)
        return watched("bcast_object", self, root, self.mpi_comm.bcast, obj, root)

    def all_gather_object(self, obj: Any) -> list[Any]:
        self._arrive("all_gather_object", None)
        return watched("all_gather_object", self, None, self.mpi_comm.allgather, obj)

    def gather_object(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on `root`; None on the other ranks."""
        self._arrive("gather_object", root)
        return watched("gather_object", self, root, self.mpi_comm.gather, obj, root)

    # ---- helpers -----------------------------------------------------------------------

    def _wait(self, blocking: Callable[..., Any], nonblocking: Callable[..., Any], *args: Any,
              **kwargs: Any) -> Any:
        """blocking(...), or (yield/sleep wait modes) nonblocking(...) tested until done."""
        if self.wait_mode not in POLLING_MODES or self.size == 1:
            return blocking(*args, **kwargs)
        poll_until(nonblocking(*args, **kwargs).Test, self.wait_mode)

    def _arrive(self, op: str, peer: int | None) -> None:
        # mpi4py has no non-blocking pickled collectives: when polling, the ranks first meet
        # in a polled Ibarrier, so the blocking call that follows barely waits.
        if self.wait_mode in POLLING_MODES and self.size > 1:
            watched(op, self, peer, poll_until, self.mpi_comm.Ibarrier().Test, self.wait_mode)

    def _exchange(self, op: str, peer: int | None, send: Any, recv: Any,
                  mpi_fn: Callable[[Any, Any], Any],
                  nccl_fn: Callable[[Any, Any], Any] | None = None) -> None:
        """Run one MPI (or NCCL) call on flat contiguous buffers; send or recv may be None.

        `send is recv` means in place (MPI.IN_PLACE for the collectives that take it). The
        MPI call runs under the watchdog as `op` with `peer` (NCCL calls only enqueue work).
        """
        if not trace.enabled():  # the common case: no span, no byte count
            self._exchange_now(op, peer, send, recv, mpi_fn, nccl_fn)
            return
        probe = recv if recv is not None else send
        with trace.span(op, "comm", bytes=int(probe.nbytes), peer=peer):
            self._exchange_now(op, peer, send, recv, mpi_fn, nccl_fn)

    def _exchange_now(self, op: str, peer: int | None, send: Any, recv: Any,
                      mpi_fn: Callable[[Any, Any], Any],
                      nccl_fn: Callable[[Any, Any], Any] | None) -> None:
        in_place = send is recv
        probe = recv if recv is not None else send
        if not backend.is_device_array(probe):
            watched(op, self, peer, mpi_fn, _mpi().IN_PLACE if in_place else send, recv)
            return
        if self._nccl is not None and nccl_fn is not None:
            nccl_fn(send, recv)
            return
        if self._mpi_sees_device:
            sync_current_stream()
            watched(op, self, peer, mpi_fn, _mpi().IN_PLACE if in_place else send, recv)
            return
        host_send = None if send is None else stage_to_host(send, self._pinned, "send")
        host_send = None if host_send is None else host_send.view(send.dtype)
        host_recv = None
        if recv is not None:
            host_recv = (host_send if in_place
                         else self._pinned.get(recv.nbytes, "recv").view(recv.dtype))
        watched(op, self, peer, mpi_fn, _mpi().IN_PLACE if in_place else host_send, host_recv)
        if recv is not None:
            stage_to_device(host_recv.view(np.uint8), recv)

    def _reduce_dtype(self, op_name: str, x: Any, op: str) -> np.dtype:
        if op not in REDUCE_OPS:
            raise Unsupported(describe(op_name, "op", f"one of {REDUCE_OPS}", repr(op)))
        dtype = as_dtype(x.dtype)
        if dtype in HALF_DTYPES:
            return float32
        if dtype.kind not in "fiu" or (op == "mean" and dtype.kind != "f"):
            kinds = "a float dtype" if op == "mean" else "a float or integer dtype"
            raise Unsupported(describe(op_name, "x", kinds, dtype.name))
        return dtype

    def _mpi_op(self, op: str) -> Any:
        MPI = _mpi()
        return MPI.MAX if op == "max" else MPI.SUM

    def _check_out(self, op_name: str, x: Any, out: Any, shape: tuple[int, ...]) -> Any:
        if out is None:
            return backend.array_namespace(x).empty(shape, dtype=x.dtype)
        if backend.device_of(out) != backend.device_of(x):
            raise InvalidProblem(describe(op_name, "out", f"on {backend.device_of(x)}",
                                          backend.device_of(out)))
        if tuple(out.shape) != tuple(shape) or out.dtype != x.dtype:
            raise InvalidProblem(describe(op_name, "out", f"shape {tuple(shape)} dtype "
                                          f"{x.dtype}", f"shape {out.shape} dtype {out.dtype}"))
        return out

    def _check_rank(self, op_name: str, arg: str, r: int) -> None:
        if not 0 <= int(r) < self.size:
            raise InvalidProblem(describe(op_name, arg, f"a rank in [0, {self.size})", r))


def _world_ranks(mpi_comm: Any) -> tuple[int, ...]:
    """The world rank of each rank of an mpi4py communicator, in its rank order."""
    MPI = _mpi()
    if mpi_comm == MPI.COMM_WORLD:
        return tuple(range(mpi_comm.Get_size()))
    group, world = mpi_comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        return tuple(group.Translate_ranks(None, world))
    finally:
        group.Free()
        world.Free()


def _label(world_ranks: tuple[int, ...]) -> str:
    """"world (4 ranks)" or "communicator of world ranks [0, 2]" (long lists shortened)."""
    n = len(world_ranks)
    if world_ranks == tuple(range(_mpi().COMM_WORLD.Get_size())):
        return f"world ({n} rank{'s' if n != 1 else ''})"
    shown = list(world_ranks) if n <= 8 else [*world_ranks[:4], "...", *world_ranks[-2:]]
    return f"communicator of world ranks [{', '.join(map(str, shown))}]"


def _nccl_op(op: str) -> str:
    return "max" if op == "max" else "sum"


def _bytes(a: Any) -> Any:
    """Flat uint8 view of a C-contiguous host or device array (0-d arrays included)."""
    return a.reshape(-1).view(backend.array_namespace(a).uint8)


def _assign(out: Any, value: Any) -> Any:
    if out is not value:
        out[...] = value.astype(out.dtype, copy=False)
    return out


def _normalize_axis(op_name: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise InvalidProblem(describe(op_name, "axis", f"in [{-ndim}, {ndim})", axis))
    return axis % ndim
