"""One check for any spec plan: results against a float64 reference, then every malformed
operand the spec implies, each rejected with the right error and no output touched.

    check_plan(gp.UnaryPlan, gp.UnaryDescriptor("gelu", 37, dtype), {"x": x},
               lambda x, alpha: {"y": ref_gelu(x)}, device=device, scale=4)

`inputs` maps operand names to host arrays at the plan's dtypes (inputs, in-place operands,
and any output whose initial value matters) and scalar names to values; the remaining
outputs are allocated and filled with a sentinel. `reference` gets every operand (as it was
before the run) and scalar as float64 host arrays / values and returns the expected float64
outputs by name (an array when the spec has one output). With `bad_inputs` every operand is
then replaced, one at a time, by what the spec forbids: a dtype outside its rule, a buffer
one element short (BufferTooSmall) or long (InvalidProblem), a strided view, an array on the
other side (host vs device), None when required, a read-only output, and an output
overlapping an input it must be distinct from. Each call must raise the matching
GpuPlanError and leave every output and in-place operand byte-identical. Needs pytest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.spec import REQUIRED
from gpuplan.testing import assert_close, assert_rejected, f64, on, stream_for

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
