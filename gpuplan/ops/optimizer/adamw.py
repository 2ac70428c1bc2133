"""AdamW steps, fused and in place: one tensor (AdamWPlan) or many in one launch
(AdamWMultiTensorPlan). With t = step (from 1), PyTorch's AdamW:

    p = p * (1 - lr * wd)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g^2
    p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

Dtypes, SKUs and the shared checks: gpuplan/ops/optimizer/common.py. Host: cache-sized blocks over
the host threads (gpuplan.host_pool), each by gpuplan.ops.optimizer.adamw_host.
"""

from __future__ import annotations

import bisect
import itertools
import math
from operator import attrgetter
from types import SimpleNamespace
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.host_pool import for_blocks
from gpuplan.nvrtc import cdiv, launch
from gpuplan.ops.optimizer.adamw_host import adamw_host
from gpuplan.ops.optimizer.common import (
    DTYPE_FIELDS,
    MODULE,
    THREADS,
    FusedStepPlan,
    check_disjoint,
    check_real,
    first_overlap,
    flat_operands,
    grad_dtype,
    lowp_dtype,
    lowp_present,
    raise_overlap,
)
from gpuplan.resolve import Resolved
from gpuplan.spec import REQUIRED, Extent, In, InOut, OpSpec, Out, Scalar, Shape
from gpuplan.stream import Stream, Workspace, upload

__all__ = [
    "AdamWDescriptor", "AdamWArgs", "AdamWPlan",
    "AdamWMultiTensorDescriptor", "AdamWMultiTensorArgs", "AdamWMultiTensorPlan",
]
__functional__ = ["adamw_step", "adamw_hyper"]

#: elements per block of the multi-tensor kernel
MULTI_TENSOR_CHUNK = 16384

# Declared ranges, checked on every call before anything is written (a NaN lr, beta 1.0).
HYPER = (Scalar("lr", REQUIRED, "real", lo=0.0), Scalar("step", REQUIRED, "int", lo=1),
         Scalar("beta1", 0.9, "real", lo=0.0, hi=1.0, hi_open=True),
         Scalar("beta2", 0.999, "real", lo=0.0, hi=1.0, hi_open=True),
         Scalar("eps", 1e-8, "real", lo=0.0), Scalar("weight_decay", 1e-2, "real", lo=0.0))
# None, or a device array of HYPER_SIZE values (adamw_hyper) the kernel reads the step's
# factors from instead of HYPER's: a captured graph keeps reading it at every replay, so a
# schedule refreshes it before each one.
HYPER_BUFFER = Scalar("hyper", None)
#: the step's factors, in the kernels' order: (decay, beta1, 1-beta1, beta2, 1-beta2,
#: step_size, 1/sqrt(bc2), eps)
HYPER_SIZE = 8


def adamw_scalars(op: str, args: Any, dtype: np.dtype) -> tuple:
    """(decay, beta1, 1-beta1, beta2, 1-beta2, step_size, 1/sqrt(bc2), eps) as `dtype`, from
    the args' run-time hyperparameters (checked here: floats in range and an int step take
    one comparison chain, anything else the precise checks)."""
    lr, b1, b2, eps, wd, t = (args.lr, args.beta1, args.beta2, args.eps, args.weight_decay,
                              args.step)
    if not (type(lr) is type(b1) is type(b2) is type(eps) is type(wd) is float
            and type(t) is int and 0.0 <= lr < _INF and 0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0
            and 0.0 <= eps < _INF and 0.0 <= wd < _INF and t >= 1):
        lr, b1, b2, eps, wd, t = _checked_hyper(op, args)
    bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
    vals = (1.0 - lr * wd, b1, 1.0 - b1, b2, 1.0 - b2, lr / bc1, 1.0 / math.sqrt(bc2), eps)
    return tuple(map(dtype.type, vals))


_INF = math.inf


def adamw_hyper(dtype: Any, *, lr: float, step: int, beta1: float = 0.9, beta2: float = 0.999,
                eps: float = 1e-8, weight_decay: float = 1e-2) -> np.ndarray:
    """The HYPER_SIZE factors of one AdamW step as a host array of `dtype` (the weights'):
    what an AdamW plan computes from these arguments, for a ``hyper`` device buffer."""
    args = SimpleNamespace(lr=lr, step=step, beta1=beta1, beta2=beta2, eps=eps,
                           weight_decay=weight_decay)
    dt = np.dtype(dtype)
    return np.array(adamw_scalars("adamw_hyper", args, dt), dtype=dt)


def check_hyper_buffer(plan: Any, hyper: Any) -> Any:
    """The kernels' `hyper` argument: the checked device buffer, or a null pointer."""
    if hyper is None:
        return _NULL
    d = plan._dtype
    ok = getattr(hyper, "shape", None) == (HYPER_SIZE,) and hyper.dtype == d and \
        hyper.flags.c_contiguous and backend.device_of(hyper) == plan.stream.kind
    if not ok:
        given = (f"shape {getattr(hyper, 'shape', None)} {getattr(hyper, 'dtype', None)} on "
                 f"{backend.device_of(hyper)}") if hasattr(hyper, "dtype") else repr(hyper)
        raise InvalidProblem(describe(plan.op, "hyper", f"None or a contiguous ({HYPER_SIZE},) "
                                      f"{d} array on the plan's device ({plan.stream.kind})",
                                      given))
    return hyper


_NULL = np.uint64(0)


def _checked_hyper(op: str, args: Any) -> tuple:
    t = args.step
    hyper = (check_real(op, "lr", args.lr, 0.0),
             check_real(op, "beta1", args.beta1, 0.0, 1.0, hi_open=True),
             check_real(op, "beta2", args.beta2, 0.0, 1.0, hi_open=True),
             check_real(op, "eps", args.eps, 0.0),
             check_real(op, "weight_decay", args.weight_decay, 0.0))
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
        raise InvalidProblem(describe(op, "step", "an integer >= 1", repr(t)))
    return (*hyper, int(t))


# -- one tensor ------------------------------------------------------------------------------

SPEC = OpSpec(
    "adamw_step",
    fields=(Extent("n"), *DTYPE_FIELDS),
    operands=(InOut("param", ("n",), distinct=True), In("grad", ("n",), dtype=grad_dtype),
              InOut("exp_avg", ("n",), distinct=("grad", "exp_avg_sq")),
              InOut("exp_avg_sq", ("n",), distinct=("grad",)),
              Out("param_lowp", ("n",), dtype=lowp_dtype, present=lowp_present)),
    scalars=(*HYPER, HYPER_BUFFER),
    empty=("n",),
)
AdamWDescriptor = SPEC.descriptor(
    "AdamWDescriptor", "AdamW over n weights of dtype (f32/f64), gradients of grad_dtype "
    "(None: dtype), an f16/bf16 copy of the weights when lowp_dtype is set.")
AdamWArgs = SPEC.args(
    "AdamWArgs", "param, exp_avg, exp_avg_sq [n] updated in place; grad [n]; param_lowp [n] "
    "(overwritten) or None; lr, step (from 1), beta1, beta2, eps, weight_decay per call; "
    "hyper: None or a device array of the step's factors read instead (adamw_hyper).")


class AdamWPlan(FusedStepPlan):
    """One fused AdamW step over one flat tensor (SKUs: ``numpy``, ``fused``: one launch)."""

    op = "adamw_step"
    spec = SPEC
    kernel = "adamw_step_kernel"

    def _check_args(self, args: Any) -> None:
        self._scalars = adamw_scalars(self.op, args, self._dtype)
        self._hyper = check_hyper_buffer(self, args.hyper)

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        p, g, m, v, low, s = (args.param, args.grad, args.exp_avg, args.exp_avg_sq,
                              args.param_lowp, _host_scalars(self))
        for_blocks(self.desc.n, lambda lo, hi: adamw_host(
            p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], None if low is None else low[lo:hi], s))

    def _run_fused(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = MODULE.function(self._kernel, stream.device_id)
        lowp = args.param if args.param_lowp is None else args.param_lowp  # unread when None
        launch(stream, fn, self._grid, THREADS,
               (args.param, args.grad, args.exp_avg, args.exp_avg_sq, lowp, self._n)
               + self._scalars + (self._write_lowp, self._hyper))


def _host_scalars(plan: Any) -> tuple:
    """The factors the host SKU uses: from the hyper buffer when one is given."""
    if plan._hyper is _NULL:
        return plan._scalars
    return tuple(plan._dtype.type(v) for v in plan._hyper)


# -- many tensors in one launch --------------------------------------------------------------

_LISTS = ("params", "grads", "exp_avgs", "exp_avg_sqs", "params_lowp")
MULTI_SPEC = OpSpec(
    "adamw_multi_tensor_step",
    fields=(Shape("sizes"), *DTYPE_FIELDS),
    # The operands are lists of flat arrays, one per size: the spec's operands are single
    # arrays, so the lists ride with the run-time scalars and AdamWMultiTensorPlan checks
    # them against a signature resolved once per plan.
    operands=(),
    scalars=(*(Scalar(name, REQUIRED) for name in _LISTS[:4]), *HYPER,
             Scalar("params_lowp", None), HYPER_BUFFER),
    empty=lambda d: not any(d.sizes),
)
AdamWMultiTensorDescriptor = MULTI_SPEC.descriptor(
    "AdamWMultiTensorDescriptor", "AdamW over len(sizes) flat tensors of these sizes sharing "
    "dtypes and hyperparameters (fields as AdamWDescriptor).")
AdamWMultiTensorArgs = MULTI_SPEC.args(
    "AdamWMultiTensorArgs", "params, grads, exp_avgs, exp_avg_sqs: one flat array per size "
    "(as AdamWArgs per tensor); params_lowp: a list when lowp_dtype is set, else None.")

#: per array: (class, shape, strides, dtype): one tuple comparison per list checks them all.
_SIGNATURE = attrgetter("__class__", "shape", "strides", "dtype")
#: host and emulated arrays the step writes must be writable (CuPy arrays always are).
_SIGNATURE_WRITTEN = attrgetter("__class__", "shape", "strides", "dtype", "flags.writeable")
_SIGNATURE_CUDA = attrgetter("__class__", "shape", "strides", "dtype", "data.device_id")
_PTR = attrgetter("data.ptr")


class AdamWMultiTensorPlan(FusedStepPlan):
    """AdamW over a list of tensors sharing dtypes and hyperparameters.

    The ``fused`` SKU makes one launch: a table of (n, param, grad, exp_avg, exp_avg_sq,
    lowp) addresses per tensor and a (tensor, start) row per block of MULTI_TENSOR_CHUNK
    elements, both written into the workspace; each element gets exactly AdamWPlan's math.
    The per-call check is one signature comparison per list (class, shape, strides, dtype,
    device of every array, resolved at select), then one overlap test of all the buffers.
    """

    op = "adamw_multi_tensor_step"
    spec = MULTI_SPEC
    kernel = "adamw_multi_tensor_kernel"

    @classmethod
    def _chunk_count(cls, desc: Any) -> int:
        return sum(cdiv(int(s), MULTI_TENSOR_CHUNK) for s in desc.sizes)

    @classmethod
    def _workspace_bytes(cls, desc: Any) -> int:
        return 8 * (6 * len(desc.sizes) + 2 * cls._chunk_count(desc))

    def _prepare(self) -> None:
        super()._prepare()
        d = self.desc
        sizes = tuple(int(s) for s in d.sizes)
        t, nchunks = len(sizes), self._chunk_count(d)
        has_lowp = d.lowp_dtype is not None
        self._names = _LISTS if has_lowp else _LISTS[:4]
        self._dtypes = (d.dtype, grad_dtype(d), d.dtype, d.dtype, lowp_dtype(d))
        cuda = self._stream.kind == "cuda"
        array_type = backend._namespace_for(self._stream.kind).ndarray
        self._getters = tuple(
            _SIGNATURE_CUDA if cuda else _SIGNATURE if name == "grads" else _SIGNATURE_WRITTEN
            for name in self._names)
        self._signatures = tuple(
            tuple((array_type, (n,), (np.dtype(dt).itemsize,), np.dtype(dt),
                   *((self._stream.device_id,) if cuda else () if name == "grads" else (True,)))
                  for n in sizes)
            for name, dt in zip(self._names, self._dtypes, strict=False))
        self._sizes, self._chunks = sizes, nchunks
        self._offsets = [0, *itertools.accumulate(sizes)]  # of each tensor in the concatenation
        # Per call only the addresses change: the element counts and the chunk rows of the
        # launch table are written once.
        self._table = np.zeros(6 * t + 2 * nchunks, dtype=np.int64)
        tensors = self._table[: 6 * t].reshape(t, 6)
        chunks = self._table[6 * t:].reshape(nchunks, 2)
        tensors[:, 0] = sizes
        per = [cdiv(n, MULTI_TENSOR_CHUNK) for n in sizes]
        chunks[:, 0] = np.repeat(np.arange(t, dtype=np.int64), per)
        chunks[:, 1] = np.concatenate(
            [np.arange(c, dtype=np.int64) for c in per] or [np.zeros(0, np.int64)]
        ) * MULTI_TENSOR_CHUNK
        itemsizes = np.array([np.dtype(x).itemsize for x in self._dtypes[:len(self._names)]])
        self._itemsizes = np.repeat(itemsizes, t)
        self._nbytes = (itemsizes[:, None] * np.array(sizes, dtype=np.int64)).reshape(-1)
        self._live = np.tile(np.array(sizes) > 0, len(self._names))
        self._ptrs: np.ndarray | None = None

    def _lists(self, args: Any) -> tuple:
        return tuple(getattr(args, name) for name in self._names)

    def _check_args(self, args: Any) -> None:
        if self.desc.lowp_dtype is None and args.params_lowp is not None:
            raise InvalidProblem(describe(self.op, "params_lowp",
                                          "None (the descriptor's lowp_dtype is None)",
                                          type(args.params_lowp).__name__))
        lists = self._lists(args)
        t = len(self._sizes)
        for name, seq, sig, get in zip(self._names, lists, self._signatures, self._getters,
                                       strict=True):
            try:
                ok = type(seq) in (list, tuple) and len(seq) == t and tuple(map(get, seq)) == sig
            except AttributeError:  # None or not an array
                ok = False
            if not ok:
                self._explain(name, seq)
        flat = [a for seq in lists for a in seq]
        if not self._stream.is_host:  # the addresses are needed for the launch table anyway
            self._ptrs = ptrs = np.fromiter(map(_PTR, flat), np.int64, len(flat))
            live = self._live
            if (ptrs[live] % self._itemsizes[live]).any():  # a misaligned view: say which
                for name, seq in zip(self._names, lists, strict=True):
                    self._explain(name, seq)
            pair = first_overlap(ptrs[live], ptrs[live] + self._nbytes[live])
            if pair is not None:
                idx = np.flatnonzero(live)
                raise_overlap(self.op, self._label(int(idx[pair[0]])),
                              self._label(int(idx[pair[1]])))
        else:
            check_disjoint(self.op, flat, self._label)
        self._scalars = adamw_scalars(self.op, args, self._dtype)
        self._hyper = check_hyper_buffer(self, args.hyper)

    def _label(self, k: int) -> str:
        t = len(self._sizes)
        return f"{self._names[k // t]}[{k % t}]"

    def _explain(self, name: str, seq: Any) -> None:
        """The precise error for list `name` (whose signature or alignment did not match),
        from a spec of its arrays; returns when every array is acceptable after all."""
        t = len(self._sizes)
        if not isinstance(seq, (list, tuple)) or len(seq) != t:
            given = f"{len(seq)} arrays" if isinstance(seq, (list, tuple)) else repr(seq)
            raise InvalidProblem(describe(self.op, name, f"a list of {t} arrays", given))
        dtype = self._dtypes[_LISTS.index(name)]
        labels = [f"{name}[{k}]" for k in range(t)]
        role = In if name == "grads" else InOut  # the step writes every other list
        one = OpSpec(self.op, fields=(), operands=[
            role(label, (n,), dtype=(dtype,)) for label, n in zip(labels, self._sizes,
                                                                   strict=True)])
        Resolved(self.op, one, None).check(SimpleNamespace(**dict(zip(labels, seq, strict=True))),
                                         self._stream)

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        # Blocks of the tensors' concatenation, over the host threads (elementwise: any
        # split gives the same bits).
        lowps = args.params_lowp or (None,) * len(self._sizes)
        tensors = list(zip(args.params, args.grads, args.exp_avgs, args.exp_avg_sqs, lowps,
                           strict=True))
        offsets = self._offsets
        scalars = _host_scalars(self)

        def block(lo: int, hi: int) -> None:
            k = bisect.bisect_right(offsets, lo) - 1
            while lo < hi:
                end = min(hi, offsets[k + 1])
                if end > lo:
                    a, b = lo - offsets[k], end - offsets[k]
                    p, g, m, v, low = tensors[k]
                    adamw_host(p[a:b], g[a:b], m[a:b], v[a:b],
                                 None if low is None else low[a:b], scalars)
                lo, k = end, k + 1

        for_blocks(offsets[-1], block)

    def _run_fused(self, stream: Stream, ws: Workspace, args: Any) -> None:
        lists = self._lists(args)
        t = len(self._sizes)
        host = self._table
        host[: 6 * t].reshape(t, 6)[:, 1:1 + len(lists)] = self._ptrs.reshape(len(lists), t).T
        table = ws.view(np.int64, host.size)
        # Ordered on the stream after earlier launches that read this workspace; returns once
        # the pageable host table has been staged (or snapshotted, while a graph captures),
        # so `host` may be rewritten by the next call.
        upload(stream, table, host)
        fn = MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, self._chunks, THREADS,
               (table[: 6 * t], table[6 * t:], np.int64(MULTI_TENSOR_CHUNK)) + self._scalars
               + (self._write_lowp, self._hyper), reachable=[a for seq in lists for a in seq])


# -- functional API ------------------------------------------------------------------------


def adamw_step(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, *, lr: float,
               beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
               param_lowp: Any = None, hyper: Any = None) -> None:
    """One AdamW step in place on param, exp_avg, exp_avg_sq (and param_lowp if given); every
    array has param's shape (in-place ones C-contiguous). `hyper`: see AdamWArgs."""
    p, g, m, v, low = flat_operands(AdamWPlan.op, param, (
        ("grad", grad, False), ("exp_avg", exp_avg, True), ("exp_avg_sq", exp_avg_sq, True),
        ("param_lowp", param_lowp, True)))
    desc = AdamWDescriptor(p.size, p.dtype, g.dtype, None if low is None else low.dtype)
    call(AdamWPlan, desc, like=p, param=p, grad=g, exp_avg=m, exp_avg_sq=v, param_lowp=low,
         lr=lr, step=step, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
         hyper=hyper)
