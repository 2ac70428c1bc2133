"""Gradient clipping by the global L2 norm: every gradient of a model in one call.

    norm = sqrt(sum_i sum_j g_i[j]^2)     (GlobalNormPlan's math and chunked sums: the bits
                                           of gpuplan.functional.global_l2_norm)
    coef = max_norm / (norm + eps)        (float64, as Python computes it)
    g_i *= coef for every i when coef < 1 (each element exactly as unary("scale", g_i, coef))

PyTorch's clip_grad_norm_ semantics: nothing changes when coef >= 1, and a NaN or inf norm
scales every gradient by NaN or 0 (PyTorch's clamp propagates them likewise). ``total_norm``
(a run argument) supplies a norm computed elsewhere, e.g. summed over the ranks of a
model-parallel group: the norm is then not computed, ``out`` holds total_norm, and only the
scaling runs (one launch for all gradients; none when coef >= 1).

On a GPU the ``chunked`` SKU launches reduction.cu's global_l2_norm and then clip_grad.cu's
clip_grad_scale over one table of the gradients' addresses; the scale kernel reads the norm
where the first left it (no host round trip). Deterministic and bit-stable.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan.dtypes import accumulator, cuda_name, short_name
from gpuplan.errors import GraphCaptureError, InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, launch
from gpuplan.ops.optimizer.common import check_disjoint
from gpuplan.ops.reduction.launch import NORM_CHUNK, NORM_DTYPES
from gpuplan.ops.reduction.plans import GlobalNormPlan, _norm_dtype
from gpuplan.spec import OpSpec, Out, Scalar, Value
from gpuplan.stream import Stream, Workspace, upload

__all__ = ["ClipGradNormDescriptor", "ClipGradNormArgs", "ClipGradNormPlan"]
__functional__ = ["clip_grad_norm_"]

_MODULE = CudaModule(
    __file__, "clip_grad.cu", ["clip_grad_scale<float>", "clip_grad_scale<double>"],
    options=(f"-DGPUPLAN_NORM_CHUNK={NORM_CHUNK}",),
    enums={"NormType": tuple(short_name(d) for d in NORM_DTYPES)},
)

SPEC = OpSpec(
    "clip_grad_norm",
    fields=(Value("sizes"), Value("dtypes")),
    # `arrays`, a list of any length scaled in place, is beyond an operand declaration: it
    # rides with the run arguments and is checked by GlobalNormPlan._check_args (and for
    # writability and overlaps here).
    operands=(Out("out", (), dtype=_norm_dtype),),
    # max_norm: checked in _check_args (>= 0, inf allowed: no clipping, as in PyTorch; NaN
    # would silently turn every gradient into NaN); total_norm may be non-finite (propagates).
    scalars=(Scalar("arrays"), Scalar("max_norm"), Scalar("eps", 1e-6, "real", lo=0.0),
             Scalar("total_norm", None)),
    empty=lambda desc: False,  # no tensor (or only empty ones): out is still written
)
ClipGradNormDescriptor = SPEC.descriptor(
    "ClipGradNormDescriptor", "Clip len(sizes) tensors (sizes[i] elements of dtypes[i]) by "
    "their global L2 norm; out (the norm) is f32, or f64 if any tensor is.")
ClipGradNormDescriptor.out_dtype = _norm_dtype

ClipGradNormArgs = SPEC.args(
    "ClipGradNormArgs", "out: 0-d array of desc.out_dtype(), the norm; arrays: the gradients, "
    "len(sizes) C-contiguous writable arrays (arrays[i].size == sizes[i], dtype dtypes[i]) "
    "scaled in place; max_norm, eps: reals; total_norm: None (compute the norm) or a real.")


def _real(op: str, name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise InvalidProblem(describe(op, name, "a real number", repr(v)))
    return float(v)


class ClipGradNormPlan(GlobalNormPlan):
    """GlobalNormPlan's norm, then every gradient scaled by max_norm / (norm + eps) when
    that is below 1 (see the module docstring). SKUs: ``numpy`` on the host; ``chunked`` on
    a GPU (two launches, one table)."""

    op = "clip_grad_norm"
    spec = SPEC

    def _prepare(self) -> None:
        super()._prepare()
        self._scale_kernel = f"clip_grad_scale<{cuda_name(self._out)}>"

    def _check_args(self, args: Any) -> None:
        super()._check_args(args)  # the list: length, then each array's side, dtype, size
        arrays = args.arrays
        if self._stream.kind != "cuda":  # host and emulated arrays may be read-only
            for i, a in enumerate(arrays):
                if not a.flags.writeable:
                    raise InvalidProblem(describe(self.op, f"arrays[{i}]", "a writable array "
                                                  "(scaled in place)", "a read-only array"))
        check_disjoint(self.op, arrays, lambda k: f"arrays[{k}]")
        max_norm, eps = _real(self.op, "max_norm", args.max_norm), _real(self.op, "eps",
                                                                          args.eps)
        if not max_norm >= 0.0:  # NaN or negative
            raise InvalidProblem(describe(self.op, "max_norm", "a number >= 0 (inf: no "
                                          "clipping)", repr(args.max_norm)))
        total = None if args.total_norm is None else _real(self.op, "total_norm",
                                                          args.total_norm)
        if total is not None and self._stream.capturing is not None:
            raise GraphCaptureError(f"{self.op}: total_norm={total!r} is a host value a graph "
                                    f"would replay unchanged; capture the norm on the device "
                                    f"(total_norm=None) instead")
        self._call = (max_norm, eps, total)

    def _coef(self, norm: float) -> float:
        max_norm, eps, _ = self._call
        return max_norm / (norm + eps)

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        total = self._call[2]
        if total is None:
            super()._run_numpy(stream, ws, args)  # out = the norm
            total = float(args.out)
        else:
            args.out[...] = total
        coef = self._coef(total)
        if coef >= 1.0:
            return
        with np.errstate(invalid="ignore", over="ignore"):  # inf * 0: NaN, as on a GPU
            for a in args.arrays:
                acc = accumulator(a.dtype)
                if acc == a.dtype:
                    a *= acc.type(coef)
                else:
                    a[...] = acc.type(coef) * a.astype(acc)

    def _run_chunked(self, stream: Stream, ws: Workspace, args: Any) -> None:
        total = self._call[2]
        n = len(self._sizes)
        if total is None:
            super()._run_chunked(stream, ws, args)  # the table into ws, then out = the norm
            given, use_given = 0.0, 0
        else:
            upload(stream, args.out, np.array(total, dtype=self._out))
            if self._coef(total) >= 1.0:
                return
            table = self._table.copy()
            table[:n] = [a.data.ptr for a in args.arrays]
            upload(stream, ws.view(np.int64, table.size, 0), table)
            given, use_given = total, 1
        max_norm, eps, _ = self._call
        launch(stream, _MODULE.function(self._scale_kernel, stream.device_id), self._grid, 256,
               (ws.view(np.int64, self._table.size, 0), np.int32(n), args.out,
                np.float64(max_norm), np.float64(eps), np.float64(given), np.int32(use_given)),
               reachable=args.arrays)


# -- functional API ------------------------------------------------------------------------


def clip_grad_norm_(arrays: list, max_norm: float, eps: float = 1e-6,
                    total_norm: float | None = None) -> Any:
    """Scale every array in place by max_norm / (norm + eps) when that is below 1; returns
    the norm (0-d, f32 or f64 if any array is; total_norm when given, which skips computing
    it). The arrays must be C-contiguous (scaled in place), on one device."""
    arrays = tuple(arrays)
    if not arrays:
        return np.zeros((), dtype=np.float32)
    desc = ClipGradNormDescriptor(tuple(a.size for a in arrays), tuple(a.dtype for a in arrays))
    return call(ClipGradNormPlan, desc, like=arrays[0], arrays=arrays, max_norm=max_norm,
                eps=eps, total_norm=total_norm)
