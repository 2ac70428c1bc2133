"""Opt-in NCCL transport for device arrays (cupy.cuda.nccl; the unique id travels over MPI)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import bfloat16, float16, float32, float64


def nccl_module() -> Any | None:
    """cupy.cuda.nccl when CuPy, a device and the NCCL library (nvidia-nccl-cu12) are present."""
    if not backend.device_available():
        return None
    try:
        from cupy.cuda import nccl
    except Exception:  # noqa: BLE001 - any import failure means "no NCCL here"
        return None
    return nccl if getattr(nccl, "available", False) else None


def nccl_available() -> bool:
    return nccl_module() is not None


class NcclTransport:
    """Stream-ordered NCCL collectives over C-contiguous CuPy arrays of one communicator."""

    def __init__(self, mpi_comm: Any) -> None:
        nccl = nccl_module()
        if nccl is None:
            raise RuntimeError(
                "backend='nccl': expected CuPy with a CUDA device and the NCCL library "
                "(pip install nvidia-nccl-cu12), given none available")
        self._nccl = nccl
        uid = nccl.get_unique_id() if mpi_comm.Get_rank() == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        self.comm = nccl.NcclCommunicator(mpi_comm.Get_size(), uid, mpi_comm.Get_rank())
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
    def _stream() -> int:
        return backend.cupy_module().cuda.get_current_stream().ptr

    def all_reduce(self, send: Any, recv: Any, op: str) -> None:
        self.comm.allReduce(send.data.ptr, recv.data.ptr, send.size, self._dtype(send),
                            self._ops[op], self._stream())

    def all_gather(self, send: Any, recv: Any) -> None:
        self.comm.allGather(send.data.ptr, recv.data.ptr, send.size, self._dtype(send),
                            self._stream())

    def reduce_scatter(self, send: Any, recv: Any, op: str) -> None:
        self.comm.reduceScatter(send.data.ptr, recv.data.ptr, recv.size, self._dtype(send),
                                self._ops[op], self._stream())

    def broadcast(self, buf: Any, root: int) -> None:
        self.comm.bcast(buf.data.ptr, buf.size, self._dtype(buf), root, self._stream())
