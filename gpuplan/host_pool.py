"""Worker threads for the NumPy host SKUs: one op's rows or elements split over the BLAS
thread budget.

NumPy releases the GIL inside its loops, so NumPy calls on disjoint slices run in parallel
from Python threads. `parallel_for(n, fn, grain)` calls ``fn(start, stop)`` over contiguous
parts of ``range(n)``, one part per thread of `gpuplan.host.thread_budget()` (the BLAS pool's
size: cores // local MPI ranks under a launcher, GPUPLAN_HOST_THREADS=N to choose), the
calling thread taking the first part. Parts are at least `grain` long, so small problems
stay on the calling thread and pay nothing.

`for_blocks(n, fn, row)` goes further: it calls ``fn(lo, hi)`` on blocks of rows (of `row`
elements each), BLOCK elements at a time on one thread, so that an op's chain of NumPy
passes runs on L2-resident data, and spreads bigger blocks over the threads when the op is
big enough to gain from them. Maps and row-wise ops give the same bits however they are
split; a reduction that adds per-block partial results in block order passes
`rows_per_block` (a function of the shape only), which makes it bit-identical for any
number of threads too.

The workers are daemon threads that poll for their next part for ~1 ms, then sleep (and the
caller polls for their parts' ends likewise: `_Worker`), and run under the caller's NumPy
error state (np.errstate); a call made while the pool is busy (from a worker, or from a
second Python thread) runs on its caller's thread instead.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np

from gpuplan import host, host_jit

#: Elements per block of `for_blocks`: BLOCK (256 KiB of float32: a block's operands and
#: scratch stay in L2) on one thread; BIG_BLOCK when split, which needs GRAIN elements per
#: thread. Every NumPy call re-takes the GIL, and handing the GIL between threads costs
#: several microseconds (more on a VM), so a split op needs calls of ~50 us or more: on the
#: 2-core benchmark machine a [1024, 512] chain of NumPy passes ran 0.85 ms on one thread,
#: 0.62 ms on two in 64K-element blocks and 1.45 ms on two in 16K-element blocks.
BLOCK = 65536
BIG_BLOCK = 131072
GRAIN = 1 << 17
#: Elements per thread before a compiled kernel (gpuplan.host_kernels: one GIL-free call per
#: part) is split: ~45 us of the LayerNorm forward kernel. A [1024, 128] LayerNorm (~45 us
#: forward, ~75 us backward on one thread) gained nothing from two threads on the 2-core VM,
#: and the small-GPT step at two threads went 56.9 -> 54.7 ms with this grain instead of
#: 1 << 15 (settings alternated step by step in one process).
KERNEL_GRAIN = 1 << 17

_lock = threading.Lock()
_workers: list[_Worker] = []


#: Polls (about 0.5 us each) a waiting side spins before it sleeps: a worker waiting for its
#: next part, or the caller waiting for a worker's part to end. On the 2-core benchmark VM a
#: sleeping thread took ~50 us to wake (a queue ping-pong: median 57 us, polling 6 us); a
#: small-GPT training step splits 70 ops, 98% of them less than 1 ms after the previous one
#: ended. So the threads poll for ~1 ms (GIL released, yielding the CPU between polls:
#: gpuplan.host_kernels.wait_until) before they sleep.
SPIN_POLLS = 2000
#: Polls a waiting side still spins after its flag is set, before it takes the GIL back. The
#: side that set the flag holds the GIL until its own GIL-free call starts (a few us of
#: Python): a thread asking for a held GIL sleeps, and on the VM waking it took ~25 us. So
#: a worker got to its part ~35 us after it was posted, ~10 us with these polls (a
#: [1024, 128] LayerNorm split over two threads: 92 -> 68 us; the small-GPT step at two
#: threads 70.4 -> 68.3 ms, alternating settings step by step in one process).
SETTLE_POLLS = 10
#: Flags of a _Worker: tasks posted, tasks finished, and the settle polls of each side (the
#: worker's is set by the poster with each task: a caller whose own part starts with more
#: Python than usual, such as a whole plan call, asks the worker to settle longer).
_POSTED, _FINISHED, _WORKER_SETTLE, _CALLER_SETTLE = range(4)


def _wait(flags: np.ndarray, index: int, value: int, settle: int) -> bool:
    """Whether flags[index] reached `value` within SPIN_POLLS polls, then flags[settle]
    more (False at once without the compiled kernels: the caller then sleeps on its
    condition)."""
    k = host_jit.kernels()
    wait_until = None if k is None else k.wait_until
    return wait_until is not None and wait_until(flags, index, value, SPIN_POLLS, settle)


class _Worker:
    """A daemon thread running one (fn, start, stop, errors) task at a time.

    `post` stores the task and bumps flags[_POSTED]; the worker polls for it (`_wait`), then
    sleeps on `cond`, woken by `post` only when it sleeps. When the task ends (its exception,
    or None, in `error`), the worker sets flags[_FINISHED] to flags[_POSTED]; `join` polls
    for that, then sleeps on `cond` likewise. Only the caller writes flags[_POSTED] (and the
    settle polls), only the worker flags[_FINISHED];
    the sleeping flags are read and written under the GIL, and each side re-checks its flag
    under `cond` before it waits, so no wake-up is lost."""

    def __init__(self) -> None:
        self.flags = np.zeros(4, np.int64)  # _POSTED, _FINISHED, _WORKER/_CALLER_SETTLE
        self.task: tuple | None = None
        self.error: BaseException | None = None
        self.cond = threading.Condition(threading.Lock())
        self.sleeping = False  # the worker waits on cond for a task
        self.joining = False   # the caller waits on cond for the task to end
        threading.Thread(target=self._loop, name="gpuplan-host", daemon=True).start()

    def post(self, task: tuple, settle: int) -> None:
        self.task, self.error = task, None
        self.flags[_WORKER_SETTLE] = settle
        self.flags[_POSTED] += 1
        if self.sleeping:
            with self.cond:
                self.cond.notify_all()

    def join(self) -> BaseException | None:
        """Wait until the posted task has ended; returns its exception or None."""
        posted = int(self.flags[_POSTED])
        self.flags[_CALLER_SETTLE] = SETTLE_POLLS
        if not _wait(self.flags, _FINISHED, posted, _CALLER_SETTLE):
            with self.cond:
                self.joining = True
                while self.flags[_FINISHED] != posted:
                    self.cond.wait()
                self.joining = False
        return self.error

    def _loop(self) -> None:
        done = 0
        while True:
            want = done + 1
            if not _wait(self.flags, _POSTED, want, _WORKER_SETTLE):
                with self.cond:
                    self.sleeping = True
                    while self.flags[_POSTED] != want:
                        self.cond.wait()
                    self.sleeping = False
            fn, start, stop, errors = self.task
            try:
                with np.errstate(**errors):
                    fn(start, stop)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
                self.error = exc
            done = want
            self.task = None
            self.flags[_FINISHED] = done
            if self.joining:
                with self.cond:
                    self.cond.notify_all()


def split(n: int, parts: int, align: int = 1) -> list[int]:
    """Boundaries [0, ..., n] of `parts` contiguous pieces of range(n) whose inner
    boundaries are multiples of `align` (fewer pieces when n is short)."""
    units = -(-n // align)
    parts = max(1, min(parts, units))
    return [min(n, (units * k // parts) * align) for k in range(parts)] + [n]


def parallel_for(n: int, fn: Callable[[int, int], None], grain: int = 1,
                 align: int = 1, settle: int | None = None) -> None:
    """fn(start, stop) over contiguous parts of range(n), at least `grain` long and aligned
    to `align`, on up to thread_budget() threads; returns when every part is done and
    re-raises the first exception. `settle`: the workers' settle polls (None:
    SETTLE_POLLS)."""
    parts = n // max(1, grain)
    if parts > 1:  # (a small problem does not ask for the budget)
        parts = min(host.thread_budget(), parts)
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
        error = None
        with host.blas_on_caller():  # the parts may call BLAS: one thread each
            for k, w in enumerate(busy, start=1):
                w.post((fn, bounds[k], bounds[k + 1], errors),
                       SETTLE_POLLS if settle is None else settle)
            try:
                fn(bounds[0], bounds[1])
            except BaseException as exc:  # noqa: BLE001 - the workers must finish first
                error = exc
            for w in busy:
                exc = w.join()
                error = error or exc
        if error is not None:
            raise error
    finally:
        _lock.release()


def block_rows(row: int) -> int:
    """Rows of `row` elements in one BLOCK (at least one)."""
    return max(1, BLOCK // max(1, row))


def for_blocks(n: int, fn: Callable[[int, int], None], row: int = 1, group: int = 1,
               rows_per_block: int | None = None, grain: int | None = None) -> None:
    """fn(lo, hi) for each block [lo, hi) of range(n), n rows of `row` elements, spread over
    the threads when there are `grain` elements or more per thread (None: GRAIN, for
    chains of NumPy passes; KERNEL_GRAIN for a compiled kernel). Blocks are whole groups of `group`
    rows, BLOCK elements (BIG_BLOCK when split) or `rows_per_block` rows: pass that when the
    result depends on the blocks (block k then starts at k * rows_per_block whatever the
    thread count)."""
    row = max(1, row)
    grain = max(1, (GRAIN if grain is None else grain) // row)
    size = rows_per_block
    if size is None:
        shared = n // grain > 1 and host.thread_budget() > 1
        size = group * max(1, (BIG_BLOCK if shared else BLOCK) // (row * group))
    if n <= size and n < 2 * grain:  # one block, on this thread
        if n > 0:
            fn(0, n)
        return

    def part(start: int, stop: int) -> None:
        for lo in range(start, stop, size):
            fn(lo, min(lo + size, stop))

    parallel_for(n, part, grain, align=size)



def _forget_workers() -> None:  # a forked child has the pool's list but not its threads
    global _lock
    _workers.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)
