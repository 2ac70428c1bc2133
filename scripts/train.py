"""The main job: train a byte-level GPT over MPI ranks (tensor x pipeline x data parallel).

    mpiexec -n 4 python -m mpi4py scripts/train.py          # defaults: tp=2, pp=2, stdlib corpus
    mpiexec -n 8 python -m mpi4py scripts/train.py --tp 2 --pp 2 --dp 2 --steps 500
    python scripts/train.py --data notes.txt --n-layer 4     # one process

Layout: world rank = (dp_i * pp + pp_i) * tp + tp_i (tensor-parallel ranks adjacent). With
no --tp/--pp/--dp the layout is derived from the rank count N: tp = 2 when N is even, then
pp = 2 when N / tp is even, dp = the rest (N=4 -> tp 2 x pp 2; N=8 -> 2 x 2 x 2). Given
some of them, the missing ones fill the rest (dp first, then pp, then tp).

Data: bytes of a text file or folder (--data) or, by default, of the Python standard
library's own sources (no download): token = byte value, vocabulary 256, last 10% held
out for validation. The global batch of step s is drawn from a generator keyed by
(seed, s) and split over the data-parallel ranks, so the loss curve does not depend on the
layout and a resumed run sees exactly the batches an uninterrupted one would.

Rank 0 prints a line per evaluation (step, loss, validation loss, tokens/s, step time,
MFU on a GPU, memory) and, on a terminal, a progress bar; at the end it writes
OUT/metrics.json, OUT/loss.png and a text sample; OUT/checkpoint/ holds one shard per
rank (model, optimizer, RNG, step) for --resume and scripts/generate.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import data as data_mod  # noqa: E402
import progress as progress_mod  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Train a byte-level GPT over MPI ranks.")
    ap.add_argument("--data", default=None, help="text file or folder (default: Python stdlib)")
    ap.add_argument("--max-bytes", type=int, default=2_000_000, help="corpus size cap")
    ap.add_argument("--tp", type=int, default=None, help="tensor-parallel size")
    ap.add_argument("--pp", type=int, default=None, help="pipeline stages")
    ap.add_argument("--dp", type=int, default=None, help="data-parallel size")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=96)
    ap.add_argument("--block-size", type=int, default=64, help="sequence length")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--batch-size", type=int, default=16, help="global batch (sequences)")
    ap.add_argument("--micro-batches", type=int, default=None,
                    help="pipeline micro-batches per step (default: 2 * pp, or 1)")
    ap.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="bf16: bf16 compute with f32 master weights")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=None,
                    help="linear warm-up steps (default: min(10, steps))")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="max grad norm (0: off)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-interval", type=int, default=25)
    ap.add_argument("--eval-batches", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default="runs/default", help="metrics, plot and checkpoint folder")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="save and stop after this step, as if interrupted")
    ap.add_argument("--sample-tokens", type=int, default=200)
    ap.add_argument("--progress", choices=["auto", "bar", "plain"], default="auto")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda", "emulated"], default="auto",
                    help="auto: the GPU when there is one (or the emulated device under "
                         "GPUPLAN_DEVICE=emulated), else cpu; emulated: every kernel runs on "
                         "the CPU from its CUDA source (slow; for checking)")
    return ap.parse_args(argv)


def derive_layout(n: int, tp: int | None, pp: int | None, dp: int | None) -> tuple[int, ...]:
    """(dp, pp, tp) for n ranks; see the module docstring for the rule."""
    if tp is None and pp is None and dp is None:
        tp = 2 if n % 2 == 0 else 1
        pp = 2 if (n // tp) % 2 == 0 else 1
        return n // (tp * pp), pp, tp
    fill = {"dp": dp, "pp": pp, "tp": tp}
    for k, v in fill.items():
        if v is not None and v < 1:
            raise ValueError(f"--{k} must be >= 1, given {v}")
    known = int(np.prod([v for v in fill.values() if v is not None]))
    rest = n // known if n % known == 0 else 1  # a mismatch is reported by validate()
    for k in ("dp", "pp", "tp"):
        if fill[k] is None:
            fill[k], rest = rest, 1
    return fill["dp"], fill["pp"], fill["tp"]


def validate(ns: argparse.Namespace, world_size: int) -> None:
    """Raise ValueError with a one-line message for options that cannot work."""
    ns.dp, ns.pp, ns.tp = derive_layout(world_size, ns.tp, ns.pp, ns.dp)
    if ns.dp * ns.pp * ns.tp != world_size:
        raise ValueError(f"mesh dp={ns.dp} x pp={ns.pp} x tp={ns.tp} = "
                         f"{ns.dp * ns.pp * ns.tp} does not match the {world_size} MPI ranks")
    for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "steps",
                 "eval_interval", "eval_batches"):
        if getattr(ns, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, given "
                             f"{getattr(ns, name)}")
    if ns.n_embd % ns.n_head:
        raise ValueError(f"--n-embd {ns.n_embd} is not divisible by --n-head {ns.n_head}")
    if getattr(ns, "device", "auto") == "cuda":
        import gpuplan as gp

        if not gp.device_available():
            raise ValueError("--device cuda: no usable CUDA device here (--device emulated runs "
                             "the CUDA kernels on the CPU)")
    if ns.n_head % ns.tp:
        raise ValueError(f"--n-head {ns.n_head} is not divisible by --tp {ns.tp}")
    if ns.n_layer % ns.pp:
        raise ValueError(f"--n-layer {ns.n_layer} is not divisible by --pp {ns.pp}")
    if ns.micro_batches is None:
        ns.micro_batches = 2 * ns.pp if ns.pp > 1 else 1
    per_rank, rem = divmod(ns.batch_size, ns.dp)
    if rem or per_rank % ns.micro_batches:
        raise ValueError(f"--batch-size {ns.batch_size} must split into dp={ns.dp} x "
                         f"--micro-batches {ns.micro_batches} equal parts")
    if ns.warmup is None:
        ns.warmup = min(10, ns.steps)
    if not 0 <= ns.warmup <= ns.steps:
        raise ValueError(f"--warmup {ns.warmup} must lie in [0, --steps {ns.steps}]")
    if not 0.0 <= ns.dropout < 1.0:
        raise ValueError(f"--dropout must lie in [0, 1), given {ns.dropout}")
    if ns.data is not None and not Path(ns.data).exists():
        raise ValueError(f"--data: no such file or folder: {ns.data}")
    if ns.resume and not (Path(ns.out) / "checkpoint").is_dir():
        raise ValueError(f"--resume: no checkpoint in {Path(ns.out) / 'checkpoint'}")


def global_batch(tokens: np.ndarray, ns: argparse.Namespace, key: list[int], dp_rank: int):
    """This data-parallel rank's rows of the global batch drawn from generator `key`."""
    x, y = data_mod.get_batch(tokens, ns.batch_size, ns.block_size,
                              np.random.default_rng(key))
    n = ns.batch_size // ns.dp
    return x[dp_rank * n:(dp_rank + 1) * n], y[dp_rank * n:(dp_rank + 1) * n]


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    import dist

    world = dist.init()
    try:
        validate(ns, world.size)
        corpus = data_mod.load_corpus(ns.data, max_bytes=ns.max_bytes)
        if min(len(corpus.train), len(corpus.val)) <= ns.block_size + 1:
            raise ValueError(f"--data: {corpus.source} is too small for --block-size "
                             f"{ns.block_size} ({len(corpus.train)} train / "
                             f"{len(corpus.val)} val bytes)")
    except (ValueError, OSError) as exc:
        if world.rank == 0:
            print(f"train.py: error: {exc}", file=sys.stderr, flush=True)
        return 2
    return Trainer(ns, world, corpus).run()


class Trainer:
    def __init__(self, ns: argparse.Namespace, world, corpus) -> None:
        import dist
        import gpuplan as gp
        from autograd import nn, optim
        from dist.models import ParallelGPT
        from dist.models.sharding import dense_shapes

        self.ns, self.world, self.corpus = ns, world, corpus
        self.mesh = dist.ProcessMesh(dp=ns.dp, pp=ns.pp, tp=ns.tp, world=world)
        self.device = gp.backend.default_device() if ns.device == "auto" else \
            gp.backend.resolve_device(ns.device)
        dist.model_parallel_seed(ns.seed, tp_rank=self.mesh.tp_rank, pp_rank=self.mesh.pp_rank)
        self.cfg = nn.GPTConfig(vocab_size=data_mod.VOCAB_SIZE, block_size=ns.block_size,
                                n_layer=ns.n_layer, n_head=ns.n_head, n_embd=ns.n_embd,
                                dropout=ns.dropout, dtype=np.float32, seed=ns.seed)
        self.model = ParallelGPT(self.cfg, self.mesh, num_micro_batches=ns.micro_batches,
                                 schedule=ns.schedule, device=self.device,
                                 dtype=gp.bfloat16 if ns.dtype == "bf16" else None)
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        self.opt = optim.AdamW([{"params": decay, "weight_decay": ns.weight_decay},
                                {"params": no_decay, "weight_decay": 0.0}], lr=ns.lr)
        self.sched = optim.CosineWithWarmup(self.opt, ns.warmup, ns.steps, min_lr=ns.min_lr)
        self.out = Path(ns.out)
        self.ckpt = self.out / "checkpoint"
        self.history: list[dict] = []
        self.start = 0
        self.n_params = sum(int(np.prod(shape)) for shape in dense_shapes(self.cfg).values())
        self.flops_token = progress_mod.flops_per_token(self.cfg, self.n_params, ns.block_size)
        name = progress_mod.device_name(self.device)
        peak = progress_mod.peak_tflops(name, ns.dtype) if self.device == "cuda" else None
        self.peak = None if peak is None else peak * 1e12 * world.size
        self.device_label = name

    def resume(self) -> None:
        import dist

        info = self.ckpt / "run.json"
        saved = json.loads(info.read_text())["layout"] if info.exists() else None
        if saved != [self.ns.dp, self.ns.pp, self.ns.tp]:
            raise ValueError(f"the checkpoint's layout dp,pp,tp={saved} differs from this "
                             f"run's {[self.ns.dp, self.ns.pp, self.ns.tp]}")
        meta = dist.load_checkpoint(self.ckpt, self.model, comm=self.world, optimizer=self.opt)
        self.sched.load_state_dict(meta["scheduler"])
        self.start, self.history = int(meta["step"]), list(meta["history"])

    def save(self, step: int) -> None:
        import dist

        specs = {n: s.to_json() for n, s in self.model.shard_specs().items()}
        dist.save_checkpoint(self.ckpt, self.model, comm=self.world, optimizer=self.opt,
                             metadata={"step": step, "scheduler": self.sched.state_dict(),
                                       "history": self.history, "args": vars(self.ns),
                                       "layout": [self.ns.dp, self.ns.pp, self.ns.tp],
                                       "config": _config_json(self.cfg), "specs": specs})
        if self.world.rank == 0:  # read first by --resume; written after every shard exists
            tmp = self.ckpt / "run.json.tmp"
            tmp.write_text(json.dumps({"step": step, "layout": [self.ns.dp, self.ns.pp,
                                                                 self.ns.tp]}))
            os.replace(tmp, self.ckpt / "run.json")

    def evaluate(self) -> float:
        import dist

        losses = [dist.evaluate(self.model, *global_batch(self.corpus.val, self.ns,
                                                          [self.ns.seed, 10**9 + i],
                                                          self.mesh.dp_rank))
                  for i in range(self.ns.eval_batches)]
        return float(np.mean(losses))

    def run(self) -> int:
        import dist

        ns, rank = self.ns, self.world.rank
        if ns.resume:
            error = None
            try:
                self.resume()
            except (ValueError, KeyError, OSError) as exc:
                error = str(exc).strip("'\"").splitlines()[0]
            errors = [e for e in self.world.all_gather_object(error) if e]
            if errors:  # on any rank: every rank stops, rank 0 says why
                if rank == 0:
                    print(f"train.py: error: --resume: {errors[0]}", file=sys.stderr,
                          flush=True)
                return 2
        bar = ns.progress == "bar" or (ns.progress == "auto" and rank == 0
                                       and progress_mod.stdout_is_terminal())
        prog = progress_mod.Progress(ns.steps, self.start, bar and rank == 0)
        if rank == 0:
            c = self.corpus
            print(f"gpt: {self.n_params / 1e6:.2f}M params, {ns.n_layer} layers x {ns.n_embd} "
                  f"wide, {ns.n_head} heads, context {ns.block_size} | data: {c.source} "
                  f"({len(c.train):,} train / {len(c.val):,} val bytes) | mesh: dp={ns.dp} "
                  f"pp={ns.pp} tp={ns.tp}, {ns.micro_batches} micro-batches ({ns.schedule}) | "
                  f"device: {self.device_label}, {ns.dtype}"
                  + (f" | resumed at step {self.start}" if ns.resume else ""), flush=True)
        stop = ns.steps if ns.stop_after is None else min(ns.steps, ns.stop_after)
        tokens = ns.batch_size * ns.block_size
        t_mark, steps_since = time.perf_counter(), 0
        for step in range(self.start, stop):
            t0 = time.perf_counter()
            x, y = global_batch(self.corpus.train, ns, [ns.seed, step], self.mesh.dp_rank)
            loss = self.model.train_step(x, y)
            gnorm = dist.clip_grad_norm_(self.model, ns.clip) if ns.clip > 0 else 0.0
            lr = self.sched.get_last_lr()[0]
            self.opt.step()
            self.opt.zero_grad()
            self.sched.step()
            steps_since += 1
            prog.step(step + 1, loss, tokens / (time.perf_counter() - t0))
            if (step + 1) % ns.eval_interval == 0 or step + 1 == stop or step == 0:
                val = self.evaluate()
                dt = (time.perf_counter() - t_mark) / steps_since
                rec = {"step": step + 1, "train_loss": loss, "val_loss": val, "lr": lr,
                       "grad_norm": gnorm, "step_time_s": dt, "tokens_per_s": tokens / dt,
                       "mfu": (None if self.peak is None
                               else self.flops_token * tokens / dt / self.peak),
                       "memory_mib": float(self.world.all_reduce(
                           np.array([progress_mod.memory_mib(self.device)]), "max")[0])}
                self.history.append(rec)
                if rank == 0:
                    prog.line(progress_mod.format_record(rec, ns.steps))
                self.save(step + 1)
                t_mark, steps_since = time.perf_counter(), 0
        if stop < ns.steps:
            if rank == 0:
                print(f"stopped after step {stop} (--stop-after); continue with --resume",
                      flush=True)
            return 0
        dense = dist.gather_dense_state_dict(self.model, self.world)
        if rank == 0:
            self.finish(dense)
        return 0

    def finish(self, dense_state: dict) -> None:
        import plotting

        self.out.mkdir(parents=True, exist_ok=True)
        metrics = {"args": vars(self.ns), "params": self.n_params, "device": self.device_label,
                   "history": self.history}
        (self.out / "metrics.json").write_text(json.dumps(metrics, indent=1))
        steps = [h["step"] for h in self.history]
        renderer = plotting.write_loss_plot(
            self.out / "loss.png",
            {"train": (steps, [h["train_loss"] for h in self.history]),
             "validation": (steps, [h["val_loss"] for h in self.history])},
            title=f"byte-level GPT, {self.n_params / 1e6:.2f}M params",
            ylabel="cross-entropy (nats/byte)")
        text = sample_text(self.cfg, dense_state, self.ns.sample_tokens, self.ns.seed,
                           self.device)
        print(f"sample (temperature 0.8, top-k 40):\n{text}\n", flush=True)
        print(f"wrote {self.out / 'metrics.json'}, {self.out / 'loss.png'} ({renderer}) and "
              f"{self.ckpt}/ (scripts/generate.py --checkpoint {self.ckpt})", flush=True)


def sample_text(cfg, dense_state: dict, n_tokens: int, seed: int, device: str,
                prompt: str = "def ", temperature: float = 0.8, top_k: int = 40) -> str:
    """Text sampled from the dense model assembled from the shards (one process)."""
    from autograd import nn

    model = nn.GPT(cfg)
    model.load_state_dict(dense_state)
    model.to(device=device)
    idx = data_mod.encode(prompt)[None].astype(np.int64)
    import gpuplan as gp

    out = model.generate(gp.to_device(idx, device), n_tokens, temperature=temperature,
                         top_k=top_k, seed=seed)
    return data_mod.decode(gp.to_host(out)[0])


def _config_json(cfg) -> dict:
    import dataclasses

    d = dataclasses.asdict(cfg)
    d["dtype"] = np.dtype(d["dtype"]).name
    return d


if __name__ == "__main__":
    sys.exit(main())
