"""What the GPU check's phases run in child processes (the check itself never holds a CUDA
context, so one crashed or hung phase cannot take the others with it):

    python -m benchsuite.gpu_check.workers probe --device cuda --json PATH
    python -m benchsuite.gpu_check.workers compile --device cuda --jobs 16
    python -m benchsuite.gpu_check.workers cuda-paths --json PATH

`probe` describes the machine (device, driver, CuPy, NumPy, torch, mpi4py and its MPI
library); `compile` builds every kernel module for the device (NVRTC through CuPy's kernel
cache on a GPU, the host compiler's build on the emulated device), `jobs` modules at a time,
largest first; `cuda-paths` checks what the emulated device cannot run (cuBLAS, pinned
staging, graph capture with a private pool, events and streams, a one-rank NCCL call) and
measures the copy and matmul ceilings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# -- probe ------------------------------------------------------------------------------------

def probe(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cpus": len(os.sched_getaffinity(0))}
    import numpy

    info["numpy"] = numpy.__version__
    for name in ("ml_dtypes", "numba", "torch", "safetensors", "threadpoolctl", "tqdm"):
        info[name] = _version_of(name)
    try:
        from mpi4py import MPI

        info["mpi4py"] = _version_of("mpi4py")
        info["mpi_library"] = MPI.Get_library_version().strip().splitlines()[0]
    except Exception as exc:  # noqa: BLE001 - reported: the MPI phases use it
        info["mpi4py"] = f"FAILED: {type(exc).__name__}: {exc}"
    if device == "emulated":
        from gpuplan import backend

        info["ok"] = backend.resolve_device("emulated") == "emulated"
        info["device"] = "the emulated device (g++ build of the kernels; no GPU)"
        return info
    try:
        import cupy as cp

        info["cupy"] = cp.__version__
        count = cp.cuda.runtime.getDeviceCount()
        props = cp.cuda.runtime.getDeviceProperties(0)
    except Exception as exc:  # noqa: BLE001 - no CuPy, no driver, no device
        info["ok"] = False
        info["device"] = f"no usable GPU: {type(exc).__name__}: {exc}"
        return info
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    rt, drv = cp.cuda.runtime.runtimeGetVersion(), cp.cuda.runtime.driverGetVersion()
    cc = cp.cuda.Device(0).compute_capability
    info.update(ok=True, gpu_name=name, compute_capability=cc,
                sm_count=props["multiProcessorCount"],
                memory_gib=round(props["totalGlobalMem"] / 2**30, 1),
                l2_mib=round(props.get("l2CacheSize", 0) / 2**20, 1),
                cuda_runtime=f"{rt // 1000}.{rt % 1000 // 10}",
                cuda_driver=f"{drv // 1000}.{drv % 1000 // 10}", device_count=count)
    info["device"] = (f"{name} (sm_{cc}, {props['multiProcessorCount']} SMs, "
                      f"{info['memory_gib']:.0f} GiB); CUDA {info['cuda_runtime']}, driver "
                      f"{info['cuda_driver']}; CuPy {cp.__version__}")
    return info


def _version_of(name: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


# -- compile ----------------------------------------------------------------------------------

def _compile_one(args: tuple[int, str]) -> tuple[str, int, float, str]:
    """Build registry()[index] for `device`: (file, kernels, seconds, error)."""
    index, device = args
    import gpuplan  # noqa: F401 - imports every op family, which declares its CudaModule
    from gpuplan.nvrtc import registry

    mod = registry()[index]
    t0 = time.perf_counter()
    try:
        if device == "emulated":
            from gpuplan.emulator.build import build_module

            build_module(mod.path, mod.name_expressions, mod.options)
        else:
            for name in mod.name_expressions:
                mod.function(name, 0)
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        return mod.path.name, len(mod.name_expressions), time.perf_counter() - t0, \
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    return mod.path.name, len(mod.name_expressions), time.perf_counter() - t0, ""


def compile_all(device: str, jobs: int) -> int:
    import concurrent.futures as cf
    import multiprocessing

    import gpuplan  # noqa: F401
    from gpuplan.nvrtc import registry

    mods = registry()
    order = sorted(range(len(mods)), key=lambda i: -mods[i].path.stat().st_size)
    total = sum(len(m.name_expressions) for m in mods)
    print(f"compiling {len(mods)} modules ({total} kernel instances) for the {device} device, "
          f"{jobs} processes", flush=True)
    t0 = time.perf_counter()
    failures = []
    ctx = multiprocessing.get_context("spawn")  # no CUDA context crosses a fork
    with cf.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx) as pool:
        futures = {pool.submit(_compile_one, (i, device)): mods[i].path.name for i in order}
        for fut in cf.as_completed(futures):
            try:
                name, n, secs, err = fut.result()
            except Exception as exc:  # noqa: BLE001 - a crashed worker process
                name, n, secs, err = futures[fut], 0, 0.0, f"{type(exc).__name__}: {exc}"
            print(f"  {name}: {n} kernels in {secs:.1f} s" + (f"  FAILED: {err}" if err else ""),
                  flush=True)
            if err:
                failures.append(name)
    print(f"compile: {len(mods)} modules, {total} kernel instances, {len(failures)} failed"
          + (f" ({', '.join(sorted(set(failures)))})" if failures else "")
          + f"; {time.perf_counter() - t0:.0f} s with {jobs} processes", flush=True)
    return 1 if failures else 0


# -- cuda-paths -------------------------------------------------------------------------------

def _cupy() -> Any:
    import cupy

    return cupy


def _timed(fn: Callable[[], None], iters: int, warmup: int = 2) -> float:
    """Mean seconds of `fn` over `iters` calls, timed with CUDA events."""
    cp = _cupy()
    for _ in range(warmup):
        fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / 1e3 / iters


def check_copy_ceiling() -> dict[str, Any]:
    """Device-to-device copy of 2 GiB: bytes read plus bytes written per second."""
    cp = _cupy()
    n = 1 << 31
    a = cp.empty(n, cp.uint8)
    b = cp.empty_like(a)
    s = _timed(lambda: b.__setitem__(Ellipsis, a), iters=10)
    return {"copy_gbs": round(2 * n / s / 1e9, 1)}


def check_matmul_ceiling() -> dict[str, Any]:
    """cupy.matmul (cuBLAS) 8192^3 in bf16 and f16 on random data: the MFU denominator."""
    import ml_dtypes

    cp = _cupy()
    out: dict[str, Any] = {}
    n = 8192
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((n, n), dtype=cp.float32)
    y = rng.standard_normal((n, n), dtype=cp.float32)
    for tag, dt in (("bf16", ml_dtypes.bfloat16), ("f16", cp.float16)):
        from gpuplan.functional import cast

        a, b = cast(x, dt), cast(y, dt)
        s = _timed(lambda a=a, b=b: cp.matmul(a, b), iters=10, warmup=3)
        out[f"matmul_{tag}_tflops"] = round(2 * n**3 / s / 1e12, 1)
    return out


def check_cublas_sku() -> dict[str, Any]:
    """Our GemmPlan's cuBLAS SKU in every dtype and transpose pair vs float64 (the gemm
    family's GPU_CASES)."""
    from gpuplan import testing
    from gpuplan.ops.gemm.cases import GPU_CASES

    testing.set_device("cuda")
    bad = []
    for case in GPU_CASES:
        try:
            case.run()
        except Exception as exc:  # noqa: BLE001 - every failing case is listed
            bad.append(f"{case.name}: {type(exc).__name__}: {str(exc)[:200]}")
    if bad:
        raise AssertionError(f"{len(bad)} of {len(GPU_CASES)} cuBLAS cases failed: "
                             + " | ".join(bad[:6]))
    return {"cublas_cases": len(GPU_CASES)}


def check_pinned_staging() -> dict[str, Any]:
    """A device array staged to pinned host memory and back (dist's host-staged MPI path)
    keeps its bytes."""
    import numpy as np

    from dist.staging import PinnedBufferCache, stage_to_device, stage_to_host

    cp = _cupy()
    src = cp.arange(3 << 20, dtype=cp.float32) * cp.float32(0.5)
    cache = PinnedBufferCache()
    host = stage_to_host(src, cache, "send")
    back = cp.zeros_like(src)
    stage_to_device(host, back)
    cp.cuda.get_current_stream().synchronize()
    if not np.array_equal(cp.asnumpy(back), cp.asnumpy(src)):
        raise AssertionError("pinned staging changed the bytes")
    return {"pinned_staging_mib": src.nbytes >> 20}


def check_graph_capture() -> dict[str, Any]:
    """Our plans captured into a CUDA graph from a private pool, replayed with new inputs,
    equal eager calls bit for bit; no allocation escapes the pool."""
    import numpy as np

    from gpuplan import graphs
    from gpuplan.functional import softmax

    cp = _cupy()

    def step(x: Any) -> Any:
        return softmax(x, scale=2.0)

    x = cp.random.default_rng(1).standard_normal((64, 1000), dtype=cp.float32)
    pool = graphs.GraphPool("cuda")
    captured = graphs.capture_step(step, x.copy(), warmup=2, pool=pool)
    ok = True
    for seed in (2, 3):
        new = cp.random.default_rng(seed).standard_normal((64, 1000), dtype=cp.float32)
        got = cp.asnumpy(captured(new))
        want = cp.asnumpy(step(new))
        ok &= bool(np.array_equal(got, want))
    if not ok:
        raise AssertionError("graph replay differs from eager")
    return {"graph_pool_bytes": pool.used_bytes()}


def check_events_and_streams() -> dict[str, Any]:
    """Work on one stream, an event, a second stream waiting on it: the second sees the
    first's result (the ordering our side streams and NCCL rely on)."""
    cp = _cupy()
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    a = cp.zeros(1 << 24, cp.float32)
    with s1:
        for _ in range(20):
            a += 1.0
        ev = s1.record()
    s2.wait_event(ev)
    with s2:
        total = float(a.sum())
    s2.synchronize()
    if total != 20.0 * a.size:
        raise AssertionError(f"stream ordering: expected {20.0 * a.size}, read {total}")
    return {}


def check_nccl_one_rank() -> dict[str, Any]:
    """A one-rank NCCL communicator's all-reduce returns its input."""
    from dist.nccl_backend import nccl_module

    nccl = nccl_module()
    if nccl is None:
        raise AssertionError("cupy.cuda.nccl is not available (no NCCL library)")
    cp = _cupy()
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    x = cp.arange(1000, dtype=cp.float32)
    y = cp.empty_like(x)
    stream = cp.cuda.get_current_stream()
    comm.allReduce(x.data.ptr, y.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
    stream.synchronize()
    if not bool((x == y).all()):
        raise AssertionError("a one-rank all-reduce changed its input")
    return {"nccl_version": nccl.get_version()}


CUDA_PATHS: list[tuple[str, Callable[[], dict[str, Any]]]] = [
    ("copy ceiling", check_copy_ceiling),
    ("matmul ceiling", check_matmul_ceiling),
    ("cuBLAS SKU", check_cublas_sku),
    ("pinned staging", check_pinned_staging),
    ("graph capture", check_graph_capture),
    ("events and streams", check_events_and_streams),
    ("NCCL one rank", check_nccl_one_rank),
]


def cuda_paths(json_path: Path | None) -> int:
    results: dict[str, Any] = {}
    failed = 0
    for name, fn in CUDA_PATHS:
        t0 = time.perf_counter()
        try:
            figures = fn()
            results[name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 2),
                             **figures}
            print(f"{name}: ok {figures or ''} ({time.perf_counter() - t0:.1f} s)", flush=True)
        except Exception as exc:  # noqa: BLE001 - every path is tried
            failed += 1
            where = traceback.extract_tb(exc.__traceback__)[-1]
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:600],
                             "where": f"{where.filename}:{where.lineno}"}
            print(f"{name}: FAILED {type(exc).__name__}: {exc} ({where.filename}:"
                  f"{where.lineno})", flush=True)
        if json_path is not None:
            json_path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"cuda-paths: {len(CUDA_PATHS) - failed} of {len(CUDA_PATHS)} passed", flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchsuite.gpu_check.workers")
    ap.add_argument("worker", choices=["probe", "compile", "cuda-paths"])
    ap.add_argument("--device", choices=["cuda", "emulated"], default="cuda")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args(argv)
    if ns.worker == "probe":
        info = probe(ns.device)
        text = json.dumps(info, indent=1, default=str)
        if ns.json is not None:
            ns.json.write_text(text + "\n")
        print(text, flush=True)
        return 0 if info.get("ok") else 2
    if ns.worker == "compile":
        return compile_all(ns.device, ns.jobs)
    return cuda_paths(ns.json)


if __name__ == "__main__":
    sys.exit(main())
