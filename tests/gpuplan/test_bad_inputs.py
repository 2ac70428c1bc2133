"""Issue 11's observed bad inputs, each a regression test: descriptor fields of the wrong
type, non-array objects given to the functional wrappers, NaN scalars (rejected alike by
every family that takes a scale), transposed shapes of the same size, float indices and
mis-shaped targets. Each is a GpuPlanError naming the op and the argument."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuplan as gp

F = gp.functional
NAN = math.nan


def _x(*shape):
    return np.ones(shape or (3, 4), np.float32)


@pytest.mark.parametrize("field,value,words", [
    ("num_embeddings", None, "an int extent, given None"),
    ("num_embeddings", 2.5, "an int extent, given 2.5"),
    ("embedding_dim", True, "given True"),
    ("dtype", "float33", "given 'float33'"),
    ("dtype", None, "given None"),  # was silently float64 (np.dtype(None))
])
def test_descriptor_fields_of_the_wrong_type(field, value, words):
    kw = dict(num_embeddings=5, embedding_dim=4, num_indices=3, dtype=np.float32) | {
        field: value}
    with pytest.raises(gp.GpuPlanError, match=f"embedding: argument '{field}'") as err:
        gp.EmbeddingPlan.select(gp.Stream.host(), gp.EmbeddingDescriptor(**kw))
    assert words in str(err.value)


@pytest.mark.parametrize("bad", [[[1.0, 2.0]], {"a": 1}, None, 3.0],
                         ids=["list", "dict", "None", "float"])
@pytest.mark.parametrize("op,call", [
    ("unary", lambda b: F.unary("relu", b)),
    ("binary", lambda b: F.binary("add", b, _x())),
    ("reduce", lambda b: F.reduce("sum", b)),
    ("softmax", lambda b: F.softmax(b)),
    ("global_l2_norm", lambda b: F.global_l2_norm([b])),
    ("clip_grad_norm", lambda b: F.clip_grad_norm_([b], 1.0)),
])
def test_non_array_objects_are_named_errors(op, call, bad):
    with pytest.raises(gp.GpuPlanError, match=f"^{op}_?: argument '"):
        call(bad)


@pytest.mark.parametrize("op,call", [
    ("unary", lambda v: F.unary("scale", _x(), alpha=v)),
    ("gemm", lambda v: F.matmul(_x(), _x(4, 2), alpha=v)),
    ("softmax", lambda v: F.softmax(_x(), scale=v)),
    ("attention", lambda v: F.attention(_x(1, 2, 4), _x(1, 2, 4), _x(1, 2, 4), scale=v)),
    ("layer_norm", lambda v: F.layer_norm(_x(), None, None, eps=v)),
    ("dropout", lambda v: F.dropout(_x(), v, 1)),
    ("clip_grad_norm", lambda v: F.clip_grad_norm_([_x()], v)),
])
def test_a_nan_scalar_is_rejected_by_every_family(op, call):
    with pytest.raises(gp.InvalidProblem, match=f"^{op}: argument '.*nan"):
        call(NAN)


def test_transposed_shapes_of_the_same_size_are_rejected():
    x, dy = _x(3, 4), _x(4, 3)
    with pytest.raises(gp.InvalidProblem, match=r"unary_backward: argument 'dy'.*\(3, 4\)"):
        F.unary_backward("gelu", x, dy)
    with pytest.raises(gp.InvalidProblem, match=r"softmax_backward: argument 'dy'.*\(4, 3\)"):
        F.softmax_backward(x, dy)


def test_float_indices_and_mis_shaped_targets_are_not_coerced():
    with pytest.raises(gp.Unsupported, match="embedding: argument 'indices'.*f64"):
        F.embedding(_x(5, 4), np.array([0.0, 1.0]))
    with pytest.raises(gp.Unsupported, match="cross_entropy: argument 'target'.*f64"):
        F.cross_entropy(_x(), np.array([0.0, 1.0, 2.0]))
    for shape in ((3, 1), (1, 3), (4,)):
        with pytest.raises(gp.InvalidProblem,
                           match=rf"cross_entropy: argument 'target'.*\(3,\).*{shape[0]}"):
            F.cross_entropy(_x(), np.zeros(shape, np.int64))
