"""The sides bench_train.py times: a `Side` (one training step to call again and again, its
sync and its loss read), their timing (one at a time, or interleaved step by step), and our
two sides: the eager step and the same step captured as a CUDA graph."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import gpuplan as gp
from autograd import nn, optim

#: Hyper-parameters of every side's step.
HYPER: dict[str, Any] = {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "max_norm": 1.0}

#: Interleaved timing: seconds before each timed step, so that the other sides' idle threads
#: (our host workers poll ~1 ms, then sleep; PyTorch's OpenMP workers spin a while) are asleep.
PAUSE = 0.02


@dataclass
class Side:
    """One side of the benchmark. `step()` takes one training step and returns its loss,
    `read(loss)` is that loss as a float (after the clock stops: its device-to-host copy is
    not timed), `sync()` waits for the side's device work. `losses` starts with the steps
    the side took before timing began (a capture's or a compilation's warm-up), whose
    seconds are in `warmup_times`; `extra` goes into the side's JSON record."""

    key: str
    label: str
    step: Callable[[], Any]
    sync: Callable[[], None]
    read: Callable[[Any], float] = lambda loss: float(loss.item())
    losses: list[float] = field(default_factory=list)
    warmup_times: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def timed(self) -> tuple[float, float]:
        """(seconds of one step between two syncs, its loss)."""
        self.sync()
        t0 = time.perf_counter()
        loss = self.step()
        self.sync()
        elapsed = time.perf_counter() - t0
        return elapsed, self.read(loss)


def time_sides(sides: list[Side], warmup: int, steps: int, pause: float = 0.0) -> None:
    """Take `warmup` untimed then `steps` timed steps of every side, in turn step by step
    (the first side first on even steps, last on odd ones), each after `pause` seconds: a
    slow phase of a shared machine then hits every side alike. Steps a side already took
    (its `losses`) are not taken again."""
    for i in range(warmup + steps):
        for side in (sides if i % 2 == 0 else list(reversed(sides))):
            if i < len(side.losses):
                continue
            if pause:
                time.sleep(pause)
            elapsed, loss = side.timed()
            (side.times if i >= warmup else side.warmup_times).append(elapsed)
            side.losses.append(loss)


# -- ours -----------------------------------------------------------------------------------

def _optimizer(model: nn.GPT) -> tuple[list[Any], optim.AdamW]:
    params = list(model.parameters())  # used twice: a generator would be spent
    return params, optim.AdamW(params, lr=HYPER["lr"], betas=HYPER["betas"],
                               weight_decay=HYPER["weight_decay"])


def ours_side(model: nn.GPT, idx: np.ndarray, targets: np.ndarray, device: str) -> Side:
    """Our eager step on `device`."""
    params, opt = _optimizer(model)
    x, y = gp.to_device(idx, device), gp.to_device(targets, device)

    def step():
        loss = model.loss(x, y)
        loss.backward()
        optim.clip_grad_norm_(params, HYPER["max_norm"])
        opt.step()
        opt.zero_grad()
        return loss

    return Side("ours", "ours", step, lambda: gp.backend.synchronize())


def ours_graph_side(model: nn.GPT, idx: np.ndarray, targets: np.ndarray, device: str,
                    warmup: int) -> Side:
    """Our step captured as one CUDA graph by ``gp.graphs.capture_step`` after `warmup`
    (>= 1) eager steps, which it takes here; every later step is one replay. The clipping
    is ``gp.functional.clip_grad_norm_`` on the gradients, which keeps the norm on the
    device (``optim.clip_grad_norm_`` returns it as a float: a host read, which a capture
    refuses). AdamW reads its step count and lr from device memory at each replay."""
    params, opt = _optimizer(model)
    x, y = gp.to_device(idx, device), gp.to_device(targets, device)
    taken: list[Any] = []

    def step(xs, ys):
        loss = model.loss(xs, ys)
        loss.backward()
        gp.functional.clip_grad_norm_([p.grad.data for p in params], HYPER["max_norm"])
        opt.step()
        opt.zero_grad()
        taken.append(loss.data)
        return loss.data

    t0 = time.perf_counter()
    captured = gp.graphs.capture_step(step, x, y, warmup=warmup)
    seconds = time.perf_counter() - t0
    stream = captured.graph.stream
    side = Side("ours_graph", "ours graph", lambda: captured(x, y), stream.synchronize,
                lambda loss: float(gp.to_host(loss)))
    side.losses = [float(gp.to_host(a)) for a in taken[:warmup]]  # the last one is captured
    side.extra["capture_s"] = seconds  # the warm-up steps and the capture
    pool = captured.graph.pool()
    if device == "cuda" and pool is not None and pool.memory_pool is not None:
        cp = gp.backend.cupy_module()
        side.extra["graph_pool_bytes"] = int(pool.memory_pool.total_bytes())
        side.extra["pool_total_bytes"] = (int(cp.get_default_memory_pool().total_bytes())
                                          + side.extra["graph_pool_bytes"])
    side.extra["_graph"] = captured  # kept alive with the side (its memory, its arrays)
    return side


def _cupy_peak_hook(cp: Any) -> Any:
    class PeakInUse(cp.cuda.MemoryHook):
        """Tracks the bytes handed out by the memory pool (rounded sizes) and their maximum."""

        name = "PeakInUse"

        def __init__(self, start: int) -> None:
            self.in_use = self.peak = start

        def malloc_postprocess(self, **kw: Any) -> None:
            self.in_use += kw["mem_size"]
            self.peak = max(self.peak, self.in_use)

        def free_postprocess(self, **kw: Any) -> None:
            self.in_use -= kw["mem_size"]

    return PeakInUse(cp.get_default_memory_pool().used_bytes())


def ours_memory(side: Side, device: str) -> dict[str, Any]:
    """On a GPU: the peak bytes in use in CuPy's pool during one more (untimed) eager step,
    and the pool's total. {} elsewhere, and for the graph side (whose replays allocate
    nothing: its pools' totals were taken at capture)."""
    if device != "cuda" or side.key == "ours_graph":
        return {}
    memory: dict[str, Any] = {}
    cp = gp.backend.cupy_module()
    try:
        hook = _cupy_peak_hook(cp)
        with hook:
            side.step()
            side.sync()
        memory["peak_in_use_bytes"] = hook.peak
    except Exception as exc:  # noqa: BLE001 - the hook API is a nicety, not the benchmark
        memory["peak_in_use_error"] = repr(exc)
    memory["pool_total_bytes"] = cp.get_default_memory_pool().total_bytes()
    return memory
