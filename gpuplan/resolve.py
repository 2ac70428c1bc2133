"""Operands of one descriptor resolved to concrete shapes and dtypes, and the per-call check
every plan runs on its args (see gpuplan.spec for the declarations it is built from)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gpuplan.dtypes import as_dtype, short_name
from gpuplan.errors import BufferTooSmall, InvalidProblem, MisalignedOperand, Unsupported, describe
from gpuplan.spec import INDEX, INDEX_DTYPES, Operand, OpSpec, _dtypes


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
    (name, shape, dtype or None, allowed dtypes, present, contiguous, alignment, written),
    `present` being True (required), None (optional) or False (must be None) and `written`
    True for outputs and in-place operands.
    """

    __slots__ = ("op", "spec", "rows", "shapes", "dtypes", "distinct", "empty", "allocatable",
                 "given_rows", "given_distinct", "ranged", "host_rows", "host_absent")

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
            rows.append((o.name, shape, one, allowed, present, o.contiguous, o.alignment,
                         o.role != "in"))
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
        #: scalars declared with a kind (and range): checked on every call.
        self.ranged = tuple(s for s in spec.scalars if s.kind is not None)
        #: (name, shape, dtype) of the given operands when the whole check of a fresh host
        #: call (`check(..., fresh=True)`) comes down to "each is a NumPy array of this shape
        #: and dtype, C-contiguous, aligned and writable" (every one required, of one
        #: dtype, contiguous, asking no alignment beyond its dtype's; no scalar range, no
        #: overlap rule but on absent outputs): `execute.call` tests that in a few steps
        #: (a read-only input fails it and takes the full check, which accepts it), else
        #: None. `host_absent`: the given operands declared absent (they must be None).
        self.host_rows = self.host_absent = None
        absent = {r[0] for r in self.given_rows if r[4] is False}
        if not self.ranged and all(p[0] in absent for p in self.given_distinct) and all(
                r[4] is False or (r[2] is not None and r[4] is True and r[5] and r[6] is None)
                for r in self.given_rows):
            self.host_rows = tuple((r[0], r[1], r[2]) for r in self.given_rows if r[4])
            self.host_absent = tuple(r[0] for r in self.given_rows if r[4] is False)

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
        for s in self.ranged:  # declared scalar ranges (a NaN lr): before anything runs
            s.check(self.op, getattr(args, s.name))
        kind = stream._kind  # slots read directly: this runs on every plan call
        host, cuda, device_id = kind == "cpu", kind == "cuda", stream._device_id
        array_type = _ARRAY_TYPES.get(kind) or array_type_of(kind)
        index = None
        for name, shape, dtype, allowed, present, contiguous, align, written in (
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
            if written and not cuda and not a.flags.writeable:  # (CuPy arrays always are)
                raise InvalidProblem(describe(self.op, name, "a writable array",
                                              "a read-only one"))
            if host:
                if align is None and a.flags.aligned:
                    continue
            elif not a.size or a.data.ptr % (align or a.dtype.itemsize) == 0:
                continue
            check_alignment(self.op, name, a, align)
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
                raise BufferTooSmall(
                    describe(self.op, name, f"at least {need} elements (shape {shape})",
                             f"{a.size} elements (shape {a_shape})"))
            raise InvalidProblem(describe(self.op, name, f"shape {shape}", f"shape {a_shape}"))
        if contiguous and not a.flags.c_contiguous:
            raise InvalidProblem(describe(self.op, name, "a C-contiguous array",
                                          "a strided view"))


_ARRAY_TYPES: dict[str, type] = {}


def array_type_of(kind: str) -> type:
    """The array class of plans on a stream of `kind` (np.ndarray, cupy.ndarray, ...)."""
    t = _ARRAY_TYPES.get(kind)
    if t is None:
        from gpuplan import devices

        t = _ARRAY_TYPES[kind] = devices.get(kind).array_type()
    return t


_SIDE = {"cpu": "host (NumPy)", "cuda": "device (CuPy)", "emulated": "emulated-device"}


def _check_side(op: str, name: str, a: Any, stream: Any) -> None:
    """InvalidProblem unless `a` is an array living where the plan's stream runs."""
    from gpuplan import backend
    if not isinstance(a, (np.ndarray, np.generic)) and not backend.is_device_array(a):
        # (an object with shape and dtype that is no array would fail deep inside a plan)
        raise InvalidProblem(describe(op, name, "an array (NumPy, CuPy or emulated-device)",
                                      type(a).__name__))
    where = backend.device_of(a)
    if where != stream.kind:
        raise InvalidProblem(describe(op, name, f"a {_SIDE[stream.kind]} array to match the "
                                                f"plan's stream", _SIDE[where]))


def _overlap(a: Any, b: Any, host: bool) -> bool:
    if host:
        return bool(np.may_share_memory(a, b))
    a0, b0 = a.data.ptr, b.data.ptr
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


def check_alignment(op: str, name: str, a: Any, align: int | None) -> None:
    """MisalignedOperand unless `a`'s address is a multiple of `align` (default: its
    itemsize); NumPy arrays answer from flags.aligned when that settles it."""
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
