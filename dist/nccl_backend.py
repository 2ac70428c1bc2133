"""Opt-in NCCL transport for device arrays (cupy.cuda.nccl; the unique id travels over MPI).

Every collective is put under the watchdog (dist.watchdog.watch_device_work): a CUDA event
recorded after it on the stream tells when it finished; one that does not finish within the
timeout gets the watchdog's one line, ncclCommAbort, and the job's abort.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

import numpy as np

from dist.watchdog import watch_device_work
from gpuplan import backend
from gpuplan.dtypes import bfloat16, float16, float32, float64

#: The NCCL wheel that goes with each CuPy wheel (same CUDA major version).
NCCL_WHEELS = {"cupy-cuda12x": "nvidia-nccl-cu12", "cupy-cuda13x": "nvidia-nccl-cu13"}


def cupy_distributions() -> list[str]:
    """Names of the installed distributions that provide the `cupy` package, normalized
    (e.g. ["cupy-cuda13x"]); empty without CuPy."""
    try:
        names = importlib.metadata.packages_distributions().get("cupy", [])
    except Exception:  # noqa: BLE001 - broken metadata must not hide the real error
        return []
    return sorted({n.lower().replace("_", "-") for n in names})


def nccl_install_hint(cupy_dists: list[str] | None = None) -> str:
    """What to install for NCCL here: the NCCL wheel matching the installed CuPy wheel."""
    dists = cupy_distributions() if cupy_dists is None else cupy_dists
    wheels = [NCCL_WHEELS[d] for d in dists if d in NCCL_WHEELS]
    if len(wheels) == 1:
        return f"pip install {wheels[0]} (it matches the installed {dists[0]})"
    generic = ("nvidia-nccl-cu12 with cupy-cuda12x, nvidia-nccl-cu13 with cupy-cuda13x, "
               "or a system NCCL library")
    if not dists:
        return (f"install CuPy for this machine's CUDA (the cuda12 or cuda13 extra), then its "
                f"NCCL: {generic}")
    return f"install the NCCL library matching the installed {', '.join(dists)}: {generic}"


def nccl_module() -> Any | None:
    """cupy.cuda.nccl when CuPy, a device and the NCCL library (nvidia-nccl-cu12 or -cu13,
    matching the CuPy wheel) are present."""
    if not backend.cuda_available():
        return None
    try:
        from cupy.cuda import nccl
    except Exception:  # noqa: BLE001 - any import failure means "no NCCL here"
        return None
    return nccl if getattr(nccl, "available", False) else None


def nccl_available() -> bool:
    return nccl_module() is not None


def _missing() -> str:
    """What of CuPy / device / NCCL is missing here, in words."""
    if backend.cupy_module() is None:
        return "no importable CuPy"
    if not backend.cuda_available():
        return "no usable CUDA device"
    return "CuPy without a loadable NCCL library"


class NcclTransport:
    """Stream-ordered NCCL collectives over C-contiguous CuPy arrays of one communicator."""

    #: Elements per ncclBroadcast call (the largest C int).
    BCAST_CHUNK = 2**31 - 1

    def __init__(self, mpi_comm: Any) -> None:
        nccl = nccl_module()
        if nccl is None:
            raise RuntimeError(
                "backend='nccl': expected CuPy with a CUDA device and the NCCL library, given "
                f"{_missing()}; {nccl_install_hint()}")
        self._nccl = nccl
        uid = nccl.get_unique_id() if mpi_comm.Get_rank() == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        self.comm = nccl.NcclCommunicator(mpi_comm.Get_size(), uid, mpi_comm.Get_rank())
        self.label = nccl_label(mpi_comm)
        self._dtypes = {
            np.dtype(np.int8): nccl.NCCL_INT8, np.dtype(np.uint8): nccl.NCCL_UINT8,
            np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.int64): nccl.NCCL_INT64,
            float16: nccl.NCCL_FLOAT16, float32: nccl.NCCL_FLOAT32,
            float64: nccl.NCCL_FLOAT64,
        }
        if hasattr(nccl, "NCCL_BFLOAT16"):
            self._dtypes[bfloat16] = nccl.NCCL_BFLOAT16
        self._ops = {"sum": nccl.NCCL_SUM, "max": nccl.NCCL_MAX}

    def _dtype(self, a: Any) -> int:
        try:
            return self._dtypes[np.dtype(a.dtype)]
        except KeyError:
            raise TypeError(f"nccl: dtype {a.dtype} has no NCCL datatype") from None

    @staticmethod
    def _stream() -> Any:
        return backend.cupy_module().cuda.get_current_stream()

    @staticmethod
    def _event_after(stream: Any) -> Callable[[], bool]:
        """A CUDA event recorded on `stream` now; returns its non-blocking query. The
        watchdog thread runs the query (and drops the event): it first makes this rank's
        device its own, since a new thread's CUDA calls otherwise go to device 0 and would
        open a context there for every rank of the node."""
        cuda = backend.cupy_module().cuda
        device = cuda.runtime.getDevice()
        event = cuda.Event(block=False, disable_timing=True)
        event.record(stream)

        def done() -> bool:
            if cuda.runtime.getDevice() != device:
                cuda.runtime.setDevice(device)
            return event.done

        return done

    def _watch(self, op: str, stream: Any, root: int | None = None) -> None:
        """Put the collective just enqueued on `stream` under the watchdog."""
        watch_device_work(op, self.label, root, self._event_after(stream), self.abort)

    def abort(self) -> None:
        """ncclCommAbort: frees this rank's NCCL resources and unblocks its kernels."""
        self.comm.abort()

    def all_reduce(self, send: Any, recv: Any, op: str) -> None:
        stream = self._stream()
        self.comm.allReduce(send.data.ptr, recv.data.ptr, send.size, self._dtype(send),
                            self._ops[op], stream.ptr)
        self._watch("all_reduce", stream)

    def all_gather(self, send: Any, recv: Any) -> None:
        stream = self._stream()
        self.comm.allGather(send.data.ptr, recv.data.ptr, send.size, self._dtype(send),
                            stream.ptr)
        self._watch("all_gather", stream)

    def reduce_scatter(self, send: Any, recv: Any, op: str) -> None:
        stream = self._stream()
        self.comm.reduceScatter(send.data.ptr, recv.data.ptr, recv.size, self._dtype(send),
                                self._ops[op], stream.ptr)
        self._watch("reduce_scatter", stream)

    def broadcast(self, buf: Any, root: int) -> None:
        """ncclBroadcast in chunks of at most BCAST_CHUNK elements: CuPy's bcast binding
        takes the count as a C int (the other collectives take a size_t)."""
        stream = self._stream()
        dtype, step = self._dtype(buf), int(np.dtype(buf.dtype).itemsize)
        for start in range(0, buf.size, self.BCAST_CHUNK):
            count = min(self.BCAST_CHUNK, buf.size - start)
            self.comm.bcast(buf.data.ptr + start * step, count, dtype, root, stream.ptr)
        self._watch("broadcast", stream, root)


def nccl_label(mpi_comm: Any) -> str:
    """How watchdog messages name an NCCL communicator: its ranks in the world."""
    from mpi4py import MPI

    ranks = MPI.Group.Translate_ranks(mpi_comm.Get_group(), list(range(mpi_comm.Get_size())),
                                      MPI.COMM_WORLD.Get_group())
    return f"NCCL communicator of world ranks {list(ranks)}"
