"""Cross-entropy over a vocabulary: fused log-softmax + NLL with label smoothing, and backward.

logits [N, V], target [N] int32/int64, e = label_smoothing (PyTorch's formula):
  lse[n]  = log sum_j exp(logits[n, j])
  loss[n] = (1 - e) * (lse[n] - logits[n, t_n]) + e * (lse[n] - mean_j logits[n, j])
loss[n] = 0 where t_n == ignore_index. reduction "none" gives loss [N]; "sum" sum_n loss[n];
"mean" that sum / #{n : t_n != ignore_index} (0 such rows -> nan, as PyTorch). Loss and lse
are float32 (float64 for f64 logits); the mean/sum is a fixed-order reduction (no atomics).
Backward: dlogits[n, j] = g_n * (softmax(logits[n])_j - (1 - e) * [j == t_n] - e / V), with
g_n = dloss[n] ("none"), dloss ("sum") or dloss / count ("mean"); ignored rows get 0.
A target outside [0, V) that is not ignore_index: on the host `can_implement` inspects the
targets and raises InvalidProblem; on a GPU (where inspecting would synchronize) the kernel
never reads out of bounds and such a row's loss and gradient are NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name, short_name
from gpuplan.errors import InvalidProblem, Unsupported, describe
from gpuplan.execute import execute
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.plan import (
    BackendKind,
    Candidate,
    Plan,
    check_dtype,
    check_index_dtype,
    check_operand,
    check_writable_distinct,
    host_candidate,
)
from gpuplan.stream import Stream, Workspace

__all__ = [
    "CrossEntropyDescriptor", "CrossEntropyArgs", "CrossEntropyPlan",
    "CrossEntropyBackwardDescriptor", "CrossEntropyBackwardArgs", "CrossEntropyBackwardPlan",
]
__functional__ = ["cross_entropy", "cross_entropy_backward"]

REDUCTIONS = ("none", "mean", "sum")
_INDEX_TYPES = ("int", "long long")
_BOOL = ("false", "true")
_ACC_TYPES = ("float", "double")
_MODULE = CudaModule(
    __file__,
    "cross_entropy.cu",
    [f"ce_forward<{cuda_name(t)}, {i}, {w}>" for t in FLOAT_DTYPES for i in _INDEX_TYPES
     for w in _BOOL]
    + [f"ce_backward<{cuda_name(t)}, {i}>" for t in FLOAT_DTYPES for i in _INDEX_TYPES]
    + [f"ce_reduce<{a}, {i}>" for a in _ACC_TYPES for i in _INDEX_TYPES]
    + [f"ce_count<{i}>" for i in _INDEX_TYPES],
)

#: Vocabularies up to this size go one row per warp in the forward; larger get a block.
WARP_ROW_MAX_VOCAB = 1024
_WARPS_PER_BLOCK = 4
_MAX_GRID = 1 << 20
_REDUCE_THREADS = 1024


def _index_ctype(target: Any) -> str:
    return "int" if target.dtype == np.int32 else "long long"


def _row_threads(vocab: int, per_thread: int) -> int:
    return min(1024, max(32, cdiv(cdiv(vocab, per_thread), 32) * 32))


@dataclass(frozen=True)
class CrossEntropyDescriptor:
    n: int
    vocab: int
    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    dtype: Any = np.float32


@dataclass(frozen=True)
class CrossEntropyArgs:
    logits: Any  # [n, vocab]
    target: Any  # [n] int32 / int64
    loss: Any    # [n] ("none") or 0-d, float32 (float64 for f64 logits)
    lse: Any     # [n], float32 (float64 for f64 logits)


@dataclass(frozen=True)
class CrossEntropyBackwardDescriptor:
    n: int
    vocab: int
    ignore_index: int = -100
    reduction: str = "mean"
    label_smoothing: float = 0.0
    dtype: Any = np.float32


@dataclass(frozen=True)
class CrossEntropyBackwardArgs:
    logits: Any   # [n, vocab]
    target: Any   # [n] int32 / int64
    lse: Any      # [n] saved by the forward
    dloss: Any    # [n] ("none") or 0-d, float32 (float64 for f64 logits)
    dlogits: Any  # [n, vocab] written


class _CrossEntropyBase(Plan):
    category = "loss"

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        if desc.reduction not in REDUCTIONS:
            raise Unsupported(describe(cls.op, "reduction", " or ".join(REDUCTIONS),
                                       repr(desc.reduction)))
        e = desc.label_smoothing
        if not (math.isfinite(e) and 0.0 <= e <= 1.0):
            raise InvalidProblem(describe(cls.op, "label_smoothing", "a value in [0, 1]", e))
        if desc.vocab < 1:
            raise InvalidProblem(describe(cls.op, "vocab", "a vocabulary size >= 1", desc.vocab))

    def _loss_shape(self) -> tuple[int, ...]:
        return (self.desc.n,) if self.desc.reduction == "none" else ()

    def _check_target(self, target: Any) -> None:
        d = self.desc
        self._index_dtype = short_name(check_index_dtype(self.op, "target", target))
        check_operand(self.op, "target", target, (d.n,), target.dtype)
        if backend.is_host_array(target) and d.n:
            t = target.astype(np.int64)
            bad = (t != d.ignore_index) & ((t < 0) | (t >= d.vocab))
            if bad.any():
                k = int(np.argmax(bad))
                raise InvalidProblem(describe(
                    self.op, "target", f"values in [0, {d.vocab}) or ignore_index="
                    f"{d.ignore_index}", f"target[{k}] = {int(t[k])}"))

    def _is_empty(self) -> bool:
        return self.desc.n == 0 and self.desc.reduction == "none"


class CrossEntropyPlan(_CrossEntropyBase):
    """Forward: loss (per reduction) and the saved lse[N] (see the module docstring)."""

    op = "cross_entropy"

    @classmethod
    def _candidates(cls, desc: CrossEntropyDescriptor, on_device: bool) -> list[Candidate]:
        d = check_dtype(cls.op, "dtype", desc.dtype, FLOAT_DTYPES)
        if not on_device:
            return [host_candidate(d)]
        acc = accumulator(d)
        ws = 0 if desc.reduction == "none" else desc.n * acc.itemsize
        variant = "warp_row" if desc.vocab <= WARP_ROW_MAX_VOCAB else "block_row"
        # Per-row losses then a one-block fixed-order reduction: deterministic; the tree
        # reductions follow the launch shape, so not bit-stable.
        return [Candidate(variant, BackendKind.NVRTC, True, False, short_name(d),
                          short_name(acc), ws)]

    def _check_args(self, args: CrossEntropyArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        check_operand(self.op, "logits", args.logits, (d.n, d.vocab), d.dtype)
        self._check_target(args.target)
        check_operand(self.op, "loss", args.loss, self._loss_shape(), acc)
        check_operand(self.op, "lse", args.lse, (d.n,), acc)
        check_writable_distinct(self.op, {"loss": args.loss, "lse": args.lse},
                                {"logits": args.logits, "target": args.target})
        check_writable_distinct(self.op, {"loss": args.loss}, {"lse": args.lse})

    def _run_numpy(self, stream: Stream, ws: Workspace, args: CrossEntropyArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        x = args.logits.astype(acc, copy=False)
        t = args.target.astype(np.int64, copy=False)
        ignored = t == d.ignore_index
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            m = x.max(axis=1) if d.n else np.zeros(0, acc)
            m_safe = np.where(np.isfinite(m), m, 0).astype(acc)
            shifted = x - m_safe[:, None]
            np.exp(shifted, out=shifted)
            lse = (m_safe + np.log(shifted.sum(axis=1))).astype(acc)
            xt = x[np.arange(d.n), np.where(ignored, 0, t)]
            e = acc.type(d.label_smoothing)
            loss = (acc.type(1) - e) * (lse - xt)
            if d.label_smoothing != 0.0:
                loss = loss + e * (lse - x.mean(axis=1))
            loss = np.where(ignored, acc.type(0), loss).astype(acc)
            if d.reduction == "none":
                args.loss[...] = loss
            elif d.reduction == "sum":
                args.loss[...] = loss.sum(dtype=acc)
            else:
                args.loss[...] = loss.sum(dtype=acc) / acc.type(np.count_nonzero(~ignored))
        args.lse[...] = lse

    def _run_warp_row(self, stream: Stream, ws: Workspace, args: CrossEntropyArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        it = _index_ctype(args.target)
        # With n == 0 there is no workspace; the reduction then reads no row.
        row_loss = args.loss if d.reduction == "none" or d.n == 0 else ws.view(acc, d.n)
        if d.n:
            warp = self._cand.variant == "warp_row"
            if warp:
                grid = min(cdiv(d.n, _WARPS_PER_BLOCK), _MAX_GRID)
                block = 32 * _WARPS_PER_BLOCK
            else:
                grid, block = min(d.n, _MAX_GRID), _row_threads(d.vocab, 16)
            fn = _MODULE.function(f"ce_forward<{cuda_name(d.dtype)}, {it}, {_BOOL[warp]}>",
                                  stream.device_id)
            launch(stream, fn, grid, block,
                   (args.logits, args.target, row_loss, args.lse, np.int64(d.n),
                    np.int64(d.vocab), np.int64(d.ignore_index), np.float64(d.label_smoothing)))
        if d.reduction != "none":
            fn = _MODULE.function(f"ce_reduce<{cuda_name(acc)}, {it}>", stream.device_id)
            launch(stream, fn, 1, _REDUCE_THREADS,
                   (row_loss, args.target, args.loss, np.int64(d.n), np.int64(d.ignore_index),
                    np.int32(d.reduction == "mean")))

    _run_block_row = _run_warp_row


class CrossEntropyBackwardPlan(_CrossEntropyBase):
    """dlogits from logits, target, the saved lse and dloss (see the module docstring)."""

    op = "cross_entropy_backward"

    @classmethod
    def _candidates(cls, desc: CrossEntropyBackwardDescriptor,
                    on_device: bool) -> list[Candidate]:
        d = check_dtype(cls.op, "dtype", desc.dtype, FLOAT_DTYPES)
        if not on_device:
            return [host_candidate(d)]
        ws = 8 if desc.reduction == "mean" else 0  # the non-ignored row count (int64)
        # Elementwise given lse; the count is an exact integer sum: bit-stable.
        return [Candidate("rowwise", BackendKind.NVRTC, True, True, short_name(d),
                          short_name(accumulator(d)), ws)]

    def _check_args(self, args: CrossEntropyBackwardArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        check_operand(self.op, "logits", args.logits, (d.n, d.vocab), d.dtype)
        self._check_target(args.target)
        check_operand(self.op, "lse", args.lse, (d.n,), acc)
        check_operand(self.op, "dloss", args.dloss, self._loss_shape(), acc)
        check_operand(self.op, "dlogits", args.dlogits, (d.n, d.vocab), d.dtype)
        check_writable_distinct(self.op, {"dlogits": args.dlogits},
                                {"logits": args.logits, "target": args.target, "lse": args.lse,
                                 "dloss": args.dloss})

    def _is_empty(self) -> bool:
        return self.desc.n == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: CrossEntropyBackwardArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        t = args.target.astype(np.int64, copy=False)
        ignored = t == d.ignore_index
        g = args.dloss.astype(acc)
        if d.reduction == "none":
            g = g[:, None]
        elif d.reduction == "mean":
            # With no non-ignored row every gradient row is zeroed below: avoid 0 / 0.
            g = g / acc.type(max(1, np.count_nonzero(~ignored)))
        e = acc.type(d.label_smoothing)
        # grad = g * (softmax(logits) - (1 - e) * onehot(target) - e / vocab), 0 on ignored rows
        grad = args.logits.astype(acc, copy=False) - args.lse.astype(acc, copy=False)[:, None]
        np.exp(grad, out=grad)
        if d.label_smoothing != 0.0:
            grad -= e / acc.type(d.vocab)
        rows = np.nonzero(~ignored)[0]
        grad[rows, t[rows]] -= acc.type(1) - e
        grad *= g
        if rows.size < d.n:
            grad[ignored] = 0
        args.dlogits[...] = grad

    def _run_rowwise(self, stream: Stream, ws: Workspace, args: CrossEntropyBackwardArgs) -> None:
        d = self.desc
        it = _index_ctype(args.target)
        count = None
        if d.reduction == "mean":
            count = ws.view(np.int64, 1)
            fn = _MODULE.function(f"ce_count<{it}>", stream.device_id)
            launch(stream, fn, 1, _REDUCE_THREADS,
                   (args.target, count, np.int64(d.n), np.int64(d.ignore_index)))
        fn = _MODULE.function(f"ce_backward<{cuda_name(d.dtype)}, {it}>", stream.device_id)
        launch(stream, fn, min(d.n, _MAX_GRID), _row_threads(d.vocab, 8),
               (args.logits, args.target, args.lse, args.dloss, count, args.dlogits,
                np.int64(d.n), np.int64(d.vocab), np.int64(d.ignore_index),
                np.float64(d.label_smoothing), np.int32(d.reduction == "none")))


# -- functional API ------------------------------------------------------------------------


def cross_entropy(logits: Any, target: Any, *, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> tuple[Any, Any]:
    """(loss, lse) of logits [N, V] against target [N]; loss [N] for "none", else 0-d."""
    xp = backend.array_namespace(logits)
    acc = accumulator(logits.dtype)
    n, v = (int(s) for s in logits.shape)
    loss = xp.empty((n,) if reduction == "none" else (), dtype=acc)
    lse = xp.empty(n, dtype=acc)
    desc = CrossEntropyDescriptor(n, v, int(ignore_index), reduction, float(label_smoothing),
                                  as_dtype(logits.dtype))
    execute(CrossEntropyPlan, desc,
            CrossEntropyArgs(xp.ascontiguousarray(logits), xp.ascontiguousarray(target), loss,
                             lse), like=logits)
    return loss, lse


def cross_entropy_backward(logits: Any, target: Any, lse: Any, dloss: Any, *,
                           ignore_index: int = -100, reduction: str = "mean",
                           label_smoothing: float = 0.0) -> Any:
    """dlogits [N, V]; dloss is 0-d ("mean"/"sum") or [N] ("none"), cast to the loss dtype."""
    xp = backend.array_namespace(logits)
    acc = accumulator(logits.dtype)
    n, v = (int(s) for s in logits.shape)
    dlogits = xp.empty((n, v), dtype=logits.dtype)
    shape = (n,) if reduction == "none" else ()
    dl = xp.asarray(dloss, dtype=acc).reshape(shape)
    dl = dl if dl.flags.c_contiguous else dl.copy()  # ascontiguousarray makes 0-d 1-d
    desc = CrossEntropyBackwardDescriptor(n, v, int(ignore_index), reduction,
                                          float(label_smoothing), as_dtype(logits.dtype))
    execute(CrossEntropyBackwardPlan, desc,
            CrossEntropyBackwardArgs(xp.ascontiguousarray(logits), xp.ascontiguousarray(target),
                                     xp.ascontiguousarray(lse), dl, dlogits), like=logits)
    return dlogits
