"""embedding: gathered values, scatter-add gradient (duplicates, padding_idx), dtype sweep."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from gpuplan.ops.embedding.reference import embedding_backward_reference, embedding_reference
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _w(v=6, d=3, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (v, d))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gradcheck_and_values(device, index_dtype):
    idx = np.array([[1, 4, 1], [0, 5, 1]], dtype=index_dtype)
    gradcheck_on(device, lambda w: F.embedding(idx, w), _w())
    w = _w()
    out = F.embedding(ag.tensor(idx, device=device), ag.tensor(w, device=device))
    assert out.shape == (2, 3, 3)
    np.testing.assert_array_equal(out.numpy(), embedding_reference(w, idx))


def test_padding_idx_gets_no_gradient(device):
    idx = np.array([2, 0, 2, 3])
    w = ag.tensor(_w(4, 2), requires_grad=True, device=device)
    out = F.embedding(idx, w, padding_idx=2)
    np.testing.assert_array_equal(out.numpy()[0], w.numpy()[2])  # forward still looks it up
    out.backward(np.ones((4, 2)))
    np.testing.assert_array_equal(w.grad.numpy(), [[1, 1], [0, 0], [0, 0], [1, 1]])
    np.testing.assert_array_equal(w.grad.numpy(),
                                  embedding_backward_reference(np.ones((4, 2)), idx, 4, 2))
    w.grad = None
    F.embedding(idx, w, padding_idx=-2).backward(np.ones((4, 2)))  # -2 counts from V
    np.testing.assert_array_equal(w.grad.numpy()[2], [0, 0])


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_index_offset_shifts_lookups_and_keeps_padding_global(device, index_dtype):
    """The table holds indices [10, 16) of a larger one: others give zero rows and no
    gradient; padding_idx=12 is a global index (row 2), not the local row 12 or -2."""
    idx = np.array([[11, 4, 12], [10, 15, 16], [12, 13, 9]], dtype=index_dtype)
    gradcheck_on(device, lambda w: F.embedding(idx, w, index_offset=10), _w())
    w = ag.tensor(_w(), requires_grad=True, device=device)
    out = F.embedding(idx, w, padding_idx=12, index_offset=10)
    np.testing.assert_array_equal(out.numpy(), embedding_reference(_w(), idx, 10))
    dout = np.random.default_rng(2).uniform(-1, 1, (3, 3, 3))
    out.backward(dout)
    np.testing.assert_allclose(w.grad.numpy(),
                               embedding_backward_reference(dout, idx, 6, 12, 10), rtol=1e-6)
    assert not w.grad.numpy()[2].any() and w.grad.numpy()[1].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    idx = np.random.default_rng(1).integers(0, 11, (4, 9))
    check_dtypes(lambda w: F.embedding(idx, w, deterministic=True), [_w(11, 17, seed=2)],
                 device, [dtype])


def test_empty(device):
    w = ag.tensor(_w(), requires_grad=True, device=device)
    F.embedding(np.zeros((0,), np.int64), w).backward(np.zeros((0, 3)))
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros((6, 3)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.bool_])
def test_float_or_bool_indices_are_refused(device, dtype):
    """Before: float indices were truncated to int64 and looked up (torch refuses them)."""
    import gpuplan as gp

    w = ag.tensor(_w(), device=device)
    with pytest.raises(gp.Unsupported, match=r"^embedding: argument 'input': expected integer "
                                             rf"indices, given dtype {np.dtype(dtype)}$"):
        F.embedding(np.array([0.5, 1.7]).astype(dtype), w)
    out = F.embedding(np.array([1, 2], dtype=np.uint8), w)  # other integer dtypes still work
    np.testing.assert_array_equal(out.numpy(), embedding_reference(_w(), np.array([1, 2])))
