"""Streams (host or CUDA) and workspaces, the execution context every plan runs in."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend, host
from gpuplan.errors import InvalidProblem, describe


class Stream:
    """A CUDA stream of one device, or the host "stream" (NumPy, runs synchronously)."""

    __slots__ = ("_cuda", "_device_id")

    _HOST: Stream | None = None

    def __init__(self, cuda_stream: Any | None = None, device_id: int | None = None) -> None:
        self._cuda = cuda_stream
        self._device_id = device_id

    @classmethod
    def host(cls) -> Stream:
        if cls._HOST is None:
            host.configure()
            cls._HOST = cls(None, None)
        return cls._HOST

    @classmethod
    def current(cls) -> Stream:
        """The current CUDA stream of the current device, or the host stream without one."""
        if not backend.device_available():
            return cls.host()
        cp = backend.cupy_module()
        return cls(cp.cuda.get_current_stream(), cp.cuda.Device().id)

    @classmethod
    def for_array(cls, a: Any) -> Stream:
        """The stream a plan on `a` should use: host for NumPy arrays, current CUDA otherwise."""
        return cls.current() if backend.is_device_array(a) else cls.host()

    @property
    def is_host(self) -> bool:
        return self._cuda is None

    @property
    def cuda_stream(self) -> Any:
        return self._cuda

    @property
    def device_id(self) -> int | None:
        return self._device_id

    @property
    def arch(self) -> str:
        """'host', or the compute capability such as '90'."""
        if self.is_host:
            return "host"
        return compute_capability(self._device_id)

    def synchronize(self) -> None:
        if self._cuda is not None:
            self._cuda.synchronize()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._cuda is self._cuda

    def __hash__(self) -> int:
        return id(self._cuda)

    def __repr__(self) -> str:
        if self.is_host:
            return "Stream.host()"
        return f"Stream(cuda device {self._device_id}, ptr={self._cuda.ptr:#x})"


_CC_CACHE: dict[int, str] = {}


def compute_capability(device_id: int | None) -> str:
    if device_id is None:
        return "host"
    cc = _CC_CACHE.get(device_id)
    if cc is None:
        cp = backend.cupy_module()
        cc = str(cp.cuda.Device(device_id).compute_capability)
        _CC_CACHE[device_id] = cc
    return cc


class Workspace:
    """Scratch memory handed to plan.run(): a byte buffer on the plan's device, or none."""

    __slots__ = ("buffer", "nbytes")

    def __init__(self, buffer: Any | None, nbytes: int) -> None:
        self.buffer = buffer
        self.nbytes = nbytes

    @classmethod
    def none(cls) -> Workspace:
        return cls(None, 0)

    @classmethod
    def allocate(cls, stream: Stream, nbytes: int) -> Workspace:
        if nbytes < 0:
            raise InvalidProblem(describe("Workspace.allocate", "nbytes", ">= 0", nbytes))
        if nbytes == 0:
            return cls.none()
        if stream.is_host:
            return cls(np.empty(nbytes, dtype=np.uint8), nbytes)
        cp = backend.cupy_module()
        with cp.cuda.Device(stream.device_id):
            return cls(cp.empty(nbytes, dtype=cp.uint8), nbytes)

    def view(self, dtype: Any, count: int, offset_bytes: int = 0) -> Any:
        """`count` elements of `dtype` starting at byte `offset_bytes` of the buffer."""
        itemsize = np.dtype(dtype).itemsize
        end = offset_bytes + count * itemsize
        return self.buffer[offset_bytes:end].view(dtype)

    def __repr__(self) -> str:
        return f"Workspace({self.nbytes} bytes)"
