"""Communication benchmark: all_reduce and send/recv bandwidth, ours vs raw mpi4py.

Run under MPI with at least two ranks, e.g.
    mpiexec -n 2 python scripts/bench_comm.py [--iters 20] [--max-mib 64] [--device auto]
Host buffers always; device buffers (CuPy) too when a GPU is present (--device cuda/auto).
all_reduce bandwidth is the bus bandwidth 2 (p - 1) / p * bytes / time (as nccl-tests);
send/recv is a ping-pong between ranks 0 and 1 (bytes / half round trip).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import dist
import gpuplan as gp


def timed(fn, comm, iters: int, sync) -> float:
    """Seconds per call: the slowest rank's mean over `iters` calls after one warm-up."""
    fn()
    sync()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    elapsed = (time.perf_counter() - start) / iters
    return comm.allreduce(elapsed, op=MPI.MAX)


def bench_all_reduce(world, device: str, nbytes: int, iters: int, sync) -> dict[str, float]:
    n = max(1, nbytes // 4)
    x = gp.to_device(np.ones(n, np.float32), device)
    out = gp.zeros(n, np.float32, device)
    rows = {"ours": timed(lambda: world.all_reduce(x, out=out), world.mpi_comm, iters, sync)}
    if device == "cpu":
        rows["mpi4py"] = timed(lambda: world.mpi_comm.Allreduce(x, out, op=MPI.SUM),
                               world.mpi_comm, iters, sync)
    p = world.size
    return {k: 2 * (p - 1) / p * n * 4 / t / 1e9 for k, t in rows.items()}


def bench_send_recv(world, device: str, nbytes: int, iters: int, sync) -> dict[str, float]:
    n = max(1, nbytes)
    buf = gp.zeros(n, np.uint8, device)
    r = world.rank

    def ours():
        if r == 0:
            world.send(buf, 1)
            world.recv(buf, 1)
        elif r == 1:
            world.recv(buf, 0)
            world.send(buf, 0)

    rows = {"ours": timed(ours, world.mpi_comm, iters, sync)}
    if device == "cpu":
        def raw():
            if r == 0:
                world.mpi_comm.Send(buf, 1)
                world.mpi_comm.Recv(buf, 1)
            elif r == 1:
                world.mpi_comm.Recv(buf, 0)
                world.mpi_comm.Send(buf, 0)

        rows["mpi4py"] = timed(raw, world.mpi_comm, iters, sync)
    return {k: n / (t / 2) / 1e9 for k, t in rows.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    args = parser.parse_args()
    world = dist.init()
    if world.size < 2:
        print("bench_comm: run under mpiexec with at least 2 ranks", file=sys.stderr)
        return 2
    if args.device == "cuda" and not gp.device_available():
        if world.rank == 0:
            print("bench_comm: --device cuda: gpuplan finds no usable CUDA device (no GPU, "
                  "or CuPy cannot reach a driver; GPUPLAN_DEVICE=emulated runs the device "
                  "path on the emulated device)", file=sys.stderr)
        return 2
    devices = ["cpu"]
    if args.device == "cuda" or (args.device == "auto" and gp.device_available()):
        # the device the buffers really live on: "emulated" under GPUPLAN_DEVICE=emulated
        devices.append(gp.backend.resolve_device("cuda"))

    def sync_for(device):
        return (lambda: gp.backend.synchronize()) if device != "cpu" else (lambda: None)

    sizes = [1 << k for k in range(10, 40, 2) if (1 << k) <= args.max_mib << 20]
    if world.rank == 0:
        print(f"# ranks={world.size} backend={world.backend} iters={args.iters}")
        print(f"{'op':<10} {'device':<8} {'bytes':>10} {'ours GB/s':>10} {'mpi4py GB/s':>12}")
    for device in devices:
        for name, fn in (("all_reduce", bench_all_reduce), ("send_recv", bench_send_recv)):
            for nbytes in sizes:
                iters = max(3, args.iters if nbytes < (8 << 20) else args.iters // 4)
                res = fn(world, device, nbytes, iters, sync_for(device))
                if world.rank == 0:
                    # 4 significant digits: a slow small message (a starved rank) still
                    # prints its rate, never 0.000.
                    raw = f"{res['mpi4py']:12.4g}" if "mpi4py" in res else f"{'-':>12}"
                    print(f"{name:<10} {device:<8} {nbytes:>10} {res['ours']:10.4g} {raw}",
                          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
