"""gather.cu on the emulated device against the family's float64 reference
(gpuplan.ops.gather.reference): gather and index_select (each index dtype, exact) and the
sorted, deterministic scatter_add and index_add."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.gather.reference import (
    gather_reference,
    index_add_reference,
    index_select_reference,
    scatter_add_reference,
)
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, f64, random, run_emulated

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
    ref = (index_select_reference if shared else gather_reference)(x, 1, index)
    np.testing.assert_array_equal(f64(out), ref, err_msg=f"gather shared={shared}")


def scatter_case(dtype, shared: bool) -> None:
    o, n_len, i, n = VIEW
    base = random((o, n_len, i), dtype, seed=3)
    src = random((o, n, i), dtype, seed=4)
    index = _index(shared, np.int64, 5)
    out = emu(base.copy())
    run_emulated(gp.ScatterAddPlan, gp.ScatterAddDescriptor(o, n_len, i, n, shared, dtype),
                 gp.ScatterAddArgs(emu(index), emu(src), out))
    ref = (index_add_reference if shared else scatter_add_reference)(base, 1, index, src)
    check(out, ref, dtype, f"scatter_add shared={shared}", scale=4)


CASES = (
    [Case(f"gather {dtype_id(ix)} shared={s} [{dtype_id(t)}]",
          lambda t=t, ix=ix, s=s: gather_case(t, ix, s))
     for t in DTYPES for ix in (np.int32, np.int64) for s in (False, True)]
    + [Case(f"scatter_add shared={s} [{dtype_id(t)}]", lambda t=t, s=s: scatter_case(t, s))
       for t in DTYPES for s in (False, True)]
)
