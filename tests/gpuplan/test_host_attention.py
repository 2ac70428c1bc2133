"""The host attention SKU (gpuplan.ops.attention.host): its compiled float32 softmax kernels
(gpuplan.host_kernels_attention) and its NumPy passes against the float64 definition and each
other, over causal row blocks (CAUSAL_ROWS) that split the queries unevenly, Lq != Lk both
ways (queries that see no key), dropout, and non-finite scores."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan import host_jit
from gpuplan.ops.attention import host as attention_host
from gpuplan.ops.attention.reference import attention_backward_reference, attention_reference
from gpuplan.ops.dropout.reference import dropout_multipliers
from gpuplan.testing import assert_close, random

pytest.importorskip("numba")
F = gp.functional
SCALE = 0.3
# (batch, lq, lk, dim, causal): causal shapes span 1 to 4 row blocks of CAUSAL_ROWS = 64,
# with a ragged last block; lq > lk leaves the first queries without keys (whole blocks of
# them at 150 x 20).
SHAPES = [(3, 128, 128, 32, True), (2, 150, 90, 16, True), (2, 90, 150, 24, True),
          (1, 150, 20, 8, True), (2, 200, 200, 40, True), (2, 130, 70, 32, False),
          (1, 64, 64, 8, True), (4, 7, 9, 8, True)]
_IDS = [f"{b}x{lq}x{lk}x{d}{'c' if c else ''}" for b, lq, lk, d, c in SHAPES]


def _inputs(b, lq, lk, dim, seed=0):
    return [random((b, n, dim), np.float32, seed=seed + i, low=-2, high=2)
            for i, n in enumerate((lq, lk, lk, lq))]


def _both(fn):
    """fn() with the compiled kernels, then with the NumPy passes."""
    jit = fn()
    with host_jit.numpy_only():
        numpy = fn()
    return jit, numpy


def _run(q, k, v, dout, causal, **drop):
    o, lse = F.attention(q, k, v, scale=SCALE, causal=causal, **drop)
    grads = F.attention_backward(q, k, v, o, lse, dout, scale=SCALE, causal=causal, **drop)
    return [o, lse, *grads]


@pytest.mark.parametrize("b,lq,lk,dim,causal", SHAPES, ids=_IDS)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_kernels_and_numpy_passes_match_float64(b, lq, lk, dim, causal, p):
    q, k, v, dout = _inputs(b, lq, lk, dim)
    drop = dict(dropout=p, seed=7, offset=3) if p else {}
    mul = dropout_multipliers((b, lq, lk), p, 7, 3) if p else None
    o_ref, lse_ref = attention_reference(q, k, v, SCALE, causal, mul)
    grads_ref = attention_backward_reference(q, k, v, dout, SCALE, causal, mul)
    for got in _both(lambda: _run(q, k, v, dout, causal, **drop)):
        o, lse, dq, dk, dv = got
        assert_close(o, o_ref, np.float32, scale=4, err_msg="o")
        seen = np.isfinite(lse_ref)
        np.testing.assert_array_equal(np.isneginf(lse), ~seen)
        assert_close(lse[seen], lse_ref[seen], np.float32, scale=4, err_msg="lse")
        for name, g, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), grads_ref, strict=True):
            atol = 1e-5 * 8 * max(1.0, float(np.abs(ref).max(initial=0.0)))
            np.testing.assert_allclose(g, ref, rtol=8e-5, atol=atol, err_msg=name)
        assert np.all(o[~seen] == 0) and np.all(dq[~seen] == 0)


def test_float32_operands_take_the_kernels():
    s, lse = np.zeros((2, 3, 4), np.float32), np.zeros((2, 5), np.float32)[:, 1:4]
    assert attention_host._kernels((s,), (lse,)) is not None  # a strided lse view is fine
    assert attention_host._kernels((s.astype(np.float64),), (lse,)) is None
    with host_jit.numpy_only():
        assert attention_host._kernels((s,), (lse,)) is None


def test_causal_blocks_skip_the_masked_keys():
    """Each causal row block's keys stop at its last row's diagonal; the last sees them all."""
    desc = gp.AttentionDescriptor(1, 150, 90, 8, SCALE, True, np.float32)
    assert attention_host.row_blocks(desc) == [(0, 64, 4), (64, 128, 68), (128, 150, 90)]
    desc = gp.AttentionDescriptor(1, 150, 20, 8, SCALE, True, np.float32)
    assert attention_host.row_blocks(desc) == [(0, 64, 0), (64, 128, 0), (128, 150, 20)]
    full = gp.AttentionDescriptor(1, 150, 90, 8, SCALE, False, np.float32)
    assert attention_host.row_blocks(full) == [(0, 150, 90)]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_score_poisons_its_row_only(bad):
    """A NaN (or an inf: inf - inf) among a row's scores makes that row's o and lse NaN, in
    both paths, as NumPy's softmax would; the other rows stay finite."""
    q, k, v, _ = _inputs(2, 70, 70, 8)
    q[1, 66, 3] = bad  # row 66 of entry 1: the second causal block
    for o, lse in _both(lambda: F.attention(q, k, v, scale=SCALE, causal=True)):
        assert np.isnan(lse[1, 66]) and np.isnan(o[1, 66]).all()
        rest = np.ones(lse.shape, bool)
        rest[1, 66] = False
        assert np.isfinite(lse[rest]).all() and np.isfinite(o[rest]).all()


def test_minus_inf_scores_give_zero_probabilities():
    """Keys whose scores are -inf for a row get probability 0; a row whose unmasked keys all
    score -inf has lse -inf and output 0, as a row with no key."""
    q, k, v, _ = _inputs(1, 3, 5, 4)
    k[0, 4] = np.float32(-1e38)  # q . k = -inf after the scale for positive q
    q[...] = np.abs(q) + 1
    k[0, :4] = np.abs(k[0, :4])
    with np.errstate(over="ignore"):  # the q k^T GEMM overflows to -inf on purpose
        for o, lse in _both(lambda: F.attention(q, k, v, scale=1e3, causal=False)):
            assert np.isfinite(lse).all() and np.isfinite(o).all()
        k[0, :4] = -1e38
        for o, lse in _both(lambda: F.attention(q, k, v, scale=1e3, causal=False)):
            np.testing.assert_array_equal(lse, -np.inf)
            np.testing.assert_array_equal(o, 0.0)


def test_kernels_do_not_depend_on_the_chunking(monkeypatch):
    """Chunks of batch entries (one entry each here) give the bits of one chunk."""
    q, k, v, dout = _inputs(5, 100, 100, 16)
    whole = _run(q, k, v, dout, True)
    monkeypatch.setattr(attention_host, "HOST_CHUNK_SCORES", 1)
    for a, b in zip(whole, _run(q, k, v, dout, True), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_inf_at_a_masked_key_gives_both_paths_the_same_non_finite_rows():
    """An inf in v at key 100 (L = 130, causal) reaches the rows of its row block only (the
    earlier block's GEMMs stop before it); the kernels and the NumPy passes agree on which
    outputs and gradients are finite, masked score gradients being 0 (not 0 * inf) in both.
    The backward takes o and lse of the finite v, so only dout v^T carries the inf."""
    q, k, v, dout = _inputs(1, 130, 130, 8)
    o, lse = F.attention(q, k, v, scale=SCALE, causal=True)
    v[0, 100, 0] = np.inf
    with np.errstate(invalid="ignore", over="ignore"):
        fwd = _both(lambda: F.attention(q, k, v, scale=SCALE, causal=True))
        bwd = _both(lambda: F.attention_backward(q, k, v, o, lse, dout, scale=SCALE,
                                                 causal=True))
    for a, b in zip(fwd[0] + bwd[0], fwd[1] + bwd[1], strict=True):
        np.testing.assert_array_equal(np.isfinite(a), np.isfinite(b))
    assert np.isfinite(fwd[0][0][0, :64]).all() and not np.isfinite(fwd[0][0][0, 64:]).all()
    dq = bwd[0][0]
    assert np.isfinite(dq[0, :100]).all() and not np.isfinite(dq[0, 100:]).all()
