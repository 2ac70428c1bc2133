"""Select kernels on the emulated device (where with broadcasting, tril and triu, every
dtype the family has) against the family's reference (gpuplan.ops.select.reference): exact,
values are copied.

Shapes are small and odd; the where cases cover same-shape (one collapsed dim), a 0-d fill
value (masked_fill) and three-way broadcasting.
"""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.ops.select.plans import SELECT_DTYPES
from gpuplan.ops.select.reference import triangle_reference, where_reference
from gpuplan.testing import Case, dtype_id, emu, host, random, run_emulated

_WHERE = (((37,), (37,), (37,)), ((5, 1), (), (3, 5, 4)), ((2, 3, 1), (4,), (3, 1)))


def _values(shape, dtype, seed):
    d = np.dtype(dtype)
    if d == np.bool_:
        return random(shape, np.float32, seed=seed) > 0
    if d.kind == "i":
        return (random(shape, np.float64, seed=seed) * 1000).astype(d)
    return random(shape, d, seed=seed)


def where(dtype, cs: tuple, as_: tuple, bs: tuple) -> None:
    cond = random(cs, np.float32, seed=1) > 0
    a, b = _values(as_, dtype, 2), _values(bs, dtype, 3)
    desc = gp.WhereDescriptor(cs, as_, bs, dtype)
    out = emu(np.zeros(desc.out_shape(), dtype))
    run_emulated(gp.WherePlan, desc, gp.WhereArgs(emu(cond), emu(a), emu(b), out))
    ref = where_reference(cond, a, b)
    np.testing.assert_array_equal(host(out), ref, err_msg=f"where {cs} {as_} {bs}")


def triangle(dtype, part: str, shape: tuple, k: int) -> None:
    x = _values(shape, dtype, 4)
    y = emu(np.ones(shape, dtype))
    desc = gp.TriangleDescriptor(part, *shape, k, dtype)
    run_emulated(gp.TrianglePlan, desc, gp.TriangleArgs(emu(x), y))
    ref = triangle_reference(part, x, k)
    np.testing.assert_array_equal(host(y), ref, err_msg=f"triangle {part} {shape} {k}")


CASES = (
    [Case(f"where {cs}x{as_}x{bs}[{dtype_id(t)}]",
          lambda t=t, cs=cs, as_=as_, bs=bs: where(t, cs, as_, bs))
     for t in SELECT_DTYPES for cs, as_, bs in _WHERE]
    + [Case(f"triangle {part} k={k}[{dtype_id(t)}]",
            lambda t=t, part=part, k=k: triangle(t, part, (3, 5, 7), k))
       for t in SELECT_DTYPES for part in ("lower", "upper") for k in (0, -2, 3)]
)
