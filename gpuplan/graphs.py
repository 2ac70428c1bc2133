"""CUDA graphs: capture a stream's work once, replay it with one launch (torch.cuda-like).

    g = gp.graphs.CUDAGraph()
    with gp.graphs.graph(g):                 # a side stream, a private pool, no host syncs
        out = f(static_x)                    # plans record their launches instead of running
    static_x[...] = next_batch; g.replay()   # or: step = gp.graphs.capture_step(f, static_x)

The rules of CUDA_NOTES: capture on a non-default stream (`graph` makes a side stream),
warm up first (compilation, cuBLAS handles, lazily created state: `capture_step` runs
`warmup` eager calls), allocate from a dedicated pool (a private CuPy MemoryPool, whose
memory the graph owns until it is deleted), keep every array the graph touches alive, and
no host sync or pageable copy while capturing: `GraphCaptureError` names the call, the
capture is abandoned and the stream works as before. Host values a graph must see change
between replays (a learning rate, a step count) live in device memory refreshed by a
`before_replay` hook (see autograd.optim.AdamW). The emulated device captures the same way
(gpuplan.emulator.capture), so CI tests all of this without a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gpuplan import backend, devices
from gpuplan.errors import GraphCaptureError
from gpuplan.stream import Stream, upload

__all__ = ["CUDAGraph", "CapturedStep", "GraphCaptureError", "GraphPool", "before_replay",
           "capture_step", "graph", "is_capturing", "side_stream"]

_SIDE: dict[int, Any] = {}  # device id -> the side stream captures run on
_GRAPHS: dict[tuple, CUDAGraph] = {}  # Stream.key -> the graph capturing on it


class GraphPool:
    """The memory a capture allocates from: a private CuPy MemoryPool on a GPU (torch's
    graph pool); on the emulated device each capture's allocations stay with its graph.
    Pass one graph's ``pool()`` to another capture to share it (replay them in order)."""

    def __init__(self, device: str) -> None:
        self.device = device
        cp = backend.cupy_module() if device == "cuda" else None
        self.memory_pool = cp.cuda.MemoryPool() if cp is not None else None

    def used_bytes(self) -> int:
        return 0 if self.memory_pool is None else int(self.memory_pool.used_bytes())


def side_stream(device: str | None = None) -> Stream:
    """The stream captures use: a non-blocking CUDA stream per device (capture refuses the
    legacy default stream), or the emulated device's stream."""
    device = backend.default_device() if device is None else backend.resolve_device(device)
    if device == "cpu":
        raise GraphCaptureError(f"graph capture: needs a device (CUDA, or the emulated "
                                f"device), given device {device!r}: host work runs eagerly")
    if device != "cuda":
        return Stream.of_device(device)  # a device with one stream (the emulated device)
    cp = backend.cupy_module()
    dev = cp.cuda.runtime.getDevice()
    cuda = _SIDE.get(dev)
    if cuda is None:
        cuda = _SIDE[dev] = cp.cuda.Stream(non_blocking=True)
    with cuda:
        return Stream._current_cuda()


def is_capturing(stream: Stream | None = None) -> bool:
    """Whether `stream` (default: the current one) is capturing a graph."""
    stream = Stream.current() if stream is None else stream
    return stream.key in _GRAPHS


def before_replay(fn: Callable[[], None], stream: Stream | None = None) -> None:
    """Run `fn` on the host before every replay of the graph capturing on `stream`, ahead
    of the graph's launch (e.g. to refresh a device buffer of per-step scalars with
    gpuplan.stream.upload). GraphCaptureError when nothing captures there."""
    stream = Stream.current() if stream is None else stream
    g = _GRAPHS.get(stream.key)
    if g is None:
        raise GraphCaptureError(f"before_replay: no graph is capturing on {stream!r}")
    g._hooks.append(fn)


class CUDAGraph:
    """One captured graph (torch.cuda.CUDAGraph): ``capture_begin``/``capture_end`` around
    the work (or the `graph` context manager), then ``replay()``."""

    def __init__(self) -> None:
        self._graph: Any = None
        self._stream: Stream | None = None
        self._pool: GraphPool | None = None
        self._hooks: list[Callable[[], None]] = []
        self.keep: list[Any] = []  # pinned snapshots the graph's copies read (stream.upload)
        self._allocator: Any = None

    @property
    def stream(self) -> Stream | None:
        return self._stream

    def pool(self) -> GraphPool | None:
        return self._pool

    def capture_begin(self, stream: Stream | None = None, pool: GraphPool | None = None) -> None:
        """Start capturing `stream` (default: the current stream, which must not be CUDA's
        legacy default stream); allocations come from `pool` (default: a new private one)."""
        if self._graph is not None or self._stream is not None:
            raise GraphCaptureError("CUDAGraph.capture_begin: this graph already holds a "
                                    "capture (reset() first)")
        stream = Stream.current() if stream is None else stream
        if stream.is_host:
            raise GraphCaptureError("graph capture: needs a device stream, given the host "
                                    "stream (host work runs eagerly)")
        if stream.key in _GRAPHS:
            raise GraphCaptureError(f"graph capture: {stream!r} is already capturing")
        device = stream.kind
        if device == "cuda" and stream.cuda_stream.ptr in (0, 1, 2):
            raise GraphCaptureError("graph capture: cannot capture CUDA's default stream; "
                                    "use gpuplan.graphs.side_stream() or graphs.graph()")
        self._pool = pool or GraphPool(device)
        if self._pool.memory_pool is not None:
            cp = backend.cupy_module()
            self._allocator = cp.cuda.using_allocator(self._pool.memory_pool.malloc)
            self._allocator.__enter__()
        try:
            stream.cuda_stream.begin_capture()
        except Exception:
            self._exit_allocator()
            raise
        self._stream = stream
        _GRAPHS[stream.key] = self
        if device == "cuda":
            devices.get("cuda").captures[stream.key] = self

    def capture_end(self) -> None:
        stream = self._require_capturing("capture_end")
        try:
            self._graph = stream.cuda_stream.end_capture()
        finally:
            self._detach()

    def abandon(self) -> None:
        """End a capture that failed: discard what was recorded; the stream is usable."""
        stream = self._stream
        if stream is None or stream.key not in _GRAPHS:
            return
        try:
            with contextlib.suppress(Exception):  # an invalidated CUDA capture raises here
                stream.cuda_stream.end_capture()
        finally:
            self._detach()
            self.reset()

    def _require_capturing(self, what: str) -> Stream:
        if self._stream is None or self._stream.key not in _GRAPHS:
            raise GraphCaptureError(f"CUDAGraph.{what}: no capture in progress")
        return self._stream

    def _detach(self) -> None:
        key = self._stream.key
        _GRAPHS.pop(key, None)
        devices.get("cuda").captures.pop(key, None)
        self._exit_allocator()

    def _exit_allocator(self) -> None:
        if self._allocator is not None:
            self._allocator.__exit__(None, None, None)
            self._allocator = None

    def replay(self) -> None:
        """Run the before-replay hooks, then launch the graph on its stream (ordered after
        the work already queued on the current stream, and before what follows it)."""
        if self._graph is None:
            raise GraphCaptureError("CUDAGraph.replay: nothing captured")
        for hook in self._hooks:
            hook()
        stream = self._stream
        if stream.kind != "cuda":  # one stream (the emulated device): nothing to order
            self._graph.launch()
            return
        cp = backend.cupy_module()
        current = cp.cuda.get_current_stream()
        side = stream.cuda_stream
        if current is not side:
            side.wait_event(current.record())
        self._graph.launch(stream=side)
        if current is not side:
            current.wait_event(side.record())

    def reset(self) -> None:
        """Drop the graph and its pool (the memory returns when no array uses it)."""
        self._graph, self._hooks, self.keep = None, [], []
        self._stream = self._pool = None


@contextlib.contextmanager
def graph(cuda_graph: CUDAGraph, pool: GraphPool | None = None,
          stream: Stream | None = None) -> Iterator[CUDAGraph]:
    """Capture the block into `cuda_graph` on `stream` (default: `side_stream()`, made
    current inside the block); on an error the capture is abandoned and the error raised
    (a CUDA capture error as GraphCaptureError)."""
    stream = side_stream() if stream is None else stream
    with _current(stream):
        cuda_graph.capture_begin(stream, pool)
        try:
            yield cuda_graph
        except BaseException as exc:
            cuda_graph.abandon()
            if not isinstance(exc, GraphCaptureError) and "StreamCapture" in str(exc):
                raise GraphCaptureError(f"graph capture: {exc} (a host sync or an operation "
                                        f"CUDA cannot capture)") from exc
            raise
        cuda_graph.capture_end()


@contextlib.contextmanager
def _current(stream: Stream) -> Iterator[None]:
    if stream.kind != "cuda":
        yield
        return
    with backend.cupy_module().cuda.Device(stream.device_id), stream.cuda_stream:
        yield


class CapturedStep:
    """`fn` captured once over static inputs; ``step(*inputs)`` copies the new inputs into
    the static ones, replays, and returns the static outputs (overwritten by each call)."""

    def __init__(self, g: CUDAGraph, static_inputs: tuple, static_outputs: Any) -> None:
        self.graph = g
        self.static_inputs = static_inputs
        self.static_outputs = static_outputs

    def __call__(self, *inputs: Any) -> Any:
        if len(inputs) != len(self.static_inputs):
            raise ValueError(f"CapturedStep: expected {len(self.static_inputs)} inputs, given "
                             f"{len(inputs)}")
        stream = self.graph.stream
        for i, (dst, src) in enumerate(zip(self.static_inputs, inputs, strict=True)):
            if src is dst:
                continue
            if tuple(src.shape) != tuple(dst.shape) or np.dtype(src.dtype) != np.dtype(dst.dtype):
                raise ValueError(f"CapturedStep: input {i}: expected shape {tuple(dst.shape)} "
                                 f"{np.dtype(dst.dtype)} (the captured static input), given "
                                 f"{tuple(src.shape)} {np.dtype(src.dtype)}")
            if backend.is_device_array(src):
                # On the current stream, where `src` was written: replay() then orders the
                # graph's stream after it (and the last replay ran before this copy: replay()
                # leaves the current stream waiting on the graph's).
                backend.copy_into(dst, backend.ascontiguous(src))
            else:
                with _current(stream):
                    upload(stream, dst, np.asarray(src))
        self.graph.replay()
        return self.static_outputs


def capture_step(fn: Callable[..., Any], *static_inputs: Any, warmup: int = 3,
                 pool: GraphPool | None = None) -> CapturedStep:
    """Run ``fn(*static_inputs)`` `warmup` times eagerly on the capture stream (compiles
    kernels, creates lazily made state such as optimizer moments: each call is a real
    step), then capture one call into a graph. Returns a `CapturedStep`: calling it with new
    inputs of the same shapes and dtypes equals calling `fn` on them, in one launch."""
    if warmup < 1:
        raise ValueError(f"capture_step: warmup: expected >= 1 eager call before capture "
                         f"(compilation and lazily created state cannot be captured), given "
                         f"{warmup}")
    devices = {backend.device_of(a) for a in static_inputs}
    if len(devices) != 1 or "cpu" in devices:
        raise GraphCaptureError(f"capture_step: static inputs must be device arrays on one "
                                f"device, given arrays on {sorted(devices)}")
    for i, a in enumerate(static_inputs):
        if not a.flags.c_contiguous:  # replays copy whole buffers into them
            raise GraphCaptureError(f"capture_step: static input {i}: expected a C-contiguous "
                                    f"array, given one with strides {tuple(a.strides)}")
    stream = side_stream(devices.pop())
    if stream.kind == "cuda":  # the inputs were written on the current stream: wait for it
        stream.cuda_stream.wait_event(backend.cupy_module().cuda.get_current_stream().record())
    with _current(stream):
        for _ in range(warmup):
            fn(*static_inputs)
        stream.synchronize()
    g = CUDAGraph()
    with graph(g, pool=pool, stream=stream):
        outputs = fn(*static_inputs)
    return CapturedStep(g, tuple(static_inputs), outputs)

