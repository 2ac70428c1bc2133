"""The main job: train a byte-level GPT with MPI ranks.

    mpiexec -n 4 python scripts/train.py                 # defaults: embedded corpus, dp=4
    mpiexec -n 2 python scripts/train.py --steps 300 --data my.txt --out runs/x

Every rank builds the same model from --seed; each data-parallel rank draws its own
batches from a generator keyed by (seed, step, dp rank), so a resumed run sees exactly the
batches an uninterrupted one would. Gradients are averaged over the data-parallel ranks
with one all-reduce per parameter. Rank 0 prints progress, writes metrics.json, loss.png
(when matplotlib is installed) and the checkpoint. Runs on the GPU when one is present,
else on the NumPy CPU backend.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import data as data_mod  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Train a byte-level GPT over MPI ranks.")
    ap.add_argument("--data", default=None, help="text file or folder (default: Python stdlib)")
    ap.add_argument("--max-bytes", type=int, default=2_000_000)
    ap.add_argument("--dp", type=int, default=None, help="data-parallel size (default: N)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    ap.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=64, help="sequence length")
    ap.add_argument("--batch-size", type=int, default=16, help="sequences per dp rank per step")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="max grad norm (0: off)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-interval", type=int, default=25)
    ap.add_argument("--eval-batches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default="runs/default", help="metrics, plot and checkpoint folder")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pkl")
    ap.add_argument("--sample-tokens", type=int, default=200)
    return ap.parse_args(argv)


def validate(ns: argparse.Namespace, world_size: int) -> None:
    """Raise ValueError with a one-line message for options that cannot work."""
    dp = ns.dp if ns.dp is not None else world_size // (ns.tp * ns.pp)
    if min(ns.tp, ns.pp, max(dp, 1)) < 1 or dp * ns.tp * ns.pp != world_size:
        raise ValueError(f"mesh dp={dp} x tp={ns.tp} x pp={ns.pp} does not match the "
                         f"{world_size} MPI ranks")
    if ns.tp > 1 or ns.pp > 1:
        raise ValueError("--tp/--pp > 1: tensor/pipeline parallel training is not wired into "
                         "this script yet (dist layers are landing); use --dp only")
    if ns.n_embd % ns.n_head:
        raise ValueError(f"--n-embd {ns.n_embd} is not divisible by --n-head {ns.n_head}")
    if ns.n_head % ns.tp:
        raise ValueError(f"--n-head {ns.n_head} is not divisible by --tp {ns.tp}")
    if ns.n_layer % ns.pp:
        raise ValueError(f"--n-layer {ns.n_layer} is not divisible by --pp {ns.pp}")
    if ns.data is not None and not Path(ns.data).exists():
        raise ValueError(f"--data: no such file or folder: {ns.data}")
    ns.dp = dp


def save_checkpoint(path: Path, state: dict) -> None:
    """Atomic write: temp file then rename; a .sha256 sidecar guards against corruption."""
    import hashlib

    blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    path.with_suffix(".sha256").write_text(hashlib.sha256(blob).hexdigest() + "\n")


def load_checkpoint(path: Path) -> dict:
    import hashlib

    blob = path.read_bytes()
    want = path.with_suffix(".sha256").read_text().strip()
    if hashlib.sha256(blob).hexdigest() != want:
        raise ValueError(f"checkpoint {path} fails its checksum")
    return pickle.loads(blob)  # noqa: S301 - our own file, checksummed


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    import dist

    world = dist.init()
    rank = world.rank
    try:
        validate(ns, world.size)
    except ValueError as exc:
        if rank == 0:
            print(f"train.py: error: {exc}", file=sys.stderr, flush=True)
        world.barrier()
        return 2

    import autograd as ag
    import gpuplan as gp
    from autograd import nn, optim

    device = "cuda" if gp.device_available() else "cpu"
    dtype = gp.bfloat16 if ns.dtype == "bf16" else np.float32
    corpus = data_mod.load_corpus(ns.data, max_bytes=ns.max_bytes)
    cfg = nn.GPTConfig(vocab_size=data_mod.VOCAB_SIZE, block_size=ns.block_size,
                       n_layer=ns.n_layer, n_head=ns.n_head, n_embd=ns.n_embd, seed=ns.seed)
    model = nn.GPT(cfg).to(device=device, dtype=dtype)
    opt = optim.AdamW(model.parameters(), lr=ns.lr, weight_decay=ns.weight_decay)
    sched = optim.CosineWithWarmup(opt, ns.warmup, ns.steps, min_lr=ns.min_lr)
    out_dir = Path(ns.out)
    ckpt = out_dir / "checkpoint.pkl"
    history: list[dict] = []
    start = 0
    if ns.resume:
        if not ckpt.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {ckpt}")
        st = load_checkpoint(ckpt)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        start, history = st["step"], st["history"]
    n_params = sum(int(np.prod(p.shape)) for p in model.parameters())
    if rank == 0:
        print(f"gpt: {n_params/1e6:.2f}M params, {ns.n_layer} layers, width {ns.n_embd}, "
              f"context {ns.block_size} | corpus: {corpus.source} "
              f"({len(corpus.train)} train / {len(corpus.val)} val bytes, "
              f"sha256 {corpus.sha256[:12]}) | ranks: dp={ns.dp} tp={ns.tp} pp={ns.pp} | "
              f"device {device} {ns.dtype}", flush=True)

    def evaluate(step: int) -> float:
        model.eval()
        losses = []
        with ag.no_grad():
            for i in range(ns.eval_batches):
                rng = np.random.default_rng([ns.seed, 10**9 + i, world.rank])
                x, y = data_mod.get_batch(corpus.val, ns.batch_size, ns.block_size, rng)
                loss = model.loss(ag.tensor(x, device=device), ag.tensor(y, device=device))
                losses.append(float(loss.item()))
        model.train()
        return float(world.all_reduce(np.array([np.mean(losses)]), op="mean")[0])

    t_last = time.perf_counter()
    tokens_per_step = ns.batch_size * ns.block_size * ns.dp
    for step in range(start, ns.steps):
        rng = np.random.default_rng([ns.seed, step, world.rank])
        x, y = data_mod.get_batch(corpus.train, ns.batch_size, ns.block_size, rng)
        loss = model.loss(ag.tensor(x, device=device), ag.tensor(y, device=device))
        loss.backward()
        for p in model.parameters():  # average gradients over data-parallel ranks
            if p.grad is not None:
                world.all_reduce(p.grad.data, op="mean", out=p.grad.data)
        gnorm = optim.clip_grad_norm_(model.parameters(), ns.clip) if ns.clip > 0 else 0.0
        opt.step()
        opt.zero_grad()
        sched.step()
        train_loss = float(world.all_reduce(np.array([loss.item()]), op="mean")[0])
        last = step + 1 == ns.steps
        if (step + 1) % ns.eval_interval == 0 or last or step == start:
            val = evaluate(step)
            dt = (time.perf_counter() - t_last) / max(1, (step + 1) - (history[-1]["step"]
                                                                         if history else start))
            t_last = time.perf_counter()
            rec = {"step": step + 1, "train_loss": train_loss, "val_loss": val,
                   "lr": sched.get_last_lr()[0], "grad_norm": gnorm,
                   "step_time_s": dt, "tokens_per_s": tokens_per_step / dt}
            history.append(rec)
            if rank == 0:
                print(f"step {step + 1:5d}/{ns.steps} | loss {train_loss:.4f} | val {val:.4f} | "
                      f"lr {rec['lr']:.2e} | {rec['tokens_per_s']:.0f} tok/s | "
                      f"{dt * 1e3:.0f} ms/step", flush=True)
            if rank == 0:
                out_dir.mkdir(parents=True, exist_ok=True)
                save_checkpoint(ckpt, {"model": model.state_dict(),
                                       "optimizer": opt.state_dict(),
                                       "scheduler": sched.state_dict(),
                                       "step": step + 1, "history": history,
                                       "args": vars(ns)})
            world.barrier()
    if rank == 0:
        finish(out_dir, history, model, ns, device)
    world.barrier()
    return 0


def finish(out_dir: Path, history: list[dict], model, ns, device: str) -> None:
    import autograd as ag

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps({"args": vars(ns), "history": history},
                                                     indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([h["step"] for h in history], [h["train_loss"] for h in history], label="train")
        ax.plot([h["step"] for h in history], [h["val_loss"] for h in history], label="val")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats/byte)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / "loss.png", dpi=100)
        print(f"wrote {out_dir / 'loss.png'}")
    except ImportError:
        print("matplotlib not installed: no loss.png (pip install matplotlib)")
    prompt = data_mod.encode("def ")
    idx = model.generate(ag.tensor(prompt[None].astype(np.int64), device=device),
                         ns.sample_tokens, temperature=0.8, top_k=40, seed=ns.seed)
    text = data_mod.decode(np.asarray(ag.tensor(idx).numpy() if not hasattr(idx, "numpy")
                                      else idx.numpy())[0])
    print("sample:\n" + text)
    print(f"wrote {out_dir / 'metrics.json'} and {out_dir / 'checkpoint.pkl'}")


if __name__ == "__main__":
    sys.exit(main())
