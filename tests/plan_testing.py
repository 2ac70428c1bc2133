"""pytest-only plan-test helpers: parameter lists of dtypes and an NVRTC compile of a .cu file
with generated enums. The shared helpers (tolerances, running a plan, comparisons) are in
gpuplan.testing, the float64 references in each family's gpuplan/ops/<family>/reference.py."""

import numpy as np
import pytest

import gpuplan as gp
from gpuplan.dtypes import FLOAT_DTYPES

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


__all__ = ["DTYPES", "INDEX_DTYPES", "compile_with_enums"]
