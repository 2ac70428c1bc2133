"""Plans along one dim that keep positions (max/min with indices, top-k) against the family's
float64 reference (gpuplan.ops.reduce_dim.reference): torch's rules for ties and NaN, every
dtype, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.reduce_dim.reference import arg_select_reference, topk_reference
from gpuplan.ops.reduction.launch import dim_view
from gpuplan.testing import check_plan, on, random, run_plan
from tests.helpers import DTYPES

# (outer, length, inner): warp-per-row (inner 1, long rows) and thread-per-column layouts.
VIEWS = [(3, 100, 1), (4, 7, 5), (1, 1, 1), (2, 33, 3), (1, 300, 1)]


def ref_select(x, op):
    values, indices = arg_select_reference(op, x)
    return {"values": values, "indices": indices}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("view", VIEWS)
def test_arg_select(device, dtype, op, view):
    x = random(view, dtype, seed=sum(view))
    check_plan(gp.ArgSelectPlan, gp.ArgSelectDescriptor(op, *view, dtype), {"x": x},
               lambda x, **_: ref_select(x, op), device=device, bad_inputs=view == (4, 7, 5))


@pytest.mark.parametrize("view", [(1, 100, 1), (2, 9, 3)])
def test_arg_select_ties_and_nan_like_torch(device, view):
    """Ties: the lowest index; NaN wins (the first NaN) for max and for min."""
    x = np.zeros(view, np.float32)
    x[:, 3, :] = x[:, 5, :] = 2.0
    x[:, 4, :] = -2.0
    x[:, -1, :] = -2.0
    for op, want in (("max", 3), ("min", 4)):
        values, indices = _run_select(device, op, x)
        assert (indices == want).all() and (values == x[:, want, :]).all()
    x[-1, 6, 0] = np.nan
    x[-1, 8, 0] = np.nan
    for op in ("max", "min"):
        values, indices = _run_select(device, op, x)
        assert indices[-1, 0] == 6 and np.isnan(values[-1, 0])
        assert not np.isnan(values[:-1]).any()


def _run_select(device, op, x):
    desc = gp.ArgSelectDescriptor(op, *x.shape, x.dtype)
    v = on(device, np.zeros((x.shape[0], x.shape[2]), x.dtype))
    i = on(device, np.zeros((x.shape[0], x.shape[2]), np.int64))
    run_plan(gp.ArgSelectPlan, desc, gp.ArgSelectArgs(on(device, x), v, i), device)
    return gp.to_host(v), gp.to_host(i)


def ref_topk(x, k, largest):
    values, indices = topk_reference(x, k, largest)
    return {"values": values, "indices": indices}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("view,k", [((3, 40, 1), 5), ((2, 9, 3), 9), ((2, 300, 1), 3),
                                    ((1, 4, 2), 0)])
def test_topk(device, dtype, largest, view, k):
    x = random(view, dtype, seed=k)
    x.reshape(-1)[::7] = x.reshape(-1)[1]  # ties
    if view[1] > 8:
        x[0, 8, 0] = np.nan
    check_plan(gp.TopkPlan, gp.TopkDescriptor(*view, k, largest, dtype), {"x": x},
               lambda x, **_: ref_topk(x, k, largest), device=device, bad_inputs=k == 5)


def test_topk_rejects_k_past_the_dim():
    with pytest.raises(gp.InvalidProblem, match="topk: argument 'k'.*<= the dim's length 4"):
        gp.TopkPlan.select(gp.Stream.host(), gp.TopkDescriptor(2, 4, 1, 5))


def test_errors_name_op_and_argument():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="arg_select: argument 'length'"):
        gp.ArgSelectPlan.select(s, gp.ArgSelectDescriptor("max", 2, 0, 3))
    with pytest.raises(gp.Unsupported, match="arg_select: argument 'op'"):
        gp.ArgSelectPlan.select(s, gp.ArgSelectDescriptor("median", 2, 3, 3))
    with pytest.raises(gp.InvalidProblem, match="topk: argument 'dim'.*\\[-2, 2\\)"):
        dim_view("topk", (3, 4), 2)


def test_functional_shapes(device):
    x = on(device, random((2, 3, 4), np.float32))
    v, i = gp.functional.arg_select("max", x, 1, keepdim=True)
    assert v.shape == i.shape == (2, 1, 4) and i.dtype == np.int64
    v, i = gp.functional.arg_select("min", x)  # flattened
    assert v.shape == () and int(i) == int(np.argmin(gp.to_host(x)))
    v, i = gp.functional.topk(x, 2, dim=-1, largest=False)
    assert v.shape == (2, 3, 2)
    smallest = topk_reference(gp.to_host(x).reshape(6, 4, 1), 2, largest=False)[0]
    np.testing.assert_array_equal(gp.to_host(v), smallest.reshape(2, 3, 2))
