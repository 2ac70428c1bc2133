"""Declared op specs: generated classes, field checks, the derived operand checks, the enum
table options, and the generic plan checker (gpuplan.testing.check_plan) catching broken plans."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.nvrtc import enum_options
from gpuplan.plan import Candidate, host_candidate
from gpuplan.spec import (
    INDEX,
    Choice,
    DType,
    Extent,
    Flag,
    In,
    Index,
    OpSpec,
    Out,
    Real,
    Scalar,
    Shape,
)
from gpuplan.testing import check_plan, random, sweep_bad_inputs
from tests.helpers import DTYPES

SPEC = OpSpec(
    "axpy_test",
    fields=(Extent("rows"), Extent("cols"), Flag("has_bias", default=False),
            DType("dtype", (np.float32, np.float64), default=np.float32)),
    operands=(In("x", ("rows", "cols")), In("idx", ("rows",), dtype=INDEX),
              In("bias", ("cols",), present="has_bias"), Out("y", ("rows", "cols"))),
    scalars=(Scalar("alpha", 1.0),),
)
AxpyDescriptor = SPEC.descriptor("AxpyDescriptor")
AxpyArgs = SPEC.args("AxpyArgs")


class AxpyPlan(gp.Plan):
    """y[r] = alpha * x[idx[r]] (+ bias): a test family with an index operand."""

    op = "axpy_test"
    spec = SPEC
    writes_early = False

    @classmethod
    def _candidates(cls, desc, stream) -> list[Candidate]:
        return [host_candidate(desc.dtype)]

    def _run_numpy(self, stream, ws, args) -> None:
        y = args.alpha * args.x[args.idx]
        args.y[...] = y + args.bias if args.bias is not None else y


def _reference(x, idx, y, alpha, bias=None):
    out = alpha * x[idx.astype(np.int64)]
    return out + bias if bias is not None else out


def test_generated_classes_follow_the_declaration():
    assert [f for f in AxpyDescriptor.__dataclass_fields__] == ["rows", "cols", "has_bias",
                                                                "dtype"]
    d = AxpyDescriptor(2, 3)
    assert d == AxpyDescriptor(2, 3, False, np.float32) and hash(d) == hash(AxpyDescriptor(2, 3))
    with pytest.raises(AttributeError):
        d.rows = 4  # frozen
    a = AxpyArgs(1, 2, None, 3)  # positional calls keep the declared order
    assert (a.x, a.idx, a.bias, a.y, a.alpha) == (1, 2, None, 3, 1.0)
    b = AxpyArgs(1, 2, y=3)  # the optional operand before a required one may be left out
    assert (b.x, b.idx, b.bias, b.y, b.alpha) == (1, 2, None, 3, 1.0)
    with pytest.raises(gp.InvalidProblem, match="AxpyArgs: argument 'y': expected a value"):
        AxpyArgs(1, 2)


@pytest.mark.parametrize("field, value, error, words", [
    ("rows", -1, gp.InvalidProblem, "an extent >= 0"),
    ("rows", 2.5, gp.InvalidProblem, "an int extent"),
    ("has_bias", "yes", gp.InvalidProblem, "a bool"),
    ("dtype", np.float16, gp.Unsupported, "dtype in (f32, f64)"),
])
def test_descriptor_fields_are_checked_at_select(field, value, error, words):
    kw = {"rows": 2, "cols": 3, "has_bias": False, "dtype": np.float32, field: value}
    with pytest.raises(error, match=f"axpy_test: argument '{field}'.*") as info:
        AxpyPlan.select(gp.Stream.host(), AxpyDescriptor(**kw))
    assert words in str(info.value)


def test_other_field_kinds():
    Choice("op", ("a", "b")).check("t", "a")
    with pytest.raises(gp.Unsupported, match="one of"):
        Choice("op", ("a", "b")).check("t", "c")
    Index("padding_idx", default=None).check("t", -3)
    Index("padding_idx", default=None).check("t", None)
    with pytest.raises(gp.InvalidProblem, match="int64 range"):  # kernels take a long long
        Index("index_offset", default=0).check("t", 2**63)
    with pytest.raises(gp.InvalidProblem):
        Shape("shape").check("t", (2, -1))
    with pytest.raises(gp.InvalidProblem, match="finite"):
        Real("eps", default=1e-5).check("t", float("nan"))


def test_wrong_descriptor_type_is_a_clear_error():
    with pytest.raises(gp.InvalidProblem, match="expected a AxpyDescriptor"):
        AxpyPlan.select(gp.Stream.host(), gp.UnaryDescriptor("relu", 3))


@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("index", [np.int32, np.int64])
def test_check_plan_passes_a_correct_plan(has_bias, index):
    x = random((4, 3), np.float64)
    inputs = {"x": x, "idx": np.array([3, 0, 0, 2], index), "alpha": -2.0}
    if has_bias:
        inputs["bias"] = random((3,), np.float64, seed=1)
    plan = check_plan(AxpyPlan, AxpyDescriptor(4, 3, has_bias, np.float64), inputs,
                      _reference)
    assert plan.sku().index_dtype == ("i32" if index == np.int32 else "i64")


def test_sweep_covers_every_operand():
    plan = AxpyPlan.select(gp.Stream.host(), AxpyDescriptor(4, 3, True, np.float64))
    host = {"x": random((4, 3), np.float64), "idx": np.zeros(4, np.int32),
            "bias": np.zeros(3), "y": np.zeros((4, 3))}
    # x, idx, bias, y: None, dtype, short, long, strided each; y read-only; y overlapping x
    assert sweep_bad_inputs(plan, gp.Stream.host(), host, {"alpha": 1.0}, "cpu") == 22


def test_check_plan_catches_a_wrong_result():
    class Wrong(AxpyPlan):
        def _run_numpy(self, stream, ws, args):
            args.y[...] = args.x[args.idx]  # ignores alpha

    with pytest.raises(AssertionError, match="axpy_test: y"):
        check_plan(Wrong, AxpyDescriptor(2, 3, False, np.float64),
                   {"x": random((2, 3), np.float64), "idx": np.array([1, 0], np.int64),
                    "alpha": 3.0}, _reference)


def test_check_plan_catches_a_write_before_validation():
    class Early(AxpyPlan):
        def run(self, stream, ws, args):
            args.y[...] = 0  # corrupts the output of a call it then rejects
            super().run(stream, ws, args)

    with pytest.raises(AssertionError):
        check_plan(Early, AxpyDescriptor(2, 3, False, np.float64),
                   {"x": random((2, 3), np.float64), "idx": np.array([1, 0], np.int64)},
                   _reference)


def test_enum_options_come_from_the_table():
    assert enum_options({"Act": ("relu", "gelu_tanh")}) == ("-DGPUPLAN_ENUM_Act=RELU=0,"
                                                           "GELU_TANH=1",)
    with pytest.raises(ValueError):
        enum_options({"Act": ("not-an-identifier",)})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backward", [False, True])
def test_every_activation_through_check_plan(device, dtype, backward):
    from gpuplan.ops.activation.plans import ACTIVATIONS
    from gpuplan.ops.activation.reference import unary_derivative_reference as ref_derivative
    from gpuplan.ops.activation.reference import unary_reference as ref_unary
    for act in ACTIVATIONS:
        alpha = -1.5 if act.alpha else None
        x = random((37,), dtype, low=-3, high=3)
        desc = gp.UnaryDescriptor(act.name, 37, dtype)
        if backward:
            check_plan(gp.UnaryBackwardPlan, desc,
                       {"x": x, "dy": random((37,), dtype, seed=1), "alpha": alpha},
                       lambda x, dy, dx, alpha, beta, n=act.name:
                       dy * ref_derivative(n, x, alpha, beta),
                       device=device, scale=4)
        else:
            check_plan(gp.UnaryPlan, desc, {"x": x, "alpha": alpha},
                       lambda x, y, alpha, beta, n=act.name: ref_unary(n, x, alpha, beta),
                       device=device, scale=4)


def test_bounds_are_declared():
    Real("p", lo=0.0, hi=1.0).check("t", 0.5)
    with pytest.raises(gp.InvalidProblem, match=r"t: argument 'p': expected a number in "
                                                r"\[0.0, 1.0\], given 1.5"):
        Real("p", lo=0.0, hi=1.0).check("t", 1.5)
    with pytest.raises(gp.InvalidProblem, match="a number >= 0.0"):
        Real("eps", lo=0.0).check("t", -1e-9)
    with pytest.raises(gp.InvalidProblem, match="an extent >= 1, given 0"):
        Extent("vocab", min=1).check("t", 0)
    with pytest.raises(gp.Unsupported, match="an extent <= 8, given 9"):
        Extent("dims", max=8).check("t", 9)
    with pytest.raises(gp.InvalidProblem, match="a tuple of extents"):
        Shape("shape").check("t", [2, 3])  # a list would not hash as a cache key


def test_dropout_and_cross_entropy_bounds_come_from_their_declarations():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="dropout: argument 'p'"):
        gp.DropoutPlan.select(s, gp.DropoutDescriptor(4, 1.5))
    with pytest.raises(gp.InvalidProblem, match="cross_entropy: argument 'label_smoothing'"):
        gp.CrossEntropyPlan.select(s, gp.CrossEntropyDescriptor(2, 3, label_smoothing=-0.1))
    with pytest.raises(gp.InvalidProblem, match="cross_entropy: argument 'vocab'"):
        gp.CrossEntropyPlan.select(s, gp.CrossEntropyDescriptor(2, 0))


def test_call_with_a_misspelled_or_missing_argument_is_a_plan_error():
    from gpuplan.execute import call
    x = np.ones(4, np.float32)
    with pytest.raises(gp.InvalidProblem, match=r"unary: argument 'args'.*unknown \['xx'\]"):
        call(gp.UnaryPlan, gp.UnaryDescriptor("relu", 4), like=x, xx=x)
    with pytest.raises(gp.InvalidProblem, match=r"dropout: argument 'args'.*no \['seed'\]"):
        call(gp.DropoutPlan, gp.DropoutDescriptor(4, 0.5), like=x, x=x)
