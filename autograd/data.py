"""Token data: TokenDataset (flat token ids, memory-mapped files) and DataLoader (random
windows keyed by (seed, step), split over data-parallel ranks)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np

import gpuplan as gp

__all__ = ["DataError", "TokenDataset", "DataLoader", "read_token_file", "LLMC_FORMATS",
           "FULL_CHECK_TOKENS"]

# llm.c's .bin files (dev/data/data_common.py there): a header of 256 int32 --
# [magic, version, token count, 0...] -- then the ids. magic -> (version, dtype, tokenizer
# name, its vocabulary size).
LLMC_FORMATS: dict[int, tuple[int, np.dtype, str, int]] = {
    20240520: (1, np.dtype(np.uint16), "gpt-2", 50257),
    20240801: (7, np.dtype(np.uint32), "llama-3", 128256),
}
_LLMC_HEADER_BYTES = 256 * 4

# At construction a dataset of at most this many tokens has every id checked against the
# vocabulary (chunked max over the memmap: ~1e10 ids/s from the page cache here, so 0.1 s
# for 2**30 ids, but a cold multi-GB file would be read from disk by every rank first).
# Larger ones check each drawn global batch instead (B * (T + 1) ids per step).
FULL_CHECK_TOKENS = 1 << 30
_CHUNK = 1 << 24


class DataError(ValueError):
    """Token data that cannot be trained on (the message is one line naming the file)."""


def read_token_file(path: str | os.PathLike, dtype: Any = None) -> tuple[np.memmap, dict]:
    """(read-only np.memmap of the ids, info) of a flat token file: nanoGPT's headerless
    ids (`dtype`, default uint16) or llm.c's (256-int32 header whose magic, version and
    token count are honoured; a `dtype` that contradicts the header is an error).

    info: {"format": "nanogpt" | "llm.c gpt-2" | "llm.c llama-3", "dtype": name,
    "vocab_size": the llm.c tokenizer's vocabulary or None}."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such token file")
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"{path}: empty token file")
    want = None if dtype is None else np.dtype(dtype)
    if want is not None and want not in (np.dtype(np.uint16), np.dtype(np.uint32)):
        raise DataError(f"{path}: token dtype must be uint16 or uint32, given {want}")
    header = _llmc_header(path, size)
    if header is not None:
        magic, version, n = header
        _, hdtype, name, vocab = LLMC_FORMATS[magic]
        if want is not None and want != hdtype:
            raise DataError(f"{path}: the llm.c header (magic {magic}, {name}) says {hdtype} "
                            f"tokens, given dtype {want}")
        tokens = np.memmap(path, dtype=hdtype, mode="r", offset=_LLMC_HEADER_BYTES, shape=(n,))
        return tokens, {"format": f"llm.c {name}", "dtype": hdtype.name, "vocab_size": vocab}
    want = want or np.dtype(np.uint16)
    if size % want.itemsize:
        raise DataError(f"{path}: {size} bytes is not a whole number of {want} tokens "
                        f"(wrong token dtype?)")
    tokens = np.memmap(path, dtype=want, mode="r")
    return tokens, {"format": "nanogpt", "dtype": want.name, "vocab_size": None}


def _llmc_header(path: Path, size: int) -> tuple[int, int, int] | None:
    """(magic, version, count) when the file starts with an llm.c header whose token count
    matches the file size exactly (so headerless ids are not taken for one by chance)."""
    with open(path, "rb") as f:
        start = f.read(12)
    magic = int(np.frombuffer(start[:4], dtype="<i4")[0]) if len(start) >= 4 else None
    if magic not in LLMC_FORMATS:
        return None
    if size < _LLMC_HEADER_BYTES:  # never read as ids: a cut header, not a token file
        raise DataError(f"{path}: starts with llm.c's magic {magic} but is {size} bytes, cut "
                        f"inside its {_LLMC_HEADER_BYTES}-byte header (expected the header "
                        f"and then the tokens)")
    version, n = (int(v) for v in np.frombuffer(start[4:12], dtype="<i4"))
    want_version, dtype, name, _ = LLMC_FORMATS[magic]
    expected = _LLMC_HEADER_BYTES + n * dtype.itemsize
    if version != want_version or n < 0 or size != expected:
        raise DataError(f"{path}: llm.c header (magic {magic}, {name}) with version {version} "
                        f"and {n} tokens does not match the file ({size} bytes; expected "
                        f"version {want_version} and {expected} bytes)")
    return magic, version, n


class TokenDataset:
    """Windows of a flat id sequence: item i is ``(x, y) = (ids[i:i+T], ids[i+1:i+T+1])``.

    Args:
        source: a token file (see `read_token_file`; memory-mapped, never read whole) or a
            1-D integer array (an np.memmap stays one).
        block_size: the context length T.
        vocab_size: ids must lie in [0, vocab_size); the whole sequence is checked now when
            it has at most `FULL_CHECK_TOKENS` ids, else every global batch the DataLoader
            draws is (see `fully_checked`). None: no check.
        dtype: a token file's id dtype (uint16 default, uint32); ignored for arrays.
        name: how errors name the data (default: the path, or "array").
    """

    def __init__(self, source: Any, block_size: int, *, vocab_size: int | None = None,
                 dtype: Any = None, name: str | None = None) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"TokenDataset: block_size must be an int >= 1, given "
                             f"{block_size!r}")
        if vocab_size is not None and (isinstance(vocab_size, bool)
                                       or not isinstance(vocab_size, int) or vocab_size < 1):
            raise ValueError(f"TokenDataset: vocab_size must be an int >= 1 or None, given "
                             f"{vocab_size!r}")
        self.info: dict = {"format": "array", "dtype": None, "vocab_size": None}
        if isinstance(source, (str, os.PathLike)):
            self.name = name or str(source)
            self.tokens, self.info = read_token_file(source, dtype)
        else:
            self.name = name or "array"
            # A device array comes to the host (CuPy refuses NumPy's implicit conversion); a
            # host array, a np.memmap included, is kept as it is.
            self.tokens = (gp.to_host(source) if gp.is_device_array(source)
                           else source if isinstance(source, np.ndarray) else np.asarray(source))
            if self.tokens.ndim != 1 or self.tokens.dtype.kind not in "iu":
                raise TypeError(f"TokenDataset: expected a 1-D integer array, given "
                                f"{self.tokens.dtype} of shape {self.tokens.shape}")
            self.info["dtype"] = self.tokens.dtype.name
        self.block_size, self.vocab_size = block_size, vocab_size
        if len(self.tokens) < block_size + 2:  # one window and one start to draw from
            raise DataError(f"{self.name}: {len(self.tokens)} tokens is too short for "
                            f"block_size {block_size} (need at least {block_size + 2})")
        self.fully_checked = vocab_size is None or _fits(self.tokens.dtype, vocab_size)
        if not self.fully_checked and len(self.tokens) <= FULL_CHECK_TOKENS:
            for lo in range(0, len(self.tokens), _CHUNK):
                self.check_ids(self.tokens[lo:lo + _CHUNK], lo)
            self.fully_checked = True

    def __len__(self) -> int:
        """The number of window starts the DataLoader draws from (the last start of a full
        window is left out, as the loader always has; see DataLoader)."""
        return len(self.tokens) - self.block_size - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.windows(np.array([i]))
        return x[0], y[0]

    def windows(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``x, y [len(starts), T]`` int64: ``x[b] = ids[s:s+T]``, ``y[b] = ids[s+1:s+T+1]``
        (one gather of T + 1 ids per row; a memmap reads only those pages)."""
        starts = np.asarray(starts, dtype=np.int64)
        if starts.size and (starts.min() < 0 or starts.max() > len(self)):
            raise IndexError(f"TokenDataset: window starts must lie in [0, {len(self)}], "
                             f"given [{starts.min()}, {starts.max()}]")
        rows = np.asarray(self.tokens[starts[:, None] + np.arange(self.block_size + 1)],
                          dtype=np.int64)
        return np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, 1:])

    def check_ids(self, ids: np.ndarray, offset: int | None = None) -> None:
        """Raise DataError when an id of `ids` lies outside [0, vocab_size)."""
        if self.vocab_size is None or ids.size == 0:
            return
        low, high = int(ids.min()), int(ids.max())
        if low >= 0 and high < self.vocab_size:
            return
        bad = high if high >= self.vocab_size else low
        where = "" if offset is None else \
            f" at position {offset + int(np.flatnonzero(np.asarray(ids) == bad)[0]):,}"
        raise DataError(f"{self.name}: token id {bad}{where} is outside the vocabulary "
                        f"[0, {self.vocab_size}) (wrong vocab size or token dtype?)")


def _fits(dtype: np.dtype, vocab_size: int) -> bool:
    """True when every value of `dtype` is a valid id (e.g. uint8 with 256 tokens)."""
    return dtype.kind == "u" and vocab_size >= 2 ** (8 * dtype.itemsize)


class DataLoader:
    """An iterable of ``(x, y)`` batches ``[batch_size / world_size, T]`` for one rank.

    Step s's global batch is `batch_size` windows whose starts are drawn by
    ``np.random.default_rng([seed, s]).integers(0, len(dataset), batch_size)``; data-
    parallel rank r takes rows ``[r * n, (r + 1) * n)``, n = batch_size / world_size. So the
    union over ranks is the single-process batch, whatever the layout, and a run resumed at
    step s (``start=s``) draws exactly what an uninterrupted one would. Each rank reads only
    its own rows, except that a dataset not checked whole (see TokenDataset) has every row
    of the global batch checked on every rank, so that all ranks raise DataError alike.

    Args:
        dataset: a TokenDataset.
        batch_size: the global batch (sequences), divisible by world_size.
        seed: the generator's key with the step.
        rank, world_size: this data-parallel rank and the group size (default 0 and 1);
            or `mesh`: a dist.ProcessMesh, whose data-parallel coordinates are used.
        start, steps: iteration yields steps start, start + 1, ... (steps of them, or
            forever when None).
        device: where the yielded Tensors live (default cpu).
    """

    def __init__(self, dataset: TokenDataset, batch_size: int, *, seed: int = 0,
                 rank: int | None = None, world_size: int | None = None, mesh: Any = None,
                 start: int = 0, steps: int | None = None, device: str | None = None) -> None:
        if mesh is not None:
            if rank is not None or world_size is not None:
                raise ValueError("DataLoader: give mesh or rank/world_size, not both")
            rank, world_size = mesh.dp_rank, mesh.shape.dp
        rank = 0 if rank is None else rank
        world_size = 1 if world_size is None else world_size
        if not isinstance(dataset, TokenDataset):
            raise TypeError(f"DataLoader: dataset must be a TokenDataset, given "
                            f"{type(dataset).__name__}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"DataLoader: rank must lie in [0, world_size={world_size}), "
                             f"given {rank}")
        if batch_size < 1 or batch_size % world_size:
            raise ValueError(f"DataLoader: batch_size must be a positive multiple of "
                             f"world_size {world_size}, given {batch_size}")
        if steps is not None and steps < 0:
            raise ValueError(f"DataLoader: steps must be >= 0 or None, given {steps}")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.start, self.steps, self.device = start, steps, device

    def starts(self, step: int) -> np.ndarray:
        """The global batch's window starts at `step` (the same on every rank)."""
        rng = np.random.default_rng([self.seed, step])
        return rng.integers(0, len(self.dataset), size=self.batch_size)

    def global_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's rows of step `step`: ``x, y [batch_size, T]`` int64."""
        x, y = self.dataset.windows(self.starts(step))
        self.dataset.check_ids(x)
        self.dataset.check_ids(y[:, -1:])
        return x, y

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows of step `step`'s global batch, as int64 arrays."""
        n = self.batch_size // self.world_size
        rows = slice(self.rank * n, (self.rank + 1) * n)
        if not self.dataset.fully_checked:  # every rank checks every row: all fail alike
            x, y = self.global_batch(step)
            return x[rows], y[rows]
        return self.dataset.windows(self.starts(step)[rows])

    def __len__(self) -> int:
        if self.steps is None:
            raise TypeError("DataLoader: no len() without steps (it iterates forever)")
        return self.steps

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        from autograd.factories import tensor

        steps = count(self.start) if self.steps is None else \
            range(self.start, self.start + self.steps)
        for step in steps:
            x, y = self.batch(step)
            yield tensor(x, device=self.device), tensor(y, device=self.device)
