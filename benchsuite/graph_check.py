"""CUDA graph check (the gpu_check.py `graphs` step): a captured training step against eager.

    python3 scripts/check_graphs.py                      # on the GPU
    python3 scripts/check_graphs.py --device emulated    # the same logic on the emulated device

1. An MLP step (forward, cross-entropy, backward, clip_grad_norm_, AdamW with a LambdaLR
   schedule) captured with gpuplan.graphs.capture_step and replayed over new batches must
   give the eager run's losses, norms and weights bit for bit (its kernels are
   deterministic: no atomics).
2. A GPT step, eager and replayed: losses within 1e-4 (embedding backward uses atomics on a
   GPU, so bits may differ), and the median step times of both with their ratio.
Prints one summary line; exit 1 on a mismatch, 2 when the device is missing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import autograd as ag
import gpuplan as gp
from autograd import nn, optim


def _trainer(model, vocab: int, lr_decay: bool):
    params = list(model.parameters())
    opt = optim.AdamW(params, lr=1e-3, weight_decay=0.1)
    sched = optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + s)) if lr_decay else None

    def step(x, y):
        with ag.Tape():
            out = model(ag.Tensor(x))
            loss = nn.functional.cross_entropy(out.reshape(-1, vocab), ag.Tensor(y.reshape(-1)))
        loss.backward()
        norm = gp.functional.clip_grad_norm_([p.grad.data for p in params], 1.0)
        opt.step()
        opt.zero_grad()
        return loss.data, norm

    return step, sched


def _mlp(device: str):
    model = nn.Sequential(nn.Linear(64, 256, seed=1), nn.GELU(), nn.LayerNorm(256),
                          nn.Linear(256, 10, seed=2))
    model.to(device=device)
    return model


def check_equal(device: str, steps: int) -> str | None:
    """None when the captured MLP run equals the eager one bit for bit, else what differs."""
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((32, 64)).astype(np.float32),
                rng.integers(0, 10, 32).astype(np.int64)) for _ in range(steps)]
    runs = []
    for captured in (False, True):
        if device == "emulated":
            from gpuplan.emulator import reset_schedules

            reset_schedules()
        model = _mlp(device)
        step, sched = _trainer(model, 10, True)
        losses = []
        dev = [tuple(gp.to_device(a, device) for a in b) for b in batches]
        if captured:
            graphed = gp.graphs.capture_step(step, *dev[0], warmup=1)
            losses.append(None)
            sched.step()
            for x, y in batches[1:]:
                loss, norm = graphed(x, y)
                sched.step()
                losses.append((float(gp.to_host(loss)), float(gp.to_host(norm))))
        else:
            for x, y in dev:
                loss, norm = step(x, y)
                sched.step()
                losses.append((float(gp.to_host(loss)), float(gp.to_host(norm))))
        runs.append((losses, [gp.to_host(p.data) for p in model.parameters()]))
    (le, pe), (lc, pc) = runs
    if le[1:] != lc[1:]:
        return f"losses/norms differ: eager {le[1:]} captured {lc[1:]}"
    bad = [i for i, (a, b) in enumerate(zip(pe, pc, strict=True)) if not np.array_equal(a, b)]
    return f"weights differ (parameters {bad})" if bad else None


def time_gpt(device: str, steps: int, size: str) -> tuple[float, float, float]:
    """(median eager step s, median replayed step s, max relative loss difference)."""
    small = size == "small"
    cfg = nn.GPTConfig(vocab_size=256, block_size=16 if small else 128,
                       n_layer=1 if small else 4, n_head=2 if small else 4,
                       n_embd=32 if small else 256, dropout=0.0, seed=0)
    batch = 2 if small else 16
    rng = np.random.default_rng(1)
    data = [(rng.integers(0, 256, (batch, cfg.block_size)),
             rng.integers(0, 256, (batch, cfg.block_size))) for _ in range(steps)]
    results = []
    for captured in (False, True):
        if device == "emulated":
            from gpuplan.emulator import reset_schedules

            reset_schedules()
        model = nn.GPT(cfg)
        model.to(device=device)
        step, _ = _trainer(model, 256, False)
        x0, y0 = (gp.to_device(a, device) for a in data[0])
        # warm-up: the eager step on batch 0 (it compiles and makes the optimizer state)
        run = gp.graphs.capture_step(step, x0, y0, warmup=1) if captured else None
        times, losses = [], []
        for x, y in data[1:] if captured else data:
            t0 = time.perf_counter()
            if captured:
                loss, _ = run(x, y)
            else:
                loss, _ = step(gp.to_device(x, device), gp.to_device(y, device))
            losses.append(float(gp.to_host(loss)))  # (a sync: the step is done)
            times.append(time.perf_counter() - t0)
        results.append((statistics.median(times[1:]), losses))
    (te, le), (tc, lc) = results
    rel = max(abs(a - b) / abs(a) for a, b in zip(le[1:], lc, strict=True))
    return te, tc, rel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "emulated"], default="cuda")
    ap.add_argument("--steps", type=int, default=20,
                    help="GPT steps per mode (at least 3: the first of each mode is not timed)")
    ap.add_argument("--size", choices=["small", "medium"], default=None,
                    help="GPT size (default: medium on cuda, small on the emulated device)")
    ns = ap.parse_args(argv)
    if ns.steps < 3:
        ap.error(f"--steps: expected at least 3, given {ns.steps}")
    device = gp.backend.resolve_device(ns.device)  # "cuda" is emulated under GPUPLAN_DEVICE
    if device == "cuda" and not gp.backend.cuda_available():
        print("check_graphs: no usable CUDA device", file=sys.stderr)
        return 2
    size = ns.size or ("medium" if device == "cuda" else "small")
    diff = check_equal(device, 5)
    te, tc, rel = time_gpt(device, ns.steps, size)
    ok = diff is None and rel < 1e-4
    print(f"graphs: mlp captured vs eager over 5 steps: "
          f"{'bitwise equal' if diff is None else 'MISMATCH: ' + diff}; gpt ({size}): eager "
          f"{te * 1e3:.2f} ms/step, replayed {tc * 1e3:.2f} ms/step, {te / tc:.2f}x, "
          f"max relative loss difference {rel:.1e}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
