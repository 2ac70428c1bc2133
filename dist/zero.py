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

Gradients reach the slices one of two ways. ``reduce_gradients()`` (what the trainer's
``--zero 1`` does) reduce-scatters each group's flattened gradients over `comm`, averaged
(f16/bf16 summed in float32, as `dist.allreduce_gradients` sums them), so each rank receives
only its slice's averaged gradient (started during the last backward after
``overlap_with(model)`` / ``overlap_gradients()``, dist.zero_overlap, with the same bits);
``grad_norm(model)`` then gives the global L2 norm the
replicated run's `dist.grad_norm` gives, and ``clip_grad_norm_(max_norm, model)`` clips the
slices by it. Without it, ``step()`` reads its part of gradients already averaged over the
data-parallel ranks (`allreduce_gradients`). Either way each rank steps its pieces with their
part of the gradients (in the gradients' dtype, as the replicated optimizer reads them), then
the slices are all-gathered back into every parameter (half parameters rounded to nearest even
from the float32 masters, as the fused optimizer rewrites them). Every operation of the update
is elementwise, and a slice's averaged gradient is the all-reduce's sum of the same values, so
parameters and state are the same bits as the replicated optimizer's at two data-parallel
ranks (``a + b`` is the same in either collective) and equal to rounding at more.

``state_dict()`` is this rank's shard: per param group its slice of every state array (and of
the f32 masters), laid flat as above, with the slice boundaries, the data-parallel size and
the padding needed to lay the shards end to end again (`assemble_shards`); a checkpoint saves
it as it is (dist.zero_checkpoint). ``consolidated_state_dict()`` (a collective) is the
replicated optimizer's state dict, which ``load_state_dict`` accepts (as does
``optimizer_class``'s), so the state resumes with or without ZeRO and at any size.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from typing import Any

import numpy as np

import gpuplan as gp
from autograd.inplace import record_writes
from autograd.nn import Parameter
from autograd.optim import AdamW, get_total_norm
from autograd.optim.optimizer import Optimizer
from autograd.tensor import Tensor
from dist.communicator import Communicator
from dist.data_parallel import DEFAULT_BUCKET_BYTES
from dist.zero_overlap import ZeroGradOverlap, has_gradient_flags
from gpuplan.dtypes import HALF_DTYPES, float32, float64

# The host global norm's own per-array sums and their combination (gpuplan's global_l2_norm:
# per array a (small, middle, big) triple of scaled sums of squares, math.fsum over arrays):
# summing the triples of the parameters the data-parallel ranks own gives its norm exactly.
from gpuplan.ops.reduction.plans import _norm_from_sums, _sums_of_squares

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

    def copy_range(self, arrays: list[Any], lo: int, hi: int, out: Any) -> Any:
        """``out[:] =`` elements [lo, hi) of the concatenation of `arrays` (zeros for None
        and past the end), cast to out's dtype."""
        out[...] = 0
        for i in range(max(0, bisect_right(self.offsets, lo) - 1), len(self.params)):
            start = self.offsets[i]
            if start >= hi:
                break
            a, b = max(lo, start), min(hi, start + self.numels[i])
            if a >= b or arrays[i] is None:
                continue
            src = gp.backend.ascontiguous(arrays[i]).reshape(-1)[a - start:b - start]
            out[a - lo:b - lo] = src if src.dtype == out.dtype else \
                gp.functional.cast(src, out.dtype)
        return out

    def flat(self, arrays: list[Any], dtype: Any) -> Any:
        """This rank's slice of the concatenation of `arrays` (zeros for None and past the
        end), in `dtype`."""
        out = gp.empty((self.chunk,), dtype, device=self.device)
        return self.copy_range(arrays, self.lo, self.hi, out)

    def ranks_of(self, i: int) -> tuple[int, int]:
        """The first and last data-parallel rank whose slice holds part of parameter i."""
        return (self.offsets[i] // self.chunk,
                (self.offsets[i] + self.numels[i] - 1) // self.chunk)


def _flat_view(p: Any) -> Any:
    """A flat view of parameter `p`'s (C-contiguous) array."""
    if not p.data.flags.c_contiguous:
        raise ValueError(f"ZeroRedundancyOptimizer: parameters must be C-contiguous, given "
                         f"one of shape {tuple(p.shape)} with strides {p.data.strides}")
    return p.data.reshape(-1)


def _counted_by(model: Any) -> Any:
    """Which parameters the global norm counts (`dist.grad_norm`): every one of a model
    without shard specs; else the tensor-parallel ones, the replicated ones on tensor-parallel
    rank 0 only, and never a duplicate (the last stage's tied embedding copy)."""
    tp = getattr(model, "tp_comm", None)
    tp_rank = 0 if tp is None else tp.rank

    def counted(p: Any) -> bool:
        spec = getattr(p, "shard_spec", None)
        return spec is None or (not spec.duplicate and (spec.tensor_parallel or tp_rank == 0))
    return counted


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
        # After reduce_gradients(): per group this rank's slice of the averaged gradients
        # (None for a group without any), and which parameters have a gradient on any rank.
        self._grads: list[Any] | None = None
        self._has_grad: list[list[bool]] = []
        self._overlap: ZeroGradOverlap | None = None

    # -- gradients ----------------------------------------------------------------------------

    def reduce_gradients(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        """Reduce-scatter every group's flattened gradients over `comm`, averaged: this rank
        keeps its slice of the mean gradient, which the next `step()` uses (the parameters'
        ``.grad`` stay this rank's own, unreduced). f16/bf16 are summed in float32. A
        parameter without ``.grad`` on every rank is skipped by the step; one with a ``.grad``
        on some ranks only counts as zeros on the others (as `dist.allreduce_gradients`).
        Sent in rounds of about `bucket_bytes`. A collective over `comm`."""
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) \
                or bucket_bytes < 1:
            raise ValueError(f"ZeroRedundancyOptimizer.reduce_gradients: argument "
                             f"'bucket_bytes': expected an int >= 1, given {bucket_bytes!r}")
        overlap = self._overlap
        if overlap is not None and overlap.pending:
            if bucket_bytes != overlap.bucket_bytes:
                raise ValueError(f"ZeroRedundancyOptimizer.reduce_gradients: argument "
                                 f"'bucket_bytes': expected the overlapped reduction's "
                                 f"{overlap.bucket_bytes} (its rounds started in backward), "
                                 f"given {bucket_bytes}")
            self._grads, self._has_grad = overlap.finish()
            return
        self._has_grad = has_gradient_flags(self)
        grads: list[Any] = []
        for lay, present in zip(self._layouts, self._has_grad, strict=True):
            if not lay.total or not any(present):
                grads.append(None)
                continue
            arrays = [None if p.grad is None else p.grad.data for p in lay.params]
            out = gp.empty((lay.chunk,), lay.dtype, device=lay.device)
            if self.size == 1:
                lay.copy_range(arrays, 0, lay.chunk, out)
            else:
                per = max(1, bucket_bytes // (self.size * lay.dtype.itemsize))
                for j in range(0, lay.chunk, per):
                    m = min(per, lay.chunk - j)
                    send = gp.empty((self.size * m,), lay.dtype, device=lay.device)
                    for r in range(self.size):
                        at = r * lay.chunk + j
                        lay.copy_range(arrays, at, at + m, send[r * m:(r + 1) * m])
                    self.comm.reduce_scatter(send, "mean", out=out[j:j + m])
            grads.append(out)
        self._grads = grads

    def overlap_gradients(self, late: Iterable[Any] = (),
                          bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> ZeroGradOverlap | None:
        """Start `reduce_gradients`' rounds during backward (dist.zero_overlap): the
        returned `ZeroGradOverlap`'s ``arm()`` before the last micro-batch's backward, then
        ``reduce_gradients(bucket_bytes)`` waits for the rounds started and sends the rest;
        the slices are the same bits as the blocking call's. `late`: parameters whose
        gradients change after backward (their rounds wait for reduce_gradients). None
        with one data-parallel rank (nothing to overlap). Replaces an earlier one."""
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) \
                or bucket_bytes < 1:
            raise ValueError(f"ZeroRedundancyOptimizer.overlap_gradients: argument "
                             f"'bucket_bytes': expected an int >= 1, given {bucket_bytes!r}")
        if self._overlap is not None:
            self._overlap.remove()
            self._overlap = None
        if self.size > 1:
            self._overlap = ZeroGradOverlap(self, late, bucket_bytes)
        return self._overlap

    def overlap_with(self, model: Any, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        """`overlap_gradients` armed by a dist.ParallelModel's ``train_step`` (its
        ``external_grad_reducer``, used with ``reduce_data_parallel`` False), its
        replicated copies (``replica_groups``, summed after backward) left late."""
        late = [p for params, _ in getattr(model, "replica_groups", []) for p in params]
        model.external_grad_reducer = self.overlap_gradients(late, bucket_bytes)

    def _reduced(self, op: str) -> list[Any]:
        if self._grads is None:
            raise RuntimeError(f"ZeroRedundancyOptimizer.{op}: expected the gradients "
                               f"reduced into the slices first (reduce_gradients()), given "
                               f"none since the last step or zero_grad")
        return self._grads

    def grad_norm(self, model: Any = None) -> float:
        """The global L2 norm of the averaged gradients, the same on every rank: what
        `dist.grad_norm(model)` gives in the replicated run (the parameters it counts, and the
        sum over `model`'s tensor- and pipeline-parallel groups, `model_parallel_norm`);
        `model` None: every parameter, no model-parallel group. After `reduce_gradients()`.

        Host gradients: each parameter counted is summed by the rank holding its first
        element (a parameter split between slices gathered whole by one all-reduce of its
        parts), and the data-parallel ranks' sums are combined as gpuplan's global norm
        combines arrays (exactly rounded), so the norm is the replicated run's bit for bit.
        Device gradients: the norm of the counted parts of the slices, to rounding.
        A collective over `comm`."""
        from dist.training import model_parallel_norm

        grads = self._reduced("grad_norm")
        counted = _counted_by(model)
        chosen = [[i for i, p in enumerate(lay.params) if has[i] and lay.numels[i]
                   and counted(p)] for lay, has in zip(self._layouts, self._has_grad,
                                                      strict=True)]
        if all(g is None or gp.device_of(g) == "cpu" for g in grads):
            local = self._exact_norm(grads, chosen)
        else:
            keep = [set(ids) for ids in chosen]
            parts = [grads[gi][at:at + b - a] for gi, lay in enumerate(self._layouts)
                     for i, a, b, at in lay.pieces if i in keep[gi]]
            norm = np.array([get_total_norm(parts)], np.float64)
            if self.size > 1:
                norm = gp.functional.global_l2_norm([self.comm.all_gather(norm)]).reshape(1)
            local = float(gp.to_host(norm)[0])
        return model_parallel_norm(model, local)

    def _exact_norm(self, grads: list[Any], chosen: list[list[int]]) -> float:
        acc = np.dtype(float64) if any(lay.dtype == float64 and ids for lay, ids in
                                       zip(self._layouts, chosen, strict=True)) \
            else np.dtype(float32)
        sums = []
        for gi, (lay, ids) in enumerate(zip(self._layouts, chosen, strict=True)):
            whole = self._gather_split(gi, lay, [i for i in ids
                                                 if len(set(lay.ranks_of(i))) > 1])
            for i in ids:
                if i in whole:
                    if lay.ranks_of(i)[0] == self.rank:
                        sums.append(_sums_of_squares(whole[i], acc))
                elif lay.ranks_of(i)[0] == self.rank:
                    at = lay.offsets[i] - lay.lo
                    sums.append(_sums_of_squares(grads[gi][at:at + lay.numels[i]], acc))
        every = [sums] if self.size == 1 else self.comm.all_gather_object(sums)
        total = [math.fsum(t[k] for part in every for t in part) for k in range(3)]
        with np.errstate(over="ignore"):
            return float(np.asarray(_norm_from_sums(*total), acc))

    def _gather_split(self, gi: int, lay: _Layout, split: list[int]) -> dict[int, Any]:
        """The whole averaged gradients of parameters `split` (each in several slices): every
        rank adds its parts to zeros elsewhere, one all-reduce (exact: x + 0 is x)."""
        if not split:
            return {}
        n = sum(lay.numels[i] for i in split)
        buf = gp.zeros((n,), lay.dtype, device=lay.device)
        spans, at = {}, 0
        for i in split:
            start, k = lay.offsets[i], lay.numels[i]
            a, b = max(start, lay.lo), min(start + k, lay.hi)
            if a < b:
                buf[at + a - start:at + b - start] = self._grads[gi][a - lay.lo:b - lay.lo]
            spans[i] = (at, k)
            at += k
        self.comm.all_reduce(buf, "sum", out=buf)
        return {i: buf[a:a + k] for i, (a, k) in spans.items()}

    def clip_grads_with_norm_(self, max_norm: float, total_norm: float,
                              eps: float = 1e-6) -> None:
        """Scale this rank's gradient slices by ``max_norm / (total_norm + eps)`` when that
        is below 1, elementwise as `optim.clip_grads_with_norm_` scales whole gradients."""
        grads = [g for g in self._reduced("clip_grads_with_norm_") if g is not None]
        if float(max_norm) / (float(total_norm) + eps) >= 1.0 or not grads:
            return
        gp.functional.clip_grad_norm_(grads, max_norm, eps=eps, total_norm=float(total_norm))

    def clip_grad_norm_(self, max_norm: float, model: Any = None, eps: float = 1e-6) -> float:
        """Clip the slices by the global norm (`grad_norm(model)`, which it returns): what
        `dist.clip_grad_norm_(model, max_norm)` does in the replicated run."""
        norm = self.grad_norm(model)
        self.clip_grads_with_norm_(max_norm, norm, eps)
        return norm

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> None:
        """Step this rank's pieces with their part of the averaged gradients (the slices of
        `reduce_gradients()`, else the parameters' ``.grad``, already averaged), then
        all-gather every parameter. A collective over `comm`."""
        reduced = self._grads
        for gi, (outer, lay) in enumerate(zip(self.param_groups, self._layouts, strict=True)):
            if self._slices[gi] is not None and not self._stepped:
                # The replicated optimizer makes its f32 masters at its first step: a load or
                # a broadcast since construction is picked up here.
                self._slices[gi][...] = lay.flat([p.data for p in lay.params], lay.work)
            for piece, (i, a, b, at) in zip(self._pieces[gi], lay.pieces, strict=True):
                if self._slices[gi] is None:
                    view = _flat_view(lay.params[i])
                    if piece.data.base is not view.base and piece.data.base is not view:
                        piece.data = view[a:b]  # the parameter's array was replaced
                if reduced is not None:
                    piece.grad = Tensor(reduced[gi][at:at + b - a]) \
                        if self._has_grad[gi][i] else None
                    continue
                g = lay.params[i].grad
                piece.grad = None if g is None else Tensor(
                    gp.backend.ascontiguous(g.data).reshape(-1)[a:b])
            if self.optimizer is not None:  # a scheduler sets lr on the public groups
                self.optimizer.param_groups[gi].update(
                    {k: v for k, v in outer.items() if k != "params"})
        if self.optimizer is not None:
            self.optimizer.step()
        self._stepped = True
        self._grads = None
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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The replicated optimizer's (over the public param_groups: .grad set to None, or
        zeroed in place and recorded as a write); drops the reduced slices too."""
        Optimizer.zero_grad(self, set_to_none)  # type: ignore[arg-type]
        self._grads = None

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

    def _piece_state(self, gi: int, k: int) -> dict[str, Any] | None:
        if self.optimizer is None:
            return None
        return self.optimizer.state.get(id(self._pieces[gi][k]))

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard (host arrays): ``flat``, per group, this rank's slice of each
        state array (zeros where a parameter has no state, and in the padding) and of the
        f32 masters (``"master"``, half groups); ``state``, the scalars (step counts) of the
        parameters with state and a piece here, by their index in the replicated state
        dict; ``param_groups`` as the replicated optimizer's; ``zero``, the data-parallel
        rank and size and each group's slice length, total, offsets and shapes."""
        flat: list[dict[str, np.ndarray]] = []
        scalars: dict[int, dict[str, Any]] = {}
        base = 0
        for gi, lay in enumerate(self._layouts):
            arrays: dict[str, Any] = {}
            for k, (i, a, b, at) in enumerate(lay.pieces):
                st = self._piece_state(gi, k)
                if st is None:
                    continue
                scalars[base + i] = {key: v for key, v in st.items() if not hasattr(v, "shape")}
                for key, v in st.items():
                    if hasattr(v, "shape"):
                        if key not in arrays:
                            arrays[key] = gp.zeros((lay.chunk,), v.dtype, device=lay.device)
                        arrays[key][at:at + b - a] = v.reshape(-1)
            if self._slices[gi] is not None:
                arrays["master"] = self._slices[gi]
            flat.append({key: gp.to_host(v).copy() for key, v in arrays.items()})
            base += len(lay.params)
        groups, base = [], 0
        for group in self.param_groups:
            n = len(group["params"])
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": list(range(base, base + n))})
            base += n
        zero = {"rank": self.rank, "size": self.size, "stepped": self._stepped,
                "groups": [{"chunk": lay.chunk, "total": lay.total,
                            "padding": lay.chunk * self.size - lay.total,
                            "offsets": lay.offsets,
                            "shapes": [list(p.shape) for p in lay.params]}
                           for lay in self._layouts]}
        return {"zero": zero, "flat": flat, "state": scalars, "param_groups": groups}

    def consolidated_state_dict(self) -> dict[str, Any]:
        """The state dict the replicated `optimizer_class` would have (host arrays, on every
        rank): every rank's `state_dict()` laid end to end (`assemble_shards`). A collective
        over `comm`."""
        mine = self.state_dict()
        return assemble_shards([mine] if self.size == 1 else
                               self.comm.all_gather_object(mine))

    def accepts_shard(self, zero: dict[str, Any]) -> bool:
        """Whether a shard's ``zero`` record is this rank's own (same rank and size, same
        groups): `load_state_dict` takes it as it is, with no resharding."""
        return (zero.get("rank"), zero.get("size")) == (self.rank, self.size) and \
            [(g.get("chunk"), g.get("total")) for g in zero.get("groups", [])] == \
            [(lay.chunk, lay.total) for lay in self._layouts]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a replicated optimizer's state dict (`consolidated_state_dict()`, or
        `optimizer_class(...).state_dict()` of a run without ZeRO): each rank keeps its
        slice. A sharded `state_dict()` loads only into the same rank of the same size (to
        reshard, `assemble_shards` of every rank's)."""
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
        self._load_inner(inner_state, inner_groups, groups)

    def _load_inner(self, inner_state: dict[int, dict[str, Any]],
                    inner_groups: list[dict[str, Any]], groups: list[dict[str, Any]]) -> None:
        if self.optimizer is not None:
            self.optimizer.load_state_dict({"state": inner_state, "param_groups": inner_groups})
        for group, theirs in zip(self.param_groups, groups, strict=True):
            group.update({k: v for k, v in theirs.items() if k != "params"})

    def _load_shard(self, state_dict: dict[str, Any]) -> None:
        z = state_dict["zero"]
        if not self.accepts_shard(z):
            raise ValueError(f"ZeroRedundancyOptimizer.load_state_dict: a shard of rank "
                             f"{z.get('rank')} of {z.get('size')}, expected rank {self.rank} "
                             f"of {self.size} with these parameters (load assemble_shards() "
                             f"of every rank's to reshard)")
        groups = state_dict["param_groups"]
        scalars = {int(k): v for k, v in state_dict["state"].items()}
        inner_state: dict[int, dict[str, Any]] = {}
        inner_groups, inner_index, base = [], 0, 0
        for gi, (theirs, lay) in enumerate(zip(groups, self._layouts, strict=True)):
            flat = state_dict["flat"][gi]
            ids = []
            for i, a, b, at in lay.pieces:
                if base + i in scalars:
                    inner_state[inner_index] = {
                        **scalars[base + i],
                        **{key: np.asarray(v)[at:at + b - a].copy() for key, v in flat.items()
                           if key != "master"}}
                ids.append(inner_index)
                inner_index += 1
            if self._slices[gi] is not None and "master" in flat:
                self._slices[gi][...] = gp.asarray(np.asarray(flat["master"]),
                                                   device=lay.device)
            inner_groups.append({**{k: v for k, v in theirs.items() if k != "params"},
                                 "params": ids})
            base += len(lay.params)
        self._load_inner(inner_state, inner_groups, groups)
        self._stepped = bool(z["stepped"])


def assemble_shards(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """The replicated optimizer's state dict (host arrays) from every data-parallel rank's
    `ZeroRedundancyOptimizer.state_dict()` (any order): each group's slices laid end to end,
    the padding dropped, cut at the parameters' offsets. ValueError (one line) unless the
    shards are ranks 0..size-1 of one size with the same groups."""
    if not shards:
        raise ValueError("assemble_shards: given no shards")
    zeros = [s["zero"] for s in shards]
    size = zeros[0]["size"]
    ranks = sorted(z["rank"] for z in zeros)
    if ranks != list(range(size)) or any(z["size"] != size for z in zeros):
        raise ValueError(f"assemble_shards: expected the shards of ranks 0..{size - 1} of "
                         f"{size}, given ranks {ranks} of sizes "
                         f"{sorted({z['size'] for z in zeros})}")
    layout = [(g["chunk"], g["total"], list(g["offsets"])) for g in zeros[0]["groups"]]
    if any([(g["chunk"], g["total"], list(g["offsets"])) for g in z["groups"]] != layout
           for z in zeros):
        raise ValueError("assemble_shards: the shards lay out their param groups differently "
                         "(not one optimizer's)")
    ordered = sorted(shards, key=lambda s: s["zero"]["rank"])
    scalars: dict[int, dict[str, Any]] = {}
    for s in ordered:
        for k, v in s["state"].items():
            scalars.setdefault(int(k), dict(v))
    state: dict[int, dict[str, Any]] = {}
    base = 0
    for gi, group in enumerate(zeros[0]["groups"]):
        chunk, offsets, shapes = group["chunk"], group["offsets"], group["shapes"]
        keys = sorted({key for s in ordered for key in s["flat"][gi]})
        full = {}
        for key in keys:
            like = next(s["flat"][gi][key] for s in ordered if key in s["flat"][gi])
            full[key] = np.concatenate([np.asarray(s["flat"][gi].get(key, np.zeros(chunk,
                                                                                  like.dtype)))
                                        for s in ordered])
        for i, shape in enumerate(shapes):
            entry = scalars.get(base + i)
            if entry is None:
                continue
            for key, values in full.items():
                entry[key] = values[offsets[i]:offsets[i + 1]].reshape(shape).copy()
            state[base + i] = entry
        base += len(shapes)
    groups = [dict(g) for g in ordered[0]["param_groups"]]
    return {"state": state, "param_groups": groups}


class Consolidated:
    """A ZeroRedundancyOptimizer seen as the replicated optimizer: ``state_dict()`` is its
    `consolidated_state_dict()` (a collective over the data-parallel ranks: every rank
    calls it), ``load_state_dict`` takes a replicated state dict, ``param_groups`` are its
    public groups (the model's parameters). For a checkpoint that must hold the replicated
    state; `dist.save_checkpoint` given the optimizer itself saves each rank's shard."""

    def __init__(self, zero: ZeroRedundancyOptimizer) -> None:
        self.zero = zero

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.zero.param_groups

    def state_dict(self) -> dict[str, Any]:
        return self.zero.consolidated_state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.zero.load_state_dict(state_dict)
