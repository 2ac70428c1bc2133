"""Run-time detection of a CUDA-aware MPI library (info key, MPIX queries, environment)."""

from __future__ import annotations

import ctypes
import functools
import os

ENV_OVERRIDE = "GPUPLAN_CUDA_AWARE_MPI"

#: Environment variables by which common MPI stacks announce (or enable) CUDA support.
_VENDOR_ENV = {
    "MPICH_GPU_SUPPORT_ENABLED": ("1",),
    "MV2_USE_CUDA": ("1",),
    "OMPI_MCA_opal_cuda_support": ("1", "true", "yes"),
}

_MPIX_GPU_SUPPORT_CUDA = 0  # MPICH's MPIX_GPU_SUPPORT_CUDA enumerator


def loaded_mpi_libraries() -> list[str]:
    """Paths of the libmpi shared objects mapped into this process (Linux /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    paths = {line.split()[-1] for line in lines if "libmpi" in line and "/" in line}
    return sorted(p for p in paths if os.path.basename(p).startswith("libmpi"))


def _info_key_says_cuda() -> bool | None:
    from mpi4py import MPI

    try:
        info = MPI.COMM_WORLD.Get_info()
    except MPI.Exception:
        return None
    try:
        kinds = info.Get("mpi_memory_alloc_kinds")
    finally:
        info.Free()
    if kinds is None:
        return None
    return any(kind.strip().startswith("cuda") for kind in kinds.lower().split(","))


def _mpix_query_says_cuda() -> bool | None:
    """Open MPI's MPIX_Query_cuda_support() or MPICH's MPIX_GPU_query_support(CUDA, &flag)."""
    answer = None
    for path in loaded_mpi_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "MPIX_Query_cuda_support"):
            lib.MPIX_Query_cuda_support.restype = ctypes.c_int
            if lib.MPIX_Query_cuda_support() == 1:
                return True
            answer = False
        if hasattr(lib, "MPIX_GPU_query_support"):
            flag = ctypes.c_int(0)
            rc = lib.MPIX_GPU_query_support(_MPIX_GPU_SUPPORT_CUDA, ctypes.byref(flag))
            if rc == 0 and flag.value:
                return True
            answer = False
    return answer


def _vendor_env_says_cuda() -> bool:
    return any(os.environ.get(k, "").lower() in v for k, v in _VENDOR_ENV.items())


@functools.lru_cache(maxsize=1)
def cuda_aware_mpi() -> tuple[bool, str]:
    """(is the MPI library CUDA-aware, which check decided). Needs MPI initialised.

    Order: the GPUPLAN_CUDA_AWARE_MPI=0/1 override, the MPI 4.1 `mpi_memory_alloc_kinds`
    info key, MPIX_Query_cuda_support / MPIX_GPU_query_support on the loaded libmpi, then
    vendor environment variables. Anything else: not CUDA-aware (host staging is safe).
    """
    override = os.environ.get(ENV_OVERRIDE)
    if override is not None and override.strip() != "":
        if override.strip() not in ("0", "1"):
            raise ValueError(f"{ENV_OVERRIDE}: expected '0' or '1', given {override!r}")
        return override.strip() == "1", ENV_OVERRIDE
    if _info_key_says_cuda():
        return True, "mpi_memory_alloc_kinds"
    if _mpix_query_says_cuda():
        return True, "MPIX query"
    if _vendor_env_says_cuda():
        return True, "vendor environment"
    return False, "no CUDA support reported"
