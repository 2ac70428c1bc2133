"""scaled_dot_product_attention: gradcheck (causal, Lq != Lk, scale), float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import autograd as ag
from autograd.nn import functional as F
from gpuplan.ops.attention.reference import attention_reference
from gpuplan.testing import assert_close, f64
from tests.helpers import DTYPES, check_dtypes, gradcheck_on


def _x(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def _ref(q, k, v, causal, scale):
    s = np.einsum("...qd,...kd->...qk", q, k) * scale
    lq, lk = s.shape[-2:]
    if causal:
        s = np.where(np.arange(lk)[None, :] > np.arange(lq)[:, None] + (lk - lq), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(3, 3), (2, 4)])
def test_gradcheck_and_values(device, causal, lq, lk):
    q, k, v = _x(1, 2, lq, 3, seed=1), _x(1, 2, lk, 3, seed=2), _x(1, 2, lk, 2, seed=3)
    fn = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal)  # noqa: E731
    gradcheck_on(device, fn, q, k, v)
    out = fn(*[ag.tensor(a, device=device) for a in (q, k, v)])
    assert out.shape == (1, 2, lq, 2)
    np.testing.assert_allclose(out.numpy(), _ref(q, k, v, causal, 1 / np.sqrt(3)),
                               rtol=1e-12, atol=1e-12)


def test_explicit_scale_and_constant_inputs(device):
    q, k, v = _x(2, 3, 4, seed=4), _x(2, 3, 4, seed=5), _x(2, 3, 4, seed=6)
    kt = ag.tensor(k, device=device)  # k does not require grad
    gradcheck_on(device, lambda a, c: F.scaled_dot_product_attention(a, kt, c, scale=0.3),
                 q, v)
    out = F.scaled_dot_product_attention(*[ag.tensor(a, device=device) for a in (q, k, v)],
                                         scale=0.3)
    np.testing.assert_allclose(out.numpy(), _ref(q, k, v, False, 0.3), rtol=1e-12)


def test_shape_errors(device):
    q = ag.tensor(_x(1, 2, 3, 4), device=device)
    with pytest.raises(ValueError, match="rank"):
        F.scaled_dot_product_attention(q.reshape(6, 4), q.reshape(6, 4), q.reshape(6, 4))
    with pytest.raises(ValueError, match="incompatible"):
        F.scaled_dot_product_attention(q, ag.tensor(_x(1, 2, 3, 5)), q)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes(device, dtype):
    q, k, v = _x(2, 2, 9, 16, seed=7), _x(2, 2, 9, 16, seed=8), _x(2, 2, 9, 16, seed=9)
    check_dtypes(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
                 [q, k, v], device, [dtype], scale=16)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(3, 3), (2, 5), (5, 2)])
def test_fused_gradcheck_and_values(device, causal, lq, lk):
    """Dv == Dh: the fused plans (lq > lk causal: queries that see no key give 0)."""
    q, k, v = _x(2, 1, lq, 3, seed=11), _x(2, 1, lk, 3, seed=12), _x(2, 1, lk, 3, seed=13)
    fn = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal)  # noqa: E731
    gradcheck_on(device, fn, q, k, v)
    out = fn(*[ag.tensor(a, device=device) for a in (q, k, v)])
    ref, _ = attention_reference(*(a.reshape(2, -1, 3) for a in (q, k, v)), 1 / np.sqrt(3),
                                 causal)
    np.testing.assert_allclose(out.numpy(), ref.reshape(out.shape), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_matches_composed(device, dtype):
    """The fused plans and the composed ops agree on values and gradients (head_dim 64:
    the tensor-core kernels for f16/bf16 on a device)."""
    from autograd.functions.attention import ComposedAttention, ScaledDotProductAttention

    arrays = [_x(1, 2, n, 64, seed=20 + i).astype(dtype) for i, n in enumerate((19, 23, 23))]
    results = []
    for fn in (ScaledDotProductAttention, ComposedAttention):
        ts = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
        out = fn.apply(*ts, scale=0.125, causal=True)
        out.backward(ag.tensor(np.ones(out.shape, dtype), device=device))
        results.append([out.numpy()] + [t.grad.numpy() for t in ts])
    for fused, composed in zip(*results, strict=True):
        assert_close(fused, f64(composed), dtype, scale=8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_dropout_matches_composed(device, dtype, monkeypatch):
    """dropout_p > 0 without a mask runs the fused plans, which drop the same entries as the
    composed softmax -> dropout -> matmul from the same generator state (the mask over
    [..., Lq, Lk] is the dropout plan's) and advance the generator as far: values and
    gradients agree (head_dim 64: the tensor-core kernels for f16/bf16 on a device)."""
    import gpuplan.functional as gf
    from autograd.functions.attention import attention_weights

    calls = []
    fused_plan = gf.attention
    monkeypatch.setattr(gf, "attention", lambda *a, **kw: calls.append(kw) or fused_plan(*a, **kw))
    arrays = [_x(2, 2, n, 64, seed=30 + i).astype(dtype) for i, n in enumerate((19, 23, 23))]
    paths = (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3,
                                                            is_causal=True),
             lambda q, k, v: attention_weights(q, k, None, 0.3, 0.125, True) @ v)
    results, offsets = [], []
    for fn in paths:
        ag.manual_seed(21)
        ts = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
        out = fn(*ts)
        out.backward(ag.tensor(np.ones(out.shape, dtype), device=device))
        results.append([out.numpy()] + [t.grad.numpy() for t in ts])
        offsets.append(ag.random.default_generator.get_state())
    assert [c["dropout"] for c in calls] == [0.3]  # the first path took the fused plans
    assert offsets[0] == offsets[1] == (21, 2 * 2 * 19 * 23)
    for fused, composed in zip(*results, strict=True):
        assert_close(fused, f64(composed), dtype, scale=16)
    ag.manual_seed(21)
    undropped = F.scaled_dot_product_attention(*(ag.tensor(a, device=device) for a in arrays),
                                               is_causal=True).numpy()
    assert not np.allclose(results[0][0], undropped)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_dropout_gradcheck(device, causal):
    """The fused plans with dropout are their forward's gradient (the seed reset per
    evaluation, so every evaluation drops the same entries)."""
    def fn(a, b, c):
        ag.manual_seed(4)
        return F.scaled_dot_product_attention(a, b, c, dropout_p=0.35, is_causal=causal)

    q, k, v = _x(1, 2, 4, 3, seed=14), _x(1, 2, 5, 3, seed=15), _x(1, 2, 5, 3, seed=16)
    gradcheck_on(device, fn, q, k, v)


def test_head_sharded_attention_errors():
    from autograd.functions.attention import head_sharded_attention

    q = ag.tensor(_x(1, 2, 3, 4))
    kw = dict(dropout_p=0.2, is_causal=True)
    with pytest.raises(ValueError, match="first_head \\+ H <= total_heads"):
        head_sharded_attention(q, q, q, total_heads=3, first_head=2, **kw)
    with pytest.raises(ValueError, match="\\[..., H, L, Dh\\]"):
        head_sharded_attention(q[0], q[0], q[0], total_heads=2, first_head=0, **kw)
    with pytest.raises(ValueError, match="Dv == Dh"):
        head_sharded_attention(q, q, ag.tensor(_x(1, 2, 3, 5)), total_heads=2, first_head=0,
                               **kw)


@pytest.mark.parametrize("parts,heads,lead", [(3, 2, (2,)), (1, 3, ()), (2, 1, (2, 1))])
def test_split_heads_gradcheck_and_equals_split_reshape_transpose(device, parts, heads, lead):
    from autograd.functions.attention import split_heads

    t, d = 4, 3
    x = _x(*lead, t, parts * heads * d, seed=5)
    fn = lambda a: split_heads(a, parts, heads)  # noqa: E731
    gradcheck_on(device, lambda a: ag.cat([o.reshape(-1) for o in fn(a)]), x)
    xt = ag.tensor(x, device=device, requires_grad=True)
    outs = fn(xt)
    assert len(outs) == parts
    for i, o in enumerate(outs):
        piece = x[..., i * heads * d:(i + 1) * heads * d].reshape(*lead, t, heads, d)
        assert o.shape == (*lead, heads, t, d)
        np.testing.assert_array_equal(o.numpy(), np.swapaxes(piece, -3, -2))
    # Only some parts take part: the others' gradients are zero.
    (outs[-1] * 2.0).sum().backward()
    want = np.zeros_like(x)
    want[..., (parts - 1) * heads * d:] = 2.0
    np.testing.assert_array_equal(xt.grad.numpy(), want)


def test_split_heads_errors():
    from autograd.functions.attention import split_heads

    with pytest.raises(ValueError, match="parts \\* heads \\* D"):
        split_heads(ag.tensor(_x(2, 10)), 3, 2)
    with pytest.raises(ValueError, match="parts \\* heads \\* D"):
        split_heads(ag.tensor(_x(6)), 3, 2)


# Grouped-query attention: (n_head, n_kv_head): groups of 2 (GQA) and of every query head
# (MQA).
GQA_HEADS = [(4, 2), (3, 1)]


@pytest.mark.parametrize("heads,kv_heads", GQA_HEADS, ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal,lq,lk", [(True, 4, 4), (True, 5, 3), (False, 3, 5)])
def test_gqa_gradcheck(device, heads, kv_heads, causal, lq, lk):
    """float64 gradcheck of the fused plans with k, v of n_kv_head heads (dk, dv summed over
    each group of query heads); lq > lk causal: queries that see no key. On the device, one
    batch entry (each gradcheck is ~400 forward runs: minutes on the emulated device with
    two); the host checks two."""
    b = 2 if device == "cpu" else 1
    q = _x(b, heads, lq, 3, seed=40)
    k, v = _x(b, kv_heads, lk, 3, seed=41), _x(b, kv_heads, lk, 3, seed=42)
    gradcheck_on(device, lambda a, b, c: F.scaled_dot_product_attention(
        a, b, c, is_causal=causal, enable_gqa=True), q, k, v)


def _run_with_grads(fn, arrays, device, cot=None):
    """[output, grads of `arrays`] of fn for the cotangent `cot` (a fixed random one when
    None)."""
    ts = [ag.tensor(a, requires_grad=True, device=device) for a in arrays]
    out = fn(*ts)
    cot = _x(*out.shape, seed=99) if cot is None else cot
    out.backward(ag.tensor(cot.astype(out.dtype), device=device))
    return [out.numpy()] + [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("heads,kv_heads", GQA_HEADS, ids=["gqa", "mqa"])
@pytest.mark.parametrize("path", ["fused", "composed", "mask", "dropout"])
def test_gqa_equals_repeated_kv(device, heads, kv_heads, path):
    """GQA equals attention with each K/V head repeated for its group's query heads
    (np.repeat): the output and dQ, and dK, dV as the group sums of the repeated run's
    gradients. Paths: the fused plans (bit for bit for the output and dQ: each query head
    reads its K/V head's rows in the same order), the composed ops (Dv != Dh), a mask, and
    dropout (the fused plans, the same generator state)."""
    group, lq, lk, dh = heads // kv_heads, 5, 7, 4
    dv = dh + 2 if path == "composed" else dh
    q = _x(2, heads, lq, dh, seed=50)
    k, v = _x(2, kv_heads, lk, dh, seed=51), _x(2, kv_heads, lk, dv, seed=52)
    kw = dict(is_causal=path != "mask", dropout_p=0.3 if path == "dropout" else 0.0)
    if path == "mask":
        kw["attn_mask"] = _x(lq, lk, seed=53) > -0.5

    def sdpa(a, b, c, **extra):
        ag.manual_seed(8)
        return F.scaled_dot_product_attention(a, b, c, **kw, **extra)

    out, dq, dk, dvv = _run_with_grads(lambda a, b, c: sdpa(a, b, c, enable_gqa=True),
                                       [q, k, v], device)
    rep = [np.repeat(a, group, axis=1) for a in (k, v)]
    out_r, dq_r, dk_r, dv_r = _run_with_grads(sdpa, [q, *rep], device)
    assert out.shape == (2, heads, lq, dv) and dk.shape == k.shape and dvv.shape == v.shape
    if path in ("fused", "dropout"):
        np.testing.assert_array_equal(out, out_r)
        np.testing.assert_array_equal(dq, dq_r)
    else:
        np.testing.assert_allclose(out, out_r, rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(dq, dq_r, rtol=1e-13, atol=1e-14)
    for got, per_head in ((dk, dk_r), (dvv, dv_r)):
        summed = per_head.reshape(2, kv_heads, group, lk, -1).sum(axis=2)
        np.testing.assert_allclose(got, summed, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gqa_dtypes(device, dtype):
    """GQA in every dtype against the float64 run (head_dim 64: the tensor-core kernels for
    f16/bf16 on a device)."""
    q, k, v = _x(1, 4, 9, 64, seed=60), _x(1, 2, 11, 64, seed=61), _x(1, 2, 11, 64, seed=62)
    check_dtypes(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True,
                                                                enable_gqa=True),
                 [q, k, v], device, [dtype], scale=16)


def test_gqa_shape_errors():
    q, k3 = ag.tensor(_x(1, 4, 3, 8)), ag.tensor(_x(1, 3, 3, 8))
    k2 = ag.tensor(_x(1, 2, 3, 8))
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: argument 'k': "
                                         r"expected as many heads .* given 2"):
        F.scaled_dot_product_attention(q, k2, k2)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: argument 'k': "
                                         r"expected n_kv_head .* dividing n_head .* = 4, "
                                         r"given n_kv_head 3"):
        F.scaled_dot_product_attention(q, k3, k3, enable_gqa=True)
    with pytest.raises(ValueError, match="incompatible"):  # leading dims must agree
        F.scaled_dot_product_attention(q, ag.tensor(_x(2, 2, 3, 8)), ag.tensor(_x(2, 2, 3, 8)),
                                       enable_gqa=True)
    with pytest.raises(ValueError, match="incompatible"):  # k and v with unlike heads
        F.scaled_dot_product_attention(q, k2, ag.tensor(_x(1, 1, 3, 8)), enable_gqa=True)
    from autograd.functions.attention import head_sharded_attention

    with pytest.raises(ValueError, match="head_sharded_attention: argument 'k': expected "
                                         "n_kv_head"):
        head_sharded_attention(q, k3, k3, dropout_p=0.0, is_causal=True, total_heads=4,
                               first_head=0)


@pytest.mark.parametrize("rank", [0, 1])
def test_gqa_head_sharded_attention_equals_full(device, rank):
    """A tensor-parallel shard with GQA (query heads [2 rank, 2 rank + 2) of 4, their K/V head
    rank of 2) gives exactly the full tensor's output and gradient slices, dropout included
    (the shard draws the full batch's bits for its query heads)."""
    from autograd.functions.attention import head_sharded_attention

    q, k, v = _x(2, 4, 6, 8, seed=70), _x(2, 2, 7, 8, seed=71), _x(2, 2, 7, 8, seed=72)

    def attend(a, b, c, first):
        ag.manual_seed(9)
        return head_sharded_attention(a, b, c, dropout_p=0.3, is_causal=True, total_heads=4,
                                      first_head=first)

    cot = _x(*q.shape, seed=73)
    full = _run_with_grads(lambda a, b, c: attend(a, b, c, 0), [q, k, v], device, cot)
    shard = _run_with_grads(lambda a, b, c: attend(a, b, c, 2 * rank),
                            [q[:, 2 * rank:2 * rank + 2], k[:, rank:rank + 1],
                             v[:, rank:rank + 1]], device, cot[:, 2 * rank:2 * rank + 2])
    slices = (slice(2 * rank, 2 * rank + 2),) * 2 + (slice(rank, rank + 1),) * 2
    for got, want, heads in zip(shard, full, slices, strict=True):
        np.testing.assert_array_equal(got, want[:, heads])
