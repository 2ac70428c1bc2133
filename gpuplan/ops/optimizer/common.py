"""Fused, in-place optimizer steps (PyTorch semantics) over master weights: what AdamW
(adamw.py) and SGD (sgd.py) share: optimizer.cu, the dtype fields and rules, the SKU list,
the run-time scalar and buffer-overlap checks.

Weights and moments are f32 (or f64, for gradient checks); gradients f32/f16/bf16 (f64 with
f64 weights) and are read in the weights' precision. All arrays are flat [n] (the functional
API flattens). Hyperparameters (lr, step, betas, eps, weight decay, momentum, dampening,
nesterov, first_step) are run-time scalars on the args, so a schedule never selects a new
plan; the factors derived from them are computed once per call in float64 and rounded to the
weights' dtype. When `param_lowp` (f16/bf16) is given it receives the updated weights rounded
to nearest even, for a low-precision forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, is_
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import (
    FLOAT_DTYPES,
    HALF_DTYPES,
    as_dtype,
    bfloat16,
    cuda_name,
    float16,
    float32,
    float64,
)
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, Unsupported, describe
from gpuplan.nvrtc import CudaModule, cdiv
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import DType
from gpuplan.stream import Stream

#: (param dtype, grad dtype) pairs with a kernel; every pair is instantiated for both lowp types.
PAIRS = [(float32, float32), (float32, float16), (float32, bfloat16), (float64, float64)]
GRAD_DTYPES = {float32: (float32, float16, bfloat16), float64: (float64,)}


def _instances(kernel: str) -> list[str]:
    return [f"{kernel}<{cuda_name(p)}, {cuda_name(g)}, {cuda_name(low)}>" for p, g in PAIRS
            for low in HALF_DTYPES]


MODULE = CudaModule(
    __file__,
    "optimizer.cu",
    _instances("adamw_step_kernel") + _instances("adamw_multi_tensor_kernel")
    + _instances("sgd_step_kernel"),
)
THREADS = 256
MAX_BLOCKS = 16384


# -- the declaration shared by every optimizer family ------------------------------------------


@dataclass(frozen=True)
class OptionalDType(DType):
    """A dtype from `allowed`, or None."""

    def check(self, op: str, value: Any) -> None:
        if value is not None:
            super().check(op, value)


#: dtype: weights and moments; grad_dtype: None means dtype (f32 weights also take f16/bf16
#: gradients); lowp_dtype: f16/bf16 when param_lowp is written, else None.
DTYPE_FIELDS = (DType("dtype", (float32, float64), default=float32),
                OptionalDType("grad_dtype", FLOAT_DTYPES, default=None),
                OptionalDType("lowp_dtype", HALF_DTYPES, default=None))


def grad_dtype(desc: Any) -> Any:
    """The gradients' dtype rule: grad_dtype, or the weights' dtype when None."""
    return desc.dtype if desc.grad_dtype is None else desc.grad_dtype


def lowp_dtype(desc: Any) -> Any:
    """The low-precision copy's dtype rule (any placeholder when there is no copy)."""
    return desc.lowp_dtype or bfloat16


def lowp_present(desc: Any) -> bool | None:
    """param_lowp is required with a lowp_dtype and must be None without one."""
    return None if desc.lowp_dtype is not None else False


class FusedStepPlan(Plan):
    """Base of the optimizer families: descriptor rule, SKUs, kernel name, launch grid.

    Subclasses set ``op``, ``spec`` and ``kernel`` (the optimizer.cu template name)."""

    category = "optimizer"
    kernel = ""

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        p = as_dtype(desc.dtype)
        g = as_dtype(grad_dtype(desc))
        if g not in GRAD_DTYPES[p]:
            names = ", ".join(sn(x) for x in GRAD_DTYPES[p])
            raise Unsupported(describe(cls.op, "grad_dtype", f"dtype in ({names}) for "
                                                             f"{sn(p)} weights", sn(g)))

    @classmethod
    def _workspace_bytes(cls, desc: Any) -> int:
        return 0

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        p = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(p)]
        # Elementwise with fixed constants: no reduction, so the bits do not depend on the
        # launch.
        return [Candidate("fused", BackendKind.NVRTC, True, True, sn(p), sn(p),
                          cls._workspace_bytes(desc))]

    def _prepare(self) -> None:
        d = self.desc
        self._dtype = as_dtype(d.dtype)
        self._write_lowp = np.int32(d.lowp_dtype is not None)
        self._kernel = (f"{self.kernel}<{cuda_name(d.dtype)}, {cuda_name(grad_dtype(d))}, "
                        f"{cuda_name(lowp_dtype(d))}>")
        n = getattr(d, "n", 0)
        self._grid = min(cdiv(n, THREADS), MAX_BLOCKS)
        self._n = np.int64(n)


# -- run-time checks ---------------------------------------------------------------------------


def check_real(op: str, name: str, v: Any, lo: float, hi: float = math.inf,
               hi_open: bool = False) -> float:
    """`v` as a float, InvalidProblem unless it is a finite real in [lo, hi] (or [lo, hi))."""
    ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    if ok:
        f = float(v)
        ok = math.isfinite(f) and lo <= f and (f < hi if hi_open else f <= hi)
    if not ok:
        rng = f"[{lo}, {hi})" if hi_open else f"[{lo}, {hi}]"
        raise InvalidProblem(describe(op, name, f"a finite number in {rng}", repr(v)))
    return f


_BASE = attrgetter("base")
_OWNS = attrgetter("flags.owndata")


def _distinct_owners(arrays: Sequence[np.ndarray]) -> bool:
    """True when every array owns its memory or is a view of an array that does, and no two
    share that owner (then they cannot overlap); False when unsure (deeper views, foreign
    buffers). A few C-level passes, no address read."""
    owners = [a if b is None else b for a, b in zip(arrays, map(_BASE, arrays), strict=True)]
    try:
        if not (all(map(is_, map(_BASE, owners), repeat(None))) and all(map(_OWNS, owners))):
            return False
    except AttributeError:  # an owner that is not an ndarray (a foreign buffer)
        return False
    return len(set(map(id, owners))) == len(owners)


def check_disjoint(op: str, arrays: Sequence[Any], label: Callable[[int], str]) -> None:
    """InvalidProblem naming two overlapping buffers among `arrays` (contiguous, None and
    empty ones skipped; `label(k)` names array k): every one but the gradients is written,
    and a shared buffer would be updated twice. NumPy arrays with distinct owning
    allocations pass without reading an address."""
    live = [k for k, a in enumerate(arrays) if a is not None and a.size]
    if not live:
        return
    if isinstance(arrays[live[0]], np.ndarray) and _distinct_owners([arrays[k] for k in live]):
        return
    starts = np.array([backend.data_ptr(arrays[k]) for k in live], dtype=np.int64)
    ends = starts + np.array([arrays[k].nbytes for k in live], dtype=np.int64)
    pair = first_overlap(starts, ends)
    if pair is not None:
        raise_overlap(op, label(live[pair[0]]), label(live[pair[1]]))


def first_overlap(starts: np.ndarray, ends: np.ndarray) -> tuple[int, int] | None:
    """(i, j) with span j starting inside span i, or None when the [start, end) spans are
    pairwise disjoint (one sort, no Python loop over the spans)."""
    if starts.size < 2:
        return None
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    hit = np.flatnonzero(s[1:] < reach[:-1])
    if not hit.size:
        return None
    j = int(hit[0]) + 1
    i = int(np.argmax(e[:j] > s[j]))
    return int(order[i]), int(order[j])


def raise_overlap(op: str, first: str, second: str) -> None:
    raise InvalidProblem(describe(op, second, f"a buffer distinct from '{first}'",
                                  "an overlapping buffer"))


# -- functional helpers ------------------------------------------------------------------------


def flat_operands(op: str, param: Any, others: Sequence[tuple[str, Any, bool]]) -> list[Any]:
    """Flat views of `param` and of each (name, array or None, in_place) in `others`, which
    must have param's shape. In-place operands must be C-contiguous (a flattened copy would
    lose the update); the others are made contiguous. The plan checks dtypes, devices and
    overlaps of the flat arrays."""
    shape = param.shape
    out = [_flat(op, "param", param, shape, True)]
    for name, a, in_place in others:
        out.append(None if a is None else _flat(op, name, a, shape, in_place))
    return out


def _flat(op: str, name: str, a: Any, shape: tuple, in_place: bool) -> Any:
    if getattr(a, "shape", None) != shape:
        if not hasattr(a, "shape"):
            raise InvalidProblem(describe(op, name, "an array", type(a).__name__))
        from gpuplan.errors import BufferTooSmall
        need = math.prod(shape)
        if a.size < need:
            raise BufferTooSmall(describe(op, name, f"at least {need} elements (shape "
                                                    f"{tuple(shape)})",
                                          f"{a.size} (shape {tuple(a.shape)})"))
        raise InvalidProblem(describe(op, name, f"shape {tuple(shape)}",
                                      f"shape {tuple(a.shape)}"))
    if not a.flags.c_contiguous:
        if in_place:
            raise InvalidProblem(describe(op, name, "a C-contiguous array (updated in place)",
                                          "a strided view"))
        a = backend.ascontiguous(a)
    return a if a.ndim == 1 else a.reshape(-1)
