"""gather.cu on the emulated device against float64 NumPy: gather and index_select (each
index dtype) and the sorted, deterministic scatter_add and index_add."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, f64, random, run_emulated
from gpuplan.testing import run_reference as reference

VIEW = (3, 5, 4, 7)  # outer, length, inner, n


def _index(shared: bool, index_dtype, seed: int) -> np.ndarray:
    o, n_len, i, n = VIEW
    shape = (n,) if shared else (o, n, i)
    return np.random.default_rng(seed).integers(0, n_len, shape).astype(index_dtype)


def gather_case(dtype, index_dtype, shared: bool) -> None:
    o, n_len, i, n = VIEW
    x = random((o, n_len, i), dtype, seed=1)
    index = _index(shared, index_dtype, 2)
    out = emu(np.full((o, n, i), 5, dtype))
    run_emulated(gp.GatherPlan, gp.GatherDescriptor(o, n_len, i, n, shared, dtype),
                 gp.GatherArgs(emu(x), emu(index), out))
    ref = np.zeros((o, n, i))
    reference(gp.GatherPlan, gp.GatherDescriptor(o, n_len, i, n, shared, np.float64),
              gp.GatherArgs(f64(x), index, ref))
    np.testing.assert_array_equal(f64(out), ref, err_msg=f"gather shared={shared}")


def scatter_case(dtype, shared: bool) -> None:
    o, n_len, i, n = VIEW
    base = random((o, n_len, i), dtype, seed=3)
    src = random((o, n, i), dtype, seed=4)
    index = _index(shared, np.int64, 5)
    out = emu(base.copy())
    run_emulated(gp.ScatterAddPlan, gp.ScatterAddDescriptor(o, n_len, i, n, shared, dtype),
                 gp.ScatterAddArgs(emu(index), emu(src), out))
    ref = f64(base)
    reference(gp.ScatterAddPlan, gp.ScatterAddDescriptor(o, n_len, i, n, shared, np.float64),
              gp.ScatterAddArgs(index, f64(src), ref))
    check(out, ref, dtype, f"scatter_add shared={shared}", scale=4)


CASES = (
    [Case(f"gather {dtype_id(ix)} shared={s} [{dtype_id(t)}]",
          lambda t=t, ix=ix, s=s: gather_case(t, ix, s))
     for t in DTYPES for ix in (np.int32, np.int64) for s in (False, True)]
    + [Case(f"scatter_add shared={s} [{dtype_id(t)}]", lambda t=t, s=s: scatter_case(t, s))
       for t in DTYPES for s in (False, True)]
)
