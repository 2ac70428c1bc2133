"""Sharded checkpoints: one file per rank, written atomically, verified by a SHA-256."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from autograd.nn import Module
from dist.communicator import Communicator
from gpuplan.dtypes import as_dtype, bfloat16

FORMAT = "gpuplan-dist-checkpoint-1"


def shard_path(directory: str | os.PathLike, rank: int, size: int) -> Path:
    return Path(directory) / f"rank{rank:05d}-of-{size:05d}.npz"


def _atomic_write(path: Path, payload: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_checkpoint(directory: str | os.PathLike, module: Module,
                    comm: Communicator | None = None,
                    metadata: dict[str, Any] | None = None) -> Path:
    """Write this rank's `module.state_dict()` to `directory/rankRRRRR-of-SSSSS.npz`.

    Arrays are stored bit-exactly (bf16 as its raw 16-bit pattern) next to a manifest
    (names, dtypes, JSON `metadata`) and the file's content goes through a temporary file
    and a rename, so a crash never leaves a half-written shard; `<shard>.sha256` holds the
    checksum that load_checkpoint verifies. Ends with a barrier so that, on return, every
    rank's shard exists. Returns this rank's shard path.
    """
    rank, size = (0, 1) if comm is None else (comm.rank, comm.size)
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = module.state_dict()
    arrays: dict[str, np.ndarray] = {}
    manifest = {"format": FORMAT, "rank": rank, "size": size, "metadata": metadata or {},
                "entries": []}
    for i, (name, value) in enumerate(state.items()):
        value = np.ascontiguousarray(value)
        raw = value.view(np.uint16) if as_dtype(value.dtype) == bfloat16 else value
        arrays[f"a{i}"] = raw
        manifest["entries"].append({"name": name, "dtype": as_dtype(value.dtype).name,
                                    "shape": list(value.shape)})
    arrays["manifest"] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    payload = buf.getvalue()
    path = shard_path(out_dir, rank, size)
    _atomic_write(path, payload)
    digest = hashlib.sha256(payload).hexdigest()
    _atomic_write(path.with_name(path.name + ".sha256"), f"{digest}  {path.name}\n".encode())
    if comm is not None:
        comm.barrier()
    return path


def read_shard(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(state dict, manifest) of one shard, after checking its SHA-256."""
    path = Path(path)
    payload = path.read_bytes()
    sums = path.with_name(path.name + ".sha256")
    if not sums.exists():
        raise ValueError(f"load_checkpoint: {sums} is missing (incomplete checkpoint?)")
    expected = sums.read_text().split()[0]
    actual = hashlib.sha256(payload).hexdigest()
    if actual != expected:
        raise ValueError(f"load_checkpoint: checksum mismatch for {path}: expected "
                         f"{expected}, given {actual} (corrupt or partial file)")
    with np.load(io.BytesIO(payload)) as npz:
        manifest = json.loads(bytes(npz["manifest"]).decode())
        state = {}
        for i, entry in enumerate(manifest["entries"]):
            raw = npz[f"a{i}"]
            dtype = as_dtype(entry["dtype"])
            state[entry["name"]] = raw.view(dtype) if raw.dtype != dtype else raw
    return state, manifest


def load_checkpoint(directory: str | os.PathLike, module: Module,
                    comm: Communicator | None = None, strict: bool = True) -> dict[str, Any]:
    """Load this rank's shard (same rank and world size as when saved) into `module`.

    Verifies the checksum and the layout, then `module.load_state_dict(state, strict)`
    (values keep each parameter's device). Returns the saved metadata.
    """
    rank, size = (0, 1) if comm is None else (comm.rank, comm.size)
    path = shard_path(directory, rank, size)
    if not path.exists():
        found = sorted(p.name for p in Path(directory).glob("rank*-of-*.npz"))
        raise FileNotFoundError(f"load_checkpoint: expected {path.name} for rank {rank} of "
                                f"{size} in {directory}, given {found}")
    state, manifest = read_shard(path)
    if manifest.get("format") != FORMAT or (manifest["rank"], manifest["size"]) != (rank, size):
        raise ValueError(f"load_checkpoint: {path} holds rank {manifest.get('rank')} of "
                         f"{manifest.get('size')} (format {manifest.get('format')!r}); "
                         f"expected rank {rank} of {size}")
    module.load_state_dict(state, strict=strict)
    return manifest["metadata"]
