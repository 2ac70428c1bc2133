"""Training-step throughput of our GPT vs PyTorch: same model, weights, batch, dtype.

    python scripts/bench_train.py --model small --device cpu --steps 5 --threads 2
    python scripts/bench_train.py --model gpt2 --device cuda --dtype bf16 --cuda-graph \
        --torch-compile --json reports/train.json

One step = forward, mean cross-entropy, backward, clip_grad_norm_(1.0), AdamW step
(lr 3e-4, betas (0.9, 0.95), weight decay 0.1), zero grad. Each step is timed between two
device synchronizations; the median is reported. Every side starts from our model's initial
weights (copied into the PyTorch model, Linear weights transposed: ours are
``[in, out]``, PyTorch's ``[out, in]``) and trains on the same fixed batch, so their
first-step losses must agree; the script exits with status 1 when they do not.

Sides (rows of the table, keys of --json):
  ours           our eager step (autograd tape, one plan call per op)
  ours_graph     --cuda-graph (a device): the same step captured once with
                 gpuplan.graphs.capture_step after the warm-up steps, then replayed (one
                 launch per step; the norm is clipped on the device, no host read)
  torch          PyTorch eager
  torch_compile  --torch-compile: the PyTorch model under torch.compile (default mode; the
                 optimizer eager). Its compilation runs in the warm-up and is reported as
                 compile_s; where it fails the error is printed and recorded, and the other
                 sides still run ("where it works").

dtype:
  f32   ours: f32 everywhere, f32 GEMMs (cuBLAS pedantic f32, never TF32); PyTorch: f32
        with its default ``allow_tf32 = False`` for matmuls, i.e. true f32 as well.
  bf16  ours: bf16 parameters and activations, f32 accumulation, f32 master weights and
        moments in AdamW. PyTorch: f32 parameters and optimizer (its master copy) under
        ``torch.autocast(bfloat16)``, which runs GEMMs and attention in bf16 and keeps
        layer norm, softmax and the loss in f32. This is the closest stock equivalent
        (PyTorch's AdamW keeps no f32 master copy of bf16 parameters), but autocast stores
        fewer activations in bf16 than ours does.

Model FLOPs per token (PaLM, appendix B, as in nanoGPT's MFU estimate):
  6 N + 12 L T C, N = parameters without the position embedding (the tied token embedding
  is counted once: it is the LM head's GEMM), L layers, T sequence length, C width.
  The attention term counts the full T x T scores although causal attention needs half.
MFU = model FLOPs/s / peak dense FLOP/s of the device (progress.PEAK_TFLOPS; bf16 for bf16, plain
f32, not TF32, for f32 since neither side uses TF32). On the host no MFU is given.

Peak memory on GPU: ours = the largest number of bytes in use in CuPy's memory pool during
one extra, untimed step (a ``cupy.cuda.MemoryHook``), and the pool's total after the run;
ours_graph = the default pool's and the graph's private pool's totals; PyTorch =
``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` over its run.

--threads N (host runs) gives both sides N threads: ours through gpuplan.host (the BLAS pool
and the budget of the other host ops), PyTorch through torch.set_num_threads.

On the host the sides run interleaved by default (--no-interleave: one after the other):
step i of each is timed in turn, after a short pause, so that a shared machine's slow phases
(PyTorch's own two-thread step ranged 51-68 ms between runs on the 2-core CI VM) hit every
side alike. The paired ratio (median over steps of torch's time / ours) is printed too. On a
GPU the sides run one at a time, ours first (before torch and its CUDA libraries are
imported), each measuring its own peak memory.

--device emulated runs our sides on the emulated device (GPUPLAN_DEVICE=emulated makes
"cuda" mean it too): the device code path end to end, at the emulator's speed, with no
PyTorch comparison. PyTorch is optional: without it only our numbers are printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import gpuplan as gp
from autograd import nn
from benchsuite.sides import (
    HYPER,
    PAUSE,
    Side,
    ours_graph_side,
    ours_memory,
    ours_side,
    time_sides,
)
from benchsuite.torch_gpt import import_torch, torch_memory, torch_train_step
from dist.trainer.progress import device_name, flops_per_token, peak_tflops

ROOT = Path(__file__).resolve().parents[1]

MODELS: dict[str, dict[str, int]] = {
    "gpt2": dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    "small": dict(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=128),
    # 19.1M parameters: the CPU benchmark's larger model (GEMM-bound, unlike 'small').
    "medium": dict(vocab_size=256, block_size=256, n_layer=6, n_head=8, n_embd=512),
    "tiny": dict(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32),
}
DEFAULT_BATCH = {"gpt2": 8, "medium": 8, "small": 8, "tiny": 4}
#: Sides whose rows compare with each torch side, and the torch sides.
OURS, THEIRS = ("ours", "ours_graph"), ("torch", "torch_compile")


# -- run description ------------------------------------------------------------------------

def git_commit() -> str:
    """Short HEAD commit, '+dirty' when tracked files differ from it; 'unknown' without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True, timeout=10).stdout
        return head + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"



# -- sides ----------------------------------------------------------------------------------

def torch_sides(torch: Any, cfg: nn.GPTConfig, state: dict[str, np.ndarray], idx: np.ndarray,
                targets: np.ndarray, args: argparse.Namespace, errors: dict[str, str]
                ) -> list[Callable[[], Side | None]]:
    """Makers of the PyTorch sides: eager, and with --torch-compile the compiled model,
    whose warm-up (compilation included) runs in its maker; a failure there is recorded in
    `errors` and the maker returns None."""
    label = "torch amp" if args.dtype == "bf16" else "torch eager"

    def eager() -> Side:
        return Side("torch", label, *torch_train_step(torch, cfg, state, idx, targets,
                                                      args.device, args.dtype, HYPER))

    def compiled() -> Side | None:
        try:
            side = Side("torch_compile", "torch compile", *torch_train_step(
                torch, cfg, state, idx, targets, args.device, args.dtype, HYPER, compile=True))
            time_sides([side], args.warmup, 0)
        except Exception as exc:  # noqa: BLE001 - "where it works": report, run the others
            errors["torch_compile"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            print(f"# torch.compile failed, no torch compile row: {errors['torch_compile']}")
            return None
        side.extra["compile_s"] = side.warmup_times[0]  # its first call compiles
        return side

    return [eager] + ([compiled] if args.torch_compile else [])


def run_sides(makers: list[Callable[[], Side | None]], args: argparse.Namespace,
              memory: Callable[[Side], dict[str, Any]],
              fresh: Callable[[], None] = lambda: None) -> list[Side]:
    """Make and time the sides: interleaved (all made first), or one at a time, each
    measuring its `memory` and freeing its own before the next is made. `fresh()` runs
    before each side is made (a new peak-memory window)."""
    if args.interleave:
        sides = [s for s in (make() for make in makers) if s is not None]
        time_sides(sides, args.warmup, args.steps, PAUSE)
        return sides
    sides = []
    for make in makers:
        fresh()
        side = make()
        if side is None:
            continue
        time_sides([side], args.warmup, args.steps)
        side.extra.update(memory(side))
        side.step = side.sync = None  # type: ignore[assignment]  # drop the model and state
        side.extra.pop("_graph", None)
        if args.device == "cuda":
            gp.backend.cupy_module().get_default_memory_pool().free_all_blocks()
        sides.append(side)
    return sides


# -- report ---------------------------------------------------------------------------------

def summarize(side: Side, tokens: int, flops_token: float, peak: float | None
              ) -> dict[str, Any]:
    """The JSON record of a timed side."""
    median = float(np.median(side.times))
    tps = tokens / median
    return {"label": side.label, "step_ms": median * 1e3, "step_ms_min": min(side.times) * 1e3,
            "step_ms_max": max(side.times) * 1e3, "tokens_per_s": tps,
            "model_tflops": flops_token * tps / 1e12,
            "mfu": None if peak is None else flops_token * tps / (peak * 1e12),
            "first_loss": side.losses[0], "last_loss": side.losses[-1],
            "losses": side.losses, "times_ms": [t * 1e3 for t in side.times],
            "warmup_ms": [t * 1e3 for t in side.warmup_times],
            **{k: v for k, v in side.extra.items() if not k.startswith("_")}}


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def print_row(r: dict[str, Any]) -> None:
    mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    print(f"{r['label']:<14}{r['step_ms']:>11.1f}{r['tokens_per_s']:>13,.0f}"
          f"{r['model_tflops']:>10.3f}{mfu:>8}{r['first_loss']:>12.6f}{r['last_loss']:>12.6f}")


def compare(results: dict[str, Any], sides: dict[str, Side], dtype: str) -> bool:
    """Print and record the throughput ratios of our sides over the torch sides (and the
    paired step-time ratios of an interleaved run), and check every side's first-step loss
    against ours. True when they all agree."""
    ratios, paired = {}, {}
    for a in OURS:
        for b in THEIRS:
            if a in results and b in results:
                r = results[a]["tokens_per_s"] / results[b]["tokens_per_s"]
                ratios[f"{a}/{b}"] = r
                verdict = f"{1 / r:.2f}x slower" if r < 1 else f"{r:.2f}x faster"
                print(f"throughput {a}/{b} = {r:.3f} ({results[a]['label']} is {verdict})")
                if sides[a].times and len(sides[a].times) == len(sides[b].times):
                    paired[f"{b}/{a}"] = float(np.median(np.array(sides[b].times)
                                                          / np.array(sides[a].times)))
    if ratios:
        results["ratios"] = ratios
    if "ours/torch" in ratios:
        results["ratio_ours_over_torch"] = ratios["ours/torch"]
    if paired and results["info"].get("interleaved"):
        results["paired_ratio_median"] = paired
        print("paired steps, median of step-time ratios: "
              + ", ".join(f"{k} {v:.3f}" for k, v in paired.items()))
    tol = 1e-4 if dtype == "f32" else 2e-2
    ours, agree_all = results["ours"], True
    for key in [k for k in (*OURS, *THEIRS) if k in results and k != "ours"]:
        theirs = results[key]
        diff = abs(ours["first_loss"] - theirs["first_loss"])
        agree = diff <= tol * max(1.0, abs(theirs["first_loss"]))
        drift = max(abs(a - b) for a, b in zip(ours["losses"], theirs["losses"], strict=True))
        theirs["first_loss_agree"] = agree
        theirs["max_loss_diff_all_steps"] = drift
        agree_all &= agree
        print(f"first-step loss ours {ours['first_loss']:.6f} vs {theirs['label']} "
              f"{theirs['first_loss']:.6f}: |diff| {diff:.2e} "
              f"({'agree' if agree else 'DISAGREE'}, relative tolerance {tol:g}); "
              f"max |diff| over all {len(ours['losses'])} steps {drift:.2e}")
    if "torch" in results:  # the headline pair's fields, as before the other sides
        results["first_loss_agree"] = results["torch"]["first_loss_agree"]
        results["max_loss_diff_all_steps"] = results["torch"]["max_loss_diff_all_steps"]
    return agree_all


def print_memory(results: dict[str, Any]) -> None:
    o, t = results["ours"], results.get("torch", {})
    line = (f"peak memory: ours {_gib(o.get('peak_in_use_bytes'))} in use "
            f"(pool {_gib(o.get('pool_total_bytes'))})")
    if "ours_graph" in results:
        g = results["ours_graph"]
        line += (f"; ours graph pools {_gib(g.get('pool_total_bytes'))} "
                 f"(graph {_gib(g.get('graph_pool_bytes'))})")
    if t:
        line += (f"; torch {_gib(t.get('max_allocated_bytes'))} allocated "
                 f"({_gib(t.get('max_reserved_bytes'))} reserved)")
    if "torch_compile" in results:
        c = results["torch_compile"]
        line += f"; torch compile {_gib(c.get('max_allocated_bytes'))} allocated"
    print(line)


# -- command line ---------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(MODELS), default="small")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda", "emulated"], default="auto")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--batch", type=int, default=None, help="default: 8 (4 for tiny)")
    ap.add_argument("--seq", type=int, default=None, help="default: the model's block size")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (10 cuda, 5 cpu)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (3 cuda, 1 cpu)")
    ap.add_argument("--threads", type=int, default=None,
                    help="host threads of both sides (default: each side's own choice)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="also time our step captured as a CUDA graph (a device only)")
    ap.add_argument("--torch-compile", action="store_true",
                    help="also time the PyTorch model under torch.compile")
    ap.add_argument("--no-torch", action="store_true", help="time ours only")
    ap.add_argument("--interleave", action=argparse.BooleanOptionalAction, default=None,
                    help="time the sides step by step in turn, each step after a "
                         f"{PAUSE * 1e3:g} ms pause (default: on for cpu, where a shared "
                         "machine's phases swing more than the sides differ; off on a "
                         "device, whose peak-memory readings need one side at a time)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.device == "auto":
        args.device = gp.backend.default_device() if gp.device_available() else "cpu"
    elif args.device == "cuda" and not gp.device_available():
        ap.error("--device cuda: gpuplan finds no usable CUDA device")
    args.device = gp.backend.resolve_device(args.device)
    host = args.device == "cpu"
    args.batch = args.batch or DEFAULT_BATCH[args.model]
    args.seq = args.seq or MODELS[args.model]["block_size"]
    args.steps = args.steps if args.steps is not None else (5 if host else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if host else 3)
    if args.seq > MODELS[args.model]["block_size"] or min(args.batch, args.seq) < 1:
        ap.error(f"--seq must lie in [1, {MODELS[args.model]['block_size']}] and --batch >= 1")
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be >= 1")
    if args.cuda_graph and host:
        ap.error("--cuda-graph: needs a device (--device cuda, or emulated); the host runs "
                 "eagerly")
    if (args.cuda_graph or args.torch_compile) and args.warmup < 1:
        ap.error(f"--warmup must be >= 1 with --cuda-graph or --torch-compile (given "
                 f"{args.warmup}): a capture needs an eager step first, and a compilation "
                 f"must not be timed")
    if args.interleave is None:
        args.interleave = host
    elif args.interleave and not host:
        ap.error("--interleave is for cpu runs (a device run measures each side's peak "
                 "memory)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device
    if args.threads is not None:
        gp.host.set_blas_threads(args.threads)
    dtype = gp.bfloat16 if args.dtype == "bf16" else np.float32
    cfg = nn.GPTConfig(**MODELS[args.model], dtype=dtype, seed=0)
    model = nn.GPT(cfg).to(device)
    n_params = model.num_parameters()
    rng = np.random.default_rng(0)
    idx = rng.integers(0, cfg.vocab_size, (args.batch, args.seq), dtype=np.int64)
    targets = rng.integers(0, cfg.vocab_size, (args.batch, args.seq), dtype=np.int64)
    tokens = args.batch * args.seq
    name = device_name(device)
    peak = peak_tflops(name, args.dtype) if device == "cuda" else None
    fpt = flops_per_token(cfg, n_params, args.seq)
    info = {"date": datetime.date.today().isoformat(), "commit": git_commit(),
            "device": f"{device}: {name}", "model": args.model, "dtype": args.dtype,
            "batch": args.batch, "seq": args.seq, "tokens_per_step": tokens,
            "params": n_params, "flops_per_token": fpt, "peak_tflops": peak,
            "steps": args.steps, "warmup": args.warmup, "numpy": np.__version__,
            "host_threads": gp.host.thread_budget() if device == "cpu" else None}
    print(f"# bench_train {info['date']} commit {info['commit']} | {info['device']}")
    print(f"# GPT '{args.model}' {n_params / 1e6:.2f}M params, {args.dtype}, batch "
          f"{args.batch}x{args.seq} = {tokens} tokens/step, {fpt / 1e6:.1f} MFLOP/token, "
          f"median of {args.steps} steps after {args.warmup} warm-up"
          + (f", {info['host_threads']} host threads" if device == "cpu" else ""))

    state = model.state_dict()  # initial weights, before any optimizer changes them
    models = [model]  # the first of our sides takes this one; a second builds its own

    def our_model() -> nn.GPT:
        return models.pop() if models else nn.GPT(cfg).to(device)

    makers: list[Callable[[], Side | None]] = [
        lambda: ours_side(our_model(), idx, targets, device)]
    if args.cuda_graph:
        makers.append(lambda: ours_graph_side(our_model(), idx, targets, device, args.warmup))
    del model
    errors: dict[str, str] = {}
    sides: list[Side] = []
    if not args.interleave:  # ours first, before torch (and its CUDA libraries) is imported
        sides += run_sides(makers, args, lambda s: ours_memory(s, device))
        makers = []
    torch = import_torch(args.no_torch, device, args.threads, info)
    info["interleaved"] = bool(args.interleave and torch is not None)
    if torch is not None:
        makers += torch_sides(torch, cfg, state, idx, targets, args, errors)
    if info["interleaved"]:
        print(f"# interleaved: the sides' steps taken in turn, each after a {PAUSE * 1e3:g} "
              "ms pause")
    sides += run_sides(makers, args, lambda s: torch_memory(torch, device),
                       lambda: torch_memory(torch, device, reset=True))

    results: dict[str, Any] = {"info": info}
    for side in sides:
        results[side.key] = summarize(side, tokens, fpt, peak)
    results.update({f"{k}_error": v for k, v in errors.items()})
    print(f"{'':<14}{'ms/step':>11}{'tokens/s':>13}{'TFLOP/s':>10}{'MFU':>8}"
          f"{'loss step1':>12}{'loss last':>12}")
    for key in (*OURS, *THEIRS):
        if key in results:
            print_row(results[key])
    for key in ("ours_graph", "torch_compile"):
        r = results.get(key, {})
        for what in ("capture_s", "compile_s"):
            if what in r:
                print(f"{r['label']}: warm-up and {what[:-2]} took {r[what]:.1f} s")
    status = 0 if compare(results, {s.key: s for s in sides}, args.dtype) else 1
    if device == "cuda":
        print_memory(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"# wrote {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
