"""Process settings of the NumPy host backend: the allocator and the BLAS thread pool.

`configure()` runs once, when the host stream is first used (`Stream.host()`):

- allocator: glibc serves large blocks (from 128 KiB, a threshold that only adapts as
  mmapped blocks are freed) with fresh mmap pages and trims the heap top after frees, so a
  training step that allocates and frees the same few-MB temporaries in every op pays a
  page fault per 4 KiB page, again and again (a quarter of a small-GPT CPU step on a VM).
  `tune_allocator()` raises both thresholds so that memory stays warm.
- BLAS threads: the host GEMM is NumPy's BLAS (OpenBLAS in NumPy's wheels), whose threads
  spin while they wait for work. Several MPI ranks on one machine, each with a pool as large
  as the machine, oversubscribe the cores and the spinning threads starve the ranks: on two
  cores, four ranks ran a small-GPT step 18x slower than with one thread each.
  `limit_blas_threads()` gives each local rank cores // local ranks threads (at least one)
  when a launcher says how many ranks share the node (MPICH/Hydra's MPI_LOCALNRANKS, Open
  MPI's OMPI_COMM_WORLD_LOCAL_SIZE, srun's SLURM_STEP_TASKS_PER_NODE), or srun's
  SLURM_CPUS_PER_TASK threads (gpuplan.launcher.blas_threads). The pools are sized through
  threadpoolctl, which knows OpenBLAS, MKL and BLIS alike.

- thread budget: `thread_budget()` is the number of threads one host op may use at once (the
  NumPy SKUs split their heavy ops over it, gpuplan.host_pool): the BLAS pool's size as set
  above, so the BLAS and the other host ops share one budget per rank. The host GEMMs split
  themselves over these threads too (gpuplan.ops.gemm.host.matmul), with the BLAS library on
  its caller's thread meanwhile (`blas_on_caller`): the BLAS's own workers, which spin
  after each call, then never compete with the ops that follow. NumPy code of the user's
  still gets the BLAS pool as sized here.

- float warnings: `fp_quiet()` / `fp_restore(token)` silence NumPy's overflow, invalid and
  divide-by-zero warnings around an op's NumPy math, as ``np.errstate`` does, for a tenth
  of its cost (~0.3 us instead of ~2-3 us on the VM: for an 8x8 add, errstate was a fifth
  of the whole plan call). NumPy 2 keeps its error state in a context variable: these set
  and reset it directly (np.errstate's own two steps, without its Python frames); where
  NumPy's internals differ, they fall back to np.errstate.

Environment: GPUPLAN_HOST_MALLOC=default leaves the allocator alone; GPUPLAN_HOST_THREADS=N
sets the BLAS pool (and the thread budget) to N threads; an explicit OPENBLAS_NUM_THREADS or
OMP_NUM_THREADS is respected (no automatic limit).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

#: glibc mallopt() parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: The largest mmap threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
_MMAP_THRESHOLD = 32 << 20
_TRIM_THRESHOLD = 512 << 20
_budget: int | None = None  # thread_budget(), once known

try:  # NumPy >= 2: the ufunc error state is a context variable holding an "extobj"
    from numpy._core._ufunc_config import _extobj_contextvar as _FP_STATE
    from numpy._core.umath import _make_extobj as _make_fp_state
except ImportError:  # pragma: no cover - another NumPy layout: np.errstate below
    _FP_STATE = _make_fp_state = None


#: the quiet error state derived from each error state (the dict holds both: their ids stay).
_QUIET: dict[Any, Any] = {}


def fp_quiet() -> Any:
    """Ignore float overflow, invalid and divide-by-zero in this thread (the other settings,
    underflow included, as they are) until `fp_restore` gets the token returned."""
    if _FP_STATE is None:  # pragma: no cover
        state = np.errstate(over="ignore", invalid="ignore", divide="ignore")
        state.__enter__()
        return state
    state = _FP_STATE.get()
    quiet = _QUIET.get(state)
    if quiet is None:  # once per error state in use (the default one, a user's errstate)
        if len(_QUIET) >= 64:
            _QUIET.clear()
        quiet = _QUIET[state] = _make_fp_state(over="ignore", invalid="ignore",
                                               divide="ignore")
    return _FP_STATE.set(quiet)


def fp_restore(token: Any) -> None:
    """Undo the `fp_quiet()` that returned `token`."""
    if _FP_STATE is None:  # pragma: no cover
        token.__exit__(None, None, None)
    else:
        _FP_STATE.reset(token)


def configure() -> None:
    """Apply the host settings (idempotent; see the module docstring)."""
    tune_allocator()
    limit_blas_threads()


@functools.lru_cache(maxsize=1)
def tune_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds so freed NumPy buffers are reused from the heap.
    Returns whether they were changed (False with GPUPLAN_HOST_MALLOC=default or off glibc)."""
    if os.environ.get("GPUPLAN_HOST_MALLOC", "").lower() == "default":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # no mallopt (macOS, Windows): nothing to do
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


@functools.lru_cache(maxsize=1)
def limit_blas_threads() -> int | None:
    """Apply the BLAS thread policy once; returns the thread count set, or None if untouched."""
    env = os.environ
    if env.get("GPUPLAN_HOST_THREADS"):
        try:
            want = int(env["GPUPLAN_HOST_THREADS"])
        except ValueError:
            raise ValueError("GPUPLAN_HOST_THREADS: expected a thread count, given "
                             f"{env['GPUPLAN_HOST_THREADS']!r}") from None
    elif env.get("OPENBLAS_NUM_THREADS") or env.get("OMP_NUM_THREADS"):
        return None
    else:
        from gpuplan import launcher  # stdlib only: reads the launcher's variables

        if launcher.local_ranks() <= 1 and not (
                env.get("SLURM_CPUS_PER_TASK") and launcher.detect().launcher != "none"):
            return None
        want = launcher.blas_threads()
        current = blas_threads()
        if current is not None and current <= want:
            return None
    return want if set_blas_threads(want) else None


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_blas_threads(n: int) -> bool:
    """Size the thread pool of every BLAS loaded in this process (threadpoolctl), and the
    thread budget of the other host ops; False if threadpoolctl finds no BLAS."""
    global _budget
    if n < 1:
        raise ValueError(f"set_blas_threads: expected n >= 1, given {n}")
    _budget = int(n)
    if blas_threads() is None:
        return False
    import threadpoolctl

    threadpoolctl.threadpool_limits(limits=int(n), user_api="blas")  # kept: not a `with`
    return True


def thread_budget() -> int:
    """Threads one host op may use: the BLAS pool's size once the policy has run (else
    GPUPLAN_HOST_THREADS, OPENBLAS_NUM_THREADS / OMP_NUM_THREADS, or the usable cores)."""
    global _budget
    if _budget is None:
        limit_blas_threads()
        if _budget is None:
            _budget = max(1, blas_threads() or _env_threads() or _usable_cores())
    return _budget


def _env_threads() -> int:
    for var in ("GPUPLAN_HOST_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        try:
            return int(os.environ.get(var, "").split(",")[0])
        except ValueError:
            continue
    return 0


def blas_threads() -> int | None:
    """Threads of the (first) BLAS loaded in this process, or None if there is none (or no
    threadpoolctl: a `pip install --no-deps` machine still runs, with BLAS's own pools)."""
    try:
        import threadpoolctl
    except ImportError:
        return None
    for pool in threadpoolctl.threadpool_info():
        if pool.get("user_api") == "blas":
            return int(pool["num_threads"])
    return None


@functools.lru_cache(maxsize=1)
def _blas_pools() -> tuple:
    """threadpoolctl's controllers of the BLAS libraries loaded now (NumPy's among them)."""
    try:
        import threadpoolctl
    except ImportError:
        return ()
    return tuple(threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers)


@contextlib.contextmanager
def blas_on_caller() -> Iterator[None]:
    """BLAS calls made in the block run on their caller's thread alone (~1 µs to switch).

    For host ops that split their work over threads of their own (gpuplan.host_pool): two
    threads calling a multithreaded OpenBLAS at once gain nothing (each call wants the whole
    pool: measured on a batched attention, 2 threads x 2 BLAS threads 2.0 ms, 2 threads x 1
    BLAS thread 1.1 ms, one thread 1.8 ms)."""
    pools = [(p, p.get_num_threads()) for p in _blas_pools()]
    for p, n in pools:
        if n != 1:
            p.set_num_threads(1)
    try:
        yield
    finally:
        for p, n in pools:
            if n != 1:
                p.set_num_threads(n)
