"""Scaled dot-product attention: the fused attention plans (FlashAttention-2 style: no
[Lq, Lk] buffer, backward recomputes P from the saved log-sum-exp; dropout drawn inside from
the dropout stream), or, where they do not apply (a value width unlike the query width, or a
head_dim over the device kernels' limit), the composed matmul -> softmax -> matmul; with an
attention mask, or dropout where the fused plans do not apply, the same composed from
autograd Functions (mask add and dropout between softmax and the second matmul).

Grouped-query attention (k, v [..., n_kv_head, Lk, D] with n_kv_head dividing the query's
n_head; torch's ``enable_gqa=True``): query head h uses K/V head h // (n_head // n_kv_head).
The fused plans take K/V as they are (never repeated per query head; their backward sums
dK, dV over each group in a fixed order); the composed paths, which need one K/V head per
query head, repeat them with autograd's broadcast (whose backward sums the group)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

import gpuplan as gp
import gpuplan.functional as F
from autograd import random
from autograd.function import Function
from autograd.functions.dropout import dropout
from autograd.functions.matmul import matmul
from autograd.functions.shape import expand, reshape, transpose, unsqueeze
from autograd.functions.softmax import softmax
from autograd.tensor_base import TensorBase, new_tensor
from gpuplan import backend, host_pool
from gpuplan.ops.attention.plans import MAX_HEAD_DIM

if TYPE_CHECKING:
    from autograd.tensor import Tensor

#: Elements a host thread copies at least when SplitHeads spreads its copies over the host
#: threads (gpuplan.host_pool): its strided copies move 128-byte runs at head_dim 32.
_COPY_GRAIN = 1 << 15


def _by_rows(like: Any, rows: int, per_row: int, fn: Any) -> None:
    """fn(lo, hi) over rows [0, rows): spread over the host threads for host arrays, one
    call for device ones (their copies are single kernels)."""
    if type(like) is np.ndarray:
        host_pool.parallel_for(rows, fn, max(1, _COPY_GRAIN // max(1, per_row)))
    else:
        fn(0, rows)


class SplitHeads(Function):
    """x [..., T, parts * heads * D] -> `parts` tensors [..., heads, T, D] (C order): the
    projection output of a packed q/k/v layer split and laid out per head, one copy per
    part (split, reshape and transpose would copy each part twice); backward writes each
    part's gradient straight into its columns of the one [..., T, parts * heads * D]
    gradient. On the host the copies are spread over the host threads by leading rows."""

    @staticmethod
    def forward(ctx, x, parts, heads):
        ctx.shape, ctx.parts = x.shape, parts
        *lead, t, width = x.shape
        rows, d = math.prod(lead), width // (parts * heads)
        v = backend.ascontiguous(x).reshape(rows, t, parts, heads, d)
        outs = [backend.empty((rows, heads, t, d), x.dtype, backend.device_of(x))
                for _ in range(parts)]

        def copy(lo: int, hi: int) -> None:
            for i, o in enumerate(outs):
                o[lo:hi] = v[lo:hi, :, i].swapaxes(1, 2)

        _by_rows(x, rows, t * width, copy)
        return tuple(o.reshape(*lead, heads, t, d) for o in outs)

    @staticmethod
    def backward(ctx, *dys):
        *lead, t, width = ctx.shape
        rows, heads, d = math.prod(lead), dys[0].shape[-3], dys[0].shape[-1]
        g = backend.empty(ctx.shape, dys[0].dtype, backend.device_of(dys[0]))
        v = g.reshape(rows, t, ctx.parts, heads, d)
        parts = [dy.reshape(rows, heads, t, d) for dy in dys]

        def copy(lo: int, hi: int) -> None:
            for i, dy in enumerate(parts):
                v[lo:hi, :, i] = dy[lo:hi].swapaxes(1, 2)

        _by_rows(g, rows, t * width, copy)
        return g


def split_heads(x: Tensor, parts: int, heads: int) -> tuple[Tensor, ...]:
    """x [..., T, parts * heads * D] -> `parts` tensors [..., heads, T, D]: part p is columns
    [p heads D, (p + 1) heads D) of x, head h of it columns [h D, (h + 1) D) of those; equal
    to ``split(x, heads * D, dim=-1)`` then ``reshape(..., T, heads, D).transpose(-3, -2)``
    of each piece (e.g. q, k, v of a fused qkv projection: parts=3)."""
    if x.ndim < 2 or parts < 1 or heads < 1 or x.shape[-1] % (parts * heads):
        raise ValueError(f"split_heads: x must be [..., T, parts * heads * D], given shape "
                         f"{tuple(x.shape)}, parts {parts}, heads {heads}")
    out = SplitHeads.apply(x, parts=int(parts), heads=int(heads))
    return out if isinstance(out, tuple) else (out,)


def _fold(a: Any) -> Any:
    """[..., L, D] as [batch, L, D] (leading axes folded; a copy only where needed)."""
    return a.reshape((-1,) + a.shape[-2:])


def kv_group(q: Any, k: Any, v: Any, op: str, enable_gqa: bool = True) -> int:
    """Query heads per K/V head of q [..., H, Lq, Dh], k [..., Hkv, Lk, Dh], v [..., Hkv,
    Lk, Dv]: 1 when k and v share q's leading dims, H // Hkv when only the head dim (-3)
    differs, Hkv divides H and `enable_gqa`; a ValueError naming `op` otherwise."""
    if q.ndim < 3 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"{op}: q, k, v must share a rank >= 3, given {q.shape}, {k.shape}, "
                         f"{v.shape}")
    if (k.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-1]
            or k.shape[-2] != v.shape[-2] or q.shape[:-3] != k.shape[:-3]):
        raise ValueError(f"{op}: incompatible shapes q {q.shape}, k {k.shape}, v {v.shape} "
                         f"(expected [..., H, Lq, Dh], [..., Hkv, Lk, Dh], [..., Hkv, Lk, Dv])")
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if heads == kv_heads:
        return 1
    if not enable_gqa:
        raise ValueError(f"{op}: argument 'k': expected as many heads (dim -3) as q ({heads}; "
                         f"fewer with enable_gqa=True: grouped-query attention), given "
                         f"{kv_heads} (q {q.shape}, k {k.shape}, v {v.shape})")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{op}: argument 'k': expected n_kv_head (k, v dim -3) dividing "
                         f"n_head (q dim -3) = {heads}, given n_kv_head {kv_heads} "
                         f"(q {q.shape}, k {k.shape}, v {v.shape})")
    return heads // kv_heads


def repeat_kv(x: Tensor, group: int) -> Tensor:
    """x [..., Hkv, L, D] -> [..., Hkv * group, L, D], K/V head c repeated for query heads
    c * group .. (c + 1) * group - 1 (Llama's repeat_kv); its gradient sums each group. A
    copy: only the composed paths use it, the fused plans read K/V heads in place."""
    if group == 1:
        return x
    *lead, kv_heads, length, dim = x.shape
    wide = expand(unsqueeze(x, -3), *lead, kv_heads, group, length, dim)
    return reshape(wide, *lead, kv_heads * group, length, dim)


class ScaledDotProductAttention(Function):
    """O = softmax(scale * Q K^T [causal mask]) V over [..., L, D] (batch dims folded), by
    the fused plans: forward saves Q, K, V, O and the per-row log-sum-exp; backward gets
    dQ, dK, dV from them (gpuplan.ops.attention.backward: dS = P (dO V^T - rowsum(dO O)),
    dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO, P recomputed tile by tile). With
    dropout > 0 the probabilities are dropped inside the plans by the keep bits of (seed,
    offset) over the [B, Lq, Lk] probabilities, which backward regenerates. K, V may hold
    fewer heads than Q (grouped-query attention: callers check the shapes with `kv_group`):
    folded, query entry b then reads K/V entry b // group, and dK, dV sum over each group."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, dropout=0.0, seed=0, offset=0, heads=None):
        q3, k3, v3 = _fold(q), _fold(k), _fold(v)
        group = q3.shape[0] // k3.shape[0] if k3.shape[0] else 1
        ctx.kw = dict(scale=scale, causal=causal, dropout=dropout, seed=seed, offset=offset,
                      heads=heads, kv_group=group)
        o, lse = F.attention(q3, k3, v3, **ctx.kw)
        ctx.save_for_backward(q3, k3, v3, o, lse)
        ctx.shapes = (q.shape, k.shape, v.shape)
        return o.reshape(q.shape)

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, o, lse = ctx.saved
        grads = F.attention_backward(q3, k3, v3, o, lse, _fold(dout), **ctx.kw)
        return tuple(g.reshape(shape) if need else None for g, shape, need in
                     zip(grads, ctx.shapes, ctx.needs_input_grad, strict=True))


class ComposedAttention(Function):
    """The same O as three plans: matmul, softmax (causal, scaled), matmul; Q, K, V and P are
    saved. With P the probabilities: dV = P^T dO, dP = dO V^T,
    dS = scale * P * (dP - rowsum(dP*P)), dQ = dS K, dK = dS^T Q. Takes V [..., Lk, Dv] of
    any width Dv."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal):
        q3, k3, v3 = _fold(q), _fold(k), _fold(v)
        scores = F.matmul(q3, k3, trans_b=True)  # [B, Lq, Lk]
        p = F.softmax(scores, scale=scale, causal=causal)
        out = F.matmul(p, v3)  # [B, Lq, Dv]
        ctx.scale, ctx.causal = scale, causal
        ctx.save_for_backward(q3, k3, v3, p)
        ctx.shapes = (q.shape, k.shape, v.shape)
        return out.reshape(q.shape[:-1] + (v.shape[-1],))

    @staticmethod
    def backward(ctx, dout):
        q3, k3, v3, p = ctx.saved
        q_shape, k_shape, v_shape = ctx.shapes
        do3 = _fold(dout)
        need_q, need_k, need_v = ctx.needs_input_grad
        dv = F.matmul(p, do3, trans_a=True).reshape(v_shape) if need_v else None
        dq = dk = None
        if need_q or need_k:
            dp = F.matmul(do3, v3, trans_b=True)
            ds = F.softmax_backward(p, dp, scale=ctx.scale, causal=ctx.causal)
            dq = F.matmul(ds, k3).reshape(q_shape) if need_q else None
            dk = F.matmul(ds, q3, trans_a=True).reshape(k_shape) if need_k else None
        return dq, dk, dv


def additive_mask(mask: Any, like: Tensor, lq: int, lk: int) -> Any:
    """A float mask to add to the scores: a bool mask (True = attend, torch's rule) becomes
    0 / -inf by filling (no arithmetic); a float mask is cast to the scores' dtype."""
    m = mask if isinstance(mask, TensorBase) else new_tensor(gp.asarray(mask, device=like.device))
    if m.device != like.device:
        raise ValueError(f"scaled_dot_product_attention: attn_mask is on {m.device}, q on "
                         f"{like.device}")
    if m.ndim < 2 or m.shape[-2] not in (1, lq) or m.shape[-1] not in (1, lk):
        raise ValueError(f"scaled_dot_product_attention: attn_mask must broadcast to "
                         f"[..., {lq}, {lk}], given shape {tuple(m.shape)}")
    if m.dtype == bool:  # a select, not mask indexing: no host sync (CUDA graph capture)
        zero, ninf = (gp.full((), v, like.dtype, like.device) for v in (0.0, -math.inf))
        return new_tensor(F.where(m.data, zero, ninf))
    if not gp.dtypes.is_float(m.dtype):
        raise ValueError(f"scaled_dot_product_attention: attn_mask must be bool or float, "
                         f"given dtype {m.dtype}")
    return m if m.dtype == like.dtype else m.to(dtype=like.dtype)


def _dead_rows(add: Tensor) -> tuple[Tensor, Tensor | None]:
    """(mask with the rows that mask every key set to 0, keep factors [..., Lq, 1] that are 0
    on those rows): softmax stays finite and the caller zeroes the rows' probabilities, as
    torch's sdpa (_safe_softmax) does, instead of NaN. Index bookkeeping on the mask, on its
    device, with no host sync; a float mask that requires grad is left as it is."""
    if add.requires_grad:
        return add, None
    data = add.data
    dead = gp.array_namespace(data).isneginf(data).all(axis=-1, keepdims=True)
    zero, one = (gp.full((), v, data.dtype, add.device) for v in (0.0, 1.0))
    # Selects, not boolean-mask assignment: CuPy sizes a mask's result on the host (a sync
    # that breaks CUDA graph capture on a GPU; the emulated device cannot show it).
    fixed = F.where(dead, zero, data)
    keep = F.where(dead, zero, one)
    return new_tensor(fixed), new_tensor(keep)


def attention_weights(q: Tensor, k: Tensor, attn_mask: Any = None, dropout_p: float = 0.0,
                      scale: float | None = None, is_causal: bool = False) -> Tensor:
    """The attention probabilities [..., Lq, Lk]: softmax(scale Q K^T + mask), then dropout
    (if dropout_p > 0), from autograd Functions (matmul, scale, broadcasting add, softmax
    and dropout plans): the fused plans take no mask, and callers such as
    MultiheadAttention(need_weights=True) need the probabilities themselves. The dropout
    mask is the one the fused plans draw from the same generator state."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = matmul(q, transpose(k, -2, -1))
    if attn_mask is None:
        p = softmax(scores, scale=s, causal=is_causal)
    else:
        add, keep = _dead_rows(additive_mask(attn_mask, q, q.shape[-2], k.shape[-2]))
        p = softmax(scores * s + add)
        if keep is not None:
            p = p * keep
    if dropout_p > 0.0:
        p = dropout(p, dropout_p, training=True)
    return p


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Any = None, enable_gqa: bool = False) -> Tensor:
    """q [..., Lq, Dh], k [..., Lk, Dh], v [..., Lk, Dv] -> [..., Lq, Dv]; scale defaults
    to 1/sqrt(Dh). ``enable_gqa`` (torch's): k, v [..., Hkv, Lk, D] may hold fewer heads
    than q [..., H, Lq, Dh] (Hkv dividing H; query head h uses K/V head h // (H // Hkv)):
    the fused plans read the K/V heads as they are, the composed paths repeat them.
    Causal masks (i, j) when j > i + (Lk - Lq) (equals PyTorch's for Lq == Lk).
    ``attn_mask`` broadcasts to [..., Lq, Lk]: bool (True = take part in attention) or
    float (added to the scaled scores); a query row whose every key is masked (-inf) gets
    zero probabilities, hence a zero output, as torch's sdpa (NaN if the float mask
    requires grad). ``dropout_p``
    drops attention probabilities (always, as torch's functional form: pass 0.0 in eval),
    drawing (seed, offset) for Lq * Lk elements per batch entry from autograd.random's
    default generator: the fused and the composed paths drop the same entries.
    Without a mask: fused plans when Dv == Dh <= 128 (every device, so results agree across
    devices), dropout included; the composed ops otherwise and with a mask.
    """
    group = kv_group(q, k, v, "scaled_dot_product_attention", enable_gqa)
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must lie in [0, 1], "
                         f"given {dropout_p}")
    if attn_mask is not None and is_causal:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal=True, "
                         "not both (as torch)")
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    fused = v.shape[-1] == q.shape[-1] <= MAX_HEAD_DIM
    if attn_mask is not None or (dropout_p > 0.0 and not fused):
        k, v = repeat_kv(k, group), repeat_kv(v, group)
        return matmul(attention_weights(q, k, attn_mask, float(dropout_p), s, bool(is_causal)),
                      v)
    if dropout_p > 0.0:
        seed, offset = random.default_generator.next_seed_offset(
            math.prod(q.shape[:-1]) * k.shape[-2])
        return ScaledDotProductAttention.apply(q, k, v, scale=s, causal=bool(is_causal),
                                               dropout=float(dropout_p), seed=seed,
                                               offset=offset)
    if fused:
        return ScaledDotProductAttention.apply(q, k, v, scale=s, causal=bool(is_causal))
    return ComposedAttention.apply(q, repeat_kv(k, group), repeat_kv(v, group), scale=s,
                                   causal=bool(is_causal))


def head_sharded_attention(q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float,
                           is_causal: bool, total_heads: int, first_head: int) -> Tensor:
    """scaled_dot_product_attention of q, k, v [..., H, L, Dh] (default scale) holding heads
    [first_head, first_head + H) of a tensor of `total_heads` heads (a tensor-parallel
    shard; k, v may hold H / group K/V heads: grouped-query attention), whose attention
    dropout drops exactly the entries one process holding every head drops there, and
    advances the default generator as far (by the full tensor's probabilities): layouts
    then agree bit for bit. Runs the fused plans (a device needs
    Dv == Dh <= 128 for them; the host takes any Dh == Dv)."""
    heads = q.shape[-3] if q.ndim >= 4 else 0
    if not (q.ndim >= 4 and 0 <= first_head and first_head + heads <= total_heads):
        raise ValueError(f"head_sharded_attention: q must be [..., H, L, Dh] with "
                         f"first_head + H <= total_heads, given shape {q.shape}, first_head "
                         f"{first_head}, total_heads {total_heads}")
    kv_group(q, k, v, "head_sharded_attention")
    if v.shape[-1] != q.shape[-1] or (q.device != "cpu" and q.shape[-1] > MAX_HEAD_DIM):
        raise ValueError(f"head_sharded_attention: needs the fused plans: Dv == Dh (<= "
                         f"{MAX_HEAD_DIM} on a device), given q {q.shape}, v {v.shape} on "
                         f"{q.device}")
    count = math.prod(q.shape[:-3]) * total_heads * q.shape[-2] * k.shape[-2]
    seed, offset = random.default_generator.next_seed_offset(count)
    return ScaledDotProductAttention.apply(
        q, k, v, scale=1.0 / math.sqrt(q.shape[-1]), causal=bool(is_causal),
        dropout=float(dropout_p), seed=seed, offset=offset,
        heads=(heads, int(total_heads), int(first_head)))
