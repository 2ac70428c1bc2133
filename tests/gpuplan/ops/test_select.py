"""Select plans (where with broadcasting, tril/triu triangles) against the family's reference
(gpuplan.ops.select.reference), on host and device: values are copied bit for bit, so results
must be exact."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.select.plans import SELECT_DTYPES
from gpuplan.ops.select.reference import broadcast_shape, triangle_reference, where_reference
from gpuplan.testing import assert_rejected, check_plan, on, random, stream_for
from tests.helpers import DTYPES

ALL_DTYPES = [pytest.param(d, id=gp.dtypes.short_name(d)) for d in SELECT_DTYPES]
WHERE_SHAPES = [((37,), (37,), (37,)), ((3, 1, 5), (4, 1), ()), ((2, 3, 4), (4,), (2, 1, 1)),
                ((1,), (6, 1), (1, 5)), ((0, 3), (3,), (1,)), ((), (), ())]


def _values(shape, dtype, seed):
    d = np.dtype(dtype)
    if d == np.bool_:
        return random(shape, np.float32, seed=seed) > 0
    if d.kind == "i":
        return (random(shape, np.float64, seed=seed) * 1000).astype(d)
    return random(shape, d, seed=seed)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("shapes", WHERE_SHAPES)
def test_where_through_check_plan(device, dtype, shapes):
    cs, as_, bs = shapes
    cond = random(cs, np.float32, seed=1) > 0
    a, b = _values(as_, dtype, 2), _values(bs, dtype, 3)
    desc = gp.WhereDescriptor(cs, as_, bs, dtype)
    plan = check_plan(gp.WherePlan, desc, {"cond": cond, "a": a, "b": b},
                      lambda cond, a, b, out: where_reference(cond, a, b), device=device, scale=0,
                      tolerance_dtype=np.float64)
    assert plan.shape("out") == broadcast_shape(cs, as_, bs) == np.broadcast_shapes(cs, as_, bs)
    assert plan.precision_guarantee().bit_stable


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("part", ["lower", "upper"])
@pytest.mark.parametrize("shape,k", [((1, 7, 5), 0), ((3, 4, 9), 2), ((2, 6, 3), -1),
                                     ((1, 3, 3), 10), ((1, 3, 3), -10), ((0, 2, 2), 0)])
def test_triangle_through_check_plan(device, dtype, part, shape, k):
    x = _values(shape, dtype, 4)
    check_plan(gp.TrianglePlan, gp.TriangleDescriptor(part, *shape, k, dtype), {"x": x},
               lambda x, y: triangle_reference(part, x, k), device=device, scale=0,
               tolerance_dtype=np.float64)


def test_nan_and_extreme_diagonals_are_exact(device):
    x = np.array([[np.nan, 1.0], [-np.inf, np.nan]], np.float32)
    F = gp.functional
    got = gp.to_host(F.triangle("lower", on(device, x)))
    np.testing.assert_array_equal(got, [[np.nan, 0.0], [-np.inf, np.nan]])
    big = 2**62  # beyond any int32 index: clamped, all or nothing selected
    np.testing.assert_array_equal(gp.to_host(F.triangle("upper", on(device, x), big)),
                                  np.zeros((2, 2)))
    np.testing.assert_array_equal(gp.to_host(F.triangle("upper", on(device, x), -big)), x)
    w = F.where(on(device, np.array([True, False])), on(device, x[0]), on(device, x[1]))
    np.testing.assert_array_equal(gp.to_host(w), [np.nan, np.nan])


@pytest.mark.parametrize("dtype", DTYPES)
def test_functional_batched_and_strided(device, dtype):
    x = on(device, random((2, 3, 5, 4), dtype))
    F = gp.functional
    got = F.triangle("upper", x.transpose(0, 1, 3, 2), 1)  # strided input
    np.testing.assert_array_equal(gp.to_host(got),
                                  triangle_reference("upper", gp.to_host(x).transpose(0, 1, 3, 2),
                                                     1))
    assert got.shape == (2, 3, 4, 5) and got.dtype == dtype
    mask = on(device, random((5, 1), np.float32) > 0)
    fill = on(device, np.full((), -3, dtype))
    out = F.where(mask, fill, x)  # masked_fill
    np.testing.assert_array_equal(gp.to_host(out), where_reference(mask, fill, x))


def test_errors_name_op_argument_and_values():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match=r"where: argument 'b_shape': expected a shape "
                                                r"broadcastable with \(3, 1\) and \(4,\), "
                                                r"given \(2,\)"):
        gp.WherePlan.select(s, gp.WhereDescriptor((3, 1), (4,), (2,)))
    with pytest.raises(gp.Unsupported, match="where: argument 'dtype'"):
        gp.WherePlan.select(s, gp.WhereDescriptor((3,), (3,), (3,), np.int8))
    with pytest.raises(gp.Unsupported, match="triangle: argument 'part'"):
        gp.TrianglePlan.select(s, gp.TriangleDescriptor("diag", 1, 2, 2))
    with pytest.raises(gp.InvalidProblem, match="triangle: argument 'diagonal'"):
        gp.TrianglePlan.select(s, gp.TriangleDescriptor("lower", 1, 2, 2, 0.5))
    with pytest.raises(gp.Unsupported, match="triangle: argument 'x': expected an array of at "
                                             r"least 2 dims, given shape \(3,\)"):
        gp.functional.triangle("lower", np.ones(3, np.float32))


def test_cond_must_be_bool(device):
    s = stream_for(device)
    plan = gp.WherePlan.select(s, gp.WhereDescriptor((4,), (4,), (4,)))
    a = on(device, np.ones(4, np.float32))
    out = on(device, np.full(4, 7, np.float32))
    assert_rejected(lambda: plan.run(s, None, gp.WhereArgs(on(device, np.ones(4, np.float32)),
                                                           a, a.copy(), out)),
                    gp.Unsupported, [out], "where", "'cond'", "bool")


def test_empty_does_not_launch(device, monkeypatch):
    for name in ("_run_numpy", "_run_map"):
        monkeypatch.setattr(gp.TrianglePlan, name, lambda *_: pytest.fail("launched"))
    z = on(device, np.zeros((0, 3, 3), np.float32))
    y = gp.functional.triangle("lower", z)
    assert y.shape == (0, 3, 3)
