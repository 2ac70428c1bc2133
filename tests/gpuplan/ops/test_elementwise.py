"""Elementwise plans (binary with broadcasting and their gradients, bias add, cast)
against float64 NumPy references, on host and device."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.elementwise import broadcast_dims
from tests.plan_testing import (
    DTYPES,
    assert_close,
    assert_rejected,
    f64,
    on,
    random,
    run_plan,
    stream_for,
)

SIZES = [1, 37, 4099]  # odd sizes: scalar tails after the 16-byte packs


# -- binary --------------------------------------------------------------------------------

SHAPE_PAIRS = [
    ((7,), (7,)),
    ((4099,), (4099,)),
    ((3, 1, 5), (4, 1)),
    ((2, 3, 4), (4,)),
    ((5,), ()),
    ((1,), (6, 1)),
    ((2, 1, 3, 1, 2), (1, 4, 1, 5, 1)),
    ((3000, 8), (8,)),      # tall column reduction for db (split into fixed row blocks)
    ((2, 70000), (1, 1)),   # long row reduction for db (split into fixed segments)
    ((0, 3), (3,)),         # empty output, db still written (zeros)
]


def _operands(a_shape, b_shape, dtype):
    a = random(a_shape, dtype, seed=2)
    b = random(b_shape, dtype, seed=3, low=0.5, high=2.0)
    b = np.where(random(b_shape, np.float32, seed=4) < 0, -b, b).astype(dtype)  # signs, |b|>=.5
    return a, b


def ref_binary(op, a, b):
    a, b = f64(a), f64(b)
    return {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[op]


def ref_binary_backward(op, a, b, dc):
    a, b, dc = f64(a), f64(b), f64(dc)
    ga, gb = {"add": (dc, dc), "sub": (dc, -dc), "mul": (dc * b, dc * a),
              "div": (dc / b, -dc * a / (b * b))}[op]
    return _sum_to(ga, a.shape), _sum_to(gb, b.shape)


def _sum_to(g, shape):
    g = np.broadcast_to(g, np.broadcast_shapes(g.shape, shape))
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, e in enumerate(shape)
                                      if e == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("a_shape,b_shape", SHAPE_PAIRS)
def test_binary_and_backward(device, dtype, op, a_shape, b_shape):
    a, b = _operands(a_shape, b_shape, dtype)
    desc = gp.BinaryDescriptor(op, a_shape, b_shape, dtype)
    out_shape = desc.out_shape()
    c = on(device, np.full(out_shape, 7, dtype))
    run_plan(gp.BinaryPlan, desc, gp.BinaryArgs(on(device, a), on(device, b), c), device)
    assert_close(c, ref_binary(op, a, b), dtype)

    dc = random(out_shape, dtype, seed=5)
    da = on(device, np.full(a_shape, 7, dtype))
    db = on(device, np.full(b_shape, 7, dtype))
    plan = run_plan(gp.BinaryBackwardPlan, gp.BinaryBackwardDescriptor(op, a_shape, b_shape,
                                                                       dtype),
                    gp.BinaryBackwardArgs(on(device, a), on(device, b), on(device, dc), da, db),
                    device)
    ra, rb = ref_binary_backward(op, a, b, dc)
    n_out = max(1, int(np.prod(out_shape)))
    assert_close(da, ra, dtype, scale=max(4.0, np.sqrt(n_out / max(1, a.size))))
    assert_close(db, rb, dtype, scale=max(4.0, np.sqrt(n_out / max(1, b.size))))
    g = plan.precision_guarantee()
    assert g.deterministic and g.bit_stable


@pytest.mark.parametrize("op", ["add", "sub"])
def test_binary_backward_optional_operands_and_outputs(device, op):
    dc = random((6, 4), np.float32)
    db = on(device, np.full((4,), 7, np.float32))
    run_plan(gp.BinaryBackwardPlan, gp.BinaryBackwardDescriptor(op, (6, 4), (4,)),
             gp.BinaryBackwardArgs(None, None, on(device, dc), None, db), device)
    sign = -1.0 if op == "sub" else 1.0
    assert_close(db, sign * f64(dc).sum(axis=0), np.float32)


def test_broadcast_dims_collapse():
    assert broadcast_dims("binary", (4, 5, 6), (4, 5, 6)) == ((4, 5, 6), [(120, 1, 1)])
    assert broadcast_dims("binary", (8, 3, 4), (4,)) == ((8, 3, 4), [(24, 4, 0), (4, 1, 1)])
    assert broadcast_dims("binary", (3, 1, 5), (4, 1)) == (
        (3, 4, 5), [(3, 5, 0), (4, 0, 1), (5, 1, 0)])
    assert broadcast_dims("binary", (1, 1), ()) == ((1, 1), [])


# -- bias add and cast ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 1), (7, 13), (33, 64), (0, 5), (5, 0)])
def test_bias_add(device, dtype, rows, n):
    x = random((rows, n), dtype)
    bias = random((n,), dtype, seed=1)
    y = on(device, np.full((rows, n), 7, dtype))
    run_plan(gp.BiasAddPlan, gp.BiasAddDescriptor(rows, n, dtype),
             gp.BiasAddArgs(on(device, x), on(device, bias), y), device)
    assert_close(y, f64(x) + f64(bias), dtype)


CAST_DTYPES = [pytest.param(np.dtype(d), id=gp.dtypes.short_name(d))
               for d in gp.FLOAT_DTYPES + (np.int32, np.int64)]


@pytest.mark.parametrize("src", CAST_DTYPES)
@pytest.mark.parametrize("dst", CAST_DTYPES)
def test_cast(device, src, dst):
    n = 1031
    vals = random((n,), np.float64, low=-100, high=100)
    x = np.trunc(vals).astype(src) if src.kind == "i" else vals.astype(src)
    y = on(device, np.full((n,), 7, dst))
    run_plan(gp.CastPlan, gp.CastDescriptor(n, src, dst), gp.CastArgs(on(device, x), y), device)
    if dst.kind == "i":  # truncation toward zero is exact
        np.testing.assert_array_equal(gp.to_host(y), np.trunc(f64(x)).astype(dst))
    else:
        assert_close(y, f64(x), dst)


def test_empty_extents(device):
    for plan_cls, desc, args in [
        (gp.UnaryPlan, gp.UnaryDescriptor("relu", 0), lambda z: gp.UnaryArgs(z, z.copy())),
        (gp.CastPlan, gp.CastDescriptor(0, np.float32, gp.bfloat16),
         lambda z: gp.CastArgs(z, z.astype(gp.bfloat16))),
        (gp.BinaryPlan, gp.BinaryDescriptor("mul", (0,), (0,)),
         lambda z: gp.BinaryArgs(z, z.copy(), z.copy())),
    ]:
        run_plan(plan_cls, desc, args(on(device, np.zeros((0,), np.float32))), device)


# -- errors ------------------------------------------------------------------------------


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="binary: argument 'b_shape'"):
        gp.BinaryPlan.select(s, gp.BinaryDescriptor("add", (3, 4), (3,)))
    with pytest.raises(gp.Unsupported, match="'op'"):
        gp.BinaryBackwardPlan.select(s, gp.BinaryBackwardDescriptor("pow", (3,), (3,)))
    with pytest.raises(gp.Unsupported, match="at most 8 dims"):
        gp.BinaryPlan.select(s, gp.BinaryDescriptor("add", (2, 1) * 5, (1, 2) * 5))
    with pytest.raises(gp.Unsupported, match="'out_dtype'"):
        gp.CastPlan.select(s, gp.CastDescriptor(3, np.float32, np.int8))
    with pytest.raises(gp.Unsupported, match="nvrtc requested"):
        gp.BiasAddPlan.select(s, gp.BiasAddDescriptor(2, 3),
                              gp.PlanPreference(backend=gp.BackendKind.NVRTC))


def test_argument_errors_leave_outputs_untouched(device):
    s = stream_for(device)
    x = on(device, random((8,), np.float32))
    y = on(device, np.full((8,), 9, np.float32))
    unary = gp.UnaryPlan.select(s, gp.UnaryDescriptor("silu", 8))
    none = gp.Workspace.none()

    def run_unary(**kw):
        a = dict(x=x, y=y) | kw
        return lambda: unary.run(s, none, gp.UnaryArgs(**a))

    assert_rejected(run_unary(x=x.astype(np.float16)), gp.Unsupported, [y], "unary", "'x'",
                    "f32", "f16")
    assert_rejected(run_unary(y=on(device, np.zeros(7, np.float32))), gp.BufferTooSmall, [y],
                    "'y'", "8", "7")
    assert_rejected(run_unary(x=x.reshape(2, 4)), gp.InvalidProblem, [y], "'x'", "(8,)")
    assert_rejected(run_unary(y=x), gp.InvalidProblem, [x], "'y'", "distinct")
    if device == "cuda":
        assert_rejected(run_unary(x=gp.to_host(x)), gp.InvalidProblem, [y], "'x'")

    binary = gp.BinaryBackwardPlan.select(s, gp.BinaryBackwardDescriptor("mul", (2, 4), (4,)))
    a2, b1 = x.reshape(2, 4), on(device, random((4,), np.float32))
    da = on(device, np.full((2, 4), 9, np.float32))
    db = on(device, np.full((4,), 9, np.float32))
    ws = gp.Workspace.allocate(s, binary.workspace_size())

    def run_bwd(**kw):
        a = dict(a=a2, b=b1, dc=a2, da=da, db=db) | kw
        return lambda: binary.run(s, ws, gp.BinaryBackwardArgs(**a))

    assert_rejected(run_bwd(a=None), gp.InvalidProblem, [da, db], "binary_backward", "'a'")
    assert_rejected(run_bwd(db=on(device, np.zeros((3,), np.float32))), gp.BufferTooSmall,
                    [da, db], "'db'", "4", "3")
    assert_rejected(run_bwd(da=on(device, np.zeros((4, 2), np.float32))), gp.InvalidProblem,
                    [da, db], "'da'", "(2, 4)")
    assert_rejected(run_bwd(dc=a2.astype(np.float64)), gp.Unsupported, [da, db], "'dc'")
    assert_rejected(run_bwd(db=da.reshape(-1)[:4]), gp.InvalidProblem, [da], "'db'", "'da'")

    cast = gp.CastPlan.select(s, gp.CastDescriptor(8, np.float32, gp.bfloat16))
    out = on(device, np.zeros((8,), gp.bfloat16))
    assert_rejected(lambda: cast.run(s, none, gp.CastArgs(x, out.astype(np.float16))),
                    gp.Unsupported, [out], "cast", "'y'", "bf16", "f16")


@pytest.mark.gpu
def test_device_skus_and_workspace():
    s = gp.Stream.current()
    same = gp.BinaryPlan.select(s, gp.BinaryDescriptor("add", (4, 5), (4, 5)))
    bcast = gp.BinaryPlan.select(s, gp.BinaryDescriptor("add", (4, 5), (5,)))
    assert (same.sku().variant, bcast.sku().variant) == ("contiguous", "broadcast")
    bwd = gp.BinaryBackwardPlan.select(s, gp.BinaryBackwardDescriptor("mul", (3000, 8), (8,),
                                                                      gp.bfloat16))
    assert bwd.workspace_size() > 0 and bwd.precision_guarantee().accumulator == "f32"
    a, b = on("cuda", random((3000, 8), gp.bfloat16)), on("cuda", random((8,), gp.bfloat16))
    da, db = on("cuda", np.zeros((3000, 8), gp.bfloat16)), on("cuda", np.zeros(8, gp.bfloat16))
    assert_rejected(lambda: bwd.run(s, gp.Workspace.none(),
                                    gp.BinaryBackwardArgs(a, b, a, da, db)),
                    gp.WorkspaceTooSmall, [da, db], "'ws'")


def test_functional_api(device):
    x = on(device, random((3, 5, 7), gp.bfloat16))
    bias = on(device, random((7,), gp.bfloat16, seed=1))
    F = gp.functional
    assert_close(F.bias_add(x, bias), f64(x) + f64(bias), gp.bfloat16)
    c = F.binary("mul", x, bias)
    assert c.shape == (3, 5, 7) and c.dtype == gp.bfloat16
    da, db = F.binary_backward("mul", x, bias, x)
    assert da.shape == (3, 5, 7) and db.shape == (7,)
    assert_close(db, (f64(x) * f64(x)).sum(axis=(0, 1)), gp.bfloat16, scale=4)
    y = F.cast(x.transpose(2, 0, 1), np.float32)  # strided input is made contiguous
    assert y.shape == (7, 3, 5) and y.dtype == np.float32 and gp.device_of(y) == device
    np.testing.assert_array_equal(gp.to_host(y), f64(x).transpose(2, 0, 1))


def test_cast_to_bf16_rounds_once(device):
    """f64 and integers to bf16: nearest even of the exact value (NumPy's astype goes through
    f32 and rounds twice; the kernel's __double2bfloat16 / __ll2bfloat16_rn round once)."""
    x = np.array([1 + 2**-8 + 2**-40, -(1 + 2**-8 + 2**-40), 2.0**-140, 1e40])
    got = gp.to_host(gp.functional.cast(on(device, x), gp.bfloat16)).astype(np.float64)
    np.testing.assert_array_equal(got, [1.0078125, -1.0078125, 0.0, np.inf])
    i = np.array([2**24 + 2**16 + 1, -(2**30 + 2**22 + 1)], np.int32)
    got = gp.to_host(gp.functional.cast(on(device, i), gp.bfloat16)).astype(np.float64)
    np.testing.assert_array_equal(got, [2**24 + 2**17, -(2**30 + 2**23)])
    j = np.array([2**40 + 2**32 + 1, 2**62 + 2**54 + 1], np.int64)
    got = gp.to_host(gp.functional.cast(on(device, j), gp.bfloat16)).astype(np.float64)
    np.testing.assert_array_equal(got, [2.0**40 + 2.0**33, 2.0**62 + 2.0**55])
