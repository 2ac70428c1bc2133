"""One-call execution of a plan for the functional API: cached select, workspace, run.

`call(PlanCls, desc, like=x, **operands)` is what the functional wrappers (and so autograd)
use: it picks the stream from where `like` lives (host for NumPy, the emulated stream, the
current CUDA stream for CuPy), reuses the plan selected earlier for the same (family,
descriptor, preference, stream), allocates the outputs the caller did not pass (their
shapes and dtypes come from the plan's spec), checks the operands once and runs. Outputs
it allocated are right by construction and overlap nothing, so only the operands the
caller gave are checked (the one validation of the call). On the host, a plan whose calls
come down to that check and its body has the whole call generated once (Plan._host_call):
`call` tries it first, and a family's wrapper may keep it per descriptor (`host_calls`,
`host_call`: binary does); operands it does not take as they are go the general way.
`execute(PlanCls, desc, args, like=x)` does the same for a ready-made args object.
`concurrently(like, *calls)` runs independent calls, on the host over the host threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpuplan.plan import _NO_WORKSPACE, MISS, Plan, PlanPreference
from gpuplan.stream import Stream, Workspace

_PLANS: dict[tuple, Plan] = {}
_MAX_PLANS = 4096
_DESCRIPTORS: dict[tuple, Any] = {}


def interned(desc_cls: type, *fields: Any) -> Any:
    """``desc_cls(*fields)``, one object per distinct fields (remembered, up to _MAX_PLANS):
    a functional wrapper calls this on every call, and a frozen dataclass costs ~2 us to
    build and its equality, on the plan-cache lookup, ~1 us more; a dict lookup on the
    fields ~0.2 us. Equal fields give equal descriptors, so the object returned is the one
    `desc_cls(*fields)` would equal."""
    key = (desc_cls, *fields)
    desc = _DESCRIPTORS.get(key)
    if desc is None:
        if len(_DESCRIPTORS) >= _MAX_PLANS:
            _DESCRIPTORS.clear()
        desc = _DESCRIPTORS[key] = desc_cls(*fields)
    return desc


def cached_plan(plan_cls: type[Plan], stream: Stream, desc: Any,
                pref: PlanPreference | None = None) -> Plan:
    """`plan_cls.select(stream, desc, pref)`, remembered per (family, desc, pref, stream)."""
    key = (plan_cls, desc, pref, stream.key)
    plan = _PLANS.get(key)
    if plan is None:
        plan = plan_cls.select(stream, desc, pref)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


#: the families' own caches of host calls (`host_calls`), emptied with the plan cache.
_HOST_CACHES: list[dict] = []


def host_calls() -> dict:
    """A new cache for a family's functional wrapper: a key of the family's choosing (the
    fields of its descriptor, say) -> the host call of the plan selected for it
    (`host_call`). `clear_plan_cache` empties it with the plans; the wrapper bounds it
    (`remember_host_call`)."""
    cache: dict = {}
    _HOST_CACHES.append(cache)
    return cache


def host_call(plan_cls: type[Plan], desc: Any) -> Callable[..., Any] | None:
    """The plan `call` runs for `desc` on the host (default preference) as one function of
    the given operands in declaration order (Plan._host_call's ``by_position``): the call's
    outputs, or MISS when the operands are not ones it runs as they are (the caller then
    goes through `call`, which says what is wrong). None when the plan has none."""
    fast = cached_plan(plan_cls, Stream.host(), desc)._host_call
    return None if fast is None else fast[1]


def remember_host_call(cache: dict, key: Any, plan_cls: type[Plan], desc: Any
                       ) -> Callable[..., Any] | None:
    """cache[key] = host_call(plan_cls, desc) (None included: asked once), the cache
    bounded as the plan cache is; returns it."""
    fast = host_call(plan_cls, desc)
    if len(cache) >= _MAX_PLANS:
        cache.clear()
    cache[key] = fast
    return fast


def _workspace(plan: Plan, stream: Stream) -> Workspace | None:
    nbytes = plan._cand.workspace_bytes
    return Workspace.allocate(stream, nbytes) if nbytes else None


def execute(plan_cls: type[Plan], desc: Any, args: Any, *, like: Any,
            pref: PlanPreference | None = None) -> Plan:
    """Select (cached) and run `plan_cls` for `desc` on the stream of array `like`."""
    stream = Stream.for_array(like)
    plan = cached_plan(plan_cls, stream, desc, pref)
    plan.run(stream, _workspace(plan, stream), args)
    return plan


def call(plan_cls: type[Plan], desc: Any, *, like: Any, pref: PlanPreference | None = None,
         **operands: Any) -> Any:
    """Run `plan_cls` on `operands` (arrays and scalars by spec name), allocating every
    required output not passed; returns the outputs in declaration order (one array when
    the spec has a single output, else a tuple)."""
    # The per-call path of every functional op, kept in line: the host stream, the cached
    # plan, its outputs (shapes, dtypes and allocator resolved with the plan), the check.
    stream = Stream._HOST if type(like) is np.ndarray else None
    if stream is None:
        stream = Stream.for_array(like)
    plan = _PLANS.get((plan_cls, desc, pref, stream.key))
    if plan is None:
        plan = cached_plan(plan_cls, stream, desc, pref)
    fast = plan._host_call
    if fast is not None:  # the host call in straight-line code (Plan._host_call)
        out = fast[0](operands)
        if out is not MISS:
            return out
    # The host check of the given operands when it is a short one (Resolved.host_rows):
    # passed, it is the call's whole check; failed, Resolved.check runs and says why.
    checked = False
    rows = plan._host_rows
    if rows is not None:
        for name, shape, dtype in rows:
            a = operands.get(name)
            if (type(a) is not np.ndarray or a.shape != shape or a.dtype is not dtype
                    or not a.flags.carray):
                break
        else:
            checked = True
            for name in plan._host_absent:
                if operands.get(name) is not None:
                    checked = False
    fresh = True
    empty = plan._empty
    for name, shape, dtype in plan._allocs:
        if name in operands:
            fresh = False
        else:
            operands[name] = empty(shape, dtype)
    spec = plan.spec
    try:
        args = spec.args_cls(**operands) if spec.args_take_any else spec.args_cls(
            **{**spec._absent, **operands})
    except TypeError:
        args = spec.make_args(**operands)  # raises the error naming the operand at fault
    if not fresh:
        nbytes = plan._cand.workspace_bytes
        plan.run(stream, Workspace.allocate(stream, nbytes) if nbytes else None, args)
    elif checked and plan._direct:
        plan._run_impl(stream, _NO_WORKSPACE, args)
    else:  # outputs right by construction: check what the caller gave
        nbytes = plan._cand.workspace_bytes
        ws = Workspace.allocate(stream, nbytes) if nbytes else None
        if checked:
            plan._run_checked(stream, ws, args)
        else:
            plan._run_fresh(stream, ws, args)
    outs = spec.outputs
    if len(outs) == 1:
        return operands[outs[0]]
    return tuple(map(operands.get, outs))


#: Work (multiply-adds) each call of `concurrently` needs before the host threads take
#: whole calls: ~0.1 ms of single-thread sgemm. Below it, the hand-off (two plan calls'
#: Python contending for the GIL: ~0.1 ms a pair on the 2-core VM) costs more than it saves.
CONCURRENT_WORK = 1 << 23
#: Settle polls (gpuplan.host_pool.SETTLE_POLLS) of a worker taking a whole call: the
#: caller's own call holds the GIL for its plan-call Python (~40 us) before its GEMM starts,
#: and a worker asking for it meanwhile sleeps (~25 us to wake on the VM). Small-GPT step at
#: two threads, 10 -> 80 polls: 55.5 -> 54.1 and 54.9 -> 54.5 ms (medians of 40 steps,
#: settings alternated step by step in one process; 40: 54.4, 160: 54.9).
CONCURRENT_SETTLE = 80


def concurrently(like: Any, *calls: Callable[[], Any] | None, work: int | None = None
                 ) -> list[Any]:
    """[call() for each call] (None for a None call), for independent calls: plan calls on
    operands where array `like` lives, none writing what another reads; `work`: the
    multiply-adds (or elements) of the smallest call, when known.

    On the host, when there are at least as many calls as host threads and each has
    CONCURRENT_WORK (or `work` is not given), the threads take whole calls
    (gpuplan.host_pool.parallel_for; a call then runs on its thread alone): for two GEMMs of
    a layer's backward that is one hand-off and no split of either product instead of two
    split products. Otherwise, and for device arrays (whose stream orders them), the calls
    run in order on the calling thread, each splitting itself as usual. Every host op gives
    the same bits however it is split, so the results do not depend on which way the calls
    ran."""
    from gpuplan import host, host_pool

    out: list[Any] = [None] * len(calls)
    todo = [k for k, c in enumerate(calls) if c is not None]
    if (len(todo) < 2 or type(like) is not np.ndarray or host.thread_budget() > len(todo)
            or (work is not None and work < CONCURRENT_WORK)):
        for k in todo:
            out[k] = calls[k]()
        return out

    def part(lo: int, hi: int) -> None:
        for k in todo[lo:hi]:
            out[k] = calls[k]()

    host_pool.parallel_for(len(todo), part, settle=CONCURRENT_SETTLE)
    return out


def clear_plan_cache() -> None:
    _PLANS.clear()
    _DESCRIPTORS.clear()
    for cache in _HOST_CACHES:
        cache.clear()
