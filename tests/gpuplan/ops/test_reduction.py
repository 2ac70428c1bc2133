"""Reduce (sum/mean/max/min/prod over axes) and global L2 norm plans against the family's
float64 references (gpuplan.ops.reduction.reference)."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.reduction import launch as reduce_launch
from gpuplan.ops.reduction.launch import COMBINES, NORM_CHUNK, NORM_DTYPES
from gpuplan.ops.reduction.plans import REDUCE_OPS, reduce_layout
from gpuplan.ops.reduction.reference import (
    global_l2_norm_reference,
    prod_backward_reference,
    reduce_reference,
    variance_reference,
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

# (shape, axes): rows (warp and block per row, split long rows), cols (split tall ones),
# general strided patterns, size-1 axes, negative axes and all-axes reductions.
CASES = [
    ((7,), None),
    ((5, 33), (1,)),
    ((50, 3), 1),
    ((3, 2000), -1),
    ((2, 70001), 1),
    ((33, 5), 0),
    ((4, 7, 9), 1),
    ((1100, 3), 0),
    ((3, 4, 5, 6), (0, 2)),
    ((2, 3, 4, 5), (1, 3)),
    ((5, 1, 6), (1,)),
    ((6, 5, 4), (0, 1, 2)),
    ((1,), 0),
]


def ref_reduce(x: np.ndarray, op: str, axes, keepdims: bool) -> np.ndarray:
    return reduce_reference(op, x, axes, keepdims)


def _n_red(shape, axes) -> int:
    nd = len(shape)
    ax = range(nd) if axes is None else ((axes,) if isinstance(axes, int) else axes)
    return int(np.prod([shape[a % nd] for a in ax]))


def _run_reduce(device, op, x, axes, keepdims=False, pref=None):
    desc = gp.ReduceDescriptor(op, x.shape, axes, keepdims, x.dtype)
    y = on(device, np.full(desc.out_shape(), 5, dtype=x.dtype))
    plan = run_plan(gp.ReducePlan, desc, gp.ReduceArgs(on(device, x), y), device, pref)
    return y, plan


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("shape,axes", CASES)
def test_reduce_matches_reference(device, dtype, op, shape, axes):
    x = random(shape, dtype, seed=len(shape))
    keepdims = len(shape) % 2 == 1
    y, plan = _run_reduce(device, op, x, axes, keepdims)
    ref = ref_reduce(x, op, axes, keepdims)
    assert tuple(y.shape) == ref.shape
    if op in ("max", "min"):  # a max of representable values is exact
        np.testing.assert_array_equal(f64(y), ref)
    elif op == "prod":  # relative error grows like the count (one rounding per factor)
        assert_close(y, ref, dtype, scale=max(1.0, _n_red(shape, axes)))
    else:
        assert_close(y, ref, dtype, scale=max(1.0, np.sqrt(_n_red(shape, axes))))
    g = plan.precision_guarantee()
    assert g.deterministic and g.bit_stable


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_is_bit_identical_across_runs(device, dtype):
    x = random((3, 40000), dtype, seed=9)
    for axes in (None, 0, 1):  # split rows, split cols, rows
        first, _ = _run_reduce(device, "sum", x, axes)
        again, _ = _run_reduce(device, "sum", x, axes)
        np.testing.assert_array_equal(gp.to_host(again).reshape(-1).view(np.uint8),
                                      gp.to_host(first).reshape(-1).view(np.uint8))


def test_max_propagates_nan(device):
    x = random((4, 50), np.float32)
    x[2, 17] = np.nan
    y, _ = _run_reduce(device, "max", x, 1)
    got = gp.to_host(y)
    assert np.isnan(got[2]) and not np.isnan(got[[0, 1, 3]]).any()


@pytest.mark.parametrize("shape,axes,op", [((0, 4), 0, "sum"), ((4, 0), 1, "mean"),
                                           ((0, 4), 1, "max"), ((3, 0, 2), (0, 2), "sum")])
def test_empty_extents(device, shape, axes, op):
    x = np.zeros(shape, np.float32)
    y, _ = _run_reduce(device, op, x, axes)
    ref = ref_reduce(x, op, axes, False)
    np.testing.assert_array_equal(f64(y), ref)  # zeros for sums, nan for means, empty for max


def test_layouts_pick_the_expected_kernels():
    lay = reduce_layout((5, 33), frozenset({1}))
    assert (lay.kind, lay.dims, lay.split) == ("rows", (5, 33), 1)
    lay = reduce_layout((2, 70001), frozenset({1}))
    assert (lay.kind, lay.split, lay.split_len) == ("rows", 5, 16384)
    assert lay.workspace_bytes(4) == 256  # 10 f32 partials, 256-byte aligned
    lay = reduce_layout((4, 7, 9), frozenset({1}))
    assert (lay.kind, lay.dims, lay.split) == ("cols", (4, 7, 9), 1)
    lay = reduce_layout((1100, 3), frozenset({0}))
    assert (lay.kind, lay.split, lay.split_len) == ("cols", 5, 256)
    lay = reduce_layout((3, 1, 4, 5), frozenset({2, 3}))  # size-1 dims vanish, 4*5 merge
    assert (lay.kind, lay.dims) == ("rows", (3, 20))
    lay = reduce_layout((3, 4, 5, 6), frozenset({0, 2}))
    assert lay.kind == "general"
    assert lay.dims == ((4, 6, 3, 5), (30, 1, 120, 6), 2)  # kept dims first, then reduced
    lay = reduce_layout((50, 3), frozenset({1}))  # short rows: a thread per row
    assert (lay.kind, lay.dims) == ("cols", (50, 3, 1))
    lay = reduce_layout((4, 0), frozenset({1}))
    assert (lay.kind, lay.n_out, lay.n_red) == ("rows", 4, 0)


def test_descriptor_errors():
    s = gp.Stream.host()
    sel = gp.ReducePlan.select
    with pytest.raises(gp.Unsupported, match="reduce: argument 'op'"):
        sel(s, gp.ReduceDescriptor("median", (3,), None))
    with pytest.raises(gp.InvalidProblem, match="'shape'"):
        sel(s, gp.ReduceDescriptor("sum", (3, -1), None))
    with pytest.raises(gp.InvalidProblem, match="'axes'"):
        sel(s, gp.ReduceDescriptor("sum", (3, 4), 2))
    with pytest.raises(gp.InvalidProblem, match="distinct"):
        sel(s, gp.ReduceDescriptor("sum", (3, 4), (1, -1)))
    with pytest.raises(gp.InvalidProblem, match="max"):
        sel(s, gp.ReduceDescriptor("max", (3, 0), 1))
    with pytest.raises(gp.InvalidProblem, match="min"):
        sel(s, gp.ReduceDescriptor("min", (3, 0), 1))
    with pytest.raises(gp.Unsupported, match="dtype"):
        sel(s, gp.ReduceDescriptor("sum", (3,), None, dtype=np.int32))
    with pytest.raises(gp.Unsupported, match="nvrtc requested"):
        sel(s, gp.ReduceDescriptor("sum", (3,), None),
            gp.PlanPreference(backend=gp.BackendKind.NVRTC))


def test_argument_errors_leave_outputs_untouched(device):
    s = stream_for(device)
    x = on(device, random((6, 5), np.float32))
    y = on(device, np.full((6,), 9, np.float32))
    plan = gp.ReducePlan.select(s, gp.ReduceDescriptor("sum", (6, 5), 1))

    def run(**kw):
        a = dict(x=x, y=y) | kw
        return lambda: plan.run(s, gp.Workspace.none(), gp.ReduceArgs(**a))

    assert_rejected(run(x=x.astype(np.float64)), gp.Unsupported, [y], "reduce", "'x'", "f32",
                    "f64")
    assert_rejected(run(y=on(device, np.zeros(5, np.float32))), gp.BufferTooSmall, [y], "'y'",
                    "6", "5")
    assert_rejected(run(x=x.reshape(5, 6)), gp.InvalidProblem, [y], "'x'", "(6, 5)")
    assert_rejected(run(x=on(device, np.zeros((6, 10), np.float32))[:, ::2]), gp.InvalidProblem,
                    [y], "contiguous")
    assert_rejected(run(y=x.reshape(-1)[:6]), gp.InvalidProblem, [x], "'y'", "distinct")


@pytest.mark.gpu
def test_device_workspace_and_skus():
    s = gp.Stream.current()
    desc = gp.ReduceDescriptor("mean", (2, 70001), 1, dtype=gp.bfloat16)
    plan = gp.ReducePlan.select(s, desc)
    assert plan.sku().variant == "rows" and plan.workspace_size() == 256
    x = on("cuda", random((2, 70001), gp.bfloat16))
    y = on("cuda", np.zeros(2, gp.bfloat16))
    assert_rejected(lambda: plan.run(s, gp.Workspace.none(), gp.ReduceArgs(x, y)),
                    gp.WorkspaceTooSmall, [y], "'ws'", "256")
    assert gp.ReducePlan.select(s, gp.ReduceDescriptor("sum", (3, 4, 5), (0, 2))).sku().variant \
        == "general"
    assert gp.ReducePlan.select(s, gp.ReduceDescriptor("sum", (30, 4), 0)).sku().variant == "cols"


def test_functional_reduce(device):
    x = on(device, random((4, 3, 5), gp.bfloat16))
    y = gp.functional.reduce("sum", x, axes=[0, 2], keepdims=True)
    assert y.shape == (1, 3, 1) and y.dtype == gp.bfloat16
    assert_close(y, reduce_reference("sum", x, (0, 2), keepdims=True), gp.bfloat16, scale=4)
    w = random((4, 3), np.float64)
    z = gp.functional.reduce("max", on(device, w).T)  # strided input
    assert z.shape == () and gp.device_of(z) == device
    assert float(gp.to_host(z)) == reduce_reference("max", w)
    m = gp.functional.reduce("mean", on(device, w), axes=-1)
    assert_close(m, reduce_reference("mean", w, -1), np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_through_check_plan(device, dtype, op):
    """Results and every malformed operand the declaration implies."""
    x = random((3, 4, 5, 6), dtype, seed=4)
    desc = gp.ReduceDescriptor(op, x.shape, (0, 2), True, dtype)
    check_plan(gp.ReducePlan, desc, {"x": x},
               lambda x, y: ref_reduce(x, op, (0, 2), True), device=device, scale=4)


def _compile_reduction(combines: tuple[str, ...], norm_types: tuple[str, ...]) -> None:
    """reduction.cu for the last combine of `combines`, compiled with the given tables."""
    from pathlib import Path
    compile_with_enums(Path(reduce_launch.__file__).with_name("reduction.cu"),
                       [f"reduce_cols<float, float, {len(combines) - 1}>",
                        "global_l2_norm<float>"],
                       {"Combine": combines, "NormType": norm_types},
                       (f"-DGPUPLAN_NORM_CHUNK={NORM_CHUNK}",))


def test_the_cuda_enums_are_generated_from_the_tables():
    """The tables as they are compile; a row without CUDA code is a compile error."""
    norm_types = tuple(gp.dtypes.short_name(d) for d in NORM_DTYPES)
    _compile_reduction(COMBINES, norm_types)
    with pytest.raises(Exception, match="combine without"):
        _compile_reduction(COMBINES + ("median",), norm_types)
    with pytest.raises(Exception, match="NormType row without a load"):
        _compile_reduction(COMBINES, norm_types + ("i8",))


# -- global L2 norm ---------------------------------------------------------------------


def _norm_inputs(with_f64: bool):
    dts = [np.float32, gp.bfloat16, np.float16, np.float32]
    if with_f64:
        dts[3] = np.float64
    shapes = [(40000,), (7, 13), (0,), (33000, 2)]  # several chunks, an empty tensor
    return [random(s, t, seed=i) for i, (s, t) in enumerate(zip(shapes, dts, strict=True))]


@pytest.mark.parametrize("with_f64", [False, True])
def test_global_norm_matches_reference(device, with_f64):
    arrays = _norm_inputs(with_f64)
    ref = global_l2_norm_reference(arrays)
    out_dtype = np.float64 if with_f64 else np.float32
    desc = gp.GlobalNormDescriptor(tuple(a.size for a in arrays),
                                   tuple(np.dtype(a.dtype) for a in arrays))
    results = []
    for _ in range(2):
        out = on(device, np.full((), 7, out_dtype))
        plan = run_plan(gp.GlobalNormPlan, desc,
                        gp.GlobalNormArgs(tuple(on(device, a) for a in arrays), out), device)
        results.append(gp.to_host(out))
    assert results[0].dtype == out_dtype
    assert_close(results[0], ref, out_dtype, scale=10)
    np.testing.assert_array_equal(results[0].reshape(-1).view(np.uint8),
                                  results[1].reshape(-1).view(np.uint8))
    g = plan.precision_guarantee()
    assert g.deterministic and g.bit_stable and plan.sku().dtype == gp.dtypes.short_name(
        out_dtype)


def test_global_norm_of_nothing_is_zero(device):
    for arrays in ([], [np.zeros((0,), np.float32)]):
        desc = gp.GlobalNormDescriptor(tuple(a.size for a in arrays),
                                       tuple(a.dtype for a in arrays))
        out = on(device, np.full((), 7, np.float32))
        run_plan(gp.GlobalNormPlan, desc,
                 gp.GlobalNormArgs(tuple(on(device, a) for a in arrays), out), device)
        assert float(gp.to_host(out)) == 0.0


def test_global_norm_errors(device):
    s = stream_for(device)
    a = on(device, random((10,), np.float32))
    b = on(device, random((3, 4), gp.bfloat16))
    out = on(device, np.full((), 7, np.float32))
    with pytest.raises(gp.InvalidProblem, match="'dtypes'"):
        gp.GlobalNormPlan.select(s, gp.GlobalNormDescriptor((10, 12), (np.float32,)))
    with pytest.raises(gp.Unsupported, match=r"'dtypes\[1\]'"):
        gp.GlobalNormPlan.select(s, gp.GlobalNormDescriptor((10, 12), (np.float32, np.int8)))
    plan = gp.GlobalNormPlan.select(s, gp.GlobalNormDescriptor((10, 12),
                                                               (np.float32, gp.bfloat16)))
    ws = gp.Workspace.allocate(s, plan.workspace_size())

    def run(arrays=(a, b), o=out):
        return lambda: plan.run(s, ws, gp.GlobalNormArgs(arrays, o))

    assert_rejected(run(arrays=(a,)), gp.InvalidProblem, [out], "global_l2_norm", "'arrays'",
                    "2 arrays")
    assert_rejected(run(arrays=(a, b.astype(np.float32))), gp.Unsupported, [out],
                    "'arrays[1]'", "bf16", "f32")
    assert_rejected(run(arrays=(a[:8], b)), gp.BufferTooSmall, [out], "'arrays[0]'", "10", "8")
    assert_rejected(run(arrays=(on(device, np.zeros(20, np.float32))[::2], b)),
                    gp.InvalidProblem, [out], "contiguous")
    assert_rejected(run(o=on(device, np.zeros((), np.float64))), gp.Unsupported, [out], "'out'")
    assert_rejected(run(o=on(device, np.zeros(2, np.float32))), gp.InvalidProblem, [out],
                    "'out'", "shape ()")
    if device == "cuda":
        assert_rejected(run(arrays=(gp.to_host(a), b)), gp.InvalidProblem, [out], "'arrays[0]'")
        assert_rejected(lambda: plan.run(s, gp.Workspace.none(), gp.GlobalNormArgs((a, b), out)),
                        gp.WorkspaceTooSmall, [out], "'ws'")


def test_functional_global_norm(device):
    arrays = [on(device, random((5, 6), np.float16)), on(device, random((9,), np.float32))]
    y = gp.functional.global_l2_norm(arrays)
    assert y.shape == () and y.dtype == np.float32 and gp.device_of(y) == device
    assert_close(y, global_l2_norm_reference(arrays), np.float32)
    assert gp.functional.global_l2_norm([]).shape == ()


# -- variance over axes, and the gradient of prod along one dim -------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axes,correction,std", [
    ((5, 33), 1, 1.0, False), ((4, 7, 9), 1, 0.0, True), ((3, 4, 5, 6), (0, 2), 1.0, True),
    ((6, 5, 4), None, 2.0, False), ((50, 3), 0, 1.0, True), ((1, 4), 0, 1.0, False)])
def test_variance(device, dtype, shape, axes, correction, std):
    x = random(shape, dtype, seed=3) + 4.0  # an offset: the two-pass formula keeps precision
    x = x.astype(dtype)
    keepdims = len(shape) % 2 == 1
    desc = gp.VarianceDescriptor(shape, axes, keepdims, correction, std, dtype)
    check_plan(gp.VariancePlan, desc, {"x": x},
               lambda x, **_: variance_reference(x, axes, keepdims, correction, std),
               device=device, scale=8, bad_inputs=shape == (5, 33))


def test_variance_of_nothing_is_nan(device):
    x = on(device, np.zeros((3, 0), np.float32))
    y = gp.functional.variance(x, 1)
    assert np.isnan(gp.to_host(y)).all() and y.shape == (3,)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("view", [(3, 6, 1), (2, 5, 3)])
def test_prod_backward_with_zeros(device, dtype, view):
    x = random(view, dtype, seed=5, low=0.5, high=1.5)
    x[0, 2, 0] = 0  # one zero in a row
    x[1, 1, 0] = x[1, 3, 0] = 0  # two zeros: all 0
    dy = random((view[0], view[2]), dtype, seed=6)
    check_plan(gp.ProdBackwardPlan, gp.ProdBackwardDescriptor(*view, dtype), {"x": x, "dy": dy},
               lambda x, dy, **_: prod_backward_reference(x, dy), device=device, scale=4,
               bad_inputs=view == (2, 5, 3))


def test_variance_and_prod_backward_errors_and_shapes(device):
    with pytest.raises(gp.InvalidProblem, match="variance: argument 'correction'"):
        gp.VariancePlan.select(gp.Stream.host(), gp.VarianceDescriptor((3,), None, False, -1.0))
    x = on(device, random((2, 3, 4), np.float32))
    dx = gp.functional.prod_backward(x, on(device, np.ones((2, 4), np.float32)), 1)
    assert dx.shape == (2, 3, 4)
    assert stream_for(device) is not None and f64(dx).shape == (2, 3, 4)
