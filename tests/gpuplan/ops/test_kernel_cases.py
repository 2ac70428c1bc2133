"""Every family's kernel cases (gpuplan/ops/<family>/cases.py) pass on the emulated device and
together launch every kernel instance the family's modules declare (what
`scripts/check_kernels.py --execute` checks for all families at once)."""

from __future__ import annotations

import importlib

import pytest

import gpuplan  # noqa: F401 - imports every family, which declares its CudaModule
from gpuplan import nvrtc, testing
from gpuplan.ops import FAMILIES, folder


@pytest.mark.parametrize("family", FAMILIES)
def test_family_cases_pass_and_launch_every_instance(family):
    testing.set_device("emulated")
    cases = importlib.import_module(f"gpuplan.ops.{family}.cases").CASES
    assert cases, f"{family}: no kernel cases"
    failures = []
    for case in cases:
        try:
            case.run()
        except Exception as exc:  # noqa: BLE001 - report every failing case at once
            failures.append(f"{case.name}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)
    declared = {(m.path.name, n) for m in nvrtc.registry() if m.path.parent == folder(family)
                for n in m.name_expressions}
    assert declared, f"{family}: no CUDA module in {folder(family)}"
    missing = sorted(declared - nvrtc.LAUNCHED)
    assert not missing, f"{family}: {len(missing)} instances never launched: {missing[:5]}"


def test_gpu_only_cases_reach_the_cublas_selection_on_the_emulated_device():
    """The cuBLAS cases (GPU_CASES, run on a real GPU only) build their operands and ask for
    the cuBLAS SKU; the emulated device refuses it by name, so everything before the launch
    has run here."""
    testing.set_device("emulated")
    with_gpu_cases = [f for f in FAMILIES if getattr(
        importlib.import_module(f"gpuplan.ops.{f}.cases"), "GPU_CASES", None)]
    assert "gemm" in with_gpu_cases
    for family in with_gpu_cases:
        for case in importlib.import_module(f"gpuplan.ops.{family}.cases").GPU_CASES:
            with pytest.raises(gpuplan.errors.Unsupported, match="cublas"):
                case.run()
