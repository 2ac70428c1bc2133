"""Training-step throughput of our GPT vs PyTorch eager: same model, weights, batch, dtype.

    python scripts/bench_train.py --model small --device cpu --steps 5 --threads 2
    python scripts/bench_train.py --model gpt2 --device cuda --dtype bf16 --json reports/train.json

One step = forward, mean cross-entropy, backward, clip_grad_norm_(1.0), AdamW step
(lr 3e-4, betas (0.9, 0.95), weight decay 0.1), zero grad. Each step is timed between two
device synchronizations; the median is reported. Both runs start from our model's initial
weights (copied into the PyTorch model, Linear weights transposed: ours are
``[in, out]``, PyTorch's ``[out, in]``) and train on the same fixed batch, so their
first-step losses must agree; the script exits with status 1 when they do not.

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
PyTorch = ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved``.

--threads N (host runs) gives both sides N threads: ours through gpuplan.host (the BLAS pool
and the budget of the other host ops), PyTorch through torch.set_num_threads.

On the host the two sides run interleaved by default (--no-interleave: ours, then PyTorch):
step i of each is timed in turn, after a short pause, so that a shared machine's slow phases
(PyTorch's own two-thread step ranged 51-68 ms between runs on the 2-core CI VM) hit both
sides alike. The paired ratio (median over steps of torch's time / ours) is printed too.

PyTorch is optional: without it only our numbers are printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from progress import device_name, flops_per_token, peak_tflops  # noqa: E402
from torch_gpt import build_torch_gpt, load_our_weights  # noqa: E402

import gpuplan as gp  # noqa: E402
from autograd import nn, optim  # noqa: E402

MODELS: dict[str, dict[str, int]] = {
    "gpt2": dict(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    "small": dict(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=128),
    # 19.1M parameters: the CPU benchmark's larger model (GEMM-bound, unlike 'small').
    "medium": dict(vocab_size=256, block_size=256, n_layer=6, n_head=8, n_embd=512),
    "tiny": dict(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32),
}
DEFAULT_BATCH = {"gpt2": 8, "medium": 8, "small": 8, "tiny": 4}

LR, BETAS, WEIGHT_DECAY, MAX_NORM = 3e-4, (0.9, 0.95), 0.1, 1.0


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


# -- timing ---------------------------------------------------------------------------------

#: --interleave: seconds before each timed step, so that the other side's idle threads (our
#: host workers poll ~1 ms, then sleep; PyTorch's OpenMP workers spin a while) are asleep.
PAUSE = 0.02


def timed(step: Callable[[], Any], sync: Callable[[], None]) -> tuple[float, float]:
    """(seconds of one step between two syncs, its loss). The loss is read after the clock
    stops, so its device-to-host copy is not timed."""
    sync()
    t0 = time.perf_counter()
    loss = step()
    sync()
    elapsed = time.perf_counter() - t0
    return elapsed, float(loss.item())


def time_steps(step: Callable[[], Any], sync: Callable[[], None], warmup: int,
               steps: int) -> tuple[list[float], list[float]]:
    """(seconds of each timed step, loss of every step, warm-up included)."""
    return time_interleaved([(step, sync)], warmup, steps, pause=0.0)[0]


def time_interleaved(sides: list[tuple[Callable[[], Any], Callable[[], None]]], warmup: int,
                     steps: int, pause: float = PAUSE) -> list[tuple[list[float], list[float]]]:
    """time_steps of each (step, sync) side, taken in turn step by step (the first side
    first on even steps, last on odd ones), each after `pause` seconds: a slow phase of a
    shared machine then hits both sides alike."""
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in sides]
    for i in range(warmup + steps):
        for k in (range(len(sides)) if i % 2 == 0 else reversed(range(len(sides)))):
            if pause:
                time.sleep(pause)
            elapsed, loss = timed(*sides[k])
            if i >= warmup:
                out[k][0].append(elapsed)
            out[k][1].append(loss)
    return out


def summarize(times: list[float], losses: list[float], tokens: int,
              flops_token: float, peak: float | None) -> dict[str, Any]:
    median = float(np.median(times))
    tps = tokens / median
    return {"step_ms": median * 1e3, "step_ms_min": min(times) * 1e3,
            "step_ms_max": max(times) * 1e3, "tokens_per_s": tps,
            "model_tflops": flops_token * tps / 1e12,
            "mfu": None if peak is None else flops_token * tps / (peak * 1e12),
            "first_loss": losses[0], "last_loss": losses[-1], "losses": losses}


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


# -- ours -----------------------------------------------------------------------------------

def ours_step(model: nn.GPT, idx: np.ndarray, targets: np.ndarray, device: str
              ) -> tuple[Callable[[], Any], Callable[[], None]]:
    """(step, sync) of our training step on `device`."""
    params = list(model.parameters())  # used twice: a generator would be spent
    opt = optim.AdamW(params, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    x, y = gp.to_device(idx, device), gp.to_device(targets, device)

    def step():
        loss = model.loss(x, y)
        loss.backward()
        optim.clip_grad_norm_(params, MAX_NORM)
        opt.step()
        opt.zero_grad()
        return loss

    def sync():
        if device == "cuda":
            gp.backend.synchronize()

    return step, sync


def bench_ours(model: nn.GPT, idx: np.ndarray, targets: np.ndarray, device: str,
               args: argparse.Namespace) -> tuple[list[float], list[float], dict]:
    step, sync = ours_step(model, idx, targets, device)
    times, losses = time_steps(step, sync, args.warmup, args.steps)
    memory: dict[str, Any] = {}
    if device == "cuda":
        cp = gp.backend.cupy_module()
        try:
            hook = _cupy_peak_hook(cp)
            with hook:
                step()
                sync()
            memory["peak_in_use_bytes"] = hook.peak
        except Exception as exc:  # noqa: BLE001 - the hook API is a nicety, not the benchmark
            memory["peak_in_use_error"] = repr(exc)
        memory["pool_total_bytes"] = cp.get_default_memory_pool().total_bytes()
    return times, losses, memory


# -- PyTorch --------------------------------------------------------------------------------

def torch_step(torch: Any, cfg: nn.GPTConfig, state: dict[str, np.ndarray], idx: np.ndarray,
               targets: np.ndarray, device: str, dtype: str
               ) -> tuple[Callable[[], Any], Callable[[], None]]:
    """(step, sync) of the PyTorch twin's training step, from our initial weights `state`."""
    torch.backends.cuda.matmul.allow_tf32 = False  # the default; ours never uses TF32
    torch.backends.cudnn.allow_tf32 = False
    tmodel = build_torch_gpt(torch, cfg)
    load_our_weights(torch, tmodel, state)
    tmodel.to(device)
    params = list(tmodel.parameters())
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    x = torch.from_numpy(idx).to(device)
    y = torch.from_numpy(targets).to(device)
    use_autocast = dtype == "bf16"

    def step():
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=use_autocast):
            loss = tmodel(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    return step, sync


def bench_torch(torch: Any, cfg: nn.GPTConfig, state: dict[str, np.ndarray], idx: np.ndarray,
                targets: np.ndarray, device: str, args: argparse.Namespace
                ) -> tuple[list[float], list[float], dict]:
    step, sync = torch_step(torch, cfg, state, idx, targets, device, args.dtype)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = time_steps(step, sync, args.warmup, args.steps)
    memory: dict[str, Any] = {}
    if device == "cuda":
        memory = {"max_allocated_bytes": torch.cuda.max_memory_allocated(),
                  "max_reserved_bytes": torch.cuda.max_memory_reserved()}
    return times, losses, memory


# -- report ---------------------------------------------------------------------------------

def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def print_row(name: str, r: dict[str, Any]) -> None:
    mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    print(f"{name:<10}{r['step_ms']:>11.1f}{r['tokens_per_s']:>13,.0f}"
          f"{r['model_tflops']:>10.3f}{mfu:>8}{r['first_loss']:>12.6f}{r['last_loss']:>12.6f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(MODELS), default="small")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--batch", type=int, default=None, help="default: 8 (4 for tiny)")
    ap.add_argument("--seq", type=int, default=None, help="default: the model's block size")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (10 cuda, 5 cpu)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (3 cuda, 1 cpu)")
    ap.add_argument("--threads", type=int, default=None,
                    help="host threads of both sides (default: each side's own choice)")
    ap.add_argument("--no-torch", action="store_true", help="time ours only")
    ap.add_argument("--interleave", action=argparse.BooleanOptionalAction, default=None,
                    help="time the two sides step by step in turn, each step after a "
                         f"{PAUSE * 1e3:g} ms pause (default: on for cpu, where a shared "
                         "machine's phases swing more than the sides differ; off for cuda, "
                         "whose peak-memory readings need one side at a time)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if gp.device_available() else "cpu"
    if args.device == "cuda" and not gp.device_available():
        ap.error("--device cuda: gpuplan finds no usable CUDA device")
    cuda = args.device == "cuda"
    args.batch = args.batch or DEFAULT_BATCH[args.model]
    args.seq = args.seq or MODELS[args.model]["block_size"]
    args.steps = args.steps if args.steps is not None else (10 if cuda else 5)
    args.warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    if args.seq > MODELS[args.model]["block_size"] or min(args.batch, args.seq) < 1:
        ap.error(f"--seq must lie in [1, {MODELS[args.model]['block_size']}] and --batch >= 1")
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be >= 1")
    if args.interleave is None:
        args.interleave = not cuda
    elif args.interleave and cuda:
        ap.error("--interleave is for cpu runs (the cuda run measures each side's peak memory)")
    return args


def _import_torch(args: argparse.Namespace, info: dict[str, Any]) -> Any:
    """torch for the comparison (its version and threads into `info`), or None: --no-torch,
    not installed, or no CUDA in this build for a cuda run."""
    if args.no_torch:
        return None
    try:
        import torch
    except ImportError:
        print("# torch is not installed: no PyTorch comparison")
        return None
    if args.device == "cuda" and not torch.cuda.is_available():
        print("# this torch build has no CUDA: no PyTorch comparison")
        return None
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
    return torch


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

    state = model.state_dict()  # initial weights, before our optimizer changes them

    def result(times: list[float], losses: list[float], memory: dict) -> dict[str, Any]:
        return {**summarize(times, losses, tokens, fpt, peak), **memory,
                "times_ms": [t * 1e3 for t in times]}

    results: dict[str, Any] = {}
    if not args.interleave:  # ours first, before torch (and its CUDA libraries) is imported
        results["ours"] = result(*bench_ours(model, idx, targets, device, args))
        del model
        if device == "cuda":
            gp.backend.cupy_module().get_default_memory_pool().free_all_blocks()
    torch = _import_torch(args, info)
    info["interleaved"] = bool(args.interleave and torch is not None)
    if args.interleave and torch is None:
        results["ours"] = result(*bench_ours(model, idx, targets, device, args))
    elif info["interleaved"]:
        print(f"# interleaved: the sides' steps taken in turn, each after a {PAUSE * 1e3:g} ms "
              "pause")
        (t_o, l_o), (t_t, l_t) = time_interleaved(
            [ours_step(model, idx, targets, device),
             torch_step(torch, cfg, state, idx, targets, device, args.dtype)],
            args.warmup, args.steps)
        results["ours"], results["torch"] = result(t_o, l_o, {}), result(t_t, l_t, {})
        results["paired_ratio_median"] = float(np.median(np.array(t_t) / np.array(t_o)))
    elif torch is not None:
        results["torch"] = result(*bench_torch(torch, cfg, state, idx, targets, device, args))

    print(f"{'':<10}{'ms/step':>11}{'tokens/s':>13}{'TFLOP/s':>10}{'MFU':>8}"
          f"{'loss step1':>12}{'loss last':>12}")
    print_row("ours", results["ours"])
    status = 0
    if "torch" in results:
        ours, theirs = results["ours"], results["torch"]
        print_row(f"torch {'amp' if args.dtype == 'bf16' else 'eager'}", theirs)
        ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
        results["ratio_ours_over_torch"] = ratio
        verdict = (f"ours is {1 / ratio:.2f}x slower" if ratio < 1
                   else f"ours is {ratio:.2f}x faster")
        print(f"throughput ours/torch = {ratio:.3f} (torch {torch.__version__}, "
              f"{info['torch_threads']} threads; {verdict})")
        if "paired_ratio_median" in results:
            print(f"paired steps: median of torch/ours step-time ratios "
                  f"{results['paired_ratio_median']:.3f}")
        tol = 1e-4 if args.dtype == "f32" else 2e-2
        diff = abs(ours["first_loss"] - theirs["first_loss"])
        agree = diff <= tol * max(1.0, abs(theirs["first_loss"]))
        drift = max(abs(a - b) for a, b in zip(ours["losses"], theirs["losses"], strict=True))
        results["first_loss_agree"] = agree
        results["max_loss_diff_all_steps"] = drift
        print(f"first-step loss ours {ours['first_loss']:.6f} vs torch "
              f"{theirs['first_loss']:.6f}: |diff| {diff:.2e} "
              f"({'agree' if agree else 'DISAGREE'}, relative tolerance {tol:g}); "
              f"max |diff| over all {len(ours['losses'])} steps {drift:.2e}")
        if not agree:
            status = 1
    if device == "cuda":
        o, t = results["ours"], results.get("torch", {})
        print(f"peak memory: ours {_gib(o.get('peak_in_use_bytes'))} in use "
              f"(pool {_gib(o.get('pool_total_bytes'))}); torch "
              f"{_gib(t.get('max_allocated_bytes'))} allocated "
              f"({_gib(t.get('max_reserved_bytes'))} reserved)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"info": info, **results}, indent=2) + "\n")
        print(f"# wrote {args.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())
