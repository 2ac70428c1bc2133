"""The pytest-side test helpers, one home (the plan-checking helpers the kernel cases share
are in gpuplan.testing; each op's float64 reference is its family's reference.py):
dtype parameter lists, an NVRTC compile of a .cu file with generated enums, and the checks of
autograd Functions (gradcheck on a device, a dtype sweep against the float64 run)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import autograd as ag
import gpuplan as gp
from gpuplan.dtypes import FLOAT_DTYPES, as_dtype, is_float
from gpuplan.testing import assert_close, f64

# -- plans ------------------------------------------------------------------------------------

DTYPES = [pytest.param(d, id=gp.dtypes.short_name(d)) for d in FLOAT_DTYPES]
INDEX_DTYPES = [pytest.param(np.dtype(np.int32), id="i32"), pytest.param(np.dtype(np.int64),
                                                                          id="i64")]



def compile_with_enums(cu_file: str, exprs: list[str], enums: dict[str, tuple[str, ...]],
                       options: tuple[str, ...] = ()) -> None:
    """NVRTC-compile `cu_file` (a family's .cu file) for the name expressions `exprs`
    with the enums generated from `enums` as the op modules generate them from their
    tables (no GPU needed: NVRTC only). Raises on a compile error; skips without CuPy."""
    pytest.importorskip("cupy")
    from pathlib import Path

    from cupy._core import core
    from cupy.cuda import compiler

    from gpuplan.nvrtc import COMPILE_OPTIONS, INCLUDE_DIR, enum_options

    path = Path(cu_file)
    opts = (tuple(core.assemble_cupy_compiler_options(())) + COMPILE_OPTIONS
            + (f"-I{path.parent}", f"-I{INCLUDE_DIR}", "-arch=sm_80") + tuple(options)
            + enum_options(enums))
    compiler._NVRTCProgram(path.read_text(), path.name, name_expressions=list(exprs),
                           method="ptx").compile(opts)


# -- autograd Functions -------------------------------------------------------------------------


def leaves(device: str, *arrays: np.ndarray) -> list[ag.Tensor]:
    """float arrays become requires_grad leaves; integer arrays plain tensors."""
    return [ag.tensor(a, requires_grad=is_float(a.dtype), device=device) for a in arrays]


def gradcheck_on(device: str, fn: Callable[..., Any], *arrays: np.ndarray, **kw: Any) -> None:
    """ag.gradcheck of fn over float64 copies of `arrays` (integer arrays pass through)."""
    cast = [a.astype(np.float64) if is_float(a.dtype) else a for a in arrays]
    assert ag.gradcheck(fn, leaves(device, *cast), **kw)


def vjp(fn: Callable[..., Any], arrays: Sequence[np.ndarray], dtype: Any, device: str,
        round_to: Any = None, seed: int = 7) -> tuple[np.ndarray, list[np.ndarray | None]]:
    """Run fn on `arrays` cast to dtype and back-propagate a fixed random cotangent
    (rounded to `round_to` first, so runs in several dtypes get the same cotangent)."""
    inputs = leaves(device, *[a.astype(dtype) if is_float(a.dtype) else a for a in arrays])
    out = fn(*inputs)
    cot = np.random.default_rng(seed).uniform(-1, 1, out.shape)
    cot = cot.astype(round_to or out.dtype).astype(out.dtype)
    out.backward(cot)
    grads = [None if not t.requires_grad else
             (np.zeros(t.shape) if t.grad is None else f64(t.grad.data)) for t in inputs]
    for t in inputs:
        if t.requires_grad and t.grad is not None:
            assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
    return f64(out.data), grads


def check_dtypes(fn: Callable[..., Any], arrays: Sequence[np.ndarray], device: str,
                 dtypes: Sequence[Any], scale: float = 1.0, grad_scale: float | None = None
                 ) -> None:
    """Each dtype's output and input gradients match float64 on the same rounded inputs."""
    for dtype in dtypes:
        dtype = as_dtype(dtype)
        rounded = [a.astype(dtype).astype(np.float64) if is_float(a.dtype) else a
                   for a in arrays]
        ref_out, ref_grads = vjp(fn, rounded, np.float64, device, round_to=dtype)
        out, grads = vjp(fn, rounded, dtype, device, round_to=dtype)
        assert_close(out, ref_out, dtype, scale, err_msg=f"forward {dtype}")
        for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
            if r is not None:
                assert_close(g, r, dtype, grad_scale or scale, err_msg=f"grad {i} {dtype}")
