"""Issue 11's observed bad inputs, each a regression test: descriptor fields of the wrong
type, non-array objects given to the functional wrappers, NaN scalars (rejected alike by
every family that takes a scale), transposed shapes of the same size, float indices and
mis-shaped targets. Each is a GpuPlanError naming the op and the argument."""

from __future__ import annotations

import inspect
import math
import re

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


# -- the sweep: every public function, every array argument mis-shaped ------------------------

def _a(*shape):
    return (np.arange(math.prod(shape)).reshape(shape) % 7 / 7 + 0.5).astype(np.float32)


def _i(*shape):
    return (np.arange(math.prod(shape)).reshape(shape) % 3).astype(np.int64)


_ADAMW = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=1)
_ST = dict(vocab_start=0, vocab_total=5)
#: function[:variant] -> (the array arguments of a valid call, its other arguments).
VALID = {
    "embedding": (lambda: dict(weight=_a(5, 4), indices=_i(3)), {}),
    "embedding_backward": (lambda: dict(dout=_a(3, 4), indices=_i(3)), dict(num_embeddings=5)),
    "quantize_per_token": (lambda: dict(x=_a(3, 4)), {}),
    "quantize_per_token_backward": (lambda: dict(d_q=_a(3, 4)), {}),
    "dequantize_per_token": (lambda: dict(q=_i(3, 4).astype(np.int8), scale=_a(3)),
                             dict(dtype=np.float32)),
    "dequantize_per_token_backward": (lambda: dict(scale=_a(3), d_output=_a(3, 4)), {}),
    "matmul": (lambda: dict(a=_a(3, 4), b=_a(4, 2), bias=_a(2)), {}),
    "unary": (lambda: dict(x=_a(3, 4)), dict(name="relu")),
    "unary_backward": (lambda: dict(x=_a(3, 4), dy=_a(3, 4)), dict(name="gelu")),
    "binary": (lambda: dict(a=_a(3, 4), b=_a(3, 4)), dict(name="add")),
    "binary_backward": (lambda: dict(a=_a(3, 4), b=_a(3, 4), dc=_a(3, 4)), dict(name="mul")),
    "bias_add": (lambda: dict(x=_a(3, 4), bias=_a(4)), {}),
    "where": (lambda: dict(cond=_a(3, 4) > 0.7, a=_a(3, 4), b=_a(3, 4)), {}),
    "triangle": (lambda: dict(x=_a(3, 4)), dict(part="lower")),
    "cast": (lambda: dict(x=_a(3, 4)), dict(dtype=np.float64)),
    "reduce": (lambda: dict(x=_a(3, 4)), dict(name="sum")),
    "global_l2_norm": (lambda: dict(arrays=[_a(3, 4), _a(2)]), {}),
    "arg_select": (lambda: dict(x=_a(3, 4)), dict(op="max", dim=1)),
    "topk": (lambda: dict(x=_a(3, 4)), dict(k=2)),
    "variance": (lambda: dict(x=_a(3, 4)), {}),
    "prod_backward": (lambda: dict(x=_a(3, 4), dy=_a(3)), dict(dim=1)),
    "gather": (lambda: dict(x=_a(3, 4), index=_i(3, 2)), dict(dim=1)),
    "scatter_add": (lambda: dict(x=_a(3, 4), index=_i(3, 2), src=_a(3, 2)), dict(dim=1)),
    "index_select": (lambda: dict(x=_a(3, 4), index=_i(2)), dict(dim=1)),
    "index_add": (lambda: dict(x=_a(3, 4), index=_i(2), src=_a(3, 2)), dict(dim=1)),
    "clip_grad_norm_": (lambda: dict(arrays=[_a(3, 4)]), dict(max_norm=1.0)),
    "layer_norm": (lambda: dict(x=_a(3, 4), weight=_a(4), bias=_a(4)), {}),
    "layer_norm_backward": (lambda: dict(dy=_a(3, 4), x=_a(3, 4), weight=_a(4), mean=_a(3),
                                         rstd=_a(3)), {}),
    "rms_norm": (lambda: dict(x=_a(3, 4), weight=_a(4)), {}),
    "rms_norm_backward": (lambda: dict(dy=_a(3, 4), x=_a(3, 4), weight=_a(4), rstd=_a(3)), {}),
    "residual_layer_norm": (lambda: dict(x=_a(3, 4), residual=_a(3, 4), weight=_a(4),
                                         bias=_a(4)), {}),
    "residual_layer_norm_backward": (lambda: dict(dy=_a(3, 4), s=_a(3, 4), weight=_a(4),
                                                  mean=_a(3), rstd=_a(3), ds=_a(3, 4)), {}),
    "softmax": (lambda: dict(x=_a(3, 4)), {}),
    "softmax_backward": (lambda: dict(y=_a(3, 4), dy=_a(3, 4)), {}),
    "log_softmax": (lambda: dict(x=_a(3, 4)), {}),
    "log_softmax_backward": (lambda: dict(y=_a(3, 4), dy=_a(3, 4)), {}),
    "rope": (lambda: dict(x=_a(2, 3, 4)), dict(offset=2)),
    "rope_backward": (lambda: dict(dy=_a(2, 3, 4)), dict(offset=2)),
    "rope_split_heads": (lambda: dict(x=_a(2, 3, 4)), dict(heads=2, offset=2)),
    "rope_split_heads_backward": (lambda: dict(dy=_a(2, 3, 4)), dict(offset=2)),
    "swiglu": (lambda: dict(gate=_a(3, 4), up=_a(3, 4)), {}),
    "swiglu_backward": (lambda: dict(gate=_a(3, 4), up=_a(3, 4), dy=_a(3, 4)), {}),
    "attention": (lambda: dict(q=_a(2, 3, 4), k=_a(2, 5, 4), v=_a(2, 5, 4)), dict(scale=0.5)),
    "attention_backward": (lambda: dict(q=_a(2, 3, 4), k=_a(2, 5, 4), v=_a(2, 5, 4),
                                        o=_a(2, 3, 4), lse=_a(2, 3), dout=_a(2, 3, 4)),
                           dict(scale=0.5)),
    "cross_entropy": (lambda: dict(logits=_a(3, 5), target=_i(3)), {}),
    "cross_entropy_backward": (lambda: dict(logits=_a(3, 5), target=_i(3), lse=_a(3),
                                            dloss=_a(1).reshape(())), {}),
    "cross_entropy_backward:none": (lambda: dict(logits=_a(3, 5), target=_i(3), lse=_a(3),
                                                 dloss=_a(3)), dict(reduction="none")),
    "cross_entropy_partial_max": (lambda: dict(logits=_a(3, 5)), {}),
    "cross_entropy_partial": (lambda: dict(logits=_a(3, 5), target=_i(3), row_max=_a(3)), _ST),
    "cross_entropy_finish": (lambda: dict(target=_i(3), row_max=_a(3), stats=_a(2, 3)),
                             dict(vocab_total=5)),
    "cross_entropy_partial_backward": (lambda: dict(logits=_a(3, 5), target=_i(3), lse=_a(3),
                                                    dloss=_a(1).reshape(())), _ST),
    "cross_entropy_partial_backward:none": (
        lambda: dict(logits=_a(3, 5), target=_i(3), lse=_a(3), dloss=_a(3)),
        _ST | dict(reduction="none")),
    "dropout": (lambda: dict(x=_a(3, 4)), dict(p=0.5, seed=1)),
    "dropout_backward": (lambda: dict(dy=_a(3, 4)), dict(p=0.5, seed=1)),
    "adamw_step": (lambda: dict(param=_a(3, 4), grad=_a(3, 4), exp_avg=_a(3, 4),
                                exp_avg_sq=_a(3, 4)), _ADAMW),
    "sgd_step": (lambda: dict(param=_a(3, 4), grad=_a(3, 4), momentum_buf=_a(3, 4)),
                 dict(lr=0.1, momentum=0.9)),
}
#: Functions without array arguments (dtype, shape and scalars only).
NO_ARRAYS = {"adamw_hyper", "dropout_mask"}
#: Mis-shapes that are valid calls: free shapes, broadcasting, batching, a longer table,
#: a longer dim holding the same indices. Each must succeed (so the list stays exact).
#: Sequences of arrays (global_l2_norm, clip_grad_norm_) take any shapes and are not mutated.
ACCEPTED = {
    "embedding": "weight.last weight.first indices.extra indices.last",
    "embedding_backward": "dout.last",
    "quantize_per_token": "x.last x.first", "quantize_per_token_backward": "d_q.last d_q.first",
    "dequantize_per_token": "q.last", "dequantize_per_token_backward": "d_output.last",
    "matmul": "a.extra a.first b.extra", "binary": "a.extra b.extra",
    "bias_add": "x.extra x.first", "where": "cond.extra a.extra b.extra",
    "prod_backward": "x.last", "gather": "x.last x.first index.last",
    "scatter_add": "x.last x.first src.last src.first", "index_add": "x.last",
    "index_select": "x.extra x.last x.first index.last",
    "layer_norm": "x.extra x.first", "rms_norm": "x.extra x.first",
    "rope": "x.extra x.first x.mid", "rope_backward": "dy.extra dy.first dy.mid",
    "rope_split_heads": "x.extra x.first x.mid",
    "rope_split_heads_backward": "dy.extra dy.first dy.mid",
    "attention": "q.mid", "cross_entropy": "logits.last", "cross_entropy_backward": "logits.last",
    "cross_entropy_partial_max": "logits.last logits.first",
    **{f: "x.extra x.last x.first" for f in ("unary", "triangle", "cast", "reduce", "arg_select",
                                              "topk", "variance", "softmax", "log_softmax",
                                              "dropout")},
    "dropout_backward": "dy.extra dy.last dy.first",
}
#: Functions whose checks are their plan's, named after the op: matmul runs the gemm plan.
OP_NAME = {"matmul": "(?:matmul|gemm)", "clip_grad_norm_": "clip_grad_norm"}


def _mis_shapes(shape):
    """One extra leading dim, and each of the first, a middle and the last dim one longer."""
    out = {"extra": (2, *shape)}
    if shape:
        out["last"] = (*shape[:-1], shape[-1] + 1)
    if len(shape) > 1:
        out["first"] = (shape[0] + 1, *shape[1:])
    if len(shape) > 2:
        out["mid"] = (shape[0], shape[1] + 1, *shape[2:])
    return out


def test_the_sweep_covers_every_public_function():
    swept = {key.split(":")[0] for key in VALID}
    assert swept | NO_ARRAYS == set(F.__all__), "add the new function to VALID"


@pytest.mark.parametrize("key", list(VALID))
def test_every_array_argument_mis_shaped_is_a_named_error(key, device):
    name = key.split(":")[0]
    make, options = VALID[key]
    fn, accepted = getattr(F, name), set(ACCEPTED.get(name, "").split())
    params = set(inspect.signature(fn).parameters)
    on_device = device != "cpu"
    put = (lambda a: gp.backend.asarray(a, device=device)) if on_device else (lambda a: a)
    message = re.compile(rf"^{OP_NAME.get(name, name)}: argument '(\w+)': expected .+, given ")
    failures = []
    for arg, value in make().items():
        if not hasattr(value, "shape"):
            continue
        for mutation, shape in _mis_shapes(value.shape).items():
            kwargs = {k: put(np.resize(v, shape) if k == arg else v)
                      for k, v in make().items()}
            before = {k: gp.backend.to_host(v).copy() for k, v in kwargs.items()
                      if hasattr(v, "shape")}
            where = f"{arg} {shape} ({mutation})"
            if f"{arg}.{mutation}" in accepted:
                if not on_device:  # the device runs the rejected calls only (no kernels)
                    fn(**kwargs, **options)
                continue
            try:
                fn(**kwargs, **options)
                failures.append(f"{where}: accepted")
                continue
            except gp.GpuPlanError as exc:
                found = message.match(str(exc))
                # broadcasting ops name the descriptor field of the argument ('b_shape')
                if found is None or found.group(1).removesuffix("_shape") not in params:
                    failures.append(f"{where}: {exc}")
            except Exception as exc:  # noqa: BLE001 - a bare NumPy/Python error is the bug
                failures.append(f"{where}: {type(exc).__name__}: {exc}")
            failures += [f"{where}: '{k}' written" for k, v in before.items()
                         if not np.array_equal(gp.backend.to_host(kwargs[k]), v)]
    assert not failures, f"{name}:\n" + "\n".join(failures)
