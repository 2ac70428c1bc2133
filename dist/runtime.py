"""dist.init(): MPI start-up, one GPU per local rank, and no hung job: abort on an uncaught
exception, a watchdog on every blocking MPI call, and a bounded wait at exit."""

from __future__ import annotations

import atexit
import os
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any

from dist.communicator import Communicator
from dist.watchdog import (
    Watchdog,
    barrier_with_deadline,
    resolve_timeout,
    wait_until_read,
    watched,
)
from gpuplan import backend as gpb
from gpuplan import launcher

_WORLD: Communicator | None = None
_LOCAL_RANK: int | None = None
_PREVIOUS_EXCEPTHOOK: Any = None
_WATCHDOG: Watchdog | None = None
_EXIT_COMM: Any = None  # a duplicate of MPI_COMM_WORLD for the exit barrier alone
_EXIT_PID: int | None = None  # the process that registered the exit hook (not a fork child)
_ABORT_STATUS = 0  # the status `python -m mpi4py` will MPI_Abort with at exit (0: none)


def init(backend: str | None = None, *, set_device: bool = True,
         abort_on_exception: bool = True, timeout: float | None = None) -> Communicator:
    """Initialise MPI and return the world Communicator (idempotent: later calls return it).

    backend: None (auto, or $GPUPLAN_DIST_BACKEND), "mpi-cuda-aware",
    "mpi-host-staged", "mpi-host" or "nccl". With a CUDA device, the local rank (rank
    within the node, from an MPI_COMM_TYPE_SHARED split) uses device
    `local_rank % device_count`. `abort_on_exception` installs a sys.excepthook that
    prints the traceback tagged with the rank and calls MPI_Abort, so an uncaught error on
    one rank ends the whole job instead of leaving the others blocked in a collective.

    With more than one rank, no job hangs: `timeout` (seconds; default
    $GPUPLAN_COLLECTIVE_TIMEOUT, else 600; 0: no limit; a later call may change it) bounds
    every blocking call of a Communicator (see dist.watchdog), and a rank that leaves the
    program (returns, sys.exit) waits at most that long for the others to leave too before
    it aborts the job, so an early exit cannot leave them blocked forever.
    """
    global _WORLD
    if _WORLD is not None:
        if timeout is not None:
            set_timeout(timeout)
        return _WORLD
    seconds = resolve_timeout(timeout)
    from mpi4py import MPI

    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    world = MPI.COMM_WORLD
    if world.Get_size() > 1:
        _start_watchdog(seconds, world.Get_rank(), world.Get_size())
    local_rank()
    if set_device and gpb.device_count():
        gpb.use_device(local_rank() % gpb.device_count())
    if abort_on_exception:
        install_abort_excepthook()
    if world.Get_size() > 1:
        install_exit_hook()
    _WORLD = Communicator(world, backend=backend)
    return _WORLD


def collective_timeout() -> float:
    """Seconds a blocking MPI call (and the exit hook) may wait; 0: no limit."""
    return _WATCHDOG.timeout if _WATCHDOG is not None else resolve_timeout(None)


def set_timeout(seconds: float) -> None:
    """Change the limit of the watchdog and of the exit hook (0: no limit)."""
    seconds = resolve_timeout(seconds)
    if _WATCHDOG is None:
        return
    _WATCHDOG.timeout = seconds
    _WATCHDOG.start()  # no-op when running or when the limit is 0


def is_initialized() -> bool:
    return _WORLD is not None


def world() -> Communicator:
    """The world Communicator of init() (calling init() when it has not run yet)."""
    return _WORLD if _WORLD is not None else init()


def local_rank() -> int:
    """This process's rank among the processes sharing its node."""
    global _LOCAL_RANK
    if _LOCAL_RANK is None:
        from mpi4py import MPI

        node = watched("split_type", "world", None, MPI.COMM_WORLD.Split_type,
                       MPI.COMM_TYPE_SHARED, MPI.COMM_WORLD.Get_rank())
        _LOCAL_RANK = node.Get_rank()
        node.Free()
    return _LOCAL_RANK


def install_abort_excepthook() -> None:
    """Make an uncaught exception print its traceback and MPI_Abort the job (no hang)."""
    global _PREVIOUS_EXCEPTHOOK
    if _PREVIOUS_EXCEPTHOOK is not None:
        return
    _PREVIOUS_EXCEPTHOOK = sys.excepthook
    sys.excepthook = _abort_excepthook


def _abort_excepthook(exc_type: Any, exc: BaseException, tb: Any) -> None:
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    size = MPI.COMM_WORLD.Get_size()
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    sys.stderr.write(f"[rank {rank}/{size}] uncaught {exc_type.__name__}; aborting the MPI job\n"
                     f"{text}")
    sys.stderr.flush()
    if size > 1:
        wait_until_read(2, 2.0)  # mpiexec's proxy has the report before the abort kills us
        MPI.COMM_WORLD.Abort(1)
    _PREVIOUS_EXCEPTHOOK(exc_type, exc, tb)


def _start_watchdog(seconds: float, rank: int, size: int) -> None:
    global _WATCHDOG
    if _WATCHDOG is None:
        _WATCHDOG = Watchdog(seconds, rank=rank, size=size)
    _WATCHDOG.timeout = seconds
    _WATCHDOG.start()


def install_exit_hook() -> None:
    """Make a rank that leaves the program wait (at most the timeout) for every rank to
    leave, then let MPI finalize; past the timeout, one line and MPI_Abort.

    atexit runs it before mpi4py's MPI_Finalize. It waits on its own duplicate of the world
    communicator, so it never matches a barrier of ranks still running. A rank that exits
    early therefore cannot hang the others: they are blocked in a watched call (watchdog)
    or reach their own exit hook, and whichever limit expires first aborts the job.
    """
    global _EXIT_COMM, _EXIT_PID
    if _EXIT_COMM is not None:
        return
    from mpi4py import MPI

    _EXIT_COMM = watched("dup", "world", None, MPI.COMM_WORLD.Dup)
    _EXIT_PID = os.getpid()
    _record_mpi4py_abort_status(MPI)
    atexit.register(_wait_for_every_rank_at_exit)


def _wait_for_every_rank_at_exit() -> None:
    from mpi4py import MPI

    if os.getpid() != _EXIT_PID or MPI.Is_finalized():
        return  # a fork child, or a program that finalized MPI itself
    if _ABORT_STATUS:  # python -m mpi4py calls MPI_Abort right after this hook
        # No line here: the program chose its exit status (and said why); mpiexec merges the
        # ranks' stderr without line atomicity, so an extra line here could split that one.
        return
    limit = collective_timeout()
    if not limit:
        return
    start = time.monotonic()
    if barrier_with_deadline(_EXIT_COMM, limit):
        return
    _WATCHDOG.expire("exit (waiting for the other ranks to finish)", "world", None,
                     time.monotonic() - start)


def _record_mpi4py_abort_status(MPI: Any) -> None:
    """`python -m mpi4py` passes a non-zero SystemExit code to MPI._set_abort_status and
    calls MPI_Abort with it at exit (after atexit handlers): note it, so that the exit hook
    lets that abort happen at once instead of first waiting for the other ranks."""
    original = getattr(MPI, "_set_abort_status", None)
    if original is None or getattr(original, "records_for_dist", False):
        return

    def set_abort_status(status: int) -> None:
        global _ABORT_STATUS
        _ABORT_STATUS = status
        original(status)

    set_abort_status.records_for_dist = True
    MPI._set_abort_status = set_abort_status


def mpi_library() -> str:
    """First line of the MPI library mpi4py is built on (MPI_Get_library_version)."""
    from mpi4py import MPI

    return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def launcher_mismatch(world_size: int, env: Mapping[str, str] | None = None,
             library: str | None = None) -> str | None:
    """The one-line error when the launcher started N > 1 processes but MPI sees a world of
    `world_size` == 1 (launcher and mpi4py from different MPI libraries); else None."""
    launch = launcher.detect(env)
    if launch.size is None or launch.size <= 1 or world_size != 1:
        return None
    library = mpi_library() if library is None else library
    return (f"the launcher ({launch.launcher}: {launch.size_var}={launch.size}) started "
            f"{launch.size} processes, but mpi4py's MPI ({library}) sees a world of 1 rank in "
            f"each: the launcher and mpi4py come from different MPI libraries, and every copy "
            f"would train alone into the same --out; launch with the mpiexec of mpi4py's MPI "
            f"(.venv/bin/mpiexec for the PyPI mpich) or build mpi4py against the launcher's MPI "
            f"(pip install --no-binary mpi4py mpi4py)")
