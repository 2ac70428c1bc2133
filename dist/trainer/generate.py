"""Sample text from a checkpoint written by scripts/train.py, in one process.

    python scripts/generate.py                                  # runs/default/checkpoint
    python scripts/generate.py --checkpoint runs/x/checkpoint --prompt "import " --tokens 400
    python scripts/generate.py --tokenizer tokenizer.json --top-p 0.9 --prompt "Once upon"

--checkpoint is a checkpoint root (its `latest` committed step is used) or one step folder
(runs/x/checkpoint/step_000200). It holds one shard per rank of whatever layout trained it
(tensor, pipeline, data parallel); each parameter's shard records the dense parameter and
the indices it holds, so the shards are assembled into the single-process nn.GPT (nn.Llama
for a Llama checkpoint) and sampled (KV cache; temperature, top-k, top-p) on the GPU when
one is present, else on the CPU. The prompt is encoded and the output decoded with the
training data's codec, or with the Hugging Face tokenizer.json --tokenizer names (the
optional `tokenizers` package). Every shard is checked against the manifest first (same
step, SHA-256), so shards of different steps or a corrupt file give one error line naming
the file, never a mixed model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from . import data as data_mod


def load_dense(checkpoint: Path):
    """(nn.GPT or nn.Llama, as the model config says, with the consolidated weights; the
    manifest's metadata) of the committed checkpoint `checkpoint` names (a step folder, or
    a root: its latest), every shard verified against the manifest first (one step,
    checksums, coordinates)."""
    from autograd import nn
    from dist.checkpoint import CheckpointError, find_fallback, resolve
    from dist.reshard import model_config_from_json, read_dense_checkpoint

    failed = checkpoint
    try:
        failed = resolve(checkpoint)
        dense = read_dense_checkpoint(checkpoint)
    except (CheckpointError, OSError) as exc:
        fallback = find_fallback(failed)
        hint = (f"; the newest older checkpoint that verifies is {fallback}" if fallback
                else "")
        raise ValueError(f"{exc}{hint}") from None
    config = model_config_from_json(dense.config, str(dense.step_dir))
    model = (nn.Llama if isinstance(config, nn.LlamaConfig) else nn.GPT)(config)
    model.load_state_dict({k: v.astype(np.float32) for k, v in dense.params.items()})
    return model, dense.metadata


def tokenizer_codec(path: str) -> data_mod.Codec:
    """The codec of the tokenizer.json `path` (--tokenizer), read once here so that a
    missing file, a missing `tokenizers` package or an unreadable file is one ValueError
    naming the option."""
    if not Path(path).is_file():
        raise ValueError(f"--tokenizer: no such file: {path}")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("--tokenizer needs the optional `tokenizers` package (pip install "
                         "tokenizers, or pip install -e '.[data]')") from None
    try:
        Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - whatever it cannot parse is one message
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise ValueError(f"--tokenizer {path}: not a tokenizer.json the tokenizers package "
                         f"reads ({text})") from None
    return data_mod.Codec("tokenizer", str(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Sample from a train.py checkpoint.")
    ap.add_argument("--checkpoint", default="runs/default/checkpoint")
    ap.add_argument("--prompt", default="def ",
                    help="text (token ids separated by spaces when the data had no tokenizer)")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    ap.add_argument("--top-k", type=int, default=40, help="0: no top-k cut")
    ap.add_argument("--top-p", type=float, default=1.0,
                    help="nucleus sampling: the most probable tokens up to this probability "
                         "mass (1: no cut)")
    ap.add_argument("--tokenizer", default=None,
                    help="a Hugging Face tokenizer.json to encode --prompt and decode the "
                         "output (default: the training data's codec)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda", "emulated"], default="auto")
    ns = ap.parse_args(argv)
    import gpuplan as gp

    try:
        if not Path(ns.checkpoint).is_dir():
            raise ValueError(f"--checkpoint: no such folder: {ns.checkpoint}")
        if ns.tokens < 0 or ns.temperature < 0:
            raise ValueError("--tokens and --temperature must be >= 0")
        if ns.top_k < 0:
            raise ValueError(f"--top-k must be an integer >= 0 (0: no top-k cut), given "
                             f"{ns.top_k}")
        if ns.device == "cuda" and not gp.device_available():
            raise ValueError("--device cuda: no usable CUDA device here (--device emulated "
                             "runs the CUDA kernels on the CPU)")
        if not 0.0 < ns.top_p <= 1.0:
            raise ValueError(f"--top-p must lie in (0, 1] (1: no cut), given {ns.top_p}")
        if not ns.prompt:
            raise ValueError("--prompt must not be empty")
        model, meta = load_dense(Path(ns.checkpoint))
        # The training data's codec (bytes, a tokenizer.json, nanoGPT's meta.pkl, or bare
        # ids); checkpoints from before token folders have none: bytes.
        args = meta.get("args") if isinstance(meta, dict) else None
        codec = (tokenizer_codec(ns.tokenizer) if ns.tokenizer else
                 data_mod.Codec.from_spec(args.get("codec") if isinstance(args, dict) else None))
        prompt = codec.encode(ns.prompt)[None]
        if prompt.max() >= model.config.vocab_size:
            raise ValueError(f"--prompt encodes to token id {int(prompt.max())}, outside the "
                             f"model's vocabulary of {model.config.vocab_size} (a tokenizer "
                             f"of another model?)")
    except (ValueError, ImportError) as exc:
        print(f"generate.py: error: {exc}", file=sys.stderr)
        return 2
    device = gp.backend.default_device() if ns.device == "auto" else ns.device
    model.to(device=device)
    prompt = prompt[:, -model.config.block_size:]
    out = model.generate(gp.to_device(prompt, device), ns.tokens, temperature=ns.temperature,
                         top_k=ns.top_k or None,
                         top_p=ns.top_p if ns.top_p < 1.0 else None, seed=ns.seed)
    cp = args.get("cp", 1) if isinstance(args, dict) else 1  # train.py's --cp (1 before it)
    print(f"# checkpoint step {meta.get('step')}, layout dp,pp,tp={meta.get('layout')}"
          f"{f', cp={cp}' if cp != 1 else ''}, {device}", file=sys.stderr)
    print(codec.decode(gp.to_host(out)[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
