"""The main job's options (scripts/train.py): the parser, the layout rule and the checks that
turn every option that cannot work into one `train.py: error:` line (option, expected, given)."""

from __future__ import annotations

import argparse
import datetime
import difflib
import math
import sys
from pathlib import Path

import numpy as np


class OptionError(ValueError):
    """An option that cannot work; the message is one line naming it."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: reported once, like ours
        raise OptionError(message)

    def print_help(self, file=None) -> None:
        # --help runs before MPI starts, on every rank: the launcher's rank 0 alone prints.
        from gpuplan.launcher import env_rank

        if env_rank() == 0:
            super().print_help(file)


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless it is None or its help already tells it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or "default" in text:
            return text
        return super()._get_help_string(action)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = _Parser(description="Train a GPT or a Llama over MPI ranks.",
                 formatter_class=_Defaults)
    ap.add_argument("--data", default=None,
                    help="a token folder (train.bin + val.bin, nanoGPT/llm.c layout; see "
                         "scripts/prepare_data.py) or a text file or folder read as bytes "
                         "(default: the Python stdlib's sources)")
    ap.add_argument("--token-dtype", choices=["uint16", "uint32"], default=None,
                    help="a token folder's id type (default: its meta.json's or llm.c "
                         "header's, else uint16)")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="the model's vocabulary; token ids must lie below it (default: 256 "
                         "for text, a token folder's meta.json or llm.c header)")
    ap.add_argument("--max-bytes", type=int, default=None,
                    help="train on only the first N bytes of a text corpus (truncates; "
                         "default: all of it)")
    ap.add_argument("--model", choices=["gpt", "llama"], default="gpt",
                    help="gpt: GPT-2 blocks (LayerNorm, GELU MLP, learned positions); llama: "
                         "RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, "
                         "no biases (its only dropout is --attn-dropout's, default --dropout)")
    ap.add_argument("--n-kv-head", type=int, default=None,
                    help="llama: key/value heads, dividing --n-head (default: --n-head)")
    ap.add_argument("--ffn-hidden", type=int, default=None,
                    help="llama: SwiGLU width (default: Llama's rule, 8/3 --n-embd rounded "
                         "up to a multiple of 256)")
    ap.add_argument("--rope-theta", type=float, default=None,
                    help="llama: rotary embedding base (default: 10000)")
    ap.add_argument("--tp", type=int, default=None, help="tensor-parallel size")
    ap.add_argument("--pp", type=int, default=None, help="pipeline stages")
    ap.add_argument("--dp", type=int, default=None, help="data-parallel size")
    ap.add_argument("--cp", type=int, default=1,
                    help="context-parallel size: each of cp ranks holds chunks i and 2cp-1-i "
                         "of every sequence (--block-size divisible by 2 x cp) and attention "
                         "runs as ring attention over them; the same losses, 1/cp of the "
                         "activations per rank")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=96)
    ap.add_argument("--block-size", type=int, default=64, help="sequence length")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--attn-dropout", type=float, default=None,
                    help="dropout of the attention probabilities (default: --dropout)")
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
                         "step folder such as OUT/checkpoint/step_000200); a checkpoint of "
                         "another tp x pp x dp layout is resharded (model and optimizer)")
    ap.add_argument("--init-from", default=None, metavar="PATH",
                    help="start from these weights: a .safetensors file (scripts/export.py), "
                         "a Hugging Face GPT-2 folder, or a checkpoint of any layout")
    ap.add_argument("--activation", choices=["gelu", "gelu_tanh"], default="gelu",
                    help="gpt's MLP activation: exact GELU, or GPT-2's tanh form")
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
    ap.add_argument("--cuda-graph", action="store_true",
                    help="capture the training step as CUDA graphs after one eager step "
                         "(one process, one micro-batch, no dropout; see "
                         "dist/trainer/graph_step.py)")
    ap.add_argument("--zero", type=int, choices=[0, 1], default=0,
                    help="1: ZeRO stage 1, the AdamW state (moments, f32 master weights) "
                         "sharded over the data-parallel ranks (dist.ZeroRedundancyOptimizer; "
                         "the same weights as 0, 1/dp of the state per rank)")
    ap.add_argument("--no-overlap", dest="overlap", action="store_false",
                    help="reduce the data-parallel gradients (or, with --zero 1, reduce-scatter "
                         "them) after the backward instead of bucket by bucket during the last "
                         "micro-batch's backward (the default; the same bits either way)")
    ap.add_argument("--recompute", choices=["none", "attention", "block"], default="none",
                    help="activation recomputation: keep only each block's input (block) or "
                         "each attention sub-layer's (attention) and re-run it in backward; "
                         "the same gradients, less memory")
    ap.add_argument("--sequence-parallel", action="store_true",
                    help="with --tp > 1: norms, dropout and residual adds on each tp rank's "
                         "share of the sequence (--block-size divisible by --tp), all-gathers "
                         "and reduce-scatters in place of the all-reduces; the same losses, "
                         "less activation memory (a no-op at --tp 1)")
    ap.add_argument("--trace", default=None, metavar="PATH",
                    help="write a Chrome trace-event JSON of every rank's timeline here "
                         "(forward/backward per micro-batch, each collective and send/recv, "
                         "optimizer, evaluate, checkpoint); open it in ui.perfetto.dev")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda", "emulated"], default="auto",
                    help="auto: the GPU when there is one (or the emulated device under "
                         "GPUPLAN_DEVICE=emulated), else cpu; emulated: every kernel runs on "
                         "the CPU from its CUDA source (slow; for checking)")
    ap.add_argument("--timeout", type=_seconds, default=None,
                    help="seconds a collective or pipeline send/recv may wait before the job "
                         "is aborted (default: $GPUPLAN_COLLECTIVE_TIMEOUT, else 600; 0: none)")
    return parse_with_config(ap, argv)


def parse_with_config(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """ap.parse_args(argv) with `--config FILE.toml` added: the file's keys are option names
    (`n_layer` or `n-layer`), its values the options' values (true/false for flags); options
    on the command line override the file. A wrong key or value is one OptionError line."""
    ap.add_argument("--config", metavar="TOML", default=None,
                    help="read options from a TOML file (keys: option names); options given "
                         "on the command line override the file's")
    for action in ap._actions:
        if action.help is None:  # argparse prints no line at all for options without help
            action.help = "" if action.default is None else "(default: %(default)s)"
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = _Parser(add_help=False)
    pre.add_argument("--config", default=None)
    config = pre.parse_known_args(argv)[0].config
    tokens = [] if config is None else config_tokens(ap, config)
    if config is not None:
        try:
            ap.parse_args(tokens)  # the file's values alone, so that errors can name the file
        except OptionError as exc:
            raise OptionError(f"--config {config}: {exc}") from None
    ns = ap.parse_args(tokens + argv)
    ns.given = given_options(ap, tokens + argv)
    return ns


def given_options(ap: argparse.ArgumentParser, tokens: list[str]) -> list[str]:
    """The dests of the options `tokens` set (on the command line or in --config), however
    spelled: argparse fills in a default only where the namespace has no value yet."""
    unset = object()
    probe = argparse.Namespace(**{a.dest: unset for a in ap._actions if a.option_strings})
    ap.parse_args(tokens, namespace=probe)
    return sorted(k for k, v in vars(probe).items() if v is not unset and k != "config")


_MAX_CONFIG_BYTES = 1 << 20  # a file of options is a few hundred bytes


def config_tokens(ap: argparse.ArgumentParser, path: str) -> list[str]:
    """The command-line tokens that say what the TOML file `path` says."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        if Path(path).stat().st_size > _MAX_CONFIG_BYTES:
            raise OptionError(f"--config {path}: {Path(path).stat().st_size} bytes, expected "
                              f"a file of options of at most {_MAX_CONFIG_BYTES} bytes")
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise OptionError(f"--config: cannot read {path} ({exc.strerror or exc})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise OptionError(f"--config {path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise OptionError(f"--config {path}: nested too deeply (expected option = value "
                          f"lines)") from None
    actions = {a.dest: a for a in ap._actions
               if a.option_strings and a.dest not in ("help", "config")}
    tokens: list[str] = []
    for key, value in data.items():
        action = actions.get(key.replace("-", "_"))
        if action is None:
            close = difflib.get_close_matches(key.replace("-", "_"), actions, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise OptionError(f"--config {path}: unknown option {key!r}{hint}; train.py "
                              f"--help lists the options")
        flag = next(o for o in action.option_strings if o.startswith("--"))
        if isinstance(value, bool) and (action.nargs == 0 or action.nargs == "?"):
            if value:  # a flag, or an option whose value may be left out (--resume)
                tokens.append(flag)
            continue
        if isinstance(value, (bool, dict, list, datetime.date, datetime.time)):
            raise OptionError(f"--config {path}: {key} expects a value like its command-line "
                              f"{flag} takes, given {value!r}")
        tokens += [flag, str(value)]
    return tokens


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
    """(dp, pp, tp) for n ranks; see dist.trainer.main's docstring for the rule."""
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


_LLAMA_OPTIONS = ("n_kv_head", "ffn_hidden", "rope_theta")


def _check_model_options(ns: argparse.Namespace) -> None:
    """--model's own options: Llama's only with --model llama, and a shape the layout can
    split (K/V heads whole or replicated per tensor-parallel rank, the SwiGLU width, even
    head sizes for rotary embeddings)."""
    model = getattr(ns, "model", "gpt")
    given = [name for name in _LLAMA_OPTIONS if getattr(ns, name, None) is not None]
    if model != "llama":
        if given:
            raise OptionError(f"--{given[0].replace('_', '-')} is an option of --model llama, "
                              f"given --model {model}")
        return
    for name in ("n_kv_head", "ffn_hidden"):
        _at_least(ns, name, 1)
    if ns.rope_theta is not None:
        _real(ns, "rope_theta", positive=True)
    if (ns.n_embd // ns.n_head) % 2:
        raise OptionError(f"--model llama needs an even head size (rotary embeddings turn "
                          f"pairs), given --n-embd {ns.n_embd} / --n-head {ns.n_head} = "
                          f"{ns.n_embd // ns.n_head}")
    kv = ns.n_head if ns.n_kv_head is None else ns.n_kv_head
    if ns.n_head % kv:
        raise OptionError(f"--n-kv-head must divide --n-head {ns.n_head}, given {kv}")
    if kv % ns.tp and ns.tp % kv:
        raise OptionError(f"--n-kv-head must be a multiple or a divisor of --tp {ns.tp} (each "
                          f"rank holds whole K/V heads, or a copy of one), given {kv}")
    from autograd.nn.llama_config import llama_ffn_hidden

    hidden = llama_ffn_hidden(ns.n_embd) if ns.ffn_hidden is None else ns.ffn_hidden
    if hidden % ns.tp:
        rule = "" if ns.ffn_hidden is not None else f" (Llama's rule from --n-embd {ns.n_embd})"
        raise OptionError(f"--ffn-hidden {hidden}{rule} is not divisible by --tp {ns.tp}")


def validate(ns: argparse.Namespace, world_size: int) -> None:
    """Raise OptionError (a ValueError) with a one-line message for options that cannot
    work; fills in the derived ones (layout, micro-batches, warm-up)."""
    cp = ns.cp = getattr(ns, "cp", 1)
    if cp < 1:
        raise OptionError(f"--cp must be an integer >= 1, given {cp}")
    # The context-parallel factor is taken first; the rule below splits the other ranks.
    rest = world_size // cp if world_size % cp == 0 else world_size
    ns.dp, ns.pp, ns.tp = derive_layout(rest, ns.tp, ns.pp, ns.dp)
    if ns.dp * ns.pp * cp * ns.tp != world_size:
        if cp == 1:
            raise OptionError(f"mesh dp={ns.dp} x pp={ns.pp} x tp={ns.tp} = "
                              f"{ns.dp * ns.pp * ns.tp} does not match the {world_size} MPI "
                              f"ranks")
        raise OptionError(f"mesh dp={ns.dp} x pp={ns.pp} x cp={cp} x tp={ns.tp} = "
                          f"{ns.dp * ns.pp * cp * ns.tp} does not match the {world_size} MPI "
                          f"ranks")
    for name in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "steps",
                 "eval_interval", "eval_batches", "micro_batches", "max_bytes", "vocab_size",
                 "keep", "max_skips", "stop_after"):
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
    if cp > 1:
        if ns.block_size % (2 * cp):
            raise OptionError(f"--cp {cp}: --block-size {ns.block_size} is not divisible by 2 "
                              f"x --cp = {2 * cp} (each cp rank holds two of 2 x cp equal "
                              f"chunks of every sequence)")
        attn = ns.dropout if getattr(ns, "attn_dropout", None) is None else ns.attn_dropout
        if attn > 0:
            raise OptionError(f"--cp {cp}: --attn-dropout must be 0 (ring attention does not "
                              f"drop attention probabilities), given {attn} (--dropout sets "
                              f"it unless --attn-dropout is given)")
        if getattr(ns, "sequence_parallel", False) and (ns.block_size // cp) % ns.tp:
            raise OptionError(f"--sequence-parallel: --block-size {ns.block_size} / --cp {cp} "
                              f"= {ns.block_size // cp} tokens per cp rank are not divisible "
                              f"by --tp {ns.tp} (each tp rank holds an equal share of them)")
    if getattr(ns, "sequence_parallel", False) and ns.block_size % ns.tp:
        raise OptionError(f"--sequence-parallel: --block-size {ns.block_size} is not divisible "
                          f"by --tp {ns.tp} (each tp rank holds an equal share of the sequence)")
    _check_model_options(ns)
    if getattr(ns, "trace", None):
        where = Path(ns.trace)
        if where.is_dir() or not where.parent.is_dir():
            raise OptionError(f"--trace: a file path in an existing folder, given {ns.trace}")
    if getattr(ns, "zero", 0) and getattr(ns, "cuda_graph", False):
        raise OptionError("--zero 1 and --cuda-graph: the captured step runs the replicated "
                          "optimizer; use one or the other")
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
    if ns.attn_dropout is not None and not 0.0 <= ns.attn_dropout < 1.0:
        raise OptionError(f"--attn-dropout must lie in [0, 1), given {ns.attn_dropout}")
    if ns.data is not None and not Path(ns.data).exists():
        raise OptionError(f"--data: no such file or folder: {ns.data}")
    _check_out(ns.out)
    if ns.resume is not None:
        where = Path(ns.out) / "checkpoint" if ns.resume == "latest" else Path(ns.resume)
        if not where.is_dir():
            raise OptionError(f"--resume: expected a checkpoint folder, given {where} "
                              f"(no such folder)")
    if getattr(ns, "init_from", None) is not None:
        if ns.resume is not None:
            raise OptionError("--init-from and --resume exclude each other (--resume keeps "
                              "the checkpoint's optimizer and step)")
        if not Path(ns.init_from).exists():
            raise OptionError(f"--init-from: no such file or folder: {ns.init_from}")
