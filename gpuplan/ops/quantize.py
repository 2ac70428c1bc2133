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
dtypes differ.
In f32 arithmetic every operand and result below FLT_MIN in magnitude is a zero of the same
sign (flush to zero, as the CUDA kernels are compiled), so host and device agree bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, as_dtype, cuda_name, float32, float64, int8
from gpuplan.dtypes import short_name as _short
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import execute
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.plan import (
    BackendKind,
    Candidate,
    Plan,
    check_dtype,
    check_operand,
    check_writable_distinct,
)
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


def _row_threads(d: int) -> int:
    """Threads per row block: a multiple of 32 (block_max needs whole warps), at most 256."""
    return int(min(256, max(32, cdiv(d, 32) * 32)))


def _row_grid(n: int) -> int:
    return int(min(n, _MAX_GRID))


def _compute_dtype(dtype: Any) -> np.dtype:
    """C: float64 for f64, float32 for f32/f16/bf16."""
    return float64 if as_dtype(dtype) == float64 else float32


def _candidates_for(op: str, dtype: Any, on_device: bool, variant: str) -> list[Candidate]:
    d = check_dtype(op, "dtype", dtype, FLOAT_DTYPES)
    c = _short(_compute_dtype(d))
    # One rounding per element and an exact max: deterministic and bit-stable everywhere.
    if not on_device:
        return [Candidate("numpy", BackendKind.NUMPY, True, True, c, c)]
    return [Candidate(variant, BackendKind.NVRTC, True, True, c, c)]


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


# -- quantize ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuantizePerTokenDescriptor:
    n: int
    d: int
    dtype: Any = np.float32


@dataclass(frozen=True)
class QuantizePerTokenArgs:
    x: Any      # [n, d] float
    q: Any      # [n, d] int8, written
    scale: Any  # [n] float32, written


class QuantizePerTokenPlan(Plan):
    """x [N, D] -> q [N, D] int8 and scale [N] f32 (module docstring). One CUDA block per row."""

    op = "quantize_per_token"
    category = "quantize"

    @classmethod
    def _candidates(cls, desc: QuantizePerTokenDescriptor, on_device: bool) -> list[Candidate]:
        return _candidates_for(cls.op, desc.dtype, on_device, "row")

    def _check_args(self, args: QuantizePerTokenArgs) -> None:
        d = self.desc
        check_operand(self.op, "x", args.x, (d.n, d.d), d.dtype)
        check_operand(self.op, "q", args.q, (d.n, d.d), int8)
        check_operand(self.op, "scale", args.scale, (d.n,), float32)
        check_writable_distinct(self.op, {"q": args.q, "scale": args.scale}, {"x": args.x})
        check_writable_distinct(self.op, {"scale": args.scale}, {"q": args.q})

    def _is_empty(self) -> bool:
        return self.desc.n == 0  # D == 0 still writes scale = 0 for every row

    def _run_numpy(self, stream: Stream, ws: Workspace, args: QuantizePerTokenArgs) -> None:
        q, scale = quantize_rows(args.x)
        args.q[...] = q
        args.scale[...] = scale

    def _run_row(self, stream: Stream, ws: Workspace, args: QuantizePerTokenArgs) -> None:
        d = self.desc
        fn = _MODULE.function(f"quantize_per_token<{cuda_name(d.dtype)}>", stream.device_id)
        launch(stream, fn, _row_grid(d.n), _row_threads(d.d),
               (args.x, args.q, args.scale, np.int64(d.n), np.int64(d.d)))


@dataclass(frozen=True)
class QuantizePerTokenBackwardDescriptor:
    n: int
    d: int
    dtype: Any = np.float32        # dtype of d_x (the forward input x)
    grad_dtype: Any = None         # dtype of d_q; None: the same as dtype


@dataclass(frozen=True)
class QuantizePerTokenBackwardArgs:
    d_q: Any  # [n, d] float (grad_dtype)
    d_x: Any  # [n, d] float (dtype), written


class QuantizePerTokenBackwardPlan(Plan):
    """Straight-through estimator: d_x = d_q (a copy, or a conversion through f32)."""

    op = "quantize_per_token_backward"
    category = "quantize"

    @classmethod
    def _candidates(cls, desc: QuantizePerTokenBackwardDescriptor,
                    on_device: bool) -> list[Candidate]:
        d = check_dtype(cls.op, "dtype", desc.dtype, FLOAT_DTYPES)
        g = check_dtype(cls.op, "grad_dtype", _grad_dtype(desc), FLOAT_DTYPES)
        name = _short(d) if g == d else "f32"
        backend_kind = BackendKind.NVRTC if on_device else BackendKind.NUMPY
        variant = ("copy" if g == d else "convert") if on_device else "numpy"
        # A copy or one rounding per element: deterministic and bit-stable.
        return [Candidate(variant, backend_kind, True, True, name, name)]

    def _check_args(self, args: QuantizePerTokenBackwardArgs) -> None:
        d = self.desc
        check_operand(self.op, "d_q", args.d_q, (d.n, d.d), _grad_dtype(d))
        check_operand(self.op, "d_x", args.d_x, (d.n, d.d), d.dtype)
        check_writable_distinct(self.op, {"d_x": args.d_x}, {"d_q": args.d_q})

    def _is_empty(self) -> bool:
        return self.desc.n == 0 or self.desc.d == 0

    def _run_numpy(self, stream: Stream, ws: Workspace,
                   args: QuantizePerTokenBackwardArgs) -> None:
        if args.d_q.dtype == args.d_x.dtype:
            args.d_x[...] = args.d_q
        else:
            args.d_x[...] = _convert_through_f32(args.d_q, args.d_x.dtype)

    def _run_copy(self, stream: Stream, ws: Workspace,
                  args: QuantizePerTokenBackwardArgs) -> None:
        backend.copy_into(args.d_x, args.d_q, stream.cuda_stream)

    def _run_convert(self, stream: Stream, ws: Workspace,
                     args: QuantizePerTokenBackwardArgs) -> None:
        d = self.desc
        total = d.n * d.d
        fn = _MODULE.function(
            f"quantize_per_token_backward_convert<{cuda_name(_grad_dtype(d))}, "
            f"{cuda_name(d.dtype)}>", stream.device_id)
        launch(stream, fn, int(min(cdiv(total, 256), _MAX_GRID)), 256,
               (args.d_q, args.d_x, np.int64(total)))


def _grad_dtype(desc: QuantizePerTokenBackwardDescriptor) -> Any:
    return desc.dtype if desc.grad_dtype is None else desc.grad_dtype


# -- dequantize --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DequantizePerTokenDescriptor:
    n: int
    d: int
    dtype: Any = np.float32  # dtype of y


@dataclass(frozen=True)
class DequantizePerTokenArgs:
    q: Any      # [n, d] int8
    scale: Any  # [n] float32
    y: Any      # [n, d] float (dtype), written


class DequantizePerTokenPlan(Plan):
    """y[n, d] = dtype(C(scale[n]) * q[n, d]), C = f32 (f64 for an f64 y)."""

    op = "dequantize_per_token"
    category = "quantize"

    @classmethod
    def _candidates(cls, desc: DequantizePerTokenDescriptor, on_device: bool) -> list[Candidate]:
        return _candidates_for(cls.op, desc.dtype, on_device, "row")

    def _check_args(self, args: DequantizePerTokenArgs) -> None:
        d = self.desc
        check_operand(self.op, "q", args.q, (d.n, d.d), int8)
        check_operand(self.op, "scale", args.scale, (d.n,), float32)
        check_operand(self.op, "y", args.y, (d.n, d.d), d.dtype)
        check_writable_distinct(self.op, {"y": args.y}, {"q": args.q, "scale": args.scale})

    def _is_empty(self) -> bool:
        return self.desc.n == 0 or self.desc.d == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: DequantizePerTokenArgs) -> None:
        c = _compute_dtype(self.desc.dtype)
        args.y[...] = _scaled(args.scale, args.q.astype(c), self.desc.dtype)

    def _run_row(self, stream: Stream, ws: Workspace, args: DequantizePerTokenArgs) -> None:
        d = self.desc
        fn = _MODULE.function(f"dequantize_per_token<{cuda_name(d.dtype)}>", stream.device_id)
        launch(stream, fn, _row_grid(d.n), _row_threads(d.d),
               (args.q, args.scale, args.y, np.int64(d.n), np.int64(d.d)))


@dataclass(frozen=True)
class DequantizePerTokenBackwardDescriptor:
    n: int
    d: int
    dtype: Any = np.float32  # dtype of d_output and d_input


@dataclass(frozen=True)
class DequantizePerTokenBackwardArgs:
    scale: Any     # [n] float32
    d_output: Any  # [n, d] float (dtype)
    d_input: Any   # [n, d] float (dtype), written


class DequantizePerTokenBackwardPlan(Plan):
    """d_input[n, d] = dtype(C(scale[n]) * C(d_output[n, d])): deterministic and bit-stable."""

    op = "dequantize_per_token_backward"
    category = "quantize"

    @classmethod
    def _candidates(cls, desc: DequantizePerTokenBackwardDescriptor,
                    on_device: bool) -> list[Candidate]:
        return _candidates_for(cls.op, desc.dtype, on_device, "row")

    def _check_args(self, args: DequantizePerTokenBackwardArgs) -> None:
        d = self.desc
        check_operand(self.op, "scale", args.scale, (d.n,), float32)
        check_operand(self.op, "d_output", args.d_output, (d.n, d.d), d.dtype)
        check_operand(self.op, "d_input", args.d_input, (d.n, d.d), d.dtype)
        check_writable_distinct(self.op, {"d_input": args.d_input},
                                {"scale": args.scale, "d_output": args.d_output})

    def _is_empty(self) -> bool:
        return self.desc.n == 0 or self.desc.d == 0

    def _run_numpy(self, stream: Stream, ws: Workspace,
                   args: DequantizePerTokenBackwardArgs) -> None:
        c = _compute_dtype(self.desc.dtype)
        args.d_input[...] = _scaled(args.scale, _to_compute(args.d_output, c), self.desc.dtype)

    def _run_row(self, stream: Stream, ws: Workspace,
                 args: DequantizePerTokenBackwardArgs) -> None:
        d = self.desc
        fn = _MODULE.function(f"dequantize_per_token_backward<{cuda_name(d.dtype)}>",
                              stream.device_id)
        launch(stream, fn, _row_grid(d.n), _row_threads(d.d),
               (args.scale, args.d_output, args.d_input, np.int64(d.n), np.int64(d.d)))


# -- functional API ----------------------------------------------------------------------------


def _rank2(op: str, name: str, a: Any) -> tuple[int, int]:
    if getattr(a, "ndim", None) != 2:
        raise InvalidProblem(describe(op, name, "a rank-2 array [N, D]",
                                      f"shape {tuple(getattr(a, 'shape', ()))}"))
    return int(a.shape[0]), int(a.shape[1])


def quantize_per_token(x: Any) -> tuple[Any, Any]:
    """x [N, D] -> (q int8 [N, D], scale f32 [N]) with scale = max|x_n| / 127."""
    n, d = _rank2("quantize_per_token", "x", x)
    x = backend.ascontiguous(x)
    xp = backend.array_namespace(x)
    q = xp.empty((n, d), dtype=np.int8)
    scale = xp.empty((n,), dtype=np.float32)
    desc = QuantizePerTokenDescriptor(n, d, as_dtype(x.dtype))
    execute(QuantizePerTokenPlan, desc, QuantizePerTokenArgs(x, q, scale), like=x)
    return q, scale


def quantize_per_token_backward(d_q: Any, dtype: Any = None) -> Any:
    """Straight-through: d_x = d_q [N, D], in `dtype` (default d_q's dtype)."""
    n, d = _rank2("quantize_per_token_backward", "d_q", d_q)
    d_q = backend.ascontiguous(d_q)
    out_dtype = as_dtype(d_q.dtype if dtype is None else dtype)
    d_x = backend.array_namespace(d_q).empty((n, d), dtype=out_dtype)
    desc = QuantizePerTokenBackwardDescriptor(n, d, out_dtype, as_dtype(d_q.dtype))
    execute(QuantizePerTokenBackwardPlan, desc, QuantizePerTokenBackwardArgs(d_q, d_x), like=d_q)
    return d_x


def dequantize_per_token(q: Any, scale: Any, dtype: Any) -> Any:
    """y [N, D] = scale[n] * q[n, d] in `dtype` (computed in f32, f64 for f64)."""
    n, d = _rank2("dequantize_per_token", "q", q)
    q = backend.ascontiguous(q)
    scale = backend.ascontiguous(scale)
    y = backend.array_namespace(q).empty((n, d), dtype=as_dtype(dtype))
    desc = DequantizePerTokenDescriptor(n, d, as_dtype(dtype))
    execute(DequantizePerTokenPlan, desc, DequantizePerTokenArgs(q, scale, y), like=q)
    return y


def dequantize_per_token_backward(scale: Any, d_output: Any) -> Any:
    """d_input [N, D] = scale[n] * d_output[n, d], in d_output's dtype."""
    n, d = _rank2("dequantize_per_token_backward", "d_output", d_output)
    d_output = backend.ascontiguous(d_output)
    scale = backend.ascontiguous(scale)
    d_input = backend.array_namespace(d_output).empty((n, d), dtype=d_output.dtype)
    desc = DequantizePerTokenBackwardDescriptor(n, d, as_dtype(d_output.dtype))
    execute(DequantizePerTokenBackwardPlan, desc,
            DequantizePerTokenBackwardArgs(scale, d_output, d_input), like=d_output)
    return d_input
