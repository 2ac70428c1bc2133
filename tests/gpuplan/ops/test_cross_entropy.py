"""Cross-entropy plans (ignore_index, reductions, label smoothing) against float64 references."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.dtypes import accumulator
from tests.plan_testing import (
    DTYPES,
    INDEX_DTYPES,
    assert_close,
    assert_rejected,
    f64,
    on,
    random,
    run_plan,
    stream_for,
)

SHAPES = [(1, 1), (7, 33), (5, 1024), (6, 1025), (3, 50257)]
IGNORE = -100


def _targets(n, v, dtype, seed=0):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, v, size=n)
    t[::3] = IGNORE  # every third row ignored (row 0 included)
    return t.astype(dtype)


def ref_loss_rows(logits, target, smoothing):
    """Per-row loss (0 on ignored rows) and lse, in float64, from the definitions:
    -log p_t with p = exp(x) / sum exp(x), smoothed with the mean of -log p_j."""
    x = f64(logits)
    out, lse = np.zeros(x.shape[0]), np.zeros(x.shape[0])
    for n, t in enumerate(np.asarray(target).tolist()):
        m = x[n].max()
        lse[n] = m + np.log(np.exp(x[n] - m).sum())
        logp = x[n] - lse[n]
        if t != IGNORE:
            out[n] = (1 - smoothing) * -logp[t] + smoothing * np.mean(-logp)
    return out, lse


def ref_reduce(rows, target, reduction):
    if reduction == "none":
        return rows
    total = rows.sum()
    return total if reduction == "sum" else total / np.count_nonzero(np.asarray(target) != IGNORE)


def ref_grad(logits, target, smoothing, dloss, reduction):
    """d(reduced loss)/d logits by the chain rule: d(-log p_k)/dx_j = p_j - [j == k]."""
    x = f64(logits)
    keep = np.asarray(target) != IGNORE
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g = np.zeros_like(x)
    for n, t in enumerate(np.asarray(target).tolist()):
        if t == IGNORE:
            continue
        onehot = np.zeros(x.shape[1])
        onehot[t] = 1
        dn = (1 - smoothing) * (p[n] - onehot) + smoothing * (p[n] - 1.0 / x.shape[1])
        w = dloss[n] if reduction == "none" else dloss
        if reduction == "mean":
            w = w / keep.sum()
        g[n] = w * dn
    return g


def _forward(device, logits, target, reduction, smoothing, dtype):
    n, v = logits.shape
    acc = accumulator(dtype)
    loss = on(device, np.full((n,) if reduction == "none" else (), 7, acc))
    lse = on(device, np.full(n, 7, acc))
    desc = gp.CrossEntropyDescriptor(n, v, IGNORE, reduction, smoothing, dtype)
    plan = run_plan(gp.CrossEntropyPlan, desc,
                    gp.CrossEntropyArgs(on(device, logits), on(device, target), loss, lse), device)
    return plan, loss, lse


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("n,v", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_forward(device, dtype, index_dtype, n, v, reduction, smoothing):
    logits = random((n, v), dtype, seed=1, low=-6, high=6)
    target = _targets(n, v, index_dtype)
    plan, loss, lse = _forward(device, logits, target, reduction, smoothing, dtype)
    rows, rlse = ref_loss_rows(logits, target, smoothing)
    acc = accumulator(dtype)
    assert_close(lse, rlse, acc, scale=4)
    if reduction == "mean" and np.all(target == IGNORE):
        assert np.isnan(f64(loss))  # 0 / 0, as PyTorch
    else:
        assert_close(loss, ref_reduce(rows, target, reduction), acc, scale=8)
    assert plan.precision_guarantee().deterministic


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("n,v", SHAPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_backward(device, dtype, index_dtype, n, v, reduction, smoothing):
    logits = random((n, v), dtype, seed=2, low=-4, high=4)
    target = _targets(n, v, index_dtype, seed=1)
    acc = accumulator(dtype)
    _, rlse = ref_loss_rows(logits, target, smoothing)
    dloss = random((n,), acc, seed=3) if reduction == "none" else np.asarray(1.7, acc)
    dlogits = on(device, np.full((n, v), 7, dtype))
    desc = gp.CrossEntropyBackwardDescriptor(n, v, IGNORE, reduction, smoothing, dtype)
    run_plan(gp.CrossEntropyBackwardPlan, desc,
             gp.CrossEntropyBackwardArgs(on(device, logits), on(device, target),
                                         on(device, rlse.astype(acc)), on(device, dloss),
                                         dlogits), device)
    ref = ref_grad(logits, target, smoothing, f64(dloss), reduction)
    assert_close(dlogits, ref, dtype, scale=4)
    np.testing.assert_array_equal(f64(dlogits)[np.asarray(target) == IGNORE], 0.0)


def test_reference_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 5))
    t = np.array([1, IGNORE, 4, 0])
    for reduction in ("none", "mean", "sum"):
        dloss = rng.normal(size=4) if reduction == "none" else 0.8
        h = 1e-6

        def objective(xx, reduction=reduction, dloss=dloss):
            red = ref_reduce(ref_loss_rows(xx, t, 0.3)[0], t, reduction)
            return float(np.sum(red * dloss))

        num = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[i] += h
            xm[i] -= h
            num[i] = (objective(xp) - objective(xm)) / (2 * h)
        np.testing.assert_allclose(ref_grad(x, t, 0.3, np.asarray(dloss), reduction), num,
                                   rtol=1e-6, atol=1e-9)


def test_all_ignored_rows(device):
    logits = random((4, 6), np.float32)
    target = np.full(4, IGNORE, np.int64)
    _, loss, _ = _forward(device, logits, target, "mean", 0.0, np.float32)
    assert np.isnan(f64(loss))
    _, loss, _ = _forward(device, logits, target, "sum", 0.0, np.float32)
    assert f64(loss) == 0
    dl = gp.functional.cross_entropy_backward(on(device, logits), on(device, target),
                                              on(device, np.zeros(4, np.float32)),
                                              on(device, np.float32(1)), reduction="mean")
    assert np.all(f64(dl) == 0)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_empty_batch(device, reduction):
    logits = np.zeros((0, 5), np.float32)
    target = np.zeros(0, np.int32)
    _, loss, lse = _forward(device, logits, target, reduction, 0.0, np.float32)
    if reduction == "mean":
        assert np.isnan(f64(loss))
    elif reduction == "sum":
        assert f64(loss) == 0
    else:
        assert loss.shape == (0,)
    dl = gp.functional.cross_entropy_backward(on(device, logits), on(device, target), lse,
                                              on(device, np.zeros(loss.shape, np.float32)),
                                              reduction=reduction)
    assert dl.shape == (0, 5)


def test_out_of_range_target_rejected_on_host():
    # Host SKU: can_implement inspects the targets (documented choice; the GPU gives NaN).
    logits = random((3, 4), np.float32)
    loss = np.full((), 5, np.float32)
    lse = np.full(3, 5, np.float32)
    plan = gp.CrossEntropyPlan.select(gp.Stream.host(), gp.CrossEntropyDescriptor(3, 4))
    for bad in (4, -1):
        t = np.array([0, bad, 1], np.int64)
        assert_rejected(lambda t=t: plan.run(gp.Stream.host(), None,
                                             gp.CrossEntropyArgs(logits, t, loss, lse)),
                        gp.InvalidProblem, [loss.reshape(1), lse], "cross_entropy", "'target'",
                        f"target[1] = {bad}", "[0, 4)")


@pytest.mark.gpu
def test_out_of_range_target_gives_nan_on_device():
    logits = on("cuda", random((3, 4), np.float32))
    t = on("cuda", np.array([0, 9, -5], np.int64))
    loss, lse = gp.functional.cross_entropy(logits, t, reduction="none")
    host = gp.to_host(loss)
    assert np.isfinite(host[0]) and np.isnan(host[1]) and np.isnan(host[2])
    dl = gp.to_host(gp.functional.cross_entropy_backward(
        logits, t, lse, on("cuda", np.ones(3, np.float32)), reduction="none"))
    assert np.all(np.isfinite(dl[0])) and np.all(np.isnan(dl[1:]))


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.Unsupported, match="cross_entropy: argument 'reduction'"):
        gp.CrossEntropyPlan.select(s, gp.CrossEntropyDescriptor(2, 3, reduction="max"))
    with pytest.raises(gp.InvalidProblem, match="'label_smoothing'"):
        gp.CrossEntropyBackwardPlan.select(s, gp.CrossEntropyBackwardDescriptor(
            2, 3, label_smoothing=1.5))
    with pytest.raises(gp.InvalidProblem, match="'vocab'"):
        gp.CrossEntropyPlan.select(s, gp.CrossEntropyDescriptor(2, 0))
    with pytest.raises(gp.InvalidProblem, match="'n'"):
        gp.CrossEntropyPlan.select(s, gp.CrossEntropyDescriptor(-2, 3))
    with pytest.raises(gp.Unsupported, match="dtype"):
        gp.CrossEntropyPlan.select(s, gp.CrossEntropyDescriptor(2, 3, dtype=np.int8))
    with pytest.raises(gp.Unsupported, match="nvrtc requested"):
        gp.CrossEntropyPlan.select(s, gp.CrossEntropyDescriptor(2, 3),
                                   gp.PlanPreference(backend=gp.BackendKind.NVRTC))


def test_argument_errors_leave_outputs_untouched(device):
    n, v = 5, 7
    s = stream_for(device)
    logits = on(device, random((n, v), np.float32))
    target = on(device, np.arange(n, dtype=np.int32))
    loss, lse = on(device, np.full((), 9, np.float32)), on(device, np.full(n, 9, np.float32))
    plan = gp.CrossEntropyPlan.select(s, gp.CrossEntropyDescriptor(n, v, reduction="sum"))
    ws = gp.Workspace.allocate(s, plan.workspace_size())

    def run(ws=ws, **kw):
        a = dict(logits=logits, target=target, loss=loss, lse=lse) | kw
        return lambda: plan.run(s, ws, gp.CrossEntropyArgs(**a))

    outs = [loss.reshape(1), lse]  # a 1-element view: assert_rejected compares bytes of >= 1-d
    assert_rejected(run(logits=logits.astype(np.float16)), gp.Unsupported, outs,
                    "cross_entropy", "'logits'", "f32", "f16")
    assert_rejected(run(target=target.astype(np.float32)), gp.Unsupported, outs, "'target'")
    assert_rejected(run(lse=lse.astype(np.float64)), gp.Unsupported, outs, "'lse'", "f64")
    assert_rejected(run(target=target[:-1]), gp.BufferTooSmall, outs, "'target'", "5", "4")
    assert_rejected(run(loss=lse), gp.InvalidProblem, outs, "'loss'", "shape ()")
    assert_rejected(run(logits=logits.reshape(v, n)), gp.InvalidProblem, outs, "'logits'")
    assert_rejected(run(lse=logits.reshape(-1)[:n]), gp.InvalidProblem, outs, "'lse'",
                    "distinct")
    if device == "cuda":
        assert plan.workspace_size() > 0
        assert_rejected(run(ws=gp.Workspace.none()), gp.WorkspaceTooSmall, outs, "'ws'")
        assert_rejected(run(target=gp.to_host(target)), gp.InvalidProblem, outs, "'target'")
    bwd = gp.CrossEntropyBackwardPlan.select(s, gp.CrossEntropyBackwardDescriptor(n, v))
    dl = on(device, np.full((n, v), 9, np.float32))
    assert_rejected(lambda: bwd.run(s, gp.Workspace.allocate(s, bwd.workspace_size()),
                                    gp.CrossEntropyBackwardArgs(logits, target, lse, lse, dl)),
                    gp.InvalidProblem, [dl], "cross_entropy_backward", "'dloss'", "shape ()")


@pytest.mark.parametrize("dtype", DTYPES)
def test_functional_api(device, dtype):
    logits = random((9, 40), dtype, seed=4, low=-3, high=3)
    target = _targets(9, 40, np.int64, seed=5)
    acc = accumulator(dtype)
    loss, lse = gp.functional.cross_entropy(on(device, logits), on(device, target),
                                            label_smoothing=0.1)
    assert loss.shape == () and loss.dtype == acc and lse.shape == (9,)
    rows, _ = ref_loss_rows(logits, target, 0.1)
    assert_close(loss, ref_reduce(rows, target, "mean"), acc, scale=8)
    dl = gp.functional.cross_entropy_backward(on(device, logits), on(device, target), lse,
                                              np.float64(2.0) if device == "cpu" else
                                              on(device, np.asarray(2.0)),
                                              label_smoothing=0.1)
    assert dl.shape == (9, 40) and dl.dtype == dtype
    assert_close(dl, ref_grad(logits, target, 0.1, 2.0, "mean"), dtype, scale=4)
    loss_n, _ = gp.functional.cross_entropy(on(device, logits), on(device, target),
                                            reduction="none", ignore_index=IGNORE)
    assert loss_n.shape == (9,)
    assert_close(loss_n, ref_loss_rows(logits, target, 0.0)[0], acc, scale=8)


@pytest.mark.gpu
def test_device_skus_and_determinism():
    s = gp.Stream.current()
    fwd = gp.CrossEntropyPlan.select(s, gp.CrossEntropyDescriptor(8, 50257, reduction="mean"),
                                     gp.PlanPreference(deterministic=True))
    assert fwd.sku().variant == "block_row" and fwd.workspace_size() == 8 * 4
    logits = on("cuda", random((300, 3000), np.float32, seed=6, low=-5, high=5))
    target = on("cuda", _targets(300, 3000, np.int32))
    first = gp.to_host(gp.functional.cross_entropy(logits, target)[0])
    for _ in range(3):
        np.testing.assert_array_equal(gp.to_host(gp.functional.cross_entropy(logits, target)[0]),
                                      first)
