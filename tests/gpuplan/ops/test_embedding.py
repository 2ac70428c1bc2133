"""Embedding forward/backward plans against float64 NumPy references, on host and device."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.spec_check import check_plan
from tests.plan_testing import (
    DTYPES,
    INDEX_DTYPES,
    assert_close,
    assert_rejected,
    embedding_backward_reference,
    embedding_reference,
    f64,
    on,
    random,
    run_plan,
    stream_for,
)

SHAPES = [(1, 1, 1), (7, 5, 11), (50, 33, 257), (1000, 768, 4096)]


def _indices(n: int, v: int, dtype, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(-2, v + 2, size=n)  # includes negative and out-of-range rows
    return idx.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("v,d,n", SHAPES)
def test_forward_matches_reference(device, dtype, index_dtype, v, d, n):
    w = random((v, d), dtype)
    idx = _indices(n, v, index_dtype)
    out = on(device, np.full((n, d), 7, dtype=dtype))
    plan = run_plan(gp.EmbeddingPlan, gp.EmbeddingDescriptor(v, d, n, dtype),
                    gp.EmbeddingArgs(on(device, w), on(device, idx), out), device)
    np.testing.assert_array_equal(f64(out), embedding_reference(w, idx))  # a gather is exact
    assert plan.precision_guarantee().bit_stable


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("v,d,n", SHAPES)
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_matches_reference(device, dtype, index_dtype, v, d, n, deterministic):
    dout = random((n, d), dtype, seed=3)
    idx = _indices(n, v, index_dtype)
    pad = min(2, v - 1)
    dw = on(device, np.zeros((v, d), dtype=dtype))
    desc = gp.EmbeddingBackwardDescriptor(v, d, n, padding_idx=pad, dtype=dtype)
    plan = run_plan(gp.EmbeddingBackwardPlan, desc,
                    gp.EmbeddingBackwardArgs(on(device, dout), on(device, idx), dw), device,
                    gp.PlanPreference(deterministic=deterministic))
    # Each sum has at most ~n/v terms in the accumulator: scale tolerance with that count.
    assert_close(dw, embedding_backward_reference(dout, idx, v, pad), dtype,
                 scale=max(1.0, n / v / 4))
    if deterministic:
        assert plan.precision_guarantee().deterministic


@pytest.mark.parametrize("dtype", DTYPES)
def test_deterministic_backward_is_bit_identical_to_host(device, dtype):
    v, d, n = 13, 40, 3000  # many repeats per row: order of additions matters
    dout = random((n, d), dtype, seed=5)
    idx = _indices(n, v, np.int64)
    desc = gp.EmbeddingBackwardDescriptor(v, d, n, padding_idx=None, dtype=dtype)
    pref = gp.PlanPreference(deterministic=True)
    host = np.zeros((v, d), dtype=dtype)
    run_plan(gp.EmbeddingBackwardPlan, desc, gp.EmbeddingBackwardArgs(dout, idx, host), "cpu",
             pref)
    for _ in range(2):
        dw = on(device, np.zeros((v, d), dtype=dtype))
        run_plan(gp.EmbeddingBackwardPlan, desc,
                 gp.EmbeddingBackwardArgs(on(device, dout), on(device, idx), dw), device, pref)
        np.testing.assert_array_equal(gp.to_host(dw).view(np.uint8), host.view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_plans_through_check_plan(device, dtype, index_dtype):
    """Results against the references, then every malformed operand the specs imply."""
    v, d, n = 9, 7, 20
    w, dout = random((v, d), dtype), random((n, d), dtype, seed=2)
    idx = _indices(n, v, index_dtype)
    check_plan(gp.EmbeddingPlan, gp.EmbeddingDescriptor(v, d, n, dtype),
               {"weight": w, "indices": idx},
               lambda weight, indices, out: embedding_reference(weight, idx), device=device)
    dw0 = random((v, d), dtype, seed=3)  # accumulated into
    before = f64(dw0)  # on the host check_plan's dweight is dw0 itself, updated in place
    check_plan(gp.EmbeddingBackwardPlan, gp.EmbeddingBackwardDescriptor(v, d, n, 4, dtype),
               {"dout": dout, "indices": idx, "dweight": dw0},
               lambda dout, indices, dweight: before + embedding_backward_reference(
                   dout, idx, v, 4), device=device, scale=2)


def test_backward_accumulates_into_existing_gradient():
    v, d, n = 4, 3, 6
    dout = random((n, d), np.float64)
    idx = np.array([0, 1, 1, 3, 3, 3])
    dw = np.ones((v, d))
    run_plan(gp.EmbeddingBackwardPlan, gp.EmbeddingBackwardDescriptor(v, d, n, dtype=np.float64),
             gp.EmbeddingBackwardArgs(dout, idx, dw), "cpu")
    np.testing.assert_allclose(dw, 1 + embedding_backward_reference(dout, idx, v, None))


@pytest.mark.parametrize("v,d,n", [(0, 4, 3), (5, 0, 3), (5, 4, 0)])
def test_empty_extents(device, v, d, n):
    w = on(device, np.zeros((v, d), np.float32))
    idx = on(device, np.zeros((n,), np.int32))
    out = on(device, np.full((n, d), 3, np.float32))
    run_plan(gp.EmbeddingPlan, gp.EmbeddingDescriptor(v, d, n), gp.EmbeddingArgs(w, idx, out),
             device)
    assert np.all(gp.to_host(out) == 0)  # no valid row: zeros (or nothing to write)
    dw = on(device, np.full((v, d), 3, np.float32))
    run_plan(gp.EmbeddingBackwardPlan, gp.EmbeddingBackwardDescriptor(v, d, n),
             gp.EmbeddingBackwardArgs(on(device, np.ones((n, d), np.float32)), idx, dw), device)
    assert np.all(gp.to_host(dw) == 3)


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="embedding: argument 'num_indices'"):
        gp.EmbeddingPlan.select(s, gp.EmbeddingDescriptor(3, 4, -1))
    with pytest.raises(gp.Unsupported, match="dtype"):
        gp.EmbeddingPlan.select(s, gp.EmbeddingDescriptor(3, 4, 5, np.int32))
    with pytest.raises(gp.Unsupported, match="nvrtc requested"):
        gp.EmbeddingPlan.select(s, gp.EmbeddingDescriptor(3, 4, 5),
                                gp.PlanPreference(backend=gp.BackendKind.NVRTC))
    with pytest.raises(gp.InvalidProblem, match="embedding_backward: argument 'padding_idx'"):
        gp.EmbeddingBackwardPlan.select(s, gp.EmbeddingBackwardDescriptor(3, 4, 5, 1.5))
    with pytest.raises(gp.InvalidProblem, match="'embedding_dim'.*>= 0"):
        gp.EmbeddingBackwardPlan.select(s, gp.EmbeddingBackwardDescriptor(3, -4, 5))
    # A negative padding_idx is a valid descriptor: it never matches a row (rows < 0 are
    # skipped anyway); autograd's embedding counts a negative one from V before it gets here.
    plan = gp.EmbeddingBackwardPlan.select(s, gp.EmbeddingBackwardDescriptor(3, 2, 2, -1))
    dw = np.zeros((3, 2), np.float32)
    plan.run(s, None, gp.EmbeddingBackwardArgs(np.ones((2, 2), np.float32),
                                               np.array([2, -1], np.int64), dw))
    np.testing.assert_array_equal(dw, [[0, 0], [0, 0], [1, 1]])


def test_argument_errors_leave_outputs_untouched(device):
    v, d, n = 5, 4, 6
    s = stream_for(device)
    w = on(device, random((v, d), np.float32))
    idx = on(device, np.arange(n, dtype=np.int64) % v)
    out = on(device, np.full((n, d), 9, np.float32))
    plan = gp.EmbeddingPlan.select(s, gp.EmbeddingDescriptor(v, d, n, np.float32))
    ws = gp.Workspace.none()

    def run(**kw):
        a = dict(weight=w, indices=idx, out=out) | kw
        return lambda: plan.run(s, ws, gp.EmbeddingArgs(**a))

    assert_rejected(run(weight=w.astype(np.float64)), gp.Unsupported, [out],
                    "embedding", "'weight'", "f32", "f64")
    assert_rejected(run(indices=idx.astype(np.float32)), gp.Unsupported, [out], "'indices'")
    assert_rejected(run(out=on(device, np.zeros((n - 1, d), np.float32))), gp.BufferTooSmall,
                    [out], "'out'", "24", "20")
    assert_rejected(run(weight=w.reshape(d, v)), gp.InvalidProblem, [out], "'weight'", "(5, 4)")
    assert_rejected(run(out=on(device, np.zeros((n, 2 * d), np.float32))[:, ::2]),
                    gp.InvalidProblem, [out], "contiguous")
    if device == "cuda":  # mixing host and device arrays
        assert_rejected(run(indices=gp.to_host(idx)), gp.InvalidProblem, [out], "'indices'")


def test_backward_rejects_aliasing_and_keeps_dweight():
    v = d = n = 4
    dw = np.ones((v, d), np.float32)
    plan = gp.EmbeddingBackwardPlan.select(gp.Stream.host(),
                                           gp.EmbeddingBackwardDescriptor(v, d, n))
    assert_rejected(lambda: plan.run(gp.Stream.host(), None,
                                     gp.EmbeddingBackwardArgs(dw, np.zeros(n, np.int32), dw)),
                    gp.InvalidProblem, [dw], "'dweight'", "distinct")


def test_sku_and_functional_api():
    w = random((10, 3), np.float32)
    idx = np.array([[1, 2], [3, 11]], np.int32)
    out = gp.functional.embedding(w, idx)
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(out[1, 1], 0)
    dw = gp.functional.embedding_backward(np.ones((2, 2, 3), np.float32), idx, 10,
                                          padding_idx=1)
    assert dw[2].tolist() == [1, 1, 1] and dw[1].tolist() == [0, 0, 0]
    plan = gp.EmbeddingPlan.select(gp.Stream.host(), gp.EmbeddingDescriptor(10, 3, 4))
    plan.can_implement(gp.EmbeddingArgs(w, idx.reshape(-1), np.empty((4, 3), np.float32)))
    sku = plan.sku()
    assert (sku.op, sku.dtype, sku.index_dtype, sku.backend) == (
        "embedding", "f32", "i32", gp.BackendKind.NUMPY)


@pytest.mark.gpu
def test_device_skus():
    s = gp.Stream.current()
    f32 = gp.EmbeddingBackwardDescriptor(10, 4, 8, dtype=np.float32)
    assert gp.EmbeddingBackwardPlan.select(s, f32).sku().variant == "atomic"
    assert not gp.EmbeddingBackwardPlan.select(s, f32).precision_guarantee().deterministic
    det = gp.EmbeddingBackwardPlan.select(s, f32, gp.PlanPreference(deterministic=True))
    assert det.sku().variant == "segment" and det.precision_guarantee().bit_stable
    bf = gp.EmbeddingBackwardDescriptor(10, 4, 8, dtype=gp.bfloat16)
    assert gp.EmbeddingBackwardPlan.select(s, bf).sku().variant == "segment"
