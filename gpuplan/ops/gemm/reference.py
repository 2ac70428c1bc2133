"""float64 reference of the GEMM family: alpha * op(A) @ op(B) + beta * C0 + bias, an epilogue
activation on top, and the error bound a K-term sum allows (`assert_gemm_close`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.ops.activation.reference import gelu_reference
from gpuplan.testing import f64, random, tol

__all__ = ["gemm_operands", "gemm_reference", "gemm_epilogue_reference", "assert_gemm_close"]


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
