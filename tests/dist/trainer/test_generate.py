"""dist.trainer.generate (scripts/generate.py): a checkpoint whose recorded model config,
parameter specs or codec are malformed is one error line (exit 2), never a traceback."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

import dist
from autograd import nn
from dist.trainer import generate

_TINY = dict(vocab_size=256, block_size=8, n_layer=1, n_head=1, n_embd=4)


def _checkpoint(root: Path) -> Path:
    model = nn.GPT(nn.GPTConfig(**_TINY))
    return dist.save_checkpoint(root, model, step=1,
                                metadata={"step": 1, "layout": [1, 1, 1],
                                          "args": {"codec": {"kind": "bytes", "path": None}}})


def _edit_header(step_dir: Path, edit) -> None:
    """Apply `edit(header)` to the one shard's JSON header, fixing the manifest's size and
    digest, so only the reader's checks of the header's content can notice."""
    shard = step_dir / "rank00000-of-00001.npz"
    with np.load(shard) as npz:
        arrays = {k: npz[k] for k in npz.files}
    header = json.loads(bytes(arrays["header"]).decode())
    edit(header)
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    shard.write_bytes(buf.getvalue())
    manifest = json.loads((step_dir / "manifest.json").read_text())
    manifest["shards"][0].update(bytes=len(buf.getvalue()),
                                 sha256=hashlib.sha256(buf.getvalue()).hexdigest())
    (step_dir / "manifest.json").write_text(json.dumps(manifest))


def test_a_checkpoint_samples(tmp_path, capsys):
    _checkpoint(tmp_path / "ck")
    assert generate.main(["--checkpoint", str(tmp_path / "ck"), "--tokens", "3",
                          "--device", "cpu"]) == 0
    assert "checkpoint step 1" in capsys.readouterr().err


@pytest.mark.parametrize("edit,message", [
    (lambda h: h["config"].update(colour=1),
     r"the model config has fields GPTConfig does not have: \['colour'\]"),
    (lambda h: h["config"].update(vocab_size=10**13), "vocab_size must be an integer in"),
    (lambda h: h["config"].update(n_embd=[4]), "n_embd must be an integer in"),
    (lambda h: h.update(specs={"wte.weight": {"name": 5}}),
     r"parameter specs: 'wte.weight' is not a spec of one of its arrays"),
    (lambda h: h.update(specs={"wte.weight": {"name": "wte.weight", "axis": 0,
                                              "index": [10**6]}}),
     "indices outside the dense"),
    (lambda h: h["metadata"].update(args={"codec": ["bytes"]}),
     r"the data's codec must be \{'kind': name, 'path': file or null\}"),
])
def test_malformed_records_are_one_line(tmp_path, capsys, edit, message):
    """Before: TypeError (unknown config key), a NumPy MemoryError (vocabulary 10**13),
    KeyError/IndexError (specs) and AttributeError (codec) tracebacks."""
    step_dir = _checkpoint(tmp_path / "ck")
    _edit_header(step_dir, edit)
    if "codec" in message:  # the codec is read from the manifest's metadata
        manifest = json.loads((step_dir / "manifest.json").read_text())
        manifest["metadata"]["args"] = {"codec": ["bytes"]}
        (step_dir / "manifest.json").write_text(json.dumps(manifest))
    assert generate.main(["--checkpoint", str(tmp_path / "ck"), "--tokens", "3",
                          "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("generate.py: error: ") and err.count("\n") == 1, err
    assert re.search(message, err), err


def test_bad_options_are_one_line(tmp_path, capsys, monkeypatch):
    """Before: --top-k -5 was accepted; --device cuda without a GPU raised a traceback."""
    import gpuplan as gp

    _checkpoint(tmp_path / "ck")
    monkeypatch.setattr(gp, "device_available", lambda: False)
    for args, message in ((["--top-k", "-5"], "--top-k must be an integer >= 0 (0: no top-k "
                                               "cut), given -5"),
                          (["--device", "cuda"], "--device cuda: no usable CUDA device here")):
        assert generate.main(["--checkpoint", str(tmp_path / "ck"), *args]) == 2
        assert capsys.readouterr().err == f"generate.py: error: {message}" + (
            " (--device emulated runs the CUDA kernels on the CPU)\n" if "cuda" in args
            else "\n")
