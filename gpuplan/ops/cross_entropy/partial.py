"""Vocabulary-parallel cross entropy: the per-rank stages between the collectives.

A rank holds logits [N, V] = the columns [vocab_start, vocab_start + V) of rows
vocab_total wide (a tensor-parallel vocabulary block). The loss of the full rows is

  1. row_max = cross_entropy_partial_max(logits)        m_loc[n] = max_j x[n, j]
     (caller: m = AllReduce_max(m_loc))
  2. stats = cross_entropy_partial(logits, target, m)   stats[0, n] = sum_j exp(x[n, j] - m[n]),
     stats[1, n] = x[n, t_n - vocab_start] when t_n falls in the block, else 0
     (caller: stats = AllReduce_sum(stats))
  3. loss, lse = cross_entropy_finish(target, m, stats) lse = m + log stats[0],
     loss[n] = lse[n] - stats[1, n] (0 where t_n == ignore_index), then the reduction
  4. dlogits = cross_entropy_partial_backward(logits, target, lse, dloss)
     = g_n * (exp(x[n, j] - lse[n]) - [j == t_n - vocab_start]) on the block, no collective

with the reductions and g_n of gpuplan/ops/cross_entropy/plans.py (no label smoothing). The
stages share one descriptor and cross_entropy.cu's kernels. Targets outside
[0, vocab_total) that are not ignore_index: InvalidProblem on the host, NaN on a device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.nvrtc import cdiv, launch
from gpuplan.ops.cross_entropy.plans import (
    MAX_GRID,
    MODULE,
    RED_INDEX,
    REDUCTIONS,
    BlockBackward,
    acc_dtype,
    check_targets,
    kernels,
    launch_reduce,
    logits_error,
    loss_like,
    loss_shape,
    row_threads,
)
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import INDEX, Choice, DType, Extent, In, Index, OpSpec, Out
from gpuplan.stream import Stream, Workspace

__all__ = [
    "CrossEntropyPartialDescriptor",
    "CrossEntropyPartialMaxArgs", "CrossEntropyPartialMaxPlan",
    "CrossEntropyPartialArgs", "CrossEntropyPartialPlan",
    "CrossEntropyFinishArgs", "CrossEntropyFinishPlan",
    "CrossEntropyPartialBackwardArgs", "CrossEntropyPartialBackwardPlan",
]
__functional__ = ["cross_entropy_partial_max", "cross_entropy_partial", "cross_entropy_finish",
                  "cross_entropy_partial_backward"]

_FIELDS = (Extent("n"), Extent("vocab"), Extent("vocab_start"), Extent("vocab_total", min=1),
           Index("ignore_index", default=-100),
           Choice("reduction", choices=REDUCTIONS, default="mean"),
           DType("dtype", FLOAT_DTYPES, default=np.float32))
_LOGITS, _TARGET = In("logits", ("n", "vocab")), In("target", ("n",), INDEX)
_ROW_MAX, _STATS = In("row_max", ("n",), acc_dtype), In("stats", (2, "n"), acc_dtype)
MAX = OpSpec("cross_entropy_partial_max", fields=_FIELDS,
             operands=(_LOGITS, Out("row_max", ("n",), acc_dtype)))
PARTIAL = OpSpec("cross_entropy_partial", fields=_FIELDS,
                 operands=(_LOGITS, _TARGET, _ROW_MAX, Out("stats", (2, "n"), acc_dtype)))
FINISH = OpSpec("cross_entropy_finish", fields=_FIELDS, operands=(
    _TARGET, _ROW_MAX, _STATS,
    Out("loss", loss_shape, acc_dtype, distinct=("target", "row_max", "stats", "lse")),
    Out("lse", ("n",), acc_dtype)))
BACKWARD = OpSpec("cross_entropy_partial_backward", fields=_FIELDS, operands=(
    _LOGITS, _TARGET, In("lse", ("n",), acc_dtype), In("dloss", loss_shape, acc_dtype),
    Out("dlogits", ("n", "vocab"))))

CrossEntropyPartialDescriptor = MAX.descriptor(
    "CrossEntropyPartialDescriptor",
    "Logits [n, vocab] (dtype): the columns [vocab_start, vocab_start + vocab) of rows "
    "vocab_total wide; ignore_index and reduction as in CrossEntropyDescriptor. The finish "
    "stage reads n, vocab_total, ignore_index, reduction and dtype only.")
for _spec in (PARTIAL, FINISH, BACKWARD):
    _spec.descriptor_cls = CrossEntropyPartialDescriptor
CrossEntropyPartialMaxArgs = MAX.args(
    "CrossEntropyPartialMaxArgs", "logits [n, vocab]; written: row_max [n] (accumulator dtype).")
CrossEntropyPartialArgs = PARTIAL.args(
    "CrossEntropyPartialArgs", "logits, target [n], the global row_max [n]; written: "
    "stats [2, n] (local sum of exp(x - row_max); target logit in the block, else 0).")
CrossEntropyFinishArgs = FINISH.args(
    "CrossEntropyFinishArgs", "target, row_max and the all-reduced stats; written: loss ([n] "
    "for 'none', else 0-d) and lse [n].")
CrossEntropyPartialBackwardArgs = BACKWARD.args(
    "CrossEntropyPartialBackwardArgs", "logits, target, lse [n], dloss (shaped like loss); "
    "written: dlogits [n, vocab].")


class _PartialBase(Plan):
    category = "loss"

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        if desc.vocab_start + desc.vocab > desc.vocab_total:
            raise InvalidProblem(describe(
                cls.op, "vocab_start", f"a block inside [0, {desc.vocab_total})",
                f"[{desc.vocab_start}, {desc.vocab_start + desc.vocab})"))

    def _check_args(self, args: Any) -> None:
        if self._stream.is_host and getattr(args, "target", None) is not None:
            check_targets(self.op, args.target, self.desc.ignore_index, self.desc.vocab_total)

    #: columns per thread of the one-row-per-block stages
    _per_thread = 16

    def _prepare(self) -> None:
        d = self.desc
        self._acc = accumulator(d.dtype)
        self._launch = (min(d.n, MAX_GRID), row_threads(d.vocab, self._per_thread))


def _device_candidate(desc: Any, stream: Stream, variant: str, bit_stable: bool,
                      ws: int = 0) -> list[Candidate]:
    d = as_dtype(desc.dtype)
    if stream.is_host:
        return [host_candidate(d)]
    return [Candidate(variant, BackendKind.NVRTC, True, bit_stable, sn(d),
                      sn(accumulator(d)), ws)]


class CrossEntropyPartialMaxPlan(_PartialBase):
    """Stage 1: row_max[n] = max of the block's row n (NaN-propagating; -inf if vocab == 0)."""

    op = "cross_entropy_partial_max"
    spec = MAX

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        return _device_candidate(desc, stream, "block_row", True)  # a max is exact

    def _prepare(self) -> None:
        super()._prepare()
        d = self.desc
        self._kernel = f"ce_partial_max<{cuda_name(d.dtype)}>"
        self._scalars = (np.int64(d.n), np.int64(d.vocab))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        x = args.logits.astype(self._acc, copy=False)
        args.row_max[...] = x.max(axis=1) if self.desc.vocab else -np.inf

    def _run_block_row(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, *self._launch, (args.logits, args.row_max, *self._scalars))


class CrossEntropyPartialPlan(_PartialBase):
    """Stage 2: stats [2, n] = (sum_j exp(x - row_max), the target logit in the block or 0)."""

    op = "cross_entropy_partial"
    spec = PARTIAL

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        return _device_candidate(desc, stream, "block_row", False)  # a tree sum

    _per_thread = 8

    def _prepare(self) -> None:
        super()._prepare()
        d = self.desc
        t = cuda_name(d.dtype)
        self._kernel = kernels(lambda i: f"ce_partial<{t}, {i}>")
        self._scalars = (np.int64(d.n), np.int64(d.vocab), np.int64(d.vocab_start))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d, acc = self.desc, self._acc
        x = args.logits.astype(acc, copy=False)
        with np.errstate(invalid="ignore", over="ignore"):
            args.stats[0] = np.exp(x - args.row_max[:, None]).sum(axis=1, dtype=acc)
        local = args.target.astype(np.int64) - d.vocab_start
        mine = (local >= 0) & (local < d.vocab)
        rows = np.nonzero(mine)[0]
        args.stats[1] = 0
        args.stats[1, rows] = x[rows, local[rows]]

    def _run_block_row(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = MODULE.function(self._kernel[args.target.dtype.itemsize], stream.device_id)
        launch(stream, fn, *self._launch,
               (args.logits, args.target, args.row_max, args.stats, *self._scalars))


class CrossEntropyFinishPlan(_PartialBase):
    """Stage 3: lse = row_max + log stats[0], the row losses lse - stats[1], the reduction."""

    op = "cross_entropy_finish"
    spec = FINISH

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        acc = accumulator(desc.dtype)
        ws = 0 if desc.reduction == "none" else desc.n * acc.itemsize
        # Row-wise, then (mean/sum) the one-block fixed-order reduction of the dense forward.
        return _device_candidate(desc, stream, "rowwise", desc.reduction == "none", ws)

    def _prepare(self) -> None:
        d = self.desc
        self._acc = accumulator(d.dtype)
        a, red = cuda_name(self._acc), RED_INDEX[d.reduction]
        self._kernel = kernels(lambda i: f"ce_finish<{a}, {i}>")
        self._reduce = kernels(lambda i: f"ce_reduce<{a}, {i}, {red}>")
        self._grid = max(1, min(cdiv(d.n, 256), MAX_GRID))
        self._scalars = (np.int64(d.n), np.int64(d.vocab_total), np.int64(d.ignore_index))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d, acc = self.desc, self._acc
        keep = args.target != d.ignore_index
        with np.errstate(invalid="ignore", divide="ignore"):
            lse = (args.row_max + np.log(args.stats[0])).astype(acc)
            loss = np.where(keep, lse - args.stats[1], acc.type(0)).astype(acc)
            if d.reduction == "none":
                args.loss[...] = loss
            elif d.reduction == "sum":
                args.loss[...] = loss.sum(dtype=acc)
            else:
                args.loss[...] = loss.sum(dtype=acc) / acc.type(np.count_nonzero(keep))
        args.lse[...] = lse

    def _run_rowwise(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        row_loss = args.loss if d.reduction == "none" or d.n == 0 else ws.view(self._acc, d.n)
        if d.n:
            fn = MODULE.function(self._kernel[args.target.dtype.itemsize], stream.device_id)
            launch(stream, fn, self._grid, 256, (args.target, args.row_max, args.stats,
                                                 row_loss, args.lse, *self._scalars))
        if d.reduction != "none":
            launch_reduce(self, stream, row_loss, args)


class CrossEntropyPartialBackwardPlan(BlockBackward, _PartialBase):
    """Stage 4: dlogits = g_n * (softmax - onehot) on the block (see the module docstring)."""

    op = "cross_entropy_partial_backward"
    spec = BACKWARD

    def _block(self) -> tuple[int, int, float]:
        return self.desc.vocab_start, self.desc.vocab_total, 0.0


# -- functional API ------------------------------------------------------------------------


def cross_entropy_partial_max(logits: Any) -> Any:
    """row_max [N] of logits [N, V] (accumulator dtype; the block's place does not matter)."""
    try:
        n, v = logits.shape
    except ValueError:
        raise logits_error("cross_entropy_partial_max", logits) from None
    return call(CrossEntropyPartialMaxPlan,
                CrossEntropyPartialDescriptor(n, v, 0, max(v, 1), dtype=logits.dtype),
                like=logits, logits=backend.ascontiguous(logits))


def cross_entropy_partial(logits: Any, target: Any, row_max: Any, *, vocab_start: int,
                          vocab_total: int, ignore_index: int = -100) -> Any:
    """stats [2, N] of the block starting at vocab_start, given the global row_max [N];
    targets equal to ignore_index contribute no target logit."""
    try:
        n, v = logits.shape
    except ValueError:
        raise logits_error("cross_entropy_partial", logits) from None
    desc = CrossEntropyPartialDescriptor(n, v, vocab_start, vocab_total, ignore_index,
                                         dtype=logits.dtype)
    return call(CrossEntropyPartialPlan, desc, like=logits, logits=backend.ascontiguous(logits),
                target=backend.ascontiguous(target), row_max=row_max)


def cross_entropy_finish(target: Any, row_max: Any, stats: Any, *, vocab_total: int,
                         ignore_index: int = -100, reduction: str = "mean") -> tuple[Any, Any]:
    """(loss, lse) from the all-reduced row_max [N] and stats [2, N]; loss [N] for "none",
    else 0-d, in row_max's dtype."""
    desc = CrossEntropyPartialDescriptor(target.shape[0], 0, 0, vocab_total, ignore_index,
                                         reduction, row_max.dtype)
    return call(CrossEntropyFinishPlan, desc, like=row_max,
                target=backend.ascontiguous(target), row_max=row_max, stats=stats)


def cross_entropy_partial_backward(logits: Any, target: Any, lse: Any, dloss: Any, *,
                                   vocab_start: int, vocab_total: int, ignore_index: int = -100,
                                   reduction: str = "mean") -> Any:
    """dlogits [N, V] of the block starting at vocab_start; dloss as for cross_entropy."""
    try:
        n, v = logits.shape
    except ValueError:
        raise logits_error("cross_entropy_partial_backward", logits) from None
    desc = CrossEntropyPartialDescriptor(n, v, vocab_start, vocab_total, ignore_index,
                                         reduction, logits.dtype)
    return call(CrossEntropyPartialBackwardPlan, desc, like=logits,
                logits=backend.ascontiguous(logits), target=backend.ascontiguous(target),
                lse=backend.ascontiguous(lse),
                dloss=loss_like("cross_entropy_partial_backward", logits, dloss, reduction))
