"""Binary plans (broadcasting add/sub/mul/div/pow/maximum/minimum and their gradients, the
bool comparisons, bias add) against the family's float64 reference
(gpuplan.ops.binary.reference), on host and device."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.binary.plans import BINARY_OP_NAMES, DIFFERENTIABLE_OPS, broadcast_dims
from gpuplan.ops.binary.reference import (
    bias_add_reference,
    binary_backward_reference,
    binary_reference,
)
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
from tests.helpers import DTYPES, compile_with_enums

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


ARITHMETIC = ("add", "sub", "mul", "div")
NEW_OPS = ("pow", "maximum", "minimum")
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
ref_binary = binary_reference
ref_binary_backward = binary_backward_reference


def _new_operands(op, a_shape, b_shape, dtype):
    """pow: a in [0.5, 2] (a negative base gives NaN for most exponents), b in [-2, 2];
    maximum/minimum and comparisons: values on a grid of quarters (exact in every dtype),
    so that ties occur."""
    if op == "pow":
        return (random(a_shape, dtype, seed=2, low=0.5, high=2.0),
                random(b_shape, dtype, seed=3, low=-2.0, high=2.0))
    grid = [np.round(random(shape, np.float64, seed=seed) * 4) / 4
            for shape, seed in ((a_shape, 2), (b_shape, 3))]
    return tuple(g.astype(dtype) for g in grid)


def test_the_table_is_the_op_list():
    integer = ("remainder", "floor_divide")
    assert BINARY_OP_NAMES == (ARITHMETIC + NEW_OPS + integer + COMPARISONS
                               + ("bitwise_and", "bitwise_or", "bitwise_xor"))
    assert DIFFERENTIABLE_OPS == ARITHMETIC + NEW_OPS + ("remainder",)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ARITHMETIC)
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
    assert broadcast_dims("binary", (4, 5, 6), (4, 5, 6)) == ((4, 5, 6), ((120, 1, 1),))
    assert broadcast_dims("binary", (8, 3, 4), (4,)) == ((8, 3, 4), ((24, 4, 0), (4, 1, 1)))
    assert broadcast_dims("binary", (3, 1, 5), (4, 1)) == (
        (3, 4, 5), ((3, 5, 0), (4, 0, 1), (5, 1, 0)))
    assert broadcast_dims("binary", (1, 1), ()) == ((1, 1), ())


def test_forward_and_backward_share_one_descriptor():
    assert gp.BinaryBackwardDescriptor is gp.BinaryDescriptor
    desc = gp.BinaryDescriptor("mul", (2, 1, 3), (4, 1))
    assert desc.out_shape() == (2, 4, 3)
    s = gp.Stream.host()
    assert gp.BinaryBackwardPlan.select(s, desc).shape("dc") == (2, 4, 3)
    assert gp.BinaryPlan.select(s, desc).shape("c") == (2, 4, 3)


# -- bias add ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 1), (7, 13), (33, 64), (0, 5), (5, 0)])
def test_bias_add(device, dtype, rows, n):
    x = random((rows, n), dtype)
    bias = random((n,), dtype, seed=1)
    y = on(device, np.full((rows, n), 7, dtype))
    run_plan(gp.BiasAddPlan, gp.BiasAddDescriptor(rows, n, dtype),
             gp.BiasAddArgs(on(device, x), on(device, bias), y), device)
    assert_close(y, bias_add_reference(x, bias), dtype)


# -- empty extents and errors --------------------------------------------------------------


def run_without_launch(monkeypatch, plan_cls, desc, args, device) -> None:
    """Run a plan whose problem is empty with every kernel/NumPy body replaced by a failure:
    `run` must return before reaching one."""
    def launched(*_):
        raise AssertionError(f"{plan_cls.__name__} launched an empty problem")

    for name in dir(plan_cls):
        if name.startswith("_run_"):
            monkeypatch.setattr(plan_cls, name, launched)
    run_plan(plan_cls, desc, args, device)


def test_empty_extents(device, monkeypatch):
    z = on(device, np.zeros((0,), np.float32))
    run_without_launch(monkeypatch, gp.BinaryPlan, gp.BinaryDescriptor("mul", (0,), (0,)),
                       gp.BinaryArgs(z, z.copy(), z.copy()), device)
    run_without_launch(monkeypatch, gp.BinaryPlan, gp.BinaryDescriptor("add", (0, 3), (3,)),
                       gp.BinaryArgs(on(device, np.zeros((0, 3), np.float32)),
                                     on(device, np.ones(3, np.float32)),
                                     on(device, np.zeros((0, 3), np.float32))), device)
    run_without_launch(monkeypatch, gp.BinaryBackwardPlan,
                       gp.BinaryBackwardDescriptor("div", (0,), (0, 1)),
                       gp.BinaryBackwardArgs(z, z.reshape(0, 1).copy(), z.reshape(0, 0).copy(),
                                             z.copy(), z.reshape(0, 1).copy()), device)
    for rows, n in ((0, 5), (5, 0)):
        run_without_launch(monkeypatch, gp.BiasAddPlan, gp.BiasAddDescriptor(rows, n),
                           gp.BiasAddArgs(on(device, np.zeros((rows, n), np.float32)),
                                          on(device, np.zeros(n, np.float32)),
                                          on(device, np.zeros((rows, n), np.float32))), device)


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="binary: argument 'b_shape'"):
        gp.BinaryPlan.select(s, gp.BinaryDescriptor("add", (3, 4), (3,)))
    with pytest.raises(gp.Unsupported, match="'op'"):
        gp.BinaryBackwardPlan.select(s, gp.BinaryBackwardDescriptor("atan2", (3,), (3,)))
    with pytest.raises(gp.Unsupported, match="binary_backward: argument 'op': expected one of "
                                             r"\('add'.*a comparison has no gradient\), "
                                             "given 'lt'"):
        gp.BinaryBackwardPlan.select(s, gp.BinaryBackwardDescriptor("lt", (3,), (3,)))
    with pytest.raises(gp.Unsupported, match="at most 8 dims"):
        gp.BinaryPlan.select(s, gp.BinaryDescriptor("add", (2, 1) * 5, (1, 2) * 5))
    with pytest.raises(gp.InvalidProblem, match="'a_shape'"):
        gp.BinaryPlan.select(s, gp.BinaryDescriptor("add", (3, -1), (3,)))
    with pytest.raises(gp.Unsupported, match="nvrtc requested"):
        gp.BiasAddPlan.select(s, gp.BiasAddDescriptor(2, 3),
                              gp.PlanPreference(backend=gp.BackendKind.NVRTC))


def test_argument_errors_leave_outputs_untouched(device):
    s = stream_for(device)
    x = on(device, random((8,), np.float32))
    binary = gp.BinaryBackwardPlan.select(s, gp.BinaryBackwardDescriptor("mul", (2, 4), (4,)))
    a2, b1 = x.reshape(2, 4), on(device, random((4,), np.float32))
    da = on(device, np.full((2, 4), 9, np.float32))
    db = on(device, np.full((4,), 9, np.float32))
    ws = gp.Workspace.allocate(s, binary.workspace_size())

    def run_bwd(**kw):
        a = dict(a=a2, b=b1, dc=a2, da=da, db=db) | kw
        return lambda: binary.run(s, ws, gp.BinaryBackwardArgs(**a))

    assert_rejected(run_bwd(a=None), gp.InvalidProblem, [da, db], "binary_backward", "'a'")
    assert_rejected(run_bwd(dc=None), gp.InvalidProblem, [da, db], "binary_backward", "'dc'")
    assert_rejected(run_bwd(db=on(device, np.zeros((3,), np.float32))), gp.BufferTooSmall,
                    [da, db], "'db'", "4", "3")
    assert_rejected(run_bwd(da=on(device, np.zeros((4, 2), np.float32))), gp.InvalidProblem,
                    [da, db], "'da'", "(2, 4)")
    assert_rejected(run_bwd(dc=a2.astype(np.float64)), gp.Unsupported, [da, db], "'dc'")
    assert_rejected(run_bwd(db=da.reshape(-1)[:4]), gp.InvalidProblem, [da], "'db'", "'da'")

    forward = gp.BinaryPlan.select(s, gp.BinaryDescriptor("add", (2, 4), (4,)))
    c = on(device, np.full((2, 4), 9, np.float32))
    assert_rejected(lambda: forward.run(s, None, gp.BinaryArgs(a2, b1, a2)), gp.InvalidProblem,
                    [a2], "binary", "'c'", "distinct")
    assert_rejected(lambda: forward.run(s, None, gp.BinaryArgs(a2, b1.astype(np.float16), c)),
                    gp.Unsupported, [c], "'b'", "f32", "f16")


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
    assert_close(F.bias_add(x, bias), bias_add_reference(x, bias), gp.bfloat16)
    c = F.binary("mul", x, bias)
    assert c.shape == (3, 5, 7) and c.dtype == gp.bfloat16
    assert_close(c, binary_reference("mul", x, bias), gp.bfloat16)
    da, db = F.binary_backward("mul", x, bias, x)
    assert da.shape == (3, 5, 7) and db.shape == (7,)
    assert_close(db, binary_backward_reference("mul", x, bias, x)[1], gp.bfloat16, scale=4)
    t = F.binary("sub", x.transpose(2, 0, 1), bias.reshape(7, 1, 1))  # strided input
    assert_close(t, binary_reference("sub", gp.to_host(x).transpose(2, 0, 1),
                                     gp.to_host(bias).reshape(7, 1, 1)), gp.bfloat16)


def test_functional_zero_d_operands_keep_shape(device):
    """0-d with 0-d is 0-d, as NumPy and torch (ascontiguousarray alone would give (1,))."""
    a = on(device, np.array(3.0, np.float32))
    b = on(device, np.array(4.0, np.float32))
    c = gp.functional.binary("div", a, b)
    assert c.shape == () and float(gp.to_host(c)) == 0.75
    da, db = gp.functional.binary_backward("mul", a, b, on(device, np.array(1.0, np.float32)))
    assert da.shape == () and db.shape == ()
    assert float(gp.to_host(da)) == 4.0 and float(gp.to_host(db)) == 3.0


def test_functional_binary_reuses_one_plan():
    """Repeated calls with the same shapes select once (the tape's gradient sums)."""
    from gpuplan.execute import _PLANS
    x = random((4, 3), np.float32)
    before = len(_PLANS)
    for _ in range(3):
        np.testing.assert_array_equal(gp.functional.binary("add", x, x), x + x)
    assert len(_PLANS) - before <= 1


def _compile_binary(names: tuple[str, ...], grad_of: int | None = None) -> None:
    """binary.cu's forward for the last row of `names` on int (and the gradient of row
    `grad_of`), compiled."""
    from gpuplan.ops.binary import plans as binary
    exprs = [f"binary_broadcast<int, {len(names) - 1}>"]
    if grad_of is not None:
        exprs.append(f"binary_grad<float, float, {grad_of}, 1>")
    compile_with_enums(binary._MODULE.path, exprs, {"BinaryOp": names})


def test_the_cuda_enum_is_generated_from_the_table():
    """The table as it is compiles; a row with no CUDA branch is a compile error."""
    _compile_binary(BINARY_OP_NAMES, grad_of=BINARY_OP_NAMES.index(DIFFERENTIABLE_OPS[-1]))
    with pytest.raises(Exception, match="binary op without CUDA forward math"):
        _compile_binary(BINARY_OP_NAMES + ("atan2",))


# -- pow, maximum, minimum, comparisons ------------------------------------------------------

NEW_SHAPES = [((37,), (37,)), ((3, 1, 5), (4, 1)), ((2, 3, 4), (4,)), ((5,), ()),
              ((0, 3), (3,))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", NEW_OPS + COMPARISONS)
@pytest.mark.parametrize("a_shape,b_shape", NEW_SHAPES)
def test_new_ops_through_check_plan(device, dtype, op, a_shape, b_shape):
    a, b = _new_operands(op, a_shape, b_shape, dtype)
    desc = gp.BinaryDescriptor(op, a_shape, b_shape, dtype)
    plan = check_plan(gp.BinaryPlan, desc, {"a": a, "b": b},
                      lambda a, b, c: ref_binary(op, a, b), device=device, scale=4)
    assert plan.shape("c") == desc.out_shape()
    if op in COMPARISONS:
        c = gp.functional.binary(op, on(device, a), on(device, b))
        assert c.dtype == np.bool_
        np.testing.assert_array_equal(gp.to_host(c), ref_binary(op, a, b))
        return
    dc = random(desc.out_shape(), dtype, seed=5)
    n_out = max(1, int(np.prod(desc.out_shape())))
    ra, rb = ref_binary_backward(op, a, b, dc)
    scale = max(4.0, np.sqrt(n_out / max(1, min(a.size, b.size))))
    sentinels = {"da": np.full(a_shape, 7, dtype), "db": np.full(b_shape, 7, dtype)}
    check_plan(gp.BinaryBackwardPlan, desc, {"a": a, "b": b, "dc": dc, **sentinels},
               lambda **_: {"da": ra, "db": rb}, device=device, scale=scale,
               bad_inputs=a_shape == (37,))


def test_special_values_follow_pytorch(device):
    """pow: 0**0 = 1, nan**0 = 1, 1**nan = 1, (-8)**(1/3) = nan, 0**-1 = inf; gradients 0
    where torch masks them. maximum/minimum propagate NaN; ties split dc in halves.
    Comparisons with NaN are False (but ne)."""
    nan, inf = np.nan, np.inf
    a = on(device, np.array([0.0, nan, 1.0, -8.0, 0.0, 2.0, 3.0], np.float64))
    b = on(device, np.array([0.0, 0.0, nan, 1 / 3, -1.0, 2.0, nan], np.float64))
    F = gp.functional
    np.testing.assert_array_equal(gp.to_host(F.binary("pow", a, b)),
                                  [1.0, 1.0, 1.0, nan, inf, 4.0, nan])
    da, db = F.binary_backward("pow", a, b, on(device, np.ones(7)))
    np.testing.assert_array_equal(gp.to_host(da)[[0, 1, 5]], [0.0, 0.0, 4.0])
    np.testing.assert_array_equal(gp.to_host(db)[[0]], [0.0])  # a == 0, b >= 0
    np.testing.assert_allclose(gp.to_host(db)[5], 4.0 * np.log(2.0))
    np.testing.assert_array_equal(gp.to_host(F.binary("maximum", a, b)),
                                  [0.0, nan, nan, 1 / 3, 0.0, 2.0, nan])
    np.testing.assert_array_equal(gp.to_host(F.binary("minimum", a, b)),
                                  [0.0, nan, nan, -8.0, -1.0, 2.0, nan])
    da, db = F.binary_backward("maximum", a, b, on(device, np.full(7, 2.0)))
    np.testing.assert_array_equal(gp.to_host(da), [1.0, 2.0, 2.0, 0.0, 2.0, 1.0, 2.0])
    np.testing.assert_array_equal(gp.to_host(db), [1.0, 2.0, 2.0, 2.0, 0.0, 1.0, 2.0])
    for op in COMPARISONS:
        got = gp.to_host(F.binary(op, a, b))
        np.testing.assert_array_equal(got, ref_binary(op, a, b), err_msg=op)
        assert got[1] == (op == "ne") and got[6] == (op == "ne")


def test_binary_against_torch():
    torch = pytest.importorskip("torch")
    a = np.array([0.0, 0.5, 1.0, 2.0, -1.0, np.nan, 3.0])
    b = np.array([0.0, 2.0, 1.0, 2.0, 3.0, 1.0, np.nan])
    for op, fn in (("maximum", torch.maximum), ("minimum", torch.minimum)):
        ta, tb = (torch.tensor(v, requires_grad=True) for v in (a, b))
        fn(ta, tb).backward(torch.ones(7, dtype=torch.float64))
        da, db = gp.functional.binary_backward(op, a, b, np.ones(7))
        np.testing.assert_array_equal(gp.functional.binary(op, a, b), fn(ta, tb).detach())
        np.testing.assert_array_equal(da, ta.grad.numpy(), err_msg=op)
        np.testing.assert_array_equal(db, tb.grad.numpy(), err_msg=op)
    pa, pb = np.abs(a[:5]), b[:5]
    ta, tb = torch.tensor(pa, requires_grad=True), torch.tensor(pb, requires_grad=True)
    (ta ** tb).backward(torch.ones(5, dtype=torch.float64))
    da, db = gp.functional.binary_backward("pow", pa, pb, np.ones(5))
    np.testing.assert_allclose(da, ta.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-12)
