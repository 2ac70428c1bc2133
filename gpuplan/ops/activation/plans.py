"""Activations: y = f(x) and dx = dy * f'(x) over flat arrays.

Every activation is one row of `ACTIVATIONS`: its name (the CUDA enumerator is the name
upper-cased, passed to activation.cu as -DGPUPLAN_ENUM_Activation), its NumPy forward and
backward math, and which run-time scalars it takes: ``alpha`` ('scale': y = alpha * x), or
the optional bounds ``alpha`` (min) and ``beta`` (max) of 'clamp' (None: unbounded). Scalars
are run arguments, never descriptor fields: a new bound reuses the plan. Adding an activation
is one row here plus its two branches in gpuplan_activation.cuh (the CUDA math, shared with
the GEMM epilogue: gpuplan.ops.gemm.sku.EPILOGUES).

NaN and edge values follow PyTorch: log(0) = -inf, log/sqrt/rsqrt of a negative number is
NaN, clamp keeps NaN and gives `max` everywhere when min > max (min(max(x, lo), hi)); its
gradient passes where lo <= x <= hi. abs'(x) is sign(x), 0 at 0 (and at NaN).

Math runs in f32 for f16/bf16 and in the dtype itself for f32/f64. On the host every
activation is split over the thread budget (gpuplan.host_pool; elementwise, so the result does
not depend on the split). GELU's host math is gpuplan.ops.activation.host: float64 with erf to
float64 accuracy; float32 (and f16/bf16) by the compiled one-pass kernels of
gpuplan.host_kernels when numba is there (gpuplan.host_jit), else by float32 NumPy passes over
cache-sized blocks; no float64 erf in either direction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name
from gpuplan.errors import InvalidProblem, describe
from gpuplan.execute import call
from gpuplan.host_pool import for_blocks
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.ops.activation import host as gelu_host
from gpuplan.ops.activation.host import run_blocks32 as _run_blocks32
from gpuplan.plan import Candidate, Plan, elementwise_candidates
from gpuplan.spec import Choice, DType, Extent, In, OpSpec, Out, Scalar
from gpuplan.stream import Stream, Workspace

__all__ = [
    "UnaryDescriptor", "UnaryArgs", "UnaryPlan",
    "UnaryBackwardDescriptor", "UnaryBackwardArgs", "UnaryBackwardPlan",
]
__functional__ = ["unary", "unary_backward"]

_SQRT_2_OVER_PI = 0.79788456080286535588


def _gelu_tanh(x, alpha):
    t = x.dtype.type
    return t(0.5) * x * (t(1) + np.tanh(t(_SQRT_2_OVER_PI) * (x + t(0.044715) * x**3)))


def _gelu_tanh_grad(x, dy, alpha):
    t = x.dtype.type
    k, c = t(_SQRT_2_OVER_PI), t(0.044715)
    th = np.tanh(k * (x + c * x**3))
    dt = k * (t(1) + t(3) * c * x * x)
    return dy * (t(0.5) * (t(1) + th) + t(0.5) * x * (t(1) - th * th) * dt)


def _silu_grad(x, dy, alpha):
    t = x.dtype.type
    s = t(1) / (t(1) + np.exp(-x))
    return dy * s * (t(1) + x * (t(1) - s))


def _sigmoid(x, alpha):
    t = x.dtype.type
    return t(1) / (t(1) + np.exp(-x))


def _rsqrt_grad(x, dy, alpha):
    r = np.reciprocal(np.sqrt(x))
    return x.dtype.type(-0.5) * dy * r * r * r


def _bounds(x, scalars):
    t = x.dtype.type
    lo, hi = scalars
    return t(-np.inf if lo is None else lo), t(np.inf if hi is None else hi)


def _clamp(x, scalars):
    lo, hi = _bounds(x, scalars)
    return np.minimum(np.maximum(x, lo), hi)  # both propagate NaN; lo > hi gives hi


def _clamp_grad(x, dy, scalars):
    lo, hi = _bounds(x, scalars)
    return np.where((x >= lo) & (x <= hi), dy, x.dtype.type(0))


@dataclass(frozen=True)
class Activation:
    """One activation: name, host forward (x, alpha) and backward (x, dy, alpha) math on
    arrays in the accumulator dtype, and whether the op takes the run-time ``alpha`` (or
    the bounds alpha, beta).
    Optionally its float32 math on one cache-sized block, written into the last array
    given, with two float32 scratch arrays: forward32(x, y, s1, s2) and
    backward32(x, dy, dx, s1, s2); the host plans use them for every dtype but f64."""

    name: str
    forward: Callable[[np.ndarray, Any], np.ndarray]
    backward: Callable[[np.ndarray, np.ndarray, Any], np.ndarray]
    alpha: bool = False
    #: takes the optional bounds alpha (min) and beta (max); the host math then gets the
    #: pair (alpha, beta) as its scalar argument.
    bounds: bool = False
    forward32: Callable[..., None] | None = None
    backward32: Callable[..., None] | None = None
    #: float32 gradient from the forward's output as well: backward_y32(x, dy, y, dx, s1,
    #: s2), used by the host plan for f32 operands when `y` is given (cheaper math).
    backward_y32: Callable[..., None] | None = None
    #: p += bias, y = f(p) on float32 [rows, n] blocks: bias_forward32(p, bias or None, y)
    #: (the host GEMM epilogue; without it, the bias add and then forward32).
    bias_forward32: Callable[..., None] | None = None
    #: The compiled kernels' name (gpuplan.host_jit): f"{jit}_forward"(x, y),
    #: f"{jit}_backward"(x, dy, dx) and f"{jit}_backward_y"(x, dy, y, dx), run by the
    #: host plans on float32 operands, when loaded, in place of the block functions.
    jit: str | None = None


ACTIVATIONS: tuple[Activation, ...] = (
    Activation("relu", lambda x, a: np.where((x > 0) | np.isnan(x), x, x.dtype.type(0)),
               lambda x, dy, a: np.where(x > 0, dy, x.dtype.type(0))),
    Activation("gelu", gelu_host.gelu, gelu_host.gelu_grad, forward32=gelu_host.gelu_f32,
               backward32=gelu_host.gelu_grad_f32, backward_y32=gelu_host.gelu_grad_y32,
               bias_forward32=gelu_host.bias_gelu_f32, jit="gelu"),
    Activation("gelu_tanh", _gelu_tanh, _gelu_tanh_grad),
    Activation("silu", lambda x, a: x / (x.dtype.type(1) + np.exp(-x)), _silu_grad),
    Activation("tanh", lambda x, a: np.tanh(x),
               lambda x, dy, a: dy * (x.dtype.type(1) - np.tanh(x) ** 2)),
    Activation("exp", lambda x, a: np.exp(x), lambda x, dy, a: dy * np.exp(x)),
    Activation("neg", lambda x, a: -x, lambda x, dy, a: -dy),
    Activation("scale", lambda x, a: x.dtype.type(a) * x,
               lambda x, dy, a: x.dtype.type(a) * dy, alpha=True),
    Activation("log", lambda x, a: np.log(x), lambda x, dy, a: dy / x),
    Activation("sqrt", lambda x, a: np.sqrt(x),
               lambda x, dy, a: dy / (x.dtype.type(2) * np.sqrt(x))),
    Activation("rsqrt", lambda x, a: np.reciprocal(np.sqrt(x)), _rsqrt_grad),
    Activation("sigmoid", _sigmoid,
               lambda x, dy, a: dy * _sigmoid(x, a) * (x.dtype.type(1) - _sigmoid(x, a))),
    Activation("abs", lambda x, a: np.abs(x),
               lambda x, dy, a: dy * ((x > 0).astype(x.dtype) - (x < 0).astype(x.dtype))),
    Activation("clamp", _clamp, _clamp_grad, bounds=True),
)
_BY_NAME = {a.name: a for a in ACTIVATIONS}
UNARY_OPS: tuple[str, ...] = tuple(_BY_NAME)
_INDEX = {name: i for i, name in enumerate(UNARY_OPS)}

_MODULE = CudaModule(
    __file__, "activation.cu",
    [f"unary_{k}<{cuda_name(t)}, {i}>" for k in ("forward", "backward") for t in FLOAT_DTYPES
     for i in range(len(ACTIVATIONS))],
    enums={"Activation": UNARY_OPS},
)
_MAX_GRID = 1 << 18


def _grid(work: int) -> int:
    return max(1, min(cdiv(work, 256), _MAX_GRID))


def _aligned16(*arrays: Any) -> np.int32:
    return np.int32(all(a.data.ptr % 16 == 0 for a in arrays))


_FIELDS = (Choice("op", choices=UNARY_OPS), Extent("numel"),
           DType("dtype", FLOAT_DTYPES, default=np.float32))
_ALPHA = (Scalar("alpha", None), Scalar("beta", None))
FORWARD = OpSpec("unary", fields=_FIELDS,
                 operands=(In("x", ("numel",)), Out("y", ("numel",))), scalars=_ALPHA)
BACKWARD = OpSpec("unary_backward", fields=_FIELDS,
                  operands=(In("x", ("numel",)), In("dy", ("numel",)), Out("dx", ("numel",)),
                            In("y", ("numel",), present=True)),
                  scalars=_ALPHA)

UnaryDescriptor = FORWARD.descriptor(
    "UnaryDescriptor", "y[numel] = f(x[numel]) (and its gradient) for activation `op`.")
#: forward and backward share the descriptor (same fields).
UnaryBackwardDescriptor = UnaryDescriptor
BACKWARD.descriptor_cls = UnaryDescriptor
UnaryArgs = FORWARD.args("UnaryArgs", "x, y [numel]; alpha: the factor of 'scale'; alpha, "
                                      "beta: the bounds of 'clamp' (None: unbounded).")
UnaryBackwardArgs = BACKWARD.args(
    "UnaryBackwardArgs", "x (the forward input), dy, dx [numel]; y (optional): the forward's "
    "output f(x), which lets the host f32 SKU of 'gelu' skip erf (the device SKUs read x "
    "only); alpha, beta as in UnaryArgs.")


class _ActivationPlan(Plan):
    category = "elementwise"

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        return elementwise_candidates(desc.dtype, stream)

    def _prepare(self) -> None:
        d = self.desc
        self._act = _BY_NAME[d.op]
        self._acc = accumulator(d.dtype)
        self._kernel = f"unary_{self._direction}<{cuda_name(d.dtype)}, {_INDEX[d.op]}>"
        self._grid = _grid(cdiv(d.numel, 16 // as_dtype(d.dtype).itemsize))

    def _check_args(self, args: Any) -> None:
        alpha, beta, op = args.alpha, args.beta, self.desc.op
        if self._act.bounds:
            for name, v in (("alpha", alpha), ("beta", beta)):
                if v is not None and (not _is_real(v) or math.isnan(v)):
                    raise InvalidProblem(describe(self.op, name, f"None or a number, not NaN "
                                                                 f"(a bound of '{op}')",
                                                  repr(v)))
            return
        if self._act.alpha:
            if not _is_real(alpha) or not math.isfinite(alpha):
                raise InvalidProblem(describe(self.op, "alpha", f"a finite number "
                                                                f"('{op}' scales by it)",
                                              repr(alpha)))
        elif alpha is not None:
            raise InvalidProblem(describe(self.op, "alpha", f"None ('{op}' takes no "
                                                            f"alpha)", alpha))
        if beta is not None:
            raise InvalidProblem(describe(self.op, "beta", f"None ('{op}' takes no beta)",
                                          beta))

    def _scalars(self, args: Any) -> Any:
        """The host math's scalar argument: alpha, or (alpha, beta) for a bounds row."""
        return (args.alpha, args.beta) if self._act.bounds else args.alpha

    def _kernel_scalars(self, args: Any) -> tuple[np.generic, np.generic]:
        """(alpha, beta) in the accumulator type: a missing bound is -inf / +inf."""
        t = self._acc.type
        if self._act.bounds:
            return (t(-np.inf if args.alpha is None else args.alpha),
                    t(np.inf if args.beta is None else args.beta))
        return t(1.0 if args.alpha is None else args.alpha), t(0.0)


def _is_real(v: Any) -> bool:
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, float, np.number))


class UnaryPlan(_ActivationPlan):
    """Activation forward over a flat array (16-byte packs when aligned)."""

    op = "unary"
    spec = FORWARD
    _direction = "forward"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        x, y, alpha, acc = args.x, args.y, self._scalars(args), self._acc
        if self._act.jit and gelu_host.run_map(f"{self._act.jit}_forward", (x,), y):
            return
        if self._act.forward32 is not None and acc == np.float32:
            _run_blocks32(self._act.forward32, (x,), y)
            return
        forward = self._act.forward

        def block(lo: int, hi: int) -> None:
            y[lo:hi] = forward(x[lo:hi].astype(acc, copy=False), alpha)

        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            for_blocks(x.size, block)

    def _run_map(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, self._grid, 256,
               (args.x, args.y, np.int64(self.desc.numel), *self._kernel_scalars(args),
                _aligned16(args.x, args.y)))


class UnaryBackwardPlan(_ActivationPlan):
    """Activation gradient from the forward input (16-byte packs when aligned)."""

    op = "unary_backward"
    spec = BACKWARD
    _direction = "backward"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        x, dy, dx, alpha, acc = args.x, args.dy, args.dx, self._scalars(args), self._acc
        y32, jit = self._act.backward_y32, self._act.jit
        if y32 is not None and args.y is not None and self.desc.dtype == np.float32:
            if jit and gelu_host.run_map(f"{jit}_backward_y", (x, dy, args.y), dx):
                return
            with np.errstate(divide="ignore"):
                _run_blocks32(y32, (x, dy, args.y), dx)
            return
        if jit and gelu_host.run_map(f"{jit}_backward", (x, dy), dx):
            return
        if self._act.backward32 is not None and acc == np.float32:
            _run_blocks32(self._act.backward32, (x, dy), dx)
            return
        backward = self._act.backward

        def block(lo: int, hi: int) -> None:
            dx[lo:hi] = backward(x[lo:hi].astype(acc, copy=False),
                                 dy[lo:hi].astype(acc, copy=False), alpha)

        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            for_blocks(x.size, block)

    def _run_map(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, self._grid, 256,
               (args.x, args.dy, args.dx, np.int64(self.desc.numel),
                *self._kernel_scalars(args), _aligned16(args.x, args.dy, args.dx)))


# -- functional API ------------------------------------------------------------------------


def _flat(x: Any) -> Any:
    return backend.ascontiguous(x).reshape(-1)


def unary(name: str, x: Any, *, alpha: float | None = None,
          beta: float | None = None) -> Any:
    """y = f(x) elementwise, same shape and dtype as x."""
    flat = _flat(x)
    y = call(UnaryPlan, UnaryDescriptor(name, flat.size, x.dtype), like=x, x=flat,
             alpha=alpha, beta=beta)
    return y.reshape(x.shape)


def unary_backward(name: str, x: Any, dy: Any, *, y: Any = None, alpha: float | None = None,
                   beta: float | None = None) -> Any:
    """dx = dy * f'(x), x the forward input (dy has x's shape). y (optional): the forward's
    output f(x), which the host f32 'gelu' uses instead of recomputing erf."""
    for name_, a in (("dy", dy), ("y", y)):
        if a is not None and a.shape != x.shape:  # flat views would match in size only
            raise InvalidProblem(describe("unary_backward", name_, f"shape {tuple(x.shape)} "
                                                                   f"like 'x'",
                                          f"shape {tuple(a.shape)}"))
    flat = _flat(x)
    dx = call(UnaryBackwardPlan, UnaryDescriptor(name, flat.size, x.dtype), like=x, x=flat,
              dy=_flat(dy), y=None if y is None else _flat(y), alpha=alpha, beta=beta)
    return dx.reshape(x.shape)
