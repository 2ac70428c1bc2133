"""Binary plans on int32, int64 and bool (arithmetic that wraps, floor division and remainder
with Python's signs, comparisons, bitwise/logical ops) and float remainder / floor_divide,
against the family's reference (gpuplan.ops.binary.reference: Python integers for the integer
ops, torch's float rules for remainder / floor_divide)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.binary.reference import binary_backward_reference, binary_reference
from gpuplan.ops.binary.table import BINARY_OPS
from gpuplan.testing import check_plan, f64, on, random
from tests.helpers import DTYPES

INT_DTYPES = (np.int32, np.int64)
INT_OPS = tuple(op.name for op in BINARY_OPS if "i" in op.kinds)
BOOL_OPS = tuple(op.name for op in BINARY_OPS if "b" in op.kinds)
SHAPES = [((37,), (37,)), ((3, 1, 5), (4, 1)), ((2, 3, 4), (4,)), ((5,), ()), ((0, 3), (3,))]


def ref_exact(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise with Python ints (bool as 0/1), wrapped to the dtype's width."""
    return binary_reference(op, a, b)


def _ints(shape, dtype, seed, extremes=False):
    v = np.round(random(shape, np.float64, seed=seed) * 9).astype(dtype).reshape(-1)
    if extremes:
        info = np.iinfo(dtype)
        k = min(4, v.size)
        v[:k] = (info.min, info.max, -1, 0)[:k]
    return v.reshape(shape)


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("op", INT_OPS)
@pytest.mark.parametrize("a_shape,b_shape", SHAPES)
def test_int_ops_through_check_plan(device, dtype, op, a_shape, b_shape):
    """Small values (exact in the float64 comparison check_plan makes), 0 and -1 included."""
    a, b = _ints(a_shape, dtype, 1), _ints(b_shape, dtype, 2)
    desc = gp.BinaryDescriptor(op, a_shape, b_shape, dtype)
    plan = check_plan(gp.BinaryPlan, desc, {"a": a, "b": b},
                      lambda a, b, c: ref_exact(op, a.astype(dtype), b.astype(dtype)),
                      device=device, scale=0, tolerance_dtype=np.float64,
                      bad_inputs=a_shape == (3, 1, 5))
    assert plan.precision_guarantee().bit_stable
    if device != "cpu":
        assert plan.sku().variant == "broadcast"


@pytest.mark.parametrize("op", BOOL_OPS)
@pytest.mark.parametrize("a_shape,b_shape", SHAPES[:3])
def test_bool_ops_through_check_plan(device, op, a_shape, b_shape):
    a = random(a_shape, np.float32, seed=1) > 0
    b = random(b_shape, np.float32, seed=2) > 0
    check_plan(gp.BinaryPlan, gp.BinaryDescriptor(op, a_shape, b_shape, np.bool_),
               {"a": a, "b": b}, lambda a, b, c: ref_exact(op, a.astype(bool), b.astype(bool)),
               device=device, scale=0, tolerance_dtype=np.float64,
               bad_inputs=a_shape == (3, 1, 5))


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_int_extremes_wrap_and_divide_like_python(device, dtype):
    """INT_MIN/INT_MAX/-1/0 against every op: exact, two's complement wrap-around,
    x // 0 == x % 0 == 0, INT_MIN // -1 == INT_MIN (wrapped), floor signs."""
    info = np.iinfo(dtype)
    vals = np.array([info.min, info.max, -1, 0, 1, 7, -7, 3, -3, info.min + 1], dtype)
    a, b = np.repeat(vals, vals.size), np.tile(vals, vals.size)
    for op in INT_OPS:
        got = gp.to_host(gp.functional.binary(op, on(device, a), on(device, b)))
        np.testing.assert_array_equal(got, ref_exact(op, a, b), err_msg=op)


def _py_float_ref(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """torch's float % and // (floor of the exact quotient; the remainder's sign is b's)."""
    return binary_reference(op, f64(a), f64(b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["remainder", "floor_divide"])
@pytest.mark.parametrize("a_shape,b_shape", SHAPES[:4])
def test_float_remainder_floor_divide(device, dtype, op, a_shape, b_shape):
    """Quarters over [-4, 4] divided by nonzero eighths: exact in every dtype, so the result
    equals Python's float arithmetic; remainder's gradients are torch's."""
    a = (np.round(random(a_shape, np.float64, seed=1) * 16) / 4).astype(dtype)
    b = np.round(random(b_shape, np.float64, seed=2, low=1, high=12)) / 8
    b = np.where(random(b_shape, np.float64, seed=3) < 0, -b, b).astype(dtype)
    desc = gp.BinaryDescriptor(op, a_shape, b_shape, dtype)
    check_plan(gp.BinaryPlan, desc, {"a": a, "b": b},
               lambda a, b, c: _py_float_ref(op, a, b), device=device, scale=0,
               tolerance_dtype=np.float64, bad_inputs=a_shape == (3, 1, 5))
    if op == "floor_divide":
        return
    dc = random(desc.out_shape(), dtype, seed=5)
    ra, rb = binary_backward_reference("remainder", a, b, dc)
    n_out = max(1, math.prod(desc.out_shape()))
    check_plan(gp.BinaryBackwardPlan, desc,
               {"a": a, "b": b, "dc": dc, "da": np.full(a_shape, 7, dtype),
                "db": np.full(b_shape, 7, dtype)},
               lambda **_: {"da": ra, "db": rb}, device=device,
               scale=max(4.0, math.sqrt(n_out / max(1, min(a.size, b.size)))), bad_inputs=False)


def test_float_remainder_floor_divide_special_values(device):
    """torch: x % 0 = nan, x // 0 = x / 0; inf divisor keeps a finite x's sign rules;
    NaN propagates; -0.0 // positive is -0.0 (copysign of the quotient)."""
    nan, inf = np.nan, np.inf
    a = np.array([5.5, -5.5, 1.0, -1.0, 0.0, nan, 3.0, -3.0, -0.0, 7.0])
    b = np.array([0.0, 0.0, inf, inf, 2.0, 2.0, -inf, 2.0, 3.0, nan])
    F = gp.functional
    rem = gp.to_host(F.binary("remainder", on(device, a), on(device, b)))
    fdiv = gp.to_host(F.binary("floor_divide", on(device, a), on(device, b)))
    np.testing.assert_array_equal(rem, [nan, nan, 1.0, inf, 0.0, nan, -inf, 1.0, -0.0, nan])
    np.testing.assert_array_equal(fdiv, [inf, -inf, 0.0, -1.0, 0.0, nan, -1.0, -2.0, -0.0,
                                         nan])
    assert math.copysign(1, fdiv[8]) == -1


def test_dtype_rules_name_op_and_dtype():
    s = gp.Stream.host()
    for op, dtype, want in (("div", np.int32, "float for op 'div'"),
                            ("pow", np.int64, "float for op 'pow'"),
                            ("bitwise_and", np.float32, "int32/int64 or bool"),
                            ("add", np.bool_, "float or int32/int64 for op 'add'")):
        with pytest.raises(gp.Unsupported, match=f"binary: argument 'dtype'.*{want}"):
            gp.BinaryPlan.select(s, gp.BinaryDescriptor(op, (3,), (3,), dtype))
    with pytest.raises(gp.Unsupported, match="binary_backward: argument 'dtype'.*float dtype"):
        gp.BinaryBackwardPlan.select(s, gp.BinaryBackwardDescriptor("add", (3,), (3,),
                                                                    np.int32))
    with pytest.raises(gp.Unsupported, match="floor_divide has no gradient"):
        gp.BinaryBackwardPlan.select(s, gp.BinaryBackwardDescriptor("floor_divide", (3,),
                                                                    (3,)))
    with pytest.raises(gp.Unsupported, match="'dtype'"):
        gp.BinaryPlan.select(s, gp.BinaryDescriptor("add", (3,), (3,), np.int8))


def test_mixed_int_dtypes_are_refused(device):
    a = on(device, np.arange(3, dtype=np.int32))
    with pytest.raises(gp.Unsupported, match="'b'"):
        gp.functional.binary("add", a, on(device, np.arange(3, dtype=np.int64)))


def test_int_against_torch():
    torch = pytest.importorskip("torch")
    info = np.iinfo(np.int64)
    vals = np.array([info.min, info.max, -1, 1, 7, -7, 3, -3], np.int64)
    a, b = np.repeat(vals, vals.size), np.tile(vals, vals.size)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for op, fn in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
                   ("remainder", torch.remainder), ("floor_divide", torch.floor_divide),
                   ("bitwise_xor", torch.bitwise_xor), ("maximum", torch.maximum)):
        np.testing.assert_array_equal(gp.functional.binary(op, a, b), fn(ta, tb).numpy(),
                                      err_msg=op)
    x = np.array([5.5, -5.5, 5.5, -5.5, -0.75, 1e10])
    y = np.array([2.0, 2.0, -2.0, -2.0, 0.5, 3.0])
    for op, fn in (("remainder", torch.remainder), ("floor_divide", torch.floor_divide)):
        np.testing.assert_array_equal(gp.functional.binary(op, x, y),
                                      fn(torch.from_numpy(x), torch.from_numpy(y)).numpy())


def test_int_device_plan_is_exact_for_large_int64(device):
    """Values past 2**53 (not exact in float64): compared as integers."""
    a = np.array([2**62 + 1, -(2**62) - 3, 2**53 + 1], np.int64)
    b = np.array([2**61 + 7, 5, -(2**53) - 1], np.int64)
    for op in ("add", "sub", "remainder", "floor_divide", "eq", "lt"):
        got = gp.to_host(gp.functional.binary(op, on(device, a), on(device, b)))
        np.testing.assert_array_equal(got, ref_exact(op, a, b), err_msg=op)
