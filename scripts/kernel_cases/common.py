"""Shared pieces of the kernel cases: the Case record, moves to the emulated device, and the
float64-reference comparison (gpuplan.testing's per-dtype tolerances)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import gpuplan as gp
from gpuplan.dtypes import FLOAT_DTYPES, short_name
from gpuplan.testing import assert_close, f64, random, run_plan, tol  # noqa: F401

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
