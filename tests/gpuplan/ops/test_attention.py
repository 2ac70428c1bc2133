"""Fused attention plans (forward and backward) against the float64 definition, on the host
and the device: every dtype, odd lengths, Lq != Lk both ways, causal and not, with and
without dropout, every SKU."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from gpuplan.dtypes import HALF_DTYPES
from gpuplan.ops.attention.reference import attention_backward_reference, attention_reference
from gpuplan.ops.dropout.reference import dropout_multipliers
from gpuplan.testing import assert_close, check_plan, f64, on, random, stream_for, tol
from tests.helpers import DTYPES

SCALE = 0.4
# (batch, lq, lk, head_dim, causal): a single element; odd lengths with lq < lk and lq > lk
# (causal: queries that see no key); head_dims taking each SIMT chunk count and both
# tensor-core sizes (f16/bf16 on a device); several key/query tiles; no keys at all.
SHAPES = [(1, 1, 1, 1, False), (2, 5, 7, 20, True), (2, 9, 4, 20, True), (1, 6, 11, 48, False),
          (3, 17, 17, 64, True), (2, 33, 20, 64, False), (1, 70, 130, 128, True),
          (1, 21, 9, 100, True), (1, 4, 0, 8, False)]
_IDS = [f"{b}x{lq}x{lk}x{d}{'c' if c else ''}" for b, lq, lk, d, c in SHAPES]


def _sweep(*extents):
    """Whether to sweep bad operands: not with an empty operand (check_plan's strided variant
    of an empty array is C-contiguous to NumPy, so it cannot be rejected)."""
    return all(extents)


def _lse_dtype(dtype):
    return np.float64 if dtype == np.float64 else np.float32


def _grad_close(got, ref, dtype, what="", scale=8.0):
    """8x the dtype's tolerance, atol relative to the largest |gradient| (each entry sums
    up to L terms as large as the largest entries; see the kernel cases)."""
    rtol, atol = tol(dtype, scale)
    atol *= max(1.0, float(np.abs(ref).max(initial=0.0)))
    np.testing.assert_allclose(f64(got), ref, rtol=rtol, atol=atol, err_msg=what)


def _expected_variant(device, dtype, dim):
    if device == "cpu":
        return "numpy"
    return "tensor_core" if dtype in HALF_DTYPES and dim in (64, 128) else "simt"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,lq,lk,dim,causal", SHAPES, ids=_IDS)
def test_forward(device, dtype, b, lq, lk, dim, causal):
    q, k, v = (random((b, n, dim), dtype, seed=i, low=-2, high=2)
               for i, n in enumerate((lq, lk, lk)))
    desc = gp.AttentionDescriptor(b, lq, lk, dim, SCALE, causal, dtype)
    o, lse = attention_reference(q, k, v, SCALE, causal)
    # lse is -inf exactly where a query sees no key (assert_allclose wants the same infs).
    plan = check_plan(gp.AttentionPlan, desc, {"q": q, "k": k, "v": v},
                      lambda **_: {"o": o, "lse": lse}, device=device, scale=4,
                      bad_inputs=_sweep(b, lq, lk, dim))
    assert plan.sku().variant == _expected_variant(device, dtype, dim)
    assert plan.precision_guarantee().deterministic


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,lq,lk,dim,causal", SHAPES, ids=_IDS)
def test_backward(device, dtype, b, lq, lk, dim, causal):
    q, k, v, dout = (random((b, n, dim), dtype, seed=10 + i, low=-2, high=2)
                     for i, n in enumerate((lq, lk, lk, lq)))
    o, lse = attention_reference(q, k, v, SCALE, causal)
    o, lse = o.astype(dtype), lse.astype(_lse_dtype(dtype))  # as the forward hands them over
    desc = gp.AttentionDescriptor(b, lq, lk, dim, SCALE, causal, dtype)
    # deterministic=True: the device SKUs qualify (no atomics), so this selects them.
    pref = gp.PlanPreference(deterministic=True)
    # Bad operands first (check_plan's sweep); values with the gradient tolerance below.
    check_plan(gp.AttentionBackwardPlan, desc,
               {"q": q, "k": k, "v": v, "o": o, "lse": lse, "dout": dout}, None,
               device=device, pref=pref, bad_inputs=_sweep(b, lq, lk, dim))
    grads = gp.functional.attention_backward(*(on(device, a) for a in (q, k, v, o, lse, dout)),
                                             scale=SCALE, causal=causal)
    refs = attention_backward_reference(q, k, v, dout, SCALE, causal)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        assert gp.device_of(got) == gp.backend.resolve_device(device)
        _grad_close(got, ref, dtype, name)
    plan = gp.AttentionBackwardPlan.select(stream_for(device), desc, pref)
    assert plan.sku().variant == _expected_variant(device, dtype, dim)
    assert plan.precision_guarantee().deterministic


def test_backward_is_deterministic(device):
    """The same inputs give the same bits (one CTA writes each gradient element)."""
    b, lq, lk, dim = 2, 40, 70, 64
    arrays = [random((b, n, dim), np.float16, seed=20 + i) for i, n in
              enumerate((lq, lk, lk, lq))]
    o, lse = (on(device, a) for a in gp.functional.attention(
        *(on(device, a) for a in arrays[:3]), scale=SCALE, causal=True))
    runs = [[gp.to_host(g) for g in gp.functional.attention_backward(
        *(on(device, a) for a in arrays[:3]), o, lse, on(device, arrays[3]), scale=SCALE,
        causal=True)] for _ in range(2)]
    for first, second in zip(*runs, strict=True):
        np.testing.assert_array_equal(first.view(np.uint16), second.view(np.uint16))


class _Fused(ag.Function):
    """The attention plans as an autograd Function (forward saves o and lse)."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        o, lse = gp.functional.attention(q, k, v, scale=SCALE, causal=causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        return o

    @staticmethod
    def backward(ctx, dout):
        return gp.functional.attention_backward(*ctx.saved, dout, scale=SCALE,
                                                causal=ctx.causal)


class _Reference(ag.Function):
    """attention_reference with attention_backward_reference as its gradient."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        ctx.args = (q, k, v, causal)
        return attention_reference(q, k, v, SCALE, causal)[0]

    @staticmethod
    def backward(ctx, dout):
        q, k, v, causal = ctx.args
        return attention_backward_reference(q, k, v, dout, SCALE, causal)


@pytest.mark.parametrize("fn", [_Fused, _Reference], ids=["plans", "reference"])
@pytest.mark.parametrize("lq,lk,causal", [(4, 4, True), (3, 6, True), (5, 3, True),
                                          (3, 5, False)])
def test_gradcheck(fn, lq, lk, causal):
    """Both the host plans and the float64 reference are their forward's gradient."""
    rng = np.random.default_rng(lq * 10 + lk)
    ts = [ag.tensor(rng.uniform(-1, 1, (2, n, 3)), requires_grad=True) for n in (lq, lk, lk)]
    assert ag.gradcheck(lambda q, k, v: fn.apply(q, k, v, causal=causal), ts)


def test_sku_choice_and_limits():
    emu = gp.Stream.emulated()
    sel = gp.AttentionPlan.select
    assert sel(emu, gp.AttentionDescriptor(1, 8, 8, 64, 1.0, True, gp.bfloat16)).sku() \
        .variant == "tensor_core"
    assert sel(emu, gp.AttentionDescriptor(1, 8, 8, 96, 1.0, True, np.float16)).sku() \
        .variant == "simt"
    with pytest.raises(gp.Unsupported, match="attention: argument 'head_dim'"):
        sel(emu, gp.AttentionDescriptor(1, 8, 8, 129, 1.0, dtype=np.float32))
    # The host takes any head_dim.
    host = gp.AttentionPlan.select(gp.Stream.host(),
                                   gp.AttentionDescriptor(1, 2, 3, 200, 1.0, dtype=np.float32))
    assert host.sku().variant == "numpy"
    # The backward needs a [B, Lq] workspace on a device: a zero cap leaves no SKU there.
    with pytest.raises(gp.Unsupported, match="workspace"):
        gp.AttentionBackwardPlan.select(emu, gp.AttentionDescriptor(2, 3, 3, 8, 1.0),
                                        gp.PlanPreference(max_workspace_bytes=0))


def test_descriptor_errors():
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem, match="attention: argument 'lq'"):
        gp.AttentionPlan.select(s, gp.AttentionDescriptor(1, -1, 2, 4, 1.0))
    with pytest.raises(gp.InvalidProblem, match="argument 'scale'"):
        gp.AttentionPlan.select(s, gp.AttentionDescriptor(1, 2, 2, 4, float("nan")))
    with pytest.raises(gp.Unsupported, match="argument 'dtype'"):
        gp.AttentionBackwardPlan.select(s, gp.AttentionDescriptor(1, 2, 2, 4, 1.0,
                                                                  dtype=np.int32))


@pytest.mark.parametrize("b,lq,lk,dim", [(0, 3, 3, 4), (2, 0, 3, 4), (2, 3, 0, 4),
                                         (2, 3, 3, 0)])
def test_empty_extents(device, b, lq, lk, dim):
    """Empty outputs return at once; no keys gives o = 0, lse = -inf and dq = 0; no queries
    gives dk = dv = 0; head_dim 0 still writes lse = log(number of keys)."""
    q, dout = (on(device, np.ones((b, lq, dim), np.float32)) for _ in range(2))
    k, v = (on(device, np.ones((b, lk, dim), np.float32)) for _ in range(2))
    o, lse = gp.functional.attention(q, k, v, scale=1.0)
    np.testing.assert_array_equal(gp.to_host(o), 0.0 if lk == 0 else 1.0)
    np.testing.assert_allclose(gp.to_host(lse), -np.inf if lk == 0 else np.log(lk), rtol=1e-6)
    dq, dk, dv = gp.functional.attention_backward(q, k, v, o, lse, dout, scale=1.0)
    assert (dq.shape, dk.shape, dv.shape) == ((b, lq, dim), (b, lk, dim), (b, lk, dim))
    np.testing.assert_array_equal(gp.to_host(dq), 0.0)
    np.testing.assert_array_equal(gp.to_host(dk), 0.0)
    np.testing.assert_array_equal(gp.to_host(dv), 0.0 if lq == 0 else float(lq) / max(lk, 1))


# (batch, lq, lk, head_dim, causal): dropout shapes: odd lk (a row's scores straddle Philox
# counters), lq > lk causal (rows that see no key), the tensor-core sizes on a device.
DROP_SHAPES = [(2, 5, 7, 20, True), (1, 9, 4, 8, True), (2, 19, 23, 64, False),
               (1, 33, 70, 128, True)]
DROP_SEED, DROP_OFFSET = 2**63 + 12345, 77


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,lq,lk,dim,causal", DROP_SHAPES)
@pytest.mark.parametrize("p", [0.25, 1.0])
def test_dropout_forward_and_backward(device, dtype, b, lq, lk, dim, causal, p):
    """o and the gradients equal the float64 chain rule through the dropout plan's keep bits
    over [b, lq, lk] (keep / (1 - p) multiplying P); lse is the undropped softmax's."""
    q, k, v, dout = (random((b, n, dim), dtype, seed=30 + i, low=-2, high=2)
                     for i, n in enumerate((lq, lk, lk, lq)))
    drop = dropout_multipliers((b, lq, lk), p, DROP_SEED, DROP_OFFSET)
    kw = dict(scale=SCALE, causal=causal, dropout=p, seed=DROP_SEED, offset=DROP_OFFSET)
    o, lse = gp.functional.attention(*(on(device, a) for a in (q, k, v)), **kw)
    ref_o, ref_lse = attention_reference(q, k, v, SCALE, causal, drop)
    assert_close(o, ref_o, dtype, scale=4)
    seen = np.isfinite(ref_lse)
    assert_close(gp.to_host(lse)[seen], ref_lse[seen], _lse_dtype(dtype), scale=4)
    if p == 1.0:
        np.testing.assert_array_equal(gp.to_host(o), 0.0)
    grads = gp.functional.attention_backward(*(on(device, a) for a in (q, k, v)), o, lse,
                                             on(device, dout), **kw)
    refs = attention_backward_reference(q, k, v, dout, SCALE, causal, drop)
    # 16x: delta = dout . o takes the forward's rounded o, whose error the 1 / (1 - p) of the
    # kept probabilities enlarges (bf16: up to ~0.9% of the largest |dk|).
    for name, got, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        _grad_close(got, ref, dtype, name, scale=16.0)


def test_dropout_stream_and_arguments(device):
    """p = 0 gives the undropped bits whatever the stream; another seed or offset drops other
    entries; the descriptor and the stream reject values out of range, writing nothing."""
    q, k, v = (on(device, random((2, 6, 8), np.float32, seed=40 + i)) for i in range(3))
    plain = gp.to_host(gp.functional.attention(q, k, v, scale=SCALE)[0])
    zero = gp.functional.attention(q, k, v, scale=SCALE, dropout=0.0, seed=5, offset=9)[0]
    np.testing.assert_array_equal(gp.to_host(zero), plain)
    outs = [gp.to_host(gp.functional.attention(q, k, v, scale=SCALE, dropout=0.5, seed=s,
                                               offset=o)[0]) for s, o in ((1, 0), (2, 0),
                                                                          (1, 72))]
    assert not np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[0], outs[2])
    with pytest.raises(gp.InvalidProblem, match="argument 'dropout'"):
        gp.functional.attention(q, k, v, scale=SCALE, dropout=1.5)
    o = on(device, np.full((2, 6, 8), 7, np.float32))
    lse = on(device, np.full((2, 6), 7, np.float32))
    stream = stream_for(device)
    plan = gp.AttentionPlan.select(stream, gp.AttentionDescriptor(2, 6, 6, 8, SCALE,
                                                                  dropout=0.5))
    for name, bad in (("seed", -1), ("seed", 2**64), ("offset", 2**64), ("seed", 1.5)):
        kw = {"seed": 1, "offset": 0, name: bad}
        with pytest.raises(gp.InvalidProblem, match=f"argument '{name}'"):
            plan.run(stream, None, gp.AttentionArgs(q, k, v, o, lse, **kw))
    np.testing.assert_array_equal(gp.to_host(o), 7.0)
    np.testing.assert_array_equal(gp.to_host(lse), 7.0)


class _FusedDrop(ag.Function):
    """The attention plans with dropout (a fixed stream) as an autograd Function."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        ctx.kw = dict(scale=SCALE, causal=causal, dropout=0.4, seed=DROP_SEED,
                      offset=DROP_OFFSET)
        o, lse = gp.functional.attention(q, k, v, **ctx.kw)
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, dout):
        return gp.functional.attention_backward(*ctx.saved, dout, **ctx.kw)


@pytest.mark.parametrize("lq,lk,causal", [(4, 4, True), (5, 3, True), (3, 5, False)])
def test_dropout_gradcheck(lq, lk, causal):
    """The host plans with dropout are their forward's gradient (the mask fixed by the
    stream, so every evaluation drops the same entries)."""
    rng = np.random.default_rng(lq * 10 + lk + 1)
    ts = [ag.tensor(rng.uniform(-1, 1, (2, n, 3)), requires_grad=True) for n in (lq, lk, lk)]
    assert ag.gradcheck(lambda q, k, v: _FusedDrop.apply(q, k, v, causal=causal), ts)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("heads,first", [(2, 0), (2, 2), (1, 3), (3, 1)])
def test_dropout_head_shard_draws_the_full_batch_bits(device, dtype, heads, first):
    """A shard holding heads [first, first + heads) of every outer entry (a tensor-parallel
    rank's attention batch), given that head layout, drops exactly the entries one process
    drops there: its o and gradients are bit-identical to the full batch's slices (f16 with
    head_dim 64: the tensor-core kernels on a device)."""
    outer, total, lq, lk, dim = 2, 4, 7, 9, 64
    full = [random((outer, total, n, dim), dtype, seed=50 + i) for i, n in
            enumerate((lq, lk, lk, lq))]
    kw = dict(scale=SCALE, causal=True, dropout=0.4, seed=99, offset=5)

    def run(arrays, layout):
        folded = [on(device, a.reshape(-1, *a.shape[2:])) for a in arrays]
        o, lse = gp.functional.attention(*folded[:3], heads=layout, **kw)
        grads = gp.functional.attention_backward(*folded[:3], o, lse, folded[3], heads=layout,
                                                 **kw)
        return [gp.to_host(x).reshape(outer, -1, *x.shape[1:]) for x in (o, lse, *grads)]

    whole = run(full, None)
    shard = run([a[:, first:first + heads] for a in full], (heads, total, first))
    for got, want in zip(shard, whole, strict=True):
        np.testing.assert_array_equal(got, want[:, first:first + heads])


def test_dropout_head_layout_errors():
    q = np.ones((4, 3, 8), np.float32)
    for heads, match in (((3, 4, 0), "argument 'drop_heads'"),
                         ((2, 4, 3), "argument 'drop_first_head'"),
                         ((0, 4, 0), "argument 'drop_heads'")):
        with pytest.raises(gp.InvalidProblem, match=match):
            gp.functional.attention(q, q, q, scale=1.0, dropout=0.5, heads=heads)


# Grouped-query attention: (outer, n_head, n_kv_head, lq, lk, head_dim, causal). The batch is
# outer x n_head query heads and K/V hold outer x n_kv_head entries: groups of 1, 2 and n_head
# (multi-query) query heads per K/V head; head_dim 64 takes the tensor cores for f16/bf16 on
# a device; lq > lk causal leaves queries that see no key.
GQA_SHAPES = [(2, 2, 2, 5, 7, 20, True), (1, 4, 2, 9, 6, 64, True), (2, 3, 1, 6, 11, 16, False),
              (1, 4, 1, 17, 17, 64, True)]
_GQA_IDS = [f"{o}x{h}/{kv}-{lq}x{lk}x{d}{'c' if c else ''}" for o, h, kv, lq, lk, d, c in
            GQA_SHAPES]


def _gqa_operands(dtype, outer, heads, kv_heads, lq, lk, dim, seed=60):
    """q, dout [outer * heads, lq, dim] and k, v [outer * kv_heads, lk, dim]."""
    rows = (outer * heads, outer * kv_heads, outer * kv_heads, outer * heads)
    return [random((r, n, dim), dtype, seed=seed + i, low=-2, high=2)
            for i, (r, n) in enumerate(zip(rows, (lq, lk, lk, lq), strict=True))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("outer,heads,kv_heads,lq,lk,dim,causal", GQA_SHAPES, ids=_GQA_IDS)
def test_gqa_forward_and_backward(device, dtype, outer, heads, kv_heads, lq, lk, dim, causal):
    """Query entry b attends with K/V entry b // group: o, lse and the gradients equal the
    float64 definition (dk, dv summed over each K/V entry's group of query heads), and the
    operand checks take k, v with outer * n_kv_head entries."""
    group = heads // kv_heads
    q, k, v, dout = _gqa_operands(dtype, outer, heads, kv_heads, lq, lk, dim)
    desc = gp.AttentionDescriptor(outer * heads, lq, lk, dim, SCALE, causal, dtype,
                                  kv_group=group)
    o, lse = attention_reference(q, k, v, SCALE, causal)
    check_plan(gp.AttentionPlan, desc, {"q": q, "k": k, "v": v},
               lambda **_: {"o": o, "lse": lse}, device=device, scale=4)
    o, lse = o.astype(dtype), lse.astype(_lse_dtype(dtype))
    check_plan(gp.AttentionBackwardPlan, desc,
               {"q": q, "k": k, "v": v, "o": o, "lse": lse, "dout": dout}, None,
               device=device, pref=gp.PlanPreference(deterministic=True))
    grads = gp.functional.attention_backward(*(on(device, a) for a in (q, k, v, o, lse, dout)),
                                             scale=SCALE, causal=causal, kv_group=group)
    refs = attention_backward_reference(q, k, v, dout, SCALE, causal)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    for name, got, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        # dk, dv sum `group` query heads' contributions: tolerance relative to that sum.
        _grad_close(got, ref, dtype, name, scale=8.0 * (group if name != "dq" else 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1)])
def test_gqa_equals_repeated_kv(device, dtype, heads, kv_heads):
    """GQA is attention with each K/V head repeated for the query heads of its group: o, lse
    and dq bit for bit (each query head reads the same K/V rows in the same order), dk and
    dv the group sums of the repeated run's per-head gradients (f16, head_dim 64: the
    tensor-core kernels on a device)."""
    outer, lq, lk, dim, group = 2, 19, 23, 64, heads // kv_heads
    q, k, v, dout = _gqa_operands(dtype, outer, heads, kv_heads, lq, lk, dim, seed=70)
    kw = dict(scale=SCALE, causal=True)

    def run(k_, v_, g):
        arrays = [on(device, a) for a in (q, k_, v_)]
        o, lse = gp.functional.attention(*arrays, kv_group=g, **kw)
        grads = gp.functional.attention_backward(*arrays, o, lse, on(device, dout),
                                                 kv_group=g, **kw)
        return [gp.to_host(x) for x in (o, lse, *grads)]

    o, lse, dq, dk, dv = run(k, v, group)
    o_r, lse_r, dq_r, dk_r, dv_r = run(np.repeat(k, group, 0), np.repeat(v, group, 0), 1)
    for got, want in ((o, o_r), (lse, lse_r), (dq, dq_r)):
        np.testing.assert_array_equal(got, want)
    for got, per_head in ((dk, dk_r), (dv, dv_r)):
        summed = f64(per_head).reshape(-1, group, lk, dim).sum(axis=1)
        _grad_close(got, summed, dtype, scale=4.0 * group)


def test_gqa_backward_is_deterministic(device):
    """The same GQA inputs give the same dk, dv bits: one CTA sums a K/V tile's group of query
    heads in a fixed order (f16, head_dim 64: the tensor-core kernels on a device)."""
    q, k, v, dout = _gqa_operands(np.float16, 1, 4, 1, 40, 70, 64, seed=80)
    kw = dict(scale=SCALE, causal=True, kv_group=4)
    arrays = [on(device, a) for a in (q, k, v)]
    o, lse = gp.functional.attention(*arrays, **kw)
    runs = [[gp.to_host(g) for g in gp.functional.attention_backward(
        *arrays, o, lse, on(device, dout), **kw)] for _ in range(2)]
    for first, second in zip(*runs, strict=True):
        np.testing.assert_array_equal(first.view(np.uint16), second.view(np.uint16))


def test_gqa_errors():
    """kv_group must divide the batch (and be >= 1); k and v must hold batch // kv_group
    entries. The messages name the op, the argument, what was expected and what was given;
    nothing is written."""
    s = gp.Stream.host()
    with pytest.raises(gp.InvalidProblem,
                       match=r"attention: argument 'kv_group': expected a divisor of batch "
                             r"\(6\).*given 4"):
        gp.AttentionPlan.select(s, gp.AttentionDescriptor(6, 2, 2, 4, 1.0, kv_group=4))
    with pytest.raises(gp.InvalidProblem, match="attention_backward: argument 'kv_group'"):
        gp.AttentionBackwardPlan.select(s, gp.AttentionDescriptor(6, 2, 2, 4, 1.0, kv_group=0))
    q = np.ones((4, 3, 8), np.float32)
    with pytest.raises(gp.InvalidProblem, match=r"attention: argument 'k': expected shape "
                                                r"\(2, 3, 8\), given shape \(4, 3, 8\)"):
        gp.functional.attention(q, q, q, scale=1.0, kv_group=2)
    plan = gp.AttentionPlan.select(s, gp.AttentionDescriptor(4, 3, 3, 8, 1.0, kv_group=2))
    o, lse = np.full((4, 3, 8), 7, np.float32), np.full((4, 3), 7, np.float32)
    kv = np.ones((2, 3, 8), np.float32)
    with pytest.raises(gp.InvalidProblem, match="argument 'v'"):
        plan.run(s, None, gp.AttentionArgs(q, kv, q, o, lse))
    np.testing.assert_array_equal(o, 7.0)
    np.testing.assert_array_equal(lse, 7.0)
