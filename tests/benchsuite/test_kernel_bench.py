"""scripts/bench_kernels.py: --smoke runs every case of every benchsuite.kernels module on the
emulated device (the plan calls a GPU run makes, at tiny sizes), with the same cases as the
full run, without importing CuPy; without a device the script says so and exits 2.

The point is to spend no GPU time on a benchmark that misuses the plan API: any wrong
descriptor, Args field or dtype fails here first, where the plans check their operands.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_kernels.py"
SMOKE_ENV = "GPUPLAN_BENCH_SMOKE"


def _load():
    import benchsuite.kernel_bench as mod

    return mod


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPUPLAN_DEVICE", SMOKE_ENV, "GPUPLAN_DISABLE_CUDA")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def _shape_free(name: str) -> str:
    """A case name without its sizes ("gemm_tiled_bf16_4096x4096x4096_nn" and the smoke
    "gemm_tiled_bf16_160x160x160_nn" agree; "adamw_124M_f32" and "adamw_84K_f32" too)."""
    return re.sub(r"\d+[KM]?", "#", name)


@pytest.fixture(scope="module")
def full_cases() -> dict[str, list]:
    """family -> its full-size Cases, imported in this process (building them touches no
    device)."""
    assert os.environ.get(SMOKE_ENV) is None, "the full-mode list needs full sizes"
    cases, errors = _load().discover()
    assert errors == []
    by_family = defaultdict(list)
    for family, case in cases:
        by_family[family].append(case)
    return dict(by_family)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """One `bench_kernels.py --smoke --json` run on the emulated device, with a `cupy` on the
    path that refuses to import: the emulated path must not need CuPy."""
    tmp = tmp_path_factory.mktemp("bench_kernels")
    (tmp / "no_cupy" / "cupy").mkdir(parents=True)
    (tmp / "no_cupy" / "cupy" / "__init__.py").write_text(
        'raise ImportError("cupy imported on the emulated device")\n')
    out = tmp / "bench.json"
    env = _env(GPUPLAN_DEVICE="emulated")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "no_cupy"), str(ROOT)])
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_smoke_run_records_the_emulated_device(smoke):
    proc, data = smoke
    assert data["import_errors"] == []
    assert data["smoke"] is True and data["device"] == "emulated device"
    assert data["cupy"] is None and data["copy_gbs"] is None
    assert (data["warmup"], data["iters"]) == (0, 1)  # the emulated device's defaults
    assert "not measured on the emulated device" in proc.stdout
    assert "(skipped: emulated device)" in proc.stdout  # the table says why, not "failed"


def test_smoke_runs_every_case_of_every_family_smaller(smoke, full_cases):
    _, data = smoke
    ran = defaultdict(list)
    for row in data["cases"]:
        ran[row["family"]].append(row["case"])
    assert sorted(ran) == sorted(full_cases)
    assert sum(map(len, ran.values())) == sum(map(len, full_cases.values())) > 80
    for family, cases in full_cases.items():
        assert [_shape_free(n) for n in ran[family]] == [_shape_free(c.name) for c in cases]
    full_names = {c.name for cases in full_cases.values() for c in cases}
    same_name = {n for names in ran.values() for n in names} & full_names
    assert same_name == {"adamw_gpt2_multi_tensor"}  # the one name without a size in it


def test_every_smoke_row_is_timed_and_sized_as_its_full_case(smoke, full_cases):
    _, data = smoke
    full = {(f, _shape_free(c.name)): c for f, cases in full_cases.items() for c in cases}
    for row in data["cases"]:
        case = full[row["family"], _shape_free(row["case"])]
        assert "error" not in row, row
        assert row["ms"] > 0, row
        moves = callable(case.bytes_moved) or case.bytes_moved > 0
        computes = callable(case.flops) or case.flops > 0
        assert (row["bytes"] > 0, "gbs" in row) == (moves, moves), row
        assert (row["flops"] > 0, "tflops" in row) == (computes, computes), row
        assert "pct_copy" not in row  # no copy bandwidth on the emulated device


def test_baselines_are_skipped_on_the_emulated_device_unless_they_are_ours(smoke, full_cases):
    _, data = smoke
    full = {(f, _shape_free(c.name)): c for f, cases in full_cases.items() for c in cases}
    ran_ours = []
    for row in data["cases"]:
        case = full[row["family"], _shape_free(row["case"])]
        assert "baseline_error" not in row, row
        if case.baseline is None:
            assert "baseline_name" not in row and "baseline_skipped" not in row
        elif case.baseline_gpu_only:
            assert row["baseline_name"] == case.baseline_name
            assert row["baseline_skipped"] == "emulated device" and "baseline_ms" not in row
        else:
            assert row["baseline_ms"] > 0 and row["speedup"] > 0
            ran_ours.append(row["case"])
    assert ran_ours == ["adamw_gpt2_multi_tensor"]  # its per-tensor AdamWPlan baseline


def test_cublas_cases_say_they_ran_the_tiled_sku(smoke):
    _, data = smoke
    noted = {r["case"] for r in data["cases"] if "note" in r}
    cublas = {r["case"] for r in data["cases"] if r["case"].startswith("gemm_cublas_")}
    assert len(cublas) == 3 and noted == cublas
    assert all("cuBLAS does not run on the emulated device" in r["note"]
               for r in data["cases"] if "note" in r)


def test_without_a_device_it_exits_2_with_its_reason():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], capture_output=True,
                          text=True, timeout=120, env=_env(GPUPLAN_DISABLE_CUDA="1"), cwd=ROOT)
    assert proc.returncode == 2
    assert "bench_kernels: no usable CUDA GPU on this machine" in proc.stderr
    assert proc.stdout == ""
