"""Benchmark cases and CUDA-event timing shared by the scripts/benchmarks/<family>.py modules.

A family module defines ``CASES: list[Case]``. ``setup()`` allocates the CuPy inputs once
(and may select the plan); ``run(state)`` launches our kernel on the current stream;
``baseline(state)``, when given, runs CuPy's or cuBLAS's own equivalent. Nothing here
touches CUDA at import time.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Case:
    """One benchmark: a name, an input factory, our launch, and what it moves or computes.

    bytes_moved / flops: an int, or a callable of the setup state returning one (0: not
    reported). rotate > 1 calls setup that many times and cycles through the copies, so the
    L2 cache does not keep a small input hot between iterations.
    """

    name: str
    setup: Callable[[], dict]
    run: Callable[[dict], None]
    bytes_moved: Callable[[dict], int] | int = 0
    flops: Callable[[dict], int] | int = 0
    baseline: Callable[[dict], None] | None = None
    baseline_name: str = ""
    rotate: int = 1


def _cupy() -> Any:
    import cupy

    return cupy


def _value(v: Callable[[dict], int] | int, state: dict) -> int:
    return int(v(state) if callable(v) else v)


def time_cuda(fn: Callable[..., None], warmup: int = 5, iters: int = 20,
              states: Sequence[dict] | None = None) -> float:
    """Median milliseconds of one call of `fn` on the current stream, timed with CUDA events.

    With `states`, call i runs ``fn(states[i % len(states)])``, else ``fn()``. All timed calls
    are queued back to back and synchronized once at the end: an event pair brackets each
    call, so launch overhead is hidden when the host keeps ahead of the GPU (and shows when
    it cannot, which is then the truth about the op).
    """
    cp = _cupy()
    if states:
        def call(i: int) -> None:
            fn(states[i % len(states)])
    else:
        def call(i: int) -> None:
            fn()
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


def copy_bandwidth_gbs(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device memcpy bandwidth in GB/s, counting bytes read and written."""
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
    """Time one case (and its baseline): a JSON-ready dict of ms, GB/s, TFLOP/s, ratios."""
    cp = _cupy()
    states = [case.setup() for _ in range(max(1, case.rotate))]
    try:
        ms = time_cuda(case.run, warmup, iters, states)
        nbytes = _value(case.bytes_moved, states[0])
        flops = _value(case.flops, states[0])
        row: dict[str, Any] = {"case": case.name, "ms": ms, "bytes": nbytes, "flops": flops}
        if nbytes:
            row["gbs"] = nbytes / (ms * 1e-3) / 1e9
            if copy_gbs:
                row["pct_copy"] = 100.0 * row["gbs"] / copy_gbs
        if flops:
            row["tflops"] = flops / (ms * 1e-3) / 1e12
        if case.baseline is not None:
            row["baseline_name"] = case.baseline_name or "baseline"
            try:
                row["baseline_ms"] = time_cuda(case.baseline, warmup, iters, states)
                row["speedup"] = row["baseline_ms"] / ms
            except Exception as exc:  # noqa: BLE001 - a failing baseline does not void the case
                row["baseline_error"] = f"{type(exc).__name__}: {exc}"
        return row
    finally:
        del states
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


def device_array(host: Any) -> Any:
    """Copy a NumPy array to the current device."""
    return _cupy().asarray(host)


def random_host(shape: tuple, dtype: Any, seed: int = 0, scale: float = 1.0) -> Any:
    """A float32 normal sample rounded to `dtype` on the host (bf16 included)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype)
