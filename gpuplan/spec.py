"""Declared op specs: a family states its fields, operands and run scalars once; the
descriptor and args classes, descriptor checks, operand checks, emptiness and the error
messages are derived from that declaration.

    SPEC = OpSpec(
        "layer_norm",
        fields=(Extent("rows"), Extent("cols"), Real("eps", 1e-5), Flag("has_weight", True),
                DType("dtype", FLOAT_DTYPES)),
        operands=(In("x", ("rows", "cols")), In("weight", ("cols",), present="has_weight"),
                  Out("y", ("rows", "cols")), Out("mean", ("rows",), dtype=np.float32)),
        empty=("rows",),
    )
    LayerNormDescriptor = SPEC.descriptor("LayerNormDescriptor", "doc ...")
    LayerNormArgs = SPEC.args("LayerNormArgs")

Fields become the descriptor (a frozen dataclass, in declaration order); operands and
scalars become the args (operands first, then scalars). Runtime values that change from
call to call (a learning rate, a step, a clip factor) are `Scalar`s: args, never
descriptor fields, so a new value never selects a new plan.

An operand's shape is a tuple whose entries are ints, descriptor field names or
expressions over them (``"rows * cols"``), or a callable ``desc -> tuple``. Its dtype is a
descriptor field name (``"dtype"``, the default), a dtype, a tuple of allowed dtypes,
``INDEX`` (int32 or int64, taken from the array) or a callable ``desc -> dtype``.
`Plan` resolves every operand once per descriptor (`Resolved`) and checks a call's
arrays against that: a shape, dtype and layout comparison per operand, the precise
error message built only when a check fails.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuplan.dtypes import as_dtype, short_name
from gpuplan.errors import InvalidProblem, Unsupported, describe


class _Required:
    """The default of a field or scalar that has none (the caller must pass it)."""

    def __repr__(self) -> str:
        return "REQUIRED"


_REQUIRED = _Required()
#: the default of a field or scalar the caller must pass.
REQUIRED = _REQUIRED

#: dtype rule of an index operand: int32 or int64, whichever the array has.
INDEX = "index"
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


# -- descriptor fields --------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One descriptor field (``default=`` keyword-only). Subclasses say how it is checked
    at `select`."""

    name: str
    default: Any = dataclasses.field(default=_REQUIRED, kw_only=True)

    def check(self, op: str, value: Any) -> None:  # pragma: no cover - overridden
        pass


@dataclass(frozen=True)
class Extent(Field):
    """A non-negative int (a size)."""

    def check(self, op: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InvalidProblem(describe(op, self.name, "an int extent", repr(value)))
        if value < 0:
            raise InvalidProblem(describe(op, self.name, "an extent >= 0", value))


@dataclass(frozen=True)
class Index(Field):
    """An int that may be negative, or None when the default is None (padding_idx...)."""

    def check(self, op: str, value: Any) -> None:
        if value is None and self.default is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InvalidProblem(describe(op, self.name, "an int", repr(value)))


@dataclass(frozen=True)
class Shape(Field):
    """A tuple of extents."""

    def check(self, op: str, value: Any) -> None:
        if not isinstance(value, (tuple, list)) or any(
                isinstance(e, bool) or not isinstance(e, (int, np.integer)) or e < 0
                for e in value):
            raise InvalidProblem(describe(op, self.name, "a tuple of extents >= 0", value))


@dataclass(frozen=True)
class DType(Field):
    """A dtype from `allowed` (Unsupported otherwise)."""

    allowed: tuple = ()

    def check(self, op: str, value: Any) -> None:
        try:
            d = as_dtype(value)
        except TypeError:
            d = None
        if d is None or (self.allowed and d not in _dtypes(self.allowed)):
            names = ", ".join(short_name(a) for a in _dtypes(self.allowed))
            given = short_name(d) if d is not None else repr(value)
            raise Unsupported(describe(op, self.name, f"dtype in ({names})", given))


@dataclass(frozen=True)
class Choice(Field):
    """One of `choices` (Unsupported otherwise): an op name, a reduction, a norm kind."""

    choices: tuple = ()

    def check(self, op: str, value: Any) -> None:
        if value not in self.choices:
            raise Unsupported(describe(op, self.name, f"one of {self.choices}", repr(value)))


@dataclass(frozen=True)
class Flag(Field):
    """A bool."""

    def check(self, op: str, value: Any) -> None:
        if not isinstance(value, (bool, np.bool_)):
            raise InvalidProblem(describe(op, self.name, "a bool", repr(value)))


@dataclass(frozen=True)
class Real(Field):
    """A finite real number fixed for the plan's life (eps, a fixed scale)."""

    def check(self, op: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                             np.floating)):
            raise InvalidProblem(describe(op, self.name, "a real number", repr(value)))
        if not math.isfinite(value):
            raise InvalidProblem(describe(op, self.name, "a finite number", value))


@dataclass(frozen=True)
class Value(Field):
    """Any hashable value, checked (if at all) by the family's `_check_descriptor`."""


# -- operands and scalars -----------------------------------------------------------------


@dataclass(frozen=True)
class Operand:
    """An array argument: its name, symbolic shape, dtype rule and role.

    role: "in" (read), "out" (written) or "inout" (read and written in place).
    present: None (always required), True (may be None), the name of a bool descriptor
    field that says whether it is passed (a passed operand is then an error when the field
    is False, and a missing one when it is True), or a callable ``desc -> rule`` returning
    None (required), True (may be None) or False (must be None).
    distinct: for outputs and in-place operands, the operand names it must not overlap
    (True: every input).
    contiguous / alignment: layout requirements (alignment defaults to the itemsize).
    """

    name: str
    shape: Any
    dtype: Any = "dtype"
    role: str = "in"
    present: Any = None
    distinct: Any = ()
    contiguous: bool = True
    alignment: int | None = None


def In(name: str, shape: Any, dtype: Any = "dtype", **kw: Any) -> Operand:  # noqa: N802
    return Operand(name, shape, dtype, "in", **kw)


def Out(name: str, shape: Any, dtype: Any = "dtype", *, distinct: Any = True,  # noqa: N802
        **kw: Any) -> Operand:
    return Operand(name, shape, dtype, "out", distinct=distinct, **kw)


def InOut(name: str, shape: Any, dtype: Any = "dtype", **kw: Any) -> Operand:  # noqa: N802
    return Operand(name, shape, dtype, "inout", **kw)


@dataclass(frozen=True)
class Scalar:
    """A per-call value passed with the args (lr, step, a clip factor, a seed)."""

    name: str
    default: Any = _REQUIRED


# -- the spec -----------------------------------------------------------------------------


class OpSpec:
    """The declaration of one op family (see the module docstring)."""

    def __init__(self, op: str, *, fields: Sequence[Field], operands: Sequence[Operand],
                 scalars: Sequence[Scalar] = (), empty: Sequence[str] | Callable | None = None
                 ) -> None:
        self.op = op
        self.fields = tuple(fields)
        self.operands = tuple(operands)
        self.scalars = tuple(scalars)
        self.empty = empty
        names = [f.name for f in self.fields]
        arg_names = [o.name for o in self.operands] + [s.name for s in self.scalars]
        for group in (names, arg_names):
            dup = {n for n in group if group.count(n) > 1}
            if dup:
                raise ValueError(f"{op}: spec declares {sorted(dup)} twice")
        self.field_names = tuple(names)
        self.inputs = tuple(o.name for o in self.operands if o.role != "out")
        self.outputs = tuple(o.name for o in self.operands if o.role != "in")
        self._fields_by_name = {f.name: f for f in self.fields}
        self.descriptor_cls: type | None = None
        self.args_cls: type | None = None
        #: every operand absent: what `make_args` starts from.
        self._absent = {o.name: None for o in self.operands}

    def make_args(self, **kw: Any) -> Any:
        """The args object from keywords, absent operands None whatever their position."""
        return self.args_cls(**{**self._absent, **kw})

    # -- class generation ------------------------------------------------------------------
    def descriptor(self, name: str, doc: str = "", module: str | None = None) -> type:
        """A frozen dataclass with one field per declared Field, in order."""
        cls = dataclasses.make_dataclass(
            name, [_dc_field(f.name, f.default) for f in self.fields],
            frozen=True, slots=True, namespace={"__doc__": doc or f"Descriptor of {self.op}."})
        cls.__module__ = module or _caller_module()
        self.descriptor_cls = self.descriptor_cls or cls
        return cls

    def args(self, name: str, doc: str = "", module: str | None = None) -> type:
        """A dataclass of the operands, then the scalars. Optional operands and scalars with
        a default keep it when every later argument has one too (Python's rule); an
        optional operand before a required one is passed explicitly (None when absent)."""
        entries = [(o.name, None if o.present is not None else _REQUIRED)
                   for o in self.operands] + [(s.name, s.default) for s in self.scalars]
        specs, defaults_ok = [], True
        for arg, default in reversed(entries):
            defaults_ok = defaults_ok and default is not _REQUIRED
            specs.append(_dc_field(arg, default if defaults_ok else _REQUIRED))
        cls = dataclasses.make_dataclass(
            name, specs[::-1], slots=True,
            namespace={"__doc__": doc or f"Arguments of {self.op}."})
        cls.__module__ = module or _caller_module()
        self.args_cls = self.args_cls or cls
        return cls

    # -- checks ----------------------------------------------------------------------------
    def check_descriptor(self, op: str, desc: Any) -> None:
        for f in self.fields:
            f.check(op, getattr(desc, f.name))

    def resolve(self, op: str, desc: Any) -> Resolved:
        """Every operand's concrete shape and dtype(s) for `desc` (done once per plan)."""
        return Resolved(op, self, desc)


def _dc_field(name: str, default: Any) -> tuple:
    if default is _REQUIRED:
        return (name, Any)
    return (name, Any, dataclasses.field(default=default))


def _caller_module() -> str:
    import sys
    return sys._getframe(2).f_globals.get("__name__", __name__)


def _dtypes(allowed: Any) -> tuple:
    return tuple(as_dtype(a) for a in allowed)


def _eval_extent(entry: Any, desc: Any, env: dict) -> int:
    if isinstance(entry, (int, np.integer)) and not isinstance(entry, bool):
        return int(entry)
    if isinstance(entry, str):
        if entry in env:
            return int(env[entry])
        return int(eval(entry, {"__builtins__": {}, "prod": math.prod}, env))  # noqa: S307
    return int(entry(desc))


class Resolved:
    """Operands of one descriptor resolved to concrete shapes and dtypes, with the per-call
    check. ``rows`` holds one tuple per operand:
    (name, shape, dtype or None, allowed dtypes, required, present, contiguous, alignment).
    """

    __slots__ = ("op", "spec", "rows", "shapes", "dtypes", "distinct", "empty", "allocatable",
                 "given_rows", "given_distinct")

    def __init__(self, op: str, spec: OpSpec, desc: Any) -> None:
        self.op, self.spec = op, spec
        env = {f: getattr(desc, f) for f in spec.field_names}
        rows, shapes, dtypes = [], {}, {}
        for o in spec.operands:
            if callable(o.shape):
                shape = tuple(int(e) for e in o.shape(desc))
            else:
                shape = tuple(_eval_extent(e, desc, env) for e in o.shape)
            allowed = self._allowed(o, desc)
            rule = o.present(desc) if callable(o.present) else o.present
            if rule is None:
                present = True
            elif rule is True:
                present = None  # either
            elif isinstance(rule, str):
                present = bool(getattr(desc, rule))
            else:  # a callable's verdict: False (must be None) / True (required)
                present = bool(rule)
            one = allowed[0] if len(allowed) == 1 else None
            rows.append((o.name, shape, one, allowed, present, o.contiguous, o.alignment))
            shapes[o.name], dtypes[o.name] = shape, one
        self.rows = tuple(rows)
        self.shapes, self.dtypes = shapes, dtypes
        self.distinct = tuple(
            (o.name, tuple(n for n in (spec.inputs if o.distinct is True else o.distinct)
                           if n != o.name))
            for o in spec.operands if o.role != "in" and o.distinct)
        self.empty = self._is_empty(spec, desc, env)
        #: outputs `call` allocates when not passed: required, of one known dtype.
        self.allocatable = tuple(r[0] for r in rows if r[0] in spec.outputs and r[4] is True
                                 and r[2] is not None)
        # What is left to check when `call` allocated every allocatable output itself (right
        # by construction, overlapping nothing): the operands the caller gave.
        self.given_rows = tuple(r for r in self.rows if r[0] not in self.allocatable)
        self.given_distinct = tuple(p for p in self.distinct if p[0] not in self.allocatable)

    @staticmethod
    def _allowed(o: Operand, desc: Any) -> tuple:
        rule = o.dtype
        if callable(rule) and not isinstance(rule, type):
            rule = rule(desc)
        if rule == INDEX:
            return INDEX_DTYPES
        if isinstance(rule, str):
            return (as_dtype(getattr(desc, rule)),)
        if isinstance(rule, (tuple, list)):
            return _dtypes(rule)
        return (as_dtype(rule),)

    def _is_empty(self, spec: OpSpec, desc: Any, env: dict) -> bool:
        if spec.empty is None:  # nothing to write: every output has no element
            outs = [self.shapes[n] for n in spec.outputs if self._present(n) is not False]
            return bool(outs) and all(math.prod(s) == 0 for s in outs)
        if callable(spec.empty):
            return bool(spec.empty(desc))
        return any(_eval_extent(e, desc, env) == 0 for e in spec.empty)

    def _present(self, name: str) -> bool | None:
        for row in self.rows:
            if row[0] == name:
                return row[4]
        raise KeyError(name)

    # -- the per-call check ----------------------------------------------------------------
    def check(self, args: Any, stream: Any, fresh: bool = False) -> str | None:
        """Raise the first operand error of `args` for a plan on `stream`; return the index
        dtype's short name when an INDEX operand is present (else None). ``fresh``: the
        allocatable outputs were just allocated from this plan's shapes (`execute.call`);
        only the other operands are checked.

        The common case (right array type, shape, dtype object and layout) costs a few
        attribute reads per operand; anything else goes through `_explain`, which raises
        the precise error or accepts an equal-but-not-identical dtype.
        """
        host = stream.is_host
        cuda, device_id = stream.kind == "cuda", stream.device_id
        array_type = _array_type(stream.kind)
        index = None
        for name, shape, dtype, allowed, present, contiguous, align in (
                self.given_rows if fresh else self.rows):
            try:
                a = getattr(args, name)
            except AttributeError:
                raise InvalidProblem(describe(self.op, "args", f"args with an operand '{name}'",
                                              type(args).__name__)) from None
            if a is None:
                if present:
                    raise InvalidProblem(describe(self.op, name, "an array", "None"))
                continue
            if present is False:
                raise InvalidProblem(describe(self.op, name, "None (the descriptor declares "
                                                             "it absent)", "an array"))
            if type(a) is not array_type:
                _check_side(self.op, name, a, stream)
            if cuda and a.data.device_id != device_id:
                raise InvalidProblem(describe(self.op, name, f"an array on device {device_id}",
                                              f"one on device {a.data.device_id}"))
            if not (a.shape == shape and (a.dtype is dtype or a.dtype in allowed)) or (
                    contiguous and not a.flags.c_contiguous):
                self._explain(name, a, shape, allowed, contiguous)
            if dtype is None and allowed is INDEX_DTYPES:
                index = "i32" if a.dtype.itemsize == 4 else "i64"
            if host:
                if align is None and a.flags.aligned:
                    continue
            elif not a.size or a.data.ptr % (align or a.dtype.itemsize) == 0:
                continue
            _check_alignment(self.op, name, a, align)
        for out, inputs in self.given_distinct if fresh else self.distinct:
            o = getattr(args, out)
            if o is None or not o.size:
                continue
            for iname in inputs:
                i = getattr(args, iname)
                if i is not None and i.size and _overlap(o, i, host):
                    raise InvalidProblem(describe(self.op, out,
                                                  f"a buffer distinct from '{iname}'",
                                                  "an overlapping buffer"))
        return index

    def _explain(self, name: str, a: Any, shape: tuple, allowed: tuple,
                 contiguous: bool) -> None:
        adt = as_dtype(a.dtype)
        if adt not in allowed:
            names = " or ".join(short_name(x) for x in allowed)
            raise Unsupported(describe(self.op, name, f"dtype {names}", short_name(adt)))
        a_shape = tuple(a.shape)
        if a_shape != shape:
            need = math.prod(shape)
            if a.size < need:
                from gpuplan.errors import BufferTooSmall
                raise BufferTooSmall(
                    describe(self.op, name, f"at least {need} elements (shape {shape})",
                             f"{a.size} elements (shape {a_shape})"))
            raise InvalidProblem(describe(self.op, name, f"shape {shape}", f"shape {a_shape}"))
        if contiguous and not a.flags.c_contiguous:
            raise InvalidProblem(describe(self.op, name, "a C-contiguous array",
                                          "a strided view"))


_ARRAY_TYPES: dict[str, type] = {}


def _array_type(kind: str) -> type:
    """The array class of plans on a stream of `kind` (np.ndarray, cupy.ndarray, ...)."""
    t = _ARRAY_TYPES.get(kind)
    if t is None:
        if kind == "cpu":
            t = np.ndarray
        elif kind == "emulated":
            from gpuplan.emulator.array import EmulatedArray
            t = EmulatedArray
        else:
            from gpuplan import backend
            t = backend.cupy_module().ndarray
        _ARRAY_TYPES[kind] = t
    return t


_SIDE = {"cpu": "host (NumPy)", "cuda": "device (CuPy)", "emulated": "emulated-device"}


def _check_side(op: str, name: str, a: Any, stream: Any) -> None:
    """InvalidProblem unless `a` is an array living where the plan's stream runs."""
    from gpuplan import backend
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise InvalidProblem(describe(op, name, "an array", type(a).__name__))
    where = backend.device_of(a)
    if where != stream.kind:
        raise InvalidProblem(describe(op, name, f"a {_SIDE[stream.kind]} array to match the "
                                                f"plan's stream", _SIDE[where]))


def _overlap(a: Any, b: Any, host: bool) -> bool:
    if host:
        return bool(np.may_share_memory(a, b))
    a0, b0 = a.data.ptr, b.data.ptr
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


def _check_alignment(op: str, name: str, a: Any, align: int | None) -> None:
    from gpuplan.errors import MisalignedOperand
    align = align or a.dtype.itemsize
    if isinstance(a, np.ndarray):
        if a.dtype.alignment % align == 0 and a.flags.aligned:
            return
        ptr = a.ctypes.data
    else:
        ptr = a.data.ptr
    if a.size and ptr % align:
        raise MisalignedOperand(describe(op, name, f"an address aligned to {align} bytes",
                                         f"{ptr:#x}"))
