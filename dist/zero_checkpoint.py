"""ZeRO's sharded optimizer state in checkpoints.

A run with `dist.ZeroRedundancyOptimizer` saves each data-parallel rank's shard of the state
as it is (its `state_dict()`), not the consolidated state: in the rank's checkpoint shard,

* the arrays ``optimizer/zero/<group>/<key>``: this rank's flat slice of each state array of
  param group ``<group>`` (``exp_avg``, ``exp_avg_sq``, and ``master`` for the f32 master
  weights of half parameters), zeros where a parameter has no state and in the padding;
* ``header["optimizer"]``: the replicated optimizer's ``param_groups`` (settings, parameter
  indices), ``scalars`` (the step counts of the parameters with a piece here, by index),
  ``names`` (the parameter of each index, as for a replicated optimizer) and ``zero``: the
  data-parallel rank and size, whether it has stepped, and per group the slice length
  (``chunk``), the total, the ``padding`` at the end of the last slice, each parameter's
  offset in the flat vector and its shape.

A shard loads as it is into the same rank of a ZeRO optimizer of the same size (bit for bit);
anything else (another data-parallel size, no ZeRO, another layout through dist.reshard) reads
the shards of the rank's data-parallel group (the ranks with its coordinates but dp) and lays
their slices end to end into the replicated optimizer's state (`dist.zero.assemble_shards`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dist.checkpoint_files import CheckpointError, read_shard
from dist.zero import assemble_shards

PREFIX = "optimizer/zero/"


def pack(opt_state: dict[str, Any], names: list[str | None]
         ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(shard arrays, header record) of a `ZeroRedundancyOptimizer.state_dict()`; `names`:
    the parameter name of each index of the replicated state dict."""
    arrays = {f"{PREFIX}{gi}/{key}": np.asarray(value)
              for gi, group in enumerate(opt_state["flat"]) for key, value in group.items()}
    record = {"param_groups": opt_state["param_groups"],
              "scalars": {str(i): s for i, s in opt_state["state"].items()},
              "names": names, "zero": opt_state["zero"]}
    return arrays, record


def is_sharded(saved: Any) -> bool:
    """Whether a shard's optimizer record is a ZeRO shard's."""
    return isinstance(saved, dict) and isinstance(saved.get("zero"), dict)


def accepts(optimizer: Any, saved: dict[str, Any]) -> bool:
    """Whether `optimizer` is a ZeRO optimizer that takes this shard as it is (same rank and
    size, same param groups)."""
    check = getattr(optimizer, "accepts_shard", None)
    return callable(check) and bool(check(saved["zero"]))


def unpack(arrays: dict[str, np.ndarray], saved: dict[str, Any], where: str
           ) -> dict[str, Any]:
    """The `ZeroRedundancyOptimizer.state_dict()` a shard stored (`pack`'s inverse);
    CheckpointError naming `where` for an array of a group it does not have."""
    groups = saved["zero"].get("groups") or []
    flat: list[dict[str, np.ndarray]] = [{} for _ in groups]
    for name, value in arrays.items():
        if not name.startswith(PREFIX):
            continue
        group, _, key = name[len(PREFIX):].partition("/")
        if not group.isdigit() or int(group) >= len(groups) or not key:
            raise CheckpointError(f"{where}: {name!r} is not a ZeRO state array of one of its "
                                  f"{len(groups)} param groups")
        flat[int(group)][key] = value
    groups_settings = [{**g, "betas": tuple(g["betas"])} if "betas" in g else g
                       for g in saved["param_groups"]]
    return {"zero": saved["zero"], "flat": flat,
            "state": {int(i): dict(s) for i, s in saved["scalars"].items()},
            "param_groups": groups_settings}


def _group_of(manifest: dict[str, Any], rank: int) -> list[int]:
    """The ranks of `rank`'s data-parallel group in dp order: those whose mesh coordinates
    are its own but dp (every rank for a shard without mesh coordinates)."""
    def coords(r: int) -> dict[str, Any]:
        return (manifest["shards"][r].get("coordinates") or {}).get("mesh") or {}
    mine = {k: v for k, v in coords(rank).items() if k != "dp"}
    ranks = [r for r in range(len(manifest["shards"]))
             if {k: v for k, v in coords(r).items() if k != "dp"} == mine]
    return sorted(ranks, key=lambda r: (coords(r).get("dp", 0), r))


def replicated_from_group(step_dir: Path, manifest: dict[str, Any], rank: int
                          ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Rank `rank`'s optimizer state as a replicated optimizer's shard would hold it: (arrays
    ``optimizer/<index>/<key>``, header record with ``param_groups``, ``scalars``, ``names``),
    assembled from the ZeRO shards of its data-parallel group, each verified against the
    manifest. CheckpointError (one line) for a group that is not one ZeRO optimizer's."""
    shards, names = [], None
    for r in _group_of(manifest, rank):
        state, header = read_shard(step_dir, manifest, r)
        saved = header.get("optimizer")
        if not is_sharded(saved):
            raise CheckpointError(f"{step_dir}: shard {r} holds no ZeRO optimizer state, "
                                  f"shard {rank} of its data-parallel group does")
        names = saved.get("names") if r == rank else names
        shards.append(unpack(state, saved, f"{step_dir}: shard {r}"))
    try:
        full = assemble_shards(shards)
    except ValueError as exc:
        raise CheckpointError(f"{step_dir}: the data-parallel group of shard {rank}: "
                              f"{exc}") from None
    arrays: dict[str, np.ndarray] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in full["state"].items():
        for key, value in entry.items():
            if hasattr(value, "shape"):
                arrays[f"optimizer/{index}/{key}"] = value
            else:
                scalars.setdefault(str(index), {})[key] = value
    return arrays, {"param_groups": full["param_groups"], "scalars": scalars, "names": names}


__all__ = ["PREFIX", "accepts", "is_sharded", "pack", "replicated_from_group", "unpack"]
