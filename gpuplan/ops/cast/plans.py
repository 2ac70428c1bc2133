"""Dtype casts: y = x.astype(out_dtype) between f32, f64, f16, bf16, int32 and int64.

Floats round to nearest even, once: the host SKU rounds f64 and integers to odd in f32
before bf16 (ml_dtypes' astype would round twice), the kernel converts int64 to bf16 with
__ll2bfloat16_rn. Float to int truncates toward zero; NaN or out-of-range float to int is
unspecified.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, as_dtype, bfloat16, cuda_name, float64, int32, int64
from gpuplan.dtypes import short_name as sn
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.plan import BackendKind, Candidate, Plan
from gpuplan.spec import DType, Extent, In, OpSpec, Out
from gpuplan.stream import Stream, Workspace

__all__ = ["CastDescriptor", "CastArgs", "CastPlan"]
__functional__ = ["cast"]

CAST_DTYPES = FLOAT_DTYPES + (int32, int64)
_MAX_GRID = 1 << 18

_MODULE = CudaModule(
    __file__, "cast.cu",
    [f"cast<{cuda_name(s)}, {cuda_name(d)}>" for s in CAST_DTYPES for d in CAST_DTYPES],
)

SPEC = OpSpec("cast", fields=(Extent("numel"),
                              DType("dtype", CAST_DTYPES, default=np.float32),
                              DType("out_dtype", CAST_DTYPES, default=np.float32)),
              operands=(In("x", ("numel",)), Out("y", ("numel",), dtype="out_dtype")))
CastDescriptor = SPEC.descriptor(
    "CastDescriptor", "y[numel] = x[numel] converted from dtype to out_dtype (round to nearest "
                      "even; float to int truncates toward zero; NaN/out-of-range float to "
                      "int is unspecified).")
CastArgs = SPEC.args("CastArgs", "x [numel] of dtype, y [numel] of out_dtype.")


class CastPlan(Plan):
    """dtype conversion between f32, f64, f16, bf16, int32 and int64 (16-byte packs)."""

    op = "cast"
    category = "elementwise"
    spec = SPEC

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        s, t = as_dtype(desc.dtype), as_dtype(desc.out_dtype)
        wide = s if s.itemsize >= t.itemsize else t
        if stream.is_host:
            return [Candidate("numpy", BackendKind.NUMPY, True, True, sn(t), sn(wide))]
        return [Candidate("map", BackendKind.NVRTC, True, True, sn(t), sn(wide))]

    def _prepare(self) -> None:
        d = self.desc
        s, t = as_dtype(d.dtype), as_dtype(d.out_dtype)
        self._out = t
        self._round_odd = t == bfloat16 and s in (float64, int32, int64)
        pack = 16 // max(s.itemsize, t.itemsize)
        self._align = (pack * s.itemsize, pack * t.itemsize)
        self._grid = max(1, min(cdiv(cdiv(d.numel, pack), 256), _MAX_GRID))
        self._kernel = f"cast<{cuda_name(s)}, {cuda_name(t)}>"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        with np.errstate(invalid="ignore", over="ignore"):
            if self._round_odd:
                args.y[...] = _round_odd_to_f32(args.x).astype(bfloat16)
            else:
                args.y[...] = args.x.astype(self._out)

    def _run_map(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        vec = args.x.data.ptr % self._align[0] == 0 and args.y.data.ptr % self._align[1] == 0
        launch(stream, fn, self._grid, 256,
               (args.x, args.y, np.int64(self.desc.numel), np.int32(vec)))


def _round_odd_to_f32(x: np.ndarray) -> np.ndarray:
    """x (f64 or integers) in f32 rounded to odd: truncated, then the last bit set when
    inexact. Rounding that to bfloat16 (8 bits) gives x rounded once to nearest even, which
    a direct astype does not (ml_dtypes goes through a round-to-nearest f32: two roundings)."""
    if x.dtype.kind in "iu":
        exact = x.astype(np.float64)
        back = np.where(np.abs(exact) >= 2.0**63, np.iinfo(np.int64).max,
                        exact).astype(np.int64)
        away = np.where(x >= 0, back > x, back < x)
        exact = np.where(away, np.nextafter(exact, 0.0), exact)
        exact = np.where(back != x, _set_last_bit(exact, np.uint64), exact)
    else:
        exact = x.astype(np.float64, copy=False)
    f = exact.astype(np.float32)
    wide = f.astype(np.float64)
    f = np.where(np.isfinite(exact) & (np.abs(wide) > np.abs(exact)), np.nextafter(f, 0), f)
    f = np.where(np.isfinite(exact) & (f.astype(np.float64) != exact),
                 _set_last_bit(f, np.uint32), f)
    return f.astype(np.float32)


def _set_last_bit(a: np.ndarray, uint: type) -> np.ndarray:
    return (np.asarray(a).view(uint) | uint(1)).view(a.dtype)


# -- functional API ------------------------------------------------------------------------


def cast(x: Any, dtype: Any) -> Any:
    """y = x converted to `dtype` (same shape)."""
    flat = backend.ascontiguous(x).reshape(-1)
    y = call(CastPlan, CastDescriptor(flat.size, x.dtype, as_dtype(dtype)), like=x, x=flat)
    return y.reshape(x.shape)
