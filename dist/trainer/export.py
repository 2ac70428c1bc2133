"""Export the consolidated model of a checkpoint of any layout, in one process.

    python scripts/export.py --checkpoint runs/default/checkpoint --out model.safetensors
    python scripts/export.py --checkpoint runs/x/checkpoint/step_000200 --gpt2 gpt2-out/

--checkpoint is a checkpoint root (its `latest` committed step) or one step folder, written
by scripts/train.py with any tp x pp x dp layout. Every shard is verified against the
manifest (SHA-256), then the shards of the first data-parallel replica are assembled into
the dense nn.GPT state dict (dist.reshard). --out writes it as one safetensors file (nn.GPT's
parameter names; the model config and step in the file's metadata: train.py --init-from and
autograd.load read it); --gpt2 writes a Hugging Face GPT-2 folder (config.json +
model.safetensors) that transformers' GPT2LMHeadModel.from_pretrained loads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def export(checkpoint: Path, out: Path | None, gpt2: Path | None) -> list[Path]:
    """Write the consolidated model of `checkpoint` to `out` and/or `gpt2`; the paths."""
    import autograd as ag
    from autograd import nn
    from autograd.nn import gpt2_io
    from dist.reshard import gpt_config_from_json, read_dense_checkpoint
    from gpuplan.confined_write import check_inside

    dense = read_dense_checkpoint(checkpoint)
    # Nothing is written through a link out of its folder: all targets checked first.
    targets = [] if out is None else [(out, out.parent)]
    if gpt2 is not None:
        targets += [(gpt2 / name, gpt2) for name in (gpt2_io.CONFIG_FILE, gpt2_io.WEIGHTS_FILE)]
    for target, folder in targets:
        check_inside(target, folder)
    written = []
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)  # a missing folder is created
        meta = {"gpt_config": json.dumps(dense.config), "source": str(dense.step_dir),
                "step": str(dense.metadata.get("step", ""))}
        ag.save(dense.params, out, metadata=meta)
        written.append(out)
    if gpt2 is not None:
        model = nn.GPT(gpt_config_from_json(dense.config, str(dense.step_dir)))
        model.load_state_dict(dense.params)
        written.append(model.save_pretrained_gpt2(gpt2))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Export a train.py checkpoint (any layout) as "
                                             "one safetensors file or a GPT-2 folder.")
    ap.add_argument("--checkpoint", required=True,
                    help="checkpoint root (its latest step) or a step folder")
    ap.add_argument("--out", type=Path, default=None, help="model.safetensors to write")
    ap.add_argument("--gpt2", type=Path, default=None,
                    help="folder to write as a Hugging Face GPT-2 model")
    ns = ap.parse_args(argv)
    try:
        if ns.out is None and ns.gpt2 is None:
            raise ValueError("give --out FILE.safetensors and/or --gpt2 FOLDER")
        if ns.out is not None and ns.out.is_dir():
            raise ValueError(f"--out must name a file, given the folder {ns.out}")
        written = export(Path(ns.checkpoint), ns.out, ns.gpt2)
    except (ValueError, OSError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"export.py: error: {text}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
