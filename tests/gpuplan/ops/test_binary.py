"""Binary plans (broadcasting add/sub/mul/div and their gradients, bias add) against float64
NumPy references, on host and device."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.binary import BINARY_OP_NAMES, broadcast_dims
from tests.plan_testing import (
    DTYPES,
    assert_close,
    assert_rejected,
    compile_with_enums,
    f64,
    on,
    random,
    run_plan,
    stream_for,
)

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


def test_the_table_is_the_op_list():
    assert BINARY_OP_NAMES == ("add", "sub", "mul", "div")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", BINARY_OP_NAMES)
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
    assert_close(y, f64(x) + f64(bias), dtype)


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
        gp.BinaryBackwardPlan.select(s, gp.BinaryBackwardDescriptor("pow", (3,), (3,)))
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
    assert_close(F.bias_add(x, bias), f64(x) + f64(bias), gp.bfloat16)
    c = F.binary("mul", x, bias)
    assert c.shape == (3, 5, 7) and c.dtype == gp.bfloat16
    assert_close(c, f64(x) * f64(bias), gp.bfloat16)
    da, db = F.binary_backward("mul", x, bias, x)
    assert da.shape == (3, 5, 7) and db.shape == (7,)
    assert_close(db, (f64(x) * f64(x)).sum(axis=(0, 1)), gp.bfloat16, scale=4)
    t = F.binary("sub", x.transpose(2, 0, 1), bias.reshape(7, 1, 1))  # strided input
    assert_close(t, f64(x).transpose(2, 0, 1) - f64(bias).reshape(7, 1, 1), gp.bfloat16)


def test_functional_binary_reuses_one_plan():
    """Repeated calls with the same shapes select once (the tape's gradient sums)."""
    from gpuplan.execute import _PLANS
    x = random((4, 3), np.float32)
    before = len(_PLANS)
    for _ in range(3):
        np.testing.assert_array_equal(gp.functional.binary("add", x, x), x + x)
    assert len(_PLANS) - before <= 1


def _compile_binary(names: tuple[str, ...]) -> None:
    """binary.cu's kernels for the last row of `names`, compiled."""
    from gpuplan.ops import binary
    last = len(names) - 1
    compile_with_enums(binary._MODULE.path, [f"binary_contiguous<float, {last}>",
                                             f"binary_grad<float, float, {last}, 1>"],
                       {"BinaryOp": names})


def test_the_cuda_enum_is_generated_from_the_table():
    """The table as it is compiles; a row with no CUDA branch is a compile error."""
    _compile_binary(BINARY_OP_NAMES)
    with pytest.raises(Exception, match="binary op without CUDA forward math"):
        _compile_binary(BINARY_OP_NAMES + ("pow",))
