"""Per-rank timelines in Chrome's trace-event format (train.py --trace PATH).

When tracing is on (`start`), the runtime records a complete event ("ph": "X") for each phase
of a step: ``forward`` and ``backward`` per micro-batch (with its stage), every collective and
point-to-point transfer by its name (``all_reduce``, ``all_gather``, ``reduce_scatter``,
``broadcast``, ``send``, ``recv``, with its bytes and peer; a non-blocking ``all_reduce``
from its issue to the end of its wait, on a thread of its own), ``optimizer``, ``checkpoint``,
``evaluate`` and the whole ``step``. `write` gathers every rank's events to rank 0 and writes
one JSON file, one ``pid`` per rank (named "rank r (dp, pp, tp)"), that Perfetto
(ui.perfetto.dev) and chrome://tracing open.

Timestamps are microseconds since `start`, which every rank calls after a barrier, so the
ranks' clocks agree to about a barrier's latency on one machine (across machines, to that
plus the hosts' clock offsets). Off, `span` costs one global read and returns a shared
no-op context manager.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_events: list[dict[str, Any]] | None = None  # None: tracing is off
_t0 = 0.0
_pid = 0
_NULL = contextlib.nullcontext()
#: The trace thread of non-blocking collectives (issue to completion): their spans overlap
#: the compute spans of thread 0 (a request issued in backward completes after it), and
#: complete events on one thread must nest.
REQUEST_TID = 1


def enabled() -> bool:
    return _events is not None


def start(comm: Any = None) -> None:
    """Turn tracing on for this process (a collective over `comm` when given: the barrier
    that aligns the ranks' time zero)."""
    global _events, _t0, _pid
    if comm is not None:
        comm.barrier()
        _pid = comm.rank
    _events = []
    _t0 = time.perf_counter()


def stop() -> list[dict[str, Any]]:
    """Turn tracing off; returns this process's events."""
    global _events
    events, _events = _events or [], None
    return events


def _now_us() -> float:
    return (time.perf_counter() - _t0) * 1e6


@contextlib.contextmanager
def _span(name: str, cat: str, args: dict[str, Any]) -> Iterator[None]:
    t = _now_us()
    try:
        yield
    finally:
        events = _events
        if events is not None:
            events.append({"name": name, "cat": cat, "ph": "X", "ts": round(t, 3),
                           "dur": round(_now_us() - t, 3), "pid": _pid, "tid": 0,
                           "args": args})


def now() -> float:
    """Microseconds since `start` (a start time for `record`)."""
    return _now_us()


def record(name: str, start_us: float, cat: str = "compute", *, tid: int = 0,
           **args: Any) -> None:
    """Record `name` from `start_us` (a `now()`) to now, when tracing is on (on trace
    thread `tid`: 0, or REQUEST_TID for a non-blocking collective)."""
    if _events is not None:
        _events.append({"name": name, "cat": cat, "ph": "X", "ts": round(start_us, 3),
                        "dur": round(_now_us() - start_us, 3), "pid": _pid, "tid": tid,
                        "args": args})


def span(name: str, cat: str = "compute", **args: Any) -> Any:
    """A context manager recording `name` from entry to exit (a no-op when tracing is off)."""
    if _events is None:
        return _NULL
    return _span(name, cat, args)


def write(path: str | os.PathLike, comm: Any = None, label: str | None = None,
          root: str | os.PathLike | None = None) -> Path | None:
    """Gather every rank's events (and `label`, its process name) on rank 0 of `comm` and
    write them there as one JSON file (a collective; returns the path on rank 0, None
    elsewhere). The write goes through a new temporary name and a rename, never through a
    link (gpuplan.confined_write); `root` is the folder it must stay inside (default: the
    file's own)."""
    from gpuplan.confined_write import atomic_write

    mine = (label, list(_events or []))
    parts = [mine] if comm is None else comm.gather_object(mine, root=0)
    if comm is not None and comm.rank != 0:
        return None
    events: list[dict[str, Any]] = []
    for rank, (name, part) in enumerate(parts):
        label = name or f"rank {rank}"
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        if any(e.get("tid") == REQUEST_TID for e in part):
            events.append({"name": "thread_name", "ph": "M", "pid": rank,
                           "tid": REQUEST_TID, "args": {"name": "non-blocking collectives"}})
        events.extend(part)
    path = Path(path)
    atomic_write(path, (json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}) + "\n")
                 .encode(), root=Path(root) if root is not None else path.parent)
    return path
