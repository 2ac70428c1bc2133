"""Worker threads for the NumPy host SKUs: one op's rows or elements split over the BLAS
thread budget.

NumPy releases the GIL inside its loops, so NumPy calls on disjoint slices run in parallel
from Python threads. `parallel_for(n, fn, grain)` calls ``fn(start, stop)`` over contiguous
parts of ``range(n)``, one part per thread of `gpuplan.host.thread_budget()` (the BLAS pool's
size: cores // local MPI ranks under a launcher, GPUPLAN_HOST_THREADS=N to choose), the
calling thread taking the first part. Parts are at least `grain` long, so small problems
stay on the calling thread and pay nothing.

`for_blocks(n, fn, row)` goes further: it calls ``fn(lo, hi)`` on blocks of about BLOCK
elements (rows of `row` elements each), so that an op's chain of NumPy passes runs on
L2-resident data, and spreads the blocks over the threads. The blocks depend on the shape
only, never on the thread count, so a reduction that adds per-block partial results in
block order is bit-identical for any number of threads; maps and row-wise ops are
bit-identical however they are split.

The workers are daemon threads that wait on a queue and run under the caller's NumPy error
state (np.errstate); a call made while the pool is busy (from a worker, or from a second
Python thread) runs on its caller's thread instead.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator

import numpy as np

from gpuplan import host

#: Elements per block of `for_blocks` (128 KiB of float32: a block's operands and scratch
#: stay in L2), and the fewest elements worth a thread of its own.
BLOCK = 32768
GRAIN = 65536

_lock = threading.Lock()
_workers: list[_Worker] = []


class _Worker:
    """A daemon thread running (fn, start, stop) tasks from its queue; each task's exception
    (or None) goes to `done`."""

    def __init__(self) -> None:
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="gpuplan-host", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, start, stop, errors = self.tasks.get()
            try:
                with np.errstate(**errors):
                    fn(start, stop)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
                self.done.put(exc)
            else:
                self.done.put(None)


def split(n: int, parts: int, align: int = 1) -> list[int]:
    """Boundaries [0, ..., n] of `parts` contiguous pieces of range(n) whose inner
    boundaries are multiples of `align` (fewer pieces when n is short)."""
    units = -(-n // align)
    parts = max(1, min(parts, units))
    return [min(n, (units * k // parts) * align) for k in range(parts)] + [n]


def parallel_for(n: int, fn: Callable[[int, int], None], grain: int = 1,
                 align: int = 1) -> None:
    """fn(start, stop) over contiguous parts of range(n), at least `grain` long and aligned
    to `align`, on up to thread_budget() threads; returns when every part is done and
    re-raises the first exception."""
    parts = min(host.thread_budget(), n // max(1, grain))
    if parts <= 1 or not _lock.acquire(blocking=False):
        if n > 0:
            fn(0, n)
        return
    try:
        bounds = split(n, parts, align)
        while len(_workers) < len(bounds) - 2:
            _workers.append(_Worker())
        busy = _workers[: len(bounds) - 2]
        errors = np.geterr()
        for k, w in enumerate(busy, start=1):
            w.tasks.put((fn, bounds[k], bounds[k + 1], errors))
        error = None
        try:
            fn(bounds[0], bounds[1])
        except BaseException as exc:  # noqa: BLE001 - the workers must finish first
            error = exc
        for w in busy:
            exc = w.done.get()
            error = error or exc
        if error is not None:
            raise error
    finally:
        _lock.release()


def blocks(start: int, stop: int, size: int) -> Iterator[tuple[int, int]]:
    """(lo, hi) of each `size`-long block of range(start, stop) (the last may be shorter)."""
    for lo in range(start, stop, size):
        yield lo, min(lo + size, stop)


def block_rows(row: int) -> int:
    """Rows of `row` elements in one block of `for_blocks` (at least one)."""
    return max(1, BLOCK // max(1, row))


def for_blocks(n: int, fn: Callable[[int, int], None], row: int = 1,
               rows_per_block: int | None = None) -> None:
    """fn(lo, hi) for each block [lo, hi) of range(n) (n rows of `row` elements; blocks of
    `rows_per_block` rows, by default block_rows(row)), the blocks spread over the threads.
    Block k starts at k * rows_per_block whatever the thread count."""
    size = rows_per_block or block_rows(row)

    def part(start: int, stop: int) -> None:
        for lo in range(start, stop, size):
            fn(lo, min(lo + size, stop))

    parallel_for(n, part, max(1, GRAIN // max(1, row)), align=size)


def _forget_workers() -> None:  # a forked child has the pool's list but not its threads
    global _lock
    _workers.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)
