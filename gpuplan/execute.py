"""One-call execution of a plan for the functional API: cached select, workspace, run.

`execute(PlanCls, desc, args)` picks the stream from where the arrays live (host for NumPy,
the current CUDA stream for CuPy), reuses the plan selected earlier for the same
(family, descriptor, preference, stream), allocates the workspace and runs the plan.
This is what the functional wrappers (and so autograd) call; per-call overhead is a dict
lookup plus the argument checks.
"""

from __future__ import annotations

from typing import Any

from gpuplan.plan import Plan, PlanPreference
from gpuplan.stream import Stream, Workspace

_DEFAULT_PREF = PlanPreference()
_PLANS: dict[tuple, Plan] = {}


def cached_plan(plan_cls: type[Plan], stream: Stream, desc: Any,
                pref: PlanPreference | None = None) -> Plan:
    pref = pref or _DEFAULT_PREF
    key = (plan_cls, desc, pref, stream)
    plan = _PLANS.get(key)
    if plan is None:
        plan = plan_cls.select(stream, desc, pref)
        if len(_PLANS) > 4096:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def execute(plan_cls: type[Plan], desc: Any, args: Any, *, like: Any,
            pref: PlanPreference | None = None) -> Plan:
    """Select (cached) and run `plan_cls` for `desc` on the stream of array `like`."""
    stream = Stream.for_array(like)
    plan = cached_plan(plan_cls, stream, desc, pref)
    nbytes = plan.workspace_size()
    ws = Workspace.allocate(stream, nbytes) if nbytes else Workspace.none()
    plan.run(stream, ws, args)
    return plan


def clear_plan_cache() -> None:
    _PLANS.clear()
