"""Text -> a token folder for scripts/train.py --data (nanoGPT's layout: train.bin, val.bin).

    python scripts/prepare_data.py notes.txt data/notes                 # byte-level ids
    python scripts/prepare_data.py corpus/ data/corpus --tokenizer tokenizer.json

The input is a text file or a folder of text files (read as train.py reads them: a folder's
files sorted by relative path, each followed by a separator line). Ids are bytes (vocabulary 256) by
default, or those of a Hugging Face `tokenizers` tokenizer.json you supply (pip install
tokenizers, or the project's `data` extra; nothing is downloaded). Ids are written as
uint16 when the vocabulary has at most 65536 entries, else uint32, streamed to disk; the
last --val-fraction of them go to val.bin. meta.json records the vocabulary size, dtype
and tokenizer (copied into the folder) so that train.py needs no --vocab-size/--token-dtype
and samples (train.py, scripts/generate.py) decode with the same tokenizer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import BinaryIO

import numpy as np

from gpuplan.confined_write import atomic_file, atomic_write

from . import data as data_mod

_CHUNK_BYTES = 1 << 20  # a tokenizer encodes files in pieces of ~1 MiB cut at line ends


def _pieces(raw: bytes):
    """`raw` in pieces of about _CHUNK_BYTES, each ending at a newline where one exists."""
    start = 0
    while start < len(raw):
        end = min(start + _CHUNK_BYTES, len(raw))
        if end < len(raw):
            cut = raw.rfind(b"\n", start, end)
            end = cut + 1 if cut > start else end
        yield raw[start:end]
        start = end


class _Encoder:
    """bytes -> ids: byte values, or a tokenizer.json's ids."""

    def __init__(self, tokenizer: Path | None) -> None:
        self.tokenizer = None
        self.vocab_size = data_mod.VOCAB_SIZE
        if tokenizer is not None:
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise ValueError("--tokenizer needs the `tokenizers` package (pip install "
                                 "tokenizers, or pip install -e '.[data]')") from None
            try:
                self.tokenizer = Tokenizer.from_file(str(tokenizer))
            except Exception as exc:  # the Rust side raises its own Exception type
                raise ValueError(f"--tokenizer: {tokenizer} is not a tokenizer.json "
                                 f"({str(exc).splitlines()[0]})") from None
            self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.dtype = np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

    def __call__(self, raw: bytes) -> list[np.ndarray]:
        if self.tokenizer is None:
            return [np.frombuffer(raw, dtype=np.uint8).astype(self.dtype)]
        texts = [p.decode("utf-8", errors="replace") for p in _pieces(raw)]
        return [np.asarray(e.ids, dtype=self.dtype)
                for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]


def prepare(source: str, out: str, tokenizer: str | None = None,
            val_fraction: float = 0.1) -> dict:
    """Write OUT/train.bin, OUT/val.bin and OUT/meta.json (returned); ValueError (one
    line) for input that cannot be prepared. The files appear only when complete."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"--val-fraction must lie in (0, 1), given {val_fraction}")
    files, description = data_mod.text_files(source)
    encoder = _Encoder(None if tokenizer is None else Path(tokenizer))
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out: {out} is a file")
    out_dir.mkdir(parents=True, exist_ok=True)
    # As train.py reads text: a file as it is, a folder's files each with a separator line.
    sep = b"" if Path(source).is_file() else data_mod._SEPARATOR
    n = 0
    # Every file goes through a fresh exclusive temporary name (never a link planted in
    # OUT) and appears complete: val.bin first, then train.bin.
    with atomic_file(out_dir / "train.bin", out_dir) as train:
        for path in files:
            for ids in encoder(path.read_bytes() + sep):
                ids.tofile(train)
                n += len(ids)
        n_val = max(int(n * val_fraction), 1)
        if n - n_val < 1:
            raise ValueError(f"{description} gives only {n} tokens")
        _split(train, out_dir, n - n_val, encoder.dtype.itemsize)
    meta = {"vocab_size": encoder.vocab_size, "dtype": encoder.dtype.name,
            "encoding": "bytes" if tokenizer is None else "tokenizer",
            "tokenizer": None, "train_tokens": n - n_val, "val_tokens": n_val,
            "source": description}
    if tokenizer is not None:
        copy = out_dir / "tokenizer.json"
        if Path(tokenizer).resolve() != copy.resolve():
            atomic_write(copy, Path(tokenizer).read_bytes(), out_dir)
        meta["tokenizer"] = copy.name
    atomic_write(out_dir / "meta.json", (json.dumps(meta, indent=1) + "\n").encode(), out_dir)
    return meta


def _split(train: BinaryIO, out_dir: Path, n_train: int, itemsize: int) -> None:
    """The ids after the first n_train of `train` (the whole stream) -> val.bin; `train`
    cut there."""
    with atomic_file(out_dir / "val.bin", out_dir) as val:
        train.seek(n_train * itemsize)
        shutil.copyfileobj(train, val, 1 << 22)
    train.truncate(n_train * itemsize)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Text -> train.bin/val.bin/meta.json for "
                                             "scripts/train.py --data.")
    ap.add_argument("source", help="a text file or a folder of text files")
    ap.add_argument("out", help="the token folder to write")
    ap.add_argument("--tokenizer", default=None, metavar="PATH",
                    help="a Hugging Face tokenizers tokenizer.json (default: byte-level ids)")
    ap.add_argument("--val-fraction", type=float, default=0.1,
                    help="the last fraction of the ids that goes to val.bin")
    ns = ap.parse_args(argv)
    try:
        if ns.tokenizer is not None and not Path(ns.tokenizer).is_file():
            raise ValueError(f"--tokenizer: no such file: {ns.tokenizer}")
        meta = prepare(ns.source, ns.out, ns.tokenizer, ns.val_fraction)
    except (ValueError, OSError) as exc:
        print(f"prepare_data.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {ns.out}: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val "
          f"{meta['dtype']} ids, vocabulary {meta['vocab_size']} ({meta['encoding']}) from "
          f"{meta['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
