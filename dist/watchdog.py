"""Watchdog: a deadline on every blocking MPI call; past it, one line on stderr and MPI_Abort.

A blocking MPI call cannot be interrupted from Python, so a daemon thread watches them.
Each call runs inside `watched(op, comm, peer, fn, *args)`, which records (start, op,
communicator, peer) in a dict keyed by thread (about 0.5 us here: no lock, no system
call). The thread wakes every `poll` seconds and, when a call has waited longer than the
timeout, writes one line (rank, op, peer or communicator, seconds waited, where it was
called) and calls MPI_Abort, which makes mpiexec kill every rank, a SIGSTOPped one included.
This works because mpi4py releases the GIL inside MPI calls and dist.init asks for
MPI_THREAD_MULTIPLE (without it the thread ends this process with os._exit, which mpiexec
also treats as a failed job).

Non-blocking calls polled against a deadline (Iallreduce + Test) were the alternative: not
taken because mpi4py has no non-blocking form of the pickled-object collectives (bcast,
allgather, gather), MPICH's non-blocking collectives are slower than its blocking ones for
small messages (Iallreduce+Wait about 2 to 4 us above Allreduce on 2 ranks here), and a
Python Test loop holds the GIL and a core while it spins.

Non-blocking MPI collectives (Communicator.iall_reduce) are noted when issued
(`watch_request`) and their wait runs under `watched` like a blocking call; a report names
the requests still outstanding, the usual cause of a peer stuck in a later call.

NCCL collectives do not block: they enqueue a kernel and return, and a hang shows up at a
later stream synchronization. `watch_device_work` puts each one under the same deadline, as
PyTorch's NCCL watchdog does: the transport records a CUDA event after the collective and
registers it; the thread queries the oldest unfinished events and, past the timeout, writes
the same one line, aborts the NCCL communicator (ncclCommAbort) and then the MPI job.

The line always comes out before the abort: written to fd 2 in one os.write, then the
watchdog waits (at most 2 s) until mpiexec's proxy has read it out of the pipe (FIONREAD is
0): MPI_Abort kills the job at once, and bytes left in the pipe died with it.

Timeout: `init(timeout=...)`, else $GPUPLAN_COLLECTIVE_TIMEOUT (seconds), else 600; 0 turns
the watchdog off. The same bound applies to the exit hook of dist.runtime.
"""

from __future__ import annotations

import array
import collections
import fcntl
import itertools
import math
import os
import stat
import sys
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

ENV_TIMEOUT = "GPUPLAN_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT = 600.0

_monotonic = time.monotonic
_get_ident = threading.get_ident

#: thread id -> (start, op, communicator, peer) of the MPI call that thread is inside.
_ARMED: dict[int, tuple[float, str, Any, Any]] = {}

#: Device work in flight (NCCL collectives), oldest first: (start, op, communicator, peer,
#: is_done, abort_transport), added by `watch_device_work`.
_DEVICE_WORK: collections.deque[tuple] = collections.deque()
_DEVICE_LOCK = threading.Lock()  # the caller appends while the watchdog thread prunes

# How the peer of an op reads in the message ("recv from rank 1", "bcast_object (root rank 0)").
_TO_PEER = ("send", "isend")
_FROM_PEER = ("recv", "recv_array")
_HERE = os.path.dirname(os.path.abspath(__file__))
_OWN_FILES = (os.path.join(_HERE, "watchdog.py"), os.path.join(_HERE, "communicator.py"))


def resolve_timeout(timeout: float | None = None) -> float:
    """Seconds a blocking MPI call may wait: `timeout`, else $GPUPLAN_COLLECTIVE_TIMEOUT,
    else 600. 0 means no limit (the watchdog is off). Raises ValueError otherwise."""
    source, given = "timeout", timeout
    if timeout is None:
        given = os.environ.get(ENV_TIMEOUT, "").strip()
        if not given:
            return DEFAULT_TIMEOUT
        source = ENV_TIMEOUT
        try:
            timeout = float(given)
        except ValueError:
            timeout = math.nan
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or math.isnan(timeout) or timeout < 0:
        raise ValueError(f"{source}: expected seconds (a number >= 0, 0: no limit), "
                         f"given {given!r}")
    return float(timeout)


def watched(op: str, comm: Any, peer: int | None, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), with this thread marked as blocked in `op` on `comm` (a Communicator, or
    a label such as "world"; peer: a rank of comm or None) for as long as fn runs, so that
    the watchdog can abort a call that never ends."""
    ident = _get_ident()
    outer = _ARMED.get(ident)
    _ARMED[ident] = (_monotonic(), op, comm, peer)
    try:
        return fn(*args)
    finally:
        if outer is None:
            del _ARMED[ident]
        else:
            _ARMED[ident] = outer


def watch_device_work(op: str, comm: Any, peer: int | None, is_done: Callable[[], bool],
                      abort_transport: Callable[[], Any] | None = None) -> None:
    """Put asynchronous device work (an NCCL collective enqueued on a stream) under the
    watchdog: `is_done()` (e.g. a CUDA event's query) tells whether it finished; past the
    timeout the watchdog reports `op` on `comm` and calls `abort_transport()` (e.g.
    ncclCommAbort) before aborting the job. Finished work at the front is dropped here, so
    the queue stays as long as the work in flight."""
    with _DEVICE_LOCK:
        while _DEVICE_WORK and _DEVICE_WORK[0][4]():
            _DEVICE_WORK.popleft()
        _DEVICE_WORK.append((_monotonic(), op, comm, peer, is_done, abort_transport))


def device_work() -> list[tuple[float, str, Any, Any]]:
    """The (start, op, communicator, peer) of every watched device work still queued."""
    with _DEVICE_LOCK:
        return [w[:4] for w in _DEVICE_WORK]


#: Non-blocking MPI requests issued and not yet waited: token -> (issued, op, comm, peer).
_REQUESTS: dict[int, tuple[float, str, Any, Any]] = {}
_request_tokens = itertools.count()


def watch_request(op: str, comm: Any, peer: int | None) -> int:
    """Note a non-blocking request just issued (e.g. an MPI_Iallreduce); returns the token
    for `unwatch_request`. Its wait runs under `watched`, which bounds it; meanwhile the
    watchdog's report of any call that times out counts the requests still outstanding."""
    token = next(_request_tokens)
    _REQUESTS[token] = (_monotonic(), op, comm, peer)
    return token


def unwatch_request(token: int | None) -> None:
    if token is not None:
        _REQUESTS.pop(token, None)


def outstanding_requests() -> list[tuple[float, str, Any, Any]]:
    """The (issued, op, communicator, peer) of every non-blocking request not yet waited."""
    return list(_REQUESTS.values())


def armed_calls() -> list[tuple[float, str, Any, Any]]:
    """The (start, op, communicator, peer) of every watched call in progress."""
    return list(_ARMED.values())


class Watchdog:
    """Daemon thread that aborts the job when a watched call waits longer than `timeout` s.

    rank, size: this process in the world (for the message). abort(code): what ends the job
    (default `abort_job`). poll: seconds between checks (default timeout / 20, in
    [0.05, 1]), so a call is caught between timeout and timeout + poll seconds.
    """

    def __init__(self, timeout: float, *, rank: int = 0, size: int = 1,
                 abort: Callable[[int], Any] | None = None, poll: float | None = None) -> None:
        self.timeout = resolve_timeout(timeout)
        self.rank, self.size = rank, size
        self._abort = abort if abort is not None else abort_job
        self._poll = poll
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def poll(self) -> float:
        if self._poll is not None:
            return self._poll
        return min(1.0, max(0.05, self.timeout / 20)) if self.timeout else 1.0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Watchdog:
        """Start the thread (once; not when the timeout is 0)."""
        if self.timeout and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpuplan-watchdog",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            self.check()

    def check(self, now: float | None = None) -> bool:
        """Abort (and return True) if a watched call has waited longer than the timeout."""
        if not self.timeout:
            return False
        now = _monotonic() if now is None else now
        for ident, (start, op, comm, peer) in tuple(_ARMED.items()):
            if now - start > self.timeout:
                self.expire(op, comm, peer, now - start, where=_call_site(ident))
                return True
        return self._check_device_work(now)

    def _check_device_work(self, now: float) -> bool:
        """Drop finished device work from the front; expire the oldest unfinished one past
        the deadline (work on one stream finishes in order, so it is the one to report)."""
        with _DEVICE_LOCK:
            while _DEVICE_WORK and _DEVICE_WORK[0][4]():
                _DEVICE_WORK.popleft()
            oldest = _DEVICE_WORK[0] if _DEVICE_WORK else None
        if oldest is None or now - oldest[0] <= self.timeout:
            return False
        start, op, comm, peer, _, abort_transport = oldest
        self.expire(op, comm, peer, now - start, before_abort=abort_transport)
        return True

    def expire(self, op: str, comm: Any, peer: int | None, waited: float,
               where: str | None = None, before_abort: Callable[[], Any] | None = None) -> None:
        """Write the one-line report (out of this process before anything else), then
        `before_abort()` if given (e.g. ncclCommAbort), then end the job."""
        emit(self.describe(op, comm, peer, waited, where))
        if before_abort is not None:
            try:
                before_abort()
            except Exception:  # noqa: BLE001 - the job must end even if the abort fails
                pass
        self._abort(1)

    def describe(self, op: str, comm: Any, peer: int | None, waited: float,
                 where: str | None = None) -> str:
        """`[rank 0/4] watchdog: recv_array from rank 1 on world (4 ranks) waited 3.12 s, over
        the 3 s timeout (...); aborting the MPI job (at pipeline/runner.py:63)`"""
        what = op
        if peer is not None:
            who = _peer_name(comm, peer)
            what = (f"{op} to {who}" if op in _TO_PEER else f"{op} from {who}"
                    if op in _FROM_PEER else f"{op} (root {who})")
        label = comm if isinstance(comm, str) else getattr(comm, "label", None)
        if label == "world":
            label = f"world ({self.size} ranks)"
        at = f" (at {where})" if where else ""
        pending = outstanding_requests()
        if pending:
            first = min(pending, key=lambda r: r[0])
            at += (f"; {len(pending)} non-blocking request{'s' if len(pending) > 1 else ''} "
                   f"outstanding (oldest: {first[1]}, issued {_monotonic() - first[0]:.2f} s "
                   f"ago)")
        return (f"[rank {self.rank}/{self.size}] watchdog: {what} on {label or 'MPI'} waited "
                f"{waited:.2f} s, over the {self.timeout:g} s timeout (${ENV_TIMEOUT} or "
                f"train.py --timeout); aborting the MPI job{at}")


def barrier_with_deadline(mpi_comm: Any, timeout: float) -> bool:
    """Ibarrier on an mpi4py communicator, tested until it completes (True) or `timeout`
    seconds pass (False; 0: no limit). Sleeps between tests (0.1 ms growing to 10 ms)."""
    request = mpi_comm.Ibarrier()
    start, pause = _monotonic(), 1e-4
    while not request.Test():
        if timeout and _monotonic() - start > timeout:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.01)
    return True


def emit(line: str, drain: float = 2.0) -> None:
    """Write one line to file descriptor 2 (no Python-level lock another thread might hold)
    in one write, then wait up to `drain` seconds until a pipe on fd 2 is empty (its reader,
    mpiexec's proxy, has the line): an MPI_Abort right after must not lose it."""
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed or odd stderr must not stop the abort
        pass
    data = (line + "\n").encode(errors="replace")
    while data:  # one write unless the pipe is nearly full; the rest follows at once
        data = data[os.write(2, data):]
    wait_until_read(2, drain)


def wait_until_read(fd: int, limit: float) -> bool:
    """For a pipe on `fd`: wait (at most `limit` s) until its reader has taken every byte
    (FIONREAD 0); True when it has. Anything else (a terminal, a file): True at once."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return True
        left = array.array("i", [0])
        for pause in itertools.chain((1e-4, 1e-3), itertools.repeat(5e-3)):
            fcntl.ioctl(fd, termios.FIONREAD, left, True)
            if left[0] == 0:
                return True
            if limit <= 0:
                return False
            time.sleep(pause)
            limit -= pause
    except OSError:
        return True  # no way to tell: nothing more to wait for
    return False


def abort_job(code: int = 1) -> None:
    """MPI_Abort the whole job (mpiexec kills every rank); os._exit when MPI cannot be used
    from this thread, which mpiexec also reports as a failed job and ends."""
    try:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized() and (
                threading.current_thread() is threading.main_thread()
                or MPI.Query_thread() == MPI.THREAD_MULTIPLE):
            MPI.COMM_WORLD.Abort(code)
    finally:
        os._exit(code)


def _peer_name(comm: Any, peer: int) -> str:
    members = getattr(comm, "world_ranks", None)
    if members is not None and 0 <= peer < len(members) and members[peer] != peer:
        return f"rank {peer} (world rank {members[peer]})"
    return f"rank {peer}"


def _call_site(ident: int) -> str | None:
    """file:line where thread `ident` called into the Communicator: the first frame outside
    this module and dist/communicator.py, going out from its innermost `watched` call."""
    frame = sys._current_frames().get(ident)
    while frame is not None and frame.f_code is not watched.__code__:
        frame = frame.f_back
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _OWN_FILES:
        frame = frame.f_back
    if frame is None:
        return None
    parts = frame.f_code.co_filename.replace(os.sep, "/").split("/")
    return f"{'/'.join(parts[-2:])}:{frame.f_lineno}"
