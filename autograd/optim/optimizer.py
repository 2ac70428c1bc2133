"""Optimizer base: param groups, per-parameter state, f32 master weights, state_dict."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.inplace import record_write, record_writes
from gpuplan.dtypes import HALF_DTYPES, float32


class Optimizer:
    """Holds ``param_groups`` (dicts with ``"params"`` plus hyper-parameters, as in PyTorch)
    and ``state`` (per parameter, keyed by ``id(param)``).

    Mixed precision (``master_weights=True``, the default): an f16/bf16 parameter's float32
    master copy lives in the optimizer state (``state["master"]``); the fused kernel updates
    the master copy (with f32 moments) and rewrites the low-precision ``param.data`` from it
    (``param_lowp``, round to nearest even), so a bf16 model trains as if its weights were
    f32. f32/f64 parameters are updated in place. ``master_weights=False`` hands half
    parameters to the kernels directly, which have no half-weight SKU: ``gp.Unsupported``.
    """

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any],
                 master_weights: bool = True) -> None:
        self.defaults = dict(defaults)
        self.master_weights = master_weights
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[int, dict[str, Any]] = {}
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: given an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        seen: set[int] = set()
        for group in groups:
            group = dict(group)
            group["params"] = list(group["params"])
            for p in group["params"]:
                if id(p) in seen:
                    raise ValueError(f"{type(self).__name__}: a parameter appears twice")
                seen.add(id(p))
            for key, value in self.defaults.items():
                group.setdefault(key, value)
            self.param_groups.append(group)

    # -- helpers for subclasses -------------------------------------------------------------

    def _uses_master(self, p: Any) -> bool:
        return bool(self.master_weights) and p.data.dtype in HALF_DTYPES

    def _param_state(self, p: Any) -> dict[str, Any]:
        """The state of `p`, created on first use: master copy (if any) and ``step = 0``."""
        state = self.state.get(id(p))
        if state is None:
            state = {"step": 0}
            if self._uses_master(p):
                state["master"] = gp.functional.cast(p.data, float32)
            self.state[id(p)] = state
        return state

    @staticmethod
    def _zeros_like_master(p: Any, state: dict[str, Any]) -> Any:
        ref = state.get("master", p.data)
        return gp.zeros(ref.shape, ref.dtype, device=gp.device_of(ref))

    @staticmethod
    def _target(p: Any, state: dict[str, Any]) -> tuple[Any, Any]:
        """(array the kernel updates, low-precision copy to rewrite or None)."""
        if "master" in state:
            return state["master"], p.data
        return p.data, None

    def _mark_stepped(self, params: Iterable[Any]) -> None:
        """Record the in-place update of each parameter (autograd.inplace: a graph recorded
        before the step and back-propagated after it raises instead of using new weights)."""
        record_writes(params, f"{type(self).__name__}.step()")

    def _params_with_grad(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    yield group, p

    # -- public API ---------------------------------------------------------------------------

    def step(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                    p.__dict__.pop("_grad_acc", None)  # the f32 sum (autograd.tape)
                else:
                    p.grad.data[...] = 0
                    record_write(p.grad, f"{type(self).__name__}.zero_grad(set_to_none=False)")

    def state_dict(self) -> dict[str, Any]:
        """Host copies of the state, parameters referred to by their position (PyTorch-like)."""
        index = 0
        groups, state = [], {}
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                if id(p) in self.state:
                    state[index] = {k: (gp.to_host(v).copy() if hasattr(v, "shape") else v)
                                    for k, v in self.state[id(p)].items()}
                ids.append(index)
                index += 1
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"{type(self).__name__}.load_state_dict: expected "
                             f"{len(self.param_groups)} param groups, given {len(groups)}")
        by_index = {}
        for mine, theirs in zip(self.param_groups, groups, strict=True):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError(f"{type(self).__name__}.load_state_dict: a param group has "
                                 f"{len(mine['params'])} parameters, given "
                                 f"{len(theirs['params'])}")
            by_index.update(zip(theirs["params"], mine["params"], strict=True))
            for k, v in theirs.items():
                if k != "params":
                    mine[k] = v
        self.state = {}
        for index, saved in state_dict["state"].items():
            p = by_index[int(index)]
            device = gp.device_of(p.data)
            entry = {}
            for k, v in saved.items():
                if hasattr(v, "shape"):
                    if tuple(v.shape) != tuple(p.data.shape):
                        raise ValueError(f"{type(self).__name__}.load_state_dict: state "
                                         f"{k!r} of parameter {index}: expected shape "
                                         f"{tuple(p.data.shape)}, given {tuple(v.shape)}")
                    # to_host: a CuPy array refuses NumPy's implicit conversion
                    entry[k] = gp.to_device(np.array(gp.to_host(v), copy=True), device)
                else:
                    entry[k] = v
            self.state[id(p)] = entry
