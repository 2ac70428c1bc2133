"""Helpers for checking plans (the test suite and `scripts/check_kernels.py --execute`):
float64 references, per-dtype tolerances, device moves, and a check that a rejected call
leaves every output untouched (that one needs pytest)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import as_dtype, bfloat16, float16, float32, float64

#: (rtol, atol) per dtype for results computed from that dtype's inputs and compared with a
#: float64 reference computed from the same (already rounded) inputs.
TOLERANCES = {
    float64: (1e-12, 1e-12),
    float32: (2e-5, 2e-6),
    float16: (2e-3, 2e-4),
    bfloat16: (1.6e-2, 1e-3),
}



def tol(dtype: Any, scale: float = 1.0) -> tuple[float, float]:
    r, a = TOLERANCES[as_dtype(dtype)]
    return r * scale, a * scale


def random(shape: Sequence[int], dtype: Any, seed: int = 0, low: float = -1.0,
           high: float = 1.0) -> np.ndarray:
    """Host array of `dtype`, uniformly drawn; rounding happens here, once."""
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=tuple(shape)).astype(as_dtype(dtype))


def f64(a: Any) -> np.ndarray:
    """Host float64 copy of any array (bf16/f16/f32/f64, host or device)."""
    return gp.to_host(a).astype(np.float64)


def on(device: str, a: np.ndarray | None) -> Any:
    """Move a host array to 'cpu', 'cuda' or 'emulated'."""
    return None if a is None else gp.to_device(a, device)


def stream_for(device: str) -> gp.Stream:
    device = gp.backend.resolve_device(device)
    if device == "emulated":
        return gp.Stream.emulated()
    return gp.Stream.host() if device == "cpu" else gp.Stream.current()


def assert_close(actual: Any, expected64: np.ndarray, dtype: Any, scale: float = 1.0,
                 err_msg: str = "") -> None:
    """Compare `actual` (any dtype/device) with a float64 reference at the dtype's tolerance."""
    rtol, atol = tol(dtype, scale)
    np.testing.assert_allclose(f64(actual), expected64, rtol=rtol, atol=atol, err_msg=err_msg)


def run_plan(plan_cls: type, desc: Any, args: Any, device: str,
             pref: gp.PlanPreference | None = None) -> gp.Plan:
    """select + allocate workspace + run on the device's stream; returns the plan."""
    stream = stream_for(device)
    plan = plan_cls.select(stream, desc, pref or gp.PlanPreference())
    ws = gp.Workspace.allocate(stream, plan.workspace_size())
    plan.run(stream, ws, args)
    stream.synchronize()
    return plan


def assert_rejected(call: Callable[[], Any], error: type[gp.GpuPlanError],
                    outputs: Sequence[Any], *words: str) -> gp.GpuPlanError:
    """`call` raises `error` whose message names every word in `words`, and the `outputs`
    arrays hold exactly the bytes they held before the call."""
    import pytest

    def raw(o: Any) -> np.ndarray:
        return np.ascontiguousarray(gp.to_host(o)).reshape(-1).view(np.uint8)

    before = [raw(o).copy() for o in outputs]
    with pytest.raises(error) as info:
        call()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"error message {msg!r} lacks {w!r}"
    for o, b in zip(outputs, before, strict=True):
        np.testing.assert_array_equal(raw(o), b)
    return info.value


def layer_norm_reference(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5,
                         rms: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm (RMSNorm when `rms`: no centring, no bias) over the last axis in float64:
    (y, mean, rstd), mean zeros for RMSNorm, rstd = 1 / sqrt(mean((x - mean)^2) + eps); a
    D = 0 row has mean 0 and rstd 1 / sqrt(eps) (the kernels' convention)."""
    x = f64(x)
    n = max(x.shape[-1], 1)
    mean = np.zeros(x.shape[:-1]) if rms else x.sum(axis=-1) / n
    c = x - mean[..., None]
    rstd = 1.0 / np.sqrt((c * c).sum(axis=-1) / n + eps)
    y = c * rstd[..., None]
    if weight is not None:
        y = y * f64(weight)
    if bias is not None:
        y = y + f64(bias)
    return y, mean, rstd


def layer_norm_backward_reference(dy: Any, x: Any, weight: Any = None, eps: float = 1e-5
                                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dweight, dbias) of LayerNorm over the last axis of 2-D x in float64, statistics
    from x (`layer_norm_reference`): with xhat = (x - mean) * rstd and g = dy * weight,
    dx = rstd * (g - mean_d(g) - xhat * mean_d(g * xhat)), dweight = sum_r dy * xhat,
    dbias = sum_r dy."""
    x, dy = f64(x), f64(dy)
    _, mean, rstd = layer_norm_reference(x, eps=eps)
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy if weight is None else dy * f64(weight)
    dx = rstd[:, None] * (g - g.mean(axis=1, keepdims=True)
                          - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def gemm_operands(desc: Any, seed: int = 0) -> tuple[np.ndarray, ...]:
    """A, B, C0 and (with has_bias) the bias of a GemmDescriptor, drawn in its dtype."""
    a = random(desc.a_shape(), desc.dtype, seed=seed)
    b = random(desc.b_shape(), desc.dtype, seed=seed + 1)
    c = random(desc.c_shape(), desc.dtype, seed=seed + 2)
    bias = random((desc.n,), desc.dtype, seed=seed + 3) if desc.has_bias else None
    return a, b, c, bias


def gemm_reference(desc: Any, a: Any, b: Any, c0: Any, bias: Any, alpha: float = 1.0,
                   beta: float = 0.0) -> np.ndarray:
    """alpha * op(A) @ op(B) + beta * C0 + bias in float64, from the rounded inputs."""
    a64, b64 = f64(a), f64(b)
    if desc.trans_a:
        a64 = np.swapaxes(a64, -1, -2)
    if desc.trans_b:
        b64 = np.swapaxes(b64, -1, -2)
    out = alpha * np.matmul(a64, b64)
    if beta != 0:
        out = out + beta * f64(c0)
    if bias is not None:
        out = out + f64(bias)
    return np.broadcast_to(out, desc.c_shape())


def gelu_reference(x: Any, approximate: str = "none") -> np.ndarray:
    """GELU in float64 from its definition: x * Phi(x) (erf), or the tanh approximation."""
    x = f64(x)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    from gpuplan.host_math import erf
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def gemm_epilogue_reference(desc: Any, pre: np.ndarray) -> np.ndarray:
    """The GEMM's output from its float64 pre-activation P (`gemm_reference`): f(P) for the
    descriptor's epilogue ("none": P)."""
    if desc.epilogue == "none":
        return pre
    return gelu_reference(pre, "tanh" if desc.epilogue == "gelu_tanh" else "none")


def assert_gemm_close(actual: Any, expected: np.ndarray, desc: Any, c0: Any = None,
                      bias: Any = None, what: str = "gemm", beta: float = 0.0,
                      pre: np.ndarray | None = None) -> None:
    """|err| <= rtol * (|ref| + |addends|) + atol * sqrt(K): sums of K products grow like
    sqrt(K); an addend (beta*C, bias) may be rounded once more before the final rounding.
    With `pre` (the float64 pre-activation of an epilogue f, `expected` being f(pre)): the
    pre-activation's bound times max |f'| (1.13 for GELU) plus a rounding of f's value.
    NaN is outside every bound."""
    import math

    rtol, atol = tol(desc.dtype)
    bound = rtol * np.abs(expected if pre is None else pre) + atol * max(1.0, math.sqrt(desc.k))
    if beta != 0 and c0 is not None:
        bound = bound + rtol * np.abs(beta * f64(c0))
    if bias is not None:
        bound = bound + rtol * np.abs(f64(bias))
    if pre is not None:
        bound = 1.13 * bound + rtol * np.abs(expected)
    got = f64(actual)
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    err = np.abs(got - expected)
    bad = ~(err <= bound)
    if bad.any():
        worst = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(err - bound, nan=np.inf),
                                                    -np.inf)), err.shape)
        raise AssertionError(
            f"{what} [{gp.dtypes.short_name(desc.dtype)}] {desc}: {int(bad.sum())} of "
            f"{bad.size} outside the bound; at {worst}: got {got[worst]}, expected "
            f"{expected[worst]}, bound {bound[worst]}")


# -- float64 reference of the cross-entropy family (tests, kernel cases) -------------------


def cross_entropy_reference(logits: Any, target: Any, smoothing: float = 0.0,
                            ignore_index: int = -100) -> tuple[np.ndarray, np.ndarray]:
    """(per-row loss, lse) in float64 from the definitions: -log p_t with p = exp(x) /
    sum exp(x), smoothed with the mean of -log p_j; the loss is 0 on ignored rows."""
    x = f64(logits)
    out, lse = np.zeros(x.shape[0]), np.zeros(x.shape[0])
    for n, t in enumerate(gp.to_host(target).tolist()):
        m = x[n].max()
        lse[n] = m + np.log(np.exp(x[n] - m).sum())
        logp = x[n] - lse[n]
        if t != ignore_index:
            out[n] = (1 - smoothing) * -logp[t] + smoothing * np.mean(-logp)
    return out, lse


def cross_entropy_reduce_reference(rows: np.ndarray, target: Any, reduction: str,
                                   ignore_index: int = -100) -> np.ndarray:
    """The per-row losses reduced: as is ('none'), summed, or over the non-ignored rows."""
    if reduction == "none":
        return rows
    total = rows.sum()
    keep = np.count_nonzero(gp.to_host(target) != ignore_index)
    return total if reduction == "sum" else total / keep


def cross_entropy_grad_reference(logits: Any, target: Any, smoothing: float, dloss: Any,
                                 reduction: str, ignore_index: int = -100) -> np.ndarray:
    """d(reduced loss)/d logits in float64 by the chain rule, d(-log p_k)/dx_j = p_j - [j == k],
    times dloss ([N] for 'none', else a scalar)."""
    x, t, dloss = f64(logits), gp.to_host(target), f64(dloss)
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g = np.zeros_like(x)
    for n, k in enumerate(t.tolist()):
        if k == ignore_index:
            continue
        onehot = np.zeros(x.shape[1])
        onehot[k] = 1
        dn = (1 - smoothing) * (p[n] - onehot) + smoothing * (p[n] - 1.0 / x.shape[1])
        w = dloss[n] if reduction == "none" else dloss
        g[n] = w * dn / (np.count_nonzero(t != ignore_index) if reduction == "mean" else 1)
    return g


def cross_entropy_over_blocks(blocks: Sequence[Any], target: Any, ignore_index: int = -100,
                              reduction: str = "mean") -> tuple[Any, Any]:
    """(loss, lse) of the vocabulary-parallel stages (gpuplan/ops/cross_entropy_partial.py)
    over column blocks [N, V_r] of one logits matrix, in one process: this function does the
    all-reduces (max, then sum) a communicator would do, on the host."""
    F = gp.functional
    device = gp.device_of(blocks[0])
    total = sum(b.shape[1] for b in blocks)
    starts = np.cumsum([0] + [b.shape[1] for b in blocks[:-1]]).tolist()
    m = np.maximum.reduce([gp.to_host(F.cross_entropy_partial_max(b)) for b in blocks])
    m = gp.to_device(m, device)
    stats = sum(gp.to_host(F.cross_entropy_partial(b, target, m, vocab_start=s,
                                                   vocab_total=total))
                for b, s in zip(blocks, starts, strict=True))
    return F.cross_entropy_finish(target, m, gp.to_device(stats, device), vocab_total=total,
                                  ignore_index=ignore_index, reduction=reduction)


# -- float64 references of the optimizer families (tests, kernel cases) ------------------------


def adamw_reference(p: Any, g: Any, m: Any, v: Any, *, lr: float, beta1: float, beta2: float,
                    eps: float, weight_decay: float, step: int) -> tuple[np.ndarray, ...]:
    """One PyTorch AdamW step (decoupled decay, bias corrections with `step` >= 1) in float64,
    textbook form: (param, exp_avg, exp_avg_sq) after the step."""
    p, g, m, v = (f64(x) for x in (p, g, m, v))
    p = p * (1 - lr * weight_decay)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    mhat, vhat = m / (1 - beta1**step), v / (1 - beta2**step)
    return p - lr * mhat / (np.sqrt(vhat) + eps), m, v


def sgd_reference(p: Any, g: Any, buf: Any, *, lr: float, momentum: float = 0.0,
                  dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                  first_step: bool = False) -> tuple[np.ndarray, Any]:
    """One PyTorch SGD step (torch.optim.sgd._single_tensor_sgd) in float64: (param, momentum
    buffer); the buffer is ignored on the first step and stays None without momentum."""
    p, g = f64(p), f64(g)
    d = g + weight_decay * p
    if momentum:
        buf = d.copy() if first_step else momentum * f64(buf) + (1 - dampening) * d
        d = d + momentum * buf if nesterov else buf
    return p - lr * d, buf


# -- float64 references of the embedding and quantize families (tests, kernel cases) ---------


def embedding_reference(weight: Any, indices: Any, index_offset: int = 0) -> np.ndarray:
    """out[..., :] = weight[indices[...] - index_offset, :] in float64 (Python-int index
    math), a zero row where that row is outside [0, V): shape indices.shape + (D,)."""
    w = f64(weight)
    idx = gp.to_host(indices)
    out = np.zeros((idx.size, w.shape[1]))
    for n, v in enumerate(idx.reshape(-1).tolist()):
        if 0 <= v - index_offset < w.shape[0]:
            out[n] = w[v - index_offset]
    return out.reshape(idx.shape + (w.shape[1],))


def embedding_backward_reference(dout: Any, indices: Any, num_embeddings: int,
                                 padding_idx: int | None = None,
                                 index_offset: int = 0) -> np.ndarray:
    """dweight [V, D] from zeros in float64: dweight[i - index_offset] += dout[n] for every n
    whose index i is not padding_idx (compared unshifted) and whose row i - index_offset is
    in [0, V) (dout [..., D], indices [...])."""
    d = f64(dout)
    d = d.reshape(-1, d.shape[-1])
    dw = np.zeros((num_embeddings, d.shape[1]))
    for n, i in enumerate(gp.to_host(indices).reshape(-1).tolist()):
        if 0 <= i - index_offset < num_embeddings and i != padding_idx:
            dw[i - index_offset] += d[n]
    return dw


FLT_MIN = np.float32(np.finfo(np.float32).tiny)


def flush_f32(a: Any) -> np.ndarray:
    """f32 copy with every |value| < FLT_MIN a zero of the same sign (the quantize family's
    flush to zero, written independently of gpuplan.ops.quantize)."""
    a = np.array(gp.to_host(a), dtype=np.float32)
    mask = np.abs(a) < FLT_MIN
    a[mask] = np.where(np.signbit(a[mask]), np.float32(-0.0), np.float32(0.0))
    return a


def quantize_reference64(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-token quantization in float64 math: (q, scale) with scale = max|x_n| / 127 (NaN
    ignored) and q = round(x / scale) (0 for a zero row or NaN; ties may differ by one from
    the bit-exact definition)."""
    x = f64(x)
    scale = np.fmax.reduce(np.abs(x), axis=1, initial=0.0) / 127.0
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(scale[:, None] > 0, np.round(x / scale[:, None]), 0.0)
    return np.nan_to_num(q, nan=0.0), scale


def quantize_reference_exact(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documented bit-exact per-token quantization (gpuplan.ops.quantize), row by row:
    (q int8, scale f32)."""
    wide = x.dtype == np.float64
    n, d = x.shape
    q = np.zeros((n, d), np.int8)
    scale = np.zeros(n, np.float32)
    for i in range(n):
        row = x[i].astype(np.float64) if wide else flush_f32(x[i].astype(np.float32))
        finite = row[~np.isnan(row)]
        amax = np.abs(finite).max() if finite.size else row.dtype.type(0)
        with np.errstate(over="ignore"):
            s = amax / row.dtype.type(127)
            scale[i] = 0.0 if s < FLT_MIN else np.float32(s)
        if scale[i] == 0:
            continue
        with np.errstate(invalid="ignore"):
            r = np.round(row / row.dtype.type(scale[i]))  # one division in C, half to even
        r[np.isnan(r)] = 0
        q[i] = np.minimum(np.maximum(r, -127), 127).astype(np.int8)
    return q, scale


def scale_reference64(scale: Any) -> np.ndarray:
    """A per-token scale as the family reads it, in float64 (subnormals flushed to 0)."""
    return f64(flush_f32(scale))


def scaled_reference_exact(scale: Any, v: Any, dtype: Any) -> np.ndarray:
    """dtype(C(scale[n]) * C(v[n, d])), C = f32 (flushed) or f64: the bit-exact dequantize
    (v = q) and dequantize backward (v = d_output)."""
    s, v = flush_f32(scale), gp.to_host(v)
    if as_dtype(dtype) == float64:
        return (s.astype(np.float64)[:, None] * v.astype(np.float64)).astype(dtype)
    return flush_f32(s[:, None] * flush_f32(v.astype(np.float32))).astype(dtype)


__all__ = [
    "adamw_reference", "sgd_reference",
    "TOLERANCES", "assert_close", "assert_gemm_close", "assert_rejected", "f64",
    "gemm_operands", "gemm_reference", "gemm_epilogue_reference", "gelu_reference",
    "layer_norm_reference", "layer_norm_backward_reference", "on",
    "random", "run_plan", "stream_for", "tol", "float16", "float32", "float64", "bfloat16",
    "embedding_reference", "embedding_backward_reference", "flush_f32", "quantize_reference64",
    "quantize_reference_exact", "scale_reference64", "scaled_reference_exact",
    "cross_entropy_reference", "cross_entropy_reduce_reference", "cross_entropy_grad_reference",
    "cross_entropy_over_blocks",
]
