"""Per-token symmetric int8 quantization, dequantization and their straight-through backwards.

Quantize, x [N, D] float -> q [N, D] int8, scale [N] float32, computing in C = f32 (f64 for
f64 input):
    amax_n = max_d |x[n, d]|          (NaN ignored; 0 for D == 0)
    s_n    = amax_n / 127 in C;  scale[n] = f32(s_n), or 0 when s_n < FLT_MIN
    q[n,d] = clamp(rint(x[n, d] / C(scale[n])), -127, 127)   (round half to even, one IEEE
             division; NaN -> 0; every q of a row with scale 0 is 0)
Dequantize: y[n, d] = dtype(C(scale[n]) * q[n, d]).
Dequantize backward: d_input[n, d] = dtype(C(scale[n]) * C(d_output[n, d])).
Quantize backward (straight-through): d_x = d_q, converted to x's dtype through f32 when the
dtypes differ (d_q's dtype is taken from the array).
In f32 arithmetic every operand and result below FLT_MIN in magnitude is a zero of the same
sign (flush to zero, as the CUDA kernels are compiled), so host and device agree bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, as_dtype, cuda_name, float32, float64, int8
from gpuplan.dtypes import short_name as _short
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.plan import BackendKind, Candidate, Plan
from gpuplan.spec import DType, Extent, In, OpSpec, Out
from gpuplan.stream import Stream, Workspace

__all__ = [
    "QuantizePerTokenDescriptor",
    "QuantizePerTokenArgs",
    "QuantizePerTokenPlan",
    "QuantizePerTokenBackwardDescriptor",
    "QuantizePerTokenBackwardArgs",
    "QuantizePerTokenBackwardPlan",
    "DequantizePerTokenDescriptor",
    "DequantizePerTokenArgs",
    "DequantizePerTokenPlan",
    "DequantizePerTokenBackwardDescriptor",
    "DequantizePerTokenBackwardArgs",
    "DequantizePerTokenBackwardPlan",
]
__functional__ = [
    "quantize_per_token",
    "quantize_per_token_backward",
    "dequantize_per_token",
    "dequantize_per_token_backward",
]

FLT_MIN = np.float32(np.finfo(np.float32).tiny)
QMAX = 127

_MODULE = CudaModule(
    __file__,
    "quantize.cu",
    [f"quantize_per_token<{cuda_name(t)}>" for t in FLOAT_DTYPES]
    + [f"dequantize_per_token<{cuda_name(t)}>" for t in FLOAT_DTYPES]
    + [f"dequantize_per_token_backward<{cuda_name(t)}>" for t in FLOAT_DTYPES]
    + [f"quantize_per_token_backward_convert<{cuda_name(a)}, {cuda_name(b)}>"
       for a in FLOAT_DTYPES for b in FLOAT_DTYPES if a != b],
)

_MAX_GRID = 65535 * 8


def _compute_dtype(dtype: Any) -> np.dtype:
    """C: float64 for f64, float32 for f32/f16/bf16."""
    return float64 if as_dtype(dtype) == float64 else float32


# -- host arithmetic shared by the NumPy SKUs (mirrors quantize.cu) ----------------------------


def ftz32(a: np.ndarray) -> np.ndarray:
    """Flush f32 subnormals to a zero of the same sign (what the f32 kernels do)."""
    a = np.asarray(a, dtype=np.float32)
    return np.where(np.abs(a) < FLT_MIN, np.copysign(np.float32(0), a), a)


def _to_compute(a: np.ndarray, c: np.dtype) -> np.ndarray:
    return a.astype(np.float64) if c == float64 else ftz32(a.astype(np.float32))


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The NumPy SKU's arithmetic on a host [N, D] array: returns (q int8, scale f32)."""
    c = _compute_dtype(x.dtype)
    xc = _to_compute(x, c)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        amax = np.fmax.reduce(np.abs(xc), axis=1, initial=c.type(0))
        s = amax / c.type(QMAX)
        scale = np.where(s < FLT_MIN, 0, s).astype(np.float32)
        r = np.rint(xc / scale.astype(c)[:, None])
        r = np.where(np.isnan(r), 0, np.clip(r, -QMAX, QMAX))
        r = np.where(scale[:, None] > 0, r, 0)
    return r.astype(np.int8), scale


def _scaled(scale: np.ndarray, v: np.ndarray, out_dtype: Any) -> np.ndarray:
    """dtype(C(scale[n]) * v[n, d]) with v already in C."""
    s = ftz32(scale)
    if v.dtype == np.float64:
        return (s.astype(np.float64)[:, None] * v).astype(out_dtype)
    with np.errstate(over="ignore"):
        return ftz32(s[:, None] * v).astype(out_dtype)


def _convert_through_f32(a: np.ndarray, out_dtype: Any) -> np.ndarray:
    return ftz32(a.astype(np.float32)).astype(out_dtype)


# -- declarations ------------------------------------------------------------------------------

_ND = ("n", "d")
_FIELDS = (Extent("n"), Extent("d"), DType("dtype", FLOAT_DTYPES, default=np.float32))

QUANTIZE = OpSpec(
    "quantize_per_token", fields=_FIELDS,
    operands=(In("x", _ND), Out("q", _ND, int8), Out("scale", ("n",), float32,
                                                     distinct=("x", "q"))),
    empty=("n",),  # D == 0 still writes scale = 0 for every row
)
QUANTIZE_BACKWARD = OpSpec(
    "quantize_per_token_backward", fields=_FIELDS,
    operands=(In("d_q", _ND, FLOAT_DTYPES), Out("d_x", _ND)),
)
DEQUANTIZE = OpSpec(
    "dequantize_per_token", fields=_FIELDS,
    operands=(In("q", _ND, int8), In("scale", ("n",), float32), Out("y", _ND)),
)
DEQUANTIZE_BACKWARD = OpSpec(
    "dequantize_per_token_backward", fields=_FIELDS,
    operands=(In("scale", ("n",), float32), In("d_output", _ND), Out("d_input", _ND)),
)

#: quantize and its backward share the descriptor: dtype is that of x (and of d_x).
QuantizePerTokenDescriptor = QUANTIZE.descriptor(
    "QuantizePerTokenDescriptor", "x [n, d] of dtype quantized per row (the backward: d_x "
                                  "[n, d] of dtype from d_q [n, d] of any float dtype).")
QuantizePerTokenBackwardDescriptor = QuantizePerTokenDescriptor
QUANTIZE_BACKWARD.descriptor_cls = QuantizePerTokenDescriptor
QuantizePerTokenArgs = QUANTIZE.args(
    "QuantizePerTokenArgs", "x [n, d]; q [n, d] int8 and scale [n] f32, written.")
QuantizePerTokenBackwardArgs = QUANTIZE_BACKWARD.args(
    "QuantizePerTokenBackwardArgs", "d_q [n, d] (any float dtype); d_x [n, d], written.")

#: dequantize and its backward share the descriptor: dtype is that of y (and of its gradient).
DequantizePerTokenDescriptor = DEQUANTIZE.descriptor(
    "DequantizePerTokenDescriptor", "y [n, d] of dtype from q [n, d] int8 and scale [n] "
                                    "f32 (the backward: d_output and d_input of dtype).")
DequantizePerTokenBackwardDescriptor = DequantizePerTokenDescriptor
DEQUANTIZE_BACKWARD.descriptor_cls = DequantizePerTokenDescriptor
DequantizePerTokenArgs = DEQUANTIZE.args(
    "DequantizePerTokenArgs", "q [n, d] int8, scale [n] f32; y [n, d], written.")
DequantizePerTokenBackwardArgs = DEQUANTIZE_BACKWARD.args(
    "DequantizePerTokenBackwardArgs", "scale [n] f32, d_output [n, d]; d_input [n, d], "
                                      "written.")


# -- plans -------------------------------------------------------------------------------------


class _PerTokenPlan(Plan):
    """One SKU per side: the NumPy body, or `kernel` (``row``: one CUDA block per row, the
    spec's operands then n and d as its parameters). One rounding per element and an exact
    max: deterministic and bit-stable everywhere."""

    category = "quantize"
    kernel = ""

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        c = _short(_compute_dtype(desc.dtype))
        if stream.is_host:
            return [Candidate("numpy", BackendKind.NUMPY, True, True, c, c)]
        return [Candidate("row", BackendKind.NVRTC, True, True, c, c)]

    def _prepare(self) -> None:
        d = self.desc
        self._dtype = as_dtype(d.dtype)
        self._compute = _compute_dtype(d.dtype)
        self._kernel = f"{self.kernel}<{cuda_name(d.dtype)}>"
        # One block per row (grid-stride past _MAX_GRID); a multiple of 32 threads (block_max
        # needs whole warps), at most 256.
        self._launch_dims = (int(min(d.n, _MAX_GRID)), int(min(256, max(32, cdiv(d.d, 32) * 32))))
        self._extents = (np.int64(d.n), np.int64(d.d))

    def _run_row(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, *self._launch_dims, self._operands(args) + self._extents)


class QuantizePerTokenPlan(_PerTokenPlan):
    """x [N, D] -> q [N, D] int8 and scale [N] f32 (module docstring). One CUDA block per row."""

    op = "quantize_per_token"
    spec = QUANTIZE
    kernel = "quantize_per_token"

    @staticmethod
    def _operands(args: Any) -> tuple:
        return (args.x, args.q, args.scale)

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        args.q[...], args.scale[...] = quantize_rows(args.x)


class QuantizePerTokenBackwardPlan(_PerTokenPlan):
    """Straight-through estimator: d_x = d_q, a copy, or a conversion through f32 when d_q's
    dtype differs (``copy`` on a GPU does both: it picks the convert kernel per call)."""

    op = "quantize_per_token_backward"
    spec = QUANTIZE_BACKWARD

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        # A copy or one rounding per element: deterministic and bit-stable.
        d = _short(desc.dtype)
        kind = BackendKind.NUMPY if stream.is_host else BackendKind.NVRTC
        return [Candidate("numpy" if stream.is_host else "copy", kind, True, True, d, d)]

    def _prepare(self) -> None:
        d = self.desc
        self._dtype = as_dtype(d.dtype)
        total = d.n * d.d
        self._total = np.int64(total)
        self._grid = int(max(1, min(cdiv(total, 256), _MAX_GRID)))
        self._convert = {g: f"quantize_per_token_backward_convert<{cuda_name(g)}, "
                            f"{cuda_name(d.dtype)}>"
                         for g in FLOAT_DTYPES if g != self._dtype}

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        if args.d_q.dtype == self._dtype:
            args.d_x[...] = args.d_q
        else:
            args.d_x[...] = _convert_through_f32(args.d_q, self._dtype)

    def _run_copy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        kernel = self._convert.get(args.d_q.dtype)
        if kernel is None:  # same dtype
            backend.copy_into(args.d_x, args.d_q, stream.cuda_stream)
            return
        fn = _MODULE.function(kernel, stream.device_id)
        launch(stream, fn, self._grid, 256, (args.d_q, args.d_x, self._total))


class DequantizePerTokenPlan(_PerTokenPlan):
    """y[n, d] = dtype(C(scale[n]) * q[n, d]), C = f32 (f64 for an f64 y)."""

    op = "dequantize_per_token"
    spec = DEQUANTIZE
    kernel = "dequantize_per_token"

    @staticmethod
    def _operands(args: Any) -> tuple:
        return (args.q, args.scale, args.y)

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        args.y[...] = _scaled(args.scale, args.q.astype(self._compute), self._dtype)


class DequantizePerTokenBackwardPlan(_PerTokenPlan):
    """d_input[n, d] = dtype(C(scale[n]) * C(d_output[n, d])): deterministic and bit-stable."""

    op = "dequantize_per_token_backward"
    spec = DEQUANTIZE_BACKWARD
    kernel = "dequantize_per_token_backward"

    @staticmethod
    def _operands(args: Any) -> tuple:
        return (args.scale, args.d_output, args.d_input)

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        args.d_input[...] = _scaled(args.scale, _to_compute(args.d_output, self._compute),
                                    self._dtype)


# -- functional API ----------------------------------------------------------------------------


def _rank2(op: str, name: str, a: Any) -> Any:
    """`a` made C-contiguous; InvalidProblem unless it is [N, D] (the descriptor's shape)."""
    if a.ndim != 2:
        raise InvalidProblem(describe(op, name, "a rank-2 array [N, D]", f"shape {a.shape}"))
    return backend.ascontiguous(a)


def quantize_per_token(x: Any) -> tuple[Any, Any]:
    """x [N, D] -> (q int8 [N, D], scale f32 [N]) with scale = max|x_n| / 127."""
    x = _rank2("quantize_per_token", "x", x)
    return call(QuantizePerTokenPlan, QuantizePerTokenDescriptor(*x.shape, x.dtype), like=x,
                x=x)


def quantize_per_token_backward(d_q: Any, dtype: Any = None) -> Any:
    """Straight-through: d_x = d_q [N, D], in `dtype` (default d_q's dtype)."""
    d_q = _rank2("quantize_per_token_backward", "d_q", d_q)
    desc = QuantizePerTokenDescriptor(*d_q.shape, d_q.dtype if dtype is None else dtype)
    return call(QuantizePerTokenBackwardPlan, desc, like=d_q, d_q=d_q)


def dequantize_per_token(q: Any, scale: Any, dtype: Any) -> Any:
    """y [N, D] = scale[n] * q[n, d] in `dtype` (computed in f32, f64 for f64)."""
    q = _rank2("dequantize_per_token", "q", q)
    return call(DequantizePerTokenPlan, DequantizePerTokenDescriptor(*q.shape, dtype), like=q,
                q=q, scale=backend.ascontiguous(scale))


def dequantize_per_token_backward(scale: Any, d_output: Any) -> Any:
    """d_input [N, D] = scale[n] * d_output[n, d], in d_output's dtype."""
    g = _rank2("dequantize_per_token_backward", "d_output", d_output)
    return call(DequantizePerTokenBackwardPlan, DequantizePerTokenDescriptor(*g.shape, g.dtype),
                like=g, scale=backend.ascontiguous(scale), d_output=g)
