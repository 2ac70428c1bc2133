"""Step time of data-parallel training with the gradient reduction overlapped with backward
and after it, alternated in one run (same machine load).

    mpiexec -n 2 python -m mpi4py scripts/bench_overlap.py [--n-layer 4 --n-embd 256 ...]

The world is data parallel (dp = its size). Two ParallelGPT models of one config (same
weights), one with ``overlap_grad_reduce`` on, one off, take turns: each step is the model's
``train_step`` (forward, backward, gradient average), the gradient clip and the AdamW step,
timed on every rank from a barrier to the end of the optimizer step (the slowest rank's time
counts). Reported: the median over --steps of each, their ratio, and whether the two models'
losses and weights are still the same bits (they see the same batches). The overlapped
reducer uses --bucket-mb buckets (its first one at most 1 MiB).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before NumPy loads its BLAS

import numpy as np  # noqa: E402 - after the BLAS thread variables


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_overlap.py", description=__doc__.splitlines()[0])
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8, help="rows per rank and step")
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--bucket-mb", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=10, help="timed steps of each")
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)

    import dist
    from autograd import nn, optim
    from dist.models import ParallelGPT

    world = dist.init()
    if world.size < 2:
        print("bench_overlap.py: run under mpiexec with at least 2 ranks", file=sys.stderr)
        return 2
    mesh = dist.ProcessMesh(dp=world.size, pp=1, tp=1, world=world)
    cfg = nn.GPTConfig(vocab_size=args.vocab, block_size=args.block_size,
                       n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                       dtype=np.float32, seed=0)
    runs = {}
    for overlap in (True, False):
        model = ParallelGPT(cfg, mesh, num_micro_batches=args.micro_batches,
                            overlap_grad_reduce=overlap)
        model.grad_bucket_bytes = int(args.bucket_mb * 2**20)
        runs[overlap] = (model, optim.AdamW(model.parameters(), lr=1e-3), [], [])
    rng = np.random.default_rng(1 + mesh.dp_rank)
    for step in range(args.warmup + args.steps):
        x = rng.integers(0, args.vocab, (args.batch_size, args.block_size))
        y = rng.integers(0, args.vocab, (args.batch_size, args.block_size))
        order = (True, False) if step % 2 == 0 else (False, True)
        for overlap in order:
            model, opt, times, losses = runs[overlap]
            world.barrier()
            t0 = time.perf_counter()
            losses.append(model.train_step(x, y))
            dist.clip_grad_norm_(model, 1.0)
            opt.step()
            opt.zero_grad()
            took = world.all_reduce(np.array([time.perf_counter() - t0]), "max")[0]
            if step >= args.warmup:
                times.append(took)
    on, off = (float(np.median(runs[o][2])) for o in (True, False))
    same = runs[True][3] == runs[False][3] and all(
        np.array_equal(a.data, b.data) for a, b in zip(runs[True][0].parameters(),
                                                        runs[False][0].parameters(),
                                                        strict=True))
    same = bool(world.all_reduce(np.array([int(same)], np.int32), "max")[0]) and same
    buckets = len(runs[True][0].grad_reducer().buckets)
    if world.rank == 0:
        params = sum(p.data.size for p in runs[True][0].parameters())
        print(f"dp={world.size}, GPT {args.n_layer} layers x {args.n_embd}, {params / 1e6:.2f}M "
              f"parameters, f32, batch {args.batch_size} x {args.block_size} per rank, "
              f"{args.micro_batches} micro-batch(es), {buckets} buckets")
        print(f"step time, median of {args.steps}: overlap {on * 1e3:.1f} ms, blocking "
              f"{off * 1e3:.1f} ms, ratio {on / off:.3f}; same losses and weights: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
