"""Streams (host, CUDA or emulated) and workspaces, the execution context every plan runs in."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend, host
from gpuplan.emulator import array as emulated_array
from gpuplan.emulator import capture as emulated_capture
from gpuplan.emulator.array import DEVICE_ID as EMULATED_DEVICE_ID
from gpuplan.emulator.capture import GraphCaptureError
from gpuplan.emulator.stream import EmulatedStream
from gpuplan.errors import InvalidProblem, describe


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
            cls._EMULATED = cls(EmulatedStream(), EMULATED_DEVICE_ID, "emulated")
        return cls._EMULATED

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
        where = backend.device_of(a)
        if where == "emulated":
            return cls.emulated()
        return cls._current_cuda() if where == "cuda" else cls.host()

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
    def arch(self) -> str:
        """'host', 'emulated', or the compute capability such as '90'."""
        if self._kind != "cuda":
            return "host" if self.is_host else "emulated"
        return compute_capability(self._device_id)

    @property
    def compute_capability(self) -> int:
        """The device's compute capability as an int (80 for the emulated sm_80 part, 0 on
        the host)."""
        if self._kind == "cuda":
            return int(compute_capability(self._device_id))
        return EMULATED_COMPUTE_CAPABILITY if self.is_emulated else 0

    def synchronize(self) -> None:
        if self._cuda is not None:
            if self.capturing is not None:
                raise GraphCaptureError(f"{self!r}: synchronize during graph capture (a "
                                        f"host sync cannot be captured)")
            self._cuda.synchronize()

    @property
    def capturing(self) -> Any:
        """The graph capture in progress on this stream (gpuplan.graphs), or None."""
        if self._kind == "emulated":
            return emulated_capture.active()
        return _CAPTURES.get(self.key) if _CAPTURES else None

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
#: CUDA streams capturing a graph (Stream.key -> the capture's state, see gpuplan.graphs).
_CAPTURES: dict[tuple, Any] = {}


def upload(stream: Stream, dst: Any, host: np.ndarray) -> None:
    """``dst[...] = host`` (a NumPy array of dst's size and dtype), ordered on `stream`.

    The plans' way to stage host-built tables: while `stream` captures a graph, the host
    data is first snapshotted into memory the graph owns (pinned on a GPU), so the captured
    copy reads the same values at every replay even after `host` is rewritten; a plain
    ``set()`` from pageable memory cannot be captured. Outside a capture `host` may be
    rewritten once this returns only because it is pageable (NumPy) memory, which CUDA
    stages before returning; a pinned buffer would be read later, asynchronously."""
    host = np.ascontiguousarray(host, dtype=dst.dtype).reshape(dst.shape)
    if stream.is_host:
        np.copyto(dst, host)
    elif stream.is_emulated:
        cap = emulated_capture.active()
        if cap is None:
            np.copyto(dst.view(np.ndarray), host)
            return
        snap = host.copy()
        target = dst.view(np.ndarray)
        cap.keep.append(snap)
        cap.record("upload", lambda: np.copyto(target, snap), (dst,))
    else:
        cap = stream.capturing
        cuda = stream.cuda_stream
        with backend.cupy_module().cuda.Device(stream.device_id):
            if cap is None:
                dst.set(host, stream=cuda)
                return
            snap = __import__("cupyx").empty_pinned(host.shape, host.dtype)
            snap[...] = host
            cap.keep.append(snap)
            dst.data.copy_from_host_async(snap.ctypes.data, host.nbytes, cuda)

#: The emulated device executes the PTX of an sm_80 part (mma.sync, ldmatrix, cp.async).
EMULATED_COMPUTE_CAPABILITY = 80

_CC_CACHE: dict[int, str] = {}


def compute_capability(device_id: int | None) -> str:
    if device_id is None:
        return "host"
    if device_id == EMULATED_DEVICE_ID:
        return str(EMULATED_COMPUTE_CAPABILITY)
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
        if stream.is_emulated:
            return cls(emulated_array.empty(nbytes, np.uint8), nbytes)
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
