"""Cross-entropy plans (ignore_index, reductions, label smoothing) against float64 references."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from gpuplan.dtypes import accumulator
from gpuplan.ops.cross_entropy.reference import (
    cross_entropy_grad_reference,
    cross_entropy_over_blocks,
    cross_entropy_reduce_reference,
    cross_entropy_reference,
)
from gpuplan.testing import assert_close, assert_rejected, f64, on, random, run_plan, stream_for
from tests.helpers import DTYPES, INDEX_DTYPES

SHAPES = [(1, 1), (7, 33), (5, 1024), (6, 1025), (3, 50257)]
IGNORE = -100


def _targets(n, v, dtype, seed=0):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, v, size=n)
    t[::3] = IGNORE  # every third row ignored (row 0 included)
    return t.astype(dtype)


def ref_loss_rows(logits, target, smoothing):
    return cross_entropy_reference(logits, target, smoothing, IGNORE)


def ref_reduce(rows, target, reduction):
    return cross_entropy_reduce_reference(rows, target, reduction, IGNORE)


def ref_grad(logits, target, smoothing, dloss, reduction):
    return cross_entropy_grad_reference(logits, target, smoothing, dloss, reduction, IGNORE)


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


class _Reference(ag.Function):
    """The float64 reference as an autograd Function: reduced loss forward, ref_grad back."""

    @staticmethod
    def forward(ctx, x, target, smoothing, reduction):
        ctx.args = (x, target, smoothing, reduction)
        return np.asarray(ref_reduce(ref_loss_rows(x, target, smoothing)[0], target, reduction))

    @staticmethod
    def backward(ctx, dloss):
        return ref_grad(*ctx.args[:3], dloss, ctx.args[3]), None


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_reference_gradient_passes_gradcheck(reduction):
    x = ag.tensor(np.random.default_rng(0).normal(size=(4, 5)), requires_grad=True)
    t = np.array([1, IGNORE, 4, 0])
    assert ag.gradcheck(lambda z: _Reference.apply(z, t, smoothing=0.3, reduction=reduction),
                        [x], rtol=1e-6, atol=1e-9)


def test_reference_hand_values():
    """Rows worked out by hand: logits (0, 0) give p = (1/2, 1/2), loss = lse = log 2 (any
    smoothing: both -log p are log 2) and dlogits = p - onehot = (-1/2, 1/2), smoothed
    (1 - ls)(p - onehot) + ls (p - 1/V) = (-0.45, 0.45) at ls = 0.1; logits (1, 2, 3), target
    2: lse = 3 + log(1 + 1/e + 1/e^2), loss = lse - 3; an ignored row adds 0 and is not
    counted by "mean"; "mean" over no row is NaN."""
    log2, e = np.log(2.0), np.e
    rows, lse = cross_entropy_reference(np.zeros((1, 2)), np.array([0]), 0.1, IGNORE)
    np.testing.assert_allclose((rows, lse), ([log2], [log2]), rtol=1e-15)
    x, t = np.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]), np.array([2, IGNORE])
    rows, lse = cross_entropy_reference(x, t, 0.0, IGNORE)
    want = 3 + np.log(1 + 1 / e + 1 / e**2)
    np.testing.assert_allclose(lse[0], want, rtol=1e-15)
    np.testing.assert_allclose(lse[1], 4 + np.log(1 + 2 / e**4), rtol=1e-15)
    np.testing.assert_allclose(rows, [want - 3, 0.0], rtol=1e-14)
    assert cross_entropy_reduce_reference(rows, t, "mean", IGNORE) == rows[0]  # 1 row counted
    assert cross_entropy_reduce_reference(rows, t, "sum", IGNORE) == rows[0]
    assert np.isnan(cross_entropy_reduce_reference(np.zeros(1), np.array([IGNORE]), "mean",
                                                   IGNORE))
    g = cross_entropy_grad_reference(np.zeros((1, 2)), np.array([0]), 0.0, 1.0, "sum", IGNORE)
    np.testing.assert_allclose(g, [[-0.5, 0.5]], rtol=1e-15)
    g = cross_entropy_grad_reference(np.zeros((2, 2)), np.array([0, IGNORE]), 0.1,
                                     np.array([2.0, 5.0]), "none", IGNORE)
    np.testing.assert_allclose(g, [[-0.9, 0.9], [0.0, 0.0]], rtol=1e-14)  # dloss 2 scales


@pytest.mark.parametrize("n,v", [(7, 33), (6, 1025)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_reference_matches_the_host_sku_in_float64(n, v, reduction, smoothing):
    """Two independent codes for one definition: the host SKU in float64 and the references
    agree to ~1e-12 (loss, lse and dlogits)."""
    logits = random((n, v), np.float64, seed=5, low=-8, high=8)
    target = _targets(n, v, np.int64, seed=4)
    _, loss, lse = _forward("cpu", logits, target, reduction, smoothing, np.float64)
    rows, rlse = ref_loss_rows(logits, target, smoothing)
    np.testing.assert_allclose(lse, rlse, rtol=1e-13)
    np.testing.assert_allclose(loss, ref_reduce(rows, target, reduction), rtol=1e-12)
    dloss = random((n,), np.float64, seed=6) if reduction == "none" else np.asarray(0.7)
    dlogits = np.full((n, v), 7.0)
    run_plan(gp.CrossEntropyBackwardPlan,
             gp.CrossEntropyBackwardDescriptor(n, v, IGNORE, reduction, smoothing, np.float64),
             gp.CrossEntropyBackwardArgs(logits, target, lse, dloss, dlogits), "cpu")
    np.testing.assert_allclose(dlogits, ref_grad(logits, target, smoothing, dloss, reduction),
                               rtol=1e-12, atol=1e-15)


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


# -- the vocabulary-parallel stages (gpuplan/ops/cross_entropy/partial.py) ----------------

PARTS = [(7, 33, 3), (6, 1025, 2), (5, 3, 4)]  # (n, vocab, blocks): 3 over 4 leaves one empty


def _split(x, count):
    """Contiguous column blocks of x (balanced, the first ones wider) and their starts."""
    widths = [len(c) for c in np.array_split(np.arange(x.shape[1]), count)]
    starts = np.cumsum([0] + widths[:-1]).tolist()
    return [gp.backend.ascontiguous(x[:, s:s + w]) for s, w in zip(starts, widths,
                                                                  strict=True)], starts


def _partial_backward(blocks, starts, target, lse, dloss, reduction):
    total = sum(b.shape[1] for b in blocks)
    return [gp.functional.cross_entropy_partial_backward(
        b, target, lse, dloss, vocab_start=s, vocab_total=total, ignore_index=IGNORE,
        reduction=reduction) for b, s in zip(blocks, starts, strict=True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("n,v,count", PARTS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_partial_stages_match_dense(device, dtype, index_dtype, n, v, count, reduction):
    logits = random((n, v), dtype, seed=7, low=-6, high=6)
    target = _targets(n, v, index_dtype, seed=2)
    acc = accumulator(dtype)
    blocks, starts = _split(on(device, logits), count)
    t = on(device, target)
    x = f64(logits)
    m = gp.functional.cross_entropy_partial_max(blocks[0])
    assert m.dtype == acc
    np.testing.assert_array_equal(f64(m), x[:, :blocks[0].shape[1]].max(axis=1))
    stats = gp.functional.cross_entropy_partial(blocks[0], t, m, vocab_start=0, vocab_total=v)
    x0 = x[:, :blocks[0].shape[1]]
    picked = [x0[i, k] if 0 <= k < x0.shape[1] else 0.0 for i, k in enumerate(target.tolist())]
    assert_close(stats, [np.exp(x0 - f64(m)[:, None]).sum(axis=1), picked], acc, scale=4)

    loss, lse = cross_entropy_over_blocks(blocks, t, IGNORE, reduction)
    rows, rlse = ref_loss_rows(logits, target, 0.0)
    assert loss.dtype == acc and lse.dtype == acc
    assert_close(lse, rlse, acc, scale=4)
    assert_close(loss, ref_reduce(rows, target, reduction), acc, scale=8)
    dloss = random((n,), acc, seed=3) if reduction == "none" else np.asarray(1.7, acc)
    ref = ref_grad(logits, target, 0.0, dloss, reduction)
    for b, s, dl in zip(blocks, starts, _partial_backward(blocks, starts, t, lse,
                                                          on(device, dloss), reduction),
                        strict=True):
        assert dl.shape == b.shape and dl.dtype == dtype
        assert_close(dl, ref[:, s:s + b.shape[1]], dtype, scale=4)


class _OverBlocks(ag.Function):
    """Cross entropy of x [N, V] through the partial stages over `count` column blocks."""

    @staticmethod
    def forward(ctx, x, target, count, reduction):
        blocks, starts = _split(x, count)
        loss, lse = cross_entropy_over_blocks(blocks, target, IGNORE, reduction)
        ctx.state = (blocks, starts, target, lse, reduction)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        blocks, starts, target, lse, reduction = ctx.state
        grads = _partial_backward(blocks, starts, target, lse, dloss, reduction)
        return gp.backend.concatenate(grads, axis=1), None


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_partial_backward_passes_gradcheck(device, reduction):
    x = ag.tensor(random((4, 7), np.float64, seed=8, low=-3, high=3), device=device,
                  requires_grad=True)
    t = on(device, np.array([6, IGNORE, 0, 3]))
    assert ag.gradcheck(lambda z: _OverBlocks.apply(z, t, count=3, reduction=reduction), [x])


def test_partial_errors():
    s = gp.Stream.host()
    desc = gp.CrossEntropyPartialDescriptor
    with pytest.raises(gp.InvalidProblem, match="cross_entropy_partial: argument 'vocab_start'"):
        gp.CrossEntropyPartialPlan.select(s, desc(2, 3, 5, 7))
    with pytest.raises(gp.InvalidProblem, match="cross_entropy_finish: argument 'vocab_total'"):
        gp.CrossEntropyFinishPlan.select(s, desc(2, 0, 0, 0))
    with pytest.raises(gp.Unsupported, match="partial_backward: argument 'reduction'"):
        gp.CrossEntropyPartialBackwardPlan.select(s, desc(2, 3, 0, 3, reduction="avg"))
    logits, m = random((3, 2), np.float32), np.zeros(3, np.float32)
    stats = np.full((2, 3), 9, np.float32)
    plan = gp.CrossEntropyPartialPlan.select(s, desc(3, 2, 2, 5))

    def run(target, row_max=m):
        return lambda: plan.run(s, None, gp.CrossEntropyPartialArgs(logits, target, row_max,
                                                                    stats))

    # A target beyond the full vocabulary is rejected on the host (NaN on a device).
    assert_rejected(run(np.array([0, 5, 4])), gp.InvalidProblem, [stats],
                    "cross_entropy_partial", "'target'", "target[1] = 5", "[0, 5)")
    assert_rejected(run(np.array([0, 1, 4]), m[:2]), gp.BufferTooSmall, [stats], "'row_max'")
    assert_rejected(run(np.array([0, 1, 4]), stats), gp.InvalidProblem, [stats], "'row_max'")


@pytest.mark.gpu
def test_partial_out_of_range_target_gives_nan_on_device():
    blocks, starts = _split(on("cuda", random((3, 4), np.float32)), 2)
    t = on("cuda", np.array([0, 9, -5], np.int64))
    loss, lse = cross_entropy_over_blocks(blocks, t, IGNORE, "none")
    host = gp.to_host(loss)
    assert np.isfinite(host[0]) and np.isnan(host[1]) and np.isnan(host[2])
    dl = gp.to_host(_partial_backward(blocks, starts, t, lse, on("cuda", np.ones(3, np.float32)),
                                      "none")[1])
    assert np.all(np.isfinite(dl[0])) and np.all(np.isnan(dl[1:]))
