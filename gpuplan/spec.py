"""Declared op specs: a family states its fields, operands and run scalars once; the
descriptor and args classes, descriptor checks, operand checks, emptiness and the error
messages are derived from that declaration.

    SPEC = OpSpec(
        "layer_norm",
        fields=(Extent("rows"), Extent("cols"), Real("eps", lo=0.0, default=1e-5),
                Flag("has_weight", default=True), DType("dtype", FLOAT_DTYPES)),
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
`Plan` resolves every operand once per descriptor (`gpuplan.resolve.Resolved`) and checks
a call's arrays against that: a shape, dtype and layout comparison per operand, the
precise error message built only when a check fails.
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
#: The largest extent any descriptor takes: element counts and byte offsets stay int64.
_EXTENT_MAX = 2**62


class _NotGiven:
    """The default of a required Args field that follows an optional one (see OpSpec.args)."""

    def __repr__(self) -> str:
        return "<not given>"


_NOT_GIVEN = _NotGiven()


def _require(cls_name: str, names: tuple[str, ...]) -> Callable[[Any], None]:
    """An Args ``__post_init__`` refusing a required argument left out. Generated as one
    ``is`` test per name (Args are built on every plan call: no loop, no getattr)."""
    test = " or ".join(f"self.{n} is _NOT_GIVEN" for n in names)  # names: identifiers
    scope = {"_NOT_GIVEN": _NOT_GIVEN, "_refuse": _refuse}
    exec(f"def post_init(self):\n    if {test}:\n        _refuse(self, {cls_name!r}, "
         f"{names!r})\n", scope)
    post_init = scope["post_init"]
    #: it refuses the marker only (a caller setting every field to a value may skip it).
    post_init.only_markers = True
    return post_init


def _refuse(args: Any, cls_name: str, names: tuple[str, ...]) -> None:
    for n in names:
        if getattr(args, n) is _NOT_GIVEN:
            raise InvalidProblem(describe(cls_name, n, "a value (a required argument)", "none"))
#: the default of a field or scalar the caller must pass.
REQUIRED = _REQUIRED

#: dtype rule of an index operand: int32 or int64, whichever the array has.
INDEX = "index"
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# -- descriptor fields --------------------------------------------------------------------


def _dtypes(allowed: Any) -> tuple:
    return tuple(as_dtype(a) for a in allowed)


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
    """An int size, at least ``min`` (0) and at most ``max`` (no bound when None)."""

    min: int = 0
    max: int | None = None

    def check(self, op: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InvalidProblem(describe(op, self.name, "an int extent", repr(value)))
        if value < self.min:
            raise InvalidProblem(describe(op, self.name, f"an extent >= {self.min}", value))
        if self.max is not None and value > self.max:
            raise Unsupported(describe(op, self.name, f"an extent <= {self.max}", value))
        if value > _EXTENT_MAX:  # sizes and offsets are int64 everywhere below
            raise Unsupported(describe(op, self.name, "an extent <= 2**62", value))


@dataclass(frozen=True)
class Index(Field):
    """An int that may be negative, or None when the default is None (padding_idx...). It
    must fit int64: kernels take it as a ``long long``."""

    def check(self, op: str, value: Any) -> None:
        if value is None and self.default is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InvalidProblem(describe(op, self.name, "an int", repr(value)))
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise InvalidProblem(describe(op, self.name, "an int in the int64 range", value))


@dataclass(frozen=True)
class Shape(Field):
    """A tuple of extents (a tuple: descriptors are hashed)."""

    def check(self, op: str, value: Any) -> None:
        if not isinstance(value, tuple) or any(
                isinstance(e, bool) or not isinstance(e, (int, np.integer)) or e < 0
                for e in value):
            raise InvalidProblem(describe(op, self.name, "a tuple of extents >= 0", value))


@dataclass(frozen=True)
class DType(Field):
    """A dtype from `allowed` (Unsupported otherwise)."""

    allowed: tuple = ()

    def check(self, op: str, value: Any) -> None:
        try:  # None is no dtype here (np.dtype(None) would silently be float64)
            d = None if value is None else as_dtype(value)
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
    """A finite real number fixed for the plan's life (eps, a fixed scale), within
    [lo, hi] when those are given."""

    lo: float | None = None
    hi: float | None = None

    def check(self, op: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                             np.floating)):
            raise InvalidProblem(describe(op, self.name, "a real number", repr(value)))
        if not math.isfinite(value):
            raise InvalidProblem(describe(op, self.name, "a finite number", value))
        lo, hi = self.lo, self.hi
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            want = (f"a number in [{lo}, {hi}]" if lo is not None and hi is not None
                    else f"a number >= {lo}" if lo is not None else f"a number <= {hi}")
            raise InvalidProblem(describe(op, self.name, want, value))


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
    """A per-call value passed with the args (lr, step, a clip factor, a seed).

    A declared range is checked on every call, before anything is written
    (`gpuplan.resolve.Resolved.check`): kind "real" (a finite real number, NaN and inf
    rejected) or "int" (an integer, bools rejected), within [lo, hi] (or [lo, hi) with
    hi_open) where given. kind None: the family checks the value itself (flags, lists)."""

    name: str
    default: Any = _REQUIRED
    kind: str | None = None
    lo: float | None = None
    hi: float | None = None
    hi_open: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (None, "real", "int"):
            raise ValueError(f"Scalar {self.name!r}: kind None, 'real' or 'int', given "
                             f"{self.kind!r}")

    def check(self, op: str, value: Any) -> None:
        """InvalidProblem naming op, the scalar, its declared range and `value` unless
        `value` is of the declared kind and within the range."""
        integer = self.kind == "int"
        ok = not isinstance(value, bool) and isinstance(
            value, (int, np.integer) if integer else (int, float, np.integer, np.floating))
        if ok and not integer:
            ok = math.isfinite(value)
        if ok:
            lo, hi = self.lo, self.hi
            ok = (lo is None or value >= lo) and (
                hi is None or (value < hi if self.hi_open else value <= hi))
        if not ok:
            raise InvalidProblem(describe(op, self.name, self.expected(), repr(value)))

    def expected(self) -> str:
        """The declared range in words: 'a finite number in [0.0, 1.0)', 'an integer >= 1'."""
        lo, hi = _bound(self.lo), _bound(self.hi)
        if self.kind == "int":
            if lo is not None and hi is not None:
                return f"an integer in [{lo}, {hi}{')' if self.hi_open else ']'}"
            return ("an integer" + (f" >= {lo}" if lo is not None else "")
                    + (f" {'<' if self.hi_open else '<='} {hi}" if hi is not None else ""))
        if lo is None and hi is None:
            return "a finite number"
        return (f"a finite number in {'(-inf' if lo is None else f'[{lo}'}, "
                f"{'inf)' if hi is None else f'{hi}' + (')' if self.hi_open else ']')}")


def _bound(v: float | None) -> str | None:
    """A range bound as written in messages: 2**64 rather than its 20 digits."""
    if v is None:
        return None
    if isinstance(v, int) and v >= 2**32 and v & (v - 1) == 0:
        return f"2**{v.bit_length() - 1}"
    return str(v)


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
        self.args_take_any = False
        #: every operand absent: what `make_args` starts from.
        self._absent = {o.name: None for o in self.operands}

    def make_args(self, **kw: Any) -> Any:
        """The args object from keywords, absent operands None whatever their position."""
        try:
            return self.args_cls(**{**self._absent, **kw})
        except TypeError:
            names = [o.name for o in self.operands] + [s.name for s in self.scalars]
            unknown = sorted(set(kw) - set(names))
            missing = [s.name for s in self.scalars
                       if s.default is _REQUIRED and s.name not in kw]
            raise InvalidProblem(describe(
                self.op, "args", f"operands and scalars among {names}",
                f"unknown {unknown}" if unknown else f"no {missing}")) from None

    # -- class generation ------------------------------------------------------------------
    def descriptor(self, name: str, doc: str = "", module: str | None = None) -> type:
        """A frozen dataclass with one field per declared Field, in order (hashed as the
        tuple of its fields, the hash computed once per object: plan caches hash the
        descriptor on every call)."""
        cls = dataclasses.make_dataclass(
            name, [_dc_field(f.name, f.default) for f in self.fields], bases=(_Descriptor,),
            frozen=True, slots=True,
            namespace={"__doc__": doc or f"Descriptor of {self.op}.",
                       "__hash__": _field_hash(self.field_names)})
        cls.__module__ = module or _caller_module()
        self.descriptor_cls = self.descriptor_cls or cls
        return cls

    def args(self, name: str, doc: str = "", module: str | None = None) -> type:
        """A dataclass of the operands, then the scalars, in that order (positional calls
        keep their meaning). Optional operands are optional (default None) and scalars keep
        their defaults. A required argument after one with a default (``AdamWArgs``' ``lr``
        after the optional ``param_lowp``) defaults to a marker, and constructing the class
        without it raises InvalidProblem naming it, so ``AdamWArgs(p, g, m, v, lr=...,
        step=...)`` needs no ``param_lowp``."""
        entries = [(o.name, None if o.present is not None else _REQUIRED)
                   for o in self.operands] + [(s.name, s.default) for s in self.scalars]
        specs, marked, seen_default = [], [], False
        for arg, default in entries:
            if default is _REQUIRED and seen_default:
                specs.append(_dc_field(arg, _NOT_GIVEN))
                marked.append(arg)
                continue
            seen_default = seen_default or default is not _REQUIRED
            specs.append(_dc_field(arg, default))
        namespace: dict[str, Any] = {"__doc__": doc or f"Arguments of {self.op}."}
        if marked:
            namespace["__post_init__"] = _require(name, tuple(marked))
        cls = dataclasses.make_dataclass(name, specs, slots=True, namespace=namespace)
        cls.__module__ = module or _caller_module()
        if self.args_cls is None:
            self.args_cls = cls
            #: every optional operand has a default (None): ``args_cls(**kw)`` needs no
            #: `_absent` merge when kw holds the required ones.
            self.args_take_any = True
        return cls

    # -- checks ----------------------------------------------------------------------------
    def check_descriptor(self, op: str, desc: Any) -> None:
        for f in self.fields:
            f.check(op, getattr(desc, f.name))


class _Descriptor:
    """Base of the descriptor dataclasses: a slot for the hash, once computed."""

    __slots__ = ("_hash",)


def _field_hash(names: tuple[str, ...]) -> Callable[[Any], int]:
    """A descriptor's __hash__: that of the tuple of its fields `names` (the dataclass
    default's value), remembered in the object (frozen: the fields never change)."""
    def __hash__(self: Any) -> int:
        try:
            return self._hash
        except AttributeError:
            h = hash(tuple([getattr(self, n) for n in names]))
            object.__setattr__(self, "_hash", h)
            return h

    return __hash__


def _dc_field(name: str, default: Any) -> tuple:
    if default is _REQUIRED:
        return (name, Any)
    return (name, Any, dataclasses.field(default=default))


def _caller_module() -> str:
    import sys
    return sys._getframe(2).f_globals.get("__name__", __name__)
