"""GELU's host math (the 'gelu' row of gpuplan.ops.activation.plans): y = x Phi(x) and
dx = dy (Phi(x) + x phi(x)), Phi(x) = (1 + erf(x / sqrt 2)) / 2.

- float64: erf to float64 accuracy (gpuplan.host_math.erf), NumPy passes.
- float32 (and f16/bf16, converted a block at a time): the compiled kernels of
  gpuplan.host_kernels, one pass, when gpuplan.host_jit has them; else the float32 NumPy
  block math (`normal_cdf_f32`, ~25 passes over a cache-sized block). The forward's bits are
  the same either way (the kernels repeat the NumPy operations in order); a gradient can
  differ by an ulp (the kernels' exp is correctly rounded more often than NumPy's).
- The backward given the forward's output y takes Phi(x) = y / x (Phi(0) = 1/2): no erf.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuplan import host_jit, host_pool
from gpuplan.host_math import erf, erf_float32, normal_cdf_f32

_INV_SQRT_2PI = 0.39894228040143267794
_INV_SQRT_2 = 0.70710678118654752440
_F32_INV_SQRT_2PI, _F32_MINUS_HALF = np.float32(_INV_SQRT_2PI), np.float32(-0.5)
_F32_ZERO, _F32_HALF = np.float32(0), np.float32(0.5)


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    """Phi(x) of an f32 or f64 array as a fresh float64 array: erf to float64 accuracy for
    f64, to float32 accuracy otherwise (see gpuplan.host_math)."""
    cdf = erf(x * _INV_SQRT_2) if x.dtype == np.float64 else erf_float32(x, scale=_INV_SQRT_2)
    cdf += 1.0
    cdf *= 0.5
    return cdf


def gelu(x: np.ndarray, alpha: Any) -> np.ndarray:
    """The table's forward: a new array of x's dtype (f32 by the float32 block math)."""
    if x.dtype == np.float32:  # e.g. the host GEMM's epilogue
        return map32(gelu_f32, x)
    y = _normal_cdf(x)
    y *= x
    return y


def gelu_grad(x: np.ndarray, dy: np.ndarray, alpha: Any) -> np.ndarray:
    """The table's backward from x: a new array of x's dtype."""
    if x.dtype == np.float32:
        return map32(gelu_grad_f32, x, dy)
    t = x.dtype.type
    pdf = x * x
    pdf *= t(-0.5)
    np.exp(pdf, out=pdf)
    pdf *= x
    pdf *= t(_INV_SQRT_2PI)
    grad = _normal_cdf(x)
    grad += pdf
    grad *= dy
    return grad


def _flat_views(*arrays: np.ndarray) -> tuple | None:
    """Flat views of arrays the kernels take (host_jit.takes), else None."""
    return tuple(a.reshape(-1) for a in arrays) if host_jit.takes(*arrays) else None


def gelu_f32(x: np.ndarray, y: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> None:
    """y = x Phi(x) on one float32 block (s1, s2: scratch)."""
    k, flat = host_jit.kernels(), _flat_views(x, y)
    if k is not None and flat is not None:
        k.gelu_forward(*flat)
        return
    normal_cdf_f32(x, y, s1, s2)
    y *= x


def bias_gelu_f32(p: np.ndarray, bias: np.ndarray | None, y: np.ndarray) -> None:
    """p += bias (bias may be None), y = x Phi(x) of the result, on a block of rows of
    float32 [rows, n] arrays (the host GEMM epilogue)."""
    k = host_jit.kernels()
    if k is not None and p.ndim == 2 and host_jit.takes(p, y, bias):
        k.bias_gelu_forward(p, p[0, :0] if bias is None else bias, bias is not None, y)
        return
    if bias is not None:
        p += bias
    gelu_f32(p, y, np.empty_like(p), np.empty_like(p))


def gelu_grad_f32(x: np.ndarray, dy: np.ndarray, dx: np.ndarray, s1: np.ndarray,
                  s2: np.ndarray) -> None:
    """dx = dy * (Phi(x) + x phi(x)) on one float32 block (s1, s2: scratch)."""
    k, flat = host_jit.kernels(), _flat_views(x, dy, dx)
    if k is not None and flat is not None:
        k.gelu_backward(*flat)
        return
    normal_cdf_f32(x, dx, s1, s2)
    _add_x_pdf_times_dy(x, dy, dx, s1)


def gelu_grad_y32(x: np.ndarray, dy: np.ndarray, y: np.ndarray, dx: np.ndarray,
                  s1: np.ndarray, s2: np.ndarray) -> None:
    """dx = dy * (Phi(x) + x phi(x)) on one float32 block, with Phi(x) = y / x from the
    forward's output y = x Phi(x) (Phi(0) = 1/2): no erf, ~10 passes instead of ~35. Phi
    comes back within an ulp or so of the forward's own (y is one rounding of x Phi)."""
    k, flat = host_jit.kernels(), _flat_views(x, dy, y, dx)
    if k is not None and flat is not None:
        k.gelu_backward_y(*flat)
        return
    np.divide(y, x, out=dx)
    zero = s2.view(np.bool_)[: x.size].reshape(x.shape)
    np.equal(x, _F32_ZERO, out=zero)
    np.copyto(dx, _F32_HALF, where=zero)
    _add_x_pdf_times_dy(x, dy, dx, s1)


def _add_x_pdf_times_dy(x, dy, dx, s1):
    """dx = (dx + x phi(x)) * dy, dx holding Phi(x) (s1: scratch)."""
    np.multiply(x, x, out=s1)
    s1 *= _F32_MINUS_HALF
    np.exp(s1, out=s1)
    s1 *= x
    s1 *= _F32_INV_SQRT_2PI  # x phi(x)
    dx += s1
    dx *= dy


def map32(fn: Any, *inputs: np.ndarray) -> np.ndarray:
    """A new float32 array of inputs[0]'s shape: `fn` over blocks of the float32 inputs."""
    out = np.empty(inputs[0].shape, np.float32)
    run_blocks32(fn, tuple(np.ascontiguousarray(a).reshape(-1) for a in inputs),
                 out.reshape(-1))
    return out


def run_blocks32(fn: Any, inputs: tuple, out: np.ndarray) -> None:
    """fn(*float32 input blocks, float32 output block, s1, s2) over the blocks of flat arrays
    (gpuplan.host_pool.for_blocks); operands of other dtypes are converted a block at a
    time. Scratch is per block: a few small allocations, reused warm by the allocator."""
    from gpuplan.host_pool import for_blocks

    direct = out.dtype == np.float32

    def block(lo: int, hi: int) -> None:
        s1, s2 = np.empty(hi - lo, np.float32), np.empty(hi - lo, np.float32)
        o = out[lo:hi] if direct else np.empty(hi - lo, np.float32)
        fn(*(a[lo:hi].astype(np.float32, copy=False) for a in inputs), o, s1, s2)
        if not direct:
            out[lo:hi] = o

    with np.errstate(over="ignore", invalid="ignore"):
        for_blocks(out.size, block)


def run_map(name: str, inputs: tuple, out: np.ndarray) -> bool:
    """The element-wise kernel `name` of gpuplan.host_kernels, kernel(*inputs, out), over flat
    float32 arrays of one size (`takes`), split over the host threads in parts of at least
    host_pool.GRAIN elements. Returns False, doing nothing, when the kernels are not loaded
    or do not take an operand: the caller then runs its NumPy passes."""
    if not host_jit.takes(out, *inputs):
        return False
    k = host_jit.kernels()
    if k is None:
        return False
    kernel = getattr(k, name)

    def part(lo: int, hi: int) -> None:
        kernel(*(a[lo:hi] for a in inputs), out[lo:hi])

    host_pool.parallel_for(out.size, part, host_pool.GRAIN)
    return True
