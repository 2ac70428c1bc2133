"""NCCL collectives under the watchdog, with a stub NCCL communicator (no GPU or NCCL here):
a collective whose completion event never fires is reported in one line, the NCCL
communicator is aborted (ncclCommAbort), then the job; finished ones are forgotten. Also
the pipe drain that keeps a watchdog line from being lost to the abort."""

from __future__ import annotations

import collections
import os
import re
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from dist import nccl_backend, watchdog
from dist.watchdog import Watchdog

LABEL = "NCCL communicator of world ranks [0, 1]"


class _StubNcclComm:
    """cupy.cuda.nccl.NcclCommunicator's calls, recorded; abort() as ncclCommAbort."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.aborted = False

    def __getattr__(self, name: str):
        if name in ("allReduce", "allGather", "reduceScatter", "bcast"):
            return lambda *args: self.calls.append(name)
        raise AttributeError(name)

    def abort(self) -> None:
        self.aborted = True


class _StubTransport(nccl_backend.NcclTransport):
    """The real NcclTransport methods over a stub communicator, stream and events: an
    event is done when `done()` says so."""

    def __init__(self, done) -> None:  # no NCCL: skip the real set-up
        self.comm, self.label, self._done = _StubNcclComm(), LABEL, done
        self._dtypes, self._ops = {np.dtype(np.float32): 7}, {"sum": 0, "max": 1}

    @staticmethod
    def _stream():
        return SimpleNamespace(ptr=0)

    def _event_after(self, stream):
        return self._done


def _array(n: int = 4):
    return SimpleNamespace(data=SimpleNamespace(ptr=4096), size=n, dtype=np.float32)


@pytest.fixture(autouse=True)
def _own_queue(monkeypatch):
    """A queue of this test's own: a stuck stub entry must not reach any other watchdog."""
    monkeypatch.setattr(watchdog, "_DEVICE_WORK", collections.deque())


def test_a_collective_that_never_completes_is_reported_and_aborted(capfd):
    ended = threading.Event()
    nccl = _StubTransport(lambda: False)  # the collective's event never fires
    dog = Watchdog(0.2, rank=1, size=2, abort=lambda code: ended.set(), poll=0.02).start()
    try:
        start = time.monotonic()
        nccl.all_reduce(_array(), _array(), "sum")  # returns at once: NCCL only enqueues
        assert nccl.comm.calls == ["allReduce"] and not ended.is_set()
        assert ended.wait(5)
        waited = time.monotonic() - start
    finally:
        dog.stop()
    assert 0.2 <= waited < 2
    assert nccl.comm.aborted  # ncclCommAbort before the job's abort
    line = capfd.readouterr().err.strip()
    assert re.fullmatch(r"\[rank 1/2\] watchdog: all_reduce on NCCL communicator of world "
                        r"ranks \[0, 1\] waited 0\.\d\d s, over the 0\.2 s timeout \(.*\); "
                        r"aborting the MPI job", line), line


def test_every_collective_is_watched_and_finished_ones_are_forgotten():
    finished = [False]
    nccl = _StubTransport(lambda: finished[0])
    aborted: list[int] = []
    dog = Watchdog(5, abort=aborted.append)
    nccl.all_reduce(_array(), _array(), "max")
    nccl.all_gather(_array(), _array(8))
    nccl.reduce_scatter(_array(8), _array(), "sum")
    nccl.broadcast(_array(), root=1)
    assert [w[1] for w in watchdog.device_work()] == ["all_reduce", "all_gather",
                                                      "reduce_scatter", "broadcast"]
    assert watchdog.device_work()[-1][2:] == (LABEL, 1)  # bcast names its root
    now = time.monotonic()
    assert dog.check(now + 4) is False  # within the timeout
    finished[0] = True
    assert dog.check(now + 100) is False and watchdog.device_work() == []
    assert aborted == [] and not nccl.comm.aborted


def test_the_message_names_the_root_of_a_stuck_broadcast(capfd):
    nccl = _StubTransport(lambda: False)
    aborted: list[int] = []
    dog = Watchdog(1, rank=0, size=2, abort=aborted.append)
    nccl.broadcast(_array(), root=1)
    assert dog.check(time.monotonic() + 2) is True and aborted == [1] and nccl.comm.aborted
    assert f"watchdog: broadcast (root rank 1) on {LABEL} waited" in capfd.readouterr().err


def test_nccl_label_names_world_ranks(world):
    assert nccl_backend.nccl_label(world.mpi_comm) == (
        f"NCCL communicator of world ranks {list(range(world.size))}")


def test_wait_until_read_waits_for_the_reader_of_a_pipe():
    """emit's drain: the line must have left the pipe (to mpiexec's proxy) before abort."""
    r, w = os.pipe()
    try:
        os.write(w, b"watchdog line\n")
        start = time.monotonic()
        assert watchdog.wait_until_read(w, 0.1) is False  # nobody reads it
        assert 0.1 <= time.monotonic() - start < 1
        reader = threading.Timer(0.05, os.read, (r, 100))
        reader.start()
        assert watchdog.wait_until_read(w, 5) is True
        reader.join()
        assert watchdog.wait_until_read(w, 0) is True  # empty pipe: at once
    finally:
        os.close(r)
        os.close(w)


def test_emit_writes_one_line_and_returns_once_it_is_read(capfd):
    watchdog.emit("[rank 0/2] watchdog: a test line")
    assert capfd.readouterr().err == "[rank 0/2] watchdog: a test line\n"


def test_broadcast_is_split_into_calls_of_at_most_bcast_chunk_elements(monkeypatch):
    """CuPy's bcast binding takes a C int count: a larger buffer goes in several calls, each
    at its own offset, one watch for the whole broadcast."""
    calls = []
    nccl = _StubTransport(lambda: True)
    nccl.comm = SimpleNamespace(bcast=lambda *args: calls.append(args))
    monkeypatch.setattr(_StubTransport, "BCAST_CHUNK", 4)
    nccl.broadcast(_array(10), root=1)  # float32: 4 bytes an element, at address 4096
    assert calls == [(4096, 4, 7, 1, 0), (4096 + 16, 4, 7, 1, 0), (4096 + 32, 2, 7, 1, 0)]
    assert [w[1] for w in watchdog.device_work()] == ["broadcast"]
    calls.clear()
    nccl.broadcast(_array(4), root=0)
    assert calls == [(4096, 4, 7, 0, 0)]
    assert nccl_backend.NcclTransport.BCAST_CHUNK == 2**31 - 1


def test_the_watchdog_thread_queries_events_on_the_ranks_device(monkeypatch):
    """A new thread's CUDA calls go to device 0: the event query made in the watchdog thread
    first makes the recording rank's device that thread's device."""
    current = {"main": 2}

    def who() -> str:
        return "main" if threading.current_thread() is threading.main_thread() else "watch"

    class Event:
        def __init__(self, **kw):
            pass

        def record(self, stream):
            pass

        @property
        def done(self):
            seen.append(current.get(who(), 0))
            return True

    runtime = SimpleNamespace(getDevice=lambda: current.get(who(), 0),
                              setDevice=lambda d: current.__setitem__(who(), d))
    cuda = SimpleNamespace(Event=Event, runtime=runtime)
    monkeypatch.setattr(nccl_backend.backend, "cupy_module",
                        lambda: SimpleNamespace(cuda=cuda))
    seen: list[int] = []
    done = nccl_backend.NcclTransport._event_after(SimpleNamespace(ptr=0))
    thread = threading.Thread(target=done)
    thread.start()
    thread.join()
    assert seen == [2] and current == {"main": 2, "watch": 2}
