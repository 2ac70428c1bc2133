"""scripts/train.py's options: the parser, the layout rule and the checks that turn every
option that cannot work into one `train.py: error:` line (option, expected, given)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np


class OptionError(ValueError):
    """An option that cannot work; the message is one line naming it."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: reported once, like ours
        raise OptionError(message)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = _Parser(description="Train a byte-level GPT over MPI ranks.")
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
    ap.add_argument("--resume", nargs="?", const="latest", default=None, metavar="PATH",
                    help="continue from OUT/checkpoint's latest checkpoint, or from PATH (a "
                         "step folder such as OUT/checkpoint/step_000200)")
    ap.add_argument("--keep", type=int, default=3,
                    help="committed checkpoints kept (the newest by step)")
    ap.add_argument("--on-nonfinite", choices=["stop", "skip"], default="stop",
                    help="a non-finite loss or gradient norm: stop (exit 1, no checkpoint "
                         "after the last finite step) or skip that optimizer step")
    ap.add_argument("--max-skips", type=int, default=10,
                    help="with --on-nonfinite skip: stop after this many consecutive skips")
    ap.add_argument("--stop-after", type=int, default=None,
                    help="save and stop after this step, as if interrupted")
    ap.add_argument("--sample-tokens", type=int, default=200)
    ap.add_argument("--progress", choices=["auto", "bar", "plain"], default="auto")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda", "emulated"], default="auto",
                    help="auto: the GPU when there is one (or the emulated device under "
                         "GPUPLAN_DEVICE=emulated), else cpu; emulated: every kernel runs on "
                         "the CPU from its CUDA source (slow; for checking)")
    ap.add_argument("--timeout", type=_seconds, default=None,
                    help="seconds a collective or pipeline send/recv may wait before the job "
                         "is aborted (default: $GPUPLAN_COLLECTIVE_TIMEOUT, else 600; 0: none)")
    return ap.parse_args(argv)


def _seconds(text: str) -> float:
    """--timeout's type: seconds >= 0 (0: no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 (0: no limit), given {text}")
    return value


def derive_layout(n: int, tp: int | None, pp: int | None, dp: int | None) -> tuple[int, ...]:
    """(dp, pp, tp) for n ranks; see scripts/train.py's docstring for the rule."""
    if tp is None and pp is None and dp is None:
        tp = 2 if n % 2 == 0 else 1
        pp = 2 if (n // tp) % 2 == 0 else 1
        return n // (tp * pp), pp, tp
    fill = {"dp": dp, "pp": pp, "tp": tp}
    for k, v in fill.items():
        if v is not None and v < 1:
            raise OptionError(f"--{k} must be >= 1, given {v}")
    known = int(np.prod([v for v in fill.values() if v is not None]))
    rest = n // known if n % known == 0 else 1  # a mismatch is reported by validate()
    for k in ("dp", "pp", "tp"):
        if fill[k] is None:
            fill[k], rest = rest, 1
    return fill["dp"], fill["pp"], fill["tp"]


def _at_least(ns: argparse.Namespace, name: str, low: int) -> None:
    value = getattr(ns, name)
    if value is not None and value < low:
        raise OptionError(f"--{name.replace('_', '-')} must be an integer >= {low}, given "
                          f"{value}")


def _real(ns: argparse.Namespace, name: str, positive: bool) -> None:
    value = getattr(ns, name)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        expected = "> 0" if positive else ">= 0"
        raise OptionError(f"--{name.replace('_', '-')} must be a finite number {expected}, "
                          f"given {value}")


def _check_out(out: str) -> None:
    """--out must be a folder or creatable as one (no file on its path)."""
    path = Path(out)
    for candidate in (path / "checkpoint", path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise OptionError(f"--out must name a folder (or a new one), given {out} "
                                  f"({candidate} is a file)")
            return


def validate(ns: argparse.Namespace, world_size: int) -> None:
    """Raise OptionError (a ValueError) with a one-line message for options that cannot
    work; fills in the derived ones (layout, micro-batches, warm-up)."""
    ns.dp, ns.pp, ns.tp = derive_layout(world_size, ns.tp, ns.pp, ns.dp)
    if ns.dp * ns.pp * ns.tp != world_size:
        raise OptionError(f"mesh dp={ns.dp} x pp={ns.pp} x tp={ns.tp} = "
                          f"{ns.dp * ns.pp * ns.tp} does not match the {world_size} MPI ranks")
    for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "steps",
                 "eval_interval", "eval_batches", "micro_batches", "max_bytes", "keep",
                 "max_skips", "stop_after"):
        _at_least(ns, name, 1)
    for name in ("warmup", "sample_tokens"):
        _at_least(ns, name, 0)
    _real(ns, "lr", positive=True)
    for name in ("min_lr", "weight_decay", "clip"):
        _real(ns, name, positive=False)
    if not 0 <= ns.seed < 2**32:
        raise OptionError(f"--seed must be an integer in [0, 2**32), given {ns.seed}")
    if ns.n_embd % ns.n_head:
        raise OptionError(f"--n-embd {ns.n_embd} is not divisible by --n-head {ns.n_head}")
    if getattr(ns, "device", "auto") == "cuda":
        import gpuplan as gp

        if not gp.device_available():
            raise OptionError("--device cuda: no usable CUDA device here (--device emulated "
                              "runs the CUDA kernels on the CPU)")
    if ns.n_head % ns.tp:
        raise OptionError(f"--n-head {ns.n_head} is not divisible by --tp {ns.tp}")
    if ns.n_layer % ns.pp:
        raise OptionError(f"--n-layer {ns.n_layer} is not divisible by --pp {ns.pp}")
    if ns.micro_batches is None:
        ns.micro_batches = 2 * ns.pp if ns.pp > 1 else 1
    per_rank, rem = divmod(ns.batch_size, ns.dp)
    if rem or per_rank % ns.micro_batches:
        raise OptionError(f"--batch-size {ns.batch_size} must split into dp={ns.dp} x "
                          f"--micro-batches {ns.micro_batches} equal parts")
    if ns.warmup is None:
        ns.warmup = min(10, ns.steps)
    if not 0 <= ns.warmup <= ns.steps:
        raise OptionError(f"--warmup {ns.warmup} must lie in [0, --steps {ns.steps}]")
    if not 0.0 <= ns.dropout < 1.0:
        raise OptionError(f"--dropout must lie in [0, 1), given {ns.dropout}")
    if ns.data is not None and not Path(ns.data).exists():
        raise OptionError(f"--data: no such file or folder: {ns.data}")
    _check_out(ns.out)
    if ns.resume is not None:
        where = Path(ns.out) / "checkpoint" if ns.resume == "latest" else Path(ns.resume)
        if not where.is_dir():
            raise OptionError(f"--resume: expected a checkpoint folder, given {where} "
                              f"(no such folder)")
