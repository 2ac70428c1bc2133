"""Checkpoint folders on disk: step folders, the `latest` pointer, fsynced writes, the
manifest, and the verification of every shard against it (see dist.checkpoint).

    root/
      latest                        "step_000200": the newest committed step (moved last)
      step_000100/  step_000200/    one committed checkpoint each:
        manifest.json               step, world size, metadata, and per shard: file, bytes,
                                    SHA-256, coordinates, entry names/dtypes/shapes
        rank00000-of-00004.npz ...  one shard per rank (arrays + a header with the same
                                    step, coordinates and entries)
      .tmp-step_000300-<id>/        a save in progress (removed by the next save)

A step folder is committed when it has its name and a manifest.json: both appear only after
every shard was written and fsynced. The SHA-256 detects corruption (truncation, bit flips,
a file of another step or rank), not tampering: whoever can write the shards can rewrite the
manifest too.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from gpuplan import confined_write
from gpuplan.confined_write import write_new
from gpuplan.dtypes import as_dtype, bfloat16

FORMAT = "gpuplan-dist-checkpoint-2"
MANIFEST = "manifest.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be saved or loaded: one line naming the file and what is
    wrong. `fallback`: the newest older committed checkpoint that verifies, when the error
    came from a load and there is one (else None)."""

    def __init__(self, message: str, fallback: Path | None = None) -> None:
        super().__init__(message)
        self.fallback = fallback


def step_dirname(step: int) -> str:
    return f"step_{step:06d}"


def shard_name(rank: int, size: int) -> str:
    return f"rank{rank:05d}-of-{size:05d}.npz"


def shard_path(directory: str | os.PathLike, rank: int, size: int) -> Path:
    return Path(directory) / shard_name(rank, size)


def step_of(path: Path) -> int | None:
    """The step of a folder named step_NNNNNN, else None."""
    match = _STEP_DIR.match(path.name)
    return None if match is None else int(match.group(1))


# ---- durable writes ---------------------------------------------------------------------

def fsync_dir(path: Path) -> None:
    """Make a folder's entries (new names, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, payload: bytes) -> None:
    """Create `path` (never through an existing file or link), write `payload` and fsync it
    (its folder is fsynced by the caller)."""
    write_new(path, payload)


def atomic_write(path: Path, payload: bytes, root: Path | None = None) -> None:
    """Write to a fresh exclusive temporary file, fsync, rename over `path`, fsync the
    folder: all or nothing, never through a link out of `root` (default: its folder)."""
    confined_write.atomic_write(path, payload, root)


# ---- shard payloads ----------------------------------------------------------------------

def pack_shard(header: dict[str, Any], state: dict[str, np.ndarray]) -> bytes:
    """An .npz of `state` (bf16 as its raw 16-bit pattern, bit-exact) and the JSON header,
    whose "entries" it fills with each array's name, dtype and shape."""
    arrays: dict[str, np.ndarray] = {}
    header["entries"] = []
    for i, (name, value) in enumerate(state.items()):
        value = np.ascontiguousarray(value)
        arrays[f"a{i}"] = value.view(np.uint16) if as_dtype(value.dtype) == bfloat16 else value
        header["entries"].append({"name": name, "dtype": as_dtype(value.dtype).name,
                                  "shape": list(value.shape)})
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def unpack_shard(payload: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(state, header) of a shard; every array must be stored with the dtype and shape its
    header entry names (bf16 as its 16-bit pattern): nothing is reinterpreted or broadcast."""
    with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
        header = json.loads(bytes(npz["header"]).decode())
        state = {}
        for i, entry in enumerate(header["entries"]):
            raw = npz[f"a{i}"]
            dtype, shape = as_dtype(entry["dtype"]), tuple(entry["shape"])
            stored = np.dtype(np.uint16) if dtype == bfloat16 else dtype
            if raw.dtype != stored or raw.shape != shape:
                raise ValueError(f"array {entry['name']!r} is stored as {raw.dtype} "
                                 f"{raw.shape}, its entry says {dtype.name} {shape}")
            state[entry["name"]] = raw.view(dtype) if dtype == bfloat16 else raw
    return state, header


def digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


# ---- finding and reading committed checkpoints --------------------------------------------

def inside(path: Path, folder: Path) -> bool:
    """Whether `path`, links resolved, lies in `folder` (links resolved)."""
    return path.resolve().is_relative_to(folder.resolve())


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """The committed step folders under `root` (those with a manifest), by step."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: step_of(p) or 0)


def read_latest(root: Path) -> Path | None:
    """The step folder `root/latest` names (None without one); a bad pointer raises."""
    pointer = root / LATEST
    if not pointer.exists():
        return None
    name = pointer.read_text(errors="replace").strip()
    if step_of(Path(name)) is None or "/" in name:
        raise CheckpointError(f"{pointer}: expected a step folder name like step_000200, "
                              f"given {name[:40]!r}")
    step_dir = root / name
    if step_dir.exists() and not inside(step_dir, root):
        raise CheckpointError(f"{pointer}: names {name}, which resolves outside {root} "
                              f"(a link out of the checkpoint folder)")
    return step_dir


def resolve(path: str | os.PathLike) -> Path:
    """The committed step folder `path` means: itself when it is a step folder, else the one
    `path/latest` names, else (a crash before the first pointer move) the newest committed
    one under `path`. Raises CheckpointError naming what is missing."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    if (path / MANIFEST).exists() or step_of(path) is not None:
        if not (path / MANIFEST).exists():
            raise CheckpointError(f"{path / MANIFEST} is missing: {path.name} is not a "
                                  f"committed checkpoint (an interrupted save?)")
        return path
    latest = read_latest(path)
    if latest is not None:
        if not (latest / MANIFEST).exists():
            raise CheckpointError(f"{path / LATEST} names {latest.name}, which is not a "
                                  f"committed checkpoint ({latest / MANIFEST} is missing)")
        return latest
    committed = list_checkpoints(path)
    if committed:
        return committed[-1]
    old = " (it holds unversioned rank*.npz shards of an older format)" \
        if any(path.glob("rank*-of-*.npz")) else ""
    raise CheckpointError(f"{path}: no committed checkpoint (no {LATEST} pointer, no "
                          f"step_* folder with a {MANIFEST}){old}")


def read_manifest(step_dir: Path) -> dict[str, Any]:
    """The manifest of a committed step folder, its fields checked."""
    path = step_dir / MANIFEST
    text = path.read_bytes()
    if not text:
        raise CheckpointError(f"{path}: empty file (a save interrupted before fsync?)")
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc}; truncated?)") from None
    except RecursionError:
        raise CheckpointError(f"{path}: JSON nested too deeply (not a manifest "
                              f"train.py writes)") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CheckpointError(f"{path}: expected format {FORMAT!r}, given {found!r}")
    step, size = manifest.get("step"), manifest.get("world_size")
    shards = manifest.get("shards")
    if not isinstance(step, int) or not isinstance(size, int) or not isinstance(shards, list) \
            or len(shards) != size or not all(isinstance(s, dict) for s in shards):
        raise CheckpointError(f"{path}: malformed (expected an int step, an int world_size "
                              f"and one shard record per rank)")
    if step_of(step_dir) not in (None, step):
        raise CheckpointError(f"{path}: says step {step}, but its folder is {step_dir.name}")
    return manifest


def read_shard(step_dir: Path, manifest: dict[str, Any],
               rank: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(state, header) of rank `rank`'s shard after checking its size, SHA-256, step,
    coordinates and entries against the manifest."""
    record = manifest["shards"][rank]
    name = record.get("file")
    if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name \
            or "\\" in name:
        raise CheckpointError(f"{step_dir / MANIFEST}: shard record {rank}: 'file' must be a "
                              f"file name in its step folder, given {str(name)[:60]!r}")
    path = step_dir / name
    if path.exists() and not inside(path, step_dir):
        raise CheckpointError(f"{path}: resolves outside its step folder {step_dir} (a link "
                              f"out of the checkpoint); refused")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (the manifest lists it for rank {rank})")
    payload = path.read_bytes()
    if len(payload) != record.get("bytes"):
        raise CheckpointError(f"{path}: {len(payload)} bytes, the manifest says "
                              f"{record.get('bytes')} (truncated or replaced)")
    if digest(payload) != record.get("sha256"):
        raise CheckpointError(f"{path}: SHA-256 {digest(payload)[:16]}... does not match the "
                              f"manifest's {str(record.get('sha256'))[:16]}... (corrupt, or "
                              f"a shard of another step or rank)")
    try:
        state, header = unpack_shard(payload)
    except Exception as exc:  # noqa: BLE001 - any unreadable payload is one message
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(f"{path}: unreadable shard ({type(exc).__name__}: "
                              f"{text})") from None
    if header.get("step") != manifest["step"]:
        raise CheckpointError(f"{path}: holds step {header.get('step')}, the manifest says "
                              f"step {manifest['step']} (shards of different steps)")
    saved, listed = header.get("coordinates") or {}, record.get("coordinates") or {}
    for key in sorted(listed.keys() | saved.keys()):
        if saved.get(key) != listed.get(key):
            raise CheckpointError(f"{path}: holds the shard of {key} {saved.get(key)}, the "
                                  f"manifest lists it for {key} {listed.get(key)}")
    if header.get("entries") != record.get("entries"):
        raise CheckpointError(f"{path}: its entries (names, dtypes, shapes) differ from the "
                              f"manifest's record for rank {rank}")
    return state, header


def verify_checkpoint(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """(step folder, manifest) after reading and checking every shard, in this process."""
    step_dir = resolve(path)
    manifest = read_manifest(step_dir)
    for rank in range(manifest["world_size"]):
        read_shard(step_dir, manifest, rank)
    return step_dir, manifest


def find_fallback(failed: Path, world_size: int | None = None) -> Path | None:
    """The newest committed checkpoint beside `failed` (a step folder, or a root whose
    `latest` could not be used) with a lower step that verifies; None if there is none."""
    failed = Path(failed)
    step = step_of(failed)
    root = failed.parent if step is not None else failed
    if step is None and root.is_dir():
        try:  # a root whose `latest` names a folder that is not committed: older than that
            latest = read_latest(root)
            step = None if latest is None else step_of(latest)
        except (CheckpointError, OSError):
            pass
    for candidate in reversed(list_checkpoints(root)):
        if step is not None and (step_of(candidate) or 0) >= step:
            continue
        try:
            _, manifest = verify_checkpoint(candidate)
        except Exception:  # noqa: BLE001 - any problem: not a fallback
            continue
        if world_size is None or manifest["world_size"] == world_size:
            return candidate
    return None


__all__ = ["FORMAT", "LATEST", "MANIFEST", "CheckpointError", "atomic_write", "digest",
           "find_fallback", "fsync_dir", "list_checkpoints", "pack_shard", "read_latest",
           "read_manifest", "read_shard", "resolve", "shard_name", "shard_path",
           "step_dirname", "step_of", "unpack_shard", "verify_checkpoint", "write_file"]
