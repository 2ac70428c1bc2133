"""Memory per rank with and without ZeRO-1 and activation recomputation, measured side by side.

    mpiexec -n 2 python -m mpi4py scripts/bench_memory.py      # optimizer state at dp=2
    mpiexec -n 4 python -m mpi4py scripts/bench_memory.py      # at dp=4
    python scripts/bench_memory.py                              # dp=1, and the activations

Optimizer state: after one AdamW step of the same GPT (f32 or bf16 parameters) on every
rank, the bytes the replicated optimizer holds (its moments, and its f32 master weights for
bf16 parameters) against the bytes ZeRO-1 holds on this rank (its slices of the weights and
the moments), the largest over the ranks. Activations (one process, a GPT and a Llama): the
bytes of the arrays the tape keeps for backward at the end of one forward (`ctx.saved` of
every recorded op, each array once, the parameters left out: `dist.memory.kept_bytes`, what
train.py reports), and the peak of the host arrays allocated during that forward and its
backward above what was live before (tracemalloc, as below: transients and the gradients
included), for --recompute none, attention and block.

Sequence parallelism (under mpiexec, tp = the world): per rank, a tensor-parallel GPT and
Llama with and without ``sequence_parallel`` (dropout 0.1, f32, host arrays): the bytes the
tape keeps for backward after one forward (as above, the parameters left out), and the peak
of the host arrays allocated during that forward and its backward above what was live
before (tracemalloc, which NumPy reports its buffers to: transients included), the largest
over the ranks.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np


def _gpt(n_layer: int, n_embd: int, dtype: Any) -> Any:
    from autograd import nn

    cfg = nn.GPTConfig(vocab_size=512, block_size=128, n_layer=n_layer, n_head=4,
                       n_embd=n_embd, dtype=dtype, seed=0)
    return nn.GPT(cfg)


def _groups(model: Any) -> list[dict]:
    params = list(model.parameters())
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def _fake_grads(model: Any) -> None:
    import autograd as ag
    import gpuplan as gp

    rng = np.random.default_rng(0)
    for p in model.parameters():
        p.grad = ag.tensor(gp.asarray(rng.standard_normal(p.shape).astype(p.dtype)))


def optimizer_state(comm: Any, dtype_name: str, n_layer: int, n_embd: int) -> dict:
    from autograd import optim
    from dist.zero import ZeroRedundancyOptimizer
    from gpuplan.dtypes import bfloat16

    dtype = bfloat16 if dtype_name == "bf16" else np.float32
    plain_model, zero_model = _gpt(n_layer, n_embd, dtype), _gpt(n_layer, n_embd, dtype)
    plain = optim.AdamW(_groups(plain_model), lr=1e-3)
    zero = ZeroRedundancyOptimizer(_groups(zero_model), optimizer_class=optim.AdamW,
                                   comm=comm, lr=1e-3)
    for model, opt in ((plain_model, plain), (zero_model, zero)):
        _fake_grads(model)
        opt.step()
    replicated = sum(int(v.nbytes) for s in plain.state.values() for v in s.values()
                     if hasattr(v, "nbytes"))
    mine = zero.state_bytes()
    most = mine if comm is None else int(comm.all_reduce(np.array([mine]), "max")[0])
    params = sum(int(p.data.nbytes) for p in plain_model.parameters())
    return {"dtype": dtype_name, "params_bytes": params, "replicated": replicated,
            "zero_max_rank": most, "ratio": most / replicated}


def _model(name: str, n_layer: int, n_embd: int) -> Any:
    from autograd import nn

    shape = dict(vocab_size=512, block_size=128, n_layer=n_layer, n_head=4, n_embd=n_embd,
                 dtype=np.float32, seed=0)
    if name == "gpt":
        return nn.GPT(nn.GPTConfig(**shape))
    return nn.Llama(nn.LlamaConfig(**shape, n_kv_head=2))


def activation_bytes(n_layer: int, n_embd: int, batch: int) -> list[dict]:
    """Per model (GPT, Llama) and --recompute mode: the bytes kept for backward after one
    forward (the parameters left out) and the peak of the host arrays during that forward and
    its backward above what was live before (see the module docstring)."""
    import gc
    import tracemalloc

    import autograd as ag
    from dist.memory import kept_bytes

    idx = np.random.default_rng(1).integers(0, 512, (batch, 128))
    rows = []
    for name in ("gpt", "llama"):
        model = _model(name, n_layer, n_embd)
        for mode in ("none", "attention", "block"):
            model.set_recompute(mode)
            model.zero_grad()
            gc.collect()
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            with ag.Tape() as tape:
                loss = model.loss(idx, idx)
            kept = kept_bytes(tape, [p.data for p in model.parameters()])
            tape.backward(loss)
            peak = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
            rows.append({"model": name, "mode": mode, "kept": kept, "peak": peak})
            del tape, loss
    return rows


def sequence_parallel_activations(comm: Any, n_layer: int, n_embd: int, batch: int,
                                  block: int = 128) -> list[dict]:
    """Per model and ``sequence_parallel``: kept-for-backward and peak bytes (max over ranks)
    of one forward and backward at tp = comm.size (see the module docstring)."""
    import gc
    import tracemalloc

    import autograd as ag
    from autograd import nn
    from dist.memory import kept_bytes
    from dist.models import ParallelGPT, ParallelLlama

    shape = dict(vocab_size=512, block_size=block, n_layer=n_layer, n_head=8, n_embd=n_embd,
                 dropout=0.1, dtype=np.float32, seed=0)
    models = {"gpt": (ParallelGPT, nn.GPTConfig(**shape)),
              "llama": (ParallelLlama, nn.LlamaConfig(**shape, n_kv_head=comm.size))}
    idx = np.random.default_rng(1).integers(0, 512, (batch, block))
    rows = []
    for name, (cls, cfg) in models.items():
        for sp in (False, True):
            model = cls(cfg, tp=comm, sequence_parallel=sp)
            gc.collect()
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            with ag.Tape() as tape:
                loss = model.loss_fn(model.forward_stage(idx), idx)
            kept = kept_bytes(tape, [p.data for p in model.parameters()])
            tape.backward(loss)
            peak = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
            most = comm.all_reduce(np.array([kept, peak], dtype=np.int64), "max")
            rows.append({"model": name, "sequence_parallel": sp, "kept": int(most[0]),
                         "peak": int(most[1])})
            del model, tape, loss
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_memory.py", description=__doc__.splitlines()[0])
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ns = ap.parse_args(argv)
    comm = None
    try:
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_size() > 1:
            import dist

            comm = dist.init()
    except ImportError:
        pass
    rank = 0 if comm is None else comm.rank
    size = 1 if comm is None else comm.size
    rows = [optimizer_state(comm, d, ns.n_layer, ns.n_embd) for d in ("f32", "bf16")]
    if rank == 0:
        print(f"# optimizer state per rank, GPT n_layer={ns.n_layer} n_embd={ns.n_embd}, "
              f"dp={size}")
        print(f"{'dtype':<6} {'params MiB':>10} {'replicated MiB':>15} {'ZeRO-1 MiB':>11} "
              f"{'ratio':>6}")
        for r in rows:
            print(f"{r['dtype']:<6} {r['params_bytes'] / 2**20:>10.2f} "
                  f"{r['replicated'] / 2**20:>15.2f} {r['zero_max_rank'] / 2**20:>11.2f} "
                  f"{r['ratio']:>6.3f}")
    if comm is not None:
        sp_rows = sequence_parallel_activations(comm, ns.n_layer, ns.n_embd, ns.batch)
        if rank == 0:
            print(f"# activations per rank at tp={size}, batch {ns.batch} x 128, f32, dropout "
                  f"0.1: kept for backward / peak during forward+backward (max over ranks)")
            for r in sp_rows:
                off = next(o for o in sp_rows if o["model"] == r["model"]
                           and not o["sequence_parallel"])
                print(f"{r['model']:<6} sequence_parallel={r['sequence_parallel']!s:<5} "
                      f"kept {r['kept'] / 2**20:8.2f} MiB ({r['kept'] / off['kept']:.3f} x)  "
                      f"peak {r['peak'] / 2**20:8.2f} MiB ({r['peak'] / off['peak']:.3f} x)")
    if comm is None:
        acts = activation_bytes(ns.n_layer, ns.n_embd, ns.batch)
        print(f"# activations, one process, n_layer={ns.n_layer} n_embd={ns.n_embd}, batch "
              f"{ns.batch} x 128, f32: kept for backward after one forward (parameters left "
              f"out) / peak of the host arrays during forward+backward")
        for r in acts:
            none = next(o for o in acts if o["model"] == r["model"] and o["mode"] == "none")
            print(f"{r['model']:<6} --recompute {r['mode']:<9} kept {r['kept'] / 2**20:8.2f} "
                  f"MiB ({r['kept'] / none['kept']:.3f} x none)  peak {r['peak'] / 2**20:8.2f} "
                  f"MiB ({r['peak'] / none['peak']:.3f} x none)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
