"""The plan base: select a kernel SKU for a descriptor, validate operands, run it.

A plan family subclasses `Plan` and provides:

- ``op``: the op name used in SKUs and error messages;
- ``spec``: its `gpuplan.spec.OpSpec` (fields, operands, scalars): the descriptor checks,
  the operand checks (`can_implement`) and emptiness are derived from it;
- ``_candidates(desc, stream)``: the SKUs able to run it on `stream`, best first;
- ``_run_<variant>(stream, ws, args)`` for every variant it offers;
- optionally ``_check_descriptor(desc)`` (call super) and ``_check_args(args)`` for the
  cross-field rules a declaration cannot state, ``_prepare()`` to derive per-plan
  launch constants once (it runs in ``__init__``, after the operands are resolved), and
  ``_host_producer()`` for a host body that can allocate its own outputs (`_host_call`).

`select` filters the candidates by the `PlanPreference`; `run` calls `can_implement`
first, so a rejected call writes nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from gpuplan import backend
from gpuplan.dtypes import as_dtype, short_name
from gpuplan.errors import (
    BufferTooSmall,
    InvalidProblem,
    Unsupported,
    WorkspaceTooSmall,
    describe,
)
from gpuplan.resolve import Resolved, check_alignment
from gpuplan.spec import _REQUIRED, OpSpec
from gpuplan.stream import Stream, Workspace


class BackendKind(enum.Enum):
    NUMPY = "numpy"
    NVRTC = "nvrtc"
    CUBLAS = "cublas"


@dataclass(frozen=True)
class PlanPreference:
    """What the caller wants from `select`: a workspace cap, determinism, a forced backend."""

    max_workspace_bytes: int | None = None
    deterministic: bool = False
    backend: BackendKind | None = None


@dataclass(frozen=True)
class PrecisionGuarantee:
    """What a SKU promises about its arithmetic.

    math_precision: dtype the inputs are rounded to before multiply/add ('f32', 'bf16', ...).
    accumulator: dtype of sums.  deterministic: the same inputs give the same bits on the
    same device and launch shape.  bit_stable: the result bits do not depend on the device,
    the launch shape or the scheduling (for example: no atomics, fixed reduction order).
    """

    math_precision: str
    accumulator: str
    deterministic: bool
    bit_stable: bool


@dataclass(frozen=True)
class KernelSku:
    """Identity of a selected kernel: op, category, dtype, index dtype, backend, arch, variant."""

    op: str
    category: str
    dtype: str
    index_dtype: str | None
    backend: BackendKind
    arch: str
    variant: str

    def __str__(self) -> str:
        idx = f",{self.index_dtype}" if self.index_dtype else ""
        where = self.arch if self.arch in ("host", "emulated") else f"sm_{self.arch}"
        return f"{self.op}.{self.variant}[{self.dtype}{idx}]@{self.backend.value}/{where}"


@dataclass(frozen=True)
class Candidate:
    """One SKU a plan family can run for a descriptor (what `select` chooses among)."""

    variant: str
    backend: BackendKind
    deterministic: bool
    bit_stable: bool
    math_precision: str
    accumulator: str
    workspace_bytes: int = 0
    min_compute_capability: int = 0  # e.g. 80 for mma.sync / cp.async kernels


def elementwise_candidates(dtype: Any, stream: Any) -> list[Candidate]:
    """An elementwise family's SKUs: the NumPy one on the host, else the NVRTC "map" kernel
    (deterministic, bit-stable; halves computed in their accumulator type)."""
    if stream.is_host:
        return [host_candidate(dtype)]
    d = as_dtype(dtype)
    acc = "f32" if d.itemsize <= 2 else short_name(d)
    return [Candidate("map", BackendKind.NVRTC, True, True, short_name(d), acc)]


def host_candidate(dtype: Any, variant: str = "numpy") -> Candidate:
    """The NumPy reference SKU: deterministic and bit-stable, accumulating as the kernels do."""
    d = as_dtype(dtype)
    acc = "f32" if d.itemsize <= 2 else short_name(d)
    return Candidate(variant, BackendKind.NUMPY, True, True, short_name(d), acc)


class Plan:
    """Base of every plan family (see the module docstring for the subclass contract)."""

    op: ClassVar[str] = "plan"
    category: ClassVar[str] = "generic"
    spec: ClassVar[OpSpec]

    def __init__(self, stream: Stream, desc: Any, candidate: Candidate) -> None:
        self._stream = stream
        self.desc = desc
        self._cand = candidate
        self._run_impl = getattr(self, f"_run_{candidate.variant}")
        self._index_dtype: str | None = None
        # Every operand's concrete shape and dtype(s) for `desc`, resolved once per plan.
        self._resolved = r = Resolved(self.op, self.spec, desc)
        #: (name, shape, dtype) of the outputs `execute.call` allocates, and the allocator of
        #: this plan's device: resolved here, not on every call.
        self._allocs = tuple((n, r.shapes[n], r.dtypes[n]) for n in r.allocatable)
        self._empty = _namespace(stream._kind).empty
        #: whether the family adds cross-operand rules (`_check_args`) to the declared checks.
        self._checks_args = type(self)._check_args is not Plan._check_args
        #: what `execute.call` needs to check, and may skip, on the host (see there): the
        #: given operands' short check (Resolved.host_rows, host_absent; None: none), and
        #: whether the run then comes down to `_run_impl` (no cross-operand rule, no
        #: workspace, not empty).
        host = stream._kind == "cpu"
        self._host_rows = r.host_rows if host else None
        self._host_absent = r.host_absent
        self._direct = not (self._checks_args or candidate.workspace_bytes or r.empty)
        self._prepare()
        #: `execute.call`'s whole host call when it comes down to the short check and
        #: `_run_impl` (see `_host_call`): (by keywords, by position), else None.
        self._host_call = _host_call(self) if host and self._direct else None

    def _prepare(self) -> None:
        """Derive per-plan launch constants from ``self.desc`` (once, at select)."""

    def _host_producer(self) -> Any:
        """Optionally, for the host call (`_host_call`): a function of the given operands
        (declaration order) returning the outputs `_run_impl` would write into fresh ones,
        allocated by itself (same shapes and dtypes, C-contiguous, overlapping no operand:
        a NumPy ufunc without ``out=`` spares the host call its empty and its args). None
        (the default): the host call allocates the outputs and runs `_run_impl`."""
        return None

    # -- selection -------------------------------------------------------------------
    @classmethod
    def select(cls, stream: Stream, desc: Any, pref: PlanPreference | None = None) -> Plan:
        pref = pref or PlanPreference()
        cls._check_descriptor(desc)
        cands = list(cls._candidates(desc, stream))
        if not cands:
            raise Unsupported(describe(cls.op, "desc", "a supported problem", desc))
        reasons = []
        for cand in cands:
            why = _unavailable(cand, stream) or _rejects(cand, pref)
            if why is None:
                return cls(stream, desc, cand)
            reasons.append(f"{cand.variant}/{cand.backend.value}: {why}")
        where = {"cpu": "host", "cuda": "device"}.get(stream.kind, stream.kind + " device")
        raise Unsupported(
            f"{cls.op}: argument 'pref': expected a preference some {where} SKU meets, "
            f"given {pref} (" + "; ".join(reasons) + ")"
        )

    @classmethod
    def _check_descriptor(cls, desc: Any) -> None:
        for name in cls.spec.field_names:
            if not hasattr(desc, name):
                want = getattr(cls.spec.descriptor_cls, "__name__", "descriptor")
                raise InvalidProblem(describe(cls.op, "desc", f"a {want}",
                                              type(desc).__name__))
        cls.spec.check_descriptor(cls.op, desc)

    @classmethod
    def _candidates(cls, desc: Any, stream: Stream) -> Sequence[Candidate]:
        raise NotImplementedError

    # -- queries ----------------------------------------------------------------------
    def workspace_size(self) -> int:
        return self._cand.workspace_bytes

    def sku(self) -> KernelSku:
        return KernelSku(
            op=self.op,
            category=self.category,
            dtype=short_name(self._sku_dtype()),
            index_dtype=self._sku_index_dtype(),
            backend=self._cand.backend,
            arch=self._stream.arch,
            variant=self._cand.variant,
        )

    def _sku_dtype(self) -> Any:
        return self.desc.dtype

    def _sku_index_dtype(self) -> str | None:
        """Index dtype of the SKU: that of the INDEX operand of the last checked args."""
        return self._index_dtype

    # -- operands ---------------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        """The shape the descriptor gives operand `name`."""
        return self._resolved.shapes[name]

    def alloc(self, name: str) -> Any:
        """A fresh, uninitialised array for operand `name` on this plan's device."""
        dtype = self._resolved.dtypes[name]
        if dtype is None:
            raise InvalidProblem(describe(self.op, name, "an operand of one dtype to allocate",
                                          "one whose dtype comes from the arrays"))
        return self._empty(self._resolved.shapes[name], dtype)

    def precision_guarantee(self) -> PrecisionGuarantee:
        c = self._cand
        return PrecisionGuarantee(c.math_precision, c.accumulator, c.deterministic, c.bit_stable)

    @property
    def stream(self) -> Stream:
        return self._stream

    # -- execution --------------------------------------------------------------------
    def can_implement(self, args: Any) -> None:
        """Raise the right GpuPlanError if `args` does not fit this plan; return None if it does."""
        index = self._resolved.check(args, self._stream)
        if index is not None:
            self._index_dtype = index
        self._check_args(args)

    def _check_args(self, args: Any) -> None:
        """Cross-operand rules a declaration cannot state (none by default)."""

    def run(self, stream: Stream, ws: Workspace | None, args: Any) -> None:
        if stream is not self._stream and (
                stream.is_host != self._stream.is_host
                or (not stream.is_host and stream.device_id != self._stream.device_id)):
            raise InvalidProblem(
                describe(self.op, "stream", f"a stream like the one selected with ({self._stream})",
                         stream)
            )
        self.can_implement(args)
        self._dispatch(stream, ws, args)

    def _run_fresh(self, stream: Stream, ws: Workspace | None, args: Any) -> None:
        """`run` for `execute.call`: `stream` is the plan's own and every allocatable output
        was just allocated from this plan's shapes, so only the given operands are checked."""
        index = self._resolved.check(args, stream, True)
        if index is not None:
            self._index_dtype = index
        self._run_checked(stream, ws, args)

    def _run_checked(self, stream: Stream, ws: Workspace | None, args: Any) -> None:
        """`_run_fresh` once the operands passed the declared checks: the family's own
        rules, then the run."""
        if self._checks_args:
            self._check_args(args)
        if ws is None and not self._cand.workspace_bytes:  # the common case, in line
            if not self._resolved.empty:
                self._run_impl(stream, _NO_WORKSPACE, args)
            return
        self._dispatch(stream, ws, args)

    def _dispatch(self, stream: Stream, ws: Workspace | None, args: Any) -> None:
        need = self._cand.workspace_bytes
        if ws is None:
            ws = _NO_WORKSPACE
        if ws.nbytes < need:
            raise WorkspaceTooSmall(
                describe(self.op, "ws", f">= {need} bytes", f"{ws.nbytes} bytes"))
        if self._resolved.empty:
            return
        self._run_impl(stream, ws, args)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.sku()}>"


_NO_WORKSPACE = Workspace.none()
_NAMESPACES: dict[str, Any] = {}


def _namespace(kind: str) -> Any:
    """The array module (numpy, cupy, ...) of plans on a stream of `kind`."""
    xp = _NAMESPACES.get(kind)
    if xp is None:
        xp = _NAMESPACES[kind] = backend._namespace_for(kind)
    return xp



#: What a host call function returns when its operands are not the ones it runs on its own
#: (a wrong or missing operand, an output passed in): the caller then takes the general
#: path, which checks everything and raises the error naming the operand at fault.
MISS = object()
#: compiled host call sources (they depend on the operand names and counts only).
_HOST_CODE: dict[str, Any] = {}


def _host_call(plan: Plan) -> tuple[Any, Any] | None:
    """A plan's host call, generated: straight-line code doing what `execute.call` does
    for a host call whose operands pass the short check (Resolved.host_rows: every given
    operand a NumPy array of its shape and dtype object, C-contiguous, aligned, writable):
    allocate the outputs, fill the args, `_run_impl`, return the outputs (or return what
    `_host_producer` gives). Anything else (another array type, a shape, dtype or layout
    off, an operand missing, unknown or declared absent, an output passed, a scalar given)
    returns MISS. None when the plan's calls need more than that (a cross-operand rule, a
    workspace, a scalar range or overlap rule, an empty problem, a scalar without a
    default, args other than the spec's dataclass).

    Returned twice: ``by_keywords(ops)`` (the keywords `execute.call` got) and
    ``by_position(*given)`` (the given operands in declaration order, for a family's own
    wrapper)."""
    r = plan._resolved
    rows = r.host_rows
    spec = plan.spec
    if rows is None or r.host_absent or any(s.default is _REQUIRED for s in spec.scalars):
        return None
    given = [name for name, _, _ in rows]
    allocs = [name for name, _, _ in plan._allocs]
    fields = [o.name for o in spec.operands] + [s.name for s in spec.scalars]
    if (not given or sorted(given + allocs) != sorted(o.name for o in spec.operands)
            or any(not n.isidentifier() or n.startswith("_") for n in fields)
            or [f.name for f in dataclasses.fields(spec.args_cls)] != fields):
        return None
    # Generated names start with "_": an operand's name (an identifier without one) is a
    # local of its own.
    scope: dict[str, Any] = {"_ndarray": np.ndarray, "_MISS": MISS, "_empty": plan._empty,
                             "_run": plan._run_impl, "_STREAM": plan._stream,
                             "_NOWS": _NO_WORKSPACE, "_Args": spec.args_cls,
                             "_new": object.__new__}
    tests = []
    for k, (name, shape, dtype) in enumerate(rows):
        scope[f"_S{k}"], scope[f"_D{k}"] = shape, dtype
        tests.append(f"type({name}) is _ndarray and {name}.shape == _S{k} and "
                     f"{name}.dtype is _D{k} and {name}.flags.carray")
    params = ", ".join(given)
    produce = plan._host_producer()
    if produce is not None:
        scope["_produce"] = produce
        body = [f"return _produce({params})"]
    else:
        body = []
        for k, (name, shape, dtype) in enumerate(plan._allocs):
            scope[f"_A{k}"], scope[f"_E{k}"] = shape, dtype
            body.append(f"{name} = _empty(_A{k}, _E{k})")
        values = [o.name for o in spec.operands]
        for k, s in enumerate(spec.scalars):
            scope[f"_V{k}"] = s.default
            values.append(f"_V{k}")
        post_init = getattr(spec.args_cls, "__post_init__", None)
        if post_init is not None and not getattr(post_init, "only_markers", False):
            body.append(f"_args = _Args({', '.join(values)})")
        else:  # every field set to a value: all the dataclass __init__ would do
            body.append("_args = _new(_Args)")
            body += [f"_args.{f} = {v}" for f, v in zip(fields, values, strict=True)]
        outs = spec.outputs
        body.append("_run(_STREAM, _NOWS, _args)")
        body.append("return " + (outs[0] if len(outs) == 1 else ", ".join(outs)))
    test = " and ".join(tests)
    # by_keywords repeats the body rather than calling by_position: one frame less in
    # every execute.call.
    src = "\n".join([
        f"def by_position({params}):",
        f"    if {test}:",
        *("        " + line for line in body),
        "    return _MISS",
        "def by_keywords(ops):",
        f"    if len(ops) == {len(given)}:",
        *(f"        {n} = ops.get({n!r})" for n in given),
        f"        if {test}:",
        *("            " + line for line in body),
        "    return _MISS",
        ""])
    code = _HOST_CODE.get(src)
    if code is None:
        code = _HOST_CODE[src] = compile(src, f"<host call {plan.op}>", "exec")
    exec(code, scope)  # noqa: S102 - names checked above
    return scope["by_keywords"], scope["by_position"]


def _unavailable(cand: Candidate, stream: Stream) -> str | None:
    """Why the stream's device cannot run `cand` (None when it can)."""
    if cand.backend is BackendKind.CUBLAS and not stream.device.has_cublas:
        return f"cuBLAS does not run on the {stream.kind} device"
    if cand.min_compute_capability and stream.kind != "cpu" and \
            stream.compute_capability < cand.min_compute_capability:
        return (f"needs sm_{cand.min_compute_capability}, the device is "
                f"sm_{stream.compute_capability}")
    return None


def _rejects(cand: Candidate, pref: PlanPreference) -> str | None:
    if pref.backend is not None and cand.backend is not pref.backend:
        return f"backend is {cand.backend.value}, {pref.backend.value} requested"
    if pref.deterministic and not cand.deterministic:
        return "not deterministic"
    if pref.max_workspace_bytes is not None and cand.workspace_bytes > pref.max_workspace_bytes:
        return f"needs {cand.workspace_bytes} workspace bytes > {pref.max_workspace_bytes}"
    return None


# -- operand checks shared by every plan family -------------------------------------------


def check_dtype(op: str, name: str, dtype: Any, allowed: Sequence[Any]) -> np.dtype:
    """Unsupported unless `dtype` is one of `allowed`; returns the normalised dtype."""
    d = as_dtype(dtype)
    allowed_d = [as_dtype(a) for a in allowed]
    if d not in allowed_d:
        names = ", ".join(short_name(a) for a in allowed_d)
        raise Unsupported(describe(op, name, f"dtype in ({names})", short_name(d)))
    return d


def check_operand(
    op: str,
    name: str,
    a: Any,
    shape: Sequence[int],
    dtype: Any | Sequence[Any],
    *,
    contiguous: bool = True,
    alignment: int | None = None,
) -> None:
    """Check one operand: present, dtype, size (BufferTooSmall), exact shape, layout, alignment.

    Runs before every plan launch, so the common case (a NumPy or CuPy array of the right
    dtype and shape) takes no NumPy calls beyond attribute reads.
    """
    if a is None or not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise InvalidProblem(describe(op, name, "an array", type(a).__name__))
    shape = _as_shape(shape)
    allowed = dtype if isinstance(dtype, (list, tuple)) else (dtype,)
    adt = a.dtype
    if not any(adt is x for x in allowed) and as_dtype(adt) not in [as_dtype(x) for x in allowed]:
        names = " or ".join(short_name(x) for x in allowed)
        raise Unsupported(describe(op, name, f"dtype {names}", short_name(adt)))
    a_shape = tuple(a.shape)
    if a_shape != shape:
        need = math.prod(shape)
        if a.size < need:
            raise BufferTooSmall(
                describe(op, name, f"at least {need} elements (shape {shape})",
                         f"{a.size} elements (shape {a_shape})")
            )
        raise InvalidProblem(describe(op, name, f"shape {shape}", f"shape {a_shape}"))
    if contiguous and not a.flags.c_contiguous:
        raise InvalidProblem(describe(op, name, "a C-contiguous array", "a strided view"))
    check_alignment(op, name, a, alignment)


def _as_shape(shape: Sequence[int]) -> tuple[int, ...]:
    if type(shape) is tuple and all(type(s) is int for s in shape):
        return shape
    return tuple(int(s) for s in shape)
