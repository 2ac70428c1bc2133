"""Reductions on the emulated device against the float64 references (gpuplan.ops.reduction
.reference): ReducePlan over every layout
(rows with a warp and a block per row, split long rows, cols, split tall cols, general), the
half <-> f32 partial passes, the broadcast-gradient sums of BinaryBackwardPlan (f32 temporaries
into half outputs) and the one-launch global L2 norm over mixed dtypes."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan import testing as common
from gpuplan.dtypes import HALF_DTYPES, float32
from gpuplan.ops.reduction.launch import (
    COMBINES,
    REDUCE_OPS,
    REDUCTIONS,
    launch_reduce,
    reduce_layout,
)
from gpuplan.ops.reduction.reference import (
    global_l2_norm_reference,
    prod_backward_reference,
    reduce_reference,
    variance_reference,
)
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, f64, random, run_emulated

# (shape, axes, what): the kernels each layout launches for dtype t (h: f16/bf16; acc: f32
# for halves, t otherwise).
SHAPES = [
    ((5, 33), 1, "rows, a warp per row: reduce_rows<t, t, op, 32>"),
    ((3, 2000), -1, "rows, a block per row: reduce_rows<t, t, op, 256>"),
    ((2, 70001), 1, "split rows: reduce_rows<t, acc, op, 256> then <acc, t, op, 32>"),
    ((4, 7, 9), 1, "cols: reduce_cols<t, t, op>"),
    ((1100, 3), 0, "split cols: reduce_cols<t, acc, op> then <acc, t, op>"),
    ((3, 4, 5, 6), (0, 2), "general: reduce_general<t, t, op>"),
    ((50, 3), 1, "short rows (a thread per row): reduce_cols<t, t, op>"),
    ((7,), None, "one row: reduce_rows<t, t, op, 32>"),
    ((6, 5, 4), (0, 1, 2), "all axes: reduce_rows<t, t, op, 32>"),
    ((5, 1, 6), (1,), "a size-1 reduced axis: reduce_cols<t, t, op>, one row each"),
    ((2, 3, 4, 5), (1, 3), "general: reduce_general<t, t, op>"),
]


def _n_red(shape, axes) -> int:
    nd = len(shape)
    ax = range(nd) if axes is None else ((axes,) if isinstance(axes, int) else axes)
    return int(np.prod([shape[a % nd] for a in ax]))


def _compare(y, ref: np.ndarray, op: str, dtype, n_red: int, what: str) -> None:
    if op in ("max", "min"):  # exact for representable values (then rounded to y's type)
        np.testing.assert_array_equal(f64(y), ref.astype(y.dtype).astype(np.float64),
                                      err_msg=f"{what} [{dtype_id(dtype)}]")
    elif op == "prod":  # one rounding per factor: the error grows like the count
        check(y, ref, dtype, what, scale=max(1.0, n_red))
    else:  # the tests' scale: the error of a sum grows like sqrt(count)
        check(y, ref, dtype, what, scale=max(1.0, np.sqrt(n_red)))


def reduce_case(dtype, shape, axes, what: str) -> None:
    x = random(shape, dtype, seed=len(shape))
    n_red = _n_red(shape, axes)
    keepdims = len(shape) % 2 == 1
    for op in REDUCE_OPS:
        desc = gp.ReduceDescriptor(op, shape, axes, keepdims, dtype)
        y = emu(np.full(desc.out_shape(), 5, dtype))
        run_emulated(gp.ReducePlan, desc, gp.ReduceArgs(emu(x), y))
        ref = reduce_reference(op, x, axes, keepdims)
        _compare(y, ref, op, dtype, n_red, f"reduce {op} {shape} axes={axes} ({what})")


def binary_backward_case(dtype, op: str, a_shape, b_shape, what: str) -> None:
    """db of mul/div sums f32 per-element terms (workspace) into a half db: the reduction
    kernels' <float, half> instances that ReducePlan never launches without a split."""
    out = np.broadcast_shapes(a_shape, b_shape)
    a = random(a_shape, dtype, seed=1)
    b = random(b_shape, dtype, seed=2, low=0.5, high=1.5)
    dc = random(out, dtype, seed=3)
    da = emu(np.full(a_shape, 7, dtype))
    db = emu(np.full(b_shape, 7, dtype))
    run_emulated(gp.BinaryBackwardPlan, gp.BinaryBackwardDescriptor(op, a_shape, b_shape, dtype),
                 gp.BinaryBackwardArgs(emu(a), emu(b), emu(dc), da, db))
    # mul's terms, summed over b's broadcast dims by reduce_reference (the binary family's
    # reference would make a cycle: binary's plans import this family's launch code).
    assert op == "mul" and np.broadcast_shapes(a_shape, out) == a_shape, (op, a_shape)
    rda = f64(dc) * f64(b)
    pad = (1,) * (len(out) - len(b_shape)) + tuple(b_shape)
    axes = tuple(k for k in range(len(out)) if pad[k] == 1 and out[k] != 1)
    rdb = reduce_reference("sum", f64(dc) * f64(a), axes, keepdims=True).reshape(b_shape)
    n_red = int(np.prod(out)) // int(np.prod(b_shape))
    check(da, rda, dtype, f"binary_backward {op} da ({what})", scale=4.0)
    check(db, rdb, dtype, f"binary_backward {op} db ({what})", scale=max(4.0, np.sqrt(n_red)))


def huge_row_max_case(dtype) -> None:
    """A row longer than 1024 segments of 16384: the second pass reduces more than 1024
    partials per row, a block per row: reduce_rows<float, h, 1, 256> (max only; sums with
    an f32 partial into a half output come from binary_backward_case)."""
    n = 1024 * 16384 + 1000
    x = random((1, n), dtype, seed=7, low=-1.0, high=0.5)
    x[0, n - 3] = 0.75  # the maximum, in the last segment
    desc = gp.ReduceDescriptor("max", (1, n), 1, False, dtype)
    y = emu(np.full((1,), 5, dtype))
    run_emulated(gp.ReducePlan, desc, gp.ReduceArgs(emu(x), y))
    ref = reduce_reference("max", x, 1)
    assert ref[0] == 0.75
    _compare(y, ref, "max", dtype, n, f"reduce max (1, {n})")


def mixed_launch_case(half, tin, tout, shape, axes, what: str) -> None:
    """launch_reduce (the plans' launch code) with input and output of different types, for
    the instances no plan launches: reduce_rows<h, float, op, 32> and reduce_general<h, float,
    op> (a half input with an f32 output only occurs in the first pass of a split, which is
    never a warp-per-row or a general layout) and reduce_general<float, h, 1> (binary_backward
    only sums). <float, h, 0> general also runs in binary_backward_case."""
    stream = common.stream()
    lay = reduce_layout(shape, frozenset(a % len(shape) for a in axes))
    assert lay.split == 1, lay
    x = random(shape, tin, seed=5)
    n_red = _n_red(shape, axes)
    out_shape = tuple(e for i, e in enumerate(shape) if i not in set(axes))
    for red in REDUCTIONS:
        y = emu(np.full(out_shape, 5, tout))
        launch_reduce(stream, lay, COMBINES.index(red.combine), emu(x), y,
                      float(n_red) if red.mean else 1.0, gp.Workspace.none())
        stream.synchronize()
        ref = reduce_reference(red.name, x, axes)
        # Results are rounded to tout; with a half input the f32 sum is of rounded halves.
        _compare(y, ref, red.name, tout if tout == half else float32, n_red,
                 f"launch_reduce {red.name} {shape} axes={axes} {dtype_id(tin)}->"
                 f"{dtype_id(tout)} ({what})")


def global_norm_case(with_f64: bool) -> None:
    dts = [np.float32, gp.bfloat16, np.float16, np.float64 if with_f64 else np.float32]
    shapes = [(20000,), (7, 13), (0,), (17000, 2)]  # several 16384-element chunks, an empty one
    arrays = [random(s, t, seed=i) for i, (s, t) in enumerate(zip(shapes, dts, strict=True))]
    out_dtype = np.float64 if with_f64 else np.float32
    desc = gp.GlobalNormDescriptor(tuple(a.size for a in arrays),
                                   tuple(np.dtype(a.dtype) for a in arrays))
    out = emu(np.full((), 7, out_dtype))
    plan = run_emulated(gp.GlobalNormPlan, desc,
                        gp.GlobalNormArgs(tuple(emu(a) for a in arrays), out))
    assert plan.sku().dtype == dtype_id(out_dtype), plan.sku()
    check(out, np.float64(global_l2_norm_reference(arrays)), out_dtype, "global_l2_norm",
          scale=10.0)


def variance_case(dtype, std: bool) -> None:
    for shape, axes in (((5, 33), 1), ((4, 7, 9), 1), ((3, 4, 5, 6), (0, 2))):
        x = (random(shape, dtype, seed=4) + 3).astype(dtype)
        desc = gp.VarianceDescriptor(shape, axes, False, 1.0, std, dtype)
        y = emu(np.full(desc.out_shape(), 5, dtype))
        run_emulated(gp.VariancePlan, desc, gp.VarianceArgs(emu(x), y))
        ref = variance_reference(x, axes, False, 1.0, std)
        check(y, ref, dtype, f"variance std={std} {shape} axes={axes}", scale=8)


def prod_backward_case(dtype) -> None:
    view = (3, 6, 2)
    x = random(view, dtype, seed=5, low=0.5, high=1.5)
    x[0, 2, 0] = 0
    x[1, 1, 1] = x[1, 4, 1] = 0
    dy = random((3, 2), dtype, seed=6)
    dx = emu(np.full(view, 5, dtype))
    run_emulated(gp.ProdBackwardPlan, gp.ProdBackwardDescriptor(*view, dtype),
                 gp.ProdBackwardArgs(emu(x), emu(dy), dx))
    ref = prod_backward_reference(x, dy)
    check(dx, ref, dtype, "prod_backward", scale=4)


CASES = (
    [Case(f"reduce {shape} axes={axes} [{dtype_id(t)}]",
          lambda t=t, s=shape, a=axes, w=what: reduce_case(t, s, a, w))
     for t in DTYPES for shape, axes, what in SHAPES]
    + [Case(f"binary_backward mul {a}x{b} [{dtype_id(t)}]",
            lambda t=t, a=a, b=b, w=w: binary_backward_case(t, "mul", a, b, w))
       for t in HALF_DTYPES for a, b, w in (
           ((2, 1100), (2, 1), "rows, a block per row: reduce_rows<float, h, 0, 256>"),
           ((3, 4, 5), (1, 4, 1), "general: reduce_general<float, h, 0>"))]
    + [Case(f"launch_reduce {dtype_id(tin)}->{dtype_id(tout)} {shape} axes={axes}",
            lambda h=h, tin=tin, tout=tout, s=shape, a=axes, w=w:
            mixed_launch_case(h, tin, tout, s, a, w))
       for h in HALF_DTYPES for tin, tout, shape, axes, w in (
           (h, float32, (5, 33), (1,), "reduce_rows<h, float, op, 32>"),
           (h, float32, (3, 4, 5, 6), (0, 2), "reduce_general<h, float, op>"),
           (float32, h, (3, 4, 5, 6), (0, 2), "reduce_general<float, h, op>"),
           (float32, h, (3, 2000), (1,), "reduce_rows<float, h, op, 256> (split rows' "
            "second pass: max only has a huge-row case)"))]
    + [Case(f"reduce max huge row [{dtype_id(h)}]", lambda h=h: huge_row_max_case(h))
       for h in HALF_DTYPES]
    + [Case(f"global_l2_norm mixed{' +f64' if w else ''}", lambda w=w: global_norm_case(w))
       for w in (False, True)]
)
CASES += (
    [Case(f"variance std={s} [{dtype_id(t)}]", lambda t=t, s=s: variance_case(t, s))
     for t in DTYPES for s in (False, True)]
    + [Case(f"prod_backward [{dtype_id(t)}]", lambda t=t: prod_backward_case(t)) for t in DTYPES]
)
