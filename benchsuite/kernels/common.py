"""Benchmark cases and their timing, shared by the benchsuite/kernels/<family>.py modules.

A family module defines ``CASES: list[Case]``. ``setup()`` allocates the inputs once on the
benchmark device (`device_array`, `empty`, `zeros`: a CUDA GPU, or the emulated device under
GPUPLAN_DEVICE=emulated) and may select the plan; ``run(state)`` launches our kernel on the
current stream; ``baseline(state)``, when given, runs CuPy's, cuBLAS's or torch's own
equivalent, so it needs a GPU and is skipped on the emulated device (unless the case says
``baseline_gpu_only=False``). Timing: CUDA events on a GPU, the host clock on the emulated
device. Nothing here touches CUDA at import time, and nothing imports CuPy on the emulated
device.

Smoke mode (GPUPLAN_BENCH_SMOKE=1, set by ``bench_kernels.py --smoke`` before the family
modules are imported): every module sizes its cases with ``size(full, smoke)``, so the same
cases, with the same shape character (edge tiles, a vocabulary that is no multiple of the
block, ignored targets), run at sizes the emulated device finishes in seconds.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SMOKE_ENV = "GPUPLAN_BENCH_SMOKE"
#: What a baseline row records on the emulated device (CuPy and torch need a GPU).
BASELINE_SKIPPED = "emulated device"


@dataclass
class Case:
    """One benchmark: a name, an input factory, our launch, and what it moves or computes.

    bytes_moved / flops: an int, or a callable of the setup state returning one (0: not
    reported). rotate > 1 calls setup that many times and cycles through the copies, so the
    L2 cache does not keep a small input hot between iterations. baseline_gpu_only=False
    says the baseline is ours too (gpuplan plans, no CuPy), so it runs on the emulated device.
    """

    name: str
    setup: Callable[[], dict]
    run: Callable[[dict], None]
    bytes_moved: Callable[[dict], int] | int = 0
    flops: Callable[[dict], int] | int = 0
    baseline: Callable[[dict], None] | None = None
    baseline_name: str = ""
    rotate: int = 1
    baseline_gpu_only: bool = True


def smoke() -> bool:
    """True in smoke mode (GPUPLAN_BENCH_SMOKE=1): every case at a tiny size."""
    return os.environ.get(SMOKE_ENV) == "1"


def size(full: Any, smoke_value: Any) -> Any:
    """`smoke_value` in smoke mode, else `full` (any value: a size, a shape, a list)."""
    return smoke_value if smoke() else full


def emulated() -> bool:
    """True when the benchmarks run on the emulated device (GPUPLAN_DEVICE=emulated)."""
    from gpuplan import backend

    return backend.emulated_default()


def device() -> str:
    """The benchmark device: "cuda", or "emulated" under GPUPLAN_DEVICE=emulated."""
    from gpuplan import backend

    return backend.resolve_device("cuda")


def device_array(host: Any) -> Any:
    """Copy a NumPy array to the benchmark device."""
    import gpuplan as gp

    return gp.to_device(host, device())


def empty(shape: Any, dtype: Any) -> Any:
    """An uninitialized array on the benchmark device."""
    import gpuplan as gp

    return gp.empty(shape, dtype, device=device())


def zeros(shape: Any, dtype: Any) -> Any:
    """A zeroed array on the benchmark device."""
    import gpuplan as gp

    return gp.zeros(shape, dtype, device=device())


def random_host(shape: tuple, dtype: Any, seed: int = 0, scale: float = 1.0) -> Any:
    """A float32 normal sample rounded to `dtype` on the host (bf16 included)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype)


def random_device(shape: tuple, dtype: Any, seed: int = 0, scale: float = 1.0) -> Any:
    """A normal sample of `shape` in `dtype` on the benchmark device, drawn there.

    On a GPU the float32 sample comes from CuPy's generator on the device and is converted by
    our cast plan (bf16 included): an 8192 x 50257 input costs milliseconds, where drawing it
    with NumPy on the host took 13.7 CPU-seconds. The emulated device's arrays live in host
    memory, so there it is `random_host` copied over (the same values for the same seed)."""
    if device() != "cuda":
        return device_array(random_host(shape, dtype, seed, scale))
    from gpuplan.dtypes import as_dtype
    from gpuplan.functional import cast

    cp = _cupy()
    x = cp.random.default_rng(seed).standard_normal(shape, dtype=cp.float32)
    if scale != 1.0:
        x *= cp.float32(scale)
    return x if as_dtype(dtype) == np.dtype(np.float32) else cast(x, dtype)


def _cupy() -> Any:
    import cupy

    return cupy


def _value(v: Callable[[dict], int] | int, state: dict) -> int:
    return int(v(state) if callable(v) else v)


def _calls(fn: Callable[..., None], states: Sequence[dict] | None) -> Callable[[int], None]:
    """Call i of `fn`: ``fn(states[i % len(states)])`` with states, else ``fn()``."""
    if states:
        return lambda i: fn(states[i % len(states)])
    return lambda i: fn()


def time_cuda(fn: Callable[..., None], warmup: int = 5, iters: int = 20,
              states: Sequence[dict] | None = None) -> float:
    """Median milliseconds of one call of `fn` on the current stream, timed with CUDA events.

    With `states`, call i runs ``fn(states[i % len(states)])``, else ``fn()``. All timed calls
    are queued back to back and synchronized once at the end: an event pair brackets each
    call, so launch overhead is hidden when the host keeps ahead of the GPU (and shows when
    it cannot, which is then the truth about the op).
    """
    cp = _cupy()
    call = _calls(fn, states)
    for i in range(warmup):
        call(i)
    stream = cp.cuda.get_current_stream()
    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(max(1, iters))]
    for i, (start, end) in enumerate(events):
        start.record(stream)
        call(warmup + i)
        end.record(stream)
    events[-1][1].synchronize()
    return statistics.median(cp.cuda.get_elapsed_time(s, e) for s, e in events)


def time_host(fn: Callable[..., None], warmup: int = 0, iters: int = 1,
              states: Sequence[dict] | None = None) -> float:
    """Median milliseconds of one call of `fn` by the host clock: the emulated device's
    launches complete before they return, so the wall time of a call is its run time."""
    call = _calls(fn, states)
    for i in range(warmup):
        call(i)
    times = []
    for i in range(max(1, iters)):
        t0 = time.perf_counter()
        call(warmup + i)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_ms(fn: Callable[..., None], warmup: int = 5, iters: int = 20,
            states: Sequence[dict] | None = None) -> float:
    """`time_host` on the emulated device, else `time_cuda`."""
    timer = time_host if emulated() else time_cuda
    return timer(fn, warmup, iters, states)


def copy_bandwidth_gbs(nbytes: int = 1 << 30, iters: int = 20) -> float | None:
    """Device-to-device memcpy bandwidth in GB/s, counting bytes read and written; None on
    the emulated device (host memory: no GPU bandwidth to compare with)."""
    if emulated():
        return None
    ms = _time_memcpy(nbytes, iters)
    _cupy().get_default_memory_pool().free_all_blocks()
    return 2.0 * nbytes / (ms * 1e-3) / 1e9


def _time_memcpy(nbytes: int, iters: int) -> float:
    cp = _cupy()
    src = cp.ones(nbytes, dtype=cp.uint8)
    dst = cp.empty_like(src)
    stream = cp.cuda.get_current_stream()
    return time_cuda(lambda: dst.data.copy_from_device_async(src.data, nbytes, stream),
                     warmup=3, iters=iters)


def run_case(case: Case, warmup: int = 5, iters: int = 20,
             copy_gbs: float | None = None) -> dict:
    """Time one case (and its baseline): a JSON-ready dict of ms, GB/s, TFLOP/s, ratios.

    On the emulated device the baseline is not run (``baseline_skipped`` says why)."""
    on_gpu = not emulated()
    states = [case.setup() for _ in range(max(1, case.rotate))]
    try:
        ms = time_ms(case.run, warmup, iters, states)
        nbytes = _value(case.bytes_moved, states[0])
        flops = _value(case.flops, states[0])
        row: dict[str, Any] = {"case": case.name, "ms": ms, "bytes": nbytes, "flops": flops}
        if "note" in states[0]:  # how this run differs from the case's own (see gemm.py)
            row["note"] = states[0]["note"]
        if nbytes:
            row["gbs"] = nbytes / (ms * 1e-3) / 1e9
            if copy_gbs:
                row["pct_copy"] = 100.0 * row["gbs"] / copy_gbs
        if flops:
            row["tflops"] = flops / (ms * 1e-3) / 1e12
        if case.baseline is not None:
            row["baseline_name"] = case.baseline_name or "baseline"
            if case.baseline_gpu_only and not on_gpu:
                row["baseline_skipped"] = BASELINE_SKIPPED
                return row
            try:
                row["baseline_ms"] = time_ms(case.baseline, warmup, iters, states)
                row["speedup"] = row["baseline_ms"] / ms
            except Exception as exc:  # noqa: BLE001 - a failing baseline does not void the case
                row["baseline_error"] = f"{type(exc).__name__}: {exc}"
        return row
    finally:
        del states
        if on_gpu:
            cp = _cupy()
            cp.cuda.get_current_stream().synchronize()
            cp.get_default_memory_pool().free_all_blocks()


def plan_state(plan_cls: type, desc: Any, args: Any, pref: Any = None, **extra: Any) -> dict:
    """Select `plan_cls` for `desc` on the current stream; a state dict for `run_plan_state`."""
    import gpuplan as gp

    stream = gp.Stream.current()
    plan = plan_cls.select(stream, desc, pref or gp.PlanPreference())
    ws = gp.Workspace.allocate(stream, plan.workspace_size())
    return {"plan": plan, "stream": stream, "ws": ws, "args": args, **extra}


def run_plan_state(state: dict) -> None:
    state["plan"].run(state["stream"], state["ws"], state["args"])
