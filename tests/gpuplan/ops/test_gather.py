"""Gather / index_select and the deterministic scatter_add / index_add against float64
references: every dtype and index dtype, bounds errors, bit-identical repeats."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.gather.reference import (
    gather_reference,
    index_add_reference,
    index_select_reference,
    scatter_add_reference,
)
from gpuplan.testing import check_plan, f64, on, random
from tests.helpers import DTYPES

F = gp.functional


def _index(shape, length, dtype, seed):
    return np.random.default_rng(seed).integers(0, length, shape).astype(dtype)


def ref_gather(x, index, shared):
    """The plan's [outer, n, inner] result along dim 1 (index_select when shared)."""
    return (index_select_reference if shared else gather_reference)(x, 1, index)


def ref_scatter(out, index, src, shared):
    """The plan's in-place [outer, length, inner] result along dim 1 (index_add when shared)."""
    return (index_add_reference if shared else scatter_add_reference)(out, 1, index, src)


# (outer, length, inner, n)
VIEWS = [(3, 5, 4, 6), (1, 7, 1, 20), (2, 1, 3, 2), (4, 6, 2, 0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("view", VIEWS)
def test_gather(device, dtype, index_dtype, shared, view):
    o, n_len, i, n = view
    x = random((o, n_len, i), dtype, seed=1)
    index = _index((n,) if shared else (o, n, i), n_len, index_dtype, seed=n)
    check_plan(gp.GatherPlan, gp.GatherDescriptor(o, n_len, i, n, shared, dtype),
               {"x": x, "index": index},
               lambda x, index, **_: ref_gather(x, index, shared), device=device,
               bad_inputs=view == VIEWS[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("view", VIEWS)
def test_scatter_add(device, dtype, index_dtype, shared, view):
    o, n_len, i, n = view
    out = random((o, n_len, i), dtype, seed=2)
    src = random((o, n, i), dtype, seed=3)
    index = _index((n,) if shared else (o, n, i), n_len, index_dtype, seed=n + 1)
    check_plan(gp.ScatterAddPlan, gp.ScatterAddDescriptor(o, n_len, i, n, shared, dtype),
               {"out": out, "index": index, "src": src},
               lambda out, index, src: ref_scatter(out, index, src, shared), device=device,
               scale=4, bad_inputs=view == VIEWS[0])


def test_scatter_add_is_deterministic_and_leaves_untouched_rows_bitwise(device):
    """Many entries into few rows; repeats give the same bits; rows that no index names
    keep their exact bits (-0.0 stays -0.0)."""
    x = np.full((2, 5, 3), -0.0, np.float32)
    src = random((2, 4000, 3), np.float32, seed=4)
    index = _index((2, 4000, 3), 3, np.int64, seed=5)  # rows 3 and 4 never named
    runs = [gp.to_host(F.scatter_add(on(device, x), 1, on(device, index), on(device, src)))
            for _ in range(2)]
    np.testing.assert_array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
    assert np.signbit(runs[0][:, 3:]).all()
    host = F.scatter_add(x, 1, index, src)  # the NumPy path adds in the same order
    np.testing.assert_array_equal(runs[0].view(np.uint32), host.view(np.uint32))


def test_functional_torch_semantics(device):
    x = random((3, 4, 5), np.float64, seed=6)
    index = _index((2, 3, 5), 4, np.int64, seed=7)  # smaller than x outside dim 1
    got = F.gather(on(device, x), 1, on(device, index))
    np.testing.assert_array_equal(f64(got), gather_reference(x, 1, index))
    src = random((3, 3, 6), np.float64, seed=8)  # larger than index: only its corner is read
    got = F.scatter_add(on(device, x), 1, on(device, index), on(device, src))
    want = scatter_add_reference(x, 1, index, src)
    np.testing.assert_allclose(f64(got), want, rtol=1e-15, atol=1e-15)
    sel = np.array([3, 0, 3])
    got = F.index_select(on(device, x), 2, on(device, sel))
    np.testing.assert_array_equal(f64(got), index_select_reference(x, 2, sel))
    got = F.index_add(on(device, x), 2, on(device, sel), on(device, np.ones((3, 4, 3))))
    want = index_add_reference(x, 2, sel, np.ones((3, 4, 3)))
    np.testing.assert_allclose(f64(got), want, rtol=1e-15)


def test_bad_indices_are_rejected_before_any_launch(device):
    x = on(device, random((3, 4), np.float32))
    for bad in (-1, 4):
        index = on(device, np.array([[0, bad], [1, 1], [2, 0]]))
        with pytest.raises(gp.InvalidProblem, match=rf"gather: argument 'index'.*\[0, 4\).*{bad}"):
            F.gather(x, 1, index)
        with pytest.raises(gp.InvalidProblem, match="scatter_add: argument 'index'"):
            F.scatter_add(x, 1, index, x[:, :2].copy())
        with pytest.raises(gp.InvalidProblem, match="index_select: argument 'index'"):
            F.index_select(x, 1, on(device, np.array([bad])))
    with pytest.raises(gp.InvalidProblem, match="gather: argument 'dim'"):
        F.gather(x, 2, on(device, np.zeros((3, 4), np.int64)))
    with pytest.raises(gp.InvalidProblem, match="gather: argument 'index'.*size <= 4 in dim 1"):
        F.gather(x, 0, on(device, np.zeros((3, 5), np.int64)))
    with pytest.raises(gp.InvalidProblem, match="gather: argument 'index'.*an integer array"):
        F.gather(x, 1, on(device, np.zeros((3, 4), np.float32)))
    with pytest.raises(gp.InvalidProblem, match="index_select: argument 'index'.*1-d"):
        F.index_select(x, 1, on(device, np.zeros((2, 2), np.int64)))
