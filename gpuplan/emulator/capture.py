"""Graph capture on the emulated device: record the stream's work, replay it, refuse syncs.

While the emulated stream captures (``_EmulatedStream.begin_capture``), nothing runs: a
kernel launch is recorded with its packed argument values (device addresses included), and
the array operations CuPy would turn into stream work on a GPU (a NumPy ufunc or function
over emulated arrays, ``a[...] = b``, ``fill``, ``copy``, ``astype``, a staged upload through
`gpuplan.stream.upload`) are recorded as closures. A replay runs the nodes in order, as
``cudaGraphLaunch`` does. What a GPU cannot capture raises `GraphCaptureError` naming the
call: reading a device value on the host (``get``, ``item``, ``float``, ``bool``,
``gp.to_host``), a copy from pageable host memory (``set``, assigning a NumPy array), or a
result that would come back to the host (a reduction to a NumPy scalar). Allocations made
while capturing belong to the capture's pool (the graph owns them); any other array a node
touches must be kept alive by its owner, and a replay that finds one freed raises instead
of writing freed memory (where a GPU would silently corrupt whatever reuses it).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from gpuplan.errors import GraphCaptureError


class Capture:
    """One capture in progress: the recorded nodes, the pool, the replay prologue hooks."""

    def __init__(self) -> None:
        self.nodes: list[tuple[str, Callable[[], None], tuple]] = []
        self.pool: list[np.ndarray] = []  # every buffer allocated while capturing
        self.keep: list[Any] = []  # host snapshots the nodes copy from
        self.failed: str | None = None

    def record(self, what: str, run: Callable[[], None], touched: tuple = ()) -> None:
        """Append a node; `touched`: the arrays it reads or writes (checked alive at replay)."""
        roots = tuple(weakref.ref(r) for r in {id(r): r for r in map(_root, touched)
                                                if r is not None}.values())
        self.nodes.append((what, run, roots))


_ACTIVE: Capture | None = None


def active() -> Capture | None:
    """The capture in progress on the emulated stream, or None."""
    return _ACTIVE


def begin() -> Capture:
    global _ACTIVE
    if _ACTIVE is not None:
        raise GraphCaptureError("emulated stream: begin_capture while a capture is in "
                                "progress (end_capture first)")
    _ACTIVE = Capture()
    return _ACTIVE


def end() -> Capture:
    global _ACTIVE
    cap, _ACTIVE = _ACTIVE, None
    if cap is None:
        raise GraphCaptureError("emulated stream: end_capture without begin_capture")
    return cap


def refuse(what: str) -> GraphCaptureError:
    """The error for an operation a capture cannot contain; the caller raises it."""
    cap = _ACTIVE
    msg = (f"{what} during graph capture: a GPU cannot capture it (a host sync or a copy "
           f"from pageable host memory); keep host reads and uploads outside the captured "
           f"region, or stage uploads with gpuplan.stream.upload")
    if cap is not None:
        cap.failed = msg
    return GraphCaptureError(msg)


def _root(a: Any) -> np.ndarray | None:
    """The ndarray owning `a`'s memory (views die young; their owner is what must live)."""
    if not isinstance(a, np.ndarray):
        return None
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def allocated(buffer: np.ndarray) -> None:
    """Called for every emulated allocation: while capturing, the pool keeps it."""
    if _ACTIVE is not None:
        _ACTIVE.pool.append(buffer)


class EmulatedGraph:
    """A captured emulated-stream graph: ``launch()`` replays it (cupy.cuda.graph.Graph's
    interface)."""

    def __init__(self, cap: Capture) -> None:
        self._nodes = cap.nodes
        self._pool = cap.pool
        self._keep = cap.keep

    @property
    def num_nodes(self) -> int:
        return len(self._nodes)

    def launch(self, stream: Any = None) -> None:
        """Run every node in capture order (a launch inside another capture is recorded as
        one node of that capture: a child graph)."""
        if _ACTIVE is not None:
            _ACTIVE.record("child graph", self._replay)
            return
        self._replay()

    def _replay(self) -> None:
        for what, run, roots in self._nodes:
            for r in roots:
                if r() is None:
                    raise GraphCaptureError(
                        f"graph replay: an array that {what} reads or writes was freed after "
                        f"capture (on a GPU the replay would write freed memory): keep every "
                        f"array the graph touches alive")
            run()

    def upload(self) -> None:
        """cupy Graph.upload counterpart (nothing to stage on the emulated device)."""
