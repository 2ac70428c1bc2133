"""Gradient clipping in one multi-tensor plan: the norm and every scaled gradient against
the family's float64 reference (gpuplan.ops.clip_grad.reference), clipping only below 1, a
given norm, determinism, the declared `out` operand's checks, the gradients list's checks,
and equality with global_l2_norm + unary('scale')."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.clip_grad.reference import clip_coefficient, clip_grad_norm_reference
from gpuplan.ops.reduction.launch import NORM_CHUNK
from gpuplan.ops.reduction.reference import global_l2_norm_reference
from gpuplan.testing import assert_close, assert_rejected, check_plan, on, random, stream_for

EPS = 1e-6


def _grads(with_f64: bool) -> list[np.ndarray]:
    """Mixed dtypes, several norm chunks, an empty tensor; f64 makes the norm f64."""
    dts = [np.float32, gp.bfloat16, np.float16, np.float64 if with_f64 else np.float32]
    shapes = [(NORM_CHUNK + 7,), (7, 13), (0,), (3, 300)]
    return [random(s, t, seed=i, low=-2, high=2) for i, (s, t) in enumerate(zip(shapes, dts,
                                                                               strict=True))]


def _reference(grads: list, max_norm: float, total: float | None = None):
    norm, scaled, _ = clip_grad_norm_reference(grads, max_norm, EPS, total)
    return norm, scaled


@pytest.mark.parametrize("with_f64", [False, True], ids=["f32-norm", "f64-norm"])
@pytest.mark.parametrize("max_norm,given", [(1.0, None), (1e6, None), (2.0, 50.0),
                                            (2.0, 1.0)])
def test_clips_like_the_reference(device, with_f64, max_norm, given):
    """check_plan: the norm (`out`) and the gradients (scaled in place) against float64,
    then every malformed `out`, each rejected with nothing written."""
    grads = _grads(with_f64)
    host = [g.copy() for g in grads]
    dev = tuple(on(device, g.copy()) for g in grads)
    desc = gp.ClipGradNormDescriptor(tuple(g.size for g in grads), tuple(g.dtype for g in grads))
    want_norm, want = _reference(host, max_norm, given)

    def reference(out, arrays, max_norm, eps, total_norm):
        for a, w, g in zip(arrays, want, host, strict=True):  # scaled in place by the run
            if w.size and clip_coefficient(want_norm, max_norm, EPS) == 1.0:
                np.testing.assert_array_equal(gp.to_host(a), g)  # untouched, bit for bit
            else:
                assert_close(a, w, g.dtype, scale=2)
        return {"out": np.float64(want_norm)}

    plan = check_plan(gp.ClipGradNormPlan, desc,
                      dict(arrays=dev, max_norm=max_norm, eps=EPS, total_norm=given),
                      reference, device=device, scale=10,
                      tolerance_dtype=desc.out_dtype())
    g = plan.precision_guarantee()
    assert g.deterministic and g.bit_stable


def test_equals_global_norm_then_scale_bitwise(device):
    """The fused plan is get_total_norm + clip_grads_with_norm_'s former per-tensor
    unary('scale') bit for bit, norm included."""
    F = gp.functional
    grads = _grads(False)
    a = [on(device, g.copy()) for g in grads]
    b = [on(device, g.copy()) for g in grads]
    norm = F.clip_grad_norm_(a, 0.5)
    norm2 = float(gp.to_host(F.global_l2_norm(b)))
    assert float(gp.to_host(norm)) == norm2
    coef = 0.5 / (norm2 + EPS)
    for x, y in zip(a, b, strict=True):
        if y.size:
            np.testing.assert_array_equal(gp.to_host(x), gp.to_host(F.unary("scale", y,
                                                                             alpha=coef)))


def test_nonfinite_norm_propagates(device):
    g = random((5,), np.float32)
    g[2] = np.inf
    d = on(device, g)
    norm = gp.functional.clip_grad_norm_([d], 1.0)
    assert np.isinf(float(gp.to_host(norm)))
    out = gp.to_host(d)
    assert np.isnan(out[2]) and np.all(out[[0, 1, 3, 4]] == 0)  # coef 0: inf * 0 is NaN


def test_list_errors_leave_gradients_untouched(device):
    s = stream_for(device)
    grads = [random((10,), np.float32, seed=1), random((3, 4), np.float64, seed=2)]
    desc = gp.ClipGradNormDescriptor((10, 12), (np.float32, np.float64))
    plan = gp.ClipGradNormPlan.select(s, desc)
    ws = gp.Workspace.allocate(s, plan.workspace_size())
    a, b = (on(device, g) for g in grads)
    out = on(device, np.zeros((), np.float64))

    def run(arrays, **kw):
        return lambda: plan.run(s, ws, gp.ClipGradNormArgs(out, arrays, **({"max_norm": 0.1}
                                                                          | kw)))

    assert_rejected(run((a,)), gp.InvalidProblem, [a, b, out], "clip_grad_norm", "'arrays'",
                    "2 arrays")
    assert_rejected(run((a, on(device, grads[1].astype(np.float32)))), gp.Unsupported,
                    [a, b, out], "'arrays[1]'")
    assert_rejected(run((a, on(device, np.zeros(6, np.float64)))), gp.BufferTooSmall,
                    [a, b, out], "'arrays[1]'", "12 elements")
    assert_rejected(run((a, b), max_norm="1"), gp.InvalidProblem, [a, b, out], "'max_norm'")
    assert_rejected(run((a, b), total_norm=[1.0]), gp.InvalidProblem, [a, b, out],
                    "'total_norm'")
    if device == "cpu":
        ro = grads[1].reshape(12).copy()
        ro.flags.writeable = False
        assert_rejected(run((a, ro)), gp.InvalidProblem, [a, out], "'arrays[1]'", "writable")


def test_overlapping_gradients_are_rejected(device):
    s = stream_for(device)
    buf = on(device, random((20,), np.float32))
    before = gp.to_host(buf).copy()
    desc = gp.ClipGradNormDescriptor((12, 12), (np.float32, np.float32))
    plan = gp.ClipGradNormPlan.select(s, desc)
    ws = gp.Workspace.allocate(s, plan.workspace_size())
    out = on(device, np.zeros((), np.float32))
    assert_rejected(lambda: plan.run(s, ws, gp.ClipGradNormArgs(out, (buf[:12], buf[8:]),
                                                                 max_norm=1e-3)),
                    gp.InvalidProblem, [buf, out], "'arrays[", "overlapping")
    np.testing.assert_array_equal(gp.to_host(buf), before)


def test_functional_and_descriptor():
    F = gp.functional
    assert F.clip_grad_norm_([], 1.0).shape == ()
    z = np.zeros(0, np.float32)
    assert float(F.clip_grad_norm_([z, z], 1.0)) == 0.0
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="clip_grad_norm: argument 'dtypes'"):
        gp.ClipGradNormPlan.select(s, gp.ClipGradNormDescriptor((3, 4), (np.float32,)))
    with pytest.raises(gp.Unsupported, match="argument 'dtypes\\[1\\]'"):
        gp.ClipGradNormPlan.select(s, gp.ClipGradNormDescriptor((3, 4),
                                                                (np.float32, np.int8)))


# -- the global norm is overflow- and underflow-safe (issue 11) ----------------------------


def _hypot(arrays: list) -> float:
    """The reduction family's reference: Python's math.hypot is scaled (no overflow or
    underflow)."""
    return global_l2_norm_reference(arrays)


@pytest.mark.parametrize("case", ["f32-huge", "f32-tiny", "f64-huge-and-tiny", "mixed"])
def test_global_norm_neither_overflows_nor_underflows(device, case):
    """1e20 float32 values gave an inf norm (their squares overflow f32), 1e-30 ones 0."""
    n = NORM_CHUNK + 9  # two chunks of the kernel
    arrays = {
        "f32-huge": [np.full(n, 1e20, np.float32), np.full(5, -3e19, np.float32)],
        "f32-tiny": [np.full(n, 1e-30, np.float32), np.full(3, 1e-41, np.float32)],
        "f64-huge-and-tiny": [np.array([1e200, -3e250, 1e-300, 2.0, 1e-200])],
        "mixed": [np.full(7, 2e38, np.float32), np.full(9, 1e-310), random((40,), gp.bfloat16)],
    }[case]
    want = _hypot(arrays)
    assert np.isfinite(want) and want > 0
    out_dtype = np.float64 if any(a.dtype == np.float64 for a in arrays) else np.float32
    rtol = 1e-6 if out_dtype == np.float32 else 1e-14  # relative only: tiny norms count
    norm = gp.functional.global_l2_norm([on(device, a) for a in arrays])
    assert norm.dtype == out_dtype
    np.testing.assert_allclose(float(gp.to_host(norm)), want, rtol=rtol, atol=0)
    # Clipping by that norm scales instead of zeroing every gradient (an inf norm gave coef 0).
    grads = [on(device, a.copy()) for a in arrays]
    got = gp.functional.clip_grad_norm_(grads, 1.0)
    np.testing.assert_allclose(float(gp.to_host(got)), want, rtol=rtol, atol=0)
    if want > 1.0:
        # the scaled gradients are rounded to their dtypes (f32 at best for the large ones)
        assert_close(gp.functional.global_l2_norm(grads), np.float64(1.0), np.float32,
                     scale=8)


def test_global_norm_still_propagates_nan_and_inf(device):
    """Scaling must not hide a non-finite gradient: NaN anywhere gives NaN, inf gives inf
    (what --on-nonfinite detects), beside huge and tiny values."""
    F = gp.functional
    for bad, check in ((np.nan, np.isnan), (np.inf, np.isinf), (-np.inf, np.isinf)):
        for dtype in (np.float32, np.float64):
            a = np.full(NORM_CHUNK + 3, 1e20, dtype)
            a[NORM_CHUNK + 1] = bad
            tiny = np.full(4, 1e-30, dtype)
            assert check(float(gp.to_host(F.global_l2_norm([on(device, tiny),
                                                              on(device, a)])))), (bad, dtype)
    nan_only_small = [on(device, np.array([1e-300, np.nan]))]  # NaN with only small values
    assert np.isnan(float(gp.to_host(F.global_l2_norm(nan_only_small))))


@pytest.mark.parametrize("kw,name", [({"max_norm": math.nan}, "'max_norm'"),
                                     ({"max_norm": -1.0}, "'max_norm'"),
                                     ({"eps": math.nan}, "'eps'"), ({"eps": math.inf}, "'eps'"),
                                     ({"eps": -1e-6}, "'eps'")])
def test_nan_or_negative_clip_scalars_are_rejected_with_nothing_written(device, kw, name):
    """A NaN max_norm used to scale every gradient by NaN silently (NaN alpha/beta were
    accepted by some plans and rejected by others); inf max_norm means no clipping."""
    s = stream_for(device)
    g = on(device, random((10,), np.float32, seed=1))
    plan = gp.ClipGradNormPlan.select(s, gp.ClipGradNormDescriptor((10,), (np.float32,)))
    ws = gp.Workspace.allocate(s, plan.workspace_size())
    out = on(device, np.zeros((), np.float32))
    args = gp.ClipGradNormArgs(out, (g,), **({"max_norm": 0.1, "eps": EPS} | kw))
    assert_rejected(lambda: plan.run(s, ws, args), gp.InvalidProblem, [g, out],
                    "clip_grad_norm", name)
    before = gp.to_host(g).copy()
    gp.functional.clip_grad_norm_([g], math.inf)  # allowed: nothing is scaled
    np.testing.assert_array_equal(gp.to_host(g), before)
