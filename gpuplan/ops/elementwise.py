"""Elementwise ops: unary activations and their gradients, broadcasting binary ops and their
gradients (reduced back to the operand shapes), bias add and dtype casts.

unary:            y = f(x) for f in relu, gelu (exact erf), gelu_tanh, silu, tanh, exp, neg,
                  scale (y = alpha * x); x, y flat [numel].
unary_backward:   dx = dy * f'(x), x the forward input.
binary:           c = a op b (add, sub, mul, div) with NumPy broadcasting.
binary_backward:  da = sum over broadcast dims of dc * dc/da (likewise db), reduced to the
                  operand's shape in a fixed order (deterministic, no atomics).
bias_add:         y[r, j] = x[r, j] + bias[j] for x [rows, n].
cast:             y = x.astype(out_dtype) between f32, f64, f16, bf16, int32, int64.
Math runs in f32 for f16/bf16 and in the dtype itself for f32/f64 (the host GELU forms
Phi(x) = (1 + erf(x / sqrt 2)) / 2 in float64, erf from gpuplan.host_math).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import (
    FLOAT_DTYPES,
    accumulator,
    as_dtype,
    bfloat16,
    cuda_name,
    float64,
    int32,
    int64,
)
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, Unsupported, describe
from gpuplan.execute import execute
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.ops.reduction import launch_reduce, reduce_layout
from gpuplan.plan import (
    BackendKind,
    Candidate,
    Plan,
    check_dtype,
    check_operand,
    check_writable_distinct,
    host_candidate,
)
from gpuplan.stream import Stream, Workspace

__all__ = [
    "BinaryDescriptor", "BinaryArgs", "BinaryPlan",
    "BinaryBackwardDescriptor", "BinaryBackwardArgs", "BinaryBackwardPlan",
    "BiasAddDescriptor", "BiasAddArgs", "BiasAddPlan",
    "CastDescriptor", "CastArgs", "CastPlan",
]
__functional__ = ["binary", "binary_backward", "bias_add", "cast"]

BINARY_OPS = ("add", "sub", "mul", "div")
CAST_DTYPES = FLOAT_DTYPES + (int32, int64)
_MAX_DIMS = 8
_MAX_GRID = 1 << 18
_HALF_ACC = [(t, accumulator(t)) for t in FLOAT_DTYPES if accumulator(t) != t]

_MODULE = CudaModule(
    __file__,
    "elementwise.cu",
    [f"binary_{k}<{cuda_name(t)}, {i}>" for k in ("contiguous", "broadcast")
       for t in FLOAT_DTYPES for i in range(len(BINARY_OPS))]
    + [f"binary_grad<{cuda_name(t)}, {cuda_name(o)}, {i}, {w}>"
       for t, o in [(t, t) for t in FLOAT_DTYPES] + _HALF_ACC
       for i in range(len(BINARY_OPS)) for w in (0, 1)]
    + [f"bias_add<{cuda_name(t)}>" for t in FLOAT_DTYPES]
    + [f"cast<{cuda_name(s)}, {cuda_name(d)}>" for s in CAST_DTYPES for d in CAST_DTYPES],
)


def _ptr(a: Any) -> int:
    return a.data.ptr


def _vec_ok(*pairs: tuple) -> np.int32:
    """1 when every (array, bytes per pack) pointer is aligned to its pack size."""
    return np.int32(all(_ptr(a) % b == 0 for a, b in pairs))


def _grid(work: int) -> int:
    return max(1, min(cdiv(work, 256), _MAX_GRID))


def _alpha(dtype: Any, alpha: float | None) -> np.generic:
    acc = accumulator(dtype)
    return acc.type(1.0 if alpha is None else alpha)


def _check_float(op: str, dtype: Any) -> np.dtype:
    return check_dtype(op, "dtype", dtype, FLOAT_DTYPES)


def _map_candidates(op: str, dtype: Any, on_device: bool, variant: str = "map") -> list:
    d = _check_float(op, dtype)
    if not on_device:
        return [host_candidate(d)]
    return [Candidate(variant, BackendKind.NVRTC, True, True, sn(d), sn(accumulator(d)))]


# -- NumPy implementation (inputs already in the accumulator dtype) ------------------------


_BINARY_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def _host_binary(op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None
                 ) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return _BINARY_UFUNCS[op](a, b, out=out)


def _host_binary_grad(op: str, which: int, a: Any, b: Any, dc: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if op == "add" or (op == "sub" and which == 0):
            return dc
        if op == "sub":
            return -dc
        if op == "mul":
            return dc * (b if which == 0 else a)
        return dc / b if which == 0 else -dc * a / (b * b)


# -- binary --------------------------------------------------------------------------------


def broadcast_dims(op: str, a_shape: tuple, b_shape: tuple) -> tuple[tuple, list]:
    """(out_shape, collapsed dims [(extent, a_stride, b_stride)]): size-1 output dims
    dropped, neighbours merged where both operands stay contiguous across them."""
    try:
        out = tuple(int(e) for e in np.broadcast_shapes(tuple(a_shape), tuple(b_shape)))
    except ValueError:
        raise InvalidProblem(describe(op, "b_shape", f"a shape broadcastable with {a_shape}",
                                      b_shape)) from None
    n = len(out)
    dims: list[list[int]] = []
    for shape in (a_shape, b_shape):
        pad = (1,) * (n - len(shape)) + tuple(int(e) for e in shape)
        strides = [int(np.prod(pad[i + 1:], dtype=np.int64)) for i in range(n)]
        dims.append([0 if pad[i] == 1 else strides[i] for i in range(n)])
    merged: list[list[int]] = []
    for i in range(n):
        if out[i] == 1:
            continue
        e, sa, sb = out[i], dims[0][i], dims[1][i]
        if merged and merged[-1][1] == sa * e and merged[-1][2] == sb * e:
            merged[-1] = [merged[-1][0] * e, sa, sb]
        else:
            merged.append([e, sa, sb])
    return out, [tuple(m) for m in merged]


def _dims_args(dims: list) -> tuple:
    pad = [(1, 0, 0)] * (_MAX_DIMS - len(dims))
    full = list(dims) + pad
    return tuple(np.int64(d[k]) for k in range(3) for d in full)


def _check_shapes(op: str, desc: Any) -> tuple[tuple, list]:
    for name in ("a_shape", "b_shape"):
        shape = tuple(getattr(desc, name))
        if any(int(e) < 0 for e in shape):
            raise InvalidProblem(describe(op, name, "extents >= 0", shape))
    out, dims = broadcast_dims(op, desc.a_shape, desc.b_shape)
    if len(dims) > _MAX_DIMS:
        raise Unsupported(describe(op, "a_shape", f"at most {_MAX_DIMS} dims after collapsing",
                                   f"{len(dims)} dims"))
    return out, dims


def _check_binary_desc(op: str, desc: Any) -> None:
    if desc.op not in BINARY_OPS:
        raise Unsupported(describe(op, "op", f"one of {BINARY_OPS}", repr(desc.op)))
    _check_shapes(op, desc)


def _is_contiguous(dims: list) -> bool:
    return len(dims) == 0 or (len(dims) == 1 and dims[0][1] == 1 and dims[0][2] == 1)


@dataclass(frozen=True)
class BinaryDescriptor:
    """c[broadcast(a_shape, b_shape)] = a op b."""

    op: str
    a_shape: tuple
    b_shape: tuple
    dtype: Any = np.float32

    def out_shape(self) -> tuple:
        return tuple(int(e) for e in np.broadcast_shapes(tuple(self.a_shape),
                                                         tuple(self.b_shape)))


@dataclass(frozen=True)
class BinaryArgs:
    a: Any  # [a_shape]
    b: Any  # [b_shape]
    c: Any  # [out_shape]


class BinaryPlan(Plan):
    """add/sub/mul/div. SKUs: ``contiguous`` (same shapes: 16-byte packs when aligned) and
    ``broadcast`` (per-dim strides over at most 8 collapsed dims)."""

    op = "binary"
    category = "elementwise"

    @classmethod
    def _check_descriptor(cls, desc: BinaryDescriptor) -> None:
        _check_binary_desc(cls.op, desc)

    @classmethod
    def _candidates(cls, desc: BinaryDescriptor, on_device: bool) -> list[Candidate]:
        _, dims = _check_shapes(cls.op, desc)
        return _map_candidates(cls.op, desc.dtype, on_device,
                               "contiguous" if _is_contiguous(dims) else "broadcast")

    def _check_args(self, args: BinaryArgs) -> None:
        d = self.desc
        check_operand(self.op, "a", args.a, tuple(d.a_shape), d.dtype)
        check_operand(self.op, "b", args.b, tuple(d.b_shape), d.dtype)
        check_operand(self.op, "c", args.c, d.out_shape(), d.dtype)
        check_writable_distinct(self.op, {"c": args.c}, {"a": args.a, "b": args.b})

    def _is_empty(self) -> bool:
        return int(np.prod(self.desc.out_shape(), dtype=np.int64)) == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: BinaryArgs) -> None:
        acc = accumulator(self.desc.dtype)
        a, b = args.a.astype(acc, copy=False), args.b.astype(acc, copy=False)
        if acc == args.c.dtype:
            _host_binary(self.desc.op, a, b, out=args.c)
        else:
            args.c[...] = _host_binary(self.desc.op, a, b)

    def _run_contiguous(self, stream: Stream, ws: Workspace, args: BinaryArgs) -> None:
        d = self.desc
        n = int(args.c.size)
        fn = _MODULE.function(f"binary_contiguous<{cuda_name(d.dtype)}, "
                              f"{BINARY_OPS.index(d.op)}>", stream.device_id)
        pack = 16 // as_dtype(d.dtype).itemsize
        launch(stream, fn, _grid(cdiv(n, pack)), 256,
               (args.a, args.b, args.c, np.int64(n),
                _vec_ok((args.a, 16), (args.b, 16), (args.c, 16))))

    def _run_broadcast(self, stream: Stream, ws: Workspace, args: BinaryArgs) -> None:
        d = self.desc
        _, dims = broadcast_dims(self.op, d.a_shape, d.b_shape)
        n = int(args.c.size)
        fn = _MODULE.function(f"binary_broadcast<{cuda_name(d.dtype)}, "
                              f"{BINARY_OPS.index(d.op)}>", stream.device_id)
        launch(stream, fn, _grid(n), 256,
               (args.a, args.b, args.c, np.int64(n), np.int32(len(dims)), *_dims_args(dims)))


@dataclass(frozen=True)
class BinaryBackwardDescriptor:
    """Gradients of c = a op b: da [a_shape], db [b_shape] from dc [broadcast shape]."""

    op: str
    a_shape: tuple
    b_shape: tuple
    dtype: Any = np.float32

    def out_shape(self) -> tuple:
        return tuple(int(e) for e in np.broadcast_shapes(tuple(self.a_shape),
                                                         tuple(self.b_shape)))


@dataclass(frozen=True)
class BinaryBackwardArgs:
    a: Any   # [a_shape]; may be None for add/sub
    b: Any   # [b_shape]; may be None for add/sub
    dc: Any  # [out_shape]
    da: Any  # [a_shape] or None (not wanted)
    db: Any  # [b_shape] or None (not wanted)


def _reduced_axes(out: tuple, target: tuple) -> frozenset:
    pad = (1,) * (len(out) - len(target)) + tuple(int(e) for e in target)
    return frozenset(i for i in range(len(out)) if pad[i] == 1 and out[i] != 1)


class BinaryBackwardPlan(Plan):
    """da, db of add/sub/mul/div. An operand with broadcast dims gets its gradient summed
    over them by the reduction kernels (mul/div first write the per-element terms in the
    accumulator type to the workspace): fixed order, deterministic and bit-stable."""

    op = "binary_backward"
    category = "elementwise"

    @classmethod
    def _check_descriptor(cls, desc: BinaryBackwardDescriptor) -> None:
        _check_binary_desc(cls.op, desc)

    @classmethod
    def _candidates(cls, desc: BinaryBackwardDescriptor, on_device: bool) -> list[Candidate]:
        d = _check_float(cls.op, desc.dtype)
        if not on_device:
            return [host_candidate(d)]
        acc = accumulator(d)
        return [Candidate("reduce", BackendKind.NVRTC, True, True, sn(d), sn(acc),
                          cls._workspace(desc, acc))]

    @classmethod
    def _workspace(cls, desc: BinaryBackwardDescriptor, acc: np.dtype) -> int:
        out = desc.out_shape()
        n_out = int(np.prod(out, dtype=np.int64))
        temp, red = 0, 0
        for target in (desc.a_shape, desc.b_shape):
            axes = _reduced_axes(out, target)
            if axes:
                red = max(red, reduce_layout(out, axes).workspace_bytes(acc.itemsize))
                if desc.op in ("mul", "div"):
                    temp = -(-n_out * acc.itemsize // 256) * 256
        return temp + red

    def _check_args(self, args: BinaryBackwardArgs) -> None:
        d = self.desc
        need_inputs = d.op in ("mul", "div")
        for name, shape in (("a", d.a_shape), ("b", d.b_shape)):
            if need_inputs or getattr(args, name) is not None:
                check_operand(self.op, name, getattr(args, name), tuple(shape), d.dtype)
        check_operand(self.op, "dc", args.dc, d.out_shape(), d.dtype)
        for name, shape in (("da", d.a_shape), ("db", d.b_shape)):
            if getattr(args, name) is not None:
                check_operand(self.op, name, getattr(args, name), tuple(shape), d.dtype)
        check_writable_distinct(self.op, {"da": args.da, "db": args.db},
                                {"a": args.a, "b": args.b, "dc": args.dc})
        check_writable_distinct(self.op, {"da": args.da}, {"db": args.db})

    def _is_empty(self) -> bool:
        d = self.desc
        return all(int(np.prod(s, dtype=np.int64)) == 0 for s in (d.a_shape, d.b_shape))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: BinaryBackwardArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        a = None if args.a is None else args.a.astype(acc, copy=False)
        b = None if args.b is None else args.b.astype(acc, copy=False)
        dc = args.dc.astype(acc, copy=False)
        out = d.out_shape()
        for which, target, dst in ((0, d.a_shape, args.da), (1, d.b_shape, args.db)):
            if dst is None:
                continue
            g = np.broadcast_to(_host_binary_grad(d.op, which, a, b, dc), out)
            axes = tuple(sorted(_reduced_axes(out, target)))
            if axes:
                g = np.sum(g, axis=axes, dtype=acc)
            dst[...] = g.reshape(tuple(target))

    def _run_reduce(self, stream: Stream, ws: Workspace, args: BinaryBackwardArgs) -> None:
        d = self.desc
        acc = accumulator(d.dtype)
        out = d.out_shape()
        n_out = int(np.prod(out, dtype=np.int64))
        _, dims = broadcast_dims(self.op, d.a_shape, d.b_shape)
        opi = BINARY_OPS.index(d.op)
        a = args.dc if args.a is None else args.a
        b = args.dc if args.b is None else args.b
        temp_bytes = (-(-n_out * acc.itemsize // 256) * 256
                      if d.op in ("mul", "div") else 0)
        for which, target, dst in ((0, d.a_shape, args.da), (1, d.b_shape, args.db)):
            if dst is None or dst.size == 0:
                continue
            axes = _reduced_axes(out, target)
            if not axes:
                self._grad(stream, a, b, args.dc, dst, n_out, dims, opi, which)
                continue
            layout = reduce_layout(out, axes)
            if d.op in ("add", "sub") or n_out == 0:  # (an empty dc sums to zeros)
                sign = -1.0 if d.op == "sub" and which == 1 and n_out else 1.0
                launch_reduce(stream, layout, 0, args.dc, dst, sign, ws, temp_bytes)
            else:
                temp = ws.view(acc, n_out, 0)
                self._grad(stream, a, b, args.dc, temp, n_out, dims, opi, which)
                launch_reduce(stream, layout, 0, temp, dst, 1.0, ws, temp_bytes)

    def _grad(self, stream, a, b, dc, dst, n, dims, opi, which) -> None:
        names = f"{cuda_name(self.desc.dtype)}, {cuda_name(dst.dtype)}, {opi}, {which}"
        fn = _MODULE.function(f"binary_grad<{names}>", stream.device_id)
        launch(stream, fn, _grid(n), 256,
               (a, b, dc, dst, np.int64(n), np.int32(len(dims)), *_dims_args(dims)))


# -- bias add and cast -------------------------------------------------------------------


@dataclass(frozen=True)
class BiasAddDescriptor:
    """y[rows, n] = x[rows, n] + bias[n]."""

    rows: int
    n: int
    dtype: Any = np.float32


@dataclass(frozen=True)
class BiasAddArgs:
    x: Any     # [rows, n]
    bias: Any  # [n]
    y: Any     # [rows, n]


class BiasAddPlan(Plan):
    """Row-broadcast bias add (16-byte packs when n and every pointer allow)."""

    op = "bias_add"
    category = "elementwise"

    @classmethod
    def _candidates(cls, desc: BiasAddDescriptor, on_device: bool) -> list[Candidate]:
        return _map_candidates(cls.op, desc.dtype, on_device)

    def _check_args(self, args: BiasAddArgs) -> None:
        d = self.desc
        check_operand(self.op, "x", args.x, (d.rows, d.n), d.dtype)
        check_operand(self.op, "bias", args.bias, (d.n,), d.dtype)
        check_operand(self.op, "y", args.y, (d.rows, d.n), d.dtype)
        check_writable_distinct(self.op, {"y": args.y}, {"x": args.x, "bias": args.bias})

    def _is_empty(self) -> bool:
        return self.desc.rows == 0 or self.desc.n == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: BiasAddArgs) -> None:
        acc = accumulator(self.desc.dtype)
        x, bias = args.x.astype(acc, copy=False), args.bias.astype(acc, copy=False)
        if acc == args.y.dtype:
            np.add(x, bias, out=args.y)
        else:
            args.y[...] = x + bias

    def _run_map(self, stream: Stream, ws: Workspace, args: BiasAddArgs) -> None:
        d = self.desc
        pack = 16 // as_dtype(d.dtype).itemsize
        vec = _vec_ok((args.x, 16), (args.bias, 16), (args.y, 16)) and d.n % pack == 0
        total = d.rows * d.n
        fn = _MODULE.function(f"bias_add<{cuda_name(d.dtype)}>", stream.device_id)
        launch(stream, fn, _grid(cdiv(total, pack if vec else 1)), 256,
               (args.x, args.bias, args.y, np.int64(total), np.int64(d.n), np.int32(vec)))


@dataclass(frozen=True)
class CastDescriptor:
    """y[numel] = x[numel] converted from dtype to out_dtype (round to nearest even;
    float to int truncates toward zero; NaN/out-of-range float to int is unspecified)."""

    numel: int
    dtype: Any = np.float32
    out_dtype: Any = np.float32


@dataclass(frozen=True)
class CastArgs:
    x: Any  # [numel] of dtype
    y: Any  # [numel] of out_dtype


class CastPlan(Plan):
    """dtype conversion between f32, f64, f16, bf16, int32 and int64 (16-byte packs)."""

    op = "cast"
    category = "elementwise"

    @classmethod
    def _candidates(cls, desc: CastDescriptor, on_device: bool) -> list[Candidate]:
        s = check_dtype(cls.op, "dtype", desc.dtype, CAST_DTYPES)
        t = check_dtype(cls.op, "out_dtype", desc.out_dtype, CAST_DTYPES)
        wide = s if s.itemsize >= t.itemsize else t
        backend_kind = BackendKind.NVRTC if on_device else BackendKind.NUMPY
        return [Candidate("map" if on_device else "numpy", backend_kind, True, True, sn(t),
                          sn(wide))]

    def _check_args(self, args: CastArgs) -> None:
        d = self.desc
        check_operand(self.op, "x", args.x, (d.numel,), d.dtype)
        check_operand(self.op, "y", args.y, (d.numel,), d.out_dtype)
        check_writable_distinct(self.op, {"y": args.y}, {"x": args.x})

    def _is_empty(self) -> bool:
        return self.desc.numel == 0

    def _run_numpy(self, stream: Stream, ws: Workspace, args: CastArgs) -> None:
        out = as_dtype(self.desc.out_dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            if out == bfloat16 and as_dtype(self.desc.dtype) in (float64, int32, int64):
                args.y[...] = _round_odd_to_f32(args.x).astype(bfloat16)
            else:
                args.y[...] = args.x.astype(out)

    def _run_map(self, stream: Stream, ws: Workspace, args: CastArgs) -> None:
        d = self.desc
        s, t = as_dtype(d.dtype), as_dtype(d.out_dtype)
        pack = 16 // max(s.itemsize, t.itemsize)
        fn = _MODULE.function(f"cast<{cuda_name(s)}, {cuda_name(t)}>", stream.device_id)
        launch(stream, fn, _grid(cdiv(d.numel, pack)), 256,
               (args.x, args.y, np.int64(d.numel),
                _vec_ok((args.x, pack * s.itemsize), (args.y, pack * t.itemsize))))


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


def _flat(x: Any) -> Any:
    return backend.ascontiguous(x).reshape(-1)


def binary(name: str, a: Any, b: Any) -> Any:
    """c = a op b with NumPy broadcasting; c.dtype == a.dtype (b must match)."""
    a, b = backend.ascontiguous(a), backend.ascontiguous(b)
    desc = BinaryDescriptor(name, tuple(a.shape), tuple(b.shape), as_dtype(a.dtype))
    c = backend.array_namespace(a).empty(desc.out_shape(), dtype=a.dtype)
    execute(BinaryPlan, desc, BinaryArgs(a, b, c), like=a)
    return c


def binary_backward(name: str, a: Any, b: Any, dc: Any) -> tuple[Any, Any]:
    """(da, db) of c = a op b, each summed over its broadcast dims back to its own shape."""
    a, b, dc = backend.ascontiguous(a), backend.ascontiguous(b), backend.ascontiguous(dc)
    xp = backend.array_namespace(dc)
    da = xp.empty(a.shape, dtype=dc.dtype)
    db = xp.empty(b.shape, dtype=dc.dtype)
    desc = BinaryBackwardDescriptor(name, tuple(a.shape), tuple(b.shape), as_dtype(dc.dtype))
    execute(BinaryBackwardPlan, desc, BinaryBackwardArgs(a, b, dc, da, db), like=dc)
    return da, db


def bias_add(x: Any, bias: Any) -> Any:
    """y[..., N] = x[..., N] + bias[N]."""
    n = int(bias.shape[-1]) if bias.ndim else 1
    rows = int(np.prod(x.shape[:-1], dtype=np.int64)) if x.ndim else 1
    x2 = backend.ascontiguous(x).reshape(rows, n)
    y = backend.array_namespace(x).empty(x2.shape, dtype=x.dtype)
    execute(BiasAddPlan, BiasAddDescriptor(int(x2.shape[0]), n, as_dtype(x.dtype)),
            BiasAddArgs(x2, backend.ascontiguous(bias).reshape(-1), y), like=x)
    return y.reshape(x.shape)


def cast(x: Any, dtype: Any) -> Any:
    """y = x converted to `dtype` (same shape)."""
    flat = _flat(x)
    y = backend.array_namespace(x).empty(flat.shape, dtype=as_dtype(dtype))
    execute(CastPlan, CastDescriptor(int(flat.size), as_dtype(x.dtype), as_dtype(dtype)),
            CastArgs(flat, y), like=x)
    return y.reshape(x.shape)

