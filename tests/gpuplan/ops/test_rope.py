"""Rotary embedding plans against the complex-rotation float64 reference, on host and device:
dtypes, odd shapes in both layouts, offsets, empty extents, the gradient as the transpose,
and bad input named by op, argument, expectation and value."""

from __future__ import annotations

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.ops.rope.reference import rope_reference
from gpuplan.testing import assert_close, check_plan, f64, on, random
from tests.helpers import DTYPES

F = gp.functional
# (batch, seq, heads, head_dim, theta, offset)
SHAPES = [(1, 1, 1, 2, 10000.0, 0), (3, 7, 1, 10, 10000.0, 5), (2, 5, 3, 6, 500000.0, 0),
          (1, 9, 1, 128, 10000.0, 2040), (4, 3, 2, 64, 1e6, 123456)]
EMPTY = [(0, 4, 1, 8), (2, 0, 1, 8), (2, 4, 0, 8), (2, 4, 1, 0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_plan_against_reference(device, dtype, shape, backward):
    b, t, h, d, theta, offset = shape
    x = random((b, t, h, d), dtype, seed=d, low=-3.0, high=3.0)
    desc = gp.RopeDescriptor(b, t, h, d, theta, dtype)
    # An angle of 1e5 radians is itself known to ~1e-11 in float64 (one ulp of theta^(-2i/D)
    # times the position): float64's tolerance grows with the position.
    scale = 2.0 * max(1.0, offset / 1000) if dtype == np.float64 else 2.0
    if backward:
        check_plan(gp.RopeBackwardPlan, desc, {"dy": x, "offset": offset},
                   lambda dy, offset, **_: rope_reference(dy, theta, offset, inverse=True),
                   device=device, scale=scale)
    else:
        check_plan(gp.RopePlan, desc, {"x": x, "offset": offset},
                   lambda x, offset, **_: rope_reference(x, theta, offset), device=device,
                   scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", EMPTY, ids=str)
def test_empty_extents(device, dtype, shape):
    x = np.zeros(shape, dtype)
    y = F.rope(on(device, x), 10000.0, 3, seq_dim=1)
    assert y.shape == shape and y.dtype == dtype
    assert F.rope_backward(on(device, x), 10000.0, 3, seq_dim=1).shape == shape


def test_float64_matches_the_real_rotate_half_form(device):
    """Hugging Face's formula, written out: cat(-x2, x1) * sin + x * cos."""
    x = np.random.default_rng(0).standard_normal((2, 4, 3, 16))
    d, theta, offset = 16, 10000.0, 7
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2) / d)
    freqs = np.outer(np.arange(offset, offset + 3), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)  # [T, D]
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    want = x * np.cos(emb) + rot * np.sin(emb)
    got = F.rope(on(device, x), theta, offset)  # [B, H, T, D]: positions along axis -2
    np.testing.assert_allclose(f64(got), want, rtol=1e-13, atol=1e-13)


def test_layouts_agree(device):
    """[B, T, H, D] with seq_dim=1 equals [B, H, T, D] with seq_dim=-2 after a transpose."""
    x = random((2, 5, 3, 8), np.float32, seed=3)
    a = f64(F.rope(on(device, x), 500.0, 2, seq_dim=1))
    xt = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    b = f64(F.rope(on(device, xt), 500.0, 2, seq_dim=-2)).transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(a, b)


def test_offset_continues_the_sequence(device):
    """rope of positions k.. of a sequence with offset k equals the tail of the whole: what a
    KV cache relies on."""
    x = random((2, 3, 9, 8), np.float64, seed=4)
    whole = f64(F.rope(on(device, x), 10000.0, 0))
    tail = f64(F.rope(on(device, np.ascontiguousarray(x[:, :, 6:])), 10000.0, 6))
    np.testing.assert_allclose(tail, whole[:, :, 6:], rtol=1e-14, atol=1e-14)


def test_backward_is_the_transpose(device):
    """<rope(x), g> == <x, rope_backward(g)>, and rope_backward inverts rope."""
    x, g = (random((3, 4, 2, 12), np.float64, seed=s) for s in (5, 6))
    y = f64(F.rope(on(device, x), 10000.0, 31, seq_dim=1))
    dx = f64(F.rope_backward(on(device, g), 10000.0, 31, seq_dim=1))
    np.testing.assert_allclose((y * g).sum(), (x * dx).sum(), rtol=1e-13)
    back = F.rope_backward(on(device, y), 10000.0, 31, seq_dim=1)
    np.testing.assert_allclose(f64(back), x, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_positions_keep_the_dtype_tolerance(device, dtype):
    """cos and sin come from float64 angles: at positions past 1000 (a float32 angle is off
    by ~1e-4 there) every dtype stays within its own tolerance, unscaled."""
    x = random((1, 6, 1, 32), dtype, seed=8, low=-4, high=4)
    y = F.rope(on(device, x), 10000.0, 1000, seq_dim=1)
    assert_close(y, rope_reference(x, 10000.0, 1000), dtype)


@pytest.mark.parametrize("field,value,error,words", [
    ("head_dim", 7, gp.InvalidProblem, "rope: argument 'head_dim': expected an even extent"),
    ("theta", 0.0, gp.InvalidProblem, "rope: argument 'theta': expected a finite number > 0"),
    ("theta", float("inf"), gp.InvalidProblem, "rope: argument 'theta': expected a finite"),
    ("seq", -1, gp.InvalidProblem, "rope: argument 'seq': expected an extent >= 0"),
    ("dtype", np.int32, gp.Unsupported, "rope: argument 'dtype': expected dtype in"),
])
def test_bad_descriptor(field, value, error, words):
    kw = dict(batch=2, seq=3, heads=1, head_dim=8, theta=10000.0, dtype=np.float32)
    with pytest.raises(error) as err:
        gp.RopePlan.select(gp.Stream.host(), gp.RopeDescriptor(**(kw | {field: value})))
    assert words in str(err.value), str(err.value)


@pytest.mark.parametrize("offset,words", [(-1, "an integer in [0, 2147483647], given -1"),
                                          (1.5, "given 1.5"), (True, "given True")])
def test_bad_offset(offset, words):
    x = np.ones((1, 2, 1, 4), np.float32)
    y = np.full_like(x, 7)
    plan = gp.RopePlan.select(gp.Stream.host(), gp.RopeDescriptor(1, 2, 1, 4, 10.0, np.float32))
    with pytest.raises(gp.InvalidProblem, match="rope: argument 'offset'") as err:
        plan.run(gp.Stream.host(), gp.Workspace.none(), gp.RopeArgs(x, y, offset))
    assert words in str(err.value)
    assert (y == 7).all()


@pytest.mark.parametrize("shape,seq_dim,words", [
    ((4,), -2, "argument 'x': expected an array [..., seq, ..., head_dim] of at least 2 dims"),
    ((2, 3, 4), -1, "argument 'seq_dim': expected an axis of x before its last"),
    ((2, 3, 4), 3, "argument 'seq_dim'"),
    ((2, 3, 4), 1.0, "argument 'seq_dim'"),
    ((2, 3, 5), -2, "argument 'x': expected [..., head_dim] with head_dim even"),
])
def test_bad_functional_input(shape, seq_dim, words):
    with pytest.raises(gp.InvalidProblem) as err:
        F.rope(np.ones(shape, np.float32), 10000.0, 0, seq_dim=seq_dim)
    assert words in str(err.value) and str(err.value).startswith("rope"), str(err.value)


# -- split_heads: [B, T, H, D] in, [B, H, T, D] out (and back for the gradient) -------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES[1:3] + [(2, 0, 3, 4, 10.0, 0)], ids=str)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_split_heads_plan(device, dtype, shape, backward):
    """Results and every malformed operand (the split side's shape is [B, H, T, D])."""
    b, t, h, d, theta, offset = shape
    x = random((b, t, h, d), dtype, seed=d, low=-3.0, high=3.0)
    desc = gp.RopeDescriptor(b, t, h, d, theta, dtype, True)
    if backward:
        check_plan(gp.RopeBackwardPlan, desc,
                   {"dy": np.ascontiguousarray(x.swapaxes(1, 2)), "offset": offset},
                   lambda dy, offset, **_: rope_reference(dy.swapaxes(1, 2), theta, offset,
                                                          inverse=True),
                   device=device, scale=2)
    else:
        check_plan(gp.RopePlan, desc, {"x": x, "offset": offset},
                   lambda x, offset, **_: rope_reference(x, theta, offset).swapaxes(1, 2),
                   device=device, scale=2)


def test_rope_split_heads_equals_split_then_rope(device):
    x = random((2, 7, 3 * 8), np.float32, seed=9)
    fused = F.rope_split_heads(on(device, x), 3, 500.0, 5)
    split = np.ascontiguousarray(x.reshape(2, 7, 3, 8).transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(f64(fused), f64(F.rope(on(device, split), 500.0, 5)))
    back = F.rope_split_heads_backward(fused, 500.0, 5)
    assert back.shape == x.shape
    np.testing.assert_allclose(f64(back), x, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("call,words", [
    (lambda: F.rope_split_heads(np.ones((2, 3, 12), np.float32), 5),
     "rope_split_heads: argument 'x': expected [..., T, heads * D] with heads=5 and D even"),
    (lambda: F.rope_split_heads(np.ones((2, 3, 12), np.float32), 4),
     "rope_split_heads: argument 'x': expected [..., T, heads * D] with heads=4 and D even"),
    (lambda: F.rope_split_heads_backward(np.ones((3, 4), np.float32)),
     "rope_split_heads_backward: argument 'dy': expected [..., heads, T, D] with D even"),
])
def test_split_heads_bad_functional_input(call, words):
    with pytest.raises(gp.InvalidProblem) as err:
        call()
    assert words in str(err.value), str(err.value)
