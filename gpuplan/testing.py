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


def gemm_operands(desc: Any, seed: int = 0) -> tuple[np.ndarray, ...]:
    """A, B, C0 and (with has_bias) the bias of a GemmDescriptor, drawn in its dtype."""
    a = random(desc.a_shape(), desc.dtype, seed=seed)
    b = random(desc.b_shape(), desc.dtype, seed=seed + 1)
    c = random(desc.c_shape(), desc.dtype, seed=seed + 2)
    bias = random((desc.n,), desc.dtype, seed=seed + 3) if desc.has_bias else None
    return a, b, c, bias


def gemm_reference(desc: Any, a: Any, b: Any, c0: Any, bias: Any) -> np.ndarray:
    """alpha * op(A) @ op(B) + beta * C0 + bias in float64, from the rounded inputs."""
    a64, b64 = f64(a), f64(b)
    if desc.trans_a:
        a64 = np.swapaxes(a64, -1, -2)
    if desc.trans_b:
        b64 = np.swapaxes(b64, -1, -2)
    out = desc.alpha * np.matmul(a64, b64)
    if desc.beta != 0:
        out = out + desc.beta * f64(c0)
    if bias is not None:
        out = out + f64(bias)
    return np.broadcast_to(out, desc.c_shape())


def assert_gemm_close(actual: Any, expected: np.ndarray, desc: Any, c0: Any = None,
                      bias: Any = None, what: str = "gemm") -> None:
    """|err| <= rtol * (|ref| + |addends|) + atol * sqrt(K): sums of K products grow like
    sqrt(K); an addend (beta*C, bias) may be rounded once more before the final rounding.
    NaN is outside every bound."""
    import math

    rtol, atol = tol(desc.dtype)
    bound = rtol * np.abs(expected) + atol * max(1.0, math.sqrt(desc.k))
    if desc.beta != 0 and c0 is not None:
        bound = bound + rtol * np.abs(desc.beta * f64(c0))
    if bias is not None:
        bound = bound + rtol * np.abs(f64(bias))
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


__all__ = [
    "TOLERANCES", "assert_close", "assert_gemm_close", "assert_rejected", "f64",
    "gemm_operands", "gemm_reference", "on",
    "random", "run_plan", "stream_for", "tol", "float16", "float32", "float64", "bfloat16",
]
