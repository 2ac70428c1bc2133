"""The one home of the plan-checking helpers, for the test suite and every family's kernel
cases (`gpuplan/ops/<family>/cases.py`, run by pytest and `scripts/check_kernels.py
--execute`): per-dtype tolerances, device moves, running a plan, comparing with a float64
reference, and a check that a rejected call leaves every output untouched (that one needs
pytest). The references themselves live with their family (`gpuplan/ops/<family>/reference.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import FLOAT_DTYPES, as_dtype, bfloat16, float16, float32, float64, short_name

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


# -- kernel cases: each family's cases.py, run on the device under test ------------------------

#: The device under test: "emulated" (CI), or "cuda" on a GPU (check_kernels.py --device).
DEVICE = "emulated"
DTYPES = FLOAT_DTYPES


def set_device(device: str) -> None:
    global DEVICE
    DEVICE = gp.backend.resolve_device(device)


def stream() -> gp.Stream:
    """The stream of the device under test."""
    return gp.Stream.emulated() if DEVICE == "emulated" else gp.Stream.current()


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[], None]


def emu(a: np.ndarray | None) -> Any:
    """A host array on the device under test (None stays None)."""
    return None if a is None else gp.to_device(a, DEVICE)


def place(a: np.ndarray, misaligned: bool = False) -> Any:
    """`emu(a)`, or with `misaligned` a copy of 1-D `a` one element past a 256-byte boundary
    on the device under test (no 16-byte packs: the kernels' scalar path)."""
    if not misaligned:
        return emu(a)
    buf = emu(np.zeros(a.shape[0] + 1, a.dtype))[1:]
    buf[...] = emu(a)  # device to device: a GPU array takes no host array by assignment
    return buf


def host(a: Any) -> np.ndarray:
    return gp.to_host(a)


def run_emulated(plan_cls: type, desc: Any, args: Any,
                 pref: gp.PlanPreference | None = None) -> gp.Plan:
    """Select on the stream of the device under test, our NVRTC SKU (no cuBLAS), and run;
    returns the plan."""
    pref = pref or gp.PlanPreference(backend=gp.BackendKind.NVRTC)
    return run_plan(plan_cls, desc, args, DEVICE, pref)


def run_reference(plan_cls: type, desc: Any, args: Any) -> None:
    """The family's NumPy implementation (the caller passes float64 descriptor and arrays)."""
    run_plan(plan_cls, desc, args, "cpu")


def check(actual: Any, expected64: np.ndarray, dtype: Any, what: str, scale: float = 1.0) -> None:
    assert_close(actual, np.asarray(expected64, dtype=np.float64), dtype, scale,
                 err_msg=f"{what} [{short_name(dtype)}]")


def dtype_id(dtype: Any) -> str:
    return short_name(dtype)
