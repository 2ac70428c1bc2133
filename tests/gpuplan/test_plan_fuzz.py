"""The plan-layer fuzz classes of issue 31: optional operands are optional in every generated
Args (positional calls keep their meaning, a required argument left out is a GpuPlanError
naming it), an extent too large for int64 arithmetic is Unsupported naming its field (not
Python's OverflowError), and an object with `shape` and `dtype` that is no array is an
InvalidProblem naming the operand (not an AttributeError from inside)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import gpuplan as gp

ARGS = sorted(n for n in dir(gp) if n.endswith("Args") and dataclasses.is_dataclass(
    getattr(gp, n)))


@pytest.mark.parametrize("name", ARGS)
def test_every_args_class_takes_its_required_arguments_alone(name):
    cls = getattr(gp, name)
    fields = dataclasses.fields(cls)
    required = [f.name for f in fields if f.default is dataclasses.MISSING
                or repr(f.default) == "<not given>"]
    optional_none = [f.name for f in fields if f.default is None]
    made = cls(**{n: object() for n in required})  # optional operands left out
    for n in optional_none:
        assert getattr(made, n) is None, (name, n)
    # Positional calls keep the declared order.
    values = [object() for _ in fields]
    positional = cls(*values)
    assert [getattr(positional, f.name) for f in fields] == values
    # A required argument left out is named.
    for n in required:
        kw = {m: object() for m in required if m != n}
        with pytest.raises((gp.InvalidProblem, TypeError)) as exc:
            cls(**kw)
        assert n in str(exc.value), (name, n)


def test_adamw_and_sgd_args_need_no_param_lowp():
    z = np.zeros(4, np.float32)
    a = gp.AdamWArgs(z, z, z, z, lr=0.1, step=1)
    assert a.param_lowp is None and a.lr == 0.1
    s = gp.SGDArgs(z, z, lr=0.1)
    assert s.param_lowp is None and s.momentum_buf is None
    with pytest.raises(gp.InvalidProblem, match="AdamWArgs: argument 'lr': expected a value"):
        gp.AdamWArgs(z, z, z, z, step=1)
    plan = gp.AdamWPlan.select(gp.Stream.host(), gp.AdamWDescriptor(4))
    p, g = np.ones(4, np.float32), np.full(4, 0.5, np.float32)
    plan.run(gp.Stream.host(), None, gp.AdamWArgs(p, g, z.copy(), z.copy(), lr=0.1, step=1))
    assert np.all(p < 1.0)


@pytest.mark.parametrize("make", [
    lambda: gp.SoftmaxPlan.select(gp.Stream.host(), gp.SoftmaxDescriptor(2**70, 4)),
    lambda: gp.UnaryPlan.select(gp.Stream.host(), gp.UnaryDescriptor("relu", 2**63)),
    lambda: gp.CastPlan.select(gp.Stream.host(), gp.CastDescriptor(2**64, np.float32,
                                                                    np.float16)),
    lambda: gp.AdamWPlan.select(gp.Stream.host(), gp.AdamWDescriptor(2**90)),
], ids=["softmax", "unary", "cast", "adamw"])
def test_an_extent_beyond_int64_arithmetic_is_unsupported(make):
    with pytest.raises(gp.Unsupported, match=r"expected an extent <= 2\*\*62"):
        make()


class _LooksLikeAnArray:
    """shape, dtype, ndim and size, but no buffer: not an array."""

    shape, dtype, ndim, size = (3,), np.dtype(np.float32), 1, 3


@pytest.mark.parametrize("call", [
    lambda a, z: gp.functional.unary("relu", a),
    lambda a, z: gp.functional.binary("add", a, z),
    lambda a, z: gp.execute(gp.UnaryPlan, gp.UnaryDescriptor("relu", 3, np.float32),
                            gp.UnaryArgs(a, z.copy()), like=z),
    lambda a, z: gp.execute(gp.UnaryPlan, gp.UnaryDescriptor("relu", 3, np.float32),
                            gp.UnaryArgs(z, a), like=z),
], ids=["unary", "binary", "execute-input", "execute-output"])
def test_an_object_that_is_no_array_is_named(call):
    z = np.zeros(3, np.float32)
    with pytest.raises(gp.GpuPlanError, match="_LooksLikeAnArray|an array|dtype"):
        call(_LooksLikeAnArray(), z)


@pytest.mark.parametrize("a, b, bias, word", [
    (np.ones((2, 2), np.int32), np.ones((2, 2), np.int32), None,
     "matmul: argument 'a': expected dtype f32 or f64 or f16 or bf16, given i32"),
    (np.ones((2, 2), np.float32), np.ones((2, 2), np.float64), None,
     "matmul: argument 'b': expected dtype f32 like 'a', given f64"),
    (np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), np.ones(2, np.float16),
     "matmul: argument 'bias': expected dtype f32 like 'a', given f16"),
], ids=["int", "mixed", "bias"])
def test_matmul_dtype_errors_name_matmul(a, b, bias, word):
    with pytest.raises(gp.Unsupported) as exc:
        gp.functional.matmul(a, b, bias=bias)
    assert str(exc.value) == word


def test_a_negative_extent_is_named_not_numpys_message():
    with pytest.raises(gp.InvalidProblem, match=r"dropout_mask: argument 'shape': expected "
                                                r"extents >= 0, given \(-3,\)"):
        gp.functional.dropout_mask((-3,), 0.5, seed=1)
    with pytest.raises(gp.InvalidProblem, match="expected an extent >= 0, given -3"):
        gp.SoftmaxPlan.select(gp.Stream.host(), gp.SoftmaxDescriptor(-3, 4))
