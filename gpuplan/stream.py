"""Streams (host, CUDA or emulated) and workspaces, the execution context every plan runs in."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend, devices, host
from gpuplan.errors import GraphCaptureError, InvalidProblem, describe


class Stream:
    """A CUDA stream of one device, the emulated device's stream, or the host "stream"
    (NumPy, runs synchronously)."""

    __slots__ = ("_cuda", "_device_id", "_kind", "key")

    _HOST: Stream | None = None
    _EMULATED: Stream | None = None

    def __init__(self, cuda_stream: Any | None = None, device_id: int | None = None,
                 kind: str | None = None) -> None:
        self._cuda = cuda_stream
        self._device_id = device_id
        self._kind = kind or ("cpu" if cuda_stream is None else "cuda")
        #: hashable identity (what plan caches key on): equal streams have equal keys. The
        #: device is part of it: CuPy's null stream is one object for every device.
        self.key = (self._kind, id(cuda_stream), device_id)

    @classmethod
    def host(cls) -> Stream:
        if cls._HOST is None:
            host.configure()
            cls._HOST = cls(None, None, "cpu")
        return cls._HOST

    @classmethod
    def emulated(cls) -> Stream:
        """The stream of the emulated device (kernels run on the host, see gpuplan.emulator)."""
        if cls._EMULATED is None:
            device = devices.get("emulated")
            cls._EMULATED = cls(device.stream, device.device_id, "emulated")
        return cls._EMULATED

    @classmethod
    def of_device(cls, device: str) -> Stream:
        """The stream plans on `device` ("cpu", "cuda", "emulated") use by default."""
        if device == "cpu":
            return cls.host()
        return cls._current_cuda() if device == "cuda" else cls.emulated()

    @classmethod
    def current(cls) -> Stream:
        """The current stream of the default device: the emulated device under
        GPUPLAN_DEVICE=emulated, else the current CUDA stream, else the host stream."""
        if backend.emulated_default():
            return cls.emulated()
        if not backend.cuda_available():
            return cls.host()
        return cls._current_cuda()

    @classmethod
    def _current_cuda(cls) -> Stream:
        """The current CuPy stream of the current device, wrapped once per (stream, device):
        the same Stream object (and so the same plan-cache key) every call."""
        cp = backend.cupy_module()
        cuda = cp.cuda.get_current_stream()
        device = cp.cuda.runtime.getDevice()
        key = (id(cuda), device)
        wrapped = _CUDA_WRAPPERS.get(key)
        if wrapped is None or wrapped._cuda is not cuda:
            if len(_CUDA_WRAPPERS) >= 256:
                _CUDA_WRAPPERS.clear()
            wrapped = _CUDA_WRAPPERS[key] = cls(cuda, device)  # holds `cuda`: its id stays
        return wrapped

    @classmethod
    def for_array(cls, a: Any) -> Stream:
        """The stream a plan on `a` should use: host for NumPy arrays, the emulated stream for
        emulated arrays, the current CUDA stream for CuPy arrays."""
        if type(a) is np.ndarray:
            return cls.host()
        return cls.of_device(backend.device_of(a))

    @property
    def kind(self) -> str:
        """'cpu', 'cuda' or 'emulated': where the arrays of plans on this stream live."""
        return self._kind

    @property
    def is_host(self) -> bool:
        return self._kind == "cpu"

    @property
    def is_emulated(self) -> bool:
        return self._kind == "emulated"

    @property
    def cuda_stream(self) -> Any:
        return self._cuda

    @property
    def device_id(self) -> int | None:
        return self._device_id

    @property
    def device(self) -> devices.Device:
        """The device this stream runs on (gpuplan.devices)."""
        return devices.get(self._kind)

    @property
    def arch(self) -> str:
        """'host', 'emulated', or the compute capability such as '90'."""
        if self._kind != "cuda":
            return "host" if self.is_host else self._kind
        return self.device.compute_capability(self._device_id)

    @property
    def compute_capability(self) -> int:
        """The device's compute capability as an int (80 for the emulated sm_80 part, 0 on
        the host)."""
        cc = self.device.compute_capability(self._device_id)
        return 0 if cc == "host" else int(cc)

    def synchronize(self) -> None:
        if self._cuda is not None:
            if self.capturing is not None:
                raise GraphCaptureError(f"{self!r}: synchronize during graph capture (a "
                                        f"host sync cannot be captured)")
            self._cuda.synchronize()

    @property
    def capturing(self) -> Any:
        """The graph capture in progress on this stream (gpuplan.graphs), or None."""
        return None if self._kind == "cpu" else self.device.capture_active(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._cuda is self._cuda and \
            other._kind == self._kind and other._device_id == self._device_id

    def __hash__(self) -> int:
        return id(self._cuda)

    def __repr__(self) -> str:
        if self.is_host:
            return "Stream.host()"
        if self.is_emulated:
            return "Stream.emulated()"
        return f"Stream(cuda device {self._device_id}, ptr={self._cuda.ptr:#x})"


_CUDA_WRAPPERS: dict[tuple[int, int], Stream] = {}


def upload(stream: Stream, dst: Any, host: np.ndarray) -> None:
    """``dst[...] = host`` (a NumPy array of dst's size and dtype), ordered on `stream`.

    The plans' way to stage host-built tables: while `stream` captures a graph, the host
    data is first snapshotted into memory the graph owns (pinned on a GPU), so the captured
    copy reads the same values at every replay even after `host` is rewritten; a plain
    ``set()`` from pageable memory cannot be captured. Outside a capture `host` may be
    rewritten once this returns only because it is pageable (NumPy) memory, which CUDA
    stages before returning; a pinned buffer would be read later, asynchronously."""
    host = np.ascontiguousarray(host, dtype=dst.dtype).reshape(dst.shape)
    stream.device.upload(stream, dst, host)


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
        return cls(stream.device.alloc_bytes(nbytes, stream.device_id), nbytes)

    def view(self, dtype: Any, count: int, offset_bytes: int = 0) -> Any:
        """`count` elements of `dtype` starting at byte `offset_bytes` of the buffer."""
        itemsize = np.dtype(dtype).itemsize
        end = offset_bytes + count * itemsize
        return self.buffer[offset_bytes:end].view(dtype)

    def __repr__(self) -> str:
        return f"Workspace({self.nbytes} bytes)"
