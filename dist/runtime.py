"""dist.init(): MPI start-up, one GPU per local rank, and abort-on-exception for the job."""

from __future__ import annotations

import sys
import traceback
from typing import Any

from dist.communicator import Communicator
from gpuplan import backend as gpb

_WORLD: Communicator | None = None
_LOCAL_RANK: int | None = None
_PREVIOUS_EXCEPTHOOK: Any = None


def init(backend: str | None = None, *, set_device: bool = True,
         abort_on_exception: bool = True) -> Communicator:
    """Initialise MPI and return the world Communicator (idempotent: later calls return it).

    backend: None (auto, or $GPUPLAN_DIST_BACKEND), "mpi-cuda-aware",
    "mpi-host-staged", "mpi-host" or "nccl". With a CUDA device, the local rank (rank
    within the node, from an MPI_COMM_TYPE_SHARED split) uses device
    `local_rank % device_count`. `abort_on_exception` installs a sys.excepthook that
    prints the traceback tagged with the rank and calls MPI_Abort, so an uncaught error on
    one rank ends the whole job instead of leaving the others blocked in a collective.
    """
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    from mpi4py import MPI

    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    world = MPI.COMM_WORLD
    local_rank()
    if set_device and gpb.device_count():
        gpb.use_device(local_rank() % gpb.device_count())
    if abort_on_exception:
        install_abort_excepthook()
    _WORLD = Communicator(world, backend=backend)
    return _WORLD


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

        node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=MPI.COMM_WORLD.Get_rank())
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
        MPI.COMM_WORLD.Abort(1)
    _PREVIOUS_EXCEPTHOOK(exc_type, exc, tb)
