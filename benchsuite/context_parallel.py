"""Context parallelism: activation memory per rank and step time at cp = 1 and cp = the world.

    mpiexec -n 2 python -m mpi4py scripts/bench_context_parallel.py          # cp=2
    mpiexec -n 2 python -m mpi4py scripts/bench_context_parallel.py --block 2048

Per model (a GPT and a Llama with grouped-query attention, f32, host arrays, dropout 0),
one sequence batch of ``--block`` tokens: at cp = 1 (every rank runs the whole sequences
alone, as one process would) and at cp = the world size (`dist.ProcessMesh(cp=...)`, each
rank its chunks i and 2cp - 1 - i, ring attention):

* kept: the bytes the tape keeps for backward after one forward and loss, the parameters
  left out (`dist.memory.activation_bytes`, what train.py reports as activations);
* peak: the peak of the host arrays allocated during one `train_step` (forward, backward,
  the gradient sums) above what was live before (tracemalloc, which NumPy reports its
  buffers to: transients and the gradients included);
* step: the median wall time of a few train_steps (the ring's messages overlap the block
  compute; on this host they share the cores with it).

The largest figure over the ranks is reported, and the ratio of cp to cp = 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np


def _config(name: str, block: int, n_layer: int, n_embd: int) -> Any:
    from autograd import nn

    shape = dict(vocab_size=512, block_size=block, n_layer=n_layer, n_head=8, n_embd=n_embd,
                 dtype=np.float32, seed=0)
    if name == "gpt":
        return nn.GPTConfig(**shape)
    return nn.LlamaConfig(**shape, n_kv_head=2)


def measure(comm: Any, name: str, cp: bool, block: int, n_layer: int, n_embd: int,
            batch: int, repeats: int) -> dict:
    """kept / peak bytes and the median step time of one model at cp = 1 or the world."""
    import gc
    import tracemalloc

    import dist
    from dist.memory import activation_bytes
    from dist.models import ParallelGPT, ParallelLlama

    cls = ParallelGPT if name == "gpt" else ParallelLlama
    cfg = _config(name, block, n_layer, n_embd)
    mesh = dist.ProcessMesh(cp=comm.size, world=comm) if cp else None
    model = cls(cfg, mesh)
    rng = np.random.default_rng(1)
    idx, targets = (rng.integers(0, 512, (batch, block)) for _ in range(2))
    kept = activation_bytes(model, idx, targets)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    model.train_step(idx, targets)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    times = []
    for _ in range(repeats):
        model.zero_grad()
        comm.barrier()
        start = time.perf_counter()
        model.train_step(idx, targets)
        times.append(time.perf_counter() - start)
    most = comm.all_reduce(np.array([kept, peak], dtype=np.int64), "max")
    step = float(comm.all_reduce(np.array([statistics.median(times)]), "max")[0])
    return {"model": name, "cp": comm.size if cp else 1, "kept": int(most[0]),
            "peak": int(most[1]), "step_s": step}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_context_parallel.py",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ns = ap.parse_args(argv)
    import dist

    comm = dist.init()
    rows = [measure(comm, name, cp, ns.block, ns.n_layer, ns.n_embd, ns.batch, ns.repeats)
            for name in ("gpt", "llama") for cp in (False, True)]
    if comm.rank == 0:
        print(f"# context parallelism, {comm.size} ranks: per rank, batch {ns.batch} x "
              f"{ns.block} tokens, n_layer={ns.n_layer} n_embd={ns.n_embd} n_head=8, f32, "
              f"host arrays (max over ranks)")
        for r in rows:
            one = next(o for o in rows if o["model"] == r["model"] and o["cp"] == 1)
            print(f"{r['model']:<6} cp={r['cp']}  kept {r['kept'] / 2**20:8.2f} MiB "
                  f"({r['kept'] / one['kept']:.3f} x)  peak {r['peak'] / 2**20:8.2f} MiB "
                  f"({r['peak'] / one['peak']:.3f} x)  step {r['step_s'] * 1e3:8.1f} ms "
                  f"({r['step_s'] / one['step_s']:.3f} x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
