"""Checkpoints across layouts: assemble the dense model (and optimizer state) from the shards
of any tp x pp x dp layout, and cut it again for this rank's layout.

Every shard records where each of its parameters sits in the dense model (a `ShardSpec`:
dense name, axis, indices; see dist.models.sharding) and, with an optimizer, which parameter
each optimizer index is (dist.checkpoint.layout_record). AdamW's moments (and f32 master
weights) have their parameter's shape, so they are assembled and cut with the parameter's
spec. Reading is done by each process on its own, from the files: no collective moves
weights; the shards of data-parallel replicas other than the first are not read, except for
the optimizer state of a ZeRO run, which is sliced over the data-parallel ranks: the slices of
each group are laid end to end into the replicated state first (dist.zero_checkpoint).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.inplace import record_write
from autograd.nn import LlamaConfig, Module
from autograd.nn.gpt2_io import param_shapes
from dist.checkpoint_files import CheckpointError, read_manifest, read_shard, resolve
from dist.models.configs import (
    GPT_MODEL_FIELDS,
    config_differences,
    llama_config_from_json,
    saved_kind,
)
from dist.models.sharding import ShardSpec, dense_shapes
from dist.zero_checkpoint import is_sharded, replicated_from_group
from gpuplan.dtypes import FLOAT_DTYPES, as_dtype

_OPT = "optimizer/"
# GPTConfig fields that change the parameters or the function the model computes.
MODEL_FIELDS = GPT_MODEL_FIELDS


@dataclass
class DenseCheckpoint:
    """A checkpoint assembled into dense arrays (host, saved dtypes)."""

    step_dir: Path
    metadata: dict[str, Any]                        # the manifest's (rank 0's) metadata
    config: dict[str, Any] | None                   # the model config's JSON, if saved
    params: dict[str, np.ndarray]                   # dense name -> array
    optimizer: dict[str, dict[str, Any]] | None = None  # dense name -> state (arrays, step)
    param_groups: list[dict[str, Any]] = field(default_factory=list)  # settings, no params
    group_of: dict[str, int] = field(default_factory=dict)  # dense name -> group index


def _assemble(pieces: list[tuple[np.ndarray, ShardSpec]], shapes: dict[str, tuple[int, ...]],
              where: str, what: str, complete: bool = True) -> dict[str, np.ndarray]:
    """Dense arrays from (shard, spec) pairs; CheckpointError naming a gap or a mismatch
    (with `complete`, every name of `shapes` must be there)."""
    out: dict[str, np.ndarray] = {}
    filled: dict[str, np.ndarray] = {}
    for array, spec in pieces:
        shape = shapes.get(spec.name)
        if shape is None:
            raise CheckpointError(f"{where}: {what} {spec.name!r} is not a parameter of the "
                                  f"saved model")
        if spec.name not in out:
            out[spec.name] = np.zeros(shape, array.dtype)
            filled[spec.name] = np.zeros(shape, bool)
        index = [slice(None)] * len(shape)
        if spec.index is not None:
            if not 0 <= spec.axis < len(shape) or \
                    not all(0 <= i < shape[spec.axis] for i in spec.index):
                raise CheckpointError(f"{where}: a shard of {what} {spec.name} names axis "
                                      f"{spec.axis} indices outside the dense {shape}")
            index[spec.axis] = list(spec.index)
        try:
            out[spec.name][tuple(index)] = array
        except ValueError:
            raise CheckpointError(f"{where}: a shard of {what} {spec.name} has shape "
                                  f"{tuple(array.shape)}, which does not fit the dense "
                                  f"{shape}") from None
        filled[spec.name][tuple(index)] = True
    missing = [n for n in out if not filled[n].all()]
    missing += [n for n in shapes if n not in out] if complete else []
    if missing:
        raise CheckpointError(f"{where}: the shards do not cover {what} {missing[:3]}")
    return {n: out[n] for n in shapes if n in out}


def _specs_of(step_dir: Path, rank: int, specs: Any, state: dict[str, np.ndarray]
              ) -> dict[str, ShardSpec]:
    """The ShardSpecs a shard records for its arrays; CheckpointError naming the shard for
    a record that is not one (a name, an int axis, int indices) or names no array of it."""
    where = f"{step_dir}: shard {rank}'s parameter specs"
    if not isinstance(specs, dict):
        raise CheckpointError(f"{where}: expected an object, given {type(specs).__name__}")
    out = {}
    for local, spec in specs.items():
        index = spec.get("index") if isinstance(spec, dict) else None
        if local not in state or not isinstance(spec, dict) \
                or not isinstance(spec.get("name"), str) \
                or not isinstance(spec.get("axis", 0), int) \
                or not (index is None or isinstance(index, list)
                        and all(isinstance(i, int) and not isinstance(i, bool) for i in index)):
            raise CheckpointError(f"{where}: {str(local)[:60]!r} is not a spec of one of its "
                                  f"arrays (a name, an int axis, int indices)")
        out[local] = ShardSpec.from_json(spec)
    return out


def _saved_config(header: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any] | None:
    config = header.get("config") or meta.get("config")
    return dict(config) if isinstance(config, dict) else None


def read_dense_checkpoint(path: str | os.PathLike, optimizer: bool = False) -> DenseCheckpoint:
    """The dense model of the committed checkpoint `path` (a step folder, or a root: its
    latest), from every shard of the first data-parallel replica, each verified against
    the manifest (size, SHA-256). With `optimizer`, the optimizer state too (an error if
    the checkpoint has none). CheckpointError (one line) for anything missing."""
    step_dir = resolve(path)
    manifest = read_manifest(step_dir)
    pieces: list[tuple[np.ndarray, ShardSpec]] = []
    opt_pieces: dict[str, list[tuple[np.ndarray, ShardSpec]]] = {}
    scalars: dict[str, dict[str, Any]] = {}
    groups: list[dict[str, Any]] = []
    group_of: dict[str, int] = {}
    config = None
    for rank, record in enumerate(manifest["shards"]):
        if ((record.get("coordinates") or {}).get("mesh") or {}).get("dp", 0) != 0:
            continue  # a data-parallel replica of shards read already
        state, header = read_shard(step_dir, manifest, rank)
        specs = header.get("specs") or header["metadata"].get("specs")
        if specs is None:
            raise CheckpointError(f"{step_dir}: shard {rank} records no parameter specs (a "
                                  f"checkpoint of an older format cannot be resharded)")
        config = config or _saved_config(header, header["metadata"])
        by_local = _specs_of(step_dir, rank, specs, state)
        pieces += [(state[n], spec) for n, spec in by_local.items()]
        if optimizer:
            saved = header.get("optimizer")
            if is_sharded(saved):  # ZeRO: the slices of this shard's data-parallel group
                if saved["zero"].get("rank") != 0:
                    continue  # (collected with the group's first rank)
                arrays, saved = replicated_from_group(step_dir, manifest, rank)
                state = {**{k: v for k, v in state.items() if not k.startswith(_OPT)},
                         **arrays}
                header = {**header, "optimizer": saved}
            _collect_optimizer(step_dir, rank, state, header, by_local, opt_pieces, scalars,
                               groups, group_of)
    if config is None:
        raise CheckpointError(f"{step_dir}: records no model config, so its dense shapes "
                              f"are unknown")
    model_config = model_config_from_json(config, str(step_dir))
    shapes = (dense_shapes(model_config) if isinstance(model_config, LlamaConfig)
              else param_shapes(model_config))
    params = _assemble(pieces, shapes, str(step_dir), "parameter")
    dense = DenseCheckpoint(step_dir, manifest["metadata"], config, params)
    if optimizer:
        dense.optimizer = {n: dict(scalars.get(n, {})) for n in shapes}
        for key, key_pieces in opt_pieces.items():
            for name, array in _assemble(key_pieces, shapes, str(step_dir),
                                         f"optimizer state {key!r} of", False).items():
                dense.optimizer[name][key] = array
        dense.param_groups, dense.group_of = groups, group_of
    return dense


def _collect_optimizer(step_dir: Path, rank: int, state: dict[str, np.ndarray],
                       header: dict[str, Any], specs: dict[str, ShardSpec],
                       opt_pieces: dict[str, list], scalars: dict[str, dict[str, Any]],
                       groups: list[dict[str, Any]], group_of: dict[str, int]) -> None:
    """Add one shard's optimizer entries (arrays by key, scalars, groups) to the pools."""
    saved = header.get("optimizer")
    if saved is None:
        raise CheckpointError(f"{step_dir}: shard {rank} holds no optimizer state")
    names = saved.get("names")
    if names is None:
        raise CheckpointError(f"{step_dir}: shard {rank} does not record which parameter "
                              f"each optimizer entry belongs to (saved by an older version)")
    if not groups:
        groups.extend({k: v for k, v in g.items() if k != "params"}
                      for g in saved["param_groups"])
    for g_index, group in enumerate(saved["param_groups"]):
        for index in group["params"]:
            group_of[specs[names[index]].name] = g_index
    for key, value in state.items():
        if key.startswith(_OPT):
            index, name = key[len(_OPT):].split("/", 1)
            opt_pieces.setdefault(name, []).append((value, specs[names[int(index)]]))
    for index, entry in saved["scalars"].items():
        scalars.setdefault(specs[names[int(index)]].name, {}).update(entry)


def gpt_config_from_json(config: Any, where: str = "model config") -> Any:
    """The GPTConfig of saved config fields (dtype by name); CheckpointError naming `where`
    and the field for anything that is not a GPTConfig's fields and valid values."""
    from autograd.nn import GPTConfig

    if not isinstance(config, dict):
        raise CheckpointError(f"{where}: the model config must be a JSON object, given "
                              f"{type(config).__name__}")
    unknown = sorted(str(k) for k in config if k not in GPTConfig.__dataclass_fields__)
    if unknown:
        raise CheckpointError(f"{where}: the model config has fields GPTConfig does not "
                              f"have: {unknown[:3]}")
    fields = dict(config)
    try:
        fields["dtype"] = as_dtype(fields.get("dtype", "float32"))
    except (TypeError, ValueError):
        raise CheckpointError(f"{where}: the model config's dtype must name a float dtype, "
                              f"given {str(fields.get('dtype'))[:40]!r}") from None
    try:
        return GPTConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: {exc}") from None


def model_config_from_json(config: Any, where: str = "model config") -> Any:
    """The GPTConfig, or the LlamaConfig of a config marked ``"model": "llama"``
    (dist.models.configs), of saved config fields; CheckpointError naming `where`."""
    if not isinstance(config, dict) or "model" not in config:
        return gpt_config_from_json(config, where)
    try:
        if saved_kind(config) == "gpt":
            return gpt_config_from_json({k: v for k, v in config.items() if k != "model"},
                                        where)
        return llama_config_from_json(config)
    except ValueError as exc:
        raise CheckpointError(f"{where}: {exc}") from None


class ConfigMismatchError(ValueError):
    """Saved weights of another model shape or activation: one line naming the field."""


def check_config(saved: dict[str, Any] | None, config: Any, where: str) -> None:
    """ConfigMismatchError naming every model field on which `saved` (a config's fields)
    and `config` (this run's GPTConfig or LlamaConfig) differ, all in one line (one launch
    shows them all)."""
    if saved is None:
        return
    try:  # the kind of model first, then its fields (dist.models.configs)
        differ = config_differences(saved, config)
    except ValueError as exc:
        raise ConfigMismatchError(f"{where}: {exc}") from None
    if differ:
        theirs = ", ".join(f"{name} {value}" for name, value, _ in differ)
        mine = ", ".join(f"{name} {value}" for name, _, value in differ)
        raise ConfigMismatchError(f"{where}: the saved model has {theirs}, this model has "
                                  f"{mine}")


def local_value(param: Any, name: str, dense: np.ndarray, where: str) -> np.ndarray:
    """This rank's part of the dense array `dense` for its parameter `name`."""
    spec = getattr(param, "shard_spec", None) or ShardSpec(name)
    value = spec.take(dense)
    if tuple(value.shape) != tuple(param.shape):
        raise CheckpointError(f"{where}: {spec.name} gives this rank's {name} the shape "
                              f"{tuple(value.shape)}, the model expects {tuple(param.shape)}")
    return value


def load_dense_into(module: Module, params: dict[str, np.ndarray], where: str) -> None:
    """Copy this rank's part of the dense state `params` into `module`'s parameters
    (cast to each parameter's dtype, on its device); every parameter must be found."""
    for name, p in module.named_parameters():
        dense = getattr(p, "shard_spec", None) or ShardSpec(name)
        if dense.name not in params:
            raise CheckpointError(f"{where}: has no {dense.name}")
        value = np.ascontiguousarray(local_value(p, name, params[dense.name], where))
        p.data[...] = gp.to_device(value.astype(p.dtype, copy=False), gp.device_of(p.data))
        record_write(p, "dist.reshard.load_dense_into")


def load_optimizer_resharded(optimizer: Any, module: Module, dense: DenseCheckpoint) -> None:
    """Give `optimizer` (over `module`'s parameters) this rank's part of the dense state."""
    where = str(dense.step_dir)
    if dense.optimizer is None:
        raise CheckpointError(f"{where}: holds no optimizer state")
    if len(dense.param_groups) != len(optimizer.param_groups):
        raise CheckpointError(f"{where}: the optimizer had {len(dense.param_groups)} param "
                              f"groups, this one has {len(optimizer.param_groups)}")
    names = {id(p): n for n, p in module.named_parameters()}
    state: dict[int, dict[str, Any]] = {}
    groups, index = [], 0
    for g_index, group in enumerate(optimizer.param_groups):
        ids = []
        for p in group["params"]:
            name = names[id(p)]
            spec = getattr(p, "shard_spec", None) or ShardSpec(name)
            if dense.group_of.get(spec.name, g_index) != g_index:
                raise CheckpointError(f"{where}: {spec.name} was in param group "
                                      f"{dense.group_of[spec.name]}, here in {g_index}")
            saved = dense.optimizer.get(spec.name) or {}
            if saved:
                state[index] = {k: (local_value(p, name, v, where).copy()
                                    if hasattr(v, "shape") else v) for k, v in saved.items()}
            ids.append(index)
            index += 1
        groups.append({**dense.param_groups[g_index], "params": ids})
    groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else g for g in groups]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def load_resharded(path: str | os.PathLike, module: Module, optimizer: Any = None
                   ) -> dict[str, Any]:
    """Load a checkpoint of any layout into this rank's `module` (a dist.ParallelGPT of any
    layout, or an nn.GPT) and `optimizer`; returns the manifest's metadata. The saved model
    config must agree with ``module.config`` (`check_config`). The RNG state is not
    restored (its streams belong to the saved layout's ranks). Run by each rank on its own:
    callers agree on errors (dist.load_checkpoint(..., reshard=True) does)."""
    dense = read_dense_checkpoint(path, optimizer=optimizer is not None)
    check_config(dense.config, module.config, str(dense.step_dir))
    load_dense_into(module, dense.params, str(dense.step_dir))
    if optimizer is not None:
        load_optimizer_resharded(optimizer, module, dense)
    return dense.metadata


def config_json(config: Any) -> dict[str, Any]:
    """A GPTConfig's fields as JSON (dtype by name)."""
    out = {k: getattr(config, k) for k in config.__dataclass_fields__}
    out["dtype"] = as_dtype(out["dtype"]).name
    return out


def read_dense_source(path: str | os.PathLike) -> tuple[dict[str, np.ndarray],
                                                       dict[str, Any] | None, str]:
    """(nn.GPT state dict, its config's fields or None, what it is) of a consolidated
    ``.safetensors`` file (scripts/export.py's, config in its metadata), a Hugging Face
    GPT-2 folder, or a checkpoint of any layout (root or step folder)."""
    import json

    from autograd import serialization
    from autograd.nn import gpt2_io

    path = Path(path)
    if path.is_file():
        params, meta = serialization.read_safetensors(path)
        config = None
        if "gpt_config" in meta:
            try:
                config = json.loads(meta["gpt_config"])
            except (ValueError, RecursionError):
                raise CheckpointError(f"{path}: its metadata gpt_config is not a JSON "
                                      f"object of GPTConfig fields") from None
            config = config_json(gpt_config_from_json(config, f"{path}: metadata gpt_config"))
        for name, value in params.items():
            if as_dtype(value.dtype) not in FLOAT_DTYPES:  # never ints or bools as weights
                raise CheckpointError(f"{path}: {name} is stored as {value.dtype}, expected a "
                                      f"float dtype")
        return params, config, f"{path} (safetensors)"
    if (path / gpt2_io.CONFIG_FILE).is_file():
        hf, tensors = gpt2_io.read_gpt2_folder(path)
        config = gpt2_io.config_from_gpt2(hf, str(path / gpt2_io.CONFIG_FILE))
        params = gpt2_io.state_from_gpt2(tensors, config, str(path))
        return params, config_json(config), f"{path} (GPT-2)"
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such file or folder")
    dense = read_dense_checkpoint(path)
    return dense.params, dense.config, f"{dense.step_dir} (checkpoint)"


def init_from(path: str | os.PathLike, module: Module) -> str:
    """Load the weights of `path` (see `read_dense_source`) into this rank's `module` (a
    dist.ParallelGPT of any layout, or an nn.GPT); a source with more positions than
    ``module.config.block_size`` gives its first rows. Returns what was loaded."""
    params, saved, what = read_dense_source(path)
    config = module.config
    if saved is not None:
        positions = int(saved.get("block_size", config.block_size))
        if positions < config.block_size:
            raise CheckpointError(f"{what}: has {positions} positions, fewer than this "
                                  f"model's block_size {config.block_size}")
        check_config({**saved, "block_size": config.block_size}, config, what)
    if "wpe.weight" in params and params["wpe.weight"].shape[0] > config.block_size:
        params = {**params, "wpe.weight": params["wpe.weight"][:config.block_size]}
    load_dense_into(module, params, what)
    return what


__all__ = ["MODEL_FIELDS", "ConfigMismatchError", "DenseCheckpoint", "check_config",
           "config_json", "gpt_config_from_json", "init_from", "load_dense_into",
           "model_config_from_json",
           "load_optimizer_resharded", "load_resharded", "read_dense_checkpoint",
           "read_dense_source"]
