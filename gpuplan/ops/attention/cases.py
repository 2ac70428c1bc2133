"""Fused attention forward on the emulated device (SIMT kernels for every dtype and head-dim
chunk count, tensor-core kernels for f16/bf16 head_dim 64/128 with cp.async and scalar tile
loads), with and without dropout, against the float64 definition
(gpuplan.ops.attention.reference, dropout multipliers from the dropout plan's
host bits) on the same rounded inputs; then the backward (SIMT and tensor-core kernels)
against the float64 chain rule; then grouped-query attention (K/V heads shared by groups of
1, 2 and every query head) through both."""

from __future__ import annotations

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import HALF_DTYPES
from gpuplan.ops.attention.reference import attention_backward_reference, attention_reference
from gpuplan.ops.dropout.reference import dropout_multipliers
from gpuplan.testing import DTYPES, Case, check, dtype_id, emu, f64, random, run_emulated, tol

SCALE = 0.35
# (batch, lq, lk, head_dim, causal): head_dim 20 / 48 / 100 take the SIMT kernels with 1 / 2
# / 4 column chunks per lane in every dtype; odd lengths (edge tiles), lq != lk both ways
# (lq > lk causal: fully masked rows), several key tiles, lk = 0 and head_dim 0 / 1.
SIMT = [(2, 5, 7, 20, True), (1, 1, 1, 1, False), (2, 9, 4, 20, True), (1, 4, 0, 20, False),
        (1, 3, 5, 0, True), (2, 33, 40, 48, False), (1, 17, 70, 48, True),
        (2, 19, 45, 100, True), (1, 16, 33, 100, False)]
# (batch, lq, lk, head_dim, causal, aligned): the tensor-core kernels (f16/bf16); unaligned
# bases take the scalar-copy tile loads. The forward takes 128 query rows per CTA for
# head_dim 64 (2 row blocks per warp) and 64 for 128: lq 150 and 131 give two query tiles
# with a partial last one. Causal offsets lk - lq of 1 and 33 put a key tile's first key
# exactly one past a warp's last visible one (the forward skips such tiles per warp).
TC = [(2, 70, 130, 64, True, True), (1, 64, 64, 64, False, True), (1, 80, 30, 64, True, True),
      (1, 65, 97, 128, True, True), (1, 33, 70, 64, True, False),
      (1, 40, 20, 128, False, False), (1, 20, 150, 128, False, False),
      (1, 150, 170, 64, True, True), (1, 131, 70, 64, False, False),
      (1, 131, 140, 128, True, True), (1, 129, 130, 64, True, True),
      (1, 100, 133, 128, True, True)]
# Dropout: (batch, lq, lk, head_dim, causal, p). Odd lk (a row's elements straddle Philox
# counters, so the kernels' paired draws split), lq != lk, several tiles, p = 1 (all dropped).
DROP_P, DROP_SEED, DROP_OFFSET = 0.3, 0x1234_5678_9ABC_DEF0, 2**64 - 3  # offset wraps
SIMT_DROP = [(2, 9, 13, 20, True, DROP_P), (1, 33, 40, 48, False, DROP_P),
             (1, 5, 7, 20, False, 1.0)]
TC_DROP = [(2, 70, 67, 64, True, DROP_P), (1, 33, 70, 128, False, DROP_P)]


def place(a: np.ndarray, aligned: bool = True):
    """`a` on the device under test; unaligned: at a 2-byte offset into its allocation (a
    base that is not 16-byte aligned, so the kernels take the scalar-copy loads)."""
    if aligned:
        return emu(a)
    buf = emu(np.zeros(a.size + 1, a.dtype))
    view = buf[1:].reshape(a.shape)
    view[...] = emu(a)  # device to device: a GPU array takes no host array by assignment
    assert view.data.ptr % 16, "meant to be misaligned"
    return view


def operands(b: int, lq: int, lk: int, dim: int, dtype, seed: int = 0,
             group: int = 1) -> list[np.ndarray]:
    """q [b, lq, dim], k, v [b // group, lk, dim] and dout [b, lq, dim], drawn in `dtype`."""
    return [random((rows, n, dim), dtype, seed=seed + i, low=-1.5, high=1.5)
            for i, (rows, n) in enumerate(((b, lq), (b // group, lk), (b // group, lk),
                                           (b, lq)))]


def variant_of(dim: int, dtype) -> str:
    return "tensor_core" if dtype in HALF_DTYPES and dim in (64, 128) else "simt"


def drop_of(b: int, lq: int, lk: int, p: float):
    """The dropout multipliers of the cases' stream, or None when p == 0."""
    return dropout_multipliers((b, lq, lk), p, DROP_SEED, DROP_OFFSET) if p else None


def forward(dtype, b: int, lq: int, lk: int, dim: int, causal: bool,
            aligned: bool = True, p: float = 0.0, group: int = 1) -> None:
    q, k, v, _ = operands(b, lq, lk, dim, dtype, seed=1, group=group)
    desc = gp.AttentionDescriptor(b, lq, lk, dim, SCALE, causal, dtype, p, group)
    lse_t = np.float64 if dtype == np.float64 else np.float32
    o, lse = emu(np.full((b, lq, dim), 7, dtype)), emu(np.full((b, lq), 7, lse_t))
    plan = run_emulated(gp.AttentionPlan, desc,
                        gp.AttentionArgs(*(place(a, aligned) for a in (q, k, v)), o, lse,
                                         DROP_SEED, DROP_OFFSET))
    assert plan.sku().variant == variant_of(dim, dtype), plan.sku()
    ref_o, ref_lse = attention_reference(q, k, v, SCALE, causal, drop_of(b, lq, lk, p))
    masked = np.isneginf(ref_lse)  # queries that see no key: lse -inf, o = 0 exactly
    np.testing.assert_array_equal(np.isneginf(f64(lse)), masked, err_msg="attention lse -inf")
    np.testing.assert_array_equal(f64(o)[masked], 0.0, err_msg="attention masked rows")
    what = f"attention {b}x{lq}x{lk}x{dim}{' causal' if causal else ''} p={p} group={group}"
    check(o, ref_o, dtype, what + " o", scale=4.0)
    check(f64(lse)[~masked], ref_lse[~masked], lse_t, what + " lse", scale=4.0)


def _name(kind: str, dtype, b, lq, lk, dim, causal, aligned=True) -> str:
    return (f"{kind} {b}x{lq}x{lk}x{dim}{' causal' if causal else ''}"
            f"{'' if aligned else ' unaligned'} [{dtype_id(dtype)}]")


def drop_name(kind: str, dtype, b, lq, lk, dim, causal, p) -> str:
    return _name(kind, dtype, b, lq, lk, dim, causal) + f" dropout {p}"


def drop_case(dtype, b, lq, lk, dim, causal, p) -> None:
    forward(dtype, b, lq, lk, dim, causal, True, p)


FORWARD_CASES = (
    [Case(_name("attention", t, *shape), lambda t=t, s=shape: forward(t, *s))
     for t in DTYPES for shape in SIMT]
    + [Case(_name("attention", t, *shape), lambda t=t, s=shape: forward(t, *s))
       for t in HALF_DTYPES for shape in TC]
    + [Case(drop_name("attention", t, *shape), lambda t=t, s=shape: drop_case(t, *s))
       for t in DTYPES for shape in SIMT_DROP]
    + [Case(drop_name("attention", t, *shape), lambda t=t, s=shape: drop_case(t, *s))
       for t in HALF_DTYPES for shape in TC_DROP]
)


# The backward's SIMT kernels (attention_backward.cu: delta, dk/dv and dq for every dtype and
# head-dim chunk count) against the float64 chain rule on the same rounded inputs; o and lse
# are the float64 forward rounded as a caller holds them.


def check_grad(got, ref: np.ndarray, dtype, what: str) -> None:
    """Elementwise at 8x the dtype's tolerance, atol relative to the largest |gradient|: an
    entry is a sum of up to L terms as large as the largest entries (rounded in the input
    dtype where the tensor cores take P and dS), so its error scales with them."""
    rtol, atol = tol(dtype, 8.0)
    atol *= max(1.0, float(np.abs(ref).max(initial=0.0)))
    np.testing.assert_allclose(f64(got), ref, rtol=rtol, atol=atol, err_msg=what)


def backward(dtype, b: int, lq: int, lk: int, dim: int, causal: bool,
             aligned: bool = True, p: float = 0.0, group: int = 1) -> None:
    q, k, v, dout = operands(b, lq, lk, dim, dtype, seed=5, group=group)
    drop = drop_of(b, lq, lk, p)
    ref_o, ref_lse = attention_reference(q, k, v, SCALE, causal, drop)
    o = ref_o.astype(dtype)
    lse = ref_lse.astype(np.float64 if dtype == np.float64 else np.float32)
    desc = gp.AttentionDescriptor(b, lq, lk, dim, SCALE, causal, dtype, p, group)
    grads = [emu(np.full(a.shape, 7, dtype)) for a in (q, k, v)]
    inputs = [place(a, aligned) for a in (q, k, v, o)] + [emu(lse), place(dout, aligned)]
    plan = run_emulated(gp.AttentionBackwardPlan, desc,
                        gp.AttentionBackwardArgs(*inputs, *grads, DROP_SEED, DROP_OFFSET),
                        gp.PlanPreference(deterministic=True, backend=gp.BackendKind.NVRTC))
    assert plan.sku().variant == variant_of(dim, dtype), plan.sku()
    refs = attention_backward_reference(q, k, v, dout, SCALE, causal, drop)
    what = (f"attention_backward {b}x{lq}x{lk}x{dim}{' causal' if causal else ''} p={p} "
            f"group={group}")
    for name, got, ref in zip(("dq", "dk", "dv"), grads, refs, strict=True):
        check_grad(got, ref, dtype, f"{what} {name}")


def drop_backward_case(dtype, b, lq, lk, dim, causal, p) -> None:
    backward(dtype, b, lq, lk, dim, causal, True, p)


BACKWARD_CASES = (
    [Case(_name("attention_backward", t, *shape), lambda t=t, s=shape: backward(t, *s))
     for t in DTYPES for shape in SIMT]
    + [Case(drop_name("attention_backward", t, *shape),
            lambda t=t, s=shape: drop_backward_case(t, *s))
       for t in DTYPES for shape in SIMT_DROP])

# The tensor-core backward (attention_backward_tc.cu: f16/bf16, head_dim 64 and 128, cp.async
# and scalar-copy tile loads, with and without dropout); its delta kernel is
# attention_backward.cu's.
BACKWARD_TC_CASES = (
    [Case(_name("attention_backward", t, *shape), lambda t=t, s=shape: backward(t, *s))
     for t in HALF_DTYPES for shape in TC]
    + [Case(drop_name("attention_backward", t, *shape),
            lambda t=t, s=shape: drop_backward_case(t, *s))
       for t in HALF_DTYPES for shape in TC_DROP])

# Grouped-query attention: (outer, n_head, n_kv_head, lq, lk, head_dim, causal, aligned, p):
# the batch is outer x n_head query heads, K/V hold outer x n_kv_head entries, so the group
# size n_head // n_kv_head is 1 (multi-head), 2 and n_head (multi-query). The backward's dk/dv
# CTAs loop over a group's query heads (several query tiles each: causal starts, partial
# tiles), accumulating dk, dv for every query head of the group. SIMT shapes (every dtype;
# head_dim 20 / 48 / 100: 1, 2, 4 column chunks), then tensor-core ones (f16/bf16).
GQA_SIMT = [(2, 2, 2, 9, 13, 20, True, True, 0.0), (1, 4, 2, 35, 40, 48, True, True, 0.0),
            (2, 3, 1, 5, 7, 100, False, True, 0.0), (1, 4, 2, 9, 13, 20, True, True, DROP_P)]
GQA_TC = [(1, 2, 2, 33, 70, 64, True, True, 0.0), (1, 4, 2, 70, 67, 64, True, True, 0.0),
          (1, 3, 1, 40, 33, 128, False, False, 0.0), (1, 2, 1, 65, 97, 128, True, True, 0.0),
          (1, 4, 2, 33, 40, 64, True, True, DROP_P)]


def gqa_name(kind: str, dtype, outer, heads, kv_heads, lq, lk, dim, causal, aligned, p) -> str:
    return (_name(kind, dtype, outer * heads, lq, lk, dim, causal, aligned)
            + f" heads {heads}/{kv_heads}" + (f" dropout {p}" if p else ""))


def gqa_case(fn, dtype, outer, heads, kv_heads, lq, lk, dim, causal, aligned, p) -> None:
    fn(dtype, outer * heads, lq, lk, dim, causal, aligned, p, heads // kv_heads)


GQA_CASES = [Case(gqa_name(kind, t, *shape), lambda f=f, t=t, s=shape: gqa_case(f, t, *s))
             for kind, f in (("attention", forward), ("attention_backward", backward))
             for types, shapes in ((DTYPES, GQA_SIMT), (HALF_DTYPES, GQA_TC))
             for t in types for shape in shapes]

CASES = FORWARD_CASES + BACKWARD_CASES + BACKWARD_TC_CASES + GQA_CASES
