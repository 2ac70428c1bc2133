"""The one home of the plan-checking helpers, for the test suite and every family's kernel
cases (`gpuplan/ops/<family>/cases.py`, run by pytest and `scripts/check_kernels.py
--execute`): per-dtype tolerances, device moves, running a plan, comparing with a float64
reference, and a check that a rejected call leaves every output untouched (that one needs
pytest). The references themselves live with their family (`gpuplan/ops/<family>/reference.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import FLOAT_DTYPES, as_dtype, bfloat16, float16, float32, float64, short_name
from gpuplan.spec import REQUIRED

#: (rtol, atol) per dtype for results computed from that dtype's inputs and compared with a
#: float64 reference computed from the same (already rounded) inputs.
TOLERANCES = {
    float64: (1e-12, 1e-12),
    float32: (2e-5, 2e-6),
    float16: (2e-3, 2e-4),
    bfloat16: (1.6e-2, 1e-3),
}


def tol(dtype: Any, scale: float = 1.0) -> tuple[float, float]:
    r, a = TOLERANCES[as_dtype(dtype)]
    return r * scale, a * scale


def random(shape: Sequence[int], dtype: Any, seed: int = 0, low: float = -1.0,
           high: float = 1.0) -> np.ndarray:
    """Host array of `dtype`, uniformly drawn; rounding happens here, once."""
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=tuple(shape)).astype(as_dtype(dtype))


def f64(a: Any) -> np.ndarray:
    """Host float64 copy of any array (bf16/f16/f32/f64, host or device)."""
    return gp.to_host(a).astype(np.float64)


def on(device: str, a: np.ndarray | None) -> Any:
    """Move a host array to 'cpu', 'cuda' or 'emulated'."""
    return None if a is None else gp.to_device(a, device)


def stream_for(device: str) -> gp.Stream:
    device = gp.backend.resolve_device(device)
    if device == "emulated":
        return gp.Stream.emulated()
    return gp.Stream.host() if device == "cpu" else gp.Stream.current()


def assert_close(actual: Any, expected64: np.ndarray, dtype: Any, scale: float = 1.0,
                 err_msg: str = "") -> None:
    """Compare `actual` (any dtype/device) with a float64 reference at the dtype's tolerance."""
    rtol, atol = tol(dtype, scale)
    np.testing.assert_allclose(f64(actual), expected64, rtol=rtol, atol=atol, err_msg=err_msg)


def run_plan(plan_cls: type, desc: Any, args: Any, device: str,
             pref: gp.PlanPreference | None = None) -> gp.Plan:
    """select + allocate workspace + run on the device's stream; returns the plan."""
    stream = stream_for(device)
    plan = plan_cls.select(stream, desc, pref or gp.PlanPreference())
    ws = gp.Workspace.allocate(stream, plan.workspace_size())
    plan.run(stream, ws, args)
    stream.synchronize()
    return plan


def assert_rejected(call: Callable[[], Any], error: type[gp.GpuPlanError],
                    outputs: Sequence[Any], *words: str) -> gp.GpuPlanError:
    """`call` raises `error` whose message names every word in `words`, and the `outputs`
    arrays hold exactly the bytes they held before the call."""
    import pytest

    def raw(o: Any) -> np.ndarray:
        return np.ascontiguousarray(gp.to_host(o)).reshape(-1).view(np.uint8)

    before = [raw(o).copy() for o in outputs]
    with pytest.raises(error) as info:
        call()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"error message {msg!r} lacks {w!r}"
    for o, b in zip(outputs, before, strict=True):
        np.testing.assert_array_equal(raw(o), b)
    return info.value


# -- check_plan: results and every malformed operand a spec implies ----------------------
#
# One check for any spec plan: results against a float64 reference, then every malformed
# operand the spec implies, each rejected with the right error and no output touched.
#
#     check_plan(gp.UnaryPlan, gp.UnaryDescriptor("gelu", 37, dtype), {"x": x},
#                lambda x, alpha: {"y": ref_gelu(x)}, device=device, scale=4)
#
# `inputs` maps operand names to host arrays at the plan's dtypes (inputs, in-place operands,
# and any output whose initial value matters) and scalar names to values; the remaining
# outputs are allocated and filled with a sentinel. `reference` gets every operand (as it was
# before the run) and scalar as float64 host arrays / values and returns the expected float64
# outputs by name (an array when the spec has one output). With `bad_inputs` every operand is
# then replaced, one at a time, by what the spec forbids: a dtype outside its rule, a buffer
# one element short (BufferTooSmall) or long (InvalidProblem), a strided view, an array on the
# other side (host vs device), None when required, a read-only output, and an output
# overlapping an input it must be distinct from. Each call must raise the matching
# GpuPlanError and leave every output and in-place operand byte-identical. Needs pytest.

_SENTINEL = 7


def check_plan(plan_cls: type, desc: Any, inputs: dict[str, Any],
               reference: Callable[..., Any] | None, *, device: str = "cpu",
               scale: float = 1.0, pref: gp.PlanPreference | None = None,
               bad_inputs: bool = True, tolerance_dtype: Any = None) -> gp.Plan:
    """Run, compare with `reference`, then sweep the spec's bad inputs (see the module doc)."""
    stream = stream_for(device)
    plan = plan_cls.select(stream, desc, pref)
    spec = plan.spec
    if spec is None:
        raise TypeError(f"{plan_cls.__name__} has no spec")
    ops = {o.name: o for o in spec.operands}
    host: dict[str, Any] = {}
    for name, o in ops.items():
        if name in inputs:
            host[name] = inputs[name]
        elif o.role == "out" and plan._resolved.dtypes[name] is not None and \
                _required(plan, name):
            host[name] = np.full(plan.shape(name), _SENTINEL, plan._resolved.dtypes[name])
    scalars = {s.name: inputs.get(s.name, s.default) for s in spec.scalars
               if s.name in inputs or s.default is not REQUIRED}
    before = {k: np.array(v, copy=True) for k, v in host.items()}  # in-place operands change
    dev = {k: on(device, np.array(v, copy=True)) for k, v in host.items()}
    ws = gp.Workspace.allocate(stream, plan.workspace_size())
    plan.run(stream, ws, spec.make_args(**dev, **scalars))
    stream.synchronize()
    if reference is not None:
        expected = reference(**{k: f64(v) for k, v in before.items()}, **scalars)
        if not isinstance(expected, dict):
            (only,) = spec.outputs
            expected = {only: expected}
        tdt = tolerance_dtype or desc.dtype
        for name, want in expected.items():
            assert_close(dev[name], want, tdt, scale=scale, err_msg=f"{spec.op}: {name}")
    if bad_inputs:
        sweep_bad_inputs(plan, stream, host, scalars, device)
    return plan


def _required(plan: gp.Plan, name: str) -> bool:
    return any(r[0] == name and r[4] is True for r in plan._resolved.rows)


def sweep_bad_inputs(plan: gp.Plan, stream: gp.Stream, host: dict[str, Any],
                     scalars: dict[str, Any], device: str) -> int:
    """Every malformed variant of every operand: the right error, nothing written.
    Returns how many calls were rejected (so a caller can see the sweep did something)."""
    spec = plan.spec
    ws = gp.Workspace.allocate(stream, plan.workspace_size())
    rejected = 0
    for name, variant, error in _variants(plan, host, device):
        dev = {k: on(device, v) for k, v in host.items()}
        dev[name] = variant
        written = [dev[n] for n in spec.outputs if dev.get(n) is not None and n != name]
        args = spec.make_args(**dev, **scalars)
        assert_rejected(lambda args=args: plan.run(stream, ws, args), error, written, name)
        rejected += 1
    for out, inputs in plan._resolved.distinct:
        for iname in inputs:
            a, o = host.get(iname), host.get(out)
            if a is None or o is None or a.shape != o.shape or a.dtype != o.dtype or not a.size:
                continue
            dev = {k: on(device, v) for k, v in host.items()}
            dev[out] = dev[iname]  # the output IS the input
            others = [dev[n] for n in spec.outputs if n != out and dev.get(n) is not None]
            args = spec.make_args(**dev, **scalars)
            assert_rejected(lambda args=args: plan.run(stream, ws, args), gp.InvalidProblem,
                            others + [dev[iname]], out)
            rejected += 1
    return rejected


def _variants(plan: gp.Plan, host: dict[str, Any], device: str):
    """(operand name, bad array or None, expected error class) for every operand."""
    for name, shape, _dtype, allowed, present, contiguous, _align, written in \
            plan._resolved.rows:
        a = host.get(name)
        if a is None:
            continue
        if present is True:
            yield name, None, gp.InvalidProblem
        wrong = next(t for t in (np.int8, np.float32, np.float64, np.int64)
                     if np.dtype(t) not in allowed)
        yield name, on(device, np.zeros(shape, wrong)), gp.Unsupported
        if a.size:
            short = np.zeros((a.size - 1,), a.dtype)
            yield name, on(device, short), gp.BufferTooSmall
        long = np.zeros(shape[:-1] + (shape[-1] + 1,) if shape else (2,), a.dtype)
        yield name, on(device, long), gp.InvalidProblem
        if contiguous and a.size and a.ndim and a.shape[-1] > 1:  # (empty views are contiguous)
            wide = np.zeros(a.shape[:-1] + (a.shape[-1] * 2,), a.dtype)
            wide[..., ::2] = a
            yield name, on(device, wide)[..., ::2], gp.InvalidProblem
        if device != "cpu":
            yield name, a.copy(), gp.InvalidProblem  # a host array for a device plan
        if written and device != "cuda":  # a read-only output (CuPy arrays are writable)
            frozen = on(device, np.array(a, copy=True))
            frozen.flags.writeable = False
            yield name, frozen, gp.InvalidProblem


# -- kernel cases: each family's cases.py, run on the device under test ------------------------

#: The device under test: "emulated" (CI), or "cuda" on a GPU (check_kernels.py --device).
DEVICE = "emulated"
DTYPES = FLOAT_DTYPES


def set_device(device: str) -> None:
    global DEVICE
    DEVICE = gp.backend.resolve_device(device)


def stream() -> gp.Stream:
    """The stream of the device under test."""
    return gp.Stream.emulated() if DEVICE == "emulated" else gp.Stream.current()


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[], None]


def emu(a: np.ndarray | None) -> Any:
    """A host array on the device under test (None stays None)."""
    return None if a is None else gp.to_device(a, DEVICE)


def place(a: np.ndarray, misaligned: bool = False) -> Any:
    """`emu(a)`, or with `misaligned` a copy of 1-D `a` one element past a 256-byte boundary
    on the device under test (no 16-byte packs: the kernels' scalar path)."""
    if not misaligned:
        return emu(a)
    buf = emu(np.zeros(a.shape[0] + 1, a.dtype))[1:]
    buf[...] = emu(a)  # device to device: a GPU array takes no host array by assignment
    return buf


def host(a: Any) -> np.ndarray:
    return gp.to_host(a)


def run_emulated(plan_cls: type, desc: Any, args: Any,
                 pref: gp.PlanPreference | None = None) -> gp.Plan:
    """Select on the stream of the device under test, our NVRTC SKU (no cuBLAS), and run;
    returns the plan."""
    pref = pref or gp.PlanPreference(backend=gp.BackendKind.NVRTC)
    return run_plan(plan_cls, desc, args, DEVICE, pref)


def check(actual: Any, expected64: np.ndarray, dtype: Any, what: str, scale: float = 1.0) -> None:
    assert_close(actual, np.asarray(expected64, dtype=np.float64), dtype, scale,
                 err_msg=f"{what} [{short_name(dtype)}]")


def dtype_id(dtype: Any) -> str:
    return short_name(dtype)
