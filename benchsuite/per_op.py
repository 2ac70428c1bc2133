"""Time per recorded op against PyTorch eager, in one process (issue 26's target: at most 3x).

    PYTHONPATH=. /tmp/benchvenv/bin/python scripts/bench_per_op.py
    PYTHONPATH=. /tmp/benchvenv/bin/python scripts/bench_per_op.py --runs 7 --calls 2000

Each op runs forward only on 8x8 float32 inputs requiring grad: ours recorded on a tape (a
fresh `ag.Tape()` per run), PyTorch's recorded for autograd, torch at one thread (ours at
its own host thread budget, which an 8x8 op never splits over). The two sides alternate op
by op within each run, and within a run in blocks (`BLOCKS`), so that a noisy machine slows
both alike; each figure is the median over the runs of the mean time per call of `--calls`
calls. The time is the calling thread's CPU time (`--timer thread`, the default): an 8x8
op runs on that thread alone on either side (garbage collection included), and the time the
VM gives other processes is not counted, so that the figures hold on a loaded machine;
`--timer wall` takes the elapsed time instead. Read the ratio column: on a shared VM the
absolute times move between runs, the ratios much less. PyTorch is not a dependency of the
project: run this with an interpreter that has torch (a separate benchmark venv) and the
project on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import autograd as ag
from autograd import nn
from autograd.nn import functional as F

OPS = ("add", "nn.Linear", "softmax", "layer_norm", "gelu")
SHAPE = (8, 8)


def our_ops(rng: np.random.Generator) -> dict[str, Callable[[], Any]]:
    """The ops as our autograd runs them (inputs requiring grad)."""
    def t(*shape: int) -> Any:
        return ag.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True)

    a, b, w, bias = t(*SHAPE), t(*SHAPE), t(SHAPE[-1]), t(SHAPE[-1])
    linear = nn.Linear(SHAPE[-1], SHAPE[-1], seed=0)
    return {"add": lambda: a + b, "nn.Linear": lambda: linear(a),
            "softmax": lambda: F.softmax(a, dim=-1),
            "layer_norm": lambda: F.layer_norm(a, (SHAPE[-1],), w, bias),
            "gelu": lambda: F.gelu(a)}


def torch_ops(torch: Any, rng: np.random.Generator) -> dict[str, Callable[[], Any]]:
    """The same ops in PyTorch eager."""
    def t(*shape: int) -> Any:
        return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).requires_grad_()

    a, b, w, bias = t(*SHAPE), t(*SHAPE), t(SHAPE[-1]), t(SHAPE[-1])
    tf = torch.nn.functional
    linear = torch.nn.Linear(SHAPE[-1], SHAPE[-1])
    return {"add": lambda: a + b, "nn.Linear": lambda: linear(a),
            "softmax": lambda: tf.softmax(a, dim=-1),
            "layer_norm": lambda: tf.layer_norm(a, (SHAPE[-1],), w, bias),
            "gelu": lambda: tf.gelu(a)}


#: blocks of calls a run alternates between the two sides, op by op (a run of 2000 calls:
#: ten blocks of 200 each side), so that both see the same moments of a loaded machine.
BLOCKS = 10
#: the clocks `--timer` chooses among: the calling thread's CPU time, or elapsed time.
TIMERS: dict[str, Callable[[], float]] = {"thread": time.thread_time, "wall": time.perf_counter}


def per_call(fn: Callable[[], Any], calls: int, timer: Callable[[], float] = time.perf_counter
             ) -> float:
    """Mean seconds (of `timer`) per call of `calls` back-to-back calls of fn."""
    t0 = timer()
    for _ in range(calls):
        fn()
    return (timer() - t0) / calls


def measure(ops: list[str], runs: int, calls: int, timer: str = "thread"
            ) -> dict[str, tuple[float, float]]:
    """{op: (ours, torch)} median seconds per call, the two sides interleaved op by op."""
    clock = TIMERS[timer]
    import torch

    torch.set_num_threads(1)
    ours, theirs = our_ops(np.random.default_rng(0)), torch_ops(torch, np.random.default_rng(0))
    times: dict[str, tuple[list[float], list[float]]] = {op: ([], []) for op in ops}
    with ag.Tape():  # warm-up: plans selected and cached, kernels compiled
        for op in ops:
            ours[op]()
            theirs[op]()
    block = max(1, calls // BLOCKS)
    for _ in range(runs):
        for op in ops:
            tape, mine, other = ag.Tape(), 0.0, 0.0
            for _ in range(BLOCKS):
                with tape:
                    mine += per_call(ours[op], block, clock)
                other += per_call(theirs[op], block, clock)
            times[op][0].append(mine / BLOCKS)
            times[op][1].append(other / BLOCKS)
    return {op: (float(np.median(a)), float(np.median(b))) for op, (a, b) in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_per_op.py", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per op (median taken)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per run")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {OPS}")
    parser.add_argument("--timer", choices=sorted(TIMERS), default="thread",
                        help="the calling thread's CPU time (default) or elapsed time")
    args = parser.parse_args(argv)
    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error(f"unknown ops {unknown}; choose from {OPS}")
    try:
        import torch
    except ImportError:
        parser.exit(2, "bench_per_op: torch is not installed in this interpreter (use the "
                       "benchmark venv, with the project on PYTHONPATH)\n")
    result = measure(ops, args.runs, args.calls, args.timer)
    print(f"per recorded op, 8x8 float32 requiring grad; torch {torch.__version__} at 1 thread; "
          f"median of {args.runs} runs of {args.calls} calls, interleaved; {args.timer} time")
    print(f"{'op':<12}{'ours us':>10}{'torch us':>10}{'ratio':>8}")
    for op, (o, t) in result.items():
        print(f"{op:<12}{o * 1e6:>10.1f}{t * 1e6:>10.1f}{o / t:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
