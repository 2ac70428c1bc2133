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
_OPT = "optimizer/"


def _rng_state() -> dict[str, Any]:
    from autograd import random as ag_random
    from dist.tensor_parallel.random import get_rng_tracker

    gen = ag_random.default_generator
    return {"default": list(gen.get_state()), "host": gen.host.bit_generator.state,
            "tracker": {k: list(v) for k, v in get_rng_tracker().get_states().items()}}


def _set_rng_state(saved: dict[str, Any]) -> None:
    from autograd import random as ag_random
    from dist.tensor_parallel.random import get_rng_tracker

    gen = ag_random.default_generator
    gen.set_state(tuple(saved["default"]))
    gen.host.bit_generator.state = saved["host"]
    get_rng_tracker().set_states({k: tuple(v) for k, v in saved["tracker"].items()})


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
                    metadata: dict[str, Any] | None = None, optimizer: Any = None,
                    rng: bool = True) -> Path:
    """Write this rank's `module.state_dict()` to `directory/rankRRRRR-of-SSSSS.npz`.

    With `optimizer`, its `state_dict()` goes in too (arrays as entries named
    ``optimizer/<param index>/<key>``, the rest in the manifest); with `rng` (default), the
    default dropout generator's (seed, offset), its host generator and the RNG tracker's
    states, so a resumed run draws the same masks. Arrays are stored bit-exactly (bf16 as
    its raw 16-bit pattern) next to a manifest (names, dtypes, JSON `metadata`) and the
    file's content goes through a temporary file and a rename, so a crash never leaves a
    half-written shard; `<shard>.sha256` holds the checksum that load_checkpoint verifies.
    Ends with a barrier so that, on return, every rank's shard exists. Returns this rank's
    shard path.
    """
    rank, size = (0, 1) if comm is None else (comm.rank, comm.size)
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = dict(module.state_dict())
    manifest = {"format": FORMAT, "rank": rank, "size": size, "metadata": metadata or {},
                "entries": []}
    if optimizer is not None:
        opt_state = optimizer.state_dict()
        scalars: dict[str, dict[str, Any]] = {}
        for index, entry in opt_state["state"].items():
            for key, value in entry.items():
                if hasattr(value, "shape"):
                    state[f"{_OPT}{index}/{key}"] = value
                else:
                    scalars.setdefault(str(index), {})[key] = value
        manifest["optimizer"] = {"param_groups": opt_state["param_groups"],
                                 "scalars": scalars}
    if rng:
        manifest["rng"] = _rng_state()
    arrays: dict[str, np.ndarray] = {}
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
                    comm: Communicator | None = None, strict: bool = True,
                    optimizer: Any = None, rng: bool = True) -> dict[str, Any]:
    """Load this rank's shard (same rank and world size as when saved) into `module`.

    Verifies the checksum and the layout, then `module.load_state_dict(state, strict)`
    (values keep each parameter's device); with `optimizer`, restores its state (an error
    if the shard has none); with `rng`, restores the RNG state saved with the shard.
    Returns the saved metadata.
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
    opt_arrays = {k: state.pop(k) for k in [k for k in state if k.startswith(_OPT)]}
    if optimizer is not None:
        if "optimizer" not in manifest:
            raise ValueError(f"load_checkpoint: {path} holds no optimizer state (saved "
                             f"without optimizer=)")
        saved = manifest["optimizer"]
        entries: dict[int, dict[str, Any]] = {}
        for key, value in opt_arrays.items():
            index, name = key[len(_OPT):].split("/", 1)
            entries.setdefault(int(index), {})[name] = value
        for index, scalars in saved["scalars"].items():
            entries.setdefault(int(index), {}).update(scalars)
        groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else g
                  for g in saved["param_groups"]]
    module.load_state_dict(state, strict=strict)
    if optimizer is not None:
        optimizer.load_state_dict({"state": entries, "param_groups": groups})
    if rng and "rng" in manifest:
        _set_rng_state(manifest["rng"])
    return manifest["metadata"]
