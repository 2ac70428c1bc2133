"""Requests of the Communicator's non-blocking calls: sends (`PendingSend`), collectives
(`PendingCollective`, from `iall_reduce` and `ireduce_scatter`) and array receives posted
ahead of use (`PendingRecv`, from `irecv_array`). Each keeps its buffers alive until
``wait()``, which runs under the watchdog (dist.watchdog) as the blocking call would.

An array message (`isend_array`) is a fixed-size header, then the data, with one tag: the
header (shape, dtype, device as JSON in HEADER_BYTES bytes) can be received into a buffer
posted before anything is known of the array, and the data's receive is posted as soon as
the header is in (`PendingRecv.progress`), so a large transfer moves while the receiver
computes instead of when it asks for the array.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from dist import trace
from dist.mpi_wait import POLLING_MODES, poll_until
from dist.staging import copy_to_device, sync_current_stream
from dist.watchdog import unwatch_request, watch_request, watched
from gpuplan import backend
from gpuplan.dtypes import as_dtype
from gpuplan.errors import InvalidProblem, describe

#: Bytes of an array message's header (JSON of shape, dtype name and device, zero-padded).
HEADER_BYTES = 256


def _mpi() -> Any:
    from mpi4py import MPI

    return MPI


def encode_header(x: Any) -> np.ndarray:
    """The header of an array message for x: HEADER_BYTES bytes."""
    text = json.dumps([list(map(int, x.shape)), as_dtype(x.dtype).name,
                       backend.device_of(x)]).encode()
    if len(text) > HEADER_BYTES:
        raise InvalidProblem(describe("isend_array", "x", f"a shape whose header fits in "
                                      f"{HEADER_BYTES} bytes", tuple(x.shape)))
    header = np.zeros(HEADER_BYTES, np.uint8)
    header[:len(text)] = np.frombuffer(text, np.uint8)
    return header


def decode_header(header: np.ndarray) -> tuple[tuple[int, ...], str, str]:
    shape, dtype, device = json.loads(header.tobytes().rstrip(b"\0"))
    return tuple(shape), dtype, device


def _wait_all(comm: Any, op: str, peer: int | None, requests: list[Any]) -> None:
    """MPI_Waitall (or, in the yield/sleep wait modes, tests) under the watchdog."""
    Request = _mpi().Request
    mode = getattr(comm, "wait_mode", "spin")
    if mode in POLLING_MODES:
        watched(op, comm, peer, poll_until, lambda: Request.Testall(requests), mode)
    else:
        watched(op, comm, peer, Request.Waitall, requests)


class PendingSend:
    """A non-blocking send in flight; keeps its buffers alive until `wait()` (which the
    watchdog bounds like any blocking call; comm and dest name it in its message)."""

    def __init__(self, requests: list[Any], buffers: list[Any], comm: Any = None,
                 dest: int | None = None) -> None:
        self._requests = requests
        self._buffers = buffers
        self._comm, self._dest = comm, dest

    def wait(self) -> None:
        if self._requests:
            with trace.span("send_wait", "comm", peer=self._dest):
                self._wait_now()
        self._requests, self._buffers = [], []

    def _wait_now(self) -> None:
        if self._requests:
            _wait_all(self._comm, "isend", self._dest, self._requests)


class PendingCollective:
    """A non-blocking collective in flight (`Communicator.iall_reduce`, `ireduce_scatter`).
    ``wait()`` waits for its MPI request under the watchdog (as the op, with how long ago it
    was issued), copies a host-staged result back to the device, applies what follows the exchange
    (the mean's division, the cast into out) and returns the result; a second ``wait()``
    returns it again. ``test()``: whether ``wait()`` would return at once. While one is
    outstanding the watchdog lists it (dist.watchdog.outstanding_requests)."""

    def __init__(self, comm: Any, op: str, peer: int | None, finish: Callable[[], Any],
                 requests: list[Any] | None = None, buffers: list[Any] | None = None,
                 finish_device: Callable[[], None] | None = None,
                 trace_start: float | None = None, nbytes: int = 0) -> None:
        self._comm, self.op, self._peer = comm, op, peer
        self._finish, self._requests, self._buffers = finish, requests or [], buffers or []
        self._finish_device = finish_device
        self._trace_start, self._nbytes = trace_start, nbytes
        self._result: Any = None
        self._done = False
        self._token = watch_request(op, comm, peer) if self._requests else None

    @property
    def done(self) -> bool:
        return self._done

    def test(self) -> bool:
        """True when the exchange has completed (MPI_Testall; no wait)."""
        return self._done or not self._requests or bool(_mpi().Request.Testall(
            self._requests))

    def wait(self) -> Any:
        if self._done:
            return self._result
        if self._requests:
            try:
                _wait_all(self._comm, f"{self.op} request", self._peer, self._requests)
            finally:
                unwatch_request(self._token)
        if self._finish_device is not None:
            self._finish_device()
        self._result = self._finish()
        self._done = True
        self._requests, self._buffers, self._finish_device = [], [], None
        if self._trace_start is not None:
            trace.record(self.op, self._trace_start, "comm", tid=trace.REQUEST_TID,
                         bytes=self._nbytes, nonblocking=True)
        return self._result


class PendingRecv:
    """An array message's receive, posted now (`Communicator.irecv_array`): the header's
    receive at once, the data's as soon as the header is in (`progress`, or `wait`).
    ``wait()`` returns the array (on `device`, default the sender's); device arrays without
    CUDA-aware MPI land in host memory and are copied over at ``wait()``. The wait runs
    under the watchdog as ``recv_array`` from `source`; a trace span ``recv`` (bytes, peer)
    covers it."""

    def __init__(self, comm: Any, source: int, tag: int, device: str | None = None) -> None:
        self._comm, self.source, self.tag, self._device = comm, source, tag, device
        self._header = np.empty(HEADER_BYTES, np.uint8)
        self._header_request = comm.mpi_comm.Irecv(self._header, source=source, tag=tag)
        self._data_request: Any = None
        self._out: Any = None
        self._host: np.ndarray | None = None
        self._done = False
        self._token = watch_request("recv_array", comm, source)

    def progress(self) -> bool:
        """Post the data's receive if the header has arrived (no wait); True once the whole
        message is in."""
        if self._done:
            return True
        if self._out is None:
            if not self._header_request.Test():
                return False
            self._post_data()
        return self._data_request is None or bool(self._data_request.Test())

    def _post_data(self) -> None:
        shape, dtype, sender_device = decode_header(self._header)
        out = backend.empty(shape, as_dtype(dtype), self._device or sender_device)
        self._out = out
        if out.size == 0:  # isend sends no data message for an empty array
            return
        if backend.is_device_array(out) and not self._comm._mpi_sees_device:
            self._host = np.empty(out.nbytes, np.uint8)
            buf = self._host
        else:
            buf = out.reshape(-1).view(backend.array_namespace(out).uint8)
            if backend.is_device_array(out):
                # CUDA-aware MPI writes outside the stream's order: the pool may hand out
                # memory that queued kernels still read.
                sync_current_stream()
        self._data_request = self._comm.mpi_comm.Irecv(buf, source=self.source, tag=self.tag)

    def _wait_now(self) -> None:
        if self._out is None:
            _wait_all(self._comm, "recv_array", self.source, [self._header_request])
            self._post_data()
        if self._data_request is not None:
            _wait_all(self._comm, "recv_array", self.source, [self._data_request])

    def wait(self) -> Any:
        if self._done:
            return self._out
        t0 = trace.now() if trace.enabled() else None
        try:
            self._wait_now()
        finally:
            unwatch_request(self._token)
        if self._host is not None:
            copy_to_device(self._host, self._out)
        self._done, self._host = True, None
        if t0 is not None:
            trace.record("recv", t0, "comm", bytes=int(self._out.nbytes), peer=self.source)
        return self._out
