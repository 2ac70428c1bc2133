"""Sharded, step-versioned checkpoints with a commit protocol that a crash cannot break.

Saving step s (every rank calls `save_checkpoint`; the layout on disk is described in
dist.checkpoint_files):

1. rank 0 creates ``root/.tmp-step_<s>-<id>/`` (removing what a crashed save left) and
   broadcasts its name;
2. every rank writes its shard there and fsyncs it, then reports the shard's size, SHA-256,
   coordinates and entries (or its error: out of disk, ...) to rank 0;
3. rank 0, once every rank confirmed, writes ``manifest.json`` (atomically: temporary file,
   fsync, rename), renames the folder to ``root/step_<s>``, moves ``root/latest`` to it
   (atomically), then removes all but the `keep` newest; it broadcasts the outcome, so
   every rank returns, or raises the same `CheckpointError`, together.

A crash at any instant leaves the previous committed checkpoint and pointer intact: nothing
of a save is visible under a step name before step 3's rename, and `latest` moves after it.
Loading (`load_checkpoint`) checks on every rank that its shard is the one the manifest
lists for it (size and SHA-256: corruption, a shard of another step or rank) and that its
coordinates, names and shapes are those this rank's model expects; any problem raises the
same one-line CheckpointError on every rank (never a hang), naming the newest older
committed checkpoint that verifies. The SHA-256 detects corruption, not tampering.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from autograd.nn import GPTConfig, LlamaConfig, Module
from dist import zero_checkpoint
from dist.checkpoint_files import (
    FORMAT,
    LATEST,
    MANIFEST,
    CheckpointError,
    atomic_write,
    digest,
    find_fallback,
    fsync_dir,
    list_checkpoints,
    pack_shard,
    read_manifest,
    read_shard,
    resolve,
    shard_name,
    shard_path,
    step_dirname,
    step_of,
    verify_checkpoint,
    write_file,
)
from dist.communicator import Communicator
from dist.models.configs import config_json

_OPT = "optimizer/"


class _Solo:
    """The object collectives of a one-process run (comm=None)."""

    rank, size = 0, 1

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        return obj

    def gather_object(self, obj: Any, root: int = 0) -> list[Any]:
        return [obj]

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, CheckpointError):
        return str(exc)
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    text = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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


def coordinates_of(module: Module, comm: Any, extra: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """Where this rank's shard belongs: its rank and the world size and, for a model-parallel
    model (a dist.ParallelGPT or ParallelLlama), the layout and this rank's mesh coordinates
    (dp, pp, tp, and cp when context-parallel); `extra`
    (JSON) is added. Saved with each shard and compared on load."""
    coords: dict[str, Any] = {"rank": comm.rank, "world_size": comm.size}
    if hasattr(module, "shard_specs") and hasattr(module, "tp_comm"):
        groups = {"dp": module.dp_comm, "pp": module.pp_comm, "tp": module.tp_comm}
        if getattr(module, "cp_comm", None) is not None:  # context parallel (cp > 1) only:
            groups["cp"] = module.cp_comm  # a cp=1 run keeps the three-key layout it had
        coords["layout"] = {k: 1 if c is None else c.size for k, c in groups.items()}
        coords["mesh"] = {k: 0 if c is None else c.rank for k, c in groups.items()}
    coords.update(extra or {})
    return coords


def layout_record(module: Module) -> dict[str, Any]:
    """What a shard records so that another layout can reshard it (dist.reshard): each
    parameter's `ShardSpec` JSON (where it sits in the dense model; whole for a dense
    module) and, for a GPT or a Llama (``config`` a GPTConfig or LlamaConfig), that config
    (`dist.models.configs.config_json`)."""
    specs = {n: (p.shard_spec.to_json() if hasattr(p, "shard_spec") else {"name": n})
             for n, p in module.named_parameters()}
    out: dict[str, Any] = {"specs": specs}
    config = getattr(module, "config", None)
    if isinstance(config, (GPTConfig, LlamaConfig)):
        out["config"] = config_json(config)
    return out


def save_checkpoint(directory: str | os.PathLike, module: Module,
                    comm: Communicator | None = None,
                    metadata: dict[str, Any] | None = None, optimizer: Any = None,
                    rng: bool = True, *, step: int | None = None, keep: int | None = None,
                    coordinates: dict[str, Any] | None = None) -> Path:
    """Commit this step's checkpoint to ``directory/step_<step>/`` (every rank calls it).

    Each rank's shard holds its `module.state_dict()` bit-exactly (bf16 as its raw 16-bit
    pattern), with `optimizer`: its `state_dict()` (arrays as entries named
    ``optimizer/<param index>/<key>``; a `dist.ZeroRedundancyOptimizer`'s is this rank's
    slice of the state, see dist.zero_checkpoint), with `rng` (default): the default dropout
    generator's (seed, offset), its host generator and the RNG tracker's states, so a
    resumed run draws the same masks; and the JSON `metadata` (rank 0's also goes into the
    manifest). `step` defaults to ``metadata["step"]`` (else 0); `keep`: how many committed
    checkpoints to keep (the newest by step, and always the new one; None: all);
    `coordinates`: JSON added to `coordinates_of`. See the module docstring for the commit
    protocol. Returns the step folder; raises CheckpointError on every rank if any rank
    could not write its shard or the commit failed (the previous checkpoint stays).
    """
    comm = _Solo() if comm is None else comm
    step = int((metadata or {}).get("step", 0)) if step is None else step
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint: step must be an int >= 0, given {step!r}")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"save_checkpoint: keep must be an int >= 1 or None, given {keep!r}")
    root = Path(directory)
    staging, error = None, None
    if comm.rank == 0:
        try:
            staging = str(_prepare_staging(root, step))
        except Exception as exc:  # noqa: BLE001 - broadcast: every rank raises it
            error = f"{root}: cannot create the checkpoint folder ({_one_line(exc)})"
    staging, error = comm.bcast_object((staging, error), root=0)
    if error is not None:
        raise CheckpointError(error)
    path = Path(staging) / shard_name(comm.rank, comm.size)
    try:
        record: dict[str, Any] = _write_shard(path, module, comm, step, metadata, optimizer,
                                              rng, coordinates)
    except Exception as exc:  # noqa: BLE001 - reported to rank 0, which aborts the commit
        record = {"error": f"rank {comm.rank}: {path.name}: {_one_line(exc)}"}
    records = comm.gather_object(record, root=0)
    outcome = None
    if comm.rank == 0:
        try:
            _commit(root, Path(staging), step, metadata, records, keep)
        except Exception as exc:  # noqa: BLE001 - every rank raises it below
            outcome = f"save_checkpoint: step {step} not committed: {_one_line(exc)}"
            shutil.rmtree(staging, ignore_errors=True)
    outcome = comm.bcast_object(outcome, root=0)
    if outcome is not None:
        raise CheckpointError(outcome)
    return root / step_dirname(step)


def _remove(path: Path) -> None:
    """Delete a folder of ours; a link found there is unlinked, never followed."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _prepare_staging(root: Path, step: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-step_*"):
        _remove(stale)  # a crashed save's (one job per root)
    for stale in root.glob(".trash-step_*"):
        _remove(stale)
    for stale in root.glob(f".{LATEST}.*tmp"):  # a pointer move killed before its rename
        stale.unlink(missing_ok=True)
    staging = root / f".tmp-{step_dirname(step)}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    return staging


def _write_shard(path: Path, module: Module, comm: Any, step: int, metadata: Any,
                 optimizer: Any, rng: bool, coordinates: Any) -> dict[str, Any]:
    """Write and fsync this rank's shard; returns its manifest record."""
    state = dict(module.state_dict())
    header: dict[str, Any] = {"format": FORMAT, "step": step, "rank": comm.rank,
                              "size": comm.size,
                              "coordinates": coordinates_of(module, comm, coordinates),
                              "metadata": metadata or {}}
    header.update(layout_record(module))
    if optimizer is not None:
        opt_state = optimizer.state_dict()
        names = {id(p): n for n, p in module.named_parameters()}
        # Parameter names by optimizer index: what resharding the moments needs.
        order = [names.get(id(p)) for g in optimizer.param_groups for p in g["params"]]
        if "zero" in opt_state:  # a ZeroRedundancyOptimizer: this rank's slice, as it is
            arrays, header["optimizer"] = zero_checkpoint.pack(opt_state, order)
            state.update(arrays)
        else:
            scalars: dict[str, dict[str, Any]] = {}
            for index, entry in opt_state["state"].items():
                for key, value in entry.items():
                    if hasattr(value, "shape"):
                        state[f"{_OPT}{index}/{key}"] = value
                    else:
                        scalars.setdefault(str(index), {})[key] = value
            header["optimizer"] = {"param_groups": opt_state["param_groups"],
                                   "scalars": scalars, "names": order}
    if rng:
        header["rng"] = _rng_state()
    payload = pack_shard(header, state)
    write_file(path, payload)
    return {"file": path.name, "rank": comm.rank, "bytes": len(payload),
            "sha256": digest(payload), "coordinates": header["coordinates"],
            "entries": header["entries"], "config": header.get("config")}


def _commit(root: Path, staging: Path, step: int, metadata: Any,
            records: list[dict[str, Any]], keep: int | None) -> None:
    """Rank 0: manifest last into the staging folder, rename it, move `latest`, prune."""
    errors = [r["error"] for r in records if "error" in r]
    if errors:
        more = f" (and {len(errors) - 1} other ranks)" if len(errors) > 1 else ""
        raise CheckpointError(errors[0] + more)
    manifest = {"format": FORMAT, "step": step, "world_size": len(records),
                "metadata": metadata or {}, "shards": records}
    fsync_dir(staging)
    atomic_write(staging / MANIFEST, json.dumps(manifest, indent=1).encode())
    final = root / step_dirname(step)
    replaced = None
    # the same step saved again (a run resumed from an older one); a link there is moved
    # aside, never followed
    if os.path.lexists(final):
        replaced = root / f".trash-{final.name}-{uuid.uuid4().hex[:8]}"
        os.replace(final, replaced)
    os.replace(staging, final)
    fsync_dir(root)
    atomic_write(root / LATEST, f"{final.name}\n".encode())
    if replaced is not None:
        _remove(replaced)
    if keep is not None:
        _prune(root, keep, final)


def _prune(root: Path, keep: int, current: Path) -> None:
    """Remove all but the `keep` newest committed checkpoints, never `current`; each goes
    by a rename first, so a crash never leaves a half-deleted folder under a step name."""
    others = [p for p in list_checkpoints(root) if p != current]
    for old in others[:max(0, len(others) - (keep - 1))]:
        trash = root / f".trash-{old.name}-{uuid.uuid4().hex[:8]}"
        os.replace(old, trash)
        fsync_dir(root)
        _remove(trash)


def load_checkpoint(directory: str | os.PathLike, module: Module,
                    comm: Communicator | None = None, strict: bool = True,
                    optimizer: Any = None, rng: bool = True, *,
                    coordinates: dict[str, Any] | None = None,
                    reshard: bool = False) -> dict[str, Any]:
    """Load this rank's shard of a committed checkpoint into `module` (every rank calls it).

    `directory`: a step folder, or a checkpoint root (its `latest`). The world size must
    be the saved one; this rank's shard must verify against the manifest and hold the
    coordinates (`coordinates_of(module, comm, coordinates)`), parameter names (all of
    them, with `strict`) and shapes this rank expects. Then `module.load_state_dict`
    (values keep each parameter's device); with `optimizer`, its state (an error if the
    shard has none; a ZeRO shard goes as it is into the same rank of a ZeRO optimizer of
    the same size, else the slices of the rank's data-parallel group are assembled into
    the replicated state, dist.zero_checkpoint); with `rng`, the RNG state saved with the
    shard. Returns this rank's saved metadata. Any problem on any rank raises the same
    one-line CheckpointError on every rank, its `fallback` the newest older committed
    checkpoint that verifies.

    With `reshard`, a checkpoint written by another layout (world size, or tp x pp x dp)
    is assembled and cut for this one instead (dist.reshard: model and optimizer state, the
    saved model config checked against ``module.config``; the RNG state is not restored)
    and the manifest's metadata returned; the same layout loads as above.
    """
    comm = _Solo() if comm is None else comm
    found: tuple[Any, ...]
    found = _find(Path(directory), comm.size) if comm.rank == 0 else ()
    step_name, manifest, error, fallback = comm.bcast_object(found, root=0)
    if error is not None:
        raise CheckpointError(error, fallback and Path(fallback))
    step_dir = Path(step_name)
    if isinstance(getattr(module, "config", None), (GPTConfig, LlamaConfig)):  # one line
        from dist.reshard import check_config  # same manifest and config: every rank alike

        check_config(manifest["shards"][0].get("config"), module.config, str(step_dir))
    try:
        if reshard and not _same_layout(manifest, module, comm, coordinates):
            from dist.reshard import load_resharded

            meta = load_resharded(step_dir, module, optimizer)
        else:
            meta = _load_own_shard(step_dir, manifest, module, comm, strict, optimizer,
                                   rng, coordinates)
        error = None
    except Exception as exc:  # noqa: BLE001 - gathered: every rank raises the first error
        meta, error = None, _one_line(exc)
    errors = [e for e in comm.all_gather_object(error) if e]
    if errors:
        fallback = find_fallback(step_dir, comm.size) if comm.rank == 0 else None
        fallback = comm.bcast_object(fallback and str(fallback), root=0)
        raise CheckpointError(errors[0], fallback and Path(fallback))
    return meta


def _same_layout(manifest: dict[str, Any], module: Module, comm: Any,
                 coordinates: Any) -> bool:
    """Whether the checkpoint was written by this world size and model layout (the same on
    every rank: it compares the manifest with this run's layout, not with this rank)."""
    if manifest["world_size"] != comm.size:
        return False
    saved = (manifest["shards"][0].get("coordinates") or {}).get("layout")
    return saved == coordinates_of(module, comm, coordinates).get("layout")


def _find(directory: Path, size: int) -> tuple[Any, ...]:
    """Rank 0: (step folder, manifest, None, None) or (None, None, error, fallback)."""
    failed = directory
    try:
        failed = resolve(directory)
        return str(failed), read_manifest(failed), None, None
    except Exception as exc:  # noqa: BLE001 - broadcast: every rank raises it
        fallback = find_fallback(failed, size)
        return None, None, _one_line(exc), fallback and str(fallback)


def _load_own_shard(step_dir: Path, manifest: dict[str, Any], module: Module, comm: Any,
                    strict: bool, optimizer: Any, rng: bool, coordinates: Any
                    ) -> dict[str, Any]:
    if manifest["world_size"] != comm.size:
        raise CheckpointError(f"{step_dir / MANIFEST}: written by {manifest['world_size']} "
                              f"ranks, this run has {comm.size}")
    record = manifest["shards"][comm.rank]
    path = step_dir / str(record.get("file"))
    _check_coordinates(path, record.get("coordinates") or {},
                       coordinates_of(module, comm, coordinates))
    _check_entries(path, record.get("entries") or [], module, strict)
    state, header = read_shard(step_dir, manifest, comm.rank)
    opt_arrays = {k: state.pop(k) for k in [k for k in state if k.startswith(_OPT)]}
    if optimizer is not None and "optimizer" not in header:
        raise CheckpointError(f"{path}: holds no optimizer state (saved without optimizer=)")
    module.load_state_dict(state, strict=strict)
    if optimizer is not None:
        saved = header["optimizer"]
        if zero_checkpoint.is_sharded(saved):
            if zero_checkpoint.accepts(optimizer, saved):  # its own slice: bit for bit
                optimizer.load_state_dict(zero_checkpoint.unpack(opt_arrays, saved, str(path)))
                saved = None
            else:  # another size, or no ZeRO: the data-parallel group's slices laid end to end
                opt_arrays, saved = zero_checkpoint.replicated_from_group(step_dir, manifest,
                                                                          comm.rank)
    if optimizer is not None and saved is not None:
        entries: dict[int, dict[str, Any]] = {}
        for key, value in opt_arrays.items():
            index, name = key[len(_OPT):].split("/", 1)
            entries.setdefault(int(index), {})[name] = value
        for index, scalars in saved["scalars"].items():
            entries.setdefault(int(index), {}).update(scalars)
        groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else g
                  for g in saved["param_groups"]]
        optimizer.load_state_dict({"state": entries, "param_groups": groups})
    if rng and "rng" in header:
        _set_rng_state(header["rng"])
    return header["metadata"]


def _check_coordinates(path: Path, saved: dict[str, Any], expected: dict[str, Any]) -> None:
    for key, want in expected.items():
        if saved.get(key) != want:
            raise CheckpointError(f"{path}: holds the shard of {key} {saved.get(key)}, this "
                                  f"rank expects {key} {want}")


def _check_entries(path: Path, entries: list[dict[str, Any]], module: Module,
                   strict: bool) -> None:
    saved = {e["name"]: tuple(e["shape"]) for e in entries if not e["name"].startswith(_OPT)}
    expected = {n: tuple(p.shape) for n, p in module.named_parameters()}
    expected.update((n, tuple(b.shape)) for n, b in module.named_buffers())
    missing = [n for n in expected if n not in saved]
    unexpected = [n for n in saved if n not in expected]
    if strict and (missing or unexpected):
        raise CheckpointError(f"{path}: parameter names differ from this rank's model: "
                              f"missing {_few(missing)}, unexpected {_few(unexpected)}")
    for name in expected:  # in the model's order, so the first mismatch is named
        if name in saved and saved[name] != expected[name]:
            raise CheckpointError(f"{path}: {name} has shape {saved[name]}, this rank's "
                                  f"model expects {expected[name]}")


def _few(names: list[str]) -> str:
    return str(names[:3])[:-1] + (", ...]" if len(names) > 3 else "]")


__all__ = ["CheckpointError", "coordinates_of", "find_fallback", "list_checkpoints",
           "load_checkpoint", "read_manifest", "read_shard", "resolve", "save_checkpoint",
           "shard_path", "step_of", "verify_checkpoint"]
