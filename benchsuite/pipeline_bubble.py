"""Pipeline bubble: PipelineParallel's measured step time against the ideal and (p-1)/(m+p-1).

    mpiexec -n 2 python scripts/bench_pipeline.py [--m 1,2,4,8,16] [--schedules gpipe,1f1b]

Rank r owns stage r, a stack of --layers nn.Linear(width, width) layers, so every stage
costs the same (the first stage skips one input-gradient GEMM: it has no input gradient;
the last adds an MSE loss). Each micro-batch has --rows rows, so a step over m micro-batches
processes m * rows rows and the per-micro-batch work does not change with m.

For each schedule and m, solo and pipelined steps interleaved (same machine load):
  T(m)       median over --steps of the slowest rank's PipelineParallel.train_step time
  ideal      median over --steps of the slowest stage run alone, without communication,
             over the same m micro-batches (all ranks at once, so the cores are as busy as
             in the pipeline): m * (t_f + t_b), the step time with no bubble
  bubble     1 - ideal / T(m), against the model (p - 1) / (m + p - 1), which assumes equal
             stages and free communication, for GPipe and 1F1B alike (1F1B bounds the live
             activations by p instead of m; it does not shrink the bubble)
  T/model T  T(m) / ((m + p - 1) (t_f + t_b)): 1 when the model explains the step time
One BLAS thread per rank (OPENBLAS/OMP/MKL_NUM_THREADS default to 1): run at most one rank
per core, or the ranks' busy-waiting receives steal time from the computing ones.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads its BLAS

import numpy as np  # noqa: E402 - after the BLAS thread variables
from mpi4py import MPI  # noqa: E402

import autograd as ag  # noqa: E402
import dist  # noqa: E402
import gpuplan as gp  # noqa: E402
from autograd import nn  # noqa: E402
from autograd.nn import functional as F  # noqa: E402
from autograd.tape import Tape  # noqa: E402


def make_stage(index: int, layers: int, width: int, device: str) -> dist.PipelineStage:
    stage = dist.PipelineStage(index)
    for j in range(layers):
        stage.add_layer(nn.Linear(width, width, seed=1000 * index + j))
    return stage.to(device)


def loss_fn(out: ag.Tensor, target) -> ag.Tensor:
    return F.mse_loss(out, target)


def row_blocks(a, m: int) -> list:
    rows = a.shape[0] // m
    return [a[i * rows:(i + 1) * rows] for i in range(m)]


def solo_step(stage, index: int, last: bool, xs: list, targets: list, grads: list,
              sync) -> float:
    """Seconds for this rank's stage alone over the micro-batches (forward then backward of
    each, no communication), treated as the runner treats it: an input gradient only past
    the first stage; on the last, the loss scaled by 1/m and read back as a float."""
    m = len(xs)
    sync()
    t0 = time.perf_counter()
    for i in range(m):
        xin = ag.tensor(xs[i], requires_grad=index > 0)
        tape = Tape()
        with tape:
            out = stage(xin)
            if last:
                loss = loss_fn(out, targets[i])
                loss.item()
                loss = loss * (1.0 / m)
        if last:
            tape.backward(loss)
        else:
            tape.backward(out, grad=grads[i])
    sync()
    return time.perf_counter() - t0


def measure(pipe, rank: int, x, target, grads: list, args, world, sync) -> tuple[float, float]:
    """(median T, median ideal) over --steps, solo and pipelined steps interleaved so both
    see the same machine load; each is the slowest rank's time."""
    m, last = pipe.num_micro_batches, rank == pipe.num_stages() - 1
    stage = pipe.stage(rank)
    xs = row_blocks(x, m) if rank == 0 else grads  # past stage 0 any activation will do
    targets = row_blocks(target, m) if last else []
    pipe_times, solo_times = [], []
    for i in range(args.warmup + args.steps):
        pipe.zero_grad()
        world.barrier()
        solo = world.mpi_comm.allreduce(solo_step(stage, rank, last, xs, targets, grads, sync),
                                        op=MPI.MAX)
        pipe.zero_grad()
        sync()
        world.barrier()
        t0 = time.perf_counter()
        pipe.train_step(x, target, loss_fn)
        sync()
        step = world.mpi_comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if i >= args.warmup:
            pipe_times.append(step)
            solo_times.append(solo)
    return float(np.median(pipe_times)), float(np.median(solo_times))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="1,2,4,8,16", help="micro-batch counts, comma-separated")
    ap.add_argument("--schedules", default="gpipe,1f1b")
    ap.add_argument("--layers", type=int, default=4, help="Linear layers per stage")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--rows", type=int, default=128, help="rows per micro-batch")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    args = ap.parse_args()
    world = dist.init()
    p, rank = world.size, world.rank
    if p < 2:
        print("bench_pipeline: run under mpiexec with at least 2 ranks", file=sys.stderr)
        return 2
    device = args.device
    if device == "cuda" and not gp.device_available():
        if rank == 0:
            print("bench_pipeline: --device cuda: gpuplan finds no usable CUDA device (no GPU, "
                  "or CuPy cannot reach a driver; GPUPLAN_DEVICE=emulated runs the device "
                  "path on the emulated device)", file=sys.stderr)
        return 2
    if device == "auto":
        device = "cuda" if gp.device_available() else "cpu"
    device = gp.backend.resolve_device(device)  # "emulated" under GPUPLAN_DEVICE=emulated

    def sync():
        if device != "cpu":
            gp.backend.synchronize()

    ms = [int(v) for v in args.m.split(",")]
    schedules = args.schedules.split(",")
    rng = np.random.default_rng(rank)
    W, R = args.width, args.rows

    def data(rows: int):
        return gp.to_device(rng.standard_normal((rows, W)).astype(np.float32), device)

    if rank == 0:
        gemm = 2 * R * W * W
        print(f"# ranks={p} backend={world.backend} device={device} | stage = {args.layers} x "
              f"Linear({W}, {W}), {R} rows per micro-batch ({gemm / 1e6:.0f} MFLOP per GEMM)"
              f" | median of {args.steps} steps")
        print(f"{'schedule':<9}{'m':>4}{'t_f+t_b ms':>12}{'T(m) ms':>10}{'ideal ms':>10}"
              f"{'bubble':>9}{'model':>8}{'T/model T':>11}")
    for name in schedules:
        for m in ms:
            pipe = dist.PipelineParallel(
                [lambda i=i: make_stage(i, args.layers, W, device) for i in range(p)],
                num_micro_batches=m, schedule=name, comm=world)
            x, target = data(m * R), data(m * R)
            grads = [data(R) for _ in range(m)]
            T, ideal = measure(pipe, rank, x, target, grads, args, world, sync)
            per_mb = ideal / m
            model = (p - 1) / (m + p - 1)
            if rank == 0:
                print(f"{name:<9}{m:>4}{per_mb * 1e3:>12.2f}{T * 1e3:>10.1f}{ideal * 1e3:>10.1f}"
                      f"{1 - ideal / T:>9.3f}{model:>8.3f}"
                      f"{T / ((m + p - 1) * per_mb):>11.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
