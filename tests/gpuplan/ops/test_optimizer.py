"""Optimizer-step plans (AdamW, multi-tensor AdamW, SGD) against the float64 NumPy references
of PyTorch's formulas (gpuplan.testing), over several steps, on host and device."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.optimizer.reference import adamw_reference, sgd_reference
from gpuplan.testing import (
    assert_close,
    assert_rejected,
    check_plan,
    f64,
    on,
    random,
    run_plan,
    stream_for,
)

# (param dtype, grad dtype) pairs with kernels
PAIRS = [
    pytest.param(np.float32, np.float32, id="f32-f32"),
    pytest.param(np.float32, np.float16, id="f32-f16"),
    pytest.param(np.float32, gp.bfloat16, id="f32-bf16"),
    pytest.param(np.float64, np.float64, id="f64-f64"),
]
LOWP = [pytest.param(None, id="nolowp"), pytest.param(np.float16, id="f16copy"),
        pytest.param(gp.bfloat16, id="bf16copy")]
SIZES = [1, 7, 1000, 66001]
HP = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)


def _state(n, dtype, seed=0):
    p = random((n,), dtype, seed=seed)
    m = random((n,), dtype, seed=seed + 1, low=-0.1, high=0.1)
    v = random((n,), dtype, seed=seed + 2, low=0.0, high=0.01)
    return p, m, v


@pytest.mark.parametrize("pdt,gdt", PAIRS)
@pytest.mark.parametrize("lowp", LOWP)
@pytest.mark.parametrize("n", SIZES)
def test_adamw_matches_reference_over_steps(device, pdt, gdt, lowp, n):
    p, m, v = _state(n, pdt)
    rp, rm, rv = f64(p), f64(m), f64(v)
    dp, dm, dv = on(device, p), on(device, m), on(device, v)
    dl = None if lowp is None else on(device, np.zeros((n,), lowp))
    desc = gp.AdamWDescriptor(n, pdt, gdt, lowp)
    for step in range(1, 5):
        g = random((n,), gdt, seed=10 + step)
        plan = run_plan(gp.AdamWPlan, desc,
                        gp.AdamWArgs(dp, on(device, g), dm, dv, step=step, param_lowp=dl, **HP),
                        device)
        rp, rm, rv = adamw_reference(rp, g, rm, rv, step=step, **HP)
    assert_close(dp, rp, pdt, scale=4)
    assert_close(dm, rm, pdt, scale=4)
    assert_close(dv, rv, pdt, scale=4)
    if lowp is not None:
        assert_close(dl, rp, lowp)
        if pdt == np.float32:  # the copy is the f32 weights rounded to nearest even
            np.testing.assert_array_equal(gp.to_host(dl).view(np.uint8),
                                          gp.to_host(dp).astype(lowp).view(np.uint8))
    g = plan.precision_guarantee()
    assert g.deterministic and g.bit_stable and g.math_precision == gp.dtypes.short_name(pdt)


SGD_CASES = [
    dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    dict(momentum=0.0, dampening=0.0, weight_decay=0.05, nesterov=False),
    dict(momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False),
    dict(momentum=0.8, dampening=0.0, weight_decay=0.05, nesterov=True),
]


@pytest.mark.parametrize("pdt,gdt", PAIRS)
@pytest.mark.parametrize("hp", SGD_CASES, ids=["plain", "wd", "momentum", "nesterov"])
@pytest.mark.parametrize("n", [1, 1000, 66001])
def test_sgd_matches_reference_over_steps(device, pdt, gdt, hp, n):
    lowp = gp.bfloat16 if hp["nesterov"] else None
    p = random((n,), pdt, seed=1)
    buf0 = random((n,), pdt, seed=2)  # garbage: the first step must overwrite it
    rp, rbuf = f64(p), None
    dp, dbuf = on(device, p), (on(device, buf0) if hp["momentum"] else None)
    dl = None if lowp is None else on(device, np.zeros((n,), lowp))
    desc = gp.SGDDescriptor(n, pdt, gdt, lowp)
    for step in range(1, 5):
        g = random((n,), gdt, seed=20 + step)
        run_plan(gp.SGDPlan, desc,
                 gp.SGDArgs(dp, on(device, g), dbuf, lr=0.05, first_step=step == 1,
                            param_lowp=dl, **hp), device)
        rp, rbuf = sgd_reference(rp, g, rbuf, lr=0.05, first_step=step == 1, **hp)
    assert_close(dp, rp, pdt, scale=4)
    if hp["momentum"]:
        assert_close(dbuf, rbuf, pdt, scale=4)
    if lowp is not None:
        assert_close(dl, rp, lowp)


@pytest.mark.parametrize("pdt,gdt", PAIRS)
@pytest.mark.parametrize("lowp", [None, gp.bfloat16])
def test_multi_tensor_adamw_matches_reference(device, pdt, gdt, lowp):
    sizes = (0, 1, 5, 16384, 16385, 40000)  # empty, tiny, chunk-sized and chunk-crossing
    states = [_state(n, pdt, seed=3 * k) for k, n in enumerate(sizes)]
    refs = [tuple(f64(a) for a in s) for s in states]
    dev = [tuple(on(device, a) for a in s) for s in states]
    lows = None if lowp is None else [on(device, np.zeros((n,), lowp)) for n in sizes]
    desc = gp.AdamWMultiTensorDescriptor(sizes, pdt, gdt, lowp)
    for step in range(1, 4):
        grads = [random((n,), gdt, seed=100 * step + k) for k, n in enumerate(sizes)]
        args = gp.AdamWMultiTensorArgs([d[0] for d in dev], [on(device, g) for g in grads],
                                       [d[1] for d in dev], [d[2] for d in dev], step=step,
                                       params_lowp=lows, **HP)
        run_plan(gp.AdamWMultiTensorPlan, desc, args, device)
        refs = [adamw_reference(r[0], g, r[1], r[2], step=step, **HP)
                for r, g in zip(refs, grads, strict=True)]
    for k, (d, r) in enumerate(zip(dev, refs, strict=True)):
        for a, b in zip(d, r, strict=True):
            assert_close(a, b, pdt, scale=4, err_msg=f"tensor {k}")
        if lows is not None:
            assert_close(lows[k], r[0], lowp)


def test_empty_extents(device):
    """Empty problems return at once (the run body never starts) after their operands were
    checked; an empty tensor among non-empty ones is skipped and left as it was."""
    z = on(device, np.zeros((0,), np.float32))
    for plan_cls, desc, args in [
            (gp.AdamWPlan, gp.AdamWDescriptor(0), gp.AdamWArgs(z, z, z, z, None, lr=1.0, step=1)),
            (gp.SGDPlan, gp.SGDDescriptor(0), gp.SGDArgs(z, z, z, None, lr=1.0, momentum=0.9)),
            (gp.AdamWMultiTensorPlan, gp.AdamWMultiTensorDescriptor(()),
             gp.AdamWMultiTensorArgs([], [], [], [], lr=1.0, step=1)),
            (gp.AdamWMultiTensorPlan, gp.AdamWMultiTensorDescriptor((0, 0)),
             gp.AdamWMultiTensorArgs([z, z], [z, z], [z, z], [z, z], lr=1.0, step=1))]:
        s = stream_for(device)
        plan = plan_cls.select(s, desc)
        plan._run_impl = _never_run  # the step body must not start
        plan.run(s, gp.Workspace.allocate(s, plan.workspace_size()), args)
    # Still checked: a wrong dtype in an empty problem is an error.
    z64 = on(device, np.zeros((0,), np.float64))
    with pytest.raises(gp.Unsupported, match="'grad'"):
        run_plan(gp.AdamWPlan, gp.AdamWDescriptor(0), gp.AdamWArgs(z, z64, z, z, None, lr=1.0,
                                                                   step=1), device)
    # A non-empty tensor beside an empty one is updated; the empty one is skipped.
    p, m, v = (on(device, a) for a in _state(5, np.float32))
    before = [gp.to_host(a).copy() for a in (p, m, v)]
    g = on(device, random((5,), np.float32, seed=4))
    run_plan(gp.AdamWMultiTensorPlan, gp.AdamWMultiTensorDescriptor((0, 5)),
             gp.AdamWMultiTensorArgs([z, p], [z, g], [z, m], [z, v], step=1, **HP), device)
    for a, want in zip((p, m, v), adamw_reference(*before[:1], g, *before[1:], step=1, **HP),
                       strict=True):
        assert_close(a, want, np.float32, scale=4)


def _never_run(*args):
    raise AssertionError("an empty problem ran its step body")


@pytest.mark.parametrize("lowp", [None, gp.bfloat16])
def test_spec_checks(device, lowp):
    """Every malformed operand the declarations imply (gpuplan.testing.check_plan: dtype, short/long
    buffer, strided view, wrong side, missing, overlapping) is rejected with nothing written;
    the accepted call matches the float64 references."""
    n = 10
    p, m, v = _state(n, np.float32)
    g = random((n,), gp.bfloat16, seed=3)

    def adamw_ref(param, grad, exp_avg, exp_avg_sq, param_lowp=None, hyper=None, **hp):
        rp, rm, rv = adamw_reference(param, grad, exp_avg, exp_avg_sq, **hp)
        return {"param": rp, "exp_avg": rm, "exp_avg_sq": rv}  # param_lowp: other tests

    check_plan(gp.AdamWPlan, gp.AdamWDescriptor(n, np.float32, gp.bfloat16, lowp),
               dict(param=p, grad=g, exp_avg=m, exp_avg_sq=v, step=2, **HP), adamw_ref,
               device=device, scale=4)

    def sgd_ref(param, grad, momentum_buf, param_lowp=None, **hp):
        rp, rbuf = sgd_reference(param, grad, momentum_buf, **hp)
        return {"param": rp, "momentum_buf": rbuf}

    check_plan(gp.SGDPlan, gp.SGDDescriptor(n, np.float32, gp.bfloat16, lowp),
               dict(param=p, grad=g, momentum_buf=m, lr=0.1, momentum=0.9, dampening=0.1,
                    weight_decay=0.01), sgd_ref, device=device, scale=4)


def test_functional_api_in_place(device):
    p, m, v = (a.reshape(4, 6) for a in _state(24, np.float32))
    g = random((4, 6), gp.bfloat16, seed=5)
    rp, rm, rv = adamw_reference(p, g, m, v, step=3, **HP)
    dp, dm, dv = on(device, p), on(device, m), on(device, v)
    low = on(device, np.zeros((4, 6), np.float16))
    assert gp.functional.adamw_step(dp, on(device, g), dm, dv, step=3, param_lowp=low,
                                    **HP) is None
    assert_close(dp, rp, np.float32)
    assert_close(dm, rm, np.float32)
    assert_close(dv, rv, np.float32)
    assert_close(low, rp, np.float16)
    q = on(device, p.copy())
    buf = on(device, np.zeros((4, 6), np.float32))
    gp.functional.sgd_step(q, on(device, g), buf, lr=0.1, momentum=0.9, first_step=True)
    rq, rbuf = sgd_reference(p, g, None, lr=0.1, momentum=0.9, first_step=True)
    assert_close(q, rq, np.float32)
    assert_close(buf, rbuf, np.float32)
    gp.functional.sgd_step(q, on(device, g), None, lr=0.1)  # plain SGD needs no buffer
    assert_close(q, rq - 0.1 * f64(g), np.float32)


def test_functional_rejects_strided_and_mismatched(device):
    p = on(device, np.ones((4, 6), np.float32))
    g = on(device, np.ones((4, 6), np.float32))
    m = on(device, np.zeros((4, 6), np.float32))
    assert_rejected(lambda: gp.functional.adamw_step(p[:, ::2], g[:, ::2], m[:, ::2],
                                                     m[:, 1::2], step=1, **HP),
                    gp.InvalidProblem, [p, m], "'param'", "contiguous")
    assert_rejected(lambda: gp.functional.sgd_step(p, g.reshape(6, 4), None, lr=1.0),
                    gp.InvalidProblem, [p], "'grad'", "(4, 6)", "(6, 4)")
    assert_rejected(lambda: gp.functional.sgd_step(p, g[:3], None, lr=1.0),
                    gp.BufferTooSmall, [p], "'grad'", "24", "18")


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.Unsupported, match="adamw_step: argument 'dtype'"):
        gp.AdamWPlan.select(s, gp.AdamWDescriptor(4, np.float16))
    with pytest.raises(gp.Unsupported, match="argument 'grad_dtype'.*f64"):
        gp.AdamWPlan.select(s, gp.AdamWDescriptor(4, np.float32, np.float64))
    with pytest.raises(gp.Unsupported, match="argument 'grad_dtype'"):
        gp.SGDPlan.select(s, gp.SGDDescriptor(4, np.float64, np.float32))
    with pytest.raises(gp.Unsupported, match="argument 'lowp_dtype'"):
        gp.SGDPlan.select(s, gp.SGDDescriptor(4, np.float32, None, np.float32))
    with pytest.raises(gp.InvalidProblem, match="argument 'n'"):
        gp.SGDPlan.select(s, gp.SGDDescriptor(-2))
    with pytest.raises(gp.InvalidProblem, match=r"argument 'sizes'.*\(3, -1\)"):
        gp.AdamWMultiTensorPlan.select(s, gp.AdamWMultiTensorDescriptor((3, -1)))
    with pytest.raises(gp.Unsupported, match="nvrtc requested"):
        gp.AdamWPlan.select(s, gp.AdamWDescriptor(4),
                            gp.PlanPreference(backend=gp.BackendKind.NVRTC))


def test_adamw_argument_errors_leave_state_untouched(device):
    n = 10
    s = gp.Stream.host() if device == "cpu" else gp.Stream.current()
    p, m, v = (on(device, a) for a in _state(n, np.float32))
    g = on(device, random((n,), np.float32, seed=9))
    low = on(device, np.zeros((n,), gp.bfloat16))
    plan = gp.AdamWPlan.select(s, gp.AdamWDescriptor(n, np.float32, np.float32, gp.bfloat16))
    outs = [p, m, v, low]

    def run(**kw):
        a = dict(param=p, grad=g, exp_avg=m, exp_avg_sq=v, step=1, param_lowp=low) | HP | kw
        return lambda: plan.run(s, gp.Workspace.none(), gp.AdamWArgs(**a))

    assert_rejected(run(grad=g.astype(np.float16)), gp.Unsupported, outs, "adamw_step", "'grad'",
                    "f32", "f16")
    assert_rejected(run(exp_avg=m.astype(np.float64)), gp.Unsupported, outs, "'exp_avg'")
    assert_rejected(run(param_lowp=low.astype(np.float16)), gp.Unsupported, outs, "'param_lowp'",
                    "bf16", "f16")
    assert_rejected(run(param_lowp=None), gp.InvalidProblem, outs, "'param_lowp'")
    assert_rejected(run(exp_avg_sq=v[:7]), gp.BufferTooSmall, outs, "'exp_avg_sq'", "10", "7")
    assert_rejected(run(grad=on(device, np.zeros((2, 5), np.float32))), gp.InvalidProblem, outs,
                    "'grad'", "(10,)", "(2, 5)")
    assert_rejected(run(exp_avg=p), gp.InvalidProblem, outs, "distinct")
    for name, bad, words in [("lr", -1.0, "[0.0"), ("beta1", 1.0, "[0.0, 1.0)"),
                             ("beta2", float("nan"), "nan"), ("eps", -1e-8, "'eps'"),
                             ("weight_decay", float("inf"), "inf"), ("step", 0, ">= 1"),
                             ("step", 1.0, "integer")]:
        assert_rejected(run(**{name: bad}), gp.InvalidProblem, outs, f"'{name}'", words)
    if device == "cuda":
        assert_rejected(run(grad=gp.to_host(g)), gp.InvalidProblem, outs, "'grad'")


def test_sgd_argument_errors_leave_state_untouched(device):
    n = 10
    s = gp.Stream.host() if device == "cpu" else gp.Stream.current()
    p, buf, _ = (on(device, a) for a in _state(n, np.float32))
    g = on(device, random((n,), np.float32, seed=9))
    plan = gp.SGDPlan.select(s, gp.SGDDescriptor(n))
    outs = [p, buf]

    def run(**kw):
        a = dict(param=p, grad=g, momentum_buf=buf, param_lowp=None, lr=0.1, momentum=0.9) | kw
        return lambda: plan.run(s, None, gp.SGDArgs(**a))

    assert_rejected(run(momentum_buf=None), gp.InvalidProblem, outs, "'momentum_buf'", "None")
    assert_rejected(run(momentum_buf=buf[:4]), gp.BufferTooSmall, outs, "'momentum_buf'")
    assert_rejected(run(nesterov=True, dampening=0.1), gp.InvalidProblem, outs, "'nesterov'")
    assert_rejected(run(nesterov=True, momentum=0.0), gp.InvalidProblem, outs, "'nesterov'")
    assert_rejected(run(momentum=-0.5), gp.InvalidProblem, outs, "'momentum'")
    assert_rejected(run(momentum_buf=g), gp.InvalidProblem, outs, "distinct")
    assert_rejected(run(param_lowp=on(device, np.zeros((n,), np.float16))), gp.InvalidProblem,
                    outs, "'param_lowp'", "None")


def test_multi_tensor_argument_errors(device):
    s = gp.Stream.host() if device == "cpu" else gp.Stream.current()
    sizes = (3, 5)
    ps = [on(device, np.ones((n,), np.float32)) for n in sizes]
    ms = [on(device, np.zeros((n,), np.float32)) for n in sizes]
    vs = [on(device, np.zeros((n,), np.float32)) for n in sizes]
    gs = [on(device, np.ones((n,), np.float32)) for n in sizes]
    plan = gp.AdamWMultiTensorPlan.select(s, gp.AdamWMultiTensorDescriptor(sizes))
    ws = gp.Workspace.allocate(s, plan.workspace_size())
    outs = ps + ms + vs

    def run(**kw):
        a = dict(params=ps, grads=gs, exp_avgs=ms, exp_avg_sqs=vs, lr=0.1, step=1) | kw
        return lambda: plan.run(s, ws, gp.AdamWMultiTensorArgs(**a))

    assert_rejected(run(grads=gs[:1]), gp.InvalidProblem, outs, "'grads'", "2 arrays", "1")
    assert_rejected(run(params=[ps[0], ps[0]]), gp.BufferTooSmall, outs, "'params[1]'", "5", "3")
    assert_rejected(run(exp_avgs=[ms[0], ps[1]]), gp.InvalidProblem, outs, "distinct")
    assert_rejected(run(exp_avg_sqs=[vs[0], vs[1].astype(np.float64)]), gp.Unsupported, outs,
                    "'exp_avg_sqs[1]'")
    assert_rejected(run(params_lowp=[None, None]), gp.InvalidProblem, outs, "'params_lowp")
    assert_rejected(run(grads=(gs[0], None)), gp.InvalidProblem, outs, "'grads[1]'", "None")
    assert_rejected(run(exp_avgs=ms[0]), gp.InvalidProblem, outs, "'exp_avgs'", "2 arrays")
    wide = on(device, np.zeros(10, np.float32))
    assert_rejected(run(params=[ps[0], wide[::2]]), gp.InvalidProblem, outs, "'params[1]'",
                    "contiguous")
    assert_rejected(run(exp_avg_sqs=[vs[0], ps[1]]), gp.InvalidProblem, outs, "distinct",
                    "'params[1]'")
    for name, bad, words in [("lr", -1.0, "[0.0"), ("step", 0, ">= 1"), ("beta2", 1.0, "1.0)")]:
        assert_rejected(run(**{name: bad}), gp.InvalidProblem, outs, f"'{name}'", words)
    if device == "cuda":
        assert_rejected(run(grads=[gs[0], gp.to_host(gs[1])]), gp.InvalidProblem, outs,
                        "'grads[1]'")
        good = gp.AdamWMultiTensorArgs(ps, gs, ms, vs, lr=0.1, step=1)
        assert_rejected(lambda: plan.run(s, gp.Workspace.none(), good), gp.WorkspaceTooSmall,
                        outs, "'ws'", f">= {plan.workspace_size()} bytes", "0 bytes")


def test_multi_tensor_check_takes_the_signature_path(device, monkeypatch):
    """Well-formed lists (flat views of [r, c] tensors, as optim.AdamW passes them) pass on
    one signature comparison per list: the per-array precise check never runs."""
    def precise(*args):
        raise AssertionError("the precise per-array check ran on well-formed lists")

    monkeypatch.setattr(gp.AdamWMultiTensorPlan, "_explain", precise)
    shapes = [(3, 4), (5,), (2, 8)]
    lists = [[on(device, random(s, np.float32, seed=10 * j + k)).reshape(-1)
              for k, s in enumerate(shapes)] for j in range(4)]
    lists[3] = [abs(v) for v in lists[3]]  # exp_avg_sq >= 0
    desc = gp.AdamWMultiTensorDescriptor(tuple(int(np.prod(s)) for s in shapes))
    before = [[gp.to_host(a).copy() for a in seq] for seq in lists]
    run_plan(gp.AdamWMultiTensorPlan, desc, gp.AdamWMultiTensorArgs(*lists, step=1, **HP),
             device)
    for k in range(len(shapes)):
        want = adamw_reference(before[0][k], before[1][k], before[2][k], before[3][k], step=1,
                               **HP)
        for j, w in zip((0, 2, 3), want, strict=True):
            assert_close(lists[j][k], w, np.float32, scale=4)


def test_sku():
    plan = gp.AdamWPlan.select(gp.Stream.host(), gp.AdamWDescriptor(8, np.float32, gp.bfloat16))
    sku = plan.sku()
    assert (sku.op, sku.dtype, sku.backend, sku.category) == (
        "adamw_step", "f32", gp.BackendKind.NUMPY, "optimizer")
    assert plan.workspace_size() == 0


@pytest.mark.gpu
def test_device_skus_and_workspace():
    s = gp.Stream.current()
    plan = gp.AdamWMultiTensorPlan.select(s, gp.AdamWMultiTensorDescriptor((16385, 3)))
    # 2 tensor rows of 6 addresses, 3 chunks of (tensor, start)
    assert plan.workspace_size() == 8 * (2 * 6 + 3 * 2)
    assert plan.sku().variant == "fused" and plan.precision_guarantee().deterministic
    assert gp.SGDPlan.select(s, gp.SGDDescriptor(5)).sku().backend is gp.BackendKind.NVRTC


@pytest.mark.gpu
def test_device_adamw_large_grid_stride(accelerator):
    n = 16384 * 256 * 2 + 5  # more elements than one grid of the single-tensor kernel
    p, m, v = (gp.asarray(a, device=accelerator) for a in _state(n, np.float32))
    hp, hm, hv = (gp.to_host(a).copy() for a in (p, m, v))
    g = gp.asarray(random((n,), np.float32, seed=3), device=accelerator)
    gp.functional.adamw_step(p, g, m, v, step=2, **HP)
    run_plan(gp.AdamWPlan, gp.AdamWDescriptor(n), gp.AdamWArgs(hp, gp.to_host(g), hm, hv, None,
                                                               step=2, **HP), "cpu")
    assert_close(p, f64(hp), np.float32)
    assert_close(v, f64(hv), np.float32)


def test_read_only_state_is_rejected_before_any_write():
    """A read-only param or moment (a memmap opened 'r', a broadcast view) used to get half a
    step: every tensor before it updated, then NumPy raised. Now nothing is written."""
    s = gp.Stream.host()
    sizes = (4, 3)
    plan = gp.AdamWMultiTensorPlan.select(s, gp.AdamWMultiTensorDescriptor(sizes))
    for frozen_list in ("params", "exp_avgs", "exp_avg_sqs"):
        lists = {k: [np.full(n, 0.5, np.float32) for n in sizes]
                 for k in ("params", "grads", "exp_avgs", "exp_avg_sqs")}
        lists[frozen_list][1].flags.writeable = False
        written = lists["params"] + lists["exp_avgs"] + lists["exp_avg_sqs"]
        assert_rejected(lambda lists=lists: plan.run(s, None, gp.AdamWMultiTensorArgs(
            **lists, lr=0.1, step=1)), gp.InvalidProblem, written, f"{frozen_list}[1]",
            "writable")
    grads = [np.full(n, 0.5, np.float32) for n in sizes]
    for g in grads:
        g.flags.writeable = False  # read only: fine
    params = [np.full(n, 0.5, np.float32) for n in sizes]
    plan.run(s, None, gp.AdamWMultiTensorArgs(params, grads, [np.zeros(n, np.float32)
                                                              for n in sizes],
                                              [np.zeros(n, np.float32) for n in sizes],
                                              lr=0.1, step=1))
    assert all((p < 0.5).all() for p in params)
