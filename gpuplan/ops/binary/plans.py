"""Binary ops with NumPy broadcasting, their gradients, and the row-broadcast bias add.

binary:           c = a op b (add, sub, mul, div, pow, maximum, minimum, remainder,
                  floor_divide, bitwise_and/or/xor), c of the broadcast shape; the
                  comparisons (lt, le, gt, ge, eq, ne) give a bool c. Floats, and per the
                  op's row int32, int64 and bool (see binary_table).
binary_backward:  da = sum over broadcast dims of dc * dc/da (likewise db), reduced to the
                  operand's shape in a fixed order (deterministic, no atomics). Comparisons
                  have none.
bias_add:         y[r, j] = x[r, j] + bias[j] for x [rows, n].

Every op is one row of `binary_table.BINARY_OPS` (its CUDA enumerator, the name upper-cased,
reaches binary.cu as -DGPUPLAN_ENUM_BinaryOp): adding one is a row there plus two branches in
binary.cu. Math runs in f32 for f16/bf16, else in the dtype itself. Integer and bool operands
(masks, indices) take the broadcast kernel only: packed instances would double the instance
count for tensors that are rarely large.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import FLOAT_DTYPES, accumulator, as_dtype, cuda_name
from gpuplan.dtypes import short_name as sn
from gpuplan.errors import InvalidProblem, Unsupported, describe
from gpuplan.execute import call, host_calls, interned, remember_host_call
from gpuplan.host import fp_quiet, fp_restore
from gpuplan.nvrtc import CudaModule, cdiv, launch
from gpuplan.ops.binary import table
from gpuplan.ops.binary.table import BINARY_OP_NAMES, BINARY_OPS, COMPARE_OPS, DIFFERENTIABLE_OPS
from gpuplan.ops.broadcast import MAX_DIMS, broadcast_layout, dims_launch_args
from gpuplan.ops.reduction.launch import SUM, launch_reduce, reduce_layout
from gpuplan.plan import MISS, BackendKind, Candidate, Plan, host_candidate
from gpuplan.spec import Choice, DType, Extent, In, OpSpec, Out, Shape
from gpuplan.stream import Stream, Workspace

__all__ = ["BinaryDescriptor", "BinaryArgs", "BinaryPlan", "BinaryBackwardDescriptor",
           "BinaryBackwardArgs", "BinaryBackwardPlan", "BiasAddDescriptor", "BiasAddArgs",
           "BiasAddPlan"]
__functional__ = ["binary", "binary_backward", "bias_add"]

_BY_NAME = {op.name: op for op in BINARY_OPS}
_INDEX = {name: i for i, name in enumerate(BINARY_OP_NAMES)}
_MAX_GRID = 1 << 18
_kind, _ctype, FLOAT = table.dtype_kind, table.ctype, table.FLOAT


# Floats: contiguous and broadcast forwards; integers and bool: broadcast only (module doc).
# Gradient terms are written as T, or in the accumulator type before a reduction: only by
# the ops reading a and b (add/sub reduce dc itself), so only they have <half, float>
# instances; ops without a gradient have none.
_MODULE = CudaModule(
    __file__, "binary.cu",
    [f"binary_{k}<{_ctype(t)}, {i}>" for t in table.BINARY_DTYPES
     for k in (("contiguous", "broadcast") if _kind(t) == FLOAT else ("broadcast",))
     for i, op in enumerate(BINARY_OPS) if _kind(t) in op.kinds]
    + [f"binary_grad<{cuda_name(t)}, {cuda_name(o)}, {i}, {w}>"
       for t in FLOAT_DTYPES for o in dict.fromkeys((t, accumulator(t)))
       for i, op in enumerate(BINARY_OPS)
       if op.grad is not None and (o == t or op.reads_operands)
       for w in (0, 1)]
    + [f"bias_add<{cuda_name(t)}>" for t in FLOAT_DTYPES], enums={"BinaryOp": BINARY_OP_NAMES})


def _grid(work: int) -> int:
    return max(1, min(cdiv(work, 256), _MAX_GRID))


def _aligned16(*arrays: Any) -> bool:
    return all(a.data.ptr % 16 == 0 for a in arrays)


def _map_candidate(desc: Any, stream: Stream, variant: str = "map", ws: int = 0) -> Candidate:
    d = as_dtype(desc.dtype)
    if stream.is_host:
        if _kind(d) != FLOAT:  # exact integer/bool math: no wider accumulator
            return Candidate("numpy", BackendKind.NUMPY, True, True, sn(d), sn(d))
        return host_candidate(d)
    return Candidate(variant, BackendKind.NVRTC, True, True, sn(d), sn(accumulator(d)), ws)


# -- broadcasting --------------------------------------------------------------------------


def broadcast_dims(op: str, a_shape: tuple, b_shape: tuple) -> tuple[tuple, tuple]:
    """(out_shape, collapsed dims ((extent, a_stride, b_stride), ...)): see
    gpuplan.ops.broadcast.broadcast_layout."""
    return broadcast_layout(op, ("a_shape", "b_shape"), (a_shape, b_shape))


def _out_shape(desc: Any) -> tuple:
    return broadcast_dims("binary", desc.a_shape, desc.b_shape)[0]


# -- specs ---------------------------------------------------------------------------------

_DTYPE = DType("dtype", FLOAT_DTYPES, default=np.float32)
_FIELDS = (Choice("op", choices=BINARY_OP_NAMES), Shape("a_shape"), Shape("b_shape"),
           DType("dtype", table.BINARY_DTYPES, default=np.float32))


def _operands_rule(desc: Any) -> bool | None:
    """a and b: required when the op's gradient reads them (mul, div), else optional."""
    return None if _BY_NAME[desc.op].reads_operands else True


def _out_dtype(desc: Any) -> Any:
    return np.dtype(np.bool_) if _BY_NAME[desc.op].compare else desc.dtype


FORWARD = OpSpec("binary", fields=_FIELDS, operands=(
    In("a", lambda d: d.a_shape), In("b", lambda d: d.b_shape),
    Out("c", _out_shape, dtype=_out_dtype)))
BACKWARD = OpSpec("binary_backward", fields=_FIELDS, operands=(
    In("a", lambda d: d.a_shape, present=_operands_rule),
    In("b", lambda d: d.b_shape, present=_operands_rule),
    In("dc", _out_shape, present=lambda d: None),  # required (an args default: it follows a, b)
    Out("da", lambda d: d.a_shape, present=True),
    Out("db", lambda d: d.b_shape, present=True, distinct=("a", "b", "dc", "da"))))

BinaryDescriptor = FORWARD.descriptor(
    "BinaryDescriptor", "c[broadcast(a_shape, b_shape)] = a op b (and its gradients).")
BinaryDescriptor.out_shape = _out_shape
#: forward and backward share the descriptor (same fields).
BinaryBackwardDescriptor = BinaryDescriptor
BACKWARD.descriptor_cls = BinaryDescriptor
BinaryArgs = FORWARD.args("BinaryArgs", "a [a_shape], b [b_shape], c [out_shape] (bool for a "
                                        "comparison).")
BinaryBackwardArgs = BACKWARD.args("BinaryBackwardArgs", "a, b (None allowed for add/sub), "
                                   "dc [out_shape]; da, db (None: not wanted).")


class _MapPlan(Plan):
    category = "elementwise"

    def _prepare(self) -> None:
        self._acc = accumulator(self.desc.dtype)
        self._in_place = self._acc == as_dtype(self.desc.dtype)  # host math writes out


class _BroadcastPlan(_MapPlan):
    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        row = _BY_NAME[desc.op]
        if _kind(desc.dtype) not in row.kinds:
            kinds = " or ".join(table.KIND_NAMES[k] for k in row.kinds)
            raise Unsupported(describe(cls.op, "dtype", f"{kinds} for op {desc.op!r}",
                                       sn(desc.dtype)))
        _, dims = broadcast_dims(cls.op, desc.a_shape, desc.b_shape)
        if len(dims) > MAX_DIMS:
            raise Unsupported(describe(cls.op, "a_shape", f"at most {MAX_DIMS} dims after "
                                                          f"collapsing", f"{len(dims)} dims"))

    def _prepare(self) -> None:
        super()._prepare()
        d = self.desc
        self._math = _BY_NAME[d.op]
        self._out, self._dims = broadcast_dims(self.op, d.a_shape, d.b_shape)
        self._n = math.prod(self._out)
        self._dims_args = dims_launch_args(self._dims, 2)


class BinaryPlan(_BroadcastPlan):
    """Every op of the table. SKUs: ``contiguous`` (same shapes: 16-byte packs when aligned) and
    ``broadcast`` (per-dim strides over at most 8 collapsed dims)."""

    op = "binary"
    spec = FORWARD

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        dims = broadcast_dims(cls.op, desc.a_shape, desc.b_shape)[1]
        same = _kind(desc.dtype) == FLOAT and (
            len(dims) == 0 or (len(dims) == 1 and dims[0][1:] == (1, 1)))
        return [_map_candidate(desc, stream, "contiguous" if same else "broadcast")]

    def _prepare(self) -> None:
        super()._prepare()
        d, t = self.desc, _ctype(self.desc.dtype)
        self._kernel = f"binary_{self._cand.variant}<{t}, {_INDEX[d.op]}>"
        pack = 16 // as_dtype(d.dtype).itemsize
        self._grid = _grid(cdiv(self._n, pack) if self._cand.variant == "contiguous"
                           else self._n)

    def _host_producer(self) -> Any:
        """The ufunc itself, quiet, for same-shape operands (not 0-d: a ufunc gives those a
        NumPy scalar) already in the accumulator dtype, when its result has c's dtype: it
        allocates c (C-contiguous, as a and b are) and spares the host call np.empty."""
        d, forward = self.desc, self._math.forward
        if not (self._in_place and d.a_shape == d.b_shape and d.a_shape
                and isinstance(forward, np.ufunc)):
            return None
        if getattr(self._run_impl, "__func__", None) is not _NUMPY_BODY:
            return None  # the host body replaced (a counting stub, a spy): the call runs it
        dt = as_dtype(d.dtype)
        try:
            if forward.resolve_dtypes((dt, dt, None))[-1] != self._resolved.dtypes["c"]:
                return None
        except TypeError:  # (no loop for these dtypes: the general path says so)
            return None

        def produce(a: Any, b: Any) -> Any:
            token = fp_quiet()
            try:
                return forward(a, b)
            finally:
                fp_restore(token)

        return produce

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        token = fp_quiet()
        try:
            if self._in_place:  # a and b already hold the accumulator dtype
                self._math.forward(args.a, args.b, out=args.c)
            else:
                acc = self._acc
                args.c[...] = self._math.forward(args.a.astype(acc, copy=False),
                                                 args.b.astype(acc, copy=False))
        finally:
            fp_restore(token)

    def _run_contiguous(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, self._grid, 256, (args.a, args.b, args.c, np.int64(self._n),
                                             np.int32(_aligned16(args.a, args.b, args.c))))

    def _run_broadcast(self, stream: Stream, ws: Workspace, args: Any) -> None:
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, self._grid, 256,
               (args.a, args.b, args.c, np.int64(self._n), *self._dims_args))


@functools.lru_cache(maxsize=1024)
def _gradient_plan(op: str, a_shape: tuple, b_shape: tuple, acc_itemsize: int) -> tuple:
    """(temp_bytes, ((which, reduced axes, reduce layout or None), ...), workspace bytes): a
    reduced mul/div gradient's terms go to a temp at the workspace start, partials after."""
    out = broadcast_dims("binary_backward", a_shape, b_shape)[0]
    n_out = math.prod(out)
    targets, temp, red = [], 0, 0
    for which, shape in enumerate((a_shape, b_shape)):
        pad = (1,) * (len(out) - len(shape)) + shape
        axes = tuple(i for i in range(len(out)) if pad[i] == 1 and out[i] != 1)
        layout = reduce_layout(out, frozenset(axes)) if axes else None
        if layout is not None:
            red = max(red, layout.workspace_bytes(acc_itemsize))
            if _BY_NAME[op].reads_operands:
                temp = -(-n_out * acc_itemsize // 256) * 256
        targets.append((which, axes, layout))
    return temp, tuple(targets), temp + red


#: BinaryPlan's own host body, which `_host_producer` stands for.
_NUMPY_BODY = BinaryPlan._run_numpy


class BinaryBackwardPlan(_BroadcastPlan):
    """da, db of the differentiable ops. An operand with broadcast dims gets its gradient
    summed over them by the reduction kernels (ops reading a, b first write the per-element
    terms in the accumulator type to the workspace): fixed order, deterministic and
    bit-stable."""

    op = "binary_backward"
    spec = BACKWARD

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        super()._check_descriptor(desc)
        if _BY_NAME[desc.op].grad is None:
            why = "a comparison" if desc.op in COMPARE_OPS else desc.op
            raise Unsupported(describe(cls.op, "op", f"one of {DIFFERENTIABLE_OPS} ({why} "
                                                     f"has no gradient)", repr(desc.op)))
        if _kind(desc.dtype) != FLOAT:
            raise Unsupported(describe(cls.op, "dtype", "a float dtype (integer ops have no "
                                                        "gradient)", sn(desc.dtype)))

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        ws = _gradient_plan(desc.op, desc.a_shape, desc.b_shape,
                            accumulator(desc.dtype).itemsize)[2]
        return [_map_candidate(desc, stream, "reduce", ws)]

    def _prepare(self) -> None:
        super()._prepare()
        d = self.desc
        self._temp, self._targets, _ = _gradient_plan(d.op, d.a_shape, d.b_shape,
                                                      self._acc.itemsize)
        # Terms as T, or as the accumulator before a reduction (mul/div; add/sub reduce dc
        # itself, times the sign of their term).
        t, acc, m = cuda_name(d.dtype), cuda_name(self._acc), self._math
        self._kernels = tuple(f"binary_grad<{t}, {t if lay is None else acc}, {_INDEX[d.op]}, {w}>"
                              for w, _, lay in self._targets)
        self._signs = tuple(1.0 if m.reads_operands else float(m.grad(w, None, None, 1.0))
                            for w in (0, 1))

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        acc = self._acc
        a = None if args.a is None else args.a.astype(acc, copy=False)
        b = None if args.b is None else args.b.astype(acc, copy=False)
        dc = args.dc.astype(acc, copy=False)
        for (which, axes, _), dst in zip(self._targets, (args.da, args.db), strict=True):
            if dst is None:
                continue
            token = fp_quiet()
            try:
                g = np.broadcast_to(self._math.grad(which, a, b, dc), self._out)
            finally:
                fp_restore(token)
            if axes:
                g = np.sum(g, axis=axes, dtype=acc)
            dst[...] = g.reshape(dst.shape)

    def _run_reduce(self, stream: Stream, ws: Workspace, args: Any) -> None:
        a = args.dc if args.a is None else args.a
        b = args.dc if args.b is None else args.b
        n = self._n
        for (which, _, layout), dst in zip(self._targets, (args.da, args.db), strict=True):
            if dst is None or dst.size == 0:
                continue
            if layout is None:
                self._grad(stream, which, (a, b, args.dc, dst))
            elif not self._math.reads_operands or n == 0:  # (an empty dc sums to zeros)
                sign = self._signs[which] if n else 1.0
                launch_reduce(stream, layout, SUM, args.dc, dst, sign, ws, self._temp)
            else:
                temp = ws.view(self._acc, n, 0)
                self._grad(stream, which, (a, b, args.dc, temp))
                launch_reduce(stream, layout, SUM, temp, dst, 1.0, ws, self._temp)

    def _grad(self, stream: Stream, which: int, arrays: tuple) -> None:
        fn = _MODULE.function(self._kernels[which], stream.device_id)
        launch(stream, fn, _grid(self._n), 256, (*arrays, np.int64(self._n), *self._dims_args))


# -- bias add ------------------------------------------------------------------------------

BIAS_ADD = OpSpec("bias_add", fields=(Extent("rows"), Extent("n"), _DTYPE),
                  operands=(In("x", ("rows", "n")), In("bias", ("n",)), Out("y", ("rows", "n"))))
BiasAddDescriptor = BIAS_ADD.descriptor("BiasAddDescriptor", "y[rows, n] = x[rows, n] + bias[n].")
BiasAddArgs = BIAS_ADD.args("BiasAddArgs", "x [rows, n], bias [n], y [rows, n].")


class BiasAddPlan(_MapPlan):
    """Row-broadcast bias add (16-byte packs when n and every pointer allow)."""

    op = "bias_add"
    spec = BIAS_ADD

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> list[Candidate]:
        return [_map_candidate(desc, stream)]

    def _prepare(self) -> None:
        super()._prepare()
        d = self.desc
        self._pack = 16 // as_dtype(d.dtype).itemsize
        self._total = d.rows * d.n
        self._kernel = f"bias_add<{cuda_name(d.dtype)}>"

    def _run_numpy(self, stream: Stream, ws: Workspace, args: Any) -> None:
        acc = self._acc
        x, bias = args.x.astype(acc, copy=False), args.bias.astype(acc, copy=False)
        if self._in_place:
            np.add(x, bias, out=args.y)
        else:
            args.y[...] = x + bias

    def _run_map(self, stream: Stream, ws: Workspace, args: Any) -> None:
        vec = self.desc.n % self._pack == 0 and _aligned16(args.x, args.bias, args.y)
        fn = _MODULE.function(self._kernel, stream.device_id)
        launch(stream, fn, _grid(cdiv(self._total, self._pack if vec else 1)), 256,
               (args.x, args.bias, args.y, np.int64(self._total), np.int64(self.desc.n),
                np.int32(vec)))


# -- functional API ------------------------------------------------------------------------


def _descriptor(name: str, a_shape: tuple, b_shape: tuple, dtype: Any) -> Any:
    """BinaryDescriptor(name, a_shape, b_shape, dtype), built once (`binary` runs for every
    gradient sum on the tape)."""
    return interned(BinaryDescriptor, name, a_shape, b_shape, dtype)


def _contiguous(a: Any) -> Any:
    if type(a) is np.ndarray:  # ascontiguousarray alone turns a 0-d array into (1,)
        return a if a.flags.c_contiguous else np.ascontiguousarray(a)
    return backend.ascontiguous(a)


#: (op, a_shape, b_shape, dtype) -> the host call of its BinaryPlan (execute.host_call), or
#: None where that plan has none (an empty problem).
_HOST = host_calls()


def binary(name: str, a: Any, b: Any) -> Any:
    """c = a op b with NumPy broadcasting; c.dtype == a.dtype (b must match), bool for a
    comparison (lt, le, gt, ge, eq, ne)."""
    if type(a) is np.ndarray and type(b) is np.ndarray:
        # The host call of a descriptor seen before: it checks a and b itself (MISS: not
        # ones it takes as they are; the general path below deals with them).
        key = (name, a.shape, b.shape, a.dtype)
        fast = _HOST.get(key, MISS)  # (MISS: not seen yet; None: the plan has none)
        if fast is MISS and name in _INDEX:
            fast = remember_host_call(_HOST, key, BinaryPlan, interned(BinaryDescriptor, *key))
        if fast is not None and fast is not MISS:
            c = fast(a, b)
            if c is not MISS:
                return c
    if type(a) is not np.ndarray or not a.flags.c_contiguous:
        a = _contiguous(a)
    if type(b) is not np.ndarray or not b.flags.c_contiguous:
        b = _contiguous(b)
    return call(BinaryPlan, interned(BinaryDescriptor, name, a.shape, b.shape, a.dtype),
                like=a, a=a, b=b)


def binary_backward(name: str, a: Any, b: Any, dc: Any,
                    shapes: tuple | None = None) -> tuple[Any, Any]:
    """(da, db) of c = a op b, each summed over its broadcast dims back to its own shape.
    add/sub: a and b may be None, with ``shapes=(a_shape, b_shape)``."""
    if shapes is None:
        shapes = (tuple(a.shape), tuple(b.shape))
    a, b, dc = (None if v is None else _contiguous(v) for v in (a, b, dc))
    xp = backend.array_namespace(dc)
    return call(BinaryBackwardPlan, _descriptor(name, *shapes, dc.dtype), like=dc, a=a, b=b,
                dc=dc, da=xp.empty(shapes[0], dc.dtype), db=xp.empty(shapes[1], dc.dtype))


def bias_add(x: Any, bias: Any) -> Any:
    """y[..., N] = x[..., N] + bias[N]."""
    n = int(bias.shape[-1]) if bias.ndim else 1
    rows = math.prod(x.shape[:-1]) if x.ndim else 1
    try:  # free when right: a bias unlike x's last dim is named, not NumPy's reshape error
        x2 = backend.ascontiguous(x).reshape(rows, n)
    except ValueError:
        raise InvalidProblem(describe("bias_add", "bias", f"shape {x.shape[-1:]} (x's last dim)",
                                      f"shape {bias.shape}")) from None
    y = call(BiasAddPlan, BiasAddDescriptor(rows, n, x.dtype), like=x, x=x2,
             bias=backend.ascontiguous(bias).reshape(-1))
    return y.reshape(x.shape)
