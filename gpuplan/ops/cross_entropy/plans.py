"""Cross-entropy over a vocabulary: fused log-softmax + NLL with label smoothing, and backward.

logits [N, V], target [N] int32/int64, e = label_smoothing (PyTorch's formula):
  lse[n]  = log sum_j exp(logits[n, j])
  loss[n] = (1 - e) * (lse[n] - logits[n, t_n]) + e * (lse[n] - mean_j logits[n, j])
loss[n] = 0 where t_n == ignore_index. reduction "none" gives loss [N]; "sum" sum_n loss[n];
"mean" that sum / #{n : t_n != ignore_index} (0 such rows -> nan, as PyTorch). Loss and lse
are float32 (float64 for f64 logits); the mean/sum is a fixed-order reduction (no atomics).
Host: blocks of rows over the host threads (gpuplan.host_pool), the mean/sum over all rows.
Backward: dlogits[n, j] = g_n * (softmax(logits[n])_j - (1 - e) * [j == t_n] - e / V), with
g_n = dloss[n] ("none"), dloss ("sum") or dloss / count ("mean"); ignored rows get 0.
A target outside [0, V) that is not ignore_index: on the host `can_implement` inspects the
targets and raises InvalidProblem; on a GPU (where inspecting would synchronize) the kernel
never reads out of bounds and such a row's loss and gradient are NaN.

The reductions are one table, `REDUCTIONS`: the descriptor's choices and, upper-cased, the
CUDA enumerators of cross_entropy.cu (-DGPUPLAN_ENUM_Reduction). The vocabulary-parallel
stages (gpuplan/ops/cross_entropy/partial.py) share this module's kernels and helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpuplan import backend, host_pool
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.host_pool import for_blocks
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import INDEX, Choice, DType, Extent, In, Index, OpSpec, Out, Real
from gpuplan.stream import Stream, Workspace

__all__ = [
    "CrossEntropyDescriptor", "CrossEntropyArgs", "CrossEntropyPlan",
    "CrossEntropyBackwardDescriptor", "CrossEntropyBackwardArgs", "CrossEntropyBackwardPlan",
]
__functional__ = ["cross_entropy", "cross_entropy_backward"]

REDUCTIONS: tuple[str, ...] = ("none", "mean", "sum")
RED_INDEX = {name: i for i, name in enumerate(REDUCTIONS)}
#: CUDA index type of a target array, by its itemsize.
INDEX_CTYPE = {4: "int", 8: "long long"}
_UNSIGNED = {4: np.uint32, 8: np.uint64}
_BOOL = ("false", "true")
_ACC_TYPES = ("float", "double")
_REDUCED = [RED_INDEX[r] for r in REDUCTIONS if r != "none"]
MODULE = CudaModule(
    __file__,
    "cross_entropy.cu",
    [f"ce_forward<{cuda_name(t)}, {i}, {w}>" for t in FLOAT_DTYPES for i in INDEX_CTYPE.values()
     for w in _BOOL]
    + [f"ce_reduce<{a}, {i}, {r}>" for a in _ACC_TYPES for i in INDEX_CTYPE.values()
       for r in _REDUCED]
    + [f"ce_count<{i}>" for i in INDEX_CTYPE.values()]
    + [f"ce_backward<{cuda_name(t)}, {i}, {r}>" for t in FLOAT_DTYPES
       for i in INDEX_CTYPE.values() for r in range(len(REDUCTIONS))]
    + [f"ce_partial_max<{cuda_name(t)}>" for t in FLOAT_DTYPES]
    + [f"ce_partial<{cuda_name(t)}, {i}>" for t in FLOAT_DTYPES for i in INDEX_CTYPE.values()]
    + [f"ce_finish<{a}, {i}>" for a in _ACC_TYPES for i in INDEX_CTYPE.values()],
    enums={"Reduction": REDUCTIONS},
)

#: Vocabularies up to this size go one row per warp in the forward; larger get a block.
WARP_ROW_MAX_VOCAB = 1024
_WARPS_PER_BLOCK = 4
MAX_GRID = 1 << 20
REDUCE_THREADS = 1024


def row_threads(vocab: int, per_thread: int) -> int:
    """Threads of a one-row-per-block launch: ~per_thread columns each, 32 to 1024."""
    return min(1024, max(32, cdiv(cdiv(vocab, per_thread), 32) * 32))


def loss_shape(d: Any) -> tuple[int, ...]:
    return (d.n,) if d.reduction == "none" else ()


def acc_dtype(d: Any) -> np.dtype:
    """Loss, lse and statistics: float32 (float64 for f64 logits)."""
    return accumulator(d.dtype)


def kernels(name: Callable[[str], str]) -> dict[int, str]:
    """Kernel instance names per target itemsize: {4: name("int"), 8: name("long long")}."""
    return {k: name(c) for k, c in INDEX_CTYPE.items()}


def check_targets(op: str, target: Any, ignore_index: int, vocab: int) -> None:
    """(host arrays) InvalidProblem unless every target is in [0, vocab) or ignore_index."""
    # Fast path: as unsigned, negative targets are huge, so one compare finds every target
    # outside [0, vocab); they are fine if they are all ignore_index.
    out = np.count_nonzero(target.view(_UNSIGNED[target.dtype.itemsize]) >= vocab)
    if not out or (not 0 <= ignore_index < vocab
                   and out == np.count_nonzero(target == ignore_index)):
        return
    t = target.astype(np.int64, copy=False)
    bad = (t != ignore_index) & ((t < 0) | (t >= vocab))
    if bad.any():
        k = int(np.argmax(bad))
        raise InvalidProblem(describe(op, "target",
                                      f"values in [0, {vocab}) or ignore_index={ignore_index}",
                                      f"target[{k}] = {int(t[k])}"))


def host_backward(d: Any, args: Any, start: int, total: int, smoothing: float) -> None:
    """dlogits of the columns [start, start + d.vocab) of rows `total` wide (see the module
    docstring), in the accumulator dtype, a block of rows at a time over the host threads."""
    acc = accumulator(d.dtype)
    t = args.target.astype(np.int64, copy=False)
    keep = t != d.ignore_index
    g = args.dloss.astype(acc)
    per_row = d.reduction == "none"
    if d.reduction == "mean":
        # With no non-ignored row every gradient row is zeroed below: avoid 0 / 0.
        g = g / acc.type(max(1, np.count_nonzero(keep)))
    e = acc.type(smoothing)
    local = t - start
    hit = keep & (local >= 0) & (local < d.vocab)
    all_kept = keep.all()

    def block(lo: int, hi: int) -> None:
        grad = (args.logits[lo:hi].astype(acc, copy=False)
                - args.lse[lo:hi].astype(acc, copy=False)[:, None])
        np.exp(grad, out=grad)
        if smoothing != 0.0:
            grad -= e / acc.type(total)
        rows = np.nonzero(hit[lo:hi])[0]
        grad[rows, local[lo:hi][rows]] -= acc.type(1) - e
        grad *= g[lo:hi, None] if per_row else g
        if not all_kept:
            grad[~keep[lo:hi]] = 0
        args.dlogits[lo:hi] = grad

    for_blocks(d.n, block, d.vocab, rows_per_block=_rows_per_block(d.vocab))


def _rows_per_block(vocab: int) -> int:
    """Rows per host block: big ones (the rows are independent and a block's passes gain
    little from L2; fewer blocks, fewer NumPy calls)."""
    return max(1, host_pool.BIG_BLOCK // vocab)


def launch_reduce(plan: Plan, stream: Stream, row_loss: Any, args: Any) -> None:
    """loss = the mean or sum of row_loss over the non-ignored rows (one block)."""
    d = plan.desc
    fn = MODULE.function(plan._reduce[args.target.dtype.itemsize], stream.device_id)
    launch(stream, fn, 1, REDUCE_THREADS,
           (row_loss, args.target, args.loss, np.int64(d.n), np.int64(d.ignore_index)))


class BlockBackward:
    """Plan mixin: the gradient over the columns [start, start + vocab) of rows `total`
    wide, from the saved lse (the dense backward is the block (0, vocab)). The plan gives
    `_block() -> (start, total, label_smoothing)`."""

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        ws = 8 if desc.reduction == "mean" else 0  # the non-ignored row count (int64)
        # Elementwise given lse; the count is an exact integer sum: bit-stable.
        return [Candidate("rowwise", BackendKind.NVRTC, True, True, sn(d), sn(accumulator(d)),
                          ws)]

    def _prepare(self) -> None:
        d = self.desc
        self._start, self._total, self._smoothing = self._block()
        t, red = cuda_name(d.dtype), RED_INDEX[d.reduction]
        self._backward = kernels(lambda i: f"ce_backward<{t}, {i}, {red}>")
        self._count = kernels(lambda i: f"ce_count<{i}>")
        self._launch = (min(d.n, MAX_GRID), row_threads(d.vocab, 8))
        self._count_scalars = (np.int64(d.n), np.int64(d.ignore_index))
        self._scalars = (np.int64(d.n), np.int64(d.vocab), np.int64(self._start),
                         np.int64(self._total), np.int64(d.ignore_index),
                         np.float64(self._smoothing))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        host_backward(self.desc, args, self._start, self._total, self._smoothing)

    def _run_rowwise(self, stream: Stream, ws: Workspace, args: Any) -> None:
        itemsize = args.target.dtype.itemsize
        count = None
        if self.desc.reduction == "mean":
            count = ws.view(np.int64, 1)
            fn = MODULE.function(self._count[itemsize], stream.device_id)
            launch(stream, fn, 1, REDUCE_THREADS, (args.target, count, *self._count_scalars))
        fn = MODULE.function(self._backward[itemsize], stream.device_id)
        launch(stream, fn, *self._launch, (args.logits, args.target, args.lse, args.dloss, count,
                                           args.dlogits, *self._scalars))


_FIELDS = (Extent("n"), Extent("vocab", min=1), Index("ignore_index", default=-100),
           Choice("reduction", choices=REDUCTIONS, default="mean"),
           Real("label_smoothing", lo=0.0, hi=1.0, default=0.0),
           DType("dtype", FLOAT_DTYPES, default=np.float32))
_LOGITS, _TARGET = In("logits", ("n", "vocab")), In("target", ("n",), INDEX)
FORWARD = OpSpec("cross_entropy", fields=_FIELDS, operands=(
    _LOGITS, _TARGET, Out("loss", loss_shape, acc_dtype, distinct=("logits", "target", "lse")),
    Out("lse", ("n",), acc_dtype)))
BACKWARD = OpSpec("cross_entropy_backward", fields=_FIELDS, operands=(
    _LOGITS, _TARGET, In("lse", ("n",), acc_dtype), In("dloss", loss_shape, acc_dtype),
    Out("dlogits", ("n", "vocab"))))

CrossEntropyDescriptor = FORWARD.descriptor(
    "CrossEntropyDescriptor",
    "Cross entropy of logits [n, vocab] (dtype) against targets [n]: ignore_index, reduction "
    "('none', 'mean', 'sum') and label_smoothing in [0, 1].")
#: forward and backward share the descriptor (same fields).
CrossEntropyBackwardDescriptor = CrossEntropyDescriptor
BACKWARD.descriptor_cls = CrossEntropyDescriptor
CrossEntropyArgs = FORWARD.args(
    "CrossEntropyArgs", "logits [n, vocab], target [n] int32/int64; written: loss ([n] for "
    "'none', else 0-d) and lse [n], float32 (float64 for f64 logits).")
CrossEntropyBackwardArgs = BACKWARD.args(
    "CrossEntropyBackwardArgs", "logits, target, the saved lse [n], dloss (shaped like loss); "
    "written: dlogits [n, vocab].")


class _CrossEntropyBase(Plan):
    category = "loss"

    def _check_args(self, args: Any) -> None:
        if self._stream.is_host:
            check_targets(self.op, args.target, self.desc.ignore_index, self.desc.vocab)


class CrossEntropyPlan(_CrossEntropyBase):
    """Forward: loss (per reduction) and the saved lse[N] (see the module docstring)."""

    op = "cross_entropy"
    spec = FORWARD

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        acc = accumulator(d)
        ws = 0 if desc.reduction == "none" else desc.n * acc.itemsize
        variant = "warp_row" if desc.vocab <= WARP_ROW_MAX_VOCAB else "block_row"
        # Per-row losses then a one-block fixed-order reduction: deterministic; the tree
        # reductions follow the launch shape, so not bit-stable.
        return [Candidate(variant, BackendKind.NVRTC, True, False, sn(d), sn(acc), ws)]

    def _prepare(self) -> None:
        d = self.desc
        self._acc = accumulator(d.dtype)
        warp = self._cand.variant == "warp_row"
        t, a, red = cuda_name(d.dtype), cuda_name(self._acc), RED_INDEX[d.reduction]
        self._forward = kernels(lambda i: f"ce_forward<{t}, {i}, {_BOOL[warp]}>")
        self._reduce = kernels(lambda i: f"ce_reduce<{a}, {i}, {red}>")
        if warp:
            self._launch = (min(cdiv(d.n, _WARPS_PER_BLOCK), MAX_GRID), 32 * _WARPS_PER_BLOCK)
        else:
            self._launch = (min(d.n, MAX_GRID), row_threads(d.vocab, 16))
        self._scalars = (np.int64(d.n), np.int64(d.vocab), np.int64(d.ignore_index),
                         np.float64(d.label_smoothing))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d, acc = self.desc, self._acc
        t = args.target.astype(np.int64, copy=False)
        ignored = t == d.ignore_index
        e = acc.type(d.label_smoothing)
        loss = np.empty(d.n, acc)

        def block(lo: int, hi: int) -> None:  # per-row lse and loss
            x = args.logits[lo:hi].astype(acc, copy=False)
            m = x.max(axis=1)
            m_safe = np.where(np.isfinite(m), m, 0).astype(acc)
            shifted = x - m_safe[:, None]
            np.exp(shifted, out=shifted)
            lse = (m_safe + np.log(shifted.sum(axis=1))).astype(acc)
            ig = ignored[lo:hi]
            xt = x[np.arange(hi - lo), np.where(ig, 0, t[lo:hi])]
            row = (acc.type(1) - e) * (lse - xt)
            if d.label_smoothing != 0.0:
                row = row + e * (lse - x.mean(axis=1))
            loss[lo:hi] = np.where(ig, acc.type(0), row)
            args.lse[lo:hi] = lse

        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            for_blocks(d.n, block, d.vocab, rows_per_block=_rows_per_block(d.vocab))
            if d.reduction == "none":
                args.loss[...] = loss
            elif d.reduction == "sum":
                args.loss[...] = loss.sum(dtype=acc)
            else:
                args.loss[...] = loss.sum(dtype=acc) / acc.type(np.count_nonzero(~ignored))

    def _run_warp_row(self, stream: Stream, ws: Workspace, args: Any) -> None:
        d = self.desc
        # With n == 0 there is no workspace; the reduction then reads no row.
        row_loss = args.loss if d.reduction == "none" or d.n == 0 else ws.view(self._acc, d.n)
        if d.n:
            fn = MODULE.function(self._forward[args.target.dtype.itemsize], stream.device_id)
            launch(stream, fn, *self._launch,
                   (args.logits, args.target, row_loss, args.lse, *self._scalars))
        if d.reduction != "none":
            launch_reduce(self, stream, row_loss, args)

    _run_block_row = _run_warp_row


class CrossEntropyBackwardPlan(BlockBackward, _CrossEntropyBase):
    """dlogits from logits, target, the saved lse and dloss (see the module docstring)."""

    op = "cross_entropy_backward"
    spec = BACKWARD

    def _block(self) -> tuple[int, int, float]:
        return 0, self.desc.vocab, self.desc.label_smoothing


# -- functional API ------------------------------------------------------------------------


def cross_entropy(logits: Any, target: Any, *, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> tuple[Any, Any]:
    """(loss, lse) of logits [N, V] against target [N]; loss [N] for "none", else 0-d."""
    try:  # free when right: a wrong rank is named instead of Python's unpacking error
        n, v = logits.shape
    except ValueError:
        raise logits_error("cross_entropy", logits) from None
    desc = CrossEntropyDescriptor(n, v, ignore_index, reduction, label_smoothing, logits.dtype)
    return call(CrossEntropyPlan, desc, like=logits, logits=backend.ascontiguous(logits),
                target=backend.ascontiguous(target))


def cross_entropy_backward(logits: Any, target: Any, lse: Any, dloss: Any, *,
                           ignore_index: int = -100, reduction: str = "mean",
                           label_smoothing: float = 0.0) -> Any:
    """dlogits [N, V]; dloss is 0-d ("mean"/"sum") or [N] ("none"), cast to the loss dtype."""
    try:  # free when right: a wrong rank is named instead of Python's unpacking error
        n, v = logits.shape
    except ValueError:
        raise logits_error("cross_entropy_backward", logits) from None
    desc = CrossEntropyDescriptor(n, v, ignore_index, reduction, label_smoothing, logits.dtype)
    return call(CrossEntropyBackwardPlan, desc, like=logits,
                logits=backend.ascontiguous(logits), target=backend.ascontiguous(target),
                lse=backend.ascontiguous(lse),
                dloss=loss_like("cross_entropy_backward", logits, dloss, reduction))


def logits_error(op: str, logits: Any) -> InvalidProblem:
    """The error for logits that are not [N, V] (built only after unpacking their shape
    failed)."""
    return InvalidProblem(describe(op, "logits", "a rank-2 array [N, V]",
                                   f"shape {tuple(logits.shape)}"))


def loss_like(op: str, logits: Any, dloss: Any, reduction: str) -> Any:
    """dloss as a contiguous array of the loss dtype and shape ([N] or 0-d); a dloss of
    more than one element for a reduced loss is named (op's error), not NumPy's."""
    xp = backend.array_namespace(logits)
    dl = xp.asarray(dloss, dtype=accumulator(logits.dtype))
    if reduction != "none":
        try:
            dl = dl.reshape(())
        except ValueError:
            raise InvalidProblem(describe(op, "dloss", f"one value (reduction {reduction!r})",
                                          f"shape {tuple(dl.shape)}")) from None
    return dl if dl.flags.c_contiguous else dl.copy()  # ascontiguousarray makes 0-d 1-d
