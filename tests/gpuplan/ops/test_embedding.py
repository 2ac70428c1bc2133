"""Embedding forward/backward plans against float64 NumPy references, on host and device."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.embedding.reference import embedding_backward_reference, embedding_reference
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
from tests.helpers import DTYPES, INDEX_DTYPES

SHAPES = [(1, 1, 1), (7, 5, 11), (50, 33, 257), (1000, 768, 4096)]


def _indices(n: int, v: int, dtype, seed: int = 1, offset: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(-2, v + 2, size=n) + offset  # includes rows outside [0, v) after -offset
    return idx.astype(dtype)


#: index_offset values: a shard's start, a negative one, one beyond int32 (int64 only).
OFFSETS = [5, -3, 2**31 + 7]


def _offsets(index_dtype):
    return [o for o in OFFSETS if np.iinfo(index_dtype).min <= o - 2 and
            o + 2 <= np.iinfo(index_dtype).max - 64]


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
@pytest.mark.parametrize("offset", [0, -6])
def test_deterministic_backward_is_bit_identical_to_host(device, dtype, offset):
    v, d, n = 13, 40, 3000  # many repeats per row: order of additions matters
    # Exact equality with the host holds on a GPU too: the deterministic kernel only adds (no
    # product for FMA contraction to fuse), in the host's order, and with normal inputs of
    # magnitude ~1 no partial sum comes near the subnormal range that -ftz=true would flush.
    dout = random((n, d), dtype, seed=5)
    idx = _indices(n, v, np.int64, offset=offset)
    desc = gp.EmbeddingBackwardDescriptor(v, d, n, padding_idx=None, dtype=dtype,
                                          index_offset=offset)
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
@pytest.mark.parametrize("offset", [0, 6])
def test_plans_through_check_plan(device, dtype, index_dtype, offset):
    """Results against the references, then every malformed operand the specs imply."""
    v, d, n = 9, 7, 20
    w, dout = random((v, d), dtype), random((n, d), dtype, seed=2)
    idx = _indices(n, v, index_dtype, offset=offset)
    check_plan(gp.EmbeddingPlan, gp.EmbeddingDescriptor(v, d, n, dtype, offset),
               {"weight": w, "indices": idx},
               lambda weight, indices, out: embedding_reference(weight, idx, offset),
               device=device)
    dw0 = random((v, d), dtype, seed=3)  # accumulated into
    before = f64(dw0)  # on the host check_plan's dweight is dw0 itself, updated in place
    pad = offset + 4
    check_plan(gp.EmbeddingBackwardPlan,
               gp.EmbeddingBackwardDescriptor(v, d, n, pad, dtype, offset),
               {"dout": dout, "indices": idx, "dweight": dw0},
               lambda dout, indices, dweight: before + embedding_backward_reference(
                   dout, idx, v, pad, offset), device=device, scale=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("v,d,n", SHAPES[1:3])
def test_shifted_forward_matches_reference(device, dtype, index_dtype, v, d, n):
    """Entry n reads row indices[n] - index_offset; rows outside the block give zeros."""
    w = random((v, d), dtype)
    for offset in _offsets(index_dtype):
        idx = _indices(n, v, index_dtype, offset=offset)
        out = on(device, np.full((n, d), 7, dtype=dtype))
        run_plan(gp.EmbeddingPlan, gp.EmbeddingDescriptor(v, d, n, dtype, index_offset=offset),
                 gp.EmbeddingArgs(on(device, w), on(device, idx), out), device)
        np.testing.assert_array_equal(f64(out), embedding_reference(w, idx, offset))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("deterministic", [False, True])
def test_shifted_backward_matches_reference(device, dtype, index_dtype, deterministic):
    """padding_idx is compared unshifted: offset + 2 is padding, the local index 2 is not
    (it is out of the block, or another row); a padding_idx outside the block skips nothing."""
    v, d, n = 17, 33, 300
    dout = random((n, d), dtype, seed=3)
    pref = gp.PlanPreference(deterministic=deterministic)
    for offset in _offsets(index_dtype):
        idx = _indices(n, v, index_dtype, offset=offset)
        idx[:4] = [offset + 2, 2, offset - 1, offset + v]
        for pad in (offset + 2, offset - 1, offset + v, None):
            dw = on(device, np.zeros((v, d), dtype=dtype))
            desc = gp.EmbeddingBackwardDescriptor(v, d, n, pad, dtype, index_offset=offset)
            run_plan(gp.EmbeddingBackwardPlan, desc,
                     gp.EmbeddingBackwardArgs(on(device, dout), on(device, idx), dw), device,
                     pref)
            want = embedding_backward_reference(dout, idx, v, pad, index_offset=offset)
            assert_close(dw, want, dtype, scale=max(1.0, n / v / 4))
            if pad == offset + 2:
                assert not gp.to_host(dw)[2].any()


@pytest.mark.parametrize("deterministic", [False, True])
def test_extreme_offsets_do_not_overflow(device, deterministic):
    """int64 indices and offsets at the type's ends: idx - offset is never wrapped around
    into the block (INT64_MIN - (INT64_MAX - 3) wraps to row 4 in int64 arithmetic)."""
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    v, d = 8, 3
    w = random((v, d), np.float64)
    cases = [(hi - 3, [lo, lo + 1, hi - 3, hi, -1, 0]),
             (lo + 2, [hi, hi - 1, lo + 2, lo + 9, lo, 0])]
    for offset, values in cases:
        idx = np.array(values, np.int64)
        n = idx.size
        out = on(device, np.full((n, d), 7.0))
        run_plan(gp.EmbeddingPlan, gp.EmbeddingDescriptor(v, d, n, np.float64, offset),
                 gp.EmbeddingArgs(on(device, w), on(device, idx), out), device)
        np.testing.assert_array_equal(f64(out), embedding_reference(w, idx, offset))
        dout = random((n, d), np.float64, seed=4)
        dw = on(device, np.zeros((v, d)))
        run_plan(gp.EmbeddingBackwardPlan,
                 gp.EmbeddingBackwardDescriptor(v, d, n, lo, np.float64, offset),
                 gp.EmbeddingBackwardArgs(on(device, dout), on(device, idx), dw), device,
                 gp.PlanPreference(deterministic=deterministic))
        assert_close(dw, embedding_backward_reference(dout, idx, v, lo, offset), np.float64)


def test_descriptor_fields_keep_the_seed_order():
    """DESIGN.md fixes the seed fields; index_offset (default 0) comes last in both."""
    for cls, names in [(gp.EmbeddingDescriptor, ["num_embeddings", "embedding_dim",
                                                 "num_indices", "dtype", "index_offset"]),
                       (gp.EmbeddingBackwardDescriptor,
                        ["num_embeddings", "embedding_dim", "num_indices", "padding_idx",
                         "dtype", "index_offset"])]:
        fields = dataclasses.fields(cls)
        assert [f.name for f in fields] == names
        assert fields[-1].default == 0
    assert gp.EmbeddingBackwardDescriptor(3, 4, 5).padding_idx is None
    assert gp.EmbeddingDescriptor(3, 4, 5).dtype == np.float32


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
    for bad, words in [(None, "an int"), (2.0, "an int"), (True, "an int"),
                       (2**63, "int64 range"), (-(2**63) - 1, "int64 range")]:
        with pytest.raises(gp.InvalidProblem, match=f"embedding: argument 'index_offset'.*"
                                                    f"{words}"):
            gp.EmbeddingPlan.select(s, gp.EmbeddingDescriptor(3, 4, 5, index_offset=bad))
        with pytest.raises(gp.InvalidProblem, match="embedding_backward: argument "
                                                    "'index_offset'"):
            gp.EmbeddingBackwardPlan.select(
                s, gp.EmbeddingBackwardDescriptor(3, 4, 5, index_offset=bad))
    with pytest.raises(gp.InvalidProblem, match="'padding_idx'.*int64 range"):
        gp.EmbeddingBackwardPlan.select(s, gp.EmbeddingBackwardDescriptor(3, 4, 5, 2**64))
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
    # index_offset: the table holds indices [10, 20) of a larger one; padding stays global.
    out = gp.functional.embedding(w, idx + 10, index_offset=10)
    np.testing.assert_array_equal(out, embedding_reference(w, idx + 10, 10))
    dw = gp.functional.embedding_backward(np.ones((2, 2, 3), np.float32), idx + 10, 10,
                                          padding_idx=11, index_offset=10)
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
