"""Training text for the main job: byte-level tokens from a file, a folder, or (by default)
the Python standard library's own sources, which every machine with Python has.

Tokenization is bytes: token = byte value (vocabulary 256), so it is deterministic, needs
no download and round-trips any text. The default corpus is the `.py` files under
`sysconfig.get_paths()["stdlib"]`, sorted by relative path, concatenated with a separator
line and cut at `max_bytes`; the last `val_fraction` of the bytes is the validation split.
(The exact text depends on the Python version installed; the run prints the corpus's
SHA-256 so two runs can be compared.)
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VOCAB_SIZE = 256
_SEPARATOR = b"\n# ----\n"
_TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".c", ".h", ".json", ".toml", ".cfg", ".ini"}


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray  # uint8 tokens
    val: np.ndarray
    source: str
    sha256: str

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def decode(tokens: np.ndarray | list[int]) -> str:
    return bytes(int(t) & 0xFF for t in tokens).decode("utf-8", errors="replace")


def _files_under(root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in {"__pycache__", "site-packages",
                                                               "dist-packages", ".git"})
        for f in sorted(filenames):
            p = Path(dirpath) / f
            if p.suffix in _TEXT_SUFFIXES:
                files.append(p)
    return sorted(files, key=lambda p: str(p.relative_to(root)))


def load_corpus(path: str | None = None, max_bytes: int = 4_000_000,
                val_fraction: float = 0.1) -> Corpus:
    """Read `path` (file or folder) or the stdlib sources; raise FileNotFoundError/ValueError
    with a one-line message for a missing path or an empty/too-small corpus."""
    if path is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = [p for p in _files_under(root) if p.suffix == ".py"]
        source = f"python stdlib sources ({root})"
    else:
        root = Path(path)
        if not root.exists():
            raise FileNotFoundError(f"--data: no such file or folder: {path}")
        files = [root] if root.is_file() else _files_under(root)
        source = str(root)
    chunks, total = [], 0
    for f in files:
        if total >= max_bytes:
            break
        try:
            b = f.read_bytes()
        except OSError:
            continue
        chunks.append(b + _SEPARATOR)
        total += len(b) + len(_SEPARATOR)
    data = b"".join(chunks)[:max_bytes]
    if len(data) < 1000:
        raise ValueError(f"--data: corpus {source} has only {len(data)} bytes; need >= 1000")
    tokens = np.frombuffer(data, dtype=np.uint8).copy()
    n_val = max(int(len(tokens) * val_fraction), 1)
    return Corpus(tokens[:-n_val], tokens[-n_val:], source,
                  hashlib.sha256(data).hexdigest())


def get_batch(tokens: np.ndarray, batch_size: int, block_size: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random windows: x[b] = tokens[i:i+T], y[b] = tokens[i+1:i+T+1] (int64)."""
    if len(tokens) <= block_size + 1:
        raise ValueError(f"corpus split of {len(tokens)} tokens is shorter than the context "
                         f"{block_size} + 1")
    starts = rng.integers(0, len(tokens) - block_size - 1, size=batch_size)
    x = np.stack([tokens[s:s + block_size] for s in starts]).astype(np.int64)
    y = np.stack([tokens[s + 1:s + block_size + 1] for s in starts]).astype(np.int64)
    return x, y
