"""ZeRO stage 1: the optimizer state sharded over the data-parallel ranks.

``dist.ZeroRedundancyOptimizer(params, optimizer_class=optim.AdamW, comm=mesh.dp, lr=...)``
behaves as ``optimizer_class(params, lr=...)`` on every rank, with each rank holding only its
share of the state. Each param group's parameters are laid end to end in one flat float vector
(float32 for f16/bf16 parameters: the master weights; the parameters' own dtype otherwise),
split into ``comm.size`` equal contiguous slices, zero-padded at the end. Rank r keeps slice r;
the part of each parameter that falls in it is one parameter (a view into the slice) of an
inner ``optimizer_class``, so the moments, and the master weights, exist for that slice only
(1/dp of the replicated optimizer's state), and every parameter keeps its own step count and
is skipped in a step where it has no gradient, exactly as the replicated optimizer does.

``step()`` runs after the gradients are averaged over the data-parallel ranks (the trainer's
`allreduce_gradients` and clipping are unchanged): each rank steps its pieces with their part
of the gradients (in the gradients' dtype, as the replicated optimizer reads them), then the
slices are all-gathered back into every parameter (half parameters rounded to nearest even
from the float32 masters, as the fused optimizer rewrites them). Every operation of the update
is elementwise, so parameters and state are the same bits as the replicated optimizer's at
any data-parallel size.

``state_dict()`` holds this rank's slice; ``consolidated_state_dict()`` (a collective) is the
replicated optimizer's state dict, which ``load_state_dict`` accepts (as does
``optimizer_class``'s), so a checkpoint resumes with or without ZeRO and at any size.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.inplace import record_writes
from autograd.nn import Parameter
from autograd.optim import AdamW
from autograd.optim.optimizer import Optimizer
from autograd.tensor import Tensor
from dist.communicator import Communicator
from gpuplan.dtypes import HALF_DTYPES, float32

ARRAY_STATE = ("exp_avg", "exp_avg_sq", "momentum_buffer")


class _Layout:
    """One param group laid flat: offsets, this rank's slice and the pieces of parameters
    in it: (parameter index, start in the parameter, end, start in the slice)."""

    def __init__(self, params: list[Any], size: int, rank: int) -> None:
        self.params = params
        self.numels = [int(np.prod(p.shape, dtype=np.int64)) for p in params]
        self.offsets = [int(x) for x in np.concatenate([[0], np.cumsum(self.numels)])]
        self.total = self.offsets[-1]
        self.chunk = -(-self.total // size) if self.total else 0
        self.lo, self.hi = rank * self.chunk, (rank + 1) * self.chunk
        dtypes = {np.dtype(p.dtype) for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"ZeroRedundancyOptimizer: a param group holds parameters of "
                             f"several dtypes ({', '.join(sorted(map(str, dtypes)))}); "
                             f"expected one dtype per group")
        self.dtype = dtypes.pop()
        self.work = np.dtype(float32) if self.dtype in HALF_DTYPES else self.dtype
        self.device = params[0].device
        self.pieces = []
        for i, (start, n) in enumerate(zip(self.offsets[:-1], self.numels, strict=True)):
            a, b = max(self.lo, start), min(self.hi, start + n)
            if a < b:
                self.pieces.append((i, a - start, b - start, a - self.lo))

    def flat(self, arrays: list[Any], dtype: Any) -> Any:
        """This rank's slice of the concatenation of `arrays` (zeros for None and past the
        end), in `dtype`."""
        out = gp.zeros((self.chunk,), dtype, device=self.device)
        for i, a, b, at in self.pieces:
            if arrays[i] is None:
                continue
            src = gp.backend.ascontiguous(arrays[i]).reshape(-1)[a:b]
            out[at:at + b - a] = src if src.dtype == np.dtype(dtype) else \
                gp.functional.cast(src, dtype)
        return out


def _flat_view(p: Any) -> Any:
    """A flat view of parameter `p`'s (C-contiguous) array."""
    if not p.data.flags.c_contiguous:
        raise ValueError(f"ZeroRedundancyOptimizer: parameters must be C-contiguous, given "
                         f"one of shape {tuple(p.shape)} with strides {p.data.strides}")
    return p.data.reshape(-1)


class ZeroRedundancyOptimizer:
    """`optimizer_class` with its state sharded over `comm` (ZeRO-1); see the module doc."""

    def __init__(self, params: Iterable[Any], optimizer_class: type = AdamW,
                 comm: Communicator | None = None, **defaults: Any) -> None:
        params = list(params)
        if not params:
            raise ValueError("ZeroRedundancyOptimizer: given an empty parameter list")
        if not isinstance(optimizer_class, type):
            raise TypeError(f"ZeroRedundancyOptimizer: argument 'optimizer_class': expected "
                            f"an optimizer class such as optim.AdamW, given "
                            f"{type(optimizer_class).__name__}")
        self.comm = comm
        self.size = 1 if comm is None else comm.size
        self.rank = 0 if comm is None else comm.rank
        self.optimizer_class = optimizer_class
        # The replicated optimizer these groups would make validates the arguments and
        # fills each group's hyper-parameters; its groups are the public param_groups.
        replicated = optimizer_class(params, **defaults)
        self.defaults = replicated.defaults
        self.param_groups = replicated.param_groups
        self._layouts = [_Layout(g["params"], self.size, self.rank) for g in self.param_groups]
        # Per group: this rank's flat slice of the f32 master weights of half parameters
        # (None for f32/f64 groups, whose pieces are views of the parameters themselves:
        # no copy of the weights, as the replicated optimizer keeps none).
        self._slices: list[Any] = []
        self._pieces: list[list[Parameter]] = []
        inner_groups = []
        for group, lay in zip(self.param_groups, self._layouts, strict=True):
            if lay.dtype in HALF_DTYPES:
                buf = lay.flat([p.data for p in lay.params], lay.work)
                pieces = [Parameter(buf[at:at + b - a]) for _, a, b, at in lay.pieces]
            else:
                buf = None
                pieces = [Parameter(_flat_view(lay.params[i])[a:b]) for i, a, b, _ in
                          lay.pieces]
            self._slices.append(buf)
            self._pieces.append(pieces)
            inner_groups.append({**{k: v for k, v in group.items() if k != "params"},
                                 "params": pieces})
        self.optimizer = optimizer_class(inner_groups, **defaults) \
            if any(self._pieces) else None
        self._stepped = False

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> None:
        """Step this rank's pieces with their part of the (already averaged) gradients, then
        all-gather every parameter. A collective over `comm`."""
        for gi, (outer, lay) in enumerate(zip(self.param_groups, self._layouts, strict=True)):
            if self._slices[gi] is not None and not self._stepped:
                # The replicated optimizer makes its f32 masters at its first step: a load or
                # a broadcast since construction is picked up here.
                self._slices[gi][...] = lay.flat([p.data for p in lay.params], lay.work)
            for piece, (i, a, b, _) in zip(self._pieces[gi], lay.pieces, strict=True):
                if self._slices[gi] is None:
                    view = _flat_view(lay.params[i])
                    if piece.data.base is not view.base and piece.data.base is not view:
                        piece.data = view[a:b]  # the parameter's array was replaced
                g = lay.params[i].grad
                piece.grad = None if g is None else Tensor(
                    gp.backend.ascontiguous(g.data).reshape(-1)[a:b])
            if self.optimizer is not None:  # a scheduler sets lr on the public groups
                self.optimizer.param_groups[gi].update(
                    {k: v for k, v in outer.items() if k != "params"})
        if self.optimizer is not None:
            self.optimizer.step()
        self._stepped = True
        for gi, lay in enumerate(self._layouts):
            self._gather_into_params(gi, lay)
            for piece in self._pieces[gi]:
                piece.grad = None
        record_writes([p for lay in self._layouts for p in lay.params],
                      "ZeroRedundancyOptimizer.step()")

    def _full(self, a: Any) -> Any:
        return a if self.comm is None or self.size == 1 else self.comm.all_gather(a)

    def _gather_into_params(self, gi: int, lay: _Layout) -> None:
        if lay.total == 0:
            return
        mine = self._slices[gi]
        if mine is None:  # f32/f64: this rank's updated pieces, laid out for the gather
            if self.size == 1:
                return  # the pieces are views: the parameters hold the update already
            mine = lay.flat([p.data for p in lay.params], lay.work)
        full = self._full(mine)
        for p, start, n in zip(lay.params, lay.offsets[:-1], lay.numels, strict=True):
            values = full[start:start + n].reshape(p.shape)
            if values.dtype != p.data.dtype:
                values = gp.functional.cast(gp.backend.ascontiguous(values), p.data.dtype)
            p.data[...] = values

    #: The replicated optimizer's (over the public param_groups): .grad set to None, or
    #: zeroed in place and recorded as a write.
    zero_grad = Optimizer.zero_grad

    # -- accounting -----------------------------------------------------------------------------

    def state_bytes(self) -> int:
        """Bytes of optimizer state on this rank: its slices of the f32 master weights (half
        parameters) and the inner optimizer's state (moments)."""
        total = sum(int(s.nbytes) for s in self._slices if s is not None)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                total += sum(int(v.nbytes) for v in state.values() if hasattr(v, "nbytes"))
        return total

    # -- state dicts ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard: the inner optimizer's state dict and its weight slices."""
        return {"zero": {"rank": self.rank, "size": self.size,
                         "totals": [lay.total for lay in self._layouts]},
                "shard": None if self.optimizer is None else self.optimizer.state_dict(),
                "slices": [None if s is None else gp.to_host(s).copy() for s in self._slices],
                "stepped": self._stepped}

    def _piece_state(self, gi: int, k: int) -> dict[str, Any] | None:
        if self.optimizer is None:
            return None
        return self.optimizer.state.get(id(self._pieces[gi][k]))

    def consolidated_state_dict(self) -> dict[str, Any]:
        """The state dict the replicated `optimizer_class` would have (host arrays, on every
        rank). A collective over `comm`."""
        # Which parameters have state, their step counts and the state's array keys: from
        # the ranks holding their pieces (every piece of a parameter has the same).
        local: dict[tuple[int, int], dict[str, Any]] = {}
        for gi, lay in enumerate(self._layouts):
            for k, (i, *_rest) in enumerate(lay.pieces):
                st = self._piece_state(gi, k)
                if st is not None:
                    local[(gi, i)] = {key: (None if hasattr(v, "shape") else v)
                                      for key, v in st.items()}
        scalars: dict[tuple[int, int], dict[str, Any]] = {}
        for part in (self.comm.all_gather_object(local) if self.comm is not None else [local]):
            scalars.update(part)
        state: dict[int, dict[str, Any]] = {}
        groups = []
        index = 0
        for gi, (group, lay) in enumerate(zip(self.param_groups, self._layouts, strict=True)):
            keys = sorted({key for (g, _), st in scalars.items() if g == gi
                           for key, v in st.items() if v is None})
            full: dict[str, np.ndarray] = {}
            for key in keys:
                buf = gp.zeros((lay.chunk,), lay.work, device=lay.device)
                for k, (_, a, b, at) in enumerate(lay.pieces):
                    st = self._piece_state(gi, k)
                    if st is not None and key in st:
                        buf[at:at + b - a] = st[key].reshape(-1)
                full[key] = gp.to_host(self._full(buf))
            if self._slices[gi] is not None and any(g == gi for g, _ in scalars):
                full["master"] = gp.to_host(self._full(self._slices[gi]))
            ids = []
            for i, (p, start, n) in enumerate(zip(lay.params, lay.offsets[:-1], lay.numels,
                                                  strict=True)):
                st = scalars.get((gi, i))
                if st is not None:
                    entry = {key: v for key, v in st.items() if v is not None}
                    for key, arr in full.items():
                        entry[key] = arr[start:start + n].reshape(p.shape).copy()
                    state[index] = entry
                ids.append(index)
                index += 1
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a replicated optimizer's state dict (`consolidated_state_dict()`, or
        `optimizer_class(...).state_dict()` of a run without ZeRO): each rank keeps its
        slice. A sharded `state_dict()` loads only into the same rank of the same size."""
        if "zero" in state_dict:
            self._load_shard(state_dict)
            return
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"ZeroRedundancyOptimizer.load_state_dict: expected "
                             f"{len(self.param_groups)} param groups, given {len(groups)}")
        saved = state_dict["state"]
        inner_state: dict[int, dict[str, Any]] = {}
        inner_groups = []
        inner_index = 0
        self._stepped = False
        for gi, (theirs, lay) in enumerate(zip(groups, self._layouts, strict=True)):
            if len(theirs["params"]) != len(lay.params):
                raise ValueError(f"ZeroRedundancyOptimizer.load_state_dict: param group {gi} "
                                 f"has {len(lay.params)} parameters, given "
                                 f"{len(theirs['params'])}")
            entries = [saved.get(i, saved.get(str(i))) for i in theirs["params"]]
            masters = [None if e is None else e.get("master") for e in entries]
            if self._slices[gi] is not None and any(m is not None for m in masters):
                # The masters are the weights from now on (the parameters are their rounding).
                current = [p.data for p in lay.params]
                self._slices[gi][...] = lay.flat(
                    [gp.asarray(m, device=lay.device) if m is not None else c
                     for m, c in zip(masters, current, strict=True)], lay.work)
                self._stepped = True
            ids = []
            for i, a, b, _ in lay.pieces:
                entry = entries[i]
                if entry is not None:
                    piece = {}
                    for key, v in entry.items():
                        if key == "master":
                            continue
                        if hasattr(v, "shape"):
                            flat = np.asarray(gp.to_host(v)).reshape(-1)[a:b]
                            piece[key] = flat.copy()
                        else:
                            piece[key] = v
                    inner_state[inner_index] = piece
                ids.append(inner_index)
                inner_index += 1
            inner_groups.append({**{k: v for k, v in theirs.items() if k != "params"},
                                 "params": ids})
        if self.optimizer is not None:
            self.optimizer.load_state_dict({"state": inner_state, "param_groups": inner_groups})
        for group, theirs in zip(self.param_groups, groups, strict=True):
            group.update({k: v for k, v in theirs.items() if k != "params"})

    def _load_shard(self, state_dict: dict[str, Any]) -> None:
        z = state_dict["zero"]
        if (z["rank"], z["size"]) != (self.rank, self.size) or \
                list(z["totals"]) != [lay.total for lay in self._layouts]:
            raise ValueError(f"ZeroRedundancyOptimizer.load_state_dict: a shard of rank "
                             f"{z['rank']} of {z['size']}, expected rank {self.rank} of "
                             f"{self.size} with these parameters (load "
                             f"consolidated_state_dict() to reshard)")
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state_dict["shard"])
        for buf, w in zip(self._slices, state_dict["slices"], strict=True):
            if buf is not None:
                buf[...] = gp.asarray(w, device=gp.device_of(buf))
        self._stepped = bool(state_dict["stepped"])


class Consolidated:
    """A ZeroRedundancyOptimizer seen as the replicated optimizer, for checkpoints:
    ``state_dict()`` is its `consolidated_state_dict()` (a collective over the data-parallel
    ranks: every rank saving a checkpoint calls it), ``load_state_dict`` takes a replicated
    state dict, ``param_groups`` are its public groups (the model's parameters)."""

    def __init__(self, zero: ZeroRedundancyOptimizer) -> None:
        self.zero = zero

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.zero.param_groups

    def state_dict(self) -> dict[str, Any]:
        return self.zero.consolidated_state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.zero.load_state_dict(state_dict)
