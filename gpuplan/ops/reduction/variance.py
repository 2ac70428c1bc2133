"""Variance and standard deviation over axes, two passes (mean, then squared deviations) in
the accumulator dtype: y = sum((x - mean)^2) / max(0, n - correction), std its square root.
The order of combination depends on the problem alone: deterministic, bit-stable."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name
from gpuplan.dtypes import short_name as sn
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, launch
from gpuplan.ops.reduction.launch import normalize_axes, reduce_layout, thread_per_output_grid
from gpuplan.plan import BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import DType, Flag, In, OpSpec, Out, Real, Shape, Value
from gpuplan.stream import Stream, Workspace

__all__ = ["VarianceDescriptor", "VarianceArgs", "VariancePlan"]
__functional__ = ["variance"]

_MAX_DIMS = 8
_DTYPE = DType("dtype", FLOAT_DTYPES, default=np.float32)

MODULE = CudaModule(
    __file__, "variance.cu",
    [f"variance_general<{cuda_name(t)}, {std}>" for t in FLOAT_DTYPES for std in (0, 1)])


def _var_axes(desc: Any) -> tuple[int, ...]:
    return normalize_axes("variance", tuple(desc.shape), desc.axes)


def _var_out_shape(desc: Any) -> tuple[int, ...]:
    axes = _var_axes(desc)
    if desc.keepdims:
        return tuple(1 if i in axes else int(e) for i, e in enumerate(desc.shape))
    return tuple(int(e) for i, e in enumerate(desc.shape) if i not in axes)


VARIANCE = OpSpec(
    "variance",
    fields=(Shape("shape"), Value("axes", default=None), Flag("keepdims", default=False),
            Real("correction", lo=0.0, default=1.0), Flag("std", default=False), _DTYPE),
    operands=(In("x", lambda d: tuple(d.shape)), Out("y", _var_out_shape)),
)
VarianceDescriptor = VARIANCE.descriptor(
    "VarianceDescriptor", "y = sum((x - mean)^2) / max(0, n - correction) over axes (n "
    "elements each); with std, its square root. axes/keepdims as in ReduceDescriptor.")
VarianceDescriptor.out_shape = _var_out_shape
VarianceArgs = VARIANCE.args("VarianceArgs", "x [shape], y [desc.out_shape()].")


def _general_dims(shape: tuple, axes: tuple) -> tuple[tuple, tuple, int]:
    """(extents, element strides, number of kept dims) of x viewed as kept dims then reduced
    dims, neighbours of the same kind merged (reduce_layout's merge)."""
    lay = reduce_layout(shape, frozenset(axes))
    if lay.kind == "general":
        return lay.dims
    if lay.kind == "rows":
        rows, cols = lay.dims
        return (rows, cols), (cols, 1), 1
    outer, r, inner = lay.dims
    return (outer, inner, r), (r * inner, 1, inner), 2


class VariancePlan(Plan):
    """Two-pass variance (mean, then squared deviations) in the accumulator dtype; GPU SKU
    ``general``: a thread per output over a strided view of any axes (long reductions with
    few outputs use few threads: correct, not fast). Deterministic and bit-stable."""

    op = "variance"
    category = "reduction"
    spec = VARIANCE

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        _var_axes(desc)

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        d = as_dtype(desc.dtype)
        if stream.is_host:
            return [host_candidate(d)]
        return [Candidate("general", BackendKind.NVRTC, True, True, sn(d), sn(accumulator(d)))]

    def _prepare(self) -> None:
        d = self.desc
        shape = tuple(int(e) for e in d.shape)
        self._axes = _var_axes(d)
        self._acc = accumulator(d.dtype)
        n_out = math.prod(e for i, e in enumerate(shape) if i not in self._axes)
        n_red = math.prod(shape[a] for a in self._axes)
        self._kernel = f"variance_general<{cuda_name(d.dtype)}, {int(bool(d.std))}>"
        if n_out == 0 or n_red == 0:
            self._params = None  # nothing to read: the host path fills NaN (0 / 0)
            return
        ext, strides, nk = _general_dims(shape, self._axes)
        pad = _MAX_DIMS - len(ext)
        self._grid = thread_per_output_grid(n_out)
        self._params = (np.int64(n_out), np.int64(n_red), np.int32(nk), np.int32(len(ext) - nk),
                        *(np.int64(e) for e in ext + (1,) * pad),
                        *(np.int64(s) for s in strides + (0,) * pad),
                        self._acc.type(d.correction))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        acc, axes = self._acc, self._axes
        x = args.x.astype(acc, copy=False)
        n = math.prod(x.shape[a] for a in axes)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.sum(x, axis=axes, keepdims=True, dtype=acc) / acc.type(n)
            sq = np.sum((x - mean) ** 2, axis=axes, keepdims=self.desc.keepdims, dtype=acc)
            v = sq / acc.type(max(0.0, n - self.desc.correction))
            if self.desc.std:
                v = np.sqrt(v)
        args.y[...] = np.asarray(v).astype(self.desc.dtype)

    def _run_general(self, stream: Stream, ws: Workspace, args: Any) -> None:
        if self._params is None:
            args.y[...] = np.nan  # variance of nothing: 0 / 0, as torch
            return
        launch(stream, MODULE.function(self._kernel, stream.device_id), self._grid, 256,
               (args.x, args.y, *self._params))


# -- functional API ----------------------------------------------------------------------


def variance(x: Any, axes: Any = None, keepdims: bool = False, correction: float = 1.0,
             std: bool = False) -> Any:
    """Variance (std: standard deviation) over `axes` with `correction` (1: unbiased)."""
    if isinstance(axes, list):
        axes = tuple(axes)
    desc = VarianceDescriptor(x.shape, axes, keepdims, float(correction), bool(std), x.dtype)
    return call(VariancePlan, desc, like=x, x=backend.ascontiguous(x))
