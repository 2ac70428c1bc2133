"""The generated host call of a plan (Plan._host_call, tried first by execute.call and by
binary's own cache): operands it takes as they are give what the general path gives;
anything else falls through to the general path, which says what is wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.execute import call, clear_plan_cache, host_call, interned
from gpuplan.ops.binary import BinaryDescriptor, BinaryPlan, binary
from gpuplan.ops.binary import plans as binary_plans
from gpuplan.plan import MISS, Candidate
from gpuplan.spec import DType, Extent, In, OpSpec, Out, Scalar

# -- a test-only family: s = x + alpha * w, p = x * w (two outputs, a scalar with a default) --

AXPY = OpSpec(
    "axpy_test",
    fields=(Extent("n"), DType("dtype", (np.float32, np.float64), default=np.float32)),
    operands=(In("x", ("n",)), In("w", ("n",)), Out("s", ("n",)), Out("p", ("n",))),
    scalars=(Scalar("alpha", 1.0),),
)
AxpyDescriptor = AXPY.descriptor("AxpyDescriptor")
AxpyArgs = AXPY.args("AxpyArgs")


class AxpyPlan(gp.Plan):
    op = "axpy_test"
    category = "test"
    spec = AXPY
    runs = 0

    @classmethod
    def _candidates(cls, desc: Any, stream: gp.Stream) -> list[Candidate]:
        return [Candidate("plain", gp.BackendKind.NUMPY, True, True, "f32", "f32")]

    def _run_plain(self, stream: gp.Stream, ws: gp.Workspace, args: Any) -> None:
        type(self).runs += 1
        np.add(args.x, args.alpha * args.w, out=args.s)
        np.multiply(args.x, args.w, out=args.p)


def _operands(n=5, dtype=np.float32):
    return np.arange(n, dtype=dtype), np.full(n, 2, dtype)


def test_a_host_call_allocates_runs_and_returns_the_outputs():
    x, w = _operands()
    desc = AxpyDescriptor(5)
    s, p = call(AxpyPlan, desc, like=x, x=x, w=w)
    np.testing.assert_array_equal(s, x + w)
    np.testing.assert_array_equal(p, x * w)
    by_position = host_call(AxpyPlan, desc)
    s2, p2 = by_position(x, w)
    np.testing.assert_array_equal(s2, s)
    assert s2 is not s and p2.flags.c_contiguous and p2.flags.writeable


def test_operands_it_does_not_take_fall_through_to_the_general_path():
    x, w = _operands()
    desc = AxpyDescriptor(5)
    fast = host_call(AxpyPlan, desc)
    strided = np.arange(10, dtype=np.float32)[::2]
    read_only = w.copy()
    read_only.flags.writeable = False
    assert fast(strided, w) is MISS
    assert fast(x, read_only) is MISS  # (the general path accepts a read-only input)
    assert fast(x, w.astype(np.float64)) is MISS
    s, _ = call(AxpyPlan, desc, like=x, x=x, w=read_only)
    np.testing.assert_array_equal(s, x + 2)
    s, _ = call(AxpyPlan, desc, like=x, x=x, w=w, alpha=3.0)  # a scalar given: general path
    np.testing.assert_array_equal(s, x + 6)
    out = np.zeros(5, np.float32)
    s, _ = call(AxpyPlan, desc, like=x, x=x, w=w, s=out)  # an output given: written
    assert s is out
    np.testing.assert_array_equal(out, x + w)


@pytest.mark.parametrize("operands, error, words", [
    ({"x": np.arange(5, dtype=np.float64)}, gp.Unsupported, ("axpy_test", "'x'", "f64")),
    ({"x": np.arange(4, dtype=np.float32)}, gp.BufferTooSmall, ("axpy_test", "'x'")),
    ({"x": np.arange(6, dtype=np.float32)}, gp.InvalidProblem, ("'x'", "shape (5,)")),
    ({"x": None}, gp.InvalidProblem, ("'x'", "an array", "None")),
    ({"v": np.arange(5, dtype=np.float32)}, gp.InvalidProblem, ("unknown ['v']",)),
])
def test_wrong_operands_get_the_general_paths_error(operands, error, words):
    x, w = _operands()
    with pytest.raises(error) as info:
        call(AxpyPlan, AxpyDescriptor(5), like=x, **{"x": x, "w": w, **operands})
    for word in words:
        assert word in str(info.value)


def test_binary_takes_its_cache_and_falls_through_when_it_must():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.full((3, 4), 0.5, np.float32)
    np.testing.assert_array_equal(binary("mul", a, b), a * b)
    np.testing.assert_array_equal(binary("mul", a, b), a * b)  # the cached host call
    np.testing.assert_array_equal(binary("mul", a.T.copy().T, b), a * b)  # F-order: general
    np.testing.assert_array_equal(binary("add", a, b[0]), a + b[0])  # broadcast: no producer
    scalar = binary("add", np.float32(2) * np.ones((), np.float32), np.ones((), np.float32))
    assert type(scalar) is np.ndarray and scalar.shape == () and scalar == 3
    with pytest.raises(gp.Unsupported, match="'b'"):
        binary("mul", a, b.astype(np.float64))
    with pytest.raises(gp.Unsupported, match="bitwise_and"):
        binary("bitwise_and", a, b)


def test_binary_remembers_a_plan_without_host_call_once():
    clear_plan_cache()
    e = np.ones((0, 3), np.float32)
    assert binary("add", e, e).shape == (0, 3)
    assert binary_plans._HOST[("add", (0, 3), (0, 3), e.dtype)] is None
    assert binary("add", e, e).shape == (0, 3)


def test_clearing_the_plan_cache_empties_the_host_call_caches():
    a = np.ones((2, 3), np.float32)
    binary("sub", a, a)
    assert ("sub", (2, 3), (2, 3), a.dtype) in binary_plans._HOST
    clear_plan_cache()
    assert not binary_plans._HOST


def test_no_host_call_where_the_plan_needs_more_or_off_the_host():
    desc = interned(BinaryDescriptor, "add", (4,), (4,), np.dtype(np.float32))
    assert host_call(BinaryPlan, desc) is not None
    empty = interned(BinaryDescriptor, "add", (0,), (0,), np.dtype(np.float32))
    assert host_call(BinaryPlan, empty) is None  # an empty problem runs nothing
    assert BinaryPlan.select(gp.Stream.emulated(), desc)._host_call is None


def test_a_replaced_host_body_runs_instead_of_the_producer(monkeypatch):
    calls = []

    def spy(plan, stream, ws, args):
        calls.append(args)
        args.c[...] = 7

    monkeypatch.setattr(BinaryPlan, "_run_numpy", spy)
    clear_plan_cache()
    a = np.ones((2, 2), np.float32)
    try:
        c = binary("add", a, a)
    finally:
        clear_plan_cache()
    assert len(calls) == 1
    np.testing.assert_array_equal(c, np.full((2, 2), 7, np.float32))
